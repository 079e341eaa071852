"""Hand a trained model to the ecosystem: a PEFT adapter folder or a Hugging Face model folder.

    export_trained(model, trainable, method="lora", out="export/", base=folder, tokenizer=folder)
    # LoRA/QLoRA: adapter_config.json + adapter_model.safetensors (+ tokenizer files):
    #     PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "export/")
    export_trained(..., merge=True)   # adapters folded into the base weights: a full HF folder
    # full fine-tuning: config.json, safetensors shards with their index, generation_config.json, tokenizer:
    #     AutoModelForCausalLM.from_pretrained("export/")

A merge folds the adapters into the base *as stored in its folder* (re-read at full precision), not into
the NF4 copy QLoRA trained against, so the merged model is what PEFT's ``merge_and_unload`` gives on the
original weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

import jax.numpy as jnp
import numpy as np

from aegis.errors import CheckpointError
from aegis.train.safetensors_io import DTYPES, FLOATING, MAX_SHARD_BYTES

__all__ = ["export_trained", "MAX_SHARD_BYTES"]



def _stored_dtype(folder: Path) -> str | None:
    """The dtype the base checkpoint's first 16- or 32-bit floating tensor is stored in ('float32', 'bfloat16', ...)."""
    from aegis.train.weights import CheckpointReader

    reader = CheckpointReader(folder)
    for name in reader.names():
        code = reader.dtype_name(name)
        if code in FLOATING and code != "F64":
            return DTYPES[code].name
    return None


def _copy_tokenizer(tokenizer: Path | None, out: Path, chat_template: str | None) -> list[str]:
    from aegis.models.source import TOKENIZER_FILES

    copied = []
    if tokenizer is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer / name).is_file():
                shutil.copy2(tokenizer / name, out / name)
                copied.append(name)
    if chat_template:
        (out / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
        copied.append("chat_template.jinja")
    return copied


def _write_model_folder(model: Any, params: Any, out: Path, *, dtype: str, base: Path | None) -> None:
    from aegis.train.weights import save_checkpoint, saved_config

    save_checkpoint(model, params, out, dtype=jnp.dtype(dtype), max_shard_bytes=MAX_SHARD_BYTES, write_config=False)
    config = dict(model.config)
    if base is not None and (base / "config.json").is_file():
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    config = saved_config(model, config)
    config["torch_dtype"] = dtype
    config.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if base is not None and (base / "generation_config.json").is_file():
        shutil.copy2(base / "generation_config.json", out / "generation_config.json")
    else:
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
        (out / "generation_config.json").write_text(json.dumps({**gen, "_from_model_config": True}, indent=2))


def export_trained(
    model: Any,
    trainable: Any,
    *,
    method: Literal["full", "lora", "qlora"],
    out: str | Path,
    base: Path | None = None,
    base_name: str | None = None,
    tokenizer: Path | None = None,
    chat_template: str | None = None,
    merge: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write ``out`` for transformers/PEFT; returns it. ``base``: the model folder trained from (None:
    a random-init run, which can only export full weights or an adapter without a loadable base).

    ``out`` is written as :mod:`aegis._outdir` writes folders: into a temporary sibling renamed into place; a
    folder holding files Aegis did not write is refused (OutputPathError) unless ``overwrite``, and even then
    only files of the same name are replaced."""
    from aegis._outdir import output_dir

    if merge and method != "full" and base is None:
        raise CheckpointError("--merge needs the base model's weights, and this run initialised them randomly; "
                              "export the adapter without --merge")
    with output_dir(out, overwrite=overwrite, writer="aegis export") as tmp:
        _write_export(model, trainable, method=method, out=tmp, base=base, base_name=base_name, merge=merge)
        _copy_tokenizer(tokenizer, tmp, chat_template)
    return Path(out)


def _write_export(model: Any, trainable: Any, *, method: str, out: Path, base: Path | None, base_name: str | None,
                  merge: bool) -> None:
    from aegis.train.lora import merge_lora
    from aegis.train.weights import load_checkpoint, save_lora_adapter

    if method == "full":
        leaf = next(x for x in _leaves(trainable))
        dtype = str(jnp.dtype(leaf.dtype))
        _write_model_folder(model, trainable, out, dtype=dtype, base=base)
    elif not merge:
        save_lora_adapter(model, trainable, out, base_model_name_or_path=base_name or (str(base) if base else None))
    else:
        assert base is not None  # checked by export_trained
        dtype = _stored_dtype(base) or "float32"
        params = load_checkpoint(model, base, dtype=jnp.float32)
        merged = merge_lora(model, params, trainable)
        _write_model_folder(model, merged, out, dtype=dtype, base=base)


def _leaves(tree: Any) -> list[Any]:
    import jax

    return [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, (jnp.ndarray, np.ndarray))]
