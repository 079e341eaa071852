"""A pure-Python model of PyTorch's CUDA caching allocator: predict what the device reserves.

Live tensors (`torch.cuda.memory_allocated`) are not what `nvidia-smi` shows or what runs out:
the caching allocator holds whole segments (`torch.cuda.memory_reserved`), and splitting,
rounding and fragmentation put the reserved peak above the allocated one. Replaying a
program's allocation stream through this model predicts `max_memory_reserved`:

    from aegis.planning.memory.allocator import CachingAllocator, replay
    stats = replay([("alloc", 1, 5 << 20), ("alloc", 2, 12 << 20), ("alloc", 3, 12 << 20), ("free", 1, 0)])
    stats.max_reserved_bytes    # 20 MiB segment (5 + 12 + 3 cached) + a new 12 MiB one = 32 MiB

    alloc = CachingAllocator(expandable_segments=True)
    h = alloc.malloc(5 << 20); alloc.free(h); alloc.reserved_bytes

Rules modelled: `c10/cuda/CUDACachingAllocator.cpp` as of PyTorch 2.7 (unchanged in these
respects since 2.1, when `expandable_segments` arrived), for one device:

* requests are rounded up to 512 B (`kMinBlockSize`); zero-byte requests take no block;
* requests of at most 1 MiB (`kSmallSize`) use the small pool, whose segments are 2 MiB
  (`kSmallBuffer`); larger ones use the large pool: below 10 MiB (`kMinLargeAlloc`) a new
  segment is 20 MiB (`kLargeBuffer`), otherwise the request rounded up to 2 MiB (`kRoundLarge`);
* a request first takes the best-fitting cached free block of its pool (smallest size, then
  lowest address); a block is split when what remains is >= 512 B (small pool, or any pool
  with expandable segments) or > 1 MiB (large pool) and the request is below `max_split_size`;
* `max_split_size`: a request below it never takes a cached block at or above it, and a request
  at or above it takes a cached block only if that wastes less than 20 MiB;
* a freed block merges with free neighbours of its segment; cached segments are never given
  back, except when a new segment does not fit (`capacity_bytes`): then oversize cached
  segments are freed (with `max_split_size`), then every whole free segment (`empty_cache`),
  and the allocation is retried once before `AllocatorOutOfMemoryError`;
* `expandable_segments=True`: one segment per pool grows by mapping pages of 2 MiB (small
  pool) or 20 MiB (large pool); the best fit prefers blocks that cannot grow, a free block at
  the mapped end is extended, and reserved is the mapped bytes. On retry free pages are unmapped;
* streams: a block belongs to the stream it was allocated on (its segment's), and a request is served only from
  free blocks of its own stream (`BlockPool` orders blocks by stream first, and `get_free_block` stops at another
  stream's): each stream has its own small and large pools (and expandable segments), a freed block returns to its
  stream's pool whichever stream frees it, and flushing the cache frees every stream's whole free segments. In a
  replayed stream ``("stream", s, 0)`` makes ``s`` the stream later allocations are made on (0, the default, until
  the first such event), as ``torch.cuda.stream(s)`` does; a stream without it is one stream's, as before:

      replay([("alloc", 1, 5 << 20), ("free", 1, 0), ("stream", 1, 0), ("alloc", 2, 5 << 20)])
      # 40 MiB reserved: stream 1 cannot take stream 0's cached 20 MiB segment

Limits (not modelled): when a block freed after use on another stream (`record_stream`) becomes reusable (a
replayed free is reusable at once, as if every stream had caught up),
CUDA graphs' private pools, `roundup_power2_divisions`, `garbage_collection_threshold`,
`release_lock_on_cudamalloc`, `cudaMallocAsync`, the real addresses `cudaMalloc` returns (new
segments get increasing addresses, which only breaks ties between equal-sized free blocks),
driver refusal before `capacity_bytes` (fragmentation of the device itself), and everything
outside the allocator: the CUDA context, cuBLAS/cuDNN workspaces allocated by the library
(they are in the stream only if they go through the allocator), NCCL buffers. The model is
only as good as the stream it replays: a fake-tensor trace has the order of allocations and
frees of eager PyTorch, not of a compiled or fused program.
"""

from __future__ import annotations

import bisect
import gc
import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

from aegis.errors import AegisError, InvalidConfigError

