"""Byte widths and how each precision mode / method places tensors (HF + PyTorch conventions).

A `Placement` answers, for one training configuration: in which dtype the base weights, the
trainable weights, their gradients and optimizer states live; whether autocast runs the matmuls in
bf16; and what dtype the residual stream, logits and LoRA adapters have.
"""

from __future__ import annotations

from typing import NamedTuple

from aegis.schema import TrainConfig

__all__ = ["Placement", "placement", "dtype_name"]


class Placement(NamedTuple):
    base_bytes: int
    """Bytes per element of the (non-quantized) base weights."""
    base_trainable: bool
    """Full fine-tuning: the base weights get gradients and optimizer states."""
    autocast: bool
    """Matmuls run under torch.autocast(bf16/fp16) on higher-precision weights."""
    stream_bytes: int
    """Residual-stream element size."""
    adapter_bytes: int
    """LoRA adapter parameter element size (PEFT keeps adapters fp32 by default)."""
    unquantized_bytes: int
    """QLoRA: element size of what stays unquantized (prepare_model_for_kbit_training upcasts it to fp32;
    peft/utils/other.py: every fp16/bf16 parameter that is not ``Params4bit`` gets ``param.data.to(float32)``)."""
    state_bytes: int
    """Optimizer-state element size for one trainable element (AdamW keeps states in the param dtype)."""
    embedding_bytes: int = 0
    """QLoRA: element size of the input embeddings and lm_head when it differs from ``unquantized_bytes`` (0: same).
    TRL's SFTTrainer with ``bf16=True`` runs ``peft_module_casting_to_bf16`` after the k-bit preparation: norms stay
    fp32, ``lm_head`` and ``embed_tokens`` go back to bf16 (trl/trainer/utils.py, TRL 0.14)."""


def placement(cfg: TrainConfig) -> Placement:
    if cfg.method == "qlora" and not cfg.stack.kbit_prep_effective:
        # no prepare_model_for_kbit_training (plain PEFT loop, Unsloth): what bitsandbytes leaves unquantised stays
        # in the load dtype (bf16), so the residual stream, norms and logits are bf16; PEFT still creates the
        # adapters in fp32 (LoraConfig autocast_adapter_dtype=True)
        return Placement(base_bytes=2, base_trainable=False, autocast=False, stream_bytes=2, adapter_bytes=4,
                         unquantized_bytes=2, state_bytes=4)
    if cfg.method == "qlora" and cfg.stack.trainer == "trl" and cfg.autocast_effective:
        return Placement(base_bytes=4, base_trainable=False, autocast=False, stream_bytes=4, adapter_bytes=4,
                         unquantized_bytes=4, state_bytes=4, embedding_bytes=2)
    if cfg.method == "qlora":
        return Placement(base_bytes=4, base_trainable=False, autocast=False, stream_bytes=4, adapter_bytes=4,
                         unquantized_bytes=4, state_bytes=4)
    if cfg.method == "lora":
        base = 4 if cfg.precision == "fp32" else 2
        return Placement(base_bytes=base, base_trainable=False, autocast=False, stream_bytes=base, adapter_bytes=4,
                         unquantized_bytes=base, state_bytes=4)
    if cfg.precision == "bf16":
        return Placement(base_bytes=2, base_trainable=True, autocast=False, stream_bytes=2, adapter_bytes=0,
                         unquantized_bytes=2, state_bytes=2)
    mixed = cfg.precision in ("bf16_mixed", "fp16_mixed")
    return Placement(base_bytes=4, base_trainable=True, autocast=mixed, stream_bytes=4, adapter_bytes=0,
                     unquantized_bytes=4, state_bytes=4)


def dtype_name(nbytes: int, cfg: TrainConfig) -> str:
    """The name of a 2- or 4-byte float in ``cfg``: 2 bytes are fp16 under fp16 mixed precision (a LoRA base loaded
    in fp16, the stream an fp16 autocast writes), else bf16."""
    return {2: "fp16" if cfg.precision == "fp16_mixed" else "bf16", 4: "fp32"}[nbytes]
