"""The model's own dropouts in training (Granite 3.0's attention dropout; Seed-OSS's attention and residual
dropouts; Phi's attention, residual and embedding dropouts; Phi-3's resid_pdrop; StarCoder2's attention, residual and embedding dropouts;
StableLM's attention dropout and hidden_dropout on the MLP output alone; GPT-NeoX's attention dropout and hidden_dropout
on the embeddings and both sublayer outputs; GPT-2's attn_pdrop, resid_pdrop and embd_pdrop): transformers in train mode, given the engine's masks, gives the engine's logits and gradients; eval
runs none; the hand-written attention backward matches autodiff through the same mask."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from aegis.train.modeling import build_model, engine_family
from aegis.train.modeling.layers import Ctx, dropout, eager_attention
from aegis.train.weights import load_checkpoint, to_hf_state_dict

from family_checks import tokens

CASES = {
    "granite": {"attention_dropout": 0.3},
    "seed_oss": {"attention_dropout": 0.3, "residual_dropout": 0.2},
    "phi": {"attention_dropout": 0.3, "resid_pdrop": 0.2, "embd_pdrop": 0.1},
    "phi3": {"attention_dropout": 0.3, "resid_pdrop": 0.2},  # Phi-3 drops both sublayer outputs too
    "starcoder2": {"attention_dropout": 0.3, "residual_dropout": 0.2, "embedding_dropout": 0.1},
    "stablelm": {"attention_dropout": 0.3, "hidden_dropout": 0.2},  # StableLM drops the MLP's output only
    "stablelm_parallel": {"attention_dropout": 0.3, "hidden_dropout": 0.2},
    # GPT-NeoX: hidden_dropout on the embeddings (emb_dropout) and on both sublayer outputs
    "gpt_neox": {"attention_dropout": 0.3, "hidden_dropout": 0.2},
    "gpt_neox_sequential": {"attention_dropout": 0.3, "hidden_dropout": 0.2},
    # GPT-2: attn_pdrop on the probabilities, resid_pdrop on both sublayer outputs, embd_pdrop on wte + wpe
    "gpt2": {"attn_pdrop": 0.3, "resid_pdrop": 0.2, "embd_pdrop": 0.1},
    "opt": {"attention_dropout": 0.3, "dropout": 0.2},
    "cohere": {"attention_dropout": 0.3},  # Cohere: the attention probabilities only
    "cohere2": {"attention_dropout": 0.3},  # sliding and global layers
    "olmo": {"attention_dropout": 0.3},  # OLMo 1: the attention probabilities only
    # GPT-J: attn_pdrop on the probabilities, resid_pdrop on both sublayer outputs, embd_pdrop on the embeddings
    "gptj": {"attn_pdrop": 0.3, "resid_pdrop": 0.2, "embd_pdrop": 0.1},
    "gpt_bigcode": {"attn_pdrop": 0.3, "resid_pdrop": 0.2, "embd_pdrop": 0.1},  # multi-query: one key/value head  # OPT: dropout on both sublayer outputs, none on the embeddings
}


def _engine_masks(model, rng: jax.Array, b: int, s: int) -> list[tuple[str, np.ndarray]]:
    """The masks the engine draws in one training forward, in the order transformers applies its dropouts: per
    layer the attention probabilities ``[b, heads, s, s]`` (the engine draws them per kv head, its query heads
    grouped), then, with residual dropout, the attention and the MLP outputs ``[b, s, d]``; an embedding dropout
    (Phi) comes before the layers."""
    from aegis.train.modeling.decoder import _EMBEDDING_DROPOUT_STREAM

    spec = model.spec
    hkv, groups = spec.num_kv_heads, spec.num_heads // spec.num_kv_heads
    out = []
    if spec.embedding_dropout:  # Phi: the embeddings first, before any layer
        key = jax.random.fold_in(rng, _EMBEDDING_DROPOUT_STREAM)
        out.append(("embedding", np.asarray(jax.random.bernoulli(key, 1.0 - spec.embedding_dropout,
                                                                  (b, s, spec.hidden_size)))))
    for layer in range(spec.num_layers):
        ctx = Ctx(dtype=jnp.float32, rng=jax.random.fold_in(rng, layer))
        keep = jax.random.bernoulli(ctx.train_rng("attention_dropout"), 1.0 - spec.attention_dropout,
                                    (b, hkv, groups * s, s))
        out.append(("attention", np.asarray(keep).reshape(b, spec.num_heads, s, s)))
        if spec.residual_dropout:
            for where in spec.residual_dropout_on:
                key = ctx.train_rng(f"residual_dropout.{where}")
                out.append(("residual", np.asarray(jax.random.bernoulli(key, 1.0 - spec.residual_dropout,
                                                                         (b, s, spec.hidden_size)))))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_training_forward_and_gradients_match_transformers_given_the_same_masks(name, hf_checkpoint, tiny_configs,
                                                                               monkeypatch):
    config = {**tiny_configs[name], **CASES[name]}
    hf, folder = hf_checkpoint(config)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    b, s = 2, 12
    ids = tokens(config["vocab_size"], (b, s))
    rng = jax.random.PRNGKey(7)
    masks = _engine_masks(model, rng, b, s)
    drawn = list(masks)

    def given_mask(x, p=0.5, training=True, inplace=False):  # noqa: ARG001 - torch's signature
        if not training or p == 0.0:
            return x
        kind, keep = drawn.pop(0)
        assert tuple(x.shape) == keep.shape or (kind == "residual" and x.numel() == keep.size), kind
        keep = keep.reshape(tuple(x.shape))  # OPT flattens [b, s, d] to [b * s, d] around its MLP
        return torch.where(torch.from_numpy(keep.copy()), x / (1.0 - p), torch.zeros((), dtype=x.dtype))

    monkeypatch.setattr(torch.nn.functional, "dropout", given_mask)
    hf.train()
    hf_logits = hf(torch.from_numpy(ids).long()).logits
    assert not drawn  # transformers applied exactly the engine's dropouts
    loss = hf_logits.float().logsumexp(-1).mean()
    loss.backward()

    def engine_loss(p):
        return jax.nn.logsumexp(model.apply(p, jnp.asarray(ids), rng=rng), axis=-1).mean()

    logits = model.apply(params, jnp.asarray(ids), rng=rng)
    np.testing.assert_allclose(np.asarray(logits), hf_logits.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert not np.allclose(np.asarray(logits), np.asarray(model.apply(params, jnp.asarray(ids))), atol=1e-3)
    grads = jax.grad(engine_loss)(params)
    proj = model.spec.qkv_name if model.spec.fused_qkv else "q_proj"
    on_disk = to_hf_state_dict(model, grads)  # transformers' names and layouts (GPT-2's Conv1D: [in, out])
    names = engine_family(model.config["model_type"]).names  # GPT-NeoX: gpt_neox.layers.{i}.attention.*
    for layer in range(model.spec.num_layers):
        module = names.checkpoint(f"model.layers.{layer}.self_attn.{proj}")
        ref = hf.get_submodule(module).weight.grad.numpy()
        np.testing.assert_allclose(on_disk[f"{module}.weight"], ref, rtol=2e-3, atol=2e-5)


def test_eval_runs_no_dropout(hf_checkpoint, tiny_configs):
    """Without a key (eval, the forensics' per-sample gradients) the logits are those of transformers in eval."""
    hf, folder = hf_checkpoint({**tiny_configs["seed_oss"], **CASES["seed_oss"]})
    model = build_model(json.loads((folder / "config.json").read_text()))
    ids = tokens(256, (1, 10))
    with torch.no_grad():
        ref = hf.eval()(torch.from_numpy(ids).long()).logits.numpy()
    got = model.apply(load_checkpoint(model, folder), jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-4)


def test_dropout_is_torch_dropout():
    """Zeroes with probability p, scales the rest by 1 / (1 - p) in the input's dtype, as torch does."""
    p = 0.25
    for dtype, tdtype in ((jnp.float32, torch.float32), (jnp.bfloat16, torch.bfloat16)):
        x = dropout(jnp.ones((256, 256), dtype), p, jax.random.PRNGKey(0))
        ref = torch.nn.functional.dropout(torch.ones((256, 256), dtype=tdtype), p=p, training=True)
        assert x.dtype == dtype
        assert set(np.unique(np.asarray(x, np.float32))) == set(np.unique(ref.float().numpy()))
        zeros = float((np.asarray(x, np.float32) == 0).mean())
        assert abs(zeros - p) < 4 * np.sqrt(p * (1 - p) / x.size)
    np.testing.assert_array_equal(dropout(jnp.ones(4), p, None), 1.0)  # eval: no key, no dropout


def test_attention_backward_through_dropout_is_autodiff():
    """The custom VJP (mask drawn again from the key in backward) equals autodiff through the same mask."""
    b, hkv, groups, s, hd, p = 1, 2, 2, 6, 8, 0.3
    k0, k1, k2, kd = jax.random.split(jax.random.PRNGKey(3), 4)
    qg = jax.random.normal(k0, (b, hkv, groups * s, hd))
    kt = jax.random.normal(k1, (b, hkv, s, hd))
    vt = jax.random.normal(k2, (b, hkv, s, hd))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((s, s), bool))[None], (b, s, s))
    keep = jax.random.bernoulli(kd, 1.0 - p, (b, hkv, groups * s, s))

    def reference(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.5
        scores = jnp.where(jnp.tile(mask[:, None], (1, 1, groups, 1)), scores, jnp.finfo(jnp.float32).min)
        probs = jnp.where(keep, jax.nn.softmax(scores, -1) / (1.0 - p), 0.0)
        return jnp.einsum("bhqk,bhkd->bhqd", probs, v)

    def ours(q, k, v):
        return eager_attention(q, k, v, mask, kd, 0.5, None, groups, p)

    cot = jax.random.normal(jax.random.PRNGKey(9), qg.shape)
    np.testing.assert_allclose(ours(qg, kt, vt), reference(qg, kt, vt), rtol=1e-5, atol=1e-6)
    for a, r in zip(jax.vjp(ours, qg, kt, vt)[1](cot), jax.vjp(reference, qg, kt, vt)[1](cot), strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)
