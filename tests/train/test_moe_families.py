"""GPT-OSS and Phi-3.5-MoE (phimoe): the engine against transformers, the planner against PEFT and transformers.

Logits parity on the tiny configs (``conftest.TINY_CONFIGS["gpt_oss"]`` / ``["phimoe"]``, also run by
test_parity.py and test_three_way_counts.py) is here too with what makes these two different: a GPT-OSS model
whose sliding (window 8) and full layers both matter at 24 tokens, experts pushed past the SwiGLU clamp,
every parameter's gradient against torch autograd (sinks, router and expert biases, LayerNorm biases, the
lm_head bias), the engine's loss against torch's cross-entropy, checkpoints loaded and saved in transformers'
layout, and LoRA adapter sizes equal to PEFT's ("all-linear" wraps q/k/v/o in GPT-OSS, and also the
``router`` nn.Linear in Phi-MoE).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from family_checks import (
    check_checkpoint_round_trip,
    check_lora_counts_agree,
    check_training_loss_is_torch_cross_entropy,
    meta_model,
)
from family_checks import tokens as _tokens
from conftest import build_hf_model, tiny_config

from aegis.errors import CheckpointError, InvalidConfigError, UnsupportedArchitectureError
from aegis.models.profiles import profile_from_config
from aegis.schema import default_lora_targets
from aegis.train.modeling import build_model
from aegis.train.weights import load_checkpoint, save_checkpoint, to_hf_state_dict

NAMES = ["gpt_oss", "phimoe", "granitemoe"]
RTOL = 1e-4


def _logits_match(hf, model, params, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids).long()).logits.numpy()
    out = np.asarray(jax.jit(model.apply)(params, ids))
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=RTOL * float(np.abs(ref).max()))
    return ref


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers_loaded_from_a_saved_folder(name, hf_checkpoint):
    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    _logits_match(hf, model, load_checkpoint(model, folder), _tokens(256, (2, 24)))


def test_gpt_oss_sliding_and_full_layers_and_the_clamp_all_matter(tmp_path):
    """Layer 0 slides over 8 tokens, layer 1 attends to all 24; expert weights large enough that the SwiGLU clamp
    (limit 7) binds. Each is shown to matter by transformers itself (changing it changes its logits), and the
    engine matches transformers with all of them in play."""
    config = tiny_config("gpt_oss")
    assert build_model(config).spec.layer_window[:2] == (8, 2**30)
    hf = build_hf_model(config, std=0.5)
    ids = _tokens(256, (2, 24))
    folder = tmp_path / "gpt_oss-std0.5"
    hf.save_pretrained(folder)
    model = build_model(config)
    ref = _logits_match(hf, model, load_checkpoint(model, folder), ids)
    for change in ({"sliding_window": 64}, {"swiglu_limit": 1e9}):
        other = build_hf_model({**config, **change}, std=0.5)
        other.load_state_dict(hf.state_dict())
        with torch.no_grad():
            assert not np.allclose(other(torch.from_numpy(ids).long()).logits.numpy(), ref, atol=1e-3), change


_GRANITE_HUB_TO_MEMORY = ((".block_sparse_moe.input_linear.weight", ".block_sparse_moe.experts.gate_up_proj"),
                          (".block_sparse_moe.output_linear.weight", ".block_sparse_moe.experts.down_proj"),
                          (".block_sparse_moe.router.layer.weight", ".block_sparse_moe.router.weight"))


def _granite_in_memory_names(tensors: dict) -> dict:
    """Granite MoE checkpoints name the fused experts input_linear/output_linear and the router router.layer;
    transformers 5 holds them as experts.gate_up_proj/down_proj and router.weight (same tensors, renamed)."""
    out = {}
    for key, value in tensors.items():
        for hub, memory in _GRANITE_HUB_TO_MEMORY:
            key = key.replace(hub, memory)
        out[key] = value
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_matches_torch_autograd(name, hf_checkpoint):
    """Through sink attention, the router bias, expert biases and the clamped SwiGLU (GPT-OSS); LayerNorm biases,
    sparsemixer routing and the lm_head bias (Phi-MoE). Both layouts are compared in transformers' names (the
    engine's gradients written out like a checkpoint)."""
    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids, targets = _tokens(256, (2, 20)), _tokens(256, (2, 20), seed=7)

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, ids))
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    grads = to_hf_state_dict(model, jax.jit(jax.grad(loss))(params))
    hf.zero_grad()
    logp = torch.log_softmax(hf(torch.from_numpy(ids).long()).logits, dim=-1)
    (-logp.gather(-1, torch.from_numpy(targets).long()[..., None]).mean()).backward()
    theirs = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    if name == "phimoe":  # the checkpoint keeps Mixtral's per-expert names; compare in transformers' fused layout
        ours = {k: v for k, v in grads.items() if ".block_sparse_moe." not in k}
        for i in range(model.spec.num_layers):
            base = f"model.layers.{i}.block_sparse_moe."
            e = range(model.spec.moe.num_experts)
            ours[f"model.layers.{i}.mlp.router.weight"] = grads[base + "gate.weight"]
            w = {n: [grads[f"{base}experts.{j}.{n}.weight"] for j in e] for n in ("w1", "w3", "w2")}
            ours[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
                [np.concatenate([a, b]) for a, b in zip(w["w1"], w["w3"], strict=True)]
            )
            ours[f"model.layers.{i}.mlp.experts.down_proj"] = np.stack(w["w2"])
        grads = ours
    if name == "granitemoe":
        grads = _granite_in_memory_names(grads)
    assert set(grads) == set(theirs)
    for key, ref in theirs.items():
        np.testing.assert_allclose(grads[key], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()), err_msg=key)