__all__ = [
    "EventStream",
    "PYTORCH_VERSION_MODELLED",
    "AllocatorOutOfMemoryError",
    "AllocatorStats",
    "CachingAllocator",
    "gc_paused",
    "replay",
    "round_size",
    "segment_size",
]

PYTORCH_VERSION_MODELLED = "2.7"
"""The PyTorch release whose CUDACachingAllocator rules this module follows."""

MIN_BLOCK_BYTES = 512
"""kMinBlockSize: every request is rounded up to a multiple of this."""
SMALL_SIZE_BYTES = 1 << 20
"""kSmallSize: largest request served from the small pool."""
SMALL_BUFFER_BYTES = 2 << 20
"""kSmallBuffer: small-pool segment size (and expandable small-pool page size)."""
LARGE_BUFFER_BYTES = 20 << 20
"""kLargeBuffer: segment for large requests below kMinLargeAlloc (and large-pool page size)."""
MIN_LARGE_ALLOC_BYTES = 10 << 20
"""kMinLargeAlloc: from this size on, a segment is the request rounded up to kRoundLarge."""
ROUND_LARGE_BYTES = 2 << 20
"""kRoundLarge: rounding of large segments."""

_UNLIMITED = 1 << 62
_ADDRESS_SPACE_BYTES = 1 << 48  # an expandable segment's virtual range when no capacity is given


class AllocatorOutOfMemoryError(AegisError, MemoryError):
    """The modelled allocator could not fit a request in ``capacity_bytes``, even after freeing its cache."""


class AllocatorStats(BaseModel):
    """What `torch.cuda.memory_stats()` would report after a replayed stream (bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocated_bytes: int = Field(description="Bytes of blocks handed out now (torch.cuda.memory_allocated).")
    reserved_bytes: int = Field(description="Bytes of segments held now (torch.cuda.memory_reserved).")
    max_allocated_bytes: int = Field(description="Peak of allocated_bytes (torch.cuda.max_memory_allocated).")
    max_reserved_bytes: int = Field(description="Peak of reserved_bytes (torch.cuda.max_memory_reserved).")
    max_requested_bytes: int = Field(description="Peak of the un-rounded sizes asked for (requested_bytes.all.peak).")
    segment_count: int = Field(description="Segments held now (cudaMalloc'd blocks, or expandable segments).")
    alloc_retries: int = Field(description="Times the cache was flushed to retry a failed allocation (num_alloc_retries).")
    expandable_segments: bool = Field(description="Whether the model ran with expandable_segments:True.")
    max_split_size: int | None = Field(description="max_split_size in bytes, None for unlimited (PyTorch's default).")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a block (as `timeit` does), back as it was after.

    A replay makes thousands of linked blocks that live until it ends: collections during it only
    re-scan them (and the whole heap, now and then) and find nothing to free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def round_size(size: int) -> int:
    """Bytes the allocator hands out for a request of ``size`` bytes (round_size; 0 stays 0)."""
    if size <= 0:
        return 0
    return -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(size: int) -> int:
    """Bytes of the new segment cudaMalloc'd for a rounded request of ``size`` (get_allocation_size)."""
    if size <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if size < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-size // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


class _Segment:
    __slots__ = ("base", "expandable", "page_bytes")

    def __init__(self, base: int, expandable: bool, page_bytes: int) -> None:
        self.base = base
        self.expandable = expandable
        self.page_bytes = page_bytes

    def page_floor(self, addr: int) -> int:
        return self.base + (addr - self.base) // self.page_bytes * self.page_bytes

    def page_ceil(self, addr: int) -> int:
        return self.base - (self.base - addr) // self.page_bytes * self.page_bytes


