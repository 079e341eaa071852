"""Measure what autograd saves in one decoder layer of a tiny PEFT LoRA model, per token, on CPU.

The stack-profile mechanisms the planner models (`aegis.planning.memory.stack_effects`) are checked against this: LoRA dropout,
and the transformers 4.x loop-over-experts MoE layout. Dropout is routed through ``torch.native_dropout``, which is
what ``F.dropout`` dispatches to on CUDA (aten ``Dropout.cpp``: ``is_fused_kernel_acceptable``); on CPU it would
save an input-sized noise tensor instead of the bool mask.

    python -m tools.stack_probe --out tests/data/stack_probe_t448.json   # under the transformers to record
    python -m tools.stack_probe --layouts-only --out tests/data/stack_probe_t457.json

The JSON written records the transformers and PEFT versions it ran under; tests compare the planner with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
TINY_MIXTRAL: dict[str, Any] = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "sliding_window": None,
}
_MOE_BASE: dict[str, Any] = {
    "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "num_experts_per_tok": 2,
}
_MLA: dict[str, Any] = {"num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 32,
                        "n_routed_experts": 4, "first_k_dense_replace": 0, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                        "qk_rope_head_dim": 8, "v_head_dim": 12, "n_shared_experts": 1}
# One tiny config per MoE model type, with the LoRA targets that name its routed experts in transformers 4
# (a type the running transformers does not have is skipped).
TINY_MOES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "mixtral": (TINY_MIXTRAL, ["w1", "w2", "w3"]),
    "phimoe": ({**_MOE_BASE, "model_type": "phimoe", "intermediate_size": 96, "num_local_experts": 4,
                "attention_bias": True, "lm_head_bias": True}, ["w1", "w2", "w3"]),
    "qwen2_moe": ({**_MOE_BASE, "model_type": "qwen2_moe", "intermediate_size": 96, "num_experts": 4,
                   "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}, ["gate_proj", "up_proj", "down_proj"]),
    "qwen3_moe": ({**_MOE_BASE, "model_type": "qwen3_moe", "head_dim": 16, "intermediate_size": 96, "num_experts": 4,
                   "moe_intermediate_size": 32}, ["gate_proj", "up_proj", "down_proj"]),
    "deepseek_v2": ({**_MOE_BASE, **_MLA, "model_type": "deepseek_v2", "q_lora_rank": None, "topk_method": "greedy"},
                    ["gate_proj", "up_proj", "down_proj"]),
    "deepseek_v3": ({**_MOE_BASE, **_MLA, "model_type": "deepseek_v3", "q_lora_rank": 24, "n_group": 2,
                     "topk_group": 1}, ["gate_proj", "up_proj", "down_proj"]),
    "gpt_oss": ({**_MOE_BASE, "model_type": "gpt_oss", "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
                 "sliding_window": 8}, ["q_proj", "o_proj"]),
}
CASES: list[dict[str, Any]] = [
    {"name": "llama lora", "config": TINY_LLAMA, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "dropout": 0.0},
    {"name": "llama lora dropout", "config": TINY_LLAMA, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "dropout": 0.1},
    {"name": "mixtral lora attn", "config": TINY_MIXTRAL, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"], "dropout": 0.0},
    {"name": "mixtral lora experts", "config": TINY_MIXTRAL, "targets": ["q_proj", "v_proj", "w1", "w2", "w3"], "dropout": 0.0},
]
BATCH, SEQ, RANK = 2, 16, 4


@contextlib.contextmanager
def cuda_dropout():
    """``F.dropout`` as on CUDA: ``native_dropout`` (saves a bool mask)."""
    import torch
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - torch's own parameter name
        if not training or p == 0:
            return input
        return torch.native_dropout(input, p, True)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


def layer_saved_bytes_per_token(config: dict[str, Any], targets: list[str], dropout: float) -> float:
    """Bytes autograd saves per token in decoder layer 0 of a bf16 model with fp32 PEFT LoRA adapters (rank 4),
    parameters and the shared RoPE cos/sin excluded, each storage once."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    cfg._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=dropout, target_modules=targets))
    model.train()
    inner = model.base_model.model.model
    x = torch.randn(BATCH, SEQ, config["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(SEQ)[None].expand(BATCH, SEQ)
    cos, sin = inner.rotary_emb(x, pos)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {cos.untyped_storage().data_ptr(), sin.untyped_storage().data_ptr()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip and st.nbytes():
            seen[st.data_ptr()] = st.nbytes()
        return t

    with cuda_dropout(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = inner.layers[0](x, attention_mask=None, position_ids=pos, position_embeddings=(cos, sin))
    del out
    return sum(seen.values()) / (BATCH * SEQ)


def linear_layout(config: dict[str, Any], targets: list[str]) -> dict[str, Any]:
    """The model's ``nn.Linear`` modules (layer and expert indices folded: name -> [in, out, count]) — what
    bitsandbytes would quantise, all but ``lm_head`` — and PEFT's trainable parameter count for ``targets``."""
    import re

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    linears: dict[str, list[int]] = {}
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and name != "lm_head":
            key = re.sub(r"\.\d+\.", ".", name)
            entry = linears.setdefault(key, [module.in_features, module.out_features, 0])
            entry[2] += 1
    peft_model = get_peft_model(model, LoraConfig(r=RANK, target_modules=targets))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    return {"linears": linears, "lora_targets": targets, "lora_trainable": trainable}


def moe_layouts() -> dict[str, dict[str, Any]]:
    """`linear_layout` of each MoE model type in `TINY_MOES` the installed transformers builds."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return {t: {"config": cfg, **linear_layout(cfg, targets)} for t, (cfg, targets) in TINY_MOES.items()
            if t in CONFIG_MAPPING}


def loss_peak_bytes_per_logit(logits_dtype: str, *, batch: int = 2, seq: int = 128, vocab: int = 512, hidden: int = 4) -> float:
    """Peak live bytes per [token, vocab] element of the model's own loss (``ForCausalLMLoss``) and its backward,
    the logits made by an op inside the trace and dropped after the loss as a training step does (traced with
    `tools.truth.alloc.LiveBytes`). The tiny hidden width keeps the head's own gradients negligible."""
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    from tools.truth.alloc import LiveBytes

    dtype = getattr(torch, logits_dtype)
    torch.manual_seed(0)
    x = torch.randn(batch, seq, hidden, dtype=dtype, requires_grad=True)
    w = torch.randn(hidden, vocab, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    tracker = LiveBytes()
    with tracker:
        logits = x @ w
        loss = ForCausalLMLoss(logits, labels, vocab)
        del logits
        loss.backward()
    return tracker.peak_bytes / (batch * seq * vocab)


def main(argv: list[str] | None = None) -> int:
    import peft
    import transformers

    parser = argparse.ArgumentParser(prog="python -m tools.stack_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the JSON here (default: print)")
    parser.add_argument("--layouts-only", action="store_true", help="record the MoE module layouts only")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"transformers": transformers.__version__, "peft": peft.__version__, "rank": RANK}
    if not args.layouts_only:
        rows = [{**case, "bytes_per_token": layer_saved_bytes_per_token(case["config"], case["targets"], case["dropout"])}
                for case in CASES]
        doc |= {"batch": BATCH, "seq": SEQ, "rows": rows,
                "loss_peak_bytes_per_logit": {d: loss_peak_bytes_per_logit(d) for d in ("bfloat16", "float32")}}
    doc["moe_layouts"] = moe_layouts()
    text = json.dumps(doc, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
