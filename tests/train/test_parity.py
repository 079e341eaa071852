"""JAX families compute what transformers computes: same random fp32 weights, same logits (rel. err <= 1e-4).

Each tiny config is built as a transformers model, saved with ``save_pretrained``, loaded into
JAX with :func:`aegis.train.weights.load_checkpoint`, and run on the same tokens. Packed
sequences (``segment_ids``) must equal running the sequences separately.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import TINY_CONFIGS, tiny_config

from aegis.errors import UnsupportedArchitectureError
from aegis.train.modeling import ENGINE_FAMILIES, build_model, engine_family, segment_positions, engine_model_types
from aegis.train.weights import load_checkpoint

RTOL = 1e-4


def _tokens(vocab: int, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, vocab, size=shape).astype(np.int32)


def _errors(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    abs_err = float(np.max(np.abs(out - ref)))
    return abs_err, abs_err / float(np.max(np.abs(ref)))


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_logits_match_transformers(name: str, scan_layers: bool, hf_checkpoint) -> None:
    """Both layer loops (unrolled with static per-layer windows and ropes, and ``lax.scan``) match."""
    hf, folder = hf_checkpoint(name)
    config = json.loads((folder / "config.json").read_text())
    model = build_model(config, scan_layers=scan_layers)
    params = load_checkpoint(model, folder)
    ids = _tokens(config["vocab_size"], (2, 24))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids).long()).logits.numpy()
    out = np.asarray(jax.jit(model.apply)(params, ids))
    abs_err, rel_err = _errors(out, ref)
    print(f"PARITY {name:10s} {model.family:10s} scan={scan_layers!s:5} max_abs={abs_err:.3e} max_rel={rel_err:.3e}")
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * float(np.max(np.abs(ref))))
    assert rel_err <= RTOL


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_raw_and_transformers_configs_give_the_same_spec(name: str) -> None:
    """The raw config.json and transformers' normalised ``to_dict()`` (layer_types, rope_parameters) agree."""
    from transformers import AutoConfig

    raw = tiny_config(name)
    cfg = dict(raw)
    normalised = AutoConfig.for_model(cfg.pop("model_type"), **cfg).to_dict()
    assert build_model(raw).spec == build_model(normalised).spec


