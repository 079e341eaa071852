"""Checks every new engine family runs against transformers (shared by the per-family test files)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch

from aegis.train.models import build_model
from aegis.train.weights import load_checkpoint, save_checkpoint, to_hf_state_dict


def tokens(vocab: int, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, vocab, size=shape).astype(np.int32)


def check_training_loss_is_torch_cross_entropy(hf, folder: Path, vocab: int = 256) -> None:
    """The engine's token loss (``aegis.train.step.token_loss_sum``, what the train step minimises) on a padded
    batch equals torch's cross-entropy over transformers' logits at the unmasked targets."""
    from aegis.train.step import token_loss_sum

    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids, targets = tokens(vocab, (2, 16)), tokens(vocab, (2, 16), seed=3)
    mask = np.ones((2, 16), np.float32)
    mask[1, 10:] = 0
    batch = {
        "input_ids": jnp.asarray(ids), "targets": jnp.asarray(targets), "loss_mask": jnp.asarray(mask),
        "segment_ids": jnp.ones((2, 16), jnp.int32), "positions": jnp.broadcast_to(jnp.arange(16), (2, 16)),
    }
    total, count = token_loss_sum(model, params, None, batch)
    with torch.no_grad():
        logits = hf(torch.from_numpy(ids).long()).logits
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), torch.from_numpy(targets).long().reshape(-1),
                                                  reduction="none").numpy()
    assert int(count) == int(mask.sum())
    np.testing.assert_allclose(float(total), float((per_token * mask.reshape(-1)).sum()), rtol=1e-5)


def engine_param_count(config: dict) -> int:
    """Parameters of the engine's tree for ``config`` (shapes only)."""
    shapes = build_model(config).param_shapes()
    return sum(int(np.prod(s)) for s in jax.tree_util.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, tuple)))


def meta_model(config: dict):
    """transformers' model for a config.json dict on the meta device (no memory)."""
    import transformers

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **cfg))


def check_checkpoint_round_trip(hf, folder: Path, out: Path) -> None:
    """Loading ``folder`` and writing it back gives transformers' own tensors (names and values, as its
    model.safetensors holds them), and transformers loads the saved folder to the same logits."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    theirs = load_file(folder / "model.safetensors")
    ours = to_hf_state_dict(model, params)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    saved = save_checkpoint(model, params, out)
    reloaded = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
    ids = torch.arange(3, 19).reshape(1, 16)
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(ids).logits.numpy(), hf(ids).logits.numpy(), rtol=1e-6, atol=1e-6)
