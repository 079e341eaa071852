"""Checks every new engine family runs against transformers (shared by the per-family test files)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch

from aegis.train.modeling import build_model, engine_family
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


def decoder_layers(hf, config: dict):
    """transformers' decoder layers, at the registry's ``layers_path`` (model.layers; GPT-NeoX: gpt_neox.layers;
    Falcon: transformer.h)."""
    from aegis.models.architectures import registry

    return hf.get_submodule(registry.get(config["model_type"]).layers_path)


def check_every_gradient_matches_torch(hf, folder: Path, vocab: int = 256) -> None:
    """Every parameter's gradient of a token cross-entropy equals torch autograd's through transformers' model."""
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids, targets = tokens(vocab, (2, 20)), tokens(vocab, (2, 20), seed=7)

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, jnp.asarray(ids)))
        return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], axis=-1))

    grads = to_hf_state_dict(model, jax.jit(jax.grad(loss))(params))
    hf.zero_grad()
    logp = torch.log_softmax(hf(torch.from_numpy(ids).long()).logits, dim=-1)
    (-logp.gather(-1, torch.from_numpy(targets).long()[..., None]).mean()).backward()
    head = engine_family(model.config.get("model_type")).names.lm_head  # checkpoints name it (GPT-NeoX: embed_out)
    theirs = {head + k[len("lm_head"):] if k.startswith("lm_head.") else k: p.grad.numpy()
              for k, p in hf.named_parameters()}
    assert set(grads) == set(theirs)
    # a key projection's bias has a zero gradient (softmax ignores a shift shared by every key): both sides are float
    # noise there, held to the scale of the model's largest gradient instead of its own
    floor = 1e-7 * max(float(np.abs(ref).max()) for ref in theirs.values())
    for key, ref in theirs.items():
        atol = max(1e-4 * float(np.abs(ref).max()), floor)
        np.testing.assert_allclose(grads[key], ref, rtol=1e-4, atol=atol, err_msg=key)


def check_lora_sizes_equal_peft(config: dict, defaults: tuple[str, ...], few: tuple[str, ...] = ("q_proj", "v_proj")) -> None:
    """The plan's default targets are ``defaults``; for them, "all-linear" and ``few`` (q/v), the planner's trainable
    count == PEFT's == the engine's adapters."""
    from aegis.models.profiles import profile_from_config
    from aegis.schema import default_lora_targets

    profile = profile_from_config(config, model_id="test", source="path")
    assert default_lora_targets(profile.linear_modules) == defaults
    check_lora_counts_agree(config, (("all-linear",), defaults, few))


def check_lora_counts_agree(config: dict, target_sets) -> None:
    """For each tuple of LoRA targets: the planner's trainable count == PEFT's on transformers' model == the
    engine's adapters."""
    import peft

    import aegis
    from aegis.models.profiles import profile_from_config
    from aegis.train.lora import init_lora, lora_param_count

    profile = profile_from_config(config, model_id="test", source="path")
    model = build_model(config)
    params = model.init(jax.random.key(0))
    for targets in target_sets:
        peft_targets = "all-linear" if targets == ("all-linear",) else list(targets)
        wrapped = peft.get_peft_model(meta_model(config), peft.LoraConfig(r=8, target_modules=peft_targets))
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        planned = profile.trainable_params("lora", aegis.LoRAConfig(rank=8, target_modules=targets))
        engine = init_lora(model, params, rank=8, alpha=16, target_modules=targets, rng=jax.random.key(1))
        assert planned == trainable == lora_param_count(engine), (targets, planned, trainable)


def check_peft_loads_the_engines_adapter(hf, folder: Path, targets: tuple[str, ...], out: Path, vocab: int = 256) -> None:
    """An adapter on ``targets`` (random B, so it changes the output), exported by the engine and loaded by PEFT onto
    transformers' model, gives the engine's logits with the adapter."""
    import peft

    from aegis.train.lora import init_lora
    from aegis.train.weights import save_lora_adapter

    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    lora = init_lora(model, params, rank=4, alpha=8, target_modules=targets, rng=jax.random.key(2))
    lora = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(5), x.shape, x.dtype), lora)
    save_lora_adapter(model, lora, out, base_model_name_or_path=str(folder))
    ids = tokens(vocab, (1, 12))
    ours = np.asarray(model.apply(params, jnp.asarray(ids), lora=lora))
    assert not np.allclose(ours, np.asarray(model.apply(params, jnp.asarray(ids))), atol=1e-3)
    wrapped = peft.PeftModel.from_pretrained(hf, out).eval()
    with torch.no_grad():
        theirs = wrapped(torch.from_numpy(ids).long()).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)
