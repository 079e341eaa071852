"""Record the allocation stream of a traced training step and replay it through the allocator model.

    python -m tools.truth.stream meta-llama/Llama-3.2-1B --method full -b 2 -s 1024

`trace_stream` runs the same fake-tensor trace as `trace.py`, with a `LiveBytes` that also
records each storage's birth and death as ``("alloc", id, nbytes)`` / ``("free", id, 0)``
(a storage grown in place becomes a new allocation followed by the old one's free, as a
resize does on CUDA). `aegis.planning.memory.allocator.replay` turns that into the reserved peak the
CUDA caching allocator would show.
"""

from __future__ import annotations

import argparse
import itertools
from contextlib import contextmanager
from unittest import mock

import torch

from tools.truth import trace as trace_module
from tools.truth.alloc import LiveBytes
from tools.truth.setup import TraceResult, TraceSetup


class StreamLiveBytes(LiveBytes):
    """`LiveBytes` that also keeps the ordered stream of storage allocations and frees."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, int, int]] = []
        self._ids: dict[int, int] = {}
        self._counter = itertools.count(1)
        self.reset_at = 0
        """Index in `events` where the tracker's peaks were last reset (model built, steps begin)."""

    def _track(self, t: torch.Tensor) -> None:
        if t.layout != torch.strided:
            return
        key = t.untyped_storage()._cdata
        before = self.live.get(key)
        super()._track(t)
        after = self.live.get(key)
        if before is None and after is not None:
            self._ids[key] = next(self._counter)
            self.events.append(("alloc", self._ids[key], t.untyped_storage().nbytes()))
        elif before is not None and after is not None and after > before:
            old = self._ids[key]
            self._ids[key] = next(self._counter)
            self.events.append(("alloc", self._ids[key], t.untyped_storage().nbytes()))
            self.events.append(("free", old, 0))

    def _free(self, key: int) -> None:
        # Pure-Python: runs inside a weakref callback.
        if key in self.live and key in self._ids:
            self.events.append(("free", self._ids.pop(key), 0))
        super()._free(key)

    def reset_peak(self) -> None:
        super().reset_peak()
        self.reset_at = len(self.events)


def as_loaded(events: list[tuple[str, int, int]], reset_at: int) -> list[tuple[str, int, int]]:
    """``events`` with the model build's temporaries dropped: of the first ``reset_at`` events (the build, up to
    where the steps begin) only the allocations still live at ``reset_at``, in order; the steps' events as traced.

    The trace builds the model with ``AutoModelForCausalLM.from_config`` on the (fake) device, which allocates a
    tied head's weight and frees it when the weights are tied, and for QLoRA builds the bf16 model and then
    quantises it. ``from_pretrained`` does neither: it builds on the meta device under ``no_tie_weights``
    (transformers ``PreTrainedModel.get_init_context``) and loads each weight into place (bitsandbytes quantises
    each one as it arrives). Kept in the stream, the build's freed blocks stay cached and the steps' tensors are
    carved out of them, which a loaded model's run never sees."""
    freed = {ident for kind, ident, _ in events[:reset_at] if kind == "free"}
    return [e for e in events[:reset_at] if e[1] not in freed] + events[reset_at:]


@contextmanager
def _recording():
    with mock.patch.object(trace_module, "LiveBytes", StreamLiveBytes):
        yield


def trace_stream(config, setup: TraceSetup, *, fake: bool = True) -> tuple[TraceResult, StreamLiveBytes]:
    """`trace_with_tracker` whose tracker holds the allocation stream in ``tracker.events``."""
    with _recording():
        return trace_module.trace_with_tracker(config, setup, fake=fake)


def predict_reserved(config, setup: TraceSetup, **allocator_options) -> dict[str, int]:
    """Trace ``setup`` and replay its whole stream (model build included) through the allocator model."""
    from aegis.planning.memory.allocator import replay

    result, tracker = trace_stream(config, setup)
    stats = replay(tracker.events, **allocator_options)
    return {
        "traced_peak_bytes": result.peak_bytes,
        "max_allocated_bytes": stats.max_allocated_bytes,
        "max_reserved_bytes": stats.max_reserved_bytes,
        "events": len(tracker.events),
    }


def main(argv: list[str] | None = None) -> int:
    from tools.truth.build import config_path

    parser = argparse.ArgumentParser(prog="python -m tools.truth.stream", description=__doc__.split("\n")[0])
    parser.add_argument("model_id")
    parser.add_argument("--method", default="full", choices=["full", "lora", "qlora"])
    parser.add_argument("-b", "--micro-batch-size", type=int, default=1)
    parser.add_argument("-s", "--seq-len", type=int, default=512)
    parser.add_argument("--gc", action="store_true", help="gradient checkpointing")
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "eager"])
    args = parser.parse_args(argv)
    setup = TraceSetup(
        method=args.method,
        micro_batch_size=args.micro_batch_size,
        seq_len=args.seq_len,
        gradient_checkpointing=args.gc,
        attention=args.attention,
    )
    from aegis.planning.memory.allocator import replay

    result, tracker = trace_stream(str(config_path(args.model_id)), setup)
    gib = 1 << 30
    print(f"traced peak (512 B-rounded live bytes): {result.peak_bytes / gib:8.3f} GiB  ({len(tracker.events)} events)")
    for expandable in (False, True):
        stats = replay(tracker.events, expandable_segments=expandable)
        print(
            f"expandable_segments={expandable!s:<5}  max_allocated {stats.max_allocated_bytes / gib:8.3f} GiB"
            f"  max_reserved {stats.max_reserved_bytes / gib:8.3f} GiB"
            f"  reserved/allocated {stats.max_reserved_bytes / stats.max_allocated_bytes:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
