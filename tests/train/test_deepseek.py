"""DeepSeek-V2 / V3 (MLA + MoE with shared experts and leading dense layers): planner, engine and transformers agree.

Logits parity for the two tiny configs in conftest.TINY_CONFIGS also runs in test_parity.py; here: parity on
variants (a non-zero e_score_correction_bias, V2's group-limited routing, V3 without interleaved rope or
q_lora_rank), every gradient against torch autograd, the training loss against torch's cross-entropy, a saved
HF folder loaded and written back, LoRA adapters against PEFT both ways, and the parameter counts of the real
configs against the authors' published totals.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from family_checks import check_training_loss_is_torch_cross_entropy, tokens as _tokens
from conftest import build_hf_model, tiny_config

from aegis.models.architectures import config_keys as arch
from aegis.models.profiles import profile_from_config
from aegis.train.modeling import build_model
from aegis.models.shapes import BUFFER_LEAVES
from aegis.train.weights import load_checkpoint, save_checkpoint, to_hf_state_dict

NAMES = ["deepseek_v3", "deepseek_v2_lite"]
VARIANTS = {
    "v3 score bias": (tiny_config("deepseek_v3"), True),
    "v3 no q_lora, half-rotated rope, no yarn": (
        {**tiny_config("deepseek_v3"), "q_lora_rank": None, "rope_interleave": False, "rope_scaling": None,
         "norm_topk_prob": False, "first_k_dense_replace": 2}, True,
    ),
    "v2 group-limited": (
        {**tiny_config("deepseek_v2_lite"), "q_lora_rank": 24, "topk_method": "group_limited_greedy", "n_group": 4,
         "topk_group": 2, "routed_scaling_factor": 16.0}, False,
    ),
    "v2 all layers sparse": ({**tiny_config("deepseek_v2_lite"), "first_k_dense_replace": 0}, False),
}


def _hf(config: dict, score_bias: bool, folder):
    hf = build_hf_model(config)
    if score_bias:  # a buffer, left at zero by the random init: make it change which experts are chosen
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for layer in hf.model.layers[config.get("first_k_dense_replace", 0):]:
                bias = layer.mlp.gate.e_score_correction_bias
                bias.copy_(torch.randn(bias.shape, generator=gen) * 0.3)
    hf.save_pretrained(folder)
    return hf


def _meta_model(config: dict):
    import transformers

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(model_type, **cfg))


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _engine_count(config: dict) -> int:
    """The engine tree's parameters: every leaf but the buffers (V3's e_score_correction_bias, one per MoE layer)."""
    shapes = build_model(config).param_shapes()
    flat = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))[0]
    buffers = [s for path, s in flat if path[-1].key in BUFFER_LEAVES]
    assert all(s[-1] == config.get("n_routed_experts", 256) for s in buffers)
    return sum(int(np.prod(s)) for path, s in flat if path[-1].key not in BUFFER_LEAVES)


@pytest.mark.parametrize("scan_layers", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(variant, scan_layers, tmp_path):
    config, score_bias = VARIANTS[variant]
    hf = _hf(config, score_bias, tmp_path / "hf")
    model = build_model(json.loads((tmp_path / "hf" / "config.json").read_text()), scan_layers=scan_layers)
    params = load_checkpoint(model, tmp_path / "hf")
    ids = _tokens(256, (2, 24))
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids).long()).logits.numpy()
    out = np.asarray(jax.jit(model.apply)(params, ids))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


def test_the_score_bias_and_the_yarn_scale_change_the_output(tmp_path):
    """The checks above could not notice a dropped e_score_correction_bias or mscale: both move the logits."""
    config = tiny_config("deepseek_v3")
    _hf(config, True, tmp_path / "hf")
    model = build_model(json.loads((tmp_path / "hf" / "config.json").read_text()))
    params = load_checkpoint(model, tmp_path / "hf")
    ids = _tokens(256, (2, 24))
    ref = np.asarray(jax.jit(model.apply)(params, ids))
    zeroed = jax.tree_util.tree_map(lambda x: x, params)
    bias = zeroed["model"]["layers"]["mlp"]["gate"]["e_score_correction_bias"]
    zeroed["model"]["layers"]["mlp"]["gate"]["e_score_correction_bias"] = jnp.zeros_like(bias)
    assert np.max(np.abs(np.asarray(jax.jit(model.apply)(zeroed, ids)) - ref)) > 1e-3 * np.abs(ref).max()
    plain_scale = model.spec.mla.qk_head_dim**-0.5
    plain = dataclasses.replace(model, spec=dataclasses.replace(model.spec, attn_scale=plain_scale))
    assert plain.spec.attn_scale != model.spec.attn_scale
    assert np.max(np.abs(np.asarray(jax.jit(plain.apply)(params, ids)) - ref)) > 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("name", NAMES)
def test_every_gradient_matches_torch_autograd(name, hf_checkpoint):
    """Through MLA (latent norms, rope on the rotated part), the router and the grouped experts, the shared
    experts and the dense layer. The score-correction bias is a buffer in transformers: no gradient here either."""
    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    ids, targets = _tokens(256, (2, 20)), _tokens(256, (2, 20), seed=7)

    def loss(p):
        logp = jax.nn.log_softmax(model.apply(p, ids))
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))

    grads = to_hf_state_dict(model, jax.jit(jax.grad(loss))(params))
    for key in [k for k in grads if k.endswith("e_score_correction_bias")]:
        assert not np.any(grads.pop(key)), key
    hf.zero_grad()
    logp = torch.log_softmax(hf(torch.from_numpy(ids).long()).logits, dim=-1)
    (-logp.gather(-1, torch.from_numpy(targets).long()[..., None]).mean()).backward()
    theirs = {}
    for k, p in hf.named_parameters():
        if k.endswith("mlp.experts.gate_up_proj"):  # checkpoints keep experts one by one: compare in that layout
            half = p.shape[1] // 2
            for e in range(p.shape[0]):
                base = k[: -len("gate_up_proj")] + f"{e}."
                theirs[base + "gate_proj.weight"] = p.grad[e, :half].numpy()
                theirs[base + "up_proj.weight"] = p.grad[e, half:].numpy()
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(p.shape[0]):
                theirs[k[: -len("down_proj")] + f"{e}.down_proj.weight"] = p.grad[e].numpy()
        else:
            theirs[k] = p.grad.numpy()
    assert set(grads) == set(theirs)
    for key, ref in theirs.items():
        np.testing.assert_allclose(grads[key], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()), err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_training_loss_is_torch_cross_entropy(name, hf_checkpoint):
    """The engine's token loss on a padded batch equals torch's cross-entropy (`family_checks`)."""
    check_training_loss_is_torch_cross_entropy(*hf_checkpoint(name))


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_keeps_transformers_names_and_values(name, hf_checkpoint, tmp_path):
    """The dense stack and the MoE stack map back to transformers' model.layers.{i} names (experts one by one)."""
    from transformers import AutoModelForCausalLM

    hf, folder = hf_checkpoint(name)
    model = build_model(json.loads((folder / "config.json").read_text()))
    params = load_checkpoint(model, folder)
    assert params["model"]["dense_layers"]["mlp"]["gate_proj"]["weight"].shape[0] == 1
    assert params["model"]["layers"]["mlp"]["experts"]["gate_up_proj"].shape[:2] == (2, 8)
    ours = to_hf_state_dict(model, params)
    from safetensors.numpy import load_file

    theirs = load_file(folder / "model.safetensors")  # what save_pretrained wrote: experts one by one
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    out = save_checkpoint(model, params, tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = torch.arange(3, 19).reshape(1, 16)
    with torch.no_grad():
        np.testing.assert_allclose(reloaded(ids).logits.numpy(), hf(ids).logits.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("targets", ["all-linear", ["q_a_proj", "kv_b_proj", "gate_proj", "up_proj", "down_proj"]])
def test_lora_adapters_match_peft_both_ways(targets, tmp_path):
    """PEFT (with transformers 5's DeepSeek conversion) adapts the attention, the fused experts (2r on gate_up)
    and, under all-linear, the router; never the dense or shared-expert MLPs. The engine creates the same
    adapters on both stacks, reads PEFT's file to the same logits, and writes one PeftModel reproduces."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    import aegis
    from aegis.train.lora import init_lora, lora_param_count
    from aegis.train.weights import CheckpointReader, load_lora_adapter, save_lora_adapter

    config = tiny_config("deepseek_v3")
    model = build_model(config)
    params = jax.tree_util.tree_map(lambda x: x * 5.0, model.init(jax.random.key(0)))
    base = save_checkpoint(model, params, tmp_path / "base")
    hf = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager").eval()
    peft_model = get_peft_model(hf, LoraConfig(r=4, lora_alpha=8, target_modules=targets)).eval()
    wrapped = {n.split(".lora_A")[0] for n, _ in peft_model.named_parameters() if ".lora_A." in n}
    assert not any("shared_experts" in n or "layers.0.mlp" in n for n in wrapped), wrapped
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    peft_model.save_pretrained(tmp_path / "peft")
    count = peft_model.get_nb_trainable_parameters()[0]
    ids = _tokens(256, (2, 12))
    with torch.no_grad():
        ref = peft_model(torch.from_numpy(ids).long()).logits.numpy()
    apply = jax.jit(model.apply)
    tol = {"rtol": 1e-4, "atol": 1e-4 * np.abs(ref).max()}

    theirs = load_lora_adapter(model, tmp_path / "peft")
    np.testing.assert_allclose(np.asarray(apply(params, ids, lora=theirs)), ref, **tol)
    fresh = init_lora(model, params, rank=4, alpha=8, target_modules=targets, rng=jax.random.key(1))
    assert lora_param_count(fresh) == lora_param_count(theirs) == count
    assert jax.tree_util.tree_map(np.shape, fresh.tree) == jax.tree_util.tree_map(np.shape, theirs.tree)
    profile = profile_from_config(config, model_id="tiny", source="path")
    plan_targets = ("all-linear",) if targets == "all-linear" else tuple(targets)
    assert profile.trainable_params("lora", aegis.LoRAConfig(rank=4, target_modules=plan_targets)) == count

    ours = jax.tree_util.tree_map(lambda x: x * 0.5, theirs)
    out = save_lora_adapter(model, ours, tmp_path / "ours", base_model_name_or_path=str(base))

    def saved(folder):
        reader = CheckpointReader(folder / "adapter_model.safetensors")
        return {k: reader.shape(k) for k in reader.names()}

    assert saved(out) == saved(tmp_path / "peft")
    hf2 = AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager").eval()
    with torch.no_grad():
        ref2 = PeftModel.from_pretrained(hf2, out).eval()(torch.from_numpy(ids).long()).logits.numpy()
    logits = np.asarray(apply(params, ids, lora=ours))
    np.testing.assert_allclose(logits, ref2, rtol=1e-4, atol=1e-4 * np.abs(ref2).max())


def test_the_real_configs_count_what_the_authors_publish():
    """DeepSeek-V3's class defaults are V3's config: 671B total, 37B activated per token (the V3 paper, without
    its 14B MTP module, which transformers does not build)."""
    v3 = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61,
          "num_attention_heads": 128}
    hf = _meta_model(v3)
    profile = profile_from_config(v3, model_id="v3", source="path")
    assert profile.total_params == _engine_count(v3) == _params(hf)
    assert round(profile.total_params / 1e9) == 671
    assert round(profile.active_params_per_token / 1e9) in (37, 38)  # 37.55B: the paper rounds down


def test_dense_width_defaults_are_transformers_class_defaults():
    from transformers import CONFIG_MAPPING

    for model_type, width in arch.MLA_DENSE_WIDTH_DEFAULTS.items():
        fields = {f.name: f.default for f in dataclasses.fields(CONFIG_MAPPING[model_type])}
        assert fields["intermediate_size"] == width


def test_configs_the_engine_cannot_follow_get_one_line_errors():
    from aegis.errors import UnsupportedArchitectureError

    with pytest.raises(UnsupportedArchitectureError, match="topk_method"):
        build_model({**tiny_config("deepseek_v2_lite"), "topk_method": "noaux_tc"})
    with pytest.raises(UnsupportedArchitectureError, match="num_key_value_heads"):
        build_model({**tiny_config("deepseek_v3"), "num_key_value_heads": 2})


def test_the_catalog_serves_v2_lite_v2_and_v3_with_r1_and_0324_as_aliases():
    import aegis
    from aegis.models import catalog

    assert catalog.find_model("deepseek-ai/DeepSeek-R1").id == "deepseek-ai/DeepSeek-V3"
    assert catalog.find_model("deepseek-ai/DeepSeek-V3-0324").id == "deepseek-ai/DeepSeek-V3"
    assert catalog.find_model("DeepSeek-V2-Lite-Chat").id == "deepseek-ai/DeepSeek-V2-Lite"
    assert catalog.find_model("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B").id == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
    lite = catalog.read_model_config(catalog.find_model("deepseek-ai/DeepSeek-V2-Lite"))
    assert lite["q_lora_rank"] is None  # put back: transformers would otherwise build q_a/q_b at its 1536 default
    spec = build_model(lite).spec
    assert spec.dense_layers == 1 and spec.moe.router == "softmax" and spec.moe.top_k == 6
    mscale = 0.1 * 0.707 * np.log(40) + 1  # yarn_get_mscale(40, mscale_all_dim=0.707)
    np.testing.assert_allclose(spec.attn_scale, 192**-0.5 * mscale**2, rtol=1e-12)
    v3 = build_model(catalog.read_model_config(catalog.find_model("deepseek-ai/DeepSeek-V3"))).spec
    assert (v3.dense_layers, v3.moe.router, v3.moe.n_group, v3.moe.topk_group) == (3, "sigmoid", 8, 4)
    for method in ("lora", "qlora", "full"):
        est = aegis.estimate_memory("deepseek-ai/DeepSeek-V2-Lite", method=method, micro_batch_size=1, seq_len=512)
        assert est.total_bytes > 15_706_484_224  # at least the weights in 8 bits
