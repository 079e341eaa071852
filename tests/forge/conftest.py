"""Tiny Llama folders for merge tests, and mergekit (when installed) as the reference.

``models`` builds one model with transformers (4 layers, hidden 64, vocab 320, a trained BPE tokenizer)
and derives the others from it by adding noise to every tensor, so that they look like fine-tunes of
one base: ``a`` and ``b`` (noise 0.01: slerp takes the spherical path), ``near`` (noise 1e-6: slerp
falls back to lerp) and ``far`` (noise 0.05).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.hf_folders import make_model_folder


def perturbed(src: Path, dst: Path, seed: int, scale: float) -> Path:
    """A copy of model folder ``src`` with Gaussian noise of std ``scale`` added to every tensor."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(src / "model.safetensors")
    noisy = {k: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in tensors.items()}
    save_file(noisy, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("forge-models")
    base = make_model_folder(root / "base", layers=4, seed=0)
    return {
        "base": base,
        "a": perturbed(base, root / "a", seed=1, scale=0.01),
        "b": perturbed(base, root / "b", seed=2, scale=0.01),
        "near": perturbed(base, root / "near", seed=3, scale=1e-6),
        "far": perturbed(base, root / "far", seed=4, scale=0.05),
    }


def fill(cfg: Any, models: dict[str, Path]) -> Any:
    """``cfg`` with model names ('base', 'a', ...) replaced by their folders."""
    if isinstance(cfg, dict):
        return {k: (str(models[v]) if k in ("model", "base_model", "tokenizer_source") and v in models else fill(v, models))
                for k, v in cfg.items()}
    if isinstance(cfg, list):
        return [fill(v, models) for v in cfg]
    return cfg


def read_folder(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of a model folder (single file or shards), as numpy arrays keyed by name."""
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def max_abs_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert a[k].dtype == b[k].dtype, (k, a[k].dtype, b[k].dtype)
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


@pytest.fixture(scope="session")
def mergekit_merge():
    """Run mergekit itself (its Python API, in this process) on a config dict; skip without mergekit."""
    pytest.importorskip("mergekit", reason="mergekit is the reference (pip install mergekit)")
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    def run(cfg: dict, out: Path, seed: int | None = None) -> Path:
        options = MergeOptions(quiet=True, write_model_card=False, random_seed=seed)
        run_merge(MergeConfiguration.model_validate(cfg), str(out), options)
        return out

    return run


def config_of(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def random_cognate_params(cfg: Any, seed: int) -> dict[str, Any]:
    """A Cognate model's parameters from numpy (eager ``init_params`` costs seconds on a loaded CPU): unit-scale
    rows, so that its predictions are far from uniform; norms and gate weights around 1."""
    from aegis.forge.cognate.hyperparams import param_shapes
    from aegis.forge.cognate.model import from_flat

    rng = np.random.default_rng(seed)
    flat = {}
    for name, shape in param_shapes(cfg).items():
        scale = 0.2 if len(shape) == 1 else shape[-1] ** -0.5
        centre = 1.0 if name.endswith(("norm.weight", "attn_weight", "mem_weight")) else 0.0
        flat[name] = (centre + scale * rng.standard_normal(shape)).astype(np.float32)
    return from_flat(flat, cfg)
