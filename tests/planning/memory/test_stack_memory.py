"""Stack profiles in the memory engine, each mechanism against what torch / PEFT / transformers do on CPU.

Live measurements run under the installed transformers (5.x); the transformers 4.48.1 references are in
tests/data/stack_probe_t448.json, written by `python -m tools.stack_probe` under transformers 4.48.1 + PEFT, and
the MoE module layouts of the last 4.x release (4.57.6) in tests/data/stack_probe_t457.json (`--layouts-only`;
each file records the versions). Dropout runs through ``torch.native_dropout``, what ``F.dropout`` is on CUDA.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aegis.errors import InvalidConfigError
from aegis.models.families import get_family
from aegis.models.resolve import resolve_model
from aegis.planning.memory import estimate
from aegis.planning.memory._dtypes import placement
from aegis.planning.memory.activations import layer_activation_terms, loss_bytes_per_token
from aegis.planning.memory.estimate import estimate_memory, step_setting
from aegis.planning.memory.stack_effects import profile_for_stack
from aegis.models.profiles import profile_from_config
from aegis.schema import LoRAConfig, StackProfile, TrainConfig
from tools import stack_probe

PROBE_448 = json.loads((Path(__file__).parents[2] / "data" / "stack_probe_t448.json").read_text(encoding="utf-8"))


def _setting_and_layer(config: dict, targets, dropout: float, version: str, method: str = "lora"):
    stack = StackProfile(transformers_version=version)
    profile = profile_for_stack(profile_from_config(config, model_id="tiny", source="path"), stack)
    lora = LoRAConfig(rank=stack_probe.RANK, target_modules=tuple(targets), dropout=dropout)
    cfg = TrainConfig(method=method, seq_len=stack_probe.SEQ, lora=lora, stack=stack, autocast=False)  # the probe runs no autocast
    fam = get_family(profile.config)
    setting = step_setting(profile, cfg, fam, placement(cfg))
    return fam, profile, setting, fam.layers_for(profile.config, profile.layout_major)[0]


def _engine_layer_bytes(config: dict, targets, dropout: float, version: str) -> float:
    fam, profile, setting, layer = _setting_and_layer(config, targets, dropout, version)
    return sum(layer_activation_terms(fam, profile.config, layer, setting).values())


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_lora_layer_saved_bytes_match_peft_measured_here(dropout):
    """LoRA dropout: a dropout output and a bool mask per wrapped module, as PEFT + native_dropout save them."""
    import transformers

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    measured = stack_probe.layer_saved_bytes_per_token(stack_probe.TINY_LLAMA, targets, dropout)
    assert _engine_layer_bytes(stack_probe.TINY_LLAMA, targets, dropout, transformers.__version__) == measured


@pytest.mark.parametrize("row", PROBE_448["rows"], ids=lambda r: r["name"])
def test_transformers_448_layer_saved_bytes_match_the_recorded_trace(row):
    """4.48: SDPA repeats GQA keys/values; Mixtral's experts are nn.Linear looped over (index_add_ sources,
    gathered routing weights, torch.where indices); dropout as above. Within 0.2% (the router's 4 B/token)."""
    predicted = _engine_layer_bytes(row["config"], row["targets"], row["dropout"], PROBE_448["transformers"])
    assert predicted == pytest.approx(row["bytes_per_token"], rel=2e-3)


def test_transformers_448_changes_what_the_current_layout_predicts():
    """The recorded 4.48 trace is not what the transformers 5 model predicts: the profile matters."""
    row = next(r for r in PROBE_448["rows"] if r["name"] == "mixtral lora experts")
    v5 = _engine_layer_bytes(row["config"], row["targets"], row["dropout"], "5.23.0")
    assert abs(v5 - row["bytes_per_token"]) / row["bytes_per_token"] > 0.1


PROBE_457 = json.loads((Path(__file__).parents[2] / "data" / "stack_probe_t457.json").read_text(encoding="utf-8"))
LAYOUTS = [(probe["transformers"], model_type, layout) for probe in (PROBE_448, PROBE_457)
           for model_type, layout in probe["moe_layouts"].items()]


@pytest.mark.parametrize(("version", "model_type", "layout"), LAYOUTS, ids=[f"{v}-{t}" for v, t, _ in LAYOUTS])
def test_moe_modules_match_the_recorded_transformers_4(version, model_type, layout):
    """Under each recorded transformers 4 release, every MoE type it builds: the nn.Linear modules bitsandbytes
    would quantise (in, out, how many) and PEFT's trainable count for the routed experts' LoRA names are the
    planner's for that version (separate expert nn.Linear where transformers 4 has them, fused tensors where not)."""
    profile = profile_for_stack(profile_from_config(layout["config"], model_id="tiny", source="path"),
                                StackProfile(transformers_version=version))
    ours = sorted((m.in_features, m.out_features, m.count) for m in profile.linear_modules if m.quantizable)
    assert ours == sorted(tuple(v) for v in layout["linears"].values())
    lora = LoRAConfig(rank=PROBE_448["rank"], target_modules=tuple(layout["lora_targets"]))
    assert profile.trainable_params("lora", lora) == layout["lora_trainable"]
    assert profile.total_params == profile_from_config(layout["config"], model_id="tiny", source="path").total_params


def test_transformers_5_fuses_the_experts_transformers_4_kept_separate():
    """The same Mixtral under transformers 5: fused gate_up at rank 2r, so another LoRA count than 4.48's."""
    layout = PROBE_448["moe_layouts"]["mixtral"]
    lora = LoRAConfig(rank=PROBE_448["rank"], target_modules=tuple(layout["lora_targets"]))
    v5 = profile_from_config(stack_probe.TINY_MIXTRAL, model_id="tiny", source="path")
    assert v5.trainable_params("lora", lora) != layout["lora_trainable"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_loss_peak_matches_transformers_loss(dtype):
    """The loss buffers per [token, vocab]: measured for the installed transformers, recorded for 4.48.1 (whose
    ForCausalLMLoss makes a shifted fp32 copy of the logits)."""
    import transformers

    def engine(version: str) -> float:
        fam, profile, setting, _ = _setting_and_layer(stack_probe.TINY_LLAMA, ["q_proj"], 0.0, version)
        setting = setting._replace(lm_head_bytes=2 if dtype == "bfloat16" else 4)
        return loss_bytes_per_token(fam, profile.config, setting)[0] / fam.vocab(profile.config)

    here = stack_probe.loss_peak_bytes_per_logit(dtype)
    assert engine(transformers.__version__) == pytest.approx(here, rel=1e-2)
    assert engine(PROBE_448["transformers"]) == pytest.approx(PROBE_448["loss_peak_bytes_per_logit"][dtype], rel=1e-2)


def test_kbit_prep_dtypes_follow_peft():
    """prepare_model_for_kbit_training upcasts every bf16 parameter that is not Params4bit to fp32 and the decoder
    then runs in fp32; without it the stream stays bf16. The engine's placement says the same."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in stack_probe.TINY_LLAMA.items() if k != "architectures"})
    ids = torch.randint(0, 128, (1, 8))
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    plain_dtype = model.model.norm.weight.dtype
    plain_stream = model(ids, output_hidden_states=True).hidden_states[-1].dtype
    prepared = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    prep_dtype = prepared.model.norm.weight.dtype
    prep_stream = prepared(ids, output_hidden_states=True).hidden_states[-1].dtype
    size = {torch.bfloat16: 2, torch.float32: 4}
    for kbit, weight, stream in ((True, prep_dtype, prep_stream), (False, plain_dtype, plain_stream)):
        place = placement(TrainConfig(method="qlora", stack=StackProfile(kbit_prep=kbit)))
        assert (place.unquantized_bytes, place.stream_bytes) == (size[weight], size[stream])


def test_plain_peft_qlora_is_below_the_prepared_plan():
    kw = dict(method="qlora", micro_batch_size=2, seq_len=2048, gradient_checkpointing=True)
    prepared = estimate_memory("llama-3.1-8b", **kw)
    plain = estimate_memory("llama-3.1-8b", trainer="peft", **kw)
    assert plain.tensor_bytes < prepared.tensor_bytes
    assert plain.component("weights").bytes < prepared.component("weights").bytes  # bf16, not fp32, non-NF4 weights
    assert any("no prepare_model_for_kbit_training" in n for n in plain.stack_notes)


def test_v5_fused_experts_refuse_lora_dropout_like_peft():
    """PEFT's ParamWrapper raises for lora_dropout != 0; the planner says so in one line, with the fixes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in stack_probe.TINY_MIXTRAL.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(ValueError, match="lora_dropout"):
        get_peft_model(model, LoraConfig(r=4, lora_dropout=0.1, target_modules=["w1", "w2", "w3"]))
    profile = profile_from_config(stack_probe.TINY_MIXTRAL, model_id="tiny", source="path")
    bad = TrainConfig(lora=LoRAConfig(rank=4, dropout=0.1, target_modules=("w1", "w2", "w3")))
    with pytest.raises(InvalidConfigError, match="lora_dropout") as err:
        estimate(profile, bad)
    assert "\n" not in str(err.value)
    # the same job under transformers 4.48 (expert nn.Linear) or without expert targets is fine
    estimate(profile, bad.model_copy(update={"stack": StackProfile(transformers_version="4.48.1")}))
    estimate(profile, bad.model_copy(update={"lora": LoRAConfig(rank=4, dropout=0.1, target_modules=("q_proj",))}))


def test_mixtral_qlora_under_transformers_4_quantises_the_experts():
    kw = dict(method="qlora", micro_batch_size=1, seq_len=4096, gradient_checkpointing=True)
    v5 = estimate_memory("mixtral-8x7b", **kw)
    v4 = estimate_memory("mixtral-8x7b", transformers_version="4.48.1", **kw)
    assert v4.component("weights").bytes < v5.component("weights").bytes / 3
    assert v4.tensor_bytes < v5.tensor_bytes / 3


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_fused_kernels_and_offload_only_ever_save_memory(method):
    kw = dict(method=method, micro_batch_size=2, seq_len=2048, gradient_checkpointing=True)
    base = estimate_memory("qwen2.5-7b", **kw).tensor_bytes
    assert estimate_memory("qwen2.5-7b", stack=StackProfile(liger=True), **kw).tensor_bytes < base
    assert estimate_memory("qwen2.5-7b", stack=StackProfile(checkpointing="offload"), **kw).tensor_bytes < base
    reentrant = estimate_memory("qwen2.5-7b", stack=StackProfile(checkpointing="reentrant"), **kw).tensor_bytes
    assert reentrant == base  # both keep each layer input and recompute one layer


def test_dropout_cost_grows_with_tokens_without_checkpointing():
    def gap(batch: int) -> int:
        kw = dict(method="lora", micro_batch_size=batch, seq_len=1024)
        return (estimate_memory("llama-3.2-1b", lora_dropout=0.1, **kw).tensor_bytes
                - estimate_memory("llama-3.2-1b", **kw).tensor_bytes)

    assert 0 < gap(1) < gap(2) < gap(4)


def test_default_profile_is_the_engine_as_before():
    profile = resolve_model("llama-3.1-8b")
    cfg = TrainConfig(method="qlora", micro_batch_size=2, seq_len=1024)
    assert cfg.stack == StackProfile() and StackProfile().is_default
    explicit = cfg.model_copy(update={"stack": StackProfile(trainer="hf", transformers_version="5.23.0")})
    assert estimate(profile, cfg).tensor_bytes == estimate(profile, explicit).tensor_bytes
    assert estimate(profile, cfg).stack_notes == estimate(profile, explicit).stack_notes


def test_adamw_temporaries_follow_the_trainers_optimizer():
    """transformers 5's TrainingArguments default (torch >= 2.8) and Aegis's emitted scripts run fused AdamW, which
    keeps no foreach temporaries; 4.x's adamw_torch runs foreach, a state-sized copy of sqrt(v) per decay tensor.
    The traced rows say so (tests/data/memory_truth.json: a Llama-3.2-1B full row with each, no temporary in the
    fused one), and the H100's reserved peak for the fused row is within 1% of the plan (test_gpu_truth)."""
    from aegis.planning.memory.components import optimizer_temp_bytes

    profile = resolve_model("meta-llama/Llama-3.2-1B")

    def cfg(stack: StackProfile) -> TrainConfig:
        return TrainConfig(method="full", micro_batch_size=1, seq_len=512, stack=stack)

    decay = 10**9
    for stack in (StackProfile(), StackProfile(adamw="fused"), StackProfile(transformers_version="4.48", adamw="fused")):
        assert optimizer_temp_bytes(cfg(stack), decay, 2)[0] == 0
    for stack in (StackProfile(transformers_version="4.48.1"), StackProfile(adamw="foreach")):
        assert optimizer_temp_bytes(cfg(stack), decay, 2)[0] == 2 * decay
    foreach = estimate(profile, cfg(StackProfile(adamw="foreach")))
    fused = estimate(profile, cfg(StackProfile()))
    assert foreach.peak_phase == "optimizer step"  # b1 s512: the foreach copy is the step's peak
    temporaries = next(c.bytes for c in foreach.components if "temporaries" in c.name)
    assert fused.total_bytes <= foreach.total_bytes - temporaries / 2
    assert StackProfile(adamw="foreach").label().endswith("foreach AdamW")
