"""Static memory components: weights (by method and precision, NF4 with its quantisation constants),
LoRA adapters, gradients, optimizer states and optimizer-step temporaries. All in bytes.

    from aegis.planning.memory.components import weight_bytes
    nbytes, formula = weight_bytes(profile, cfg)
"""

from __future__ import annotations

from typing import NamedTuple

from aegis.errors import InvalidConfigError
from aegis.models.families.base import LayerShape
from aegis.planning.memory._dtypes import Placement
from aegis.schema import LoRAConfig, ModelProfile, TrainConfig, lora_selects, lora_target_names

__all__ = ["NF4_BLOCK", "NF4_BLOCK2", "nf4_bytes", "Sizes", "sizes", "optimizer_state_bytes", "optimizer_temp_bytes",
           "check_lora_targets", "layer_storage_bytes", "root_storage_bytes"]

NF4_BLOCK = 64
"""Elements per NF4 quantisation block (one absmax each)."""
NF4_BLOCK2 = 256
"""Absmax values per double-quantisation block (one fp32 absmax each)."""
_ALLOC = 512
"""The CUDA caching allocator rounds every tensor up to 512 bytes."""


def selects_any(profile: ModelProfile, lora: LoRAConfig) -> bool:
    """Whether ``lora.target_modules`` select at least one linear layer of the model."""
    targets = lora_target_names(lora.target_modules, profile.linear_modules)
    return any(lora_selects(m, targets) for m in profile.linear_modules)


def check_lora_targets(profile: ModelProfile, lora: LoRAConfig) -> None:
    """InvalidConfigError naming the valid module names when ``lora.target_modules`` select nothing in the
    model (PEFT refuses such a config: "Target modules ... not found in the base model")."""
    if selects_any(profile, lora):
        return
    valid = sorted(lora_target_names(("all-linear",), profile.linear_modules))
    raise InvalidConfigError(
        f"LoRA target_modules {list(lora.target_modules)} match no linear layer of {profile.model_id}; "
        f"valid names: {', '.join(valid)} (or all-linear)"
    )


