"""Time and cost: tokens/s from FLOPs per token over the GPU's tensor rate in the step's precision (bf16, or fp16
where the card is faster at it) at an MFU range, or at the MFU a stored measurement achieved (`aegis benchmark`);
epoch and total time; cost at catalog prices.

A measurement transfers: the JAX engine's record for a GPU, model and method gives its MFU (measured tokens/s x the
one FLOPs count at the measured length, over the peak; `measured_mfu`), and the planner applies that MFU to the
planned batch, length and precision on the same GPU, saying so in the basis.

The rate is a roofline over the catalog's two peaks: a token cannot be trained faster than its FLOPs allow at the
tensor rate, nor faster than the device memory it must move allows at the card's bandwidth (`bytes_per_token`).
Large models are compute-bound (the bandwidth roof is 10-50x higher); a tiny model's step is bound by moving its
activations and logits, and the utilisation range applies to whichever roof binds.

    from aegis.planning.throughput import flops_per_token, tokens_per_s_range
    low, high, basis, source = tokens_per_s_range(profile, cfg, gpu)
    token_flops(profile, "lora", 2048).forward    # the one FLOPs count: planner, benchmark MFU, forge fitness
"""

from __future__ import annotations

from typing import NamedTuple

from aegis.planning.calibration import CalibrationRecord, CalibrationStore
from aegis.schema import (
    GPU, Cost, Framework, LoRAConfig, MemoryEstimate, Method, ModelProfile, TrainConfig, lora_selects, lora_target_names,
)

__all__ = ["MFU_RANGE", "TokenFlops", "bytes_per_token", "costs", "flops_per_token", "measured_mfu",
           "measured_tokens_per_s", "model_flops_utilisation", "token_flops", "tokens_per_s_range"]

MFU_RANGE = {"full": (0.30, 0.45), "lora": (0.28, 0.42), "qlora": (0.18, 0.30)}
"""Model-FLOPs utilisation assumed per method (QLoRA dequantises every weight on the fly). Measured on a lent H200
(tests/data/gpu_speed.json, Llama-3.2-1B-shaped, bf16, b4 x 2,048): the JAX engine at 35.7% (full) and 28.8% (LoRA),
HF Trainer at 38.9% (full), all inside; HF Trainer + PEFT's LoRA at 19.2%, below the LoRA range."""
MEASURED_SPREAD = 0.10
"""A stored measurement is shown as +/- this share."""


class TokenFlops(NamedTuple):
    """FLOPs per token of one model at one sequence length: the one count the planner's time, the benchmark's MFU
    and forge's speed fitness all use."""

    training: float
    """One training step's FLOPs per token: forward + backward (+ the recomputed forward with checkpointing)."""
    forward: float
    """One forward pass's FLOPs per token (evaluation, generation)."""
    formula: str
    """How ``training`` was counted, in words."""


def token_flops(
    profile: ModelProfile, method: Method, seq_len: int, *, recompute: bool | float = False,
    lora: LoRAConfig | None = None,
) -> TokenFlops:
    """FLOPs per token, PaLM-style with causal attention.

    Matmul parameters: the parameters a token passes through (routed experts only, `active_params_per_token`),
    without the lookups (token and learned position embeddings), the norms' weights and the linears' biases, but with
    the head (a tied head still multiplies). Forward: 2 FLOPs per matmul
    parameter, plus causal attention's QK^T and AV, ``2 x layers x heads x head_dim x seq_len`` (each query sees
    seq_len/2 keys on average). Backward: input gradients (one forward's worth) plus weight gradients (another) for
    full fine-tuning; frozen weights (LoRA, QLoRA) need no weight gradients; attention always has both halves.
    ``lora`` (LoRA, QLoRA): the adapters' own matmuls, ``x A`` then ``(x A) B``, ``rank x (in + out)`` parameters
    per adapted module a token passes through, trained: 6 FLOPs each (forward, input and weight gradients).
    ``recompute`` (gradient checkpointing) adds one forward; a fraction (the engine's ``remat_layers`` of the
    layers) that fraction of one."""
    matmul = (profile.active_params_per_token - profile.embedding_params - profile.position_embedding_params
              - profile.norm_params - _active_bias_params(profile))
    if profile.tie_word_embeddings:
        matmul += profile.embedding_params  # the tied head still multiplies
    attn_fwd = 2 * profile.num_layers * profile.num_attention_heads * profile.head_dim * seq_len
    adapters = _adapter_matmul_params(profile, lora) if method != "full" and lora is not None else 0
    fwd = 2 * matmul + attn_fwd + 2 * adapters
    passes = 3.0 if method == "full" else 2.0  # frozen weights need no weight gradients
    total = passes * 2 * matmul + 3 * attn_fwd + 6 * adapters
    params = f"{matmul / 1e9:.2f}B" if matmul >= 1e7 else f"{matmul / 1e6:.2f}M"
    text = f"{'6' if method == 'full' else '4'} x {params} matmul params + causal attention"
    if adapters:
        text += f" + 6 x {adapters / 1e6:.2f}M LoRA adapter params"
    share = float(recompute)
    if share:
        total += share * fwd
        text += " + recomputed forward" if share >= 1.0 else f" + {share:.0%} of a forward recomputed"
    return TokenFlops(training=float(total), forward=float(fwd), formula=text)