@pytest.mark.parametrize("name", NAMES)
def test_the_training_loss_is_torch_cross_entropy(name, hf_checkpoint):
    """The engine's token loss on a padded batch equals torch's cross-entropy (`family_checks`)."""
    check_training_loss_is_torch_cross_entropy(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_keeps_transformers_names_and_values(name, hf_checkpoint, tmp_path):
    """GPT-OSS experts are stored transposed with gate/up interleaved, Phi-MoE's per expert under
    block_sparse_moe: loading and saving gives back transformers' own tensors, which it loads again."""
    check_checkpoint_round_trip(*hf_checkpoint(name), tmp_path / "saved")


@pytest.mark.parametrize("name", NAMES)
def test_lora_adapter_sizes_equal_peft_and_the_engine(name):
    """Planner == PEFT == the engine's adapters, for "all-linear" and for the plan's default targets (q/k/v/o:
    the experts are not nn.Linear, and routers stay out of the defaults)."""
    config = tiny_config(name)
    profile = profile_from_config(config, model_id=name, source="path")
    defaults = default_lora_targets(profile.linear_modules)
    assert defaults == ("q_proj", "k_proj", "v_proj", "o_proj")
    check_lora_counts_agree(config, (("all-linear",), defaults))


def test_the_planner_mirrors_bitsandbytes_and_transformers_attention():
    """bitsandbytes replaces exact nn.Linear modules only: the attention projections, never the fused experts
    nor Phi-MoE's nn.Linear-subclass router. transformers runs GPT-OSS eager (its sinks refuse sdpa)."""
    from transformers import GptOssForCausalLM, PhimoeForCausalLM

    from aegis.models.families import get_family

    for name, cls in (("gpt_oss", GptOssForCausalLM), ("phimoe", PhimoeForCausalLM)):
        config = tiny_config(name)
        profile = profile_from_config(config, model_id=name, source="path")
        quantized = {m.name for m in profile.linear_modules if m.quantizable}
        hf = meta_model(config)
        exact = {n.rsplit(".", 1)[-1] for n, m in hf.model.layers[0].named_modules() if type(m) is torch.nn.Linear}
        assert quantized == exact == {"q_proj", "k_proj", "v_proj", "o_proj"}
        assert get_family(config).sdpa_supported == cls._supports_sdpa


def test_mxfp4_dequantisation_is_transformers_bit_for_bit():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from aegis.train.modeling.gpt_oss_phimoe import mxfp4_dequantize

    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (3, 6, 2, 16), dtype=np.uint8)  # every code, both nibbles
    scales = rng.integers(100, 150, (3, 6, 2), dtype=np.uint8)  # 2**-27 .. 2**22
    ours = mxfp4_dequantize(blocks, scales)
    for dtype in (torch.float32, torch.bfloat16):
        ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=dtype)
        np.testing.assert_array_equal(torch.from_numpy(ours).to(dtype).float().numpy(), ref.float().numpy())
    with pytest.raises(CheckpointError, match="MXFP4"):
        mxfp4_dequantize(blocks, scales[:, :, :1])


