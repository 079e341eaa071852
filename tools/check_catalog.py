"""Check the bundled model configs against published parameter counts and transformers.

For every entry of ``sdk/aegis/models/catalog/models.json``: the planner's count from shapes
(`aegis.models.profiles.profile_from_config`) is compared with each parameter count the entry says is published
(model card, paper, Hub safetensors total) — total, non-embedding or active — within one unit of the
published figure's last digit (exact for an exact figure). A figure the entry marks as known to
disagree (with the reason) is reported, not failed. With transformers installed, the model is also
built on the meta device (no memory, no download) and its count must equal the planner's exactly;
anything transformers logs or warns while reading a config is printed under the table.

    python tools/check_catalog.py               # table; exit status 1 on any unexplained mismatch
    python tools/check_catalog.py --only qwen   # ids containing "qwen"
    python tools/check_catalog.py --no-meta     # published counts only (no torch/transformers)

The same checks run in tests/models/test_catalog.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from dataclasses import dataclass

from aegis.models import catalog
from aegis.models.profiles import profile_from_config


@dataclass(frozen=True)
class Figure:
    """One published figure against the planner's count."""

    model_id: str
    counts: str
    published: str
    where: str
    computed: int
    verdict: str  # exact | within | known | MISMATCH
    why: str = ""


@dataclass(frozen=True)
class MetaRow:
    """The planner's total against transformers' meta-device model."""

    model_id: str
    architecture: str
    planner: int
    transformers: int
    messages: tuple[str, ...]


def counts_of(entry: catalog.CatalogModel) -> dict[str, int]:
    """total / non_embedding / active parameters of an entry, from shapes."""
    p = profile_from_config(catalog.read_model_config(entry), model_id=entry.id, source="catalog")
    return {"total": p.total_params, "non_embedding": p.total_params - p.embedding_params - p.lm_head_params,
            "active": p.active_params_per_token}


def verdict(figure: catalog.PublishedCount, computed: int) -> str:
    if figure.agrees(computed):
        return "exact" if figure.tolerance == 0 else "within"
    return "known" if figure.disagrees else "MISMATCH"


def check_published(only: str | None = None) -> list[Figure]:
    rows = []
    for entry in catalog.models():
        if only and only.lower() not in entry.id.lower():
            continue
        counts = counts_of(entry)
        for fig in entry.published:
            got = counts[fig.counts]
            rows.append(Figure(entry.id, fig.counts, fig.value, fig.where, got, verdict(fig, got), fig.disagrees))
    return rows


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def meta_count(config_dict: dict) -> tuple[str, int, tuple[str, ...]]:
    """Build the model of ``config_dict`` on the meta device; return (class name, params, warnings)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    handler = _Collect()
    tf_logger = logging.getLogger("transformers")
    tf_logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = dict(config_dict)
            model_type = cfg.pop("model_type")
            cfg.pop("auto_map", None)  # remote-code pointers: the native class is used instead
            config = AutoConfig.for_model(model_type, **cfg)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
    finally:
        tf_logger.removeHandler(handler)
    params = sum(p.numel() for p in model.parameters())
    return type(model).__name__, params, tuple(handler.messages) + tuple(str(w.message) for w in caught)


def check_meta(only: str | None = None) -> list[MetaRow]:
    rows = []
    for entry in catalog.models():
        if only and only.lower() not in entry.id.lower():
            continue
        arch, params, messages = meta_count(catalog.read_model_config(entry))
        rows.append(MetaRow(entry.id, arch, counts_of(entry)["total"], params, messages))
    return rows


def render(figures: list[Figure], meta: list[MetaRow]) -> str:
    head = f"{'model':52} {'counts':13} {'published':>16} {'computed':>17} verdict"
    lines = [head, "-" * len(head)]
    for f in figures:
        lines.append(f"{f.model_id:52} {f.counts:13} {f.published:>16} {f.computed:>17,} {f.verdict}")
    tally = {v: sum(f.verdict == v for f in figures) for v in ("exact", "within", "known", "MISMATCH")}
    lines.append(f"\n{len(figures)} published figures: " + ", ".join(f"{n} {v}" for v, n in tally.items()))
    lines += [f"  known: {f.model_id} {f.published} ({f.where}): {f.why}" for f in figures if f.verdict == "known"]
    if meta:
        off = [m for m in meta if m.planner != m.transformers]
        lines.append(f"transformers meta-device counts: {len(meta) - len(off)}/{len(meta)} equal the planner's")
        lines += [f"  DIFFERS {m.model_id} ({m.architecture}): planner {m.planner:,} transformers {m.transformers:,}"
                  for m in off]
        lines += [f"  [{m.model_id}] {msg}" for m in meta for msg in m.messages]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="check only ids containing this text")
    parser.add_argument("--no-meta", action="store_true", help="skip the transformers meta-device build")
    args = parser.parse_args(argv)
    figures = check_published(args.only)
    meta = [] if args.no_meta else check_meta(args.only)
    print(render(figures, meta))
    failed = any(f.verdict == "MISMATCH" for f in figures) or any(m.planner != m.transformers for m in meta)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
