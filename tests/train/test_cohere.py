"""Cohere (``cohere``: Command R, Command R+, Aya 23; ``cohere2``: Command R7B, Command A): CohereConfig's and
Cohere2Config's defaults and layout in the engine spec, the
rotation over adjacent pairs it is (checked against transformers' own ``apply_rotary_pos_emb``), and the plan's
reading of the bundled Aya 23 8B. Counts, gradients, checkpoints and LoRA against transformers and PEFT are in
test_layernorm_families.py, logits parity in test_parity.py (``cohere``, ``cohere_qk``, ``cohere2``, ``cohere2_types`` in
conftest.TINY_CONFIGS), the attention dropout in test_model_dropout.py."""

from __future__ import annotations

import numpy as np
import pytest
from aegis.train.modeling import build_model
from conftest import tiny_config

NAMES = ["cohere", "cohere_qk"]


@pytest.mark.parametrize("name", NAMES)
def test_spec_follows_cohereconfig(name):
    """What a config.json leaves out is CohereConfig's: the tied head, logit_scale 0.0625, rope_theta 500,000, no
    q/k norms, no biases; the block is the parallel one on a weight-only LayerNorm."""
    from transformers import CohereConfig

    config = tiny_config(name)
    spec = build_model(config).spec
    hf = CohereConfig(**{k: v for k, v in config.items() if k != "model_type"})
    assert spec.tie_embeddings == hf.tie_word_embeddings and spec.logits_scale == hf.logit_scale
    assert spec.ropes[0].theta == hf.rope_parameters["rope_theta"] and spec.rope_interleave
    assert spec.qk_norm == spec.qk_norm_head_weights == hf.use_qk_norm
    assert spec.qkv_bias == spec.o_bias == hf.attention_bias and not spec.mlp_bias
    assert spec.parallel_block and spec.layer_norm and not spec.layer_norm_bias and not spec.plain_mlp
    assert spec.rms_norm_eps == hf.layer_norm_eps


@pytest.mark.parametrize("name", ["cohere2", "cohere2_types"])
def test_cohere2_layers_follow_cohere2config(name):
    """Cohere2Config's layer types (every ``sliding_window_pattern``-th layer global, default 4, or an explicit
    list), its head width (a file's ``head_dim``, which its ``__post_init__`` keyword arguments set back over the
    hidden / heads it first writes) and RoPE where a layer has a window."""
    from transformers import Cohere2Config

    config = {**tiny_config(name), "head_dim": 32}
    spec = build_model(config).spec
    hf = Cohere2Config(**{k: v for k, v in config.items() if k != "model_type"})
    assert spec.head_dim == hf.head_dim == 32 != hf.hidden_size // hf.num_attention_heads
    assert build_model(tiny_config(name)).spec.head_dim == hf.hidden_size // hf.num_attention_heads
    slides = [t == "sliding_attention" for t in hf.layer_types]
    assert [w == hf.sliding_window for w in spec.layer_window] == slides
    assert [spec.ropes[i].rope_type != "none" for i in spec.layer_rope] == slides
    assert spec.rope_interleave and spec.parallel_block and not spec.layer_norm_bias
    assert spec.logits_scale == hf.logit_scale and spec.tie_embeddings == hf.tie_word_embeddings