class _Block:
    __slots__ = ("addr", "size", "pool", "segment", "allocated", "mapped", "prev", "next", "requested")

    def __init__(self, addr: int, size: int, pool: _Pool, segment: _Segment, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.pool = pool
        self.segment = segment
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.requested = 0
        """Bytes asked for by the allocation that holds this block (set by `replay`)."""

    def splice(self, before: _Block | None, after: _Block | None) -> None:
        """Link this block between ``before`` and ``after``."""
        self.prev, self.next = before, after
        if before is not None:
            before.next = self
        if after is not None:
            after.prev = self


class _Pool:
    """Free mapped blocks ordered by (size, address), and unmapped ranges ordered by address."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, _Block]] = []
        """(size, address, block), sorted: (size, address) is unique, so the block is never compared."""
        self.unmapped: dict[int, _Block] = {}

    def insert(self, block: _Block) -> None:
        bisect.insort(self.keys, (block.size, block.addr, block))

    def remove(self, block: _Block) -> None:
        del self.keys[bisect.bisect_left(self.keys, (block.size, block.addr))]

    def at(self, index: int) -> _Block:
        return self.keys[index][2]


class CachingAllocator:
    """PyTorch's CUDA caching allocator for one device (see the module docstring); ``stream`` of `malloc` picks the
    stream's pools (0, the default stream, unless given).

    ``max_split_size`` is `PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb` in bytes (must exceed
    20 MiB, as PyTorch requires); ``capacity_bytes`` is the memory the allocator may reserve
    (None: unlimited, so the cache is never flushed).
    """

    def __init__(
        self, expandable_segments: bool = False, max_split_size: int | None = None, capacity_bytes: int | None = None
    ) -> None:
        if max_split_size is not None and max_split_size <= LARGE_BUFFER_BYTES:
            raise InvalidConfigError(
                f"max_split_size must be more than {LARGE_BUFFER_BYTES >> 20} MiB (PyTorch's minimum), "
                f"got {max_split_size} bytes; pass None for no limit"
            )
        if capacity_bytes is not None and capacity_bytes <= 0:
            raise InvalidConfigError(f"capacity_bytes must be positive or None, got {capacity_bytes}")
        self.expandable_segments = expandable_segments
        self.max_split_size = max_split_size
        self.capacity_bytes = capacity_bytes
        self._max_split = _UNLIMITED if max_split_size is None else max_split_size
        self._capacity = _UNLIMITED if capacity_bytes is None else capacity_bytes
        self._small = _Pool(small=True)
        self._large = _Pool(small=False)
        self._pools: dict[int, tuple[_Pool, _Pool]] = {0: (self._small, self._large)}
        """Per stream: its (small, large) pools."""
        self._handles: dict[int, _Block | None] = {}
        self._requested: dict[int, int] = {}
        self._next_handle = itertools.count(1)
        self._next_addr = 1 << 40
        self._allocated = 0
        self._reserved = 0
        self._requested_total = 0
        self._max_allocated = 0
        self._max_reserved = 0
        self._max_requested = 0
        self._segments = 0
        self._retries = 0

    # -- public surface -------------------------------------------------------------------
    @property
    def allocated_bytes(self) -> int:
        """Bytes of blocks handed out now (a block not split keeps its whole size)."""
        return self._allocated

    @property
    def reserved_bytes(self) -> int:
        """Bytes of segments (or mapped pages) held now."""
        return self._reserved

    @property
    def max_allocated_bytes(self) -> int:
        """Peak of `allocated_bytes` since construction or `reset_peak_stats`."""
        return self._max_allocated

    @property
    def max_reserved_bytes(self) -> int:
        """Peak of `reserved_bytes` since construction or `reset_peak_stats`."""
        return self._max_reserved

    def reset_peak_stats(self) -> None:
        """Peaks restart from the current values (torch.cuda.reset_peak_memory_stats)."""
        self._max_allocated = self._allocated
        self._max_reserved = self._reserved
        self._max_requested = self._requested_total

    def stats(self) -> AllocatorStats:
        """A snapshot of the counters."""
        return AllocatorStats(
            allocated_bytes=self._allocated,
            reserved_bytes=self._reserved,
            max_allocated_bytes=self._max_allocated,
            max_reserved_bytes=self._max_reserved,
            max_requested_bytes=self._max_requested,
            segment_count=self._segments,
            alloc_retries=self._retries,
            expandable_segments=self.expandable_segments,
            max_split_size=self.max_split_size,
        )

    def _stream_pools(self, stream: int) -> tuple[_Pool, _Pool]:
        pools = self._pools.get(stream)
        if pools is None:
            pools = self._pools[stream] = (_Pool(small=True), _Pool(small=False))
        return pools

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream`` (0: the default stream); returns a handle for `free`."""
        if size < 0:
            raise ValueError(f"cannot allocate a negative size ({size} bytes)")
        handle = next(self._next_handle)
        if size == 0:
            self._handles[handle] = None
            self._requested[handle] = 0
            return handle
        rounded = round_size(size)
        small, large = self._stream_pools(stream)
        pool = small if rounded <= SMALL_SIZE_BYTES else large
        block = self._get_free_block(pool, rounded)
        if block is None:
            block = self._new_block(pool, rounded, size)
        self._take(block, rounded)
        self._handles[handle] = block
        self._requested[handle] = size
        self._requested_total += size
        if self._requested_total > self._max_requested:
            self._max_requested = self._requested_total
        return handle

    def free(self, handle: int) -> None:
        """Return a block to its pool (the segment stays reserved)."""
        try:
            block = self._handles.pop(handle)
        except KeyError:
            raise ValueError(f"unknown or already freed handle {handle}") from None
        self._requested_total -= self._requested.pop(handle)
        if block is None:
            return
        block.allocated = False
        self._allocated -= block.size
        self._merge(block, block.prev)
        self._merge(block, block.next)
        block.pool.insert(block)

    def empty_cache(self) -> None:
        """Give back every whole free segment and unmap free pages (torch.cuda.empty_cache)."""
        self._release_cached_blocks()

    def replay(self, events: Iterable[tuple[str, int, int]]) -> AllocatorStats:
        """Apply ``("alloc", id, size)`` / ``("free", id, 0)`` events, and ``("stream", s, 0)`` to allocate on stream
        ``s`` from then on; ids are the caller's.

        The steps of `malloc` and `free`, inlined (a plan replays thousands of events per tier); a new
        segment, expandable segments and merges with free neighbours go through the same methods.
        ``tests/planning/memory/test_allocator.py`` checks it against `malloc`/`free` on random streams."""
        with gc_paused():
            self._replay(events)
        return self.stats()

    def _replay(self, events: Iterable[tuple[str, int, int]]) -> None:
        live: dict[int, _Block | None] = {}
        small, large = self._small, self._large
        expandable, max_split = self.expandable_segments, self._max_split
        bisect_left, insort = bisect.bisect_left, bisect.insort
        allocated, max_allocated = self._allocated, self._max_allocated
        requested, max_requested = self._requested_total, self._max_requested
        try:
            for kind, ident, size in events:
                if kind == "alloc":
                    if ident in live:
                        raise ValueError(f"id {ident} allocated twice without a free")
                    if size <= 0:
                        if size < 0:
                            raise ValueError(f"cannot allocate a negative size ({size} bytes)")
                        live[ident] = None
                        continue
                    rounded = -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
                    pool = small if rounded <= SMALL_SIZE_BYTES else large
                    keys = pool.keys
                    block = None
                    if expandable:
                        block = self._get_free_block(pool, rounded)
                    else:  # _get_free_block without expandable segments
                        index = bisect_left(keys, (rounded, -1))
                        if index < len(keys):
                            found = keys[index][0]
                            if not (rounded < max_split <= found or (
                                    rounded >= max_split and found >= rounded + LARGE_BUFFER_BYTES)):
                                block = keys[index][2]
                                del keys[index]
                    if block is None:
                        self._allocated = allocated  # the slow path reports the counters
                        block = self._new_block(pool, rounded, size)
                    remaining = block.size - rounded  # _take
                    if remaining >= MIN_BLOCK_BYTES if pool.small or expandable else (
                            rounded < max_split and remaining > SMALL_SIZE_BYTES):
                        rest = _Block(block.addr + rounded, remaining, pool, block.segment)
                        after = block.next
                        rest.prev, rest.next, block.next = block, after, rest
                        if after is not None:
                            after.prev = rest
                        block.size = rounded
                        insort(keys, (remaining, rest.addr, rest))
                    block.allocated = True
                    block.requested = size
                    allocated += block.size
                    if allocated > max_allocated:
                        max_allocated = allocated
                    requested += size
                    if requested > max_requested:
                        max_requested = requested
                    live[ident] = block
                elif kind == "stream":
                    small, large = self._stream_pools(ident)
                elif kind == "free":
                    try:
                        block = live.pop(ident)
                    except KeyError:
                        raise ValueError(f"free of id {ident}, which is not allocated") from None
                    if block is None:
                        continue
                    requested -= block.requested
                    block.allocated = False
                    allocated -= block.size
                    # _merge with free mapped neighbours, inlined (unmapped ones go through _merge)
                    before = block.prev
                    if before is not None and not before.allocated:
                        if before.mapped:
                            keys = before.pool.keys
                            del keys[bisect_left(keys, (before.size, before.addr))]
                            block.addr = before.addr
                            block.size += before.size
                            block.prev = before = before.prev
                            if before is not None:
                                before.next = block
                        else:
                            self._merge(block, before)
                    after = block.next
                    if after is not None and not after.allocated:
                        if after.mapped:
                            keys = after.pool.keys
                            del keys[bisect_left(keys, (after.size, after.addr))]
                            block.size += after.size
                            block.next = after = after.next
                            if after is not None:
                                after.prev = block
                        else:
                            self._merge(block, after)
                    insort(block.pool.keys, (block.size, block.addr, block))
                else:
                    raise ValueError(f"unknown event kind {kind!r}: expected 'alloc', 'free' or 'stream'")
        finally:
            self._allocated, self._max_allocated = allocated, max_allocated
            self._requested_total, self._max_requested = requested, max_requested

    # -- the allocator's steps (names follow CUDACachingAllocator.cpp) ----------------------
    def _reserve(self, nbytes: int) -> None:
        self._reserved += nbytes
        if self._reserved > self._max_reserved:
            self._max_reserved = self._reserved

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        index = bisect.bisect_left(pool.keys, (size, -1))
        if index == len(pool.keys):
            return None
        if self.expandable_segments:
            # Best fit counts what a block at the mapped end could grow to: prefer those that cannot.
            def grows_to(b: _Block) -> int:
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while index + 1 < len(pool.keys) and grows_to(pool.at(index + 1)) < grows_to(pool.at(index)):
                index += 1
        block = pool.keys[index][2]
        if size < self._max_split <= block.size:
            return None  # a small request never takes an oversize block
        if size >= self._max_split and block.size >= size + LARGE_BUFFER_BYTES:
            return None  # an oversize request may waste less than kLargeBuffer
        del pool.keys[index]
        return block

    def _new_block(self, pool: _Pool, rounded: int, size: int) -> _Block:
        """No cached block fits: a new segment, after freeing oversize cached segments, then the whole cache
        (counted as a retry); `AllocatorOutOfMemoryError` when even that does not fit."""
        block = self._alloc_block(pool, rounded)
        if block is None and self._release_available_cached_blocks(pool, rounded):
            block = self._alloc_block(pool, rounded)
        if block is None:
            self._release_cached_blocks()
            self._retries += 1
            block = self._alloc_block(pool, rounded)
        if block is None:
            raise AllocatorOutOfMemoryError(
                f"tried to allocate {size} bytes with {self._reserved} reserved and {self._allocated} allocated "
                f"of {self.capacity_bytes}; a smaller batch, checkpointing or expandable segments may fit"
            )
        return block

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.small or self.expandable_segments:
            return remaining >= MIN_BLOCK_BYTES
        return size < self._max_split and remaining > SMALL_SIZE_BYTES

    def _take(self, block: _Block, size: int) -> None:
        """alloc_found_block: split off the tail when the rules allow, mark allocated."""
        if self._should_split(block, size):
            rest = _Block(block.addr + size, block.size - size, block.pool, block.segment)
            rest.splice(block, block.next)
            block.size = size
            block.pool.insert(rest)
        block.allocated = True
        self._allocated += block.size
        if self._allocated > self._max_allocated:
            self._max_allocated = self._allocated

    def _merge(self, dst: _Block, src: _Block | None) -> None:
        """try_merge_blocks: ``dst`` (not in a pool) absorbs a free neighbour of the same mapping."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            src.pool.remove(src)
        else:
            del src.pool.unmapped[src.addr]
        if src is dst.prev:
            dst.addr = src.addr
            dst.splice(src.prev, dst.next)
        else:
            dst.splice(dst.prev, src.next)
        dst.size += src.size

    def _alloc_block(self, pool: _Pool, size: int) -> _Block | None:
        if self.expandable_segments:
            return self._try_allocate_expandable_block(pool, size)
        nbytes = segment_size(size)
        if self._reserved + nbytes > self._capacity:
            return None
        block = _Block(self._next_addr, nbytes, pool, _Segment(self._next_addr, expandable=False, page_bytes=nbytes))
        self._next_addr += nbytes
        self._segments += 1
        self._reserve(nbytes)
        return block

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """Free oversize cached segments (only with max_split_size) until ``size`` could fit."""
        if self.max_split_size is None or self.expandable_segments:
            return False
        want = max(size, self._max_split)
        index = bisect.bisect_left(pool.keys, (want, -1))
        if index < len(pool.keys):
            return self._release_segment(pool.at(index))
        released = 0
        index = len(pool.keys) - 1
        while released < want and index >= 0 and pool.keys[index][0] >= self._max_split:
            block = pool.at(index)
            if self._release_segment(block):
                released += block.size
            index -= 1
        return released >= want

    def _release_segment(self, block: _Block) -> bool:
        if block.prev is not None or block.next is not None:
            return False
        block.pool.remove(block)
        self._reserved -= block.size
        self._segments -= 1
        return True

    def _release_cached_blocks(self) -> None:
        for pool in [p for small, large in self._pools.values() for p in (large, small)]:
            to_unmap = []
            for key in list(pool.keys):
                block = key[2]
                if block.segment.expandable:
                    to_unmap.append(block)
                else:
                    self._release_segment(block)
            for block in to_unmap:
                self._unmap_block(block)

    # -- expandable segments ----------------------------------------------------------------
    def _find_expandable_block(self, pool: _Pool, size: int) -> _Block:
        def has_room(b: _Block | None) -> bool:
            room = 0
            while room < size and b is not None and not b.allocated:
                room += b.size
                b = b.next
            return room >= size

        for addr in sorted(pool.unmapped):
            candidate = pool.unmapped[addr]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            if has_room(candidate):
                return candidate
        page = SMALL_BUFFER_BYTES if pool.small else LARGE_BUFFER_BYTES
        span = _ADDRESS_SPACE_BYTES if self.capacity_bytes is None else self.capacity_bytes + self.capacity_bytes // 8
        span = -(-span // page) * page
        block = _Block(self._next_addr, span, pool, _Segment(self._next_addr, expandable=True, page_bytes=page), mapped=False)
        self._next_addr += span
        self._segments += 1
        pool.unmapped[block.addr] = block
        return block

    def _map_block(self, block: _Block, size: int) -> bool:
        """Map whole pages covering the first ``size`` bytes of an unmapped range."""
        nbytes = block.segment.page_ceil(block.addr + size) - block.addr  # unmapped ranges start on a page
        if self._reserved + nbytes > self._capacity:
            return False
        pool = block.pool
        del pool.unmapped[block.addr]
        block.mapped = True
        if nbytes < block.size:
            rest = _Block(block.addr + nbytes, block.size - nbytes, pool, block.segment, mapped=False)
            rest.splice(block, block.next)
            block.size = nbytes
            pool.unmapped[rest.addr] = rest
        self._merge(block, block.prev)
        self._merge(block, block.next)
        pool.insert(block)
        self._reserve(nbytes)
        return True

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Block | None:
        candidate = self._find_expandable_block(pool, size)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:  # free -> unmapped -> ...: map more and merge
            following = candidate.next
            assert following is not None and not following.mapped
            if not self._map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.remove(candidate)
        return candidate

    def _unmap_block(self, block: _Block) -> None:
        """Unmap the whole pages inside a free block; partial pages at its ends stay free and mapped."""
        begin = block.segment.page_ceil(block.addr)
        end = block.segment.page_floor(block.addr + block.size)
        if end <= begin:
            return
        pool = block.pool
        pool.remove(block)
        if begin > block.addr:
            before = _Block(block.addr, begin - block.addr, pool, block.segment)
            before.splice(block.prev, block)
            pool.insert(before)
        if end < block.addr + block.size:
            after = _Block(end, block.addr + block.size - end, pool, block.segment)
            after.splice(block, block.next)
            pool.insert(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        self._merge(block, block.prev)
        self._merge(block, block.next)
        pool.unmapped[block.addr] = block
        self._reserved -= end - begin


def replay(
    events: Iterable[tuple[str, int, int]],
    *,
    expandable_segments: bool = False,
    max_split_size: int | None = None,
    capacity_bytes: int | None = None,
) -> AllocatorStats:
    """Replay an allocation stream through a fresh `CachingAllocator` and return its counters."""
    allocator = CachingAllocator(expandable_segments, max_split_size, capacity_bytes)
    return allocator.replay(events)


class EventStream:
    """Writes the ``("alloc", id, nbytes)`` / ``("free", id, 0)`` events `CachingAllocator.replay` reads (ids from 1)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self._ids = itertools.count(1)
        self._append = self.events.append  # thousands of events per tier: bound once

    def alloc(self, nbytes: float) -> int:
        ident = next(self._ids)
        n = int(nbytes)
        self._append(("alloc", ident, n if n > 0 else 0))
        return ident

    def free(self, *handles: int) -> None:
        self.events.extend([("free", h, 0) for h in handles])