def _adapter_matmul_params(profile: ModelProfile, lora: LoRAConfig) -> int:
    """LoRA parameters a token passes through: ``rank x (in + out)`` per adapted module (an expert's adapters only
    for the top-k routed experts)."""
    targets = lora_target_names(lora.target_modules, profile.linear_modules)
    total = 0.0
    for m in profile.linear_modules:
        if lora_selects(m, targets):
            share = profile.num_experts_per_tok / profile.num_experts if "expert" in m.name and profile.num_experts else 1
            total += lora.rank * (m.in_features + m.out_features) * m.count * share
    return int(total)


def _active_bias_params(profile: ModelProfile) -> int:
    """Bias parameters a token touches (an expert's bias only for the top-k routed experts)."""
    total = 0.0
    for m in profile.linear_modules:
        if m.bias:
            share = profile.num_experts_per_tok / profile.num_experts if "expert" in m.name and profile.num_experts else 1
            total += m.out_features * m.count * share
    return int(total)


def flops_per_token(profile: ModelProfile, cfg: TrainConfig) -> tuple[float, str]:
    """Training FLOPs per token of ``cfg`` (`token_flops` at its method, length and checkpointing) and the formula."""
    f = token_flops(profile, cfg.method, cfg.seq_len, recompute=recomputed_share(profile, cfg),
                    lora=cfg.lora_config if cfg.method != "full" else None)
    return f.training, f.formula


def recomputed_share(profile: ModelProfile, cfg: TrainConfig) -> float:
    """The share of the layers whose forward the backward pass recomputes: 1 with gradient checkpointing (every
    layer), ``remat_layers / layers`` with the engine's partial rematerialisation, 0 without."""
    if not cfg.gradient_checkpointing:
        return 0.0
    if cfg.remat_layers is None:
        return 1.0
    return min(cfg.remat_layers, profile.num_layers) / max(profile.num_layers, 1)


def model_flops_utilisation(tokens_per_s: float, profile: ModelProfile, cfg: TrainConfig, gpu: GPU) -> float:
    """The MFU a measured rate means: ``tokens_per_s`` x `flops_per_token` over the GPU's peak in ``cfg``'s
    precision. The planner's predicted rate is this function's inverse at its MFU range, so the two agree by
    construction."""
    return tokens_per_s * flops_per_token(profile, cfg)[0] / (gpu.tflops(cfg.precision) * 1e12)


def bytes_per_token(profile: ModelProfile, cfg: TrainConfig, gpu: GPU, memory: MemoryEstimate | None = None) -> float:
    """Device-memory traffic per token a training step cannot avoid, from the memory engine's own tensors
    (``memory``, else `aegis.planning.memory.estimate.estimate` of ``cfg``): every activation and logit saved for the
    backward is written once and read back once, and every base weight is read once per pass over the micro batch
    (forward and input gradients, plus the recomputed forward with checkpointing). A lower bound: temporaries,
    optimizer and gradient traffic are left out, so the throughput it caps is an upper bound."""
    if memory is None:
        from aegis.planning.memory.estimate import estimate

        memory = estimate(profile, cfg, gpu=gpu)
    parts = {c.key: c.bytes for c in memory.components}
    saved = parts.get("activations", 0) + parts.get("logits", 0)
    passes = 2 + recomputed_share(profile, cfg)
    return (2 * saved + passes * parts.get("weights", 0)) / (cfg.micro_batch_size * cfg.seq_len)


def measured_mfu(record: CalibrationRecord, profile: ModelProfile, gpu: GPU) -> float:
    """The MFU a stored measurement achieved: its tokens/s x the one FLOPs count (`flops_per_token`) at the
    measured method, sequence length and checkpointing, over ``gpu``'s peak in the measured precision. What makes a
    measurement transferable: the planner applies it to another batch, length or precision on the same GPU."""
    measured = TrainConfig(method=record.method, micro_batch_size=record.micro_batch_size, seq_len=record.seq_len,
                           gradient_checkpointing=record.gradient_checkpointing, precision=record.precision,
                           remat_layers=record.remat_layers if record.method != "full" else None, lora=None)
    return model_flops_utilisation(record.tokens_per_s, profile, measured, gpu)


