"""The config solver: from a GPU's memory and a job, the recommended, aggressive and fallback configs.

Every candidate is sized by the memory engine; "fits" means the predicted high end (tensor peak +
framework overhead + dynamic margin) is within the GPU's memory. The recommended tier keeps
comfortable headroom and maximises throughput; the aggressive one maximises throughput with under
1 GiB of headroom; the fallback chain — ordered by expected training quality, each entry smaller than
the one before — is what the supervisor switches to on an OOM.

    from aegis.planning.solver import solve
    solution = solve(profile, gpu, method="qlora", seq_len=1024)
    solution.recommended.config.micro_batch_size
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aegis.planning.memory.estimate import estimate
from aegis.units import GIB, gib
from aegis.schema import GPU, LoRAConfig, MemoryEstimate, Method, ModelProfile, Optimizer, Precision, StackProfile, Tier, TrainConfig

__all__ = ["Solution", "solve", "fits", "headroom_bytes", "comfort_bytes", "relative_speed", "AGGRESSIVE_HEADROOM_BYTES"]

AGGRESSIVE_HEADROOM_BYTES = GIB
"""The aggressive tier runs with less than this much headroom."""
AGGRESSIVE_SUMMARY = ("max throughput, little headroom: expect occasional OOM on long batches; "
                      "fine where a restart is cheap")
AGGRESSIVE_OMITTED = "aggressive tier omitted: nothing faster than the recommended config fits"
_CKPT_SPEED = 0.75
"""Throughput with gradient checkpointing relative to without (one extra forward: ~4/3 the compute)."""


def comfort_bytes(gpu: GPU) -> int:
    """Headroom the recommended tier keeps: 10% of the card, at least 1.5 GiB."""
    return max(int(0.10 * gpu.memory_bytes), int(1.5 * GIB))


def headroom_bytes(est: MemoryEstimate, gpu: GPU) -> int:
    return gpu.memory_bytes - est.high_bytes


def fits(est: MemoryEstimate, gpu: GPU) -> bool:
    return headroom_bytes(est, gpu) >= 0


def relative_speed(cfg: TrainConfig) -> float:
    """Expected throughput of a config, relative units: GPUs saturate with more tokens per micro step;
    checkpointing recomputes the forward; 8-bit/paged optimizers and chunked CE cost a little."""
    tokens = cfg.micro_batch_size * cfg.seq_len
    speed = tokens / (tokens + 1024)
    if cfg.gradient_checkpointing:
        speed *= _CKPT_SPEED
    if cfg.optimizer == "paged_adamw_8bit":
        speed *= 0.97
    if cfg.chunked_cross_entropy:
        speed *= 0.97
    return speed


@dataclass
class Solution:
    """Solver output: tiers plus what was tried."""

    recommended: Tier | None
    aggressive: Tier | None
    fallbacks: list[Tier]
    smallest: Tier
    """The smallest configuration tried (shown when nothing fits)."""
    notes: list[str] = field(default_factory=list)
    savings: bool = False
    """The recommended config trades something asked for memory (8-bit optimizer, chunked loss, lower rank)."""


def _tier(profile: ModelProfile, gpu: GPU, cfg: TrainConfig, name: str, summary: str, fsdp: int, eval_seq: int | None,
          ddp: bool = False, zero_stage: int = 0) -> Tier:
    est = estimate(profile, cfg, gpu=gpu, fsdp_shards=fsdp, eval_seq_len=eval_seq, ddp=ddp, zero_stage=zero_stage)
    room = headroom_bytes(est, gpu)
    return Tier(name=name, config=cfg, memory=est, headroom_bytes=room, fits=room >= 0, summary=summary,
                relative_speed=relative_speed(cfg))


def _powers(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def solve(
    profile: ModelProfile,
    gpu: GPU,
    *,
    method: Method = "lora",
    seq_len: int = 1024,
    effective_batch_size: int = 16,
    lora: LoRAConfig | None = None,
    optimizer: Optimizer = "adamw",
    precision: Precision = "bf16",
    micro_batch_size: int | None = None,
    gradient_checkpointing: bool | None = None,
    fsdp_shards: int = 1,
    gpu_count: int = 1,
    eval_seq_len: int | None = None,
    stack: StackProfile | None = None,
    autocast: bool | None = None,
    zero_stage: int = 0,
) -> Solution:
    """Search micro batch (binary search over powers of two), checkpointing, optimizer, chunked CE, rank.
    ``zero_stage`` 2 or 3: DeepSpeed ZeRO over ``fsdp_shards`` GPUs (`aegis.planning.memory.zero_stages`)."""
    lora = lora if method != "full" else None
    if method != "full" and lora is None:
        lora = LoRAConfig()
    per_gpu_batch = max(1, effective_batch_size // max(1, gpu_count))
    base = TrainConfig(method=method, seq_len=seq_len, precision=precision, optimizer=optimizer, lora=lora,
                       micro_batch_size=1, gradient_accumulation_steps=per_gpu_batch, stack=stack or StackProfile(),
                       autocast=autocast)
    base = base.model_copy(update={"autocast": base.autocast_effective})  # explicit in every tier (and plan.json)
    comfort = comfort_bytes(gpu)

    def make(mb: int, ckpt: bool, **extra) -> TrainConfig:
        accum = max(1, -(-per_gpu_batch // mb))
        return base.model_copy(update={"micro_batch_size": mb, "gradient_accumulation_steps": accum,
                                       "gradient_checkpointing": ckpt, **extra})

    cache: dict[TrainConfig, Tier] = {}

    def tier(cfg: TrainConfig, name: str = "", summary: str = "") -> Tier:
        if cfg not in cache:
            cache[cfg] = _tier(profile, gpu, cfg, name, summary, fsdp_shards, eval_seq_len,
                               ddp=gpu_count > 1 and fsdp_shards == 1 and not zero_stage, zero_stage=zero_stage)
        return cache[cfg].model_copy(update={"name": name, "summary": summary})

    def largest(ckpt: bool, room: int, **extra) -> int | None:
        """Largest power-of-two micro batch with at least `room` headroom (binary search)."""
        options = [micro_batch_size] if micro_batch_size else _powers(max(1, per_gpu_batch))
        lo, hi, best = 0, len(options) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            if tier(make(options[mid], ckpt, **extra)).headroom_bytes >= room:
                best, lo = options[mid], mid + 1
            else:
                hi = mid - 1
        return best

    ckpt_options = [gradient_checkpointing] if gradient_checkpointing is not None else [False, True]
    notes: list[str] = []

    def best_for(room: int) -> TrainConfig | None:
        candidates = []
        for ckpt in ckpt_options:
            mb = largest(ckpt, room)
            if mb:
                candidates.append(make(mb, ckpt))
        return max(candidates, key=relative_speed) if candidates else None

    rec_cfg = best_for(comfort)
    recommended, savings = None, False
    if rec_cfg is not None:
        without = None if gradient_checkpointing is not None else largest(False, comfort)
        if gradient_checkpointing is not None:
            why = f"checkpointing {'ON' if gradient_checkpointing else 'OFF'}: as asked"
        elif not rec_cfg.gradient_checkpointing:
            why = "checkpointing OFF: not needed at this headroom"
        elif without is None:
            why = "checkpointing ON: without it even micro batch 1 leaves too little headroom"
        else:
            why = (f"checkpointing ON: micro batch {rec_cfg.micro_batch_size} with it is faster than micro batch "
                   f"{without} without it")
        recommended = tier(rec_cfg, "recommended", f"fastest config with >= {gib(comfort)} headroom; {why}")
    else:  # no micro batch fits as asked: the fewest memory savings that make one fit
        rec_cfg, why = _with_savings(make, largest, ckpt_options, lora, comfort)
        if rec_cfg is not None:
            recommended, savings = tier(rec_cfg, "recommended", why), True
    agg_cfg = best_for(0)
    if recommended is None and agg_cfg is not None:  # fits as asked, tightly, and no saving is left to try
        rec_cfg = agg_cfg
        recommended = tier(rec_cfg, "recommended", f"tight: fits with less than {gib(comfort)} headroom")
    aggressive = None
    if agg_cfg is not None and (rec_cfg is None or relative_speed(agg_cfg) > relative_speed(rec_cfg) * 1.01):
        aggressive = tier(agg_cfg, "aggressive", AGGRESSIVE_SUMMARY)
    elif agg_cfg is not None and rec_cfg is not None:
        notes.append(AGGRESSIVE_OMITTED)

    # the chain steps down from the recommended config; with none, nothing as asked fits, and a chain of configs
    # that drop what was asked (a pinned micro batch or checkpointing) would tell the report two stories
    fallbacks = _fallback_chain(rec_cfg, tier, make, method, lora, gpu) if recommended is not None else []
    smallest = _smallest(make, lora, tier, micro_batch_size or 1, gradient_checkpointing)
    return Solution(recommended=recommended, aggressive=aggressive, fallbacks=fallbacks, smallest=smallest, notes=notes,
                    savings=savings)


def _savings(start: TrainConfig, lora: LoRAConfig | None) -> list[tuple[str, dict]]:
    """The memory savings that cost no quality or little, cheapest first (applied cumulatively)."""
    steps: list[tuple[str, dict]] = []
    if start.optimizer == "adamw":
        steps.append(("paged 8-bit AdamW: near-identical quality", {"optimizer": "paged_adamw_8bit"}))
    if not start.chunked_cross_entropy:
        steps.append(("chunked cross-entropy (e.g. Liger/Unsloth kernels): same quality", {"chunked_cross_entropy": True}))
    if lora is not None and lora.rank > 8:
        steps.append((f"LoRA rank {max(8, lora.rank // 2)}: fewer adapter parameters, slightly lower capacity",
                      {"lora": lora.model_copy(update={"rank": max(8, lora.rank // 2)})}))
    return steps


def _with_savings(make, largest, ckpt_options, lora: LoRAConfig | None,
                  comfort: int) -> tuple[TrainConfig | None, str]:
    """The recommended config when no micro batch fits as asked: the fewest savings (`_savings`) after which one
    keeps the comfortable headroom, at the largest micro batch that then does; else the fewest after which one fits
    at all (tight)."""
    extra: dict = {}
    applied: list[str] = []
    tight: tuple[TrainConfig, str] | None = None
    for summary, change in _savings(make(1, True), lora):
        extra.update(change)
        applied.append(summary.split(":")[0])
        for room in (comfort, 0):
            found = [make(mb, ckpt, **extra) for ckpt in ckpt_options if (mb := largest(ckpt, room, **extra))]
            if not found:
                continue
            best = max(found, key=relative_speed)
            if room:
                return best, (f"no micro batch fits as asked; with {', '.join(applied)} the fastest config keeps "
                              f">= {gib(comfort)} headroom")
            if tight is None:
                tight = best, (f"tight: no micro batch fits as asked, and with {', '.join(applied)} it fits "
                               f"with less than {gib(comfort)} headroom")
    return tight if tight is not None else (None, "")


def _fallback_chain(start: TrainConfig, tier, make, method: Method, lora: LoRAConfig | None, gpu: GPU) -> list[Tier]:
    """Cumulative steps, each cutting memory at the least cost to quality; kept when it fits and is smaller."""
    steps: list[tuple[str, dict]] = []
    mb = start.micro_batch_size
    while mb > 1:
        mb //= 2
        accum = max(1, -(-start.effective_batch_size // mb))
        steps.append((f"micro batch {mb}, grad accum {accum}: same effective batch, same quality",
                      {"micro_batch_size": mb}))
    if not start.gradient_checkpointing:
        steps.append(("gradient checkpointing ON: ~25% slower, same quality", {"gradient_checkpointing": True}))
    steps += _savings(start, start.lora if lora is not None else None)
    chain: list[Tier] = []
    current = start
    previous_bytes = tier(start).memory.total_bytes
    for summary, change in steps:
        update = dict(change)
        if "micro_batch_size" in update:
            new_mb = update["micro_batch_size"]
            update["gradient_accumulation_steps"] = max(1, -(-start.effective_batch_size // new_mb))
        current = current.model_copy(update=update)
        t = tier(current)
        if t.fits and _smaller(t.memory.total_bytes, previous_bytes):
            chain.append(t.model_copy(update={"name": f"fallback {len(chain) + 1}", "summary": summary}))
            previous_bytes = t.memory.total_bytes
    return chain


def _smaller(new_bytes: int, old_bytes: int) -> bool:
    """A step down worth taking: less memory, and a different figure where the report states it (GiB to one
    decimal, `aegis.units.gib`). A tiny model's steps save kilobytes under a fixed runtime overhead: a chain of
    configs that all read '1.4 GiB' would cost speed or quality for nothing an OOM could tell apart."""
    return new_bytes < old_bytes and gib(new_bytes, 1) != gib(old_bytes, 1)


def _smallest(make, lora: LoRAConfig | None, tier, micro_batch_size: int = 1,
              gradient_checkpointing: bool | None = None) -> Tier:
    """The smallest configuration the request allows: every saving, at the micro batch and the checkpointing asked
    for (micro batch 1 and checkpointing where they were left to the solver). When it does not fit, nothing does."""
    extra: dict = {"optimizer": "paged_adamw_8bit", "chunked_cross_entropy": True}
    if lora is not None and lora.rank > 8:  # the rank `_savings` tries
        extra["lora"] = lora.model_copy(update={"rank": max(8, lora.rank // 2)})
    ckpt = gradient_checkpointing is not False
    summary = f"micro batch {micro_batch_size:,}, " + ("checkpointing, " if ckpt else "no checkpointing (as asked), ")
    return tier(make(micro_batch_size, ckpt, **extra), "smallest", summary + "paged 8-bit AdamW, chunked CE")
