"""Number and label formatting shared by every report renderer (text, Markdown, JSON-adjacent, Slack).

Memory is computed in bytes everywhere in Aegis and turned into text only here, in GiB
(`aegis.units`: the unit of PyTorch's OOM messages; a "24 GB" RTX 3090 reads 24.0 GiB).

    from aegis.planning.report.format import format_bytes, format_params, format_hours_range
    format_bytes(13_346_000_000)        # '12.43 GiB'
    format_params(8_030_261_248)        # '8.03B'
    format_hours_range(0.58, 0.83)      # '35-50 min'
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from aegis.units import GIB
from aegis.schema import ALL_LINEAR_TARGETS, GPU, LORA_GATE_TARGETS, Method, Optimizer, TrainConfig

__all__ = [
    "GB",
    "format_bytes",
    "format_bytes_range",
    "format_gb_value",
    "format_params",
    "format_int",
    "format_share",
    "format_hours",
    "format_hours_range",
    "format_usd",
    "format_rate",
    "method_label",
    "method_short",
    "optimizer_label",
    "targets_label",
    "headroom_verdict",
    "config_line",
    "config_diff",
    "RISK_MARKERS",
]

GB = GIB
"""Bytes in one report unit (GiB, `aegis.units`)."""

_METHOD_SHORT: dict[str, str] = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}
_OPTIMIZER_LABELS: dict[str, str] = {
    "adamw": "AdamW",
    "adamw_8bit": "AdamW 8-bit (bitsandbytes)",
    "paged_adamw_8bit": "Paged AdamW 8-bit (bitsandbytes)",
    "sgd": "SGD",
    "adafactor": "Adafactor",
}
_ATTN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")

RISK_MARKERS: dict[str, str] = {"ok": "[ok]", "warn": "[!!]", "danger": "[XX]"}
"""The bracketed marker each risk level prints with (plain text survives any terminal)."""

# Headroom below which a fitting configuration is called tight rather than comfortable: the
# aggressive tier is defined by the solver as "< 1 GiB headroom", so the same line is used here.
_TIGHT_HEADROOM_BYTES = GB


def format_gb_value(n_bytes: float, digits: int = 2) -> str:
    """Bytes as a bare GiB number: ``format_gb_value(13.35e9) == '12.43'``."""
    return f"{n_bytes / GB:.{digits}f}"


def format_bytes(n_bytes: float, digits: int = 2) -> str:
    """Bytes as GiB text with ``digits`` decimals: ``'12.43 GiB'``; below 0.01 GiB, in MiB."""
    if 0 < abs(n_bytes) < GB / 10 ** digits:
        return f"{n_bytes / 2**20:.1f} MiB"
    return f"{format_gb_value(n_bytes, digits)} GiB"


def format_bytes_range(low_bytes: float, high_bytes: float, digits: int = 1) -> str:
    """A memory range: ``'11.6 - 13.2 GiB'``."""
    return f"{format_gb_value(low_bytes, digits)} - {format_gb_value(high_bytes, digits)} GiB"


def format_params(n: int) -> str:
    """A parameter count with a magnitude suffix: ``'8.03B'``, ``'41.9M'``, ``'512K'``, ``'900'``."""
    for scale, suffix, digits in ((1e12, "T", 2), (1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 0)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f}{suffix}"
    return str(n)


def format_int(n: float) -> str:
    """An integer with thousands separators: ``'10,247'``."""
    return f"{round(n):,}"


def format_share(x: float) -> str:
    """A fraction as a percentage with sensible precision: ``0.0052 -> '0.52%'``, ``0.73 -> '73%'``."""
    pct = 100 * x
    if pct == 0:
        return "0%"
    if abs(pct) < 1:
        return f"{pct:.2f}%"
    if abs(pct) < 10:
        return f"{pct:.1f}%"
    return f"{pct:.0f}%"


def _duration_unit(hours: float) -> tuple[float, str]:
    if hours < 1:
        return 60.0, "min"
    if hours < 48:
        return 1.0, "h"
    return 1 / 24, "days"


def _fmt_amount(value: float, unit: str) -> str:
    if unit == "min":
        return f"{max(1, round(value))}"
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def format_hours(hours: float) -> str:
    """A duration given in hours: ``0.6 -> '36 min'``, ``2.5 -> '2.5 h'``, ``60 -> '2.5 days'``."""
    scale, unit = _duration_unit(hours)
    return f"{_fmt_amount(hours * scale, unit)} {unit}"


def format_hours_range(low_hours: float, high_hours: float) -> str:
    """A duration range in the unit of its upper end: ``(0.58, 0.83) -> '35-50 min'``."""
    scale, unit = _duration_unit(high_hours)
    low, high = _fmt_amount(low_hours * scale, unit), _fmt_amount(high_hours * scale, unit)
    return f"{high} {unit}" if low == high else f"{low}-{high} {unit}"


def format_usd(usd: float) -> str:
    """Dollars: cents below $100, whole dollars above."""
    return f"${usd:,.2f}" if usd < 100 else f"${usd:,.0f}"


def format_rate(tokens_per_s: float) -> str:
    """A throughput, rounded to 2-3 significant figures: ``1523.4 -> '1,520'``."""
    if tokens_per_s <= 0:
        return "0"
    magnitude = int(math.floor(math.log10(tokens_per_s)))
    if magnitude < 2:
        return f"{tokens_per_s:.{max(0, 1 - magnitude)}f}"
    return format_int(round(tokens_per_s, -(magnitude - 2)))


def method_label(method: Method, cfg: TrainConfig | None = None) -> str:
    """What a method trains, in words, with the dtypes the memory engine places (``cfg``, else the method's
    defaults): ``'QLoRA (NF4 base + fp32 adapters)'``, ``'Full fine-tuning (every weight trainable, bf16)'``."""
    from aegis.planning.report._facts import dtype_facts

    d = dtype_facts(cfg if cfg is not None else TrainConfig(method=method))
    if method == "full":
        return f"Full fine-tuning (every weight trainable, {d.base})"
    return f"{_METHOD_SHORT[method]} ({d.base} base + {d.adapters} adapters)"


def method_short(method: Method) -> str:
    """``'QLoRA'``, ``'LoRA'`` or ``'Full'``."""
    return _METHOD_SHORT[method]


def optimizer_label(optimizer: Optimizer) -> str:
    """Display name of an optimizer."""
    return _OPTIMIZER_LABELS[optimizer]


def targets_label(targets: Iterable[str], known: Iterable[str] = ()) -> str:
    """LoRA target modules, shortened: ``'q,k,v,o,gate,up,down (all attn + MLP)'``. With ``known`` (the
    names that select a module of the model), "all attn + MLP" means every projection of that model
    (Mixtral: ``q,k,v,o,w1,w3,w2``), and names that select nothing are said so rather than counted:
    ``'q,k,v,o (all attention); gate,up,down match no module of this model'`` on Mixtral."""
    names = tuple(targets)
    if "all-linear" in names:
        return "all-linear (every linear layer PEFT can wrap)"
    known = set(known)
    unmatched = [t for t in names if known and t not in known]
    names = tuple(t for t in names if t not in unmatched)
    short = ",".join(_short_target(t) for t in names)
    chosen = set(names)
    projections = known - LORA_GATE_TARGETS if known else set(ALL_LINEAR_TARGETS)
    if chosen >= projections and not chosen - set(_ATTN_TARGETS):  # GPT-OSS: the experts are not nn.Linear
        label = f"{short} (all attention, the only LoRA targets)"
    elif chosen >= projections:
        label = f"{short} (all attn + MLP)"
    elif chosen >= set(_ATTN_TARGETS) and not chosen & set(_MLP_TARGETS):
        label = f"{short} (all attention)"
    elif chosen >= set(_MLP_TARGETS) and not chosen & set(_ATTN_TARGETS):
        label = f"{short} (MLP only)"
    else:
        label = short
    if unmatched:
        label += f"; {','.join(_short_target(t) for t in unmatched)} match no module of this model"
    return label


def _short_target(name: str) -> str:
    """``q_proj`` -> ``q``, ``gate_up_proj`` -> ``gate_up``; a name that would shrink to one letter other than q, k, v
    or o stays whole (StarCoder2's ``c_proj`` is not ``c``)."""
    short = name.removesuffix("_proj")
    return short if len(short) > 1 or short in "qkvo" else name


def headroom_verdict(headroom_bytes: int, gpu: GPU | None = None) -> str:
    """One word on a headroom: ``'comfortable'``, ``'tight'`` or ``'does not fit'``. Tight is under the headroom the
    solver's recommended tier keeps on ``gpu`` (`aegis.planning.solver.comfort_bytes`), or under 1 GiB with no GPU."""
    from aegis.planning.solver import comfort_bytes

    if headroom_bytes < 0:
        return "does not fit"
    if headroom_bytes < (comfort_bytes(gpu) if gpu is not None else _TIGHT_HEADROOM_BYTES):
        return "tight"
    return "comfortable"


def config_line(cfg: TrainConfig) -> str:
    """A configuration on one line: ``'bs=4, grad_accum=4, seq=1024, ckpt OFF, adamw'``."""
    parts = [f"bs={cfg.micro_batch_size}", f"grad_accum={cfg.gradient_accumulation_steps}", f"seq={cfg.seq_len}"]
    if cfg.method != "full":
        parts.append(f"rank {cfg.lora_config.rank}")
    parts.append(f"grad ckpt {'ON' if cfg.gradient_checkpointing else 'OFF'}")
    parts.append(cfg.optimizer)
    if cfg.chunked_cross_entropy:
        parts.append("chunked CE")
    return ", ".join(parts)


def config_diff(base: TrainConfig | None, cfg: TrainConfig) -> str:
    """What ``cfg`` changes relative to ``base``: ``'bs=2, grad_accum=8'`` or ``'Enable grad checkpointing'``.

    Without a base (nothing else fits) the whole configuration is listed.
    """
    if base is None:
        return config_line(cfg)
    parts: list[str] = []
    if cfg.method != base.method:
        parts.append(f"{method_short(cfg.method)} instead of {method_short(base.method)}")
    if cfg.method != "full" and base.method != "full" and cfg.lora_config.rank != base.lora_config.rank:
        parts.append(f"rank {cfg.lora_config.rank}")
    if cfg.gradient_checkpointing != base.gradient_checkpointing:
        parts.append("grad ckpt" if cfg.gradient_checkpointing else "no grad ckpt")
    if cfg.micro_batch_size != base.micro_batch_size:
        parts.append(f"bs={cfg.micro_batch_size}")
    if cfg.gradient_accumulation_steps != base.gradient_accumulation_steps:
        parts.append(f"grad_accum={cfg.gradient_accumulation_steps}")
    if cfg.seq_len != base.seq_len:
        parts.append(f"seq={cfg.seq_len}")
    if cfg.optimizer != base.optimizer:
        parts.append(cfg.optimizer)
    if cfg.chunked_cross_entropy != base.chunked_cross_entropy:
        parts.append("chunked CE" if cfg.chunked_cross_entropy else "no chunked CE")
    if cfg.attention != base.attention:
        parts.append(f"{cfg.attention} attention")
    if cfg.precision != base.precision:
        parts.append(cfg.precision)
    if not parts:
        return "same configuration"
    if parts == ["grad ckpt"]:
        return "Enable grad checkpointing"
    text = ", ".join(parts)
    return text[0].upper() + text[1:] if "=" not in parts[0] else text