def _mxfp4_folder(tmp_path, config):
    """A GPT-OSS checkpoint as the published ones are: experts as MXFP4 blocks + scales, the rest as is."""
    from safetensors.numpy import save_file

    hf = build_hf_model(config)
    rng = np.random.default_rng(7)
    tensors = {}
    for k, v in hf.state_dict().items():
        v = v.detach().numpy()
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, rows_in, cols_out = v.shape  # [E, in, out]: stored as [E, out, in / 32, 16] codes + [E, out, in / 32]
            tensors[k + "_blocks"] = rng.integers(0, 256, (e, cols_out, rows_in // 32, 16), dtype=np.uint8)
            tensors[k + "_scales"] = rng.integers(120, 126, (e, cols_out, rows_in // 32), dtype=np.uint8)
        else:
            tensors[k] = v
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                 "model.embed_tokens", "lm_head"]}
    full = {**config, "architectures": ["GptOssForCausalLM"], "quantization_config": quant}
    (tmp_path / "config.json").write_text(json.dumps(full))
    return full


def test_an_mxfp4_checkpoint_loads_trains_and_saves_in_bf16_like_transformers(tmp_path):
    """The published gpt-oss checkpoints (MXFP4 experts): the engine reads them, its logits equal transformers'
    (which dequantises them on CPU), and a saved folder holds plain expert tensors without quantization_config
    that transformers loads to the same logits."""
    from transformers import AutoModelForCausalLM, Mxfp4Config

    src, out = tmp_path / "mxfp4", tmp_path / "saved"
    src.mkdir()
    config = _mxfp4_folder(src, tiny_config("gpt_oss"))
    ref = AutoModelForCausalLM.from_pretrained(
        src, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model = build_model(config)
    params = load_checkpoint(model, src, dtype=jnp.float32)
    ids = _tokens(256, (2, 24))
    _logits_match(ref, model, params, ids)

    save_checkpoint(model, params, out)
    saved = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in saved
    again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    _logits_match(again, model, params, ids)


def test_configs_the_engine_cannot_follow_get_one_line_errors():
    with pytest.raises(UnsupportedArchitectureError, match="num_experts_per_tok"):
        build_model({**tiny_config("phimoe"), "num_experts_per_tok": 3})
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                "short_mscale": 1.2, "long_mscale": 1.3, "original_max_position_embeddings": 64}
    with pytest.raises(UnsupportedArchitectureError, match="mscale"):
        build_model({**tiny_config("phimoe"), "rope_scaling": longrope})
    with pytest.raises(InvalidConfigError, match="sinks"):
        build_model(tiny_config("gpt_oss"), attention="dot_product")


def test_phimoe_longrope_matches_transformers(hf_checkpoint):
    """Phi-3.5-MoE's LongRoPE: transformers uses the short factors and scales cos/sin by short_mscale."""
    factors = [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0]  # head_dim 16: 8 frequencies
    config = {**tiny_config("phimoe"), "rope_scaling": {
        "type": "longrope", "short_factor": factors, "long_factor": [f * 2 for f in factors],
        "short_mscale": 1.243163121016122, "long_mscale": 1.243163121016122, "original_max_position_embeddings": 64}}
    hf, folder = hf_checkpoint(config)
    model = build_model(json.loads((folder / "config.json").read_text()))
    _logits_match(hf, model, load_checkpoint(model, folder), _tokens(256, (2, 24)))


def test_catalog_gpt_oss_20b_counts_and_plans():
    """The bundled gpt-oss-20b config: 20,914,757,184 parameters (the card's 21B), a plan runs eager attention."""
    import aegis
    from aegis.models import catalog

    entry = catalog.find_model("gpt-oss-20b")
    profile = profile_from_config(catalog.read_model_config(entry), model_id=entry.id, source="catalog")
    assert profile.total_params == 20_914_757_184
    assert profile.active_params_per_token - profile.embedding_params == 3_608_307_264  # the card's 3.6B
    est = aegis.estimate_memory(entry.id, method="qlora", micro_batch_size=1, seq_len=1024)
    assert est.total_bytes > 0


@pytest.mark.slow  # compiles a train step
@pytest.mark.parametrize("name", NAMES)
def test_one_engine_training_step_moves_each_weight_by_torchs_gradient(name, hf_checkpoint):
    """``make_train_step`` (full fine-tuning, SGD without momentum or clipping): the step's loss is torch's mean
    cross-entropy and every parameter moves by ``-lr x`` torch's gradient of it."""
    from aegis.schema import TrainConfig
    from aegis.train.step import OptimizerSettings, init_state, make_optimizer, make_train_step

    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids, targets = _tokens(256, (2, 16)), _tokens(256, (2, 16), seed=5)
    settings = OptimizerSettings(learning_rate=1e-2, b1=0.0, clip_norm=0.0)
    tx = make_optimizer(TrainConfig(method="full", precision="fp32", optimizer="sgd"), settings)
    step = jax.jit(make_train_step(model, tx, settings))
    batch = {
        "input_ids": ids, "targets": targets, "loss_mask": np.ones((2, 16), np.float32),
        "segment_ids": np.ones((2, 16), np.int32), "positions": np.broadcast_to(np.arange(16, dtype=np.int32), (2, 16)),
    }
    state, metrics = step(init_state(params, tx, settings, jax.random.key(0)), None,
                          {k: jnp.asarray(v)[None] for k, v in batch.items()})
    logits = hf(torch.from_numpy(ids).long()).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), torch.from_numpy(targets).long().reshape(-1))
    loss.backward()
    np.testing.assert_allclose(float(metrics["loss"]), loss.item(), rtol=1e-5)
    before, after = to_hf_state_dict(model, params), to_hf_state_dict(model, state.trainable)
    grads = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    if name == "phimoe":  # compare the per-expert checkpoint tensors with slices of the fused gradients
        for i in range(model.spec.num_layers):
            fused_gu = grads.pop(f"model.layers.{i}.mlp.experts.gate_up_proj")
            fused_d = grads.pop(f"model.layers.{i}.mlp.experts.down_proj")
            grads[f"model.layers.{i}.block_sparse_moe.gate.weight"] = grads.pop(f"model.layers.{i}.mlp.router.weight")
            half = fused_gu.shape[1] // 2
            for e in range(model.spec.moe.num_experts):
                base = f"model.layers.{i}.block_sparse_moe.experts.{e}."
                grads[base + "w1.weight"], grads[base + "w3.weight"] = fused_gu[e, :half], fused_gu[e, half:]
                grads[base + "w2.weight"] = fused_d[e]
    if name == "granitemoe":
        before, after = _granite_in_memory_names(before), _granite_in_memory_names(after)
    assert set(grads) == set(before)
    for key, g in grads.items():
        moved = (before[key] - after[key]) / settings.learning_rate
        # the move is read back from fp32 weights: it is known to a few ulps of the weight, over the learning rate
        resolution = 4 * float(np.finfo(np.float32).eps) * float(np.abs(before[key]).max()) / settings.learning_rate
        np.testing.assert_allclose(moved, g, rtol=2e-3, atol=2e-3 * float(np.abs(g).max()) + resolution, err_msg=key)
