"""Save a Cognate model as a Hugging Face folder that transformers loads with its own modeling code, and read it back.

    save_pretrained(params, cfg, "out/model", tokenizer=tok, extra_files={"report.json": text})
    AutoModelForCausalLM.from_pretrained("out/model", trust_remote_code=True)   # logits == forward()'s (fp32)
    params, cfg = load_pretrained("out/model")                                   # back into the engine
    widen_memory("out/model", "out/wide", slots=1024)   # the same function with inactive (zero) memory slots added

The folder holds ``config.json`` (``model_type: cognate``, ``auto_map`` naming the two code files),
``configuration_cognate.py`` and ``modeling_cognate.py`` (copied from this package's ``hf/``), ``model.safetensors``
(fp32, written by :mod:`aegis.train.safetensors_io`), ``generation_config.json`` and the tokenizer's files. It is
written as :mod:`aegis._outdir` writes every folder: atomically, refusing a folder of someone else's files.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from aegis.forge.cognate.hyperparams import CognateConfig, param_shapes

__all__ = ["save_pretrained", "load_pretrained", "hf_config", "widen_memory", "memory_slots", "write_files", "CODE_FILES"]

CODE_FILES = ("configuration_cognate.py", "modeling_cognate.py")


def hf_config(cfg: CognateConfig, tokenizer: Any = None) -> dict[str, Any]:
    """config.json's contents."""
    data: dict[str, Any] = {
        "architectures": ["CognateForCausalLM"], "model_type": "cognate",
        "auto_map": {"AutoConfig": "configuration_cognate.CognateConfig",
                     "AutoModelForCausalLM": "modeling_cognate.CognateForCausalLM"},
        **cfg.model_dump(), "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": False,
    }
    if tokenizer is not None:
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, key, None)
            if value is not None:
                data[key] = value
    return data


def save_pretrained(params: dict[str, Any], cfg: CognateConfig, out: str | Path, *, tokenizer: Any = None,
                    extra_files: dict[str, str] | None = None, overwrite: bool = False,
                    writer: str = "aegis cognate") -> Path:
    """Write the folder (see the module docstring); ``extra_files`` (name -> text) go in with it, in the same
    atomic publish. Returns the folder's absolute path."""
    from aegis._outdir import output_dir

    with output_dir(out, overwrite=overwrite, writer=writer) as tmp:
        write_files(tmp, params, cfg, tokenizer=tokenizer)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    return Path(out).expanduser().absolute()


def write_files(folder: Path, params: dict[str, Any], cfg: CognateConfig, *, tokenizer: Any = None) -> None:
    """The folder's files, written into ``folder`` as it is (an output folder its caller publishes)."""
    import numpy as np

    from aegis.forge.cognate.model import to_flat
    from aegis.train.safetensors_io import write_shards

    flat = {k: np.asarray(v, dtype=np.float32) for k, v in to_flat(params).items()}
    write_shards(folder, {k: flat[k] for k in param_shapes(cfg)})
    (folder / "config.json").write_text(json.dumps(hf_config(cfg, tokenizer), indent=2) + "\n", encoding="utf-8")
    gen = {"do_sample": False, "use_cache": False}
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        gen["eos_token_id"] = tokenizer.eos_token_id
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    code = resources.files("aegis.forge.cognate").joinpath("hf")
    for name in CODE_FILES:
        (folder / name).write_text(code.joinpath(name).read_text(encoding="utf-8"), encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def load_pretrained(folder: str | Path) -> tuple[dict[str, Any], CognateConfig]:
    """Read an exported folder back into the engine's parameters and config."""
    from aegis.errors import CheckpointError
    from aegis.forge.cognate.model import from_flat
    from aegis.train.safetensors_io import CheckpointReader

    folder = Path(folder)
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{folder} is not a Cognate folder ({err}); pass a folder `aegis cognate` wrote") from None
    if data.get("model_type") != "cognate":
        raise CheckpointError(f"{folder} holds a {data.get('model_type')!r} model, not a Cognate one")
    cfg = CognateConfig(**{k: v for k, v in data.items() if k in CognateConfig.model_fields})
    reader = CheckpointReader(folder)
    flat = {name: reader.get(name) for name in param_shapes(cfg)}
    return from_flat(flat, cfg), cfg


def memory_slots(folder: str | Path) -> int | None:
    """The long-term memory slots (``ltm_slots``) of the Cognate folder; None for any other model."""
    try:
        data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return int(data["ltm_slots"]) if data.get("model_type") == "cognate" and "ltm_slots" in data else None


def widen_memory(src: str | Path, out: str | Path, slots: int, *, writer: str = "aegis forge") -> Path:
    """Copy the Cognate folder ``src`` to ``out`` with its memory MLP zero-padded to ``slots`` hidden units (each
    layer's ``memory.w1`` gains zero columns, ``memory.w2`` zero rows; config.json's ``ltm_slots`` follows).

    The copy computes the same function: a zero slot j has W1[:, j] = 0 and W2[j] = 0, so its activation is
    silu(0) = 0 and it adds nothing to M(x); its share of the associative loss's gradient is a_j * r = 0 for W2[j]
    and (r . W2[j]) * silu'(0) * k = 0 for W1[:, j], so the test-time update (momentum and forgetting included)
    leaves it at zero, and every other slot's update is unchanged. Models with different slot counts can then be
    merged tensor by tensor (EvoMerge); their extra slots merge with zeros."""
    import shutil

    import numpy as np

    from aegis._outdir import MARKER, output_dir
    from aegis.errors import CheckpointError
    from aegis.train.safetensors_io import CheckpointReader, write_shards

    src = Path(src)
    have = memory_slots(src)
    if have is None:
        raise CheckpointError(f"{src} is not a Cognate folder; pass a folder `aegis cognate` wrote")
    if slots < have:
        raise CheckpointError(f"{src} has {have} memory slots; widening to {slots} would drop slots")
    data = json.loads((src / "config.json").read_text(encoding="utf-8"))
    cfg = CognateConfig(**{k: v for k, v in data.items() if k in CognateConfig.model_fields})
    reader = CheckpointReader(src)
    tensors = {}
    for name in param_shapes(cfg):
        t = np.asarray(reader.get(name))
        if name.endswith(".memory.w1"):
            t = np.pad(t, [(0, 0), (0, slots - have)])
        elif name.endswith(".memory.w2"):
            t = np.pad(t, [(0, slots - have), (0, 0)])
        tensors[name] = t
    data["ltm_slots"] = slots
    weights = {"model.safetensors", "model.safetensors.index.json", "config.json", MARKER}
    with output_dir(out, overwrite=False, writer=writer) as tmp:
        write_shards(tmp, tensors)
        (tmp / "config.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        for f in src.iterdir():
            if f.is_file() and f.name not in weights and not f.name.endswith(".safetensors"):
                shutil.copy2(f, tmp / f.name)
    return Path(out).expanduser().absolute()
