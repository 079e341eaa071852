"""Cognate models (TRM x Titans-MAG) and phase 1 of the forge: three diverse small models trained from scratch.

    from aegis.forge.cognate import CognateConfig, run_phase1
    folders = run_phase1(config, Path("out/phase1_cognate"), tiny=True)   # three Hugging Face folders
    # AutoModelForCausalLM.from_pretrained(folders[0], trust_remote_code=True)

The architecture is :mod:`aegis.forge.cognate.model` (JAX), its PyTorch twin ships inside every export
(:mod:`aegis.forge.cognate.hf_folder`); training and the diversity checks are :mod:`aegis.forge.cognate.phase1`.
Importing this package imports neither JAX nor torch.
"""

from aegis.forge.cognate.hyperparams import TINY_MODEL, CognateConfig

__all__ = ["CognateConfig", "TINY_MODEL", "run_phase1", "load_phase1_config"]


def __getattr__(name: str):
    if name in ("run_phase1", "load_phase1_config"):
        from aegis.forge.cognate import phase1

        return getattr(phase1, name)
    raise AttributeError(f"module 'aegis.forge.cognate' has no attribute {name!r}")
