"""BitNet b1.58 compression: the quantisers against the paper's formulas, 2-bit packing, and the packed
folder against the dequantised-ternary model in the JAX engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from aegis.errors import InvalidConfigError
from aegis.forge._bitnet_pack import (
    absmax_int8,
    absmean_ternary,
    pack_ternary,
    round_clip,
    ternary_ste,
    unpack_ternary,
    unpack_ternary_jax,
)
from aegis.forge.bitnet import (
    BITNET_CONFIG,
    SIZE_CATEGORIES,
    compress_model,
    is_ternary_target,
    load_packed,
    size_category,
)
from tests.forge.conftest import read_folder
from tests.hf_folders import make_model_folder

# ----- quantisers vs formulas -------------------------------------------------------------------------------


def test_round_clip_rounds_ties_to_even_and_clips():
    x = np.array([-2.7, -1.5, -0.5, -0.49, 0.0, 0.49, 0.5, 0.51, 1.5, 2.5], np.float32)
    np.testing.assert_array_equal(round_clip(x, -1, 1), [-1, -1, 0, 0, 0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("per_channel", [False, True])
def test_absmean_matches_formula(per_channel):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, (48, 37)).astype(np.float32)
    w[5] = 0.0  # an all-zero row
    codes, scale = absmean_ternary(w, per_channel=per_channel)
    gamma = np.abs(w).mean(axis=1, keepdims=True) if per_channel else np.abs(w).mean(keepdims=True)
    expected = np.clip(np.round(w / (gamma.astype(np.float32) + np.float32(1e-5))), -1, 1)
    assert codes.dtype == np.int8 and set(np.unique(codes)) <= {-1, 0, 1}
    np.testing.assert_array_equal(codes, expected)
    np.testing.assert_allclose(scale.reshape(-1), gamma.reshape(-1), rtol=1e-6)
    assert scale.shape == ((48,) if per_channel else (1,))
    assert not codes[5].any()
    if per_channel:
        assert scale[5] == 0.0  # the zero row dequantises to zeros


def test_absmean_ties_at_half():
    w = np.array([[0.5, -0.5, 1.5, -1.5]], np.float32)  # mean |w| = 1 exactly, so w / gamma = w with eps = 0
    codes, scale = absmean_ternary(w, eps=0.0)
    assert scale.item() == 1.0
    np.testing.assert_array_equal(codes, [[0, 0, 1, -1]])
    zero, zscale = absmean_ternary(np.zeros((3, 8), np.float32))
    assert not zero.any() and zscale.item() == 0.0


def test_absmax_int8_matches_formula():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (4, 5, 64)).astype(np.float32)
    x[1, 2] = 0.0  # an all-zero token
    q, scale = absmax_int8(x)
    q, scale = np.asarray(q), np.asarray(scale)
    gmax = np.abs(x).max(axis=-1, keepdims=True)
    expected = np.clip(np.round(x * 127 / np.maximum(gmax, 1e-5)), -128, 127)
    np.testing.assert_array_equal(q, expected)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert not q[1, 2].any()
    np.testing.assert_allclose(scale, np.maximum(gmax, 1e-5) / 127, rtol=1e-6)  # zero token: eps / 127
    assert np.all(np.abs(q * scale - x) <= scale / 2 + 1e-6)


# ----- packing ----------------------------------------------------------------------------------------------


def test_code_mapping_and_bit_order():
    packed = pack_ternary(np.array([-1, 0, 1, 0, 1], np.int8))
    assert packed.tolist() == [0 | (1 << 2) | (2 << 4) | (1 << 6), 2 | (1 << 2) | (1 << 4) | (1 << 6)]


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 13, 64])
def test_pack_unpack_round_trips_bit_exactly(n):
    import jax.numpy as jnp

    codes = np.random.default_rng(n).integers(-1, 2, (3, 7, n)).astype(np.int8)
    packed = pack_ternary(codes)
    assert packed.dtype == np.uint8 and packed.shape == (3, 7, -(-n // 4))
    np.testing.assert_array_equal(unpack_ternary(packed, n), codes)
    np.testing.assert_array_equal(np.asarray(unpack_ternary_jax(jnp.asarray(packed), n)), codes)


# ----- size categories and targets ------------------------------------------------------------------------


def test_size_categories_follow_the_plan():
    assert [size_category(n).name for n in (115_008, 49_999_999, 50_000_000, 499_999_999, 1_999_999_999, 7 * 10**9)] == [
        "tiny", "tiny", "small", "small", "medium", "large"]
    assert [c.target_compression for c in SIZE_CATEGORIES.values()] == [6.0, 8.0, 10.0, 12.0]
    for c in SIZE_CATEGORIES.values():
        assert {"embeddings", "lm_head", "norms"} <= set(c.preserve)


def test_ternary_targets():
    assert is_ternary_target("model.layers.3.self_attn.q_proj.weight", (8, 8), 4)
    assert is_ternary_target("model.layers.0.mlp.experts.gate_up_proj", (4, 16, 8), 4)
    assert not is_ternary_target("model.layers.3.self_attn.q_proj.weight", (8, 8), 4, keep_layers=(-1,))
    assert not is_ternary_target("model.layers.3.self_attn.q_proj.bias", (8,), 4)
    assert not is_ternary_target("model.layers.0.input_layernorm.weight", (8,), 4)
    assert not is_ternary_target("model.layers.0.self_attn.q_norm.weight", (8,), 4)
    assert not is_ternary_target("model.layers.0.mlp.gate.weight", (4, 8), 4)  # MoE router
    assert not is_ternary_target("model.embed_tokens.weight", (320, 8), 4)
    assert not is_ternary_target("lm_head.weight", (320, 8), 4)


# ----- the packed folder ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_model_folder(tmp_path_factory.mktemp("bitnet") / "llama", layers=3, seed=0)


def _reference_logits(folder: Path, ids, *, per_channel=False, keep_last=False, scale_dtype=None):
    """The JAX engine on the original weights with each linear weight replaced by W_q * gamma (numpy)."""
    import jax
    import jax.numpy as jnp

    from aegis.train.modeling import build_model
    from aegis.train.weights import load_checkpoint

    config = json.loads((folder / "config.json").read_text())
    model = build_model(config)
    params = load_checkpoint(model, folder)
    layers = params["model"]["layers"]
    n = model.spec.num_layers
    for group in ("self_attn", "mlp"):
        for mod in layers[group].values():
            w = np.asarray(mod["weight"])
            out = w.copy()
            for i in range(n - 1 if keep_last else n):
                codes, gamma = absmean_ternary(w[i], per_channel=per_channel)
                if scale_dtype is not None:
                    gamma = gamma.astype(scale_dtype).astype(np.float32)
                out[i] = codes * gamma[..., None]
            mod["weight"] = jnp.asarray(out)
    return np.asarray(jax.jit(model.apply)(params, ids))


IDS = np.array([[1, 5, 7, 9, 20, 30, 41, 2], [3, 3, 100, 200, 250, 17, 8, 9]], np.int32)


@pytest.mark.parametrize("per_channel", [False, True])
def test_packed_logits_equal_dequantised_ternary_model(llama, tmp_path, per_channel):
    result = compress_model(llama, tmp_path / "p", per_channel=per_channel)
    packed = load_packed(tmp_path / "p", activations="none")  # W1.58 A16: the weights alone
    got = np.asarray(packed.apply(IDS))
    np.testing.assert_allclose(got, _reference_logits(llama, IDS, per_channel=per_channel), atol=1e-5, rtol=0)
    dense = np.asarray(packed.model.apply(packed.dense_params(), IDS))
    np.testing.assert_allclose(got, dense, atol=1e-5, rtol=0)
    assert result.size_category == "tiny" and result.per_channel is per_channel


def test_generate_serves_the_packed_model_as_trained_with_int8_activations(llama, tmp_path):
    """`aegis generate` runs a packed folder as `PackedModel.apply` does (W1.58 A8, the straight-through
    fine-tuning's forward), not the dequantised W1.58 A16 tree (which differs)."""
    import jax

    from aegis.forge.generate import _engine

    compress_model(llama, tmp_path / "p")
    packed = load_packed(tmp_path / "p")
    want = np.asarray(packed.apply(IDS))
    model, params, kind = _engine(tmp_path / "p")
    assert kind == "packed ternary"
    got = np.asarray(jax.jit(model.apply)(params, IDS))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    a16 = np.asarray(jax.jit(model.apply)(packed.dense_params(), IDS))
    assert np.abs(a16 - want).max() > 1e-3


def test_transformers_refuses_the_packed_folder_and_aegis_loads_it(llama, tmp_path):
    """Before, transformers loaded the folder as the plain llama of config.json, its decoder weights random."""
    transformers = pytest.importorskip("transformers")
    compress_model(llama, tmp_path / "p")
    for load in (transformers.AutoModelForCausalLM.from_pretrained, transformers.AutoConfig.from_pretrained):
        with pytest.raises(ValueError, match="model type `aegis-bitnet-b1.58`"):
            load(tmp_path / "p")
    assert "load_packed" in (tmp_path / "p" / "README.md").read_text()
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "p")("reset the password")["input_ids"]
    got = np.asarray(load_packed(tmp_path / "p", activations="none").apply(IDS))
    np.testing.assert_allclose(got, _reference_logits(llama, IDS), atol=1e-5, rtol=0)