def _round(n: float) -> int:
    return int(-(-int(n) // _ALLOC) * _ALLOC)


def nf4_bytes(elements: int) -> int:
    """One NF4 weight with double quantisation: packed 4-bit values, 8-bit absmax per 64, fp32 absmax per
    256 absmax, the 256-entry fp32 code book and the offset — each its own allocation."""
    blocks = -(-elements // NF4_BLOCK)
    return _round(elements / 2) + _round(blocks) + _round(4 * -(-blocks // NF4_BLOCK2)) + _round(256 * 4) + _round(4)


class Sizes(NamedTuple):
    """Element counts and bytes of everything static in a configuration."""

    base_bytes: int
    base_formula: str
    adapter_params: int
    adapter_bytes: int
    trainable_params: int
    trainable_bytes_per_param: int
    quantized_params: int
    decay_params: int
    """Trainable elements in the weight-decay group (HF: all but biases and norms) — the largest foreach group."""
    quant_state_bytes: int = 0
    """QLoRA: the part of ``base_bytes`` that is NF4 quantisation state (absmax, nested absmax, code book, offset),
    held by each ``Params4bit`` beside its packed data rather than as a parameter (FSDP does not shard it)."""


def sizes(profile: ModelProfile, cfg: TrainConfig, place: Placement) -> Sizes:
    lora = cfg.lora_config
    norm_and_bias = profile.norm_params + sum(m.count * m.out_features for m in profile.linear_modules if m.bias)
    if cfg.method == "full":
        p = profile.total_params
        return Sizes(
            base_bytes=p * place.base_bytes,
            base_formula=f"{p:,} params x {place.base_bytes} B",
            adapter_params=0, adapter_bytes=0,
            trainable_params=p, trainable_bytes_per_param=place.base_bytes,
            quantized_params=0, decay_params=p - norm_and_bias,
        )
    adapters = profile.trainable_params(cfg.method, lora)
    if cfg.method == "lora":
        p = profile.total_params
        base, formula, quantized = p * place.base_bytes, f"{p:,} params x {place.base_bytes} B (frozen)", 0
    else:
        quant = [m for m in profile.linear_modules if m.quantizable]
        quantized = sum(m.count * m.in_features * m.out_features for m in quant)
        nf4 = sum(m.count * nf4_bytes(m.in_features * m.out_features) for m in quant)
        packed = sum(m.count * _round((m.in_features * m.out_features) / 2) for m in quant)
        rest = profile.total_params - quantized
        base = nf4 + rest * place.unquantized_bytes
        # a layer linear bitsandbytes skips where its siblings are quantised: the module of the model's last
        # parameter in a tied model without final-norm weights (OLMo-1B's last down_proj)
        skipped = sorted({m.name for m in profile.linear_modules if not m.quantizable} & {m.name for m in quant})
        formula = (
            f"NF4 {quantized:,} x (0.5 B + 1 B/64 absmax + 4 B/16,384 absmax2) + code books; "
            f"{rest:,} unquantized (embeddings, head, norms{', experts' if profile.is_moe else ''}"
            f"{''.join(f', the last {n}' for n in skipped)}) x "
            f"{place.unquantized_bytes} B" + (" (prepare_model_for_kbit_training upcasts them)"
                                               if place.unquantized_bytes == 4 else " (left in bf16)")
        )
        if place.embedding_bytes and place.embedding_bytes != place.unquantized_bytes:
            head = profile.embedding_params + profile.lm_head_params
            base += head * (place.embedding_bytes - place.unquantized_bytes)
            formula += f"; embeddings and head {head:,} x {place.embedding_bytes} B (TRL casts them back to bf16)"
    return Sizes(
        base_bytes=base, base_formula=formula,
        adapter_params=adapters, adapter_bytes=adapters * place.adapter_bytes,
        trainable_params=adapters, trainable_bytes_per_param=place.adapter_bytes,
        quantized_params=quantized, decay_params=adapters, quant_state_bytes=nf4 - packed if quantized else 0,
    )


def layer_storage_bytes(layer: LayerShape, cfg: TrainConfig, place: Placement) -> int:
    """Bytes of one decoder layer's parameters as FSDP all-gathers them. QLoRA's quantised weights are their packed
    NF4 data (two 4-bit codes per byte, whatever the storage dtype); the rest is held at its element size, except
    under mixed precision, where the Trainer's FSDP (accelerate's ``set_mixed_precision``: ``MixedPrecision``
    ``param_dtype``) gathers parameters in the 16-bit compute dtype."""
    unq = place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes
    if place.autocast:
        unq = 2
    total = (layer.norm_params + layer.router_params) * unq
    for lin in layer.linears:
        elements = lin.in_features * lin.out_features
        if cfg.method == "qlora" and lin.quantizable:
            total += lin.count * -(-elements // 2)
        else:
            total += lin.count * elements * unq
        total += lin.count * lin.out_features * unq if lin.bias else 0
    return total


def root_storage_bytes(profile: ModelProfile, cfg: TrainConfig, place: Placement) -> int:
    """Bytes of FSDP's root unit as it all-gathers it: every parameter outside the decoder layers (embeddings,
    final norm, an untied head), which a transformer-based wrap policy leaves to the root, at the gathered element
    size (`layer_storage_bytes`'s rule: never quantised)."""
    unq = place.unquantized_bytes if cfg.method == "qlora" else place.base_bytes
    if place.autocast:
        unq = 2
    return (profile.total_params - sum(profile.layer_params)) * unq


def optimizer_state_bytes(cfg: TrainConfig, trainable: int, state_bytes: int) -> tuple[int, str]:
    """Optimizer state held between steps."""
    if cfg.optimizer == "adamw":
        return 2 * trainable * state_bytes, f"2 states x {trainable:,} x {state_bytes} B"
    if cfg.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        per = 2 + 2 * 4 / 2048
        return int(trainable * per), f"2 x 8-bit states + fp32 absmax per 2,048: {trainable:,} x {per:.4f} B"
    if cfg.optimizer == "sgd":
        return 0, "plain SGD keeps no state"
    return int(trainable * 0.02 * 4), f"Adafactor factored second moment ~2% of {trainable:,} x 4 B"


def optimizer_temp_bytes(cfg: TrainConfig, decay_params: int, state_bytes: int) -> tuple[int, str]:
    """Transient memory of the optimizer step."""
    if cfg.optimizer == "adamw" and not cfg.stack.adamw_fused:
        return decay_params * state_bytes, f"foreach sqrt(v) copy: {decay_params:,} x {state_bytes} B"
    if cfg.optimizer == "adamw":
        return 0, "fused AdamW: no large temporaries"
    return 0, "no large temporaries"
