"""NF4 + double quantisation in JAX equals bitsandbytes' ``quantize_4bit(nf4, compress_statistics=True)``
and the format's definition; models run on NF4 weights dequantised on the fly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import tiny_config

from aegis.train.modeling import build_model
from aegis.train.nf4 import NF4_CODE, NF4Tensor, dequantize, dynamic_map, quantize, quantize_params


@pytest.fixture(scope="module")
def weight() -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((128, 96)) * 0.05).astype(np.float32)


def _unpack_nibbles(packed: np.ndarray, n: int) -> np.ndarray:
    """bitsandbytes' 4-bit layout: two codes per byte, the first value in the high nibble."""
    flat = np.asarray(packed, np.uint8).reshape(-1)
    return np.stack([flat >> 4, flat & 0xF], axis=-1).reshape(-1)[:n].astype(np.int64)


def _bnb_absmax(state) -> np.ndarray:
    """Per-block absmax as bitsandbytes' QuantState defines it; nested (double quantisation):
    ``state2.code[absmax_u8] * state2.absmax[i // state2.blocksize] + offset``."""
    if state.state2 is None:
        return state.absmax.numpy().astype(np.float32)
    codes = state.absmax.numpy().astype(np.int64)
    scale = np.repeat(state.state2.absmax.numpy(), state.state2.blocksize)[: codes.size]
    return state.state2.code.numpy()[codes] * scale + np.float32(state.offset.item())