def test_sliding_windows_and_rope_per_layer_follow_transformers() -> None:
    gemma3 = build_model(tiny_config("gemma3")).spec
    assert gemma3.layer_window == (8, 2**30)  # pattern 2: layer 0 slides, layer 1 is global
    assert [gemma3.ropes[i].theta for i in gemma3.layer_rope] == [10000.0, 1000000.0]
    assert gemma3.ropes[gemma3.layer_rope[1]].rope_type == "linear"
    qwen2 = build_model(tiny_config("qwen2")).spec
    assert qwen2.layer_window == (2**30, 8)  # layers >= max_window_layers slide
    no_sliding = build_model({**tiny_config("qwen2"), "use_sliding_window": False}).spec
    assert no_sliding.layer_window == (2**30, 2**30)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_packed_segments_equal_separate_sequences(name: str, scan_layers: bool) -> None:
    config = tiny_config(name)
    model = build_model(config, scan_layers=scan_layers)
    params = model.init(jax.random.key(1))
    params = jax.tree_util.tree_map(lambda x: x * 5.0 if x.ndim >= 2 else x, params)  # non-trivial logits
    a = _tokens(config["vocab_size"], (1, 10), seed=1)
    b = _tokens(config["vocab_size"], (1, 14), seed=2)
    pad_a = np.zeros((1, 14), np.int32)
    pad_b = np.zeros((1, 10), np.int32)
    # Row 0: a and b packed; row 1: a then padding; row 2: b then padding. One compile for all three.
    ids = np.concatenate([np.concatenate([a, b], 1), np.concatenate([a, pad_a], 1), np.concatenate([b, pad_b], 1)])
    seg = np.array([[1] * 10 + [2] * 14, [1] * 10 + [0] * 14, [7] * 14 + [0] * 10], np.int32)
    out = np.asarray(jax.jit(model.apply)(params, ids, segment_ids=seg))
    assert np.isfinite(out).all()
    ref_a = np.asarray(jax.jit(model.apply)(params, a))  # unpadded, no segment ids
    scale = float(np.max(np.abs(ref_a)))
    np.testing.assert_allclose(out[0, :10], ref_a[0], rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(out[1, :10], ref_a[0], rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(out[0, 10:], out[2, :14], rtol=1e-5, atol=1e-5 * scale)
    # and the packed row is not trivially equal to attending across the boundary
    unsegmented = np.asarray(jax.jit(model.apply)(params, ids[:1]))
    assert np.max(np.abs(unsegmented[0, 10:] - out[0, 10:])) > 1e-3 * scale


def test_segment_positions_restart_per_segment() -> None:
    seg = jnp.array([[1, 1, 2, 2, 2, 0, 0], [3, 3, 3, 3, 4, 4, 4]])
    assert segment_positions(seg).tolist() == [[0, 1, 0, 1, 2, 0, 1], [0, 1, 2, 3, 0, 1, 2]]


def test_bf16_compute_stays_close_to_fp32() -> None:
    config = tiny_config("llama")
    m32 = build_model(config)
    m16 = build_model(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, remat=True)
    params = m32.init(jax.random.key(0))
    ids = _tokens(256, (2, 16))
    ref = np.asarray(jax.jit(m32.apply)(params, ids))
    out = jax.jit(m16.apply)(jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params), ids)
    assert out.dtype == jnp.float32
    assert np.max(np.abs(np.asarray(out) - ref)) < 0.05 * np.max(np.abs(ref)) + 1e-2


def test_hidden_and_head_weight_reproduce_apply() -> None:
    model = build_model(tiny_config("gemma2"))  # soft-capped logits, tied head
    params = model.init(jax.random.key(2))
    ids = _tokens(256, (1, 12))
    h = jax.jit(model.hidden)(params, ids)
    w = model.head_weight(params)
    assert w.shape == (256, 64)  # [vocab, d], HF layout
    np.testing.assert_array_equal(np.asarray(w), np.asarray(params["model"]["embed_tokens"]["weight"]))
    logits = np.asarray(jax.jit(model.apply)(params, ids))
    np.testing.assert_allclose(np.asarray(model.project(h, w)), logits, rtol=1e-5, atol=1e-6)
    assert np.max(np.abs(logits)) <= model.spec.final_softcap


def test_unknown_model_type_lists_supported_ones() -> None:
    with pytest.raises(UnsupportedArchitectureError) as err:
        build_model({"model_type": "bloom", "vocab_size": 10})
    for mt in engine_model_types():
        assert mt in str(err.value)
    assert set(ENGINE_FAMILIES) == set(engine_model_types())
    assert engine_family("gemma3_text").name == "gemma3"


@pytest.mark.parametrize(
    ("model_type", "rope", "seq_len"),
    [
        ("llama", {"rope_type": "default", "rope_theta": 10000.0}, 32),
        ("llama", {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 32),
        (
            "llama",
            {
                "rope_type": "llama3",
                "rope_theta": 5e5,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            32,
        ),
        ("qwen2", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 64}, 32),
        (
            "phi3",
            {
                "rope_type": "longrope",
                "rope_theta": 1e4,
                "short_factor": [1.0 + 0.1 * i for i in range(8)],
                "long_factor": [2.0 + 0.3 * i for i in range(8)],
            },
            32,
        ),
        (
            "phi3",
            {
                "rope_type": "longrope",
                "rope_theta": 1e4,
                "short_factor": [1.0 + 0.1 * i for i in range(8)],
                "long_factor": [2.0 + 0.3 * i for i in range(8)],
            },
            128,
        ),
    ],
)
def test_rope_variants_match_transformers(model_type: str, rope: dict, seq_len: int) -> None:
    """Inverse frequencies and cos/sin scaling equal transformers' ROPE_INIT_FUNCTIONS for each rope type."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from aegis.train.modeling.rope import inv_freq

    raw = {
        **tiny_config("llama"),
        "model_type": model_type,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 64,
        "rope_scaling": dict(rope),
    }
    cfg = dict(raw)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    rope_type = hf_config.rope_parameters["rope_type"]
    if rope_type == "default":
        ref_scale = 1.0
        base = hf_config.rope_parameters["rope_theta"]
        ref = 1.0 / (base ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", seq_len=seq_len)
    spec = build_model(raw).spec.ropes[0]
    ours, scale = inv_freq(spec, seq_len)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)
    assert scale == pytest.approx(ref_scale, rel=1e-6)


@pytest.mark.parametrize("name", ["llama", "gemma3", "mistral"])
def test_fused_attention_path_equals_explicit_attention(name: str) -> None:
    """``attention="dot_product"`` (the call cuDNN flash attention uses) computes what the explicit path does,
    with and without packed segments (uniform windows, per-layer windows, a sliding window)."""
    config = tiny_config(name)
    ref_model = build_model(config)
    fast = build_model(config, attention="dot_product")
    params = jax.tree_util.tree_map(lambda x: x * 5.0 if x.ndim >= 2 else x, ref_model.init(jax.random.key(4)))
    ids = _tokens(256, (2, 20))
    seg = np.array([[1] * 9 + [2] * 11, [5] * 20], np.int32)
    for kwargs in ({}, {"segment_ids": seg}):
        ref = np.asarray(jax.jit(ref_model.apply)(params, ids, **kwargs))
        out = np.asarray(jax.jit(fast.apply)(params, ids, **kwargs))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_fused_attention_refuses_soft_capping() -> None:
    from aegis.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="attention='xla'"):
        build_model(tiny_config("gemma2"), dtype=jnp.bfloat16, attention="cudnn")
    with pytest.raises(InvalidConfigError, match="bf16 or fp16"):
        build_model(tiny_config("llama"), attention="cudnn")
    with pytest.raises(InvalidConfigError, match="not one of"):
        build_model(tiny_config("llama"), attention="flash")  # the planner's name; the engine says cudnn
    assert build_model(tiny_config("llama"), dtype=jnp.bfloat16, attention="cudnn").attention == "cudnn"


def _device(platform: str, kind: str, cc: str = "") -> object:
    from types import SimpleNamespace

    return SimpleNamespace(platform=platform, device_kind=kind, compute_capability=cc)


def test_auto_attention_picks_cudnn_only_where_it_applies() -> None:
    """``attention="auto"`` (what training and ``aegis benchmark`` ask for unless the plan says eager) runs
    cuDNN flash attention on NVIDIA GPUs in bf16/fp16 with a head dim cuDNN takes, and the eager maths
    everywhere else; on this CPU the built model is the eager one."""
    from aegis.train.modeling import engine_attention, resolve_attention

    h100, a100 = _device("gpu", "NVIDIA H100 80GB HBM3", "9.0"), _device("gpu", "NVIDIA A100-SXM4-80GB", "8.0")
    t4 = _device("gpu", "Tesla T4", "7.5")
    llama, gemma2 = engine_family("llama").build_spec(tiny_config("llama")), engine_family("gemma2").build_spec(tiny_config("gemma2"))
    wide = engine_family("llama").build_spec({**tiny_config("llama"), "head_dim": 256})
    odd = engine_family("llama").build_spec({**tiny_config("llama"), "head_dim": 12})
    bf16, fp16, fp32 = jnp.bfloat16, jnp.float16, jnp.float32
    cases = [
        (llama, bf16, h100, "cudnn"),
        (llama, fp16, a100, "cudnn"),
        (llama, fp32, h100, "xla"),  # cuDNN flash attention is bf16/fp16 only
        (gemma2, bf16, h100, "xla"),  # attention soft-capping
        (wide, bf16, h100, "cudnn"),  # head dim 256: Hopper and later
        (wide, bf16, a100, "xla"),
        (odd, bf16, h100, "xla"),  # not a multiple of 8
        (llama, bf16, t4, "xla"),  # before Ampere
        (llama, bf16, _device("gpu", "AMD Instinct MI300X", "gfx942"), "xla"),  # ROCm: no CUDA capability
        (llama, bf16, _device("cpu", "cpu"), "xla"),
    ]
    for spec, dtype, device, want in cases:
        assert resolve_attention("auto", spec, dtype, device) == want, (spec.head_dim, dtype, device)
    assert resolve_attention("dot_product", llama, fp32, h100) == "dot_product"  # explicit choices stand
    assert [engine_attention(a) for a in ("eager", "sdpa", "flash")] == ["xla", "auto", "auto"]
    assert build_model(tiny_config("llama"), dtype=bf16, attention="auto").attention == "xla"  # this CPU


@pytest.mark.parametrize("remat", [False, True], ids=["stored", "remat"])
def test_scanned_and_unrolled_layers_give_the_same_gradients(remat: bool) -> None:
    """The two layer loops are one model: same loss and LoRA gradients on gemma3 (per-layer windows, two
    rope tables) with packed segments and LoRA dropout (the per-layer dropout keys match too); the scan
    with and without gradient checkpointing."""
    from aegis.train.lora import init_lora

    config = {**tiny_config("gemma3"), "sliding_window": 6}
    scanned = build_model(config, scan_layers=True, remat=remat)
    unrolled = build_model(config, scan_layers=False)
    assert scanned.scans_layers() and not unrolled.scans_layers()
    params = jax.tree_util.tree_map(lambda x: x * 5.0 if x.ndim >= 2 else x, scanned.init(jax.random.key(3)))
    lora = init_lora(scanned, params, rank=4, alpha=8, target_modules="all-linear", dropout=0.3, rng=jax.random.key(5))
    lora = jax.tree_util.tree_map(lambda x: x + 0.05, lora)  # non-zero B, so both factors get gradients
    ids = _tokens(config["vocab_size"], (2, 20))
    seg = np.array([[1] * 9 + [2] * 11, [5] * 20], np.int32)

    def loss(model):
        def f(lora_):
            logits = model.apply(params, ids, segment_ids=seg, lora=lora_, rng=jax.random.key(9))
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

        return jax.jit(jax.value_and_grad(f))(lora)

    (l_s, g_s), (l_u, g_u) = loss(scanned), loss(unrolled)
    np.testing.assert_allclose(float(l_u), float(l_s), rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(g_u), jax.tree_util.tree_leaves(g_s), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6 * float(np.abs(b).max()))


@pytest.mark.parametrize("name", ["llama", "gemma2", "qwen2"])
def test_gradients_match_transformers(name: str, hf_checkpoint) -> None:
    """Every parameter's gradient equals torch autograd's through the transformers model: GQA, soft-capped
    attention (gemma2), sliding windows (gemma2, qwen2). This checks the hand-written attention backward."""
    hf, folder = hf_checkpoint(name)
    config = json.loads((folder / "config.json").read_text())
    model = build_model(config)
    params = load_checkpoint(model, folder)
    ids = _tokens(config["vocab_size"], (2, 20))
    targets = _tokens(config["vocab_size"], (2, 20), seed=7)

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, ids))
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    grads = jax.jit(jax.grad(loss))(params)
    hf.zero_grad()
    logp = torch.log_softmax(hf(torch.from_numpy(ids).long()).logits, dim=-1)
    (-logp.gather(-1, torch.from_numpy(targets).long()[..., None]).mean()).backward()
    checked = 0
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        keys = [k.key for k in path]
        if keys[:2] == ["model", "layers"]:
            refs = [dict(hf.named_parameters())[f"model.layers.{i}.{'.'.join(keys[2:])}"].grad for i in range(len(g))]
            ref = torch.stack(refs).numpy()
        else:
            ref = dict(hf.named_parameters())[".".join(keys)].grad.numpy()
        g = np.asarray(g)
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()), err_msg=".".join(keys))
        checked += g.size
    assert checked == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_eager_attention_backward_equals_autodiff(dtype) -> None:
    """The custom VJP of the eager attention core equals autodiff of its forward, soft-cap, grouped queries
    and a row with nothing to attend (padding) included, in fp32 and bf16."""
    from aegis.train.modeling.layers import _eager_forward, eager_attention

    rng = np.random.default_rng(0)
    b, h, groups, s, hd = 2, 2, 3, 7, 8
    qg, kt, vt, g = (jnp.asarray(rng.normal(size=shape), dtype) for shape in
                     [(b, h, groups * s, hd), (b, h, s, hd), (b, h, s, hd), (b, h, groups * s, hd)])
    mask = np.tril(np.ones((s, s), bool))[None].repeat(b, 0)
    mask[1, 3] = False  # a query row that attends to nothing
    mask = jnp.asarray(mask)
    for softcap in (None, 1.5):
        def ours(q, k, v, softcap=softcap):
            return jnp.sum(eager_attention(q, k, v, mask, None, 0.35, softcap, groups).astype(jnp.float32) * g)

        def reference(q, k, v, softcap=softcap):
            return jnp.sum(_eager_forward(q, k, v, mask, None, 0.35, softcap, groups, 0.0)[0].astype(jnp.float32) * g)

        got = jax.grad(ours, argnums=(0, 1, 2))(qg, kt, vt)
        want = jax.grad(reference, argnums=(0, 1, 2))(qg, kt, vt)
        tol = 1e-5 if dtype == jnp.float32 else 2e-2
        for a, w in zip(got, want, strict=True):
            w = np.asarray(w, np.float32)
            np.testing.assert_allclose(np.asarray(a, np.float32), w, rtol=tol, atol=tol * float(np.abs(w).max()))


def test_gradient_checkpointing_scans_the_layers_and_saves_memory() -> None:
    """Unrolled, XLA hoists every layer's recomputation and remat saves almost nothing, so remat picks the
    scan (and refuses an explicit unrolled loop); XLA's temporaries for the gradient then shrink."""
    from aegis.errors import InvalidConfigError

    config = {**tiny_config("llama"), "hidden_size": 128, "intermediate_size": 256}
    with pytest.raises(InvalidConfigError, match="scan"):
        build_model(config, remat=True, scan_layers=False)
    stored, remat = build_model(config), build_model(config, remat=True)
    assert not stored.scans_layers() and remat.scans_layers()
    ids = jax.ShapeDtypeStruct((8, 128), jnp.int32)

    def temp(model):
        params = jax.eval_shape(model.init, jax.random.key(0))
        grad = jax.jit(jax.grad(lambda p, i: jnp.mean(model.apply(p, i))))
        return grad.lower(params, ids).compile().memory_analysis().temp_size_in_bytes

    assert temp(remat) < 0.6 * temp(stored)
