"""The one FLOPs count (`aegis.planning.throughput.token_flops`) against torch's own FLOP counter on transformers' models,
and the MFU it gives a measured rate, the inverse of the planner's predicted rate."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from aegis.planning.hardware import find_gpu
from aegis.models.resolve import resolve_model
from aegis.models.profiles import profile_from_config
from aegis.schema import TrainConfig
from aegis.planning.throughput import MFU_RANGE, flops_per_token, model_flops_utilisation, token_flops, tokens_per_s_range

CONFIGS = {
    "llama": dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2-tied": dict(model_type="qwen2", vocab_size=384, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True),
}


def _counted(config: dict, seq: int, train: str | None) -> float:
    """FLOPs torch counts for one forward (train=None), or forward + backward with every weight trained ('full')
    or every weight frozen ('frozen': only input gradients flow, as under LoRA)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config, attn_implementation="eager")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, config["vocab_size"], (1, seq))
    inputs = {"input_ids": ids}
    if train == "frozen":  # every weight frozen (a tied head too); input gradients flow from the embedded inputs
        model.requires_grad_(False)
        inputs = {"inputs_embeds": model.get_input_embeddings()(ids).detach().requires_grad_()}
    with FlopCounterMode(display=False) as counter:
        out = model(**inputs)
        if train:
            out.logits.float().sum().backward()
    return counter.get_total_flops() / seq


@pytest.mark.parametrize("name", CONFIGS)
def test_token_flops_match_torchs_counter(name: str) -> None:
    """Torch's eager attention multiplies the full seq x seq scores (masked afterwards): it counts twice the causal
    attention `token_flops` counts. Everything else (every matmul parameter, the head, tied or not, and the
    backward's input- and weight-gradient matmuls) must agree exactly."""
    config, seq = CONFIGS[name], 32
    profile = profile_from_config(config, model_id=name, source="path")
    causal_attention = 2 * profile.num_layers * profile.num_attention_heads * profile.head_dim * seq
    full, lora = token_flops(profile, "full", seq), token_flops(profile, "lora", seq)
    assert _counted(config, seq, None) == pytest.approx(full.forward + causal_attention, rel=1e-9)
    assert _counted(config, seq, "full") == pytest.approx(full.training + 3 * causal_attention, rel=1e-9)
    assert _counted(config, seq, "frozen") == pytest.approx(lora.training + 3 * causal_attention, rel=1e-9)
    recompute = token_flops(profile, "full", seq, recompute=True)
    assert recompute.training == pytest.approx(full.training + full.forward)
    assert lora.forward == full.forward


@pytest.mark.parametrize("name", CONFIGS)
def test_lora_adapters_add_their_own_matmuls_as_peft_runs_them(name: str) -> None:
    """A PEFT LoRA model (rank 4 on every linear but the head, base frozen, adapters trained) counted by torch: the
    frozen path's forward and input gradients plus each adapter's ``x A`` and ``(x A) B`` with their input and weight
    gradients, which `token_flops` counts as 6 x rank x (in + out) per adapted module."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from aegis.schema import LoRAConfig

    config, seq = CONFIGS[name], 32
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config, attn_implementation="eager"))
    model = get_peft_model(model, PeftLoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets)))
    ids = torch.randint(0, config["vocab_size"], (1, seq))
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()  # input gradients from layer 0 on
    with FlopCounterMode(display=False) as counter:
        model(inputs_embeds=embeds).logits.float().sum().backward()
    profile = profile_from_config(config, model_id=name, source="path")
    causal_attention = 2 * profile.num_layers * profile.num_attention_heads * profile.head_dim * seq
    lora = token_flops(profile, "lora", seq, lora=LoRAConfig(rank=4, alpha=8, target_modules=targets))
    assert counter.get_total_flops() / seq == pytest.approx(lora.training + 3 * causal_attention, rel=1e-9)
    assert lora.training > token_flops(profile, "lora", seq).training
    assert "LoRA adapter params" in lora.formula


def test_mfu_of_a_measured_rate_inverts_the_planners_prediction() -> None:
    """At the planner's compute-bound rate for an MFU m, the measured-rate MFU the benchmark prints is m again."""
    profile, gpu = resolve_model("llama-3.1-8b"), find_gpu("h100-sxm")
    for cfg in (TrainConfig(method="lora", micro_batch_size=4, seq_len=2048),
                TrainConfig(method="full", micro_batch_size=1, seq_len=4096, gradient_checkpointing=True)):
        low, high, basis, source = tokens_per_s_range(profile, cfg, gpu, store=_EmptyStore())
        assert source == "estimated" and "memory-bound" not in basis
        lo, hi = MFU_RANGE[cfg.method]
        assert model_flops_utilisation(low, profile, cfg, gpu) == pytest.approx(lo)
        assert model_flops_utilisation(high, profile, cfg, gpu) == pytest.approx(hi)
        assert f"{flops_per_token(profile, cfg)[0] / 1e9:.1f} GFLOP/token" in basis


def test_benchmark_and_forge_use_the_one_count() -> None:
    """No second FLOPs formula: the benchmark's MFU and forge's speed fitness call `token_flops`."""
    import inspect

    import aegis.forge._evo_fitness as fitness
    import aegis.train.benchmark as bench

    assert "model_flops_utilisation(" in inspect.getsource(bench.run_benchmark)
    config = CONFIGS["llama"]
    profile = profile_from_config(config, model_id="x", source="path")
    assert fitness.flops_per_token(config, 128) == token_flops(profile, "full", 128).forward


class _EmptyStore:
    def lookup(self, *args: object) -> None:
        return None