def _decode_bnb(packed, state) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode bitsandbytes' packed NF4 format by its definition (``code[idx] * absmax`` per block), without
    its dequantize kernel (wrong on some CPU builds: 0.056 max error against the weights where codes x
    absmax give 0.015). Returns (4-bit indices, per-block absmax, decoded values), all flat."""
    n = int(np.prod(tuple(state.shape)))
    idx = _unpack_nibbles(packed.numpy(), n)
    absmax = _bnb_absmax(state)
    values = state.code.numpy()[idx] * np.repeat(absmax, state.blocksize)[:n]
    return idx, absmax, values


def _at_midpoint(scaled: np.ndarray, code: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """Values within float rounding (``tol``) of the boundary between two code values, where rounding may go
    either way."""
    midpoints = (code[:-1] + code[1:]) / 2
    return np.min(np.abs(scaled[..., None] - midpoints), axis=-1) < tol


@pytest.mark.parametrize("double_quant", [True, False], ids=["double_quant", "single_quant"])
def test_matches_bitsandbytes_bit_for_bit(weight: np.ndarray, double_quant: bool) -> None:
    """The packed codes equal bitsandbytes' ``quantize_4bit`` output, and dequantisation equals decoding
    bitsandbytes' packed format by hand (nibble order, NF4 table, nested absmax)."""
    import bitsandbytes.functional as bnbf

    np.testing.assert_allclose(dynamic_map(), bnbf.create_dynamic_map().numpy(), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(NF4_CODE, bnbf.get_4bit_type("nf4", device="cpu").numpy())

    packed, state = bnbf.quantize_4bit(
        torch.from_numpy(weight), blocksize=64, compress_statistics=double_quant, quant_type="nf4"
    )
    assert packed.dtype == torch.uint8 and state.nested == double_quant
    np.testing.assert_array_equal(state.code.numpy(), NF4_CODE)
    bnb_idx, bnb_absmax, reference = _decode_bnb(packed, state)

    # The reference decoder reads the format right: its indices are the NF4 formula's, nearest code to
    # value / absmax (bitsandbytes scales by the reciprocal), up to ties on a code boundary.
    blocks = weight.reshape(-1, 64)
    absmax = np.abs(blocks).max(axis=1)
    scaled = np.clip(blocks * (np.float32(1) / absmax)[:, None], -1, 1).reshape(-1)
    formula_idx = np.abs(scaled[:, None] - NF4_CODE).argmin(-1)
    tie = _at_midpoint(scaled, NF4_CODE)
    assert np.all((bnb_idx == formula_idx) | tie)
    assert tie.sum() <= 2  # float32 data almost never sits on a midpoint: measured 0 of 12288

    # Codes bit for bit (measured: all 6144 bytes equal); only a value on a code boundary could round
    # either way, so at most a tie may differ, by one code.
    q = quantize(jnp.asarray(weight), block_size=64, double_quant=double_quant)
    mine_idx = _unpack_nibbles(np.asarray(q.packed), weight.size)
    differ = mine_idx != bnb_idx
    assert np.all(tie[differ]) and np.all(np.abs(mine_idx - bnb_idx)[differ] == 1)
    if not differ.any():
        np.testing.assert_array_equal(np.asarray(q.packed), packed.numpy().reshape(-1))

    mine = np.asarray(dequantize(q, jnp.float32)).reshape(-1)
    if not double_quant:
        np.testing.assert_array_equal(np.asarray(q.absmax), bnb_absmax)
        np.testing.assert_allclose(mine[~differ], reference[~differ], rtol=0, atol=1e-7)
        return

    # 8-bit double-quantised absmax: equal, except where a value sits on a rounding boundary that the
    # two float32 computations of the dynamic map (numpy vs torch linspace) place 1 ulp apart
    # (measured: 1 of 192 blocks, one code apart, its centred absmax 2e-6 from a midpoint; recomputing
    # mean and scale here in numpy moves it by ~3e-7, hence the looser tolerance).
    mine_q, theirs_q = np.asarray(q.absmax).astype(int), state.absmax.numpy().astype(int)
    blocks_differ = np.flatnonzero(mine_q != theirs_q)
    assert len(blocks_differ) <= 2 and np.all(np.abs(mine_q - theirs_q)[blocks_differ] == 1)
    centred = (absmax - absmax.mean()) / np.abs(absmax - absmax.mean()).max()
    assert np.all(_at_midpoint(centred[blocks_differ], dynamic_map(), tol=1e-5))
    np.testing.assert_allclose(np.asarray(q.absmax_scale), state.state2.absmax.numpy(), rtol=1e-6)
    np.testing.assert_allclose(float(q.absmax_offset), state.offset.item(), rtol=1e-6)

    # Dequantised values equal the hand-decoded reference (1-ulp differences in the dynamic map aside)
    # on every block whose absmax code agrees; on the others they differ by exactly that absmax step.
    same = ~np.isin(np.arange(weight.size) // 64, blocks_differ) & ~differ
    np.testing.assert_allclose(mine[same], reference[same], rtol=0, atol=1e-7)
    mine_absmax = dynamic_map()[mine_q] * np.asarray(q.absmax_scale)[0] + float(q.absmax_offset)
    step = np.repeat(np.abs(mine_absmax - bnb_absmax), 64)[: weight.size]
    assert np.all(np.abs(mine - reference)[~differ] <= np.abs(NF4_CODE[bnb_idx][~differ]) * step[~differ] + 1e-7)


def test_without_double_quant_error_is_the_nf4_rounding(weight: np.ndarray) -> None:
    q = quantize(jnp.asarray(weight), block_size=64, double_quant=False)
    blocks = weight.reshape(-1, 64)
    absmax = np.abs(blocks).max(axis=1)
    np.testing.assert_array_equal(np.asarray(q.absmax), absmax)
    # Definition: each value becomes absmax * (the NF4 code value nearest to value / absmax).
    scaled = blocks / absmax[:, None]
    nearest = NF4_CODE[np.abs(scaled[..., None] - NF4_CODE).argmin(-1)]
    expected = (nearest * absmax[:, None]).reshape(weight.shape)
    np.testing.assert_allclose(np.asarray(dequantize(q, jnp.float32)), expected, rtol=1e-6, atol=1e-8)
    # So the error is bounded by half the widest gap between code values, per block.
    half_gap = np.max(np.diff(NF4_CODE)) / 2
    err = np.abs(np.asarray(dequantize(q, jnp.float32)) - weight).reshape(-1, 64)
    assert np.all(err <= half_gap * absmax[:, None] + 1e-7)
    assert q.nbytes < weight.nbytes / 6  # 4 bits per value + one fp32 per 64 values


def test_double_quant_absmax_error_is_bounded(weight: np.ndarray) -> None:
    q = quantize(jnp.asarray(weight), block_size=64, double_quant=True)
    single = quantize(jnp.asarray(weight), block_size=64, double_quant=False)
    np.testing.assert_array_equal(np.asarray(q.packed), np.asarray(single.packed))
    absmax = np.asarray(single.absmax)
    recon = np.asarray(dynamic_map())[np.asarray(q.absmax)] * np.asarray(q.absmax_scale)[0] + float(q.absmax_offset)
    step = np.max(np.diff(dynamic_map())) / 2 * np.abs(absmax - absmax.mean()).max()
    assert np.max(np.abs(recon - absmax)) <= step + 1e-7


def test_remainder_blocks_and_batch_axis() -> None:
    rng = np.random.default_rng(1)
    odd = rng.standard_normal((7, 33)).astype(np.float32)  # 231 values: a partial last block
    q = quantize(jnp.asarray(odd), block_size=64, double_quant=True)
    out = np.asarray(dequantize(q, jnp.float32))
    assert out.shape == odd.shape
    assert np.max(np.abs(out - odd)) < 0.2 * np.abs(odd).max()
    stacked = rng.standard_normal((3, 64, 32)).astype(np.float32)
    qs = quantize(jnp.asarray(stacked), batch_dims=1)
    assert qs.shape == (64, 32) and qs.packed.shape == (3, 1024)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(qs.packed[i]), np.asarray(quantize(jnp.asarray(stacked[i])).packed))
    sliced = jax.tree_util.tree_map(lambda x: x[1], qs)
    np.testing.assert_array_equal(np.asarray(dequantize(sliced)), np.asarray(dequantize(qs))[1])


def test_model_runs_on_nf4_weights_with_bf16_compute() -> None:
    config = tiny_config("qwen2_moe")  # dense attention + MoE experts + shared expert
    model = build_model(config, dtype=jnp.bfloat16)
    params = model.init(jax.random.key(0))
    qparams = quantize_params(model, params)
    layers = qparams["model"]["layers"]
    assert isinstance(layers["self_attn"]["q_proj"]["weight"], NF4Tensor)
    assert isinstance(layers["mlp"]["experts"]["gate_up_proj"], NF4Tensor)
    assert isinstance(layers["mlp"]["shared_expert"]["down_proj"]["weight"], NF4Tensor)
    for kept in (
        qparams["model"]["embed_tokens"]["weight"],
        qparams["lm_head"]["weight"],
        layers["input_layernorm"]["weight"],
        layers["self_attn"]["q_proj"]["bias"],
        layers["mlp"]["gate"]["weight"],
    ):
        assert not isinstance(kept, NF4Tensor)

    dequantised = jax.tree_util.tree_map(
        lambda x: dequantize(x, jnp.float32) if isinstance(x, NF4Tensor) else x,
        qparams,
        is_leaf=lambda x: isinstance(x, NF4Tensor),
    )
    ids = np.random.default_rng(0).integers(3, 256, (2, 16)).astype(np.int32)
    out_q = np.asarray(jax.jit(model.apply)(qparams, ids))
    out_dq = np.asarray(jax.jit(model.apply)(dequantised, ids))
    np.testing.assert_allclose(out_q, out_dq, rtol=1e-2, atol=1e-2 * np.abs(out_dq).max())


def test_qlora_backward_does_not_keep_dense_weights() -> None:
    """Gradients w.r.t. LoRA over an NF4 base recompute the dequantised weights instead of storing them:
    XLA's temporaries stay below one bf16 copy of the linear weights (measured: 0.6x with the recompute,
    2.6x without it)."""
    from aegis.train.lora import init_lora

    config = {
        **tiny_config("llama"),
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    }
    model = build_model(config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    params = jax.eval_shape(model.init, jax.random.key(0))
    qparams = jax.eval_shape(lambda p: quantize_params(model, p), params)
    lora = jax.eval_shape(
        lambda p: init_lora(model, p, rank=8, alpha=16, target_modules="all-linear", rng=jax.random.key(1)), params
    )
    ids = jax.ShapeDtypeStruct((1, 16), jnp.int32)

    def loss(lora_, qparams_, ids_):
        return jnp.mean(model.apply(qparams_, ids_, lora=lora_))

    stats = jax.jit(jax.grad(loss)).lower(lora, qparams, ids).compile().memory_analysis()
    layers = params["model"]["layers"]
    dense_bytes = sum(x.size * 2 for x in jax.tree_util.tree_leaves(layers) if x.ndim == 3)
    assert stats.temp_size_in_bytes < dense_bytes