def test_a_packed_folder_of_the_earlier_layout_still_loads(llama, tmp_path):
    compress_model(llama, tmp_path / "p")
    (tmp_path / "p" / "model_config.json").replace(tmp_path / "p" / "config.json")
    got = np.asarray(load_packed(tmp_path / "p", activations="none").apply(IDS))
    np.testing.assert_allclose(got, _reference_logits(llama, IDS), atol=1e-5, rtol=0)


def test_packed_file_round_trips_against_the_original(llama, tmp_path):
    result = compress_model(llama, tmp_path / "p")
    orig, out = read_folder(llama), read_folder(tmp_path / "p")
    meta = json.loads((tmp_path / "p" / BITNET_CONFIG).read_text())
    assert set(meta["packed"]) == set(result.packed) and len(result.packed) == 7 * 3
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= set(result.preserved)
    assert meta["packing"]["code_map"] == {"-1": 0, "0": 1, "1": 2}
    for name in result.packed:
        codes, gamma = absmean_ternary(orig[name])
        np.testing.assert_array_equal(out[name + ".ternary"], pack_ternary(codes))
        np.testing.assert_array_equal(unpack_ternary(out[name + ".ternary"], orig[name].shape[-1]), codes)
        np.testing.assert_array_equal(out[name + ".scale"], gamma)
        assert name not in out
    for name in result.preserved:
        np.testing.assert_array_equal(out[name], orig[name])
    zeros = sum(int((unpack_ternary(out[n + ".ternary"], orig[n].shape[-1]) == 0).sum()) for n in result.packed)
    assert result.zero_weights == zeros and 0.0 < result.sparsity < 1.0
    # fp32 linear weights: 32 bits -> 2 bits, plus one fp32 scale per tensor
    assert result.linear_bytes_original == sum(orig[n].nbytes for n in result.packed)
    assert 15.9 < result.linear_compression <= 16.0
    assert result.total_bytes_packed == sum(a.nbytes for a in out.values())
    assert result.total_compression > 1.0
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "p" / f).read_bytes() == (llama / f).read_bytes()
    assert (tmp_path / "p" / "model_config.json").read_bytes() == (llama / "config.json").read_bytes()
    assert json.loads((tmp_path / "p" / "config.json").read_text())["model_type"] == "aegis-bitnet-b1.58"