def measured_tokens_per_s(record: CalibrationRecord, profile: ModelProfile, cfg: TrainConfig, gpu: GPU) -> tuple[float, float]:
    """``(tokens/s per GPU, MFU)``: the record's `measured_mfu` applied to ``cfg`` (its FLOPs per token and its
    precision's peak). At the measured configuration this is the measured rate itself."""
    mfu = measured_mfu(record, profile, gpu)
    return mfu * gpu.tflops(cfg.precision) * 1e12 / flops_per_token(profile, cfg)[0], mfu


def _remat_text(checkpointing: bool, remat_layers: int | None) -> str:
    if not checkpointing:
        return ""
    return ", remat" if remat_layers is None else f", remat {remat_layers} layers"


def tokens_per_s_range(
    profile: ModelProfile, cfg: TrainConfig, gpu: GPU, *, gpu_count: int = 1, efficiency: tuple[float, float] = (1.0, 1.0),
    store: CalibrationStore | None = None, memory: MemoryEstimate | None = None, framework: Framework = "jax",
) -> tuple[float, float, str, str]:
    """(low, high, basis, 'estimated' | 'measured') for the whole job across `gpu_count` GPUs.

    Measured: when ``store`` (default ``$AEGIS_HOME/calibration.json``) holds an `aegis benchmark` record of this
    GPU, model and method run by ``framework``'s engine, its MFU (`measured_mfu`) applied to ``cfg`` (another batch,
    length or precision is fine: the FLOPs per token and the peak are ``cfg``'s), +/- `MEASURED_SPREAD`.
    Estimated: the roofline (the slower of the compute and the memory-traffic bound) at the method's documented
    utilisation range (`MFU_RANGE`). ``memory``: ``cfg``'s single-GPU estimate, when already made."""
    store = store if store is not None else CalibrationStore()
    record = store.lookup(gpu.id, profile.model_id, cfg.method)
    if record is not None and record.framework == framework:
        per_gpu, mfu = measured_tokens_per_s(record, profile, cfg, gpu)
        rate = per_gpu * gpu_count
        same = (record.micro_batch_size, record.seq_len, record.precision, record.gradient_checkpointing,
                record.remat_layers) == (cfg.micro_batch_size, cfg.seq_len, cfg.precision, cfg.gradient_checkpointing,
                                         cfg.remat_layers)
        basis = (f"measured by `aegis benchmark` on {record.measured_at[:10]}: {record.tokens_per_s:,.0f} tokens/s, "
                 f"MFU {_percent(mfu)} ({record.framework} engine on {record.device}, mb {record.micro_batch_size}, "
                 f"seq {record.seq_len}, {record.precision}"
                 f"{_remat_text(record.gradient_checkpointing, record.remat_layers)})")
        if not same:
            flops = flops_per_token(profile, cfg)[0]
            work = f"{flops / 1e9:.1f} GFLOP" if flops >= 1e8 else f"{flops / 1e6:.1f} MFLOP"
            basis += (f"; that MFU applied to this plan's {work}/token (mb {cfg.micro_batch_size}, seq {cfg.seq_len}, "
                      f"{cfg.precision}{', remat' if cfg.gradient_checkpointing else ''}) = {per_gpu:,.0f} tokens/s")
        if gpu_count > 1:
            basis += f" x {gpu_count} GPUs at {efficiency[0]:.0%}-{efficiency[1]:.0%} scaling"
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
        basis = (f"estimated from the documented efficiency (no `aegis benchmark` record): {text} = {work}/token, "
                 f"but memory-bound: {amount}/token moved (saved activations and logits written and read back, "
                 f"weights read every pass) at {lo:.0%}-{hi:.0%} utilisation of {gpu.bandwidth_gb_per_s:,.0f} GB/s, under the {tflops:g} TFLOPS {kind} compute roof")
    else:
        basis = (f"estimated from the documented efficiency (no `aegis benchmark` record): {text} = {work}/token at "
                 f"{lo:.0%}-{hi:.0%} MFU of {tflops:g} TFLOPS {kind}")
    if gpu_count > 1:
        basis += f" x {gpu_count} GPUs at {efficiency[0]:.0%}-{efficiency[1]:.0%} scaling"
    return (rate * lo * gpu_count * efficiency[0], rate * hi * gpu_count * efficiency[1], basis, "estimated")


def _percent(share: float) -> str:
    """0.4312 -> '43.1%'; a CPU-sized share of a GPU's peak keeps two significant digits (0.0000123 -> '0.0012%')."""
    return f"{share:.1%}" if share >= 0.01 else f"{share * 100:.2g}%"


def costs(gpu: GPU, gpu_count: int, hours: tuple[float, float]) -> list[Cost]:
    """Cost at each listed price of this GPU."""
    return [
        Cost(gpu_id=gpu.id, provider=p.provider, usd_low=hours[0] * p.usd_per_hour * gpu_count,
             usd_high=hours[1] * p.usd_per_hour * gpu_count, usd_per_hour=p.usd_per_hour * gpu_count, as_of=p.as_of,
             counterfactual=gpu.local)
        for p in gpu.prices
    ]