def test_rotating_permuted_heads_is_cohere_rotation_up_to_the_same_permutation():
    """The engine rotates de-interleaved heads with the half-split rotation; transformers rotates adjacent pairs in
    place. The results are one permutation apart, the same for q and k, so every score q.k is the same."""
    import jax.numpy as jnp
    import torch
    from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb

    from aegis.train.modeling.rope import apply_rope, deinterleave

    rng = np.random.default_rng(0)
    b, s, h, d = 1, 6, 2, 8
    q, k = rng.standard_normal((2, b, s, h, d)).astype(np.float32)
    freqs = np.outer(np.arange(s), 1.0 / 10000 ** (np.arange(0, d, 2) / d))[None].astype(np.float32)
    cos_i, sin_i = np.repeat(np.cos(freqs), 2, -1), np.repeat(np.sin(freqs), 2, -1)  # Cohere's interleaved tables
    ref_q, ref_k = apply_rotary_pos_emb(torch.from_numpy(q).transpose(1, 2), torch.from_numpy(k).transpose(1, 2),
                                        torch.from_numpy(cos_i), torch.from_numpy(sin_i))
    cos_h = np.concatenate([np.cos(freqs)] * 2, -1)  # the engine's half-split tables
    sin_h = np.concatenate([np.sin(freqs)] * 2, -1)
    ours_q = np.asarray(apply_rope(deinterleave(jnp.asarray(q)), jnp.asarray(cos_h), jnp.asarray(sin_h)))
    ours_k = np.asarray(apply_rope(deinterleave(jnp.asarray(k)), jnp.asarray(cos_h), jnp.asarray(sin_h)))
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    np.testing.assert_allclose(ours_q, ref_q.transpose(1, 2).numpy()[..., perm], rtol=1e-5, atol=1e-6)
    scores = np.einsum("bqhd,bkhd->bhqk", ours_q, ours_k)
    ref_scores = torch.einsum("bhqd,bhkd->bhqk", ref_q, ref_k).numpy()
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_the_bundled_aya_23_8b_plans_with_its_published_size():
    from aegis import estimate_memory, resolve_model
    from aegis.models import catalog

    entry = catalog.find_model("aya-23-8b")
    profile = resolve_model("aya-23-8b")
    assert entry.id == profile.model_id == "CohereForAI/aya-23-8B"
    assert all(p.agrees(profile.total_params) for p in entry.published)
    assert profile.total_params == 8_028_033_024  # 32 x 218,112,000 per layer + the tied 256,000 x 4,096 embedding
    lora = estimate_memory("aya-23-8b", method="lora", micro_batch_size=1, seq_len=512)
    assert lora.model_id == "CohereForAI/aya-23-8B"


@pytest.mark.parametrize("trains", [False, True], ids=["frozen", "trained"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("heads", [None, 4], ids=["block", "per-head"])
def test_the_planners_cohere_norm_saves_what_autograd_saves(trains, dtype, heads):
    """Per token, the planner's CohereLayerNorm holds the bytes autograd saves in transformers' own module (its
    weight aside): both centred float32 copies, the rsqrt per row (per head for the q/k norms), and the normalised
    tensor when the weight trains."""
    import torch
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    from aegis.planning.memory.activations import _Acc, _norm
    from aegis.planning.memory.activations import Setting

    tokens, width = 8, 64
    norm = CohereLayerNorm(hidden_size=(heads, width // heads) if heads else width).to(getattr(torch, dtype))
    norm.weight.requires_grad_(trains)
    x = torch.randn(1, tokens, *((heads, width // heads) if heads else (width,)), dtype=getattr(torch, dtype),
                    requires_grad=True)
    saved: dict[int, int] = {}

    def pack(t):
        if t.data_ptr() != norm.weight.data_ptr() and t.numel() != norm.weight.numel():  # not the weight (or its cast)
            saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        norm(x)
    size = 2 if dtype == "bfloat16" else 4
    setting = Setting(stream_bytes=size, base_trainable=trains, autocast=False, norm_weight_bytes=size,
                      lora_targets=frozenset(), lora_rank=16, adapter_bytes=4, adapter_compute_bytes=4,
                      sdpa_autocast=False, eager=False, flash=False, seq_len=tokens, expert_weight_bytes=size,
                      lm_head_bytes=size)
    acc = _Acc()
    out = _norm(acc, setting, size, width, gemma=False, label="norms", layer_norm="manual", rows=heads or 1)
    assert sum(acc.terms.values()) * tokens == sum(saved.values())
    assert out == size  # the module returns its input's dtype
