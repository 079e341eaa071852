"""Live tensor-storage accounting with a `TorchDispatchMode`, like the CUDA caching allocator.

`LiveBytes` sees every ATen op below autograd. Each output tensor's untyped storage is
counted once (keyed by identity, released through a weakref callback when the storage
dies) with its size rounded up to 512 B, as `torch.cuda.memory_allocated` counts blocks.
It works the same on real CPU tensors and on `FakeTensor`s, which is what lets a fake
trace be validated against a real run.

    tracker = LiveBytes()
    with tracker:
        tracker.phase("forward")
        loss = model(**batch).loss
        ...
    tracker.phase_peaks["forward"], tracker.peak_bytes, tracker.peak_breakdown()

At each new peak the set of live storages is remembered lazily (copied only when the
first free after the peak happens), so `peak_breakdown()` can split the peak into the
groups `groups_fn` names (parameters / gradients / optimizer state) and other
(activations and temporaries). `groups_fn` is only called from dispatch, never from the
weakref callbacks, which run while a tensor is being destroyed. With `record_origin` the
op, phase, shape and dtype that allocated each storage are kept (see `explain.py`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ALLOCATOR_ROUNDING_BYTES = 512
"""The CUDA caching allocator's minimum block size: every request is rounded up to it."""


def rounded_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator charges for a request of ``nbytes`` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // ALLOCATOR_ROUNDING_BYTES) * ALLOCATOR_ROUNDING_BYTES


def storage_key(t: torch.Tensor) -> int:
    """A key identifying the storage behind ``t`` while it is alive."""
    return t.untyped_storage()._cdata


def storage_bytes_of(tensors: Iterable[torch.Tensor]) -> int:
    """Rounded bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        seen[st._cdata] = rounded_bytes(st.nbytes())
    return sum(seen.values())


class LiveBytes(TorchDispatchMode):
    """Track live storage bytes, the overall peak, per-phase peaks and the peak's live set."""

    def __init__(
        self, groups_fn: Callable[[], dict[str, set[int]]] | None = None, *, record_origin: bool = False
    ) -> None:
        super().__init__()
        self.record_origin = record_origin
        self.origin: dict[int, tuple[str, str, tuple[int, ...], str]] = {}
        self.peak_origin: dict[int, tuple[str, str, tuple[int, ...], str]] = {}
        self._op = "external"
        self.groups_fn = groups_fn
        self.peak_groups: dict[str, set[int]] = {}
        self._groups: dict[str, set[int]] = {}
        self._groups_pending = False
        self.live: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.total_bytes = 0
        self.peak_bytes = 0
        self.current_phase = "setup"
        self.peak_phase = "setup"
        self.phase_peaks: dict[str, int] = {}
        self.peak_snapshot: dict[int, int] = {}
        self._snapshot_stale = False

    # -- bookkeeping -------------------------------------------------------------------
    def register(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count storages that already exist (created before the mode was entered)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        if t.layout != torch.strided:
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            # A resize (e.g. `out=` ops) can grow an existing storage.
            size = rounded_bytes(st.nbytes())
            if size > self.live[key]:
                self.total_bytes += size - self.live[key]
                self.live[key] = size
                self._note_peak()
            return
        size = rounded_bytes(st.nbytes())
        self.live[key] = size
        if self.record_origin:
            self.origin[key] = (self.current_phase, self._op, tuple(t.shape), str(t.dtype).replace("torch.", ""))
        self._refs[key] = weakref.ref(st, lambda _r, k=key: self._free(k))
        self.total_bytes += size
        self._note_peak()

    def _note_peak(self) -> None:
        phase_peak = self.phase_peaks.get(self.current_phase, 0)
        if self.total_bytes > phase_peak:
            self.phase_peaks[self.current_phase] = self.total_bytes
        if self.total_bytes > self.peak_bytes:
            self.peak_bytes = self.total_bytes
            self.peak_phase = self.current_phase
            self._snapshot_stale = True
            self._groups_pending = True

    def _free(self, key: int) -> None:
        size = self.live.get(key)
        if size is None:
            return
        if self._snapshot_stale:
            self._take_snapshot()
        del self.live[key]
        self._refs.pop(key, None)
        self.origin.pop(key, None)
        self.total_bytes -= size

    def _refresh_groups(self) -> None:
        # Only ever called from dispatch / user code, never from a weakref callback: a
        # callback fires while a tensor is being destroyed, where touching tensors crashes.
        if self._groups_pending and self.groups_fn is not None:
            self._groups = self.groups_fn()
        self._groups_pending = False

    def _take_snapshot(self) -> None:
        # Pure-Python: may run inside a weakref callback.
        self.peak_snapshot = dict(self.live)
        self.peak_groups = self._groups
        if self.record_origin:
            self.peak_origin = dict(self.origin)
        self._snapshot_stale = False

    def phase(self, name: str) -> None:
        """Start a named phase; its peak starts from the bytes live now."""
        self.current_phase = name
        self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), self.total_bytes)

    def reset_peak(self) -> None:
        """Forget peaks so far (e.g. after model construction)."""
        self.peak_bytes = self.total_bytes
        self.peak_phase = self.current_phase
        self.phase_peaks = {}
        self._groups_pending = True
        self._refresh_groups()
        self._take_snapshot()

    def peak_breakdown(self) -> dict[str, int]:
        """Bytes live at the overall peak, split by the groups known at that moment."""
        if self._snapshot_stale:
            self._refresh_groups()
            self._take_snapshot()
        return classify(self.peak_snapshot, self.peak_groups)

    # -- dispatch ------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._groups_pending:
            # The op that raised the peak has returned and autograd has attached its
            # results (e.g. `.grad`): classify the live set as of now.
            self._refresh_groups()
        if self.record_origin:
            self._op = str(func.overloadpacket.__name__)
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def classify(snapshot: dict[int, int], groups: dict[str, set[int]]) -> dict[str, int]:
    """Split a live set into named groups of storage keys; the rest is ``other``."""
    out = {name: 0 for name in groups}
    out["other"] = 0
    for key, size in snapshot.items():
        for name, keys in groups.items():
            if key in keys:
                out[name] += size
                break
        else:
            out["other"] += size
    return out
