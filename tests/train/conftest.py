"""Tiny config.json dicts for every JAX family, and a factory for random transformers checkpoints.

``TINY_CONFIGS[name]`` is a config.json-style dict (2 layers, hidden 64, vocab 256, GQA) in the
layout a Hub checkpoint uses; the ``hf_checkpoint`` fixture builds the transformers model from it
with random fp32 weights (larger than the default init, so logits are far from zero) and saves it
with ``save_pretrained`` into a temporary folder.

XLA's CPU backend is told to optimise less: these tests compile many tiny programs and run each
a few times, so compile time dominates (measured: the train tests use about 40% less CPU time).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join([_flags, *(f for f in _FAST_COMPILE if f.split("=")[0] not in _flags)]).strip()

_COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

_DEEPSEEK: dict[str, Any] = {  # MLA (nope 16 + rope 8 per q/k head, v 12), 1 dense layer then 2 MoE layers
    **_COMMON,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 12,
}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v3": {  # q_a/q_b (q_lora_rank), sigmoid group-limited routing, yarn with mscale on the softmax scale
        **_DEEPSEEK,
        "model_type": "deepseek_v3",
        "q_lora_rank": 24,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "rope_scaling": {
            "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0,
        },
    },
    "deepseek_v2_lite": {  # q_proj (no q_lora_rank), softmax greedy routing, two shared experts, biases
        **_DEEPSEEK,
        "model_type": "deepseek_v2",
        "q_lora_rank": None,
        "n_shared_experts": 2,
        "topk_method": "greedy",
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama": {**_COMMON, "model_type": "llama", "hidden_act": "silu", "rope_theta": 10000.0},
    "llama3": {
        **_COMMON,
        "model_type": "llama",
        "rope_theta": 500000.0,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "qwen2": {
        **_COMMON,
        "model_type": "qwen2",
        "rope_theta": 1000000.0,
        "use_sliding_window": True,
        "sliding_window": 8,
        "max_window_layers": 1,
    },
    "qwen3": {**_COMMON, "model_type": "qwen3", "head_dim": 32, "rope_theta": 1000000.0, "tie_word_embeddings": True},
    "mistral": {**_COMMON, "model_type": "mistral", "sliding_window": 8, "head_dim": 16},
    "phi3": {
        **_COMMON,
        "model_type": "phi3",
        "partial_rotary_factor": 0.5,
        "sliding_window": None,
        "original_max_position_embeddings": 256,
    },
    "gemma2": {
        **_COMMON,
        "model_type": "gemma2",
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": 5.0,
        "attn_logit_softcapping": 2.0,
        "tie_word_embeddings": True,
    },
    "gemma3": {
        **_COMMON,
        "model_type": "gemma3_text",
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
    "mixtral": {
        **_COMMON,
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": None,
        "rope_theta": 1000000.0,
    },
    "qwen2_moe": {
        **_COMMON,
        "model_type": "qwen2_moe",
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96,
        "norm_topk_prob": False,
    },
    "qwen3_moe": {
        **_COMMON,
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
    "gemma": {
        **_COMMON,
        "model_type": "gemma",
        "head_dim": 16,
        "hidden_act": "gelu",  # the published configs' legacy value: GemmaConfig reads it as gelu_pytorch_tanh
        "tie_word_embeddings": True,
    },
    "olmo2": {**_COMMON, "model_type": "olmo2", "rope_theta": 500000.0},
    "ministral": {  # layer_types: sliding (window 8) then full; no config key beyond Mistral's but the list
        **_COMMON, "model_type": "ministral", "sliding_window": 8, "head_dim": 16, "rope_theta": 100000000.0,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "olmo3": {  # every 4th layer full (window 8 elsewhere); yarn on the full layers only, theta 5e5 on the sliding
        **_COMMON, "model_type": "olmo3", "num_hidden_layers": 4, "sliding_window": 8, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    },
    "smollm3": {  # 4 layers, the 4th without RoPE; tied head
        **_COMMON, "model_type": "smollm3", "num_hidden_layers": 4, "rope_theta": 5000000.0, "tie_word_embeddings": True,
    },
    "seed_oss": {  # q/k/v bias (attention_bias), none on o (attention_out_bias), explicit head_dim
        **_COMMON, "model_type": "seed_oss", "head_dim": 32, "attention_bias": True, "attention_out_bias": False,
        "rope_theta": 10000000.0,
    },
    "granite": {
        **_COMMON,
        "model_type": "granite",
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0625,
        "logits_scaling": 8.0,
        "tie_word_embeddings": True,
    },
    "granitemoe": {  # Granite's four multipliers, fused experts stored as input_linear/output_linear, top-k router
        **_COMMON,
        "model_type": "granitemoe",
        "intermediate_size": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0625,
        "logits_scaling": 8.0,
        "tie_word_embeddings": True,
    },
    "gpt_oss": {  # layer 0 slides (window 8), layer 1 is full; sinks, biases, clamped SwiGLU, yarn
        **_COMMON,
        "model_type": "gpt_oss",
        "head_dim": 16,
        "intermediate_size": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 64,
        },
    },
    "phimoe": {  # LayerNorm, attention and lm_head biases, sparsemixer top-2
        **_COMMON,
        "model_type": "phimoe",
        "intermediate_size": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "attention_bias": True,
        "lm_head_bias": True,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
    },
    "phi": {  # parallel attention + plain MLP on one LayerNorm; partial_rotary_factor and hidden_act left to defaults
        **{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
        "model_type": "phi",
        "layer_norm_eps": 1e-5,
    },
    "starcoder2": {  # LayerNorms, biases, plain GELU MLP, one sliding window (8) for every layer, tied embeddings
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "tie_word_embeddings")},
        "model_type": "starcoder2",
        "norm_epsilon": 1e-5,
        "sliding_window": 8,
    },
    "phi_qk": {  # qk_layernorm (per-head LayerNorms with biases), a quarter of each head rotated
        **{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
        "model_type": "phi",
        "num_key_value_heads": 4,
        "qk_layernorm": True,
        "partial_rotary_factor": 0.25,
        "layer_norm_eps": 1e-5,
    },
    "stablelm": {  # LayerNorms, q/k/v biases, SwiGLU, a quarter of each head rotated (the default), sequential
        **{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
        "model_type": "stablelm",
        "use_qkv_bias": True,
        "layer_norm_eps": 1e-5,
    },
    "stablelm_parallel": {  # use_parallel_residual: one LayerNorm feeds attention and the SwiGLU MLP; half rotated
        **{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
        "model_type": "stablelm",
        "use_parallel_residual": True,
        "partial_rotary_factor": 0.5,
        "layer_norm_eps": 1e-5,
    },
    "cohere": {  # Command R's layout: attention and the SwiGLU MLP side by side on one weight-only LayerNorm, GQA,
        # RoPE over adjacent pairs, logits times logit_scale, tied head (the default)
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "tie_word_embeddings")},
        "model_type": "cohere",
        "logit_scale": 0.25,
        "rope_theta": 10000.0,
        "layer_norm_eps": 1e-5,
    },
    "cohere_qk": {  # Command R+'s use_qk_norm (a LayerNorm weight per head on q and k), attention biases, an untied
        # head, the default logit_scale and rope_theta
        **{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
        "model_type": "cohere",
        "use_qk_norm": True,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "layer_norm_eps": 1e-5,
    },
    "cohere2": {  # Command R7B's layout: Cohere's block, sliding-window layers with RoPE, every second (here) layer
        # global without positions, a window shorter than the tests' sequences
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "tie_word_embeddings")},
        "model_type": "cohere2",
        "num_hidden_layers": 4,
        "sliding_window": 6,
        "sliding_window_pattern": 2,
        "logit_scale": 0.25,
        "layer_norm_eps": 1e-5,
    },
    "olmo": {  # OLMo-1B's layout: LayerNorms without weight or bias (eps fixed at 1e-5), SwiGLU, a tied head
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "tie_word_embeddings", "num_key_value_heads")},
        "model_type": "olmo",
        "tie_word_embeddings": True,
    },
    "olmo_clip": {  # OLMo 1.7's clip_qkv (tight enough that random projections are clamped), GQA, attention
        # biases, an untied head; the stray rms_norm_eps is ignored as OlmoLayerNorm ignores it
        **_COMMON,
        "model_type": "olmo",
        "clip_qkv": 0.05,
        "attention_bias": True,
        "rms_norm_eps": 0.5,
    },
    "cohere2_types": {  # an explicit layer_types list, attention biases, an untied head
        **{k: v for k, v in _COMMON.items() if k != "rms_norm_eps"},
        "model_type": "cohere2",
        "num_hidden_layers": 3,
        "sliding_window": 5,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        "attention_bias": True,
        "layer_norm_eps": 1e-5,
    },
    "gpt_neox": {  # Pythia's layout: q/k/v grouped by head in one query_key_value, attention and the GELU MLP side by
        # side on two LayerNorms, a quarter of each head rotated; rotary settings left to GPTNeoXConfig's defaults
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "num_key_value_heads")},
        "model_type": "gpt_neox",
        "layer_norm_eps": 1e-5,
    },
    "gpt_neox_sequential": {  # use_parallel_residual false, no attention biases, the older rotary_pct/rotary_emb_base
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "num_key_value_heads")},
        "model_type": "gpt_neox",
        "use_parallel_residual": False,
        "attention_bias": False,
        "rotary_pct": 0.5,
        "rotary_emb_base": 5000,
        "hidden_act": "gelu_fast",
        "layer_norm_eps": 1e-5,
    },
    "gpt2": {  # GPT-2's layout under its own key names (n_embd, n_layer, n_head, n_positions): learned positions,
        # Conv1D c_attn / c_proj / c_fc, LayerNorms with biases, gelu_new, tied head; the MLP 4 x n_embd (n_inner left out)
        "model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 48,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    },
    "gpt2_inner": {  # n_inner set, exact GELU, an untied head, another LayerNorm epsilon
        "model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 32,
        "n_inner": 96, "activation_function": "gelu", "tie_word_embeddings": False, "layer_norm_epsilon": 1e-6,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    },
    "gptj": {  # GPT-J's layout under its own key names: attention and the gelu_new MLP side by side on ln_1, RoPE
        # over adjacent pairs of the first rotary_dim (8 of 16) dims of each head, an lm_head bias, untied
        "model_type": "gptj", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
        "rotary_dim": 8,
    },
    "gptj_full": {  # every head dim rotated, n_inner set, exact GELU, a tied head
        "model_type": "gptj", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
        "rotary_dim": 16, "n_inner": 96, "activation_function": "gelu", "tie_word_embeddings": True,
    },
    "gpt_bigcode": {  # StarCoder's layout: GPT-2's in nn.Linear, multi-query (one key/value head: [q; k; v] in c_attn)
        "model_type": "gpt_bigcode", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 48,
        "n_inner": 96, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    },
    "gpt_bigcode_mha": {  # multi_query false: every head its own key and value, c_attn's rows [q_h; k_h; v_h] per head
        "model_type": "gpt_bigcode", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32,
        "multi_query": False, "activation_function": "gelu", "tie_word_embeddings": False,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    },
    "opt": {  # OPT-125m's layout: learned positions read 2 rows on (OPTLearnedPositionalEmbedding's offset), q/k/v/out_proj
        # and fc1/fc2 with biases, ReLU, LayerNorms named self_attn_layer_norm / final_layer_norm, tied head
        "model_type": "opt", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "ffn_dim": 96, "max_position_embeddings": 40, "dropout": 0.0,
    },
    "opt_nobias": {  # enable_bias false, GELU, an untied head
        "model_type": "opt", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "ffn_dim": 128, "max_position_embeddings": 32, "dropout": 0.0, "enable_bias": False,
        "activation_function": "gelu", "tie_word_embeddings": False,
    },
    "falcon": {  # Falcon-7B's layout: multi-query (one key/value head), attention and MLP side by side on one LayerNorm,
        # no biases, tied embeddings, the MLP 4 x hidden (ffn_hidden_size left out)
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "num_key_value_heads", "intermediate_size",
                                                          "tie_word_embeddings")},
        "model_type": "falcon",
        "layer_norm_epsilon": 1e-5,
    },
    "falcon_new": {  # Falcon-40B's: new_decoder_architecture, q/k/v grouped per key/value head (2), ln_attn and ln_mlp
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "num_key_value_heads", "intermediate_size")},
        "model_type": "falcon",
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        "bias": True,
        "ffn_hidden_size": 96,
        "layer_norm_epsilon": 1e-5,
    },
    "falcon_sequential": {  # parallel_attn false (input and post-attention LayerNorms), every head its own k and v
        **{k: v for k, v in _COMMON.items() if k not in ("rms_norm_eps", "num_key_value_heads", "intermediate_size")},
        "model_type": "falcon",
        "parallel_attn": False,
        "multi_query": False,
        "bias": True,
        "activation": "gelu_pytorch_tanh",
        "layer_norm_epsilon": 1e-5,
    },
}


def tiny_config(name: str) -> dict[str, Any]:
    """A fresh copy of ``TINY_CONFIGS[name]``."""
    return copy.deepcopy(TINY_CONFIGS[name])


@pytest.fixture(scope="session")
def tiny_configs() -> dict[str, dict[str, Any]]:
    return copy.deepcopy(TINY_CONFIGS)


def build_hf_model(config: dict[str, Any], seed: int = 0, std: float = 0.15) -> Any:
    """A transformers model for ``config`` (eager attention, fp32, eval mode) with N(0, std) weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(
                    1.0 + 0.1 * torch.randn_like(p)
                    if "gemma" not in config["model_type"]
                    else 0.1 * torch.randn_like(p)
                )
            else:
                p.normal_(0.0, std)
    return model


@pytest.fixture
def hf_checkpoint(tmp_path: Path) -> Callable[..., tuple[Any, Path]]:
    """``make(name_or_config) -> (hf_model, folder)``: a random transformers model saved with save_pretrained."""

    def make(config: str | dict[str, Any], seed: int = 0, **save_kwargs: Any) -> tuple[Any, Path]:
        cfg = tiny_config(config) if isinstance(config, str) else config
        model = build_hf_model(cfg, seed=seed)
        folder = tmp_path / f"hf-{cfg['model_type']}-{seed}"
        model.save_pretrained(folder, **save_kwargs)
        return model, folder

    return make
