"""Time and cost: tokens/s from FLOPs per token over the GPU's tensor rate in the step's precision (bf16, or fp16
where the card is faster at it) at an MFU range, or from a stored measurement (`aegis benchmark`); epoch and total
time; cost at catalog prices.

The rate is a roofline over the catalog's two peaks: a token cannot be trained faster than its FLOPs allow at the
tensor rate, nor faster than the device memory it must move allows at the card's bandwidth (`bytes_per_token`).
Large models are compute-bound (the bandwidth roof is 10-50x higher); a tiny model's step is bound by moving its
activations and logits, and the utilisation range applies to whichever roof binds.

    from aegis.throughput import flops_per_token, tokens_per_s_range
    low, high, basis, source = tokens_per_s_range(profile, cfg, gpu)
"""

from __future__ import annotations

from aegis.calibration import CalibrationStore
from aegis.schema import GPU, Cost, MemoryEstimate, ModelProfile, TrainConfig

__all__ = ["MFU_RANGE", "flops_per_token", "bytes_per_token", "tokens_per_s_range", "costs"]

MFU_RANGE = {"full": (0.30, 0.45), "lora": (0.28, 0.42), "qlora": (0.18, 0.30)}
"""Model-FLOPs utilisation assumed per method (QLoRA dequantises every weight on the fly)."""
MEASURED_SPREAD = 0.10
"""A stored measurement is shown as +/- this share."""


def flops_per_token(profile: ModelProfile, cfg: TrainConfig) -> tuple[float, str]:
    """Training FLOPs per token: matmul params x (6 full | 4 LoRA) + causal attention; +1 forward with checkpointing."""
    matmul = profile.active_params_per_token - profile.embedding_params
    if profile.tie_word_embeddings:
        matmul += profile.embedding_params  # the tied head still multiplies
    attn_fwd = 2 * profile.num_layers * profile.num_attention_heads * profile.head_dim * cfg.seq_len
    fwd = 2 * matmul + attn_fwd
    passes = 3.0 if cfg.method == "full" else 2.0  # frozen weights need no weight gradients
    total = passes * 2 * matmul + 3 * attn_fwd
    params = f"{matmul / 1e9:.2f}B" if matmul >= 1e7 else f"{matmul / 1e6:.2f}M"
    text = f"{'6' if cfg.method == 'full' else '4'} x {params} matmul params + causal attention"
    if cfg.gradient_checkpointing:
        total += fwd
        text += " + recomputed forward"
    return total, text


def bytes_per_token(profile: ModelProfile, cfg: TrainConfig, gpu: GPU, memory: MemoryEstimate | None = None) -> float:
    """Device-memory traffic per token a training step cannot avoid, from the memory engine's own tensors
    (``memory``, else `aegis.memory.estimate.estimate` of ``cfg``): every activation and logit saved for the
    backward is written once and read back once, and every base weight is read once per pass over the micro batch
    (forward and input gradients, plus the recomputed forward with checkpointing). A lower bound: temporaries,
    optimizer and gradient traffic are left out, so the throughput it caps is an upper bound."""
    if memory is None:
        from aegis.memory.estimate import estimate

        memory = estimate(profile, cfg, gpu=gpu)
    parts = {c.key: c.bytes for c in memory.components}
    saved = parts.get("activations", 0) + parts.get("logits", 0)
    passes = 3 if cfg.gradient_checkpointing else 2
    return (2 * saved + passes * parts.get("weights", 0)) / (cfg.micro_batch_size * cfg.seq_len)


def tokens_per_s_range(
    profile: ModelProfile, cfg: TrainConfig, gpu: GPU, *, gpu_count: int = 1, efficiency: tuple[float, float] = (1.0, 1.0),
    store: CalibrationStore | None = None, memory: MemoryEstimate | None = None,
) -> tuple[float, float, str, str]:
    """(low, high, basis, 'estimated' | 'measured') for the whole job across `gpu_count` GPUs: the measurement when
    one is stored, else the roofline (the slower of the compute and the memory-traffic bound) at the method's
    utilisation range. ``memory``: ``cfg``'s single-GPU estimate, when already made."""
    store = store if store is not None else CalibrationStore()
    record = store.lookup(gpu.id, profile.model_id, cfg.method)
    if record is not None:
        rate = record.tokens_per_s * gpu_count
        basis = (f"measured {record.tokens_per_s:,.0f} tok/s on {record.device} "
                 f"(mb {record.micro_batch_size}, seq {record.seq_len}, {record.measured_at[:10]})")
        return rate * (1 - MEASURED_SPREAD) * efficiency[0], rate * (1 + MEASURED_SPREAD) * efficiency[1], basis, "measured"
    flops, text = flops_per_token(profile, cfg)
    lo, hi = MFU_RANGE[cfg.method]
    tflops = gpu.tflops(cfg.precision)
    peak = tflops * 1e12
    kind = "fp16" if cfg.precision == "fp16_mixed" and gpu.fp16_tflops else "bf16"
    work = f"{flops / 1e9:.1f} GFLOP" if flops >= 1e8 else f"{flops / 1e6:.1f} MFLOP"
    moved = bytes_per_token(profile, cfg, gpu, memory)
    rate = peak / flops
    if moved > 0 and gpu.bandwidth_gb_per_s * 1e9 / moved < rate:  # memory-bound: the bandwidth roof is lower
        rate = gpu.bandwidth_gb_per_s * 1e9 / moved
        amount = f"{moved / 1e6:,.2f} MB" if moved >= 1e6 else f"{moved / 1e3:,.1f} kB"
        basis = (f"{text} = {work}/token, but memory-bound: {amount}/token moved (saved activations and "
                 f"logits written and read back, weights read every pass) at {lo:.0%}-{hi:.0%} utilisation of "
                 f"{gpu.bandwidth_gb_per_s:,.0f} GB/s, under the {tflops:g} TFLOPS {kind} compute roof")
    else:
        basis = f"{text} = {work}/token at {lo:.0%}-{hi:.0%} MFU of {tflops:g} TFLOPS {kind}"
    if gpu_count > 1:
        basis += f" x {gpu_count} GPUs at {efficiency[0]:.0%}-{efficiency[1]:.0%} scaling"
    return (rate * lo * gpu_count * efficiency[0], rate * hi * gpu_count * efficiency[1], basis, "estimated")


def costs(gpu: GPU, gpu_count: int, hours: tuple[float, float]) -> list[Cost]:
    """Cost at each listed price of this GPU."""
    return [
        Cost(gpu_id=gpu.id, provider=p.provider, usd_low=hours[0] * p.usd_per_hour * gpu_count,
             usd_high=hours[1] * p.usd_per_hour * gpu_count, usd_per_hour=p.usd_per_hour * gpu_count, as_of=p.as_of,
             counterfactual=gpu.local)
        for p in gpu.prices
    ]