def test_keep_last_layer_and_bf16_scales(llama, tmp_path):
    import ml_dtypes

    result = compress_model(llama, tmp_path / "p", keep_layers=(-1,), scale_dtype="bfloat16")
    assert not any(".layers.2." in n for n in result.packed)
    assert "model.layers.2.self_attn.q_proj.weight" in result.preserved
    packed = load_packed(tmp_path / "p", activations="none")
    want = _reference_logits(llama, IDS, keep_last=True, scale_dtype=ml_dtypes.bfloat16)
    np.testing.assert_allclose(np.asarray(packed.apply(IDS)), want, atol=1e-5, rtol=0)


def test_tied_embeddings_and_sharded_input(tmp_path):
    src = make_model_folder(tmp_path / "tied", tie=True, max_shard_size="100KB")
    result = compress_model(src, tmp_path / "p")
    assert "lm_head.weight" not in result.preserved and "model.embed_tokens.weight" in result.preserved
    np.testing.assert_allclose(np.asarray(load_packed(tmp_path / "p", activations="none").apply(IDS)), _reference_logits(src, IDS),
                               atol=1e-5, rtol=0)


def test_bad_input_names_the_fix(llama, tmp_path):
    with pytest.raises(InvalidConfigError, match="input folder"):
        compress_model(llama, llama)
    with pytest.raises(InvalidConfigError, match="compress_model"):
        load_packed(llama)
    layers = json.loads((llama / "config.json").read_text())["num_hidden_layers"]
    for k in (layers, -layers - 1):  # a layer the model does not have was silently ignored
        with pytest.raises(InvalidConfigError, match=f"--keep-layer {k}: .* has {layers} decoder layers"):
            compress_model(llama, tmp_path / "k", keep_layers=(k,))
        assert not (tmp_path / "k").exists()


# ----- straight-through estimator ----------------------------------------------------------------------------


def test_ste_forward_is_ternary_and_gradient_is_identity():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(0, 0.02, (16, 24)).astype(np.float32))
    c = jnp.asarray(rng.normal(size=(16, 24)).astype(np.float32))
    codes, gamma = absmean_ternary(np.asarray(w))
    np.testing.assert_allclose(np.asarray(ternary_ste(w)), codes * gamma[..., None], rtol=1e-6, atol=1e-9)
    grad = jax.grad(lambda w: jnp.sum(ternary_ste(w) * c))(w)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(c))
    grad_pc = jax.jit(jax.grad(lambda w: jnp.sum(ternary_ste(w, per_channel=True) ** 2)))(w)
    np.testing.assert_allclose(np.asarray(grad_pc), 2 * np.asarray(ternary_ste(w, per_channel=True)), rtol=1e-6)


def test_aegis_compress_cli_writes_the_packed_folder_and_refuses_a_non_folder(tmp_path):
    from typer.testing import CliRunner

    from aegis.cli.forge import compress
    import typer

    app = typer.Typer()
    app.command("compress")(compress)
    app.command("noop")(lambda: None)  # two commands: typer keeps the command name in the argv
    src = make_model_folder(tmp_path / "m")
    res = CliRunner().invoke(app, ["compress", str(src), str(tmp_path / "packed")])
    assert res.exit_code == 0 and "ternary" in res.output and (tmp_path / "packed" / "bitnet_config.json").is_file()
    res = CliRunner().invoke(app, ["compress", str(tmp_path / "nope"), str(tmp_path / "p2")])
    assert res.exit_code == 2 and "not a model folder" in res.output
