"""The caching-allocator model against hand-worked allocation sequences, plus invariants (hypothesis).

Each hand-worked case states, in its comments, what PyTorch's CUDACachingAllocator does step by
step; the numbers asserted are the ones worked out there.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis.errors import AegisError, InvalidConfigError
from aegis.planning.memory.allocator import (
    AllocatorOutOfMemoryError,
    CachingAllocator,
    replay,
    round_size,
    segment_size,
)

KIB = 1 << 10
MIB = 1 << 20


def test_rounding_and_segment_sizes():
    assert [round_size(n) for n in (0, 1, 512, 513, 4000)] == [0, 512, 512, 1024, 4096]
    # <= 1 MiB: small pool, 2 MiB segments; < 10 MiB: 20 MiB; else rounded up to 2 MiB.
    assert segment_size(MIB) == 2 * MIB
    assert segment_size(MIB + 512) == 20 * MIB
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB
    assert segment_size(13 * MIB + 512) == 14 * MIB


def test_small_requests_share_a_2_mib_segment():
    a = CachingAllocator()
    # 400 KiB = 409,600 B (a multiple of 512): small pool. The first one cudaMallocs a 2 MiB
    # segment and splits it (2,097,152 - 409,600 = 1,687,552 >= 512 left); the next two are
    # cut from the free remainder: 1,277,952 then 868,352 B left.
    handles = [a.malloc(400 * KIB) for _ in range(3)]
    assert a.reserved_bytes == 2 * MIB
    assert a.allocated_bytes == 1200 * KIB
    # Two more still fit (868,352 -> 458,752 -> 49,152 left); the sixth needs a second segment.
    handles += [a.malloc(400 * KIB) for _ in range(2)]
    assert a.reserved_bytes == 2 * MIB
    handles.append(a.malloc(400 * KIB))
    assert a.reserved_bytes == 4 * MIB
    for h in handles:
        a.free(h)
    assert a.allocated_bytes == 0 and a.reserved_bytes == 4 * MIB  # cached, not given back


def test_a_5_mib_request_reserves_a_20_mib_segment_and_the_remainder_is_reused():
    a = CachingAllocator()
    first = a.malloc(5 * MIB)  # 1 MiB < 5 MiB < 10 MiB: a 20 MiB segment, split 5 | 15 (15 > 1 MiB)
    assert (a.allocated_bytes, a.reserved_bytes) == (5 * MIB, 20 * MIB)
    a.malloc(12 * MIB)  # best fit: the cached 15 MiB block, split 12 | 3
    assert (a.allocated_bytes, a.reserved_bytes) == (17 * MIB, 20 * MIB)
    a.malloc(12 * MIB)  # only 3 MiB cached: a new segment of 12 MiB (>= 10 MiB, rounded to 2 MiB)
    assert (a.allocated_bytes, a.reserved_bytes) == (29 * MIB, 32 * MIB)
    a.free(first)
    assert (a.allocated_bytes, a.reserved_bytes, a.max_reserved_bytes) == (24 * MIB, 32 * MIB, 32 * MIB)


def test_a_freed_segment_is_reused_by_a_larger_request_that_fits_it():
    # 5 MiB in a 20 MiB segment, freed: the blocks merge back into one free 20 MiB block, and
    # a 12 MiB request takes it (split 12 | 8) rather than cudaMalloc'ing a 12 MiB segment.
    stats = replay([("alloc", 1, 5 * MIB), ("free", 1, 0), ("alloc", 2, 12 * MIB)])
    assert stats.reserved_bytes == 20 * MIB and stats.segment_count == 1
    assert stats.allocated_bytes == 12 * MIB


def test_large_pool_does_not_split_a_remainder_of_1_mib_or_less():
    a = CachingAllocator()
    # 13.5 MiB -> a 14 MiB segment; 0.5 MiB would remain, not > 1 MiB: the whole block is
    # handed out, and memory_allocated counts all 14 MiB.
    a.malloc(13 * MIB + 512 * KIB)
    assert (a.allocated_bytes, a.reserved_bytes) == (14 * MIB, 14 * MIB)
    # 12.5 MiB -> 14 MiB segment, 1.5 MiB remains (> 1 MiB): split.
    b = CachingAllocator()
    b.malloc(12 * MIB + 512 * KIB)
    assert (b.allocated_bytes, b.reserved_bytes) == (12 * MIB + 512 * KIB, 14 * MIB)


def test_fragmentation_holes_force_a_new_segment():
    a = CachingAllocator()
    # Four 5 MiB blocks fill one 20 MiB segment: splits 5|15, 5|10, 5|5, and the last takes
    # the final 5 MiB whole. Freeing the 1st and 3rd leaves two 5 MiB holes that cannot merge
    # (their neighbours are allocated).
    h = [a.malloc(5 * MIB) for _ in range(4)]
    assert a.reserved_bytes == 20 * MIB
    a.free(h[0])
    a.free(h[2])
    assert (a.allocated_bytes, a.reserved_bytes) == (10 * MIB, 20 * MIB)
    # 10 MiB is free but no single block holds 8 MiB: a second 20 MiB segment.
    a.malloc(8 * MIB)
    assert (a.allocated_bytes, a.reserved_bytes) == (18 * MIB, 40 * MIB)
    # Freeing the 2nd merges holes 1-2-3 into 15 MiB, which now fits 12 MiB without new memory.
    a.free(h[1])
    a.malloc(12 * MIB)
    assert a.reserved_bytes == 40 * MIB


def test_small_pool_holes_do_not_serve_a_large_request():
    a = CachingAllocator()
    # Four 512 KiB blocks fill a 2 MiB small segment; free two non-adjacent ones: 1 MiB free
    # in two holes. A 1.5 MiB request is large-pool: a 20 MiB segment, the small cache unused.
    h = [a.malloc(512 * KIB) for _ in range(4)]
    a.free(h[0])
    a.free(h[2])
    a.malloc(MIB + 512 * KIB)
    assert a.reserved_bytes == 22 * MIB


def test_expandable_segments_grow_in_pages_and_beat_fixed_segments_on_growing_requests():
    # Alternating alloc/free of growing sizes: 12, 24, 36 MiB.
    events = [
        ("alloc", 1, 12 * MIB), ("free", 1, 0),
        ("alloc", 2, 24 * MIB), ("free", 2, 0),
        ("alloc", 3, 36 * MIB), ("free", 3, 0),
    ]  # fmt: skip
    # Fixed segments: the cached 12 MiB segment cannot hold 24 MiB, nor 12 + 24 (two segments)
    # hold 36 MiB: 12 + 24 + 36 = 72 MiB reserved.
    fixed = replay(events)
    assert fixed.max_reserved_bytes == 72 * MIB and fixed.segment_count == 3
    # Expandable: 12 MiB maps one 20 MiB page; after its free, 24 MiB extends the free block at
    # the mapped end by one more page (40 MiB); 36 MiB fits in the free 40 MiB.
    grown = replay(events, expandable_segments=True)
    assert grown.max_reserved_bytes == 40 * MIB and grown.segment_count == 1
    assert grown.max_allocated_bytes == fixed.max_allocated_bytes == 36 * MIB


def test_expandable_segments_page_sizes_and_empty_cache():
    a = CachingAllocator(expandable_segments=True)
    small = a.malloc(400 * KIB)  # small pool maps 2 MiB pages
    assert a.reserved_bytes == 2 * MIB
    first = a.malloc(5 * MIB)  # large pool maps 20 MiB pages: [0,5) used, [5,20) free
    assert a.reserved_bytes == 22 * MIB
    # 30 MiB: no free block fits; the free [5,20) at the mapped end grows by one 20 MiB page
    # to [5,40), split 30 | 5 (any remainder >= 512 B splits with expandable segments).
    second = a.malloc(30 * MIB)
    assert (a.allocated_bytes, a.reserved_bytes) == (400 * KIB + 35 * MIB, 42 * MIB)
    # Without expandable segments the same three requests reserve 2 + 20 + 30 MiB.
    assert replay([("alloc", 1, 400 * KIB), ("alloc", 2, 5 * MIB), ("alloc", 3, 30 * MIB)]).reserved_bytes == 52 * MIB
    a.free(first)
    # empty_cache unmaps only whole free pages: [0,5) and [35,40) are free but share pages
    # with the 30 MiB block at [5,35), so all 40 MiB stay mapped.
    a.empty_cache()
    assert a.reserved_bytes == 42 * MIB
    a.free(second)
    a.free(small)
    a.empty_cache()
    assert (a.allocated_bytes, a.reserved_bytes, a.max_reserved_bytes) == (0, 0, 42 * MIB)


def test_out_of_memory_flushes_the_cache_and_retries_once():
    a = CachingAllocator(capacity_bytes=40 * MIB)
    a.free(a.malloc(12 * MIB))  # 12 MiB segment, cached
    a.free(a.malloc(24 * MIB))  # does not fit the cached 12: a 24 MiB segment (36 reserved)
    big = a.malloc(36 * MIB)  # 36 + 36 > 40: free both cached segments, retry: 36 reserved
    assert (a.reserved_bytes, a.max_reserved_bytes, a.stats().alloc_retries) == (36 * MIB, 36 * MIB, 1)
    with pytest.raises(AllocatorOutOfMemoryError) as err:
        a.malloc(8 * MIB)  # needs a 20 MiB segment; nothing cached to free
    assert isinstance(err.value, AegisError) and isinstance(err.value, MemoryError)
    a.free(big)
    assert a.allocated_bytes == 0


def test_max_split_size_keeps_small_requests_out_of_oversize_blocks():
    mib40 = 40 * MIB
    # 64 MiB freed; a 30 MiB request (< max_split) may not take the oversize 64 MiB block.
    events = [("alloc", 1, 64 * MIB), ("free", 1, 0), ("alloc", 2, 30 * MIB)]
    assert replay(events, max_split_size=mib40).reserved_bytes == 94 * MIB
    assert replay(events).reserved_bytes == 64 * MIB  # default: taken and split 30 | 34
    # An oversize request takes an oversize block only if it wastes < 20 MiB, and never splits it.
    a = CachingAllocator(max_split_size=mib40)
    a.free(a.malloc(64 * MIB))
    h = a.malloc(50 * MIB)  # 64 < 50 + 20: taken whole
    assert (a.allocated_bytes, a.reserved_bytes) == (64 * MIB, 64 * MIB)
    a.free(h)
    a.malloc(40 * MIB)  # 64 >= 40 + 20: refused, a new 40 MiB segment
    assert a.reserved_bytes == 104 * MIB
    # At capacity, oversize cached segments are freed first (no full flush, no retry counted).
    b = CachingAllocator(max_split_size=mib40, capacity_bytes=80 * MIB)
    b.free(b.malloc(64 * MIB))
    b.malloc(30 * MIB)  # 64 + 30 > 80: the cached 64 MiB segment is released
    assert (b.reserved_bytes, b.stats().alloc_retries) == (30 * MIB, 0)
    with pytest.raises(InvalidConfigError):
        CachingAllocator(max_split_size=20 * MIB)


def test_replay_checks_its_events():
    with pytest.raises(ValueError, match="not allocated"):
        replay([("free", 1, 0)])
    with pytest.raises(ValueError, match="twice"):
        replay([("alloc", 1, 10), ("alloc", 1, 10)])
    with pytest.raises(ValueError, match="event kind"):
        replay([("resize", 1, 10)])
    zero = replay([("alloc", 1, 0), ("free", 1, 0)])
    assert zero.max_reserved_bytes == 0 and zero.max_allocated_bytes == 0


# --- invariants ----------------------------------------------------------------------------

SIZES = st.one_of(
    st.integers(0, 4 * KIB),
    st.integers(1, 2 * MIB),
    st.integers(MIB, 12 * MIB),
    st.integers(10 * MIB, 90 * MIB),
)
OPS = st.lists(st.tuples(st.booleans(), SIZES, st.integers(0, 1 << 16)), min_size=1, max_size=80)


def _cached_free_bytes(a: CachingAllocator) -> int:
    return sum(size for pool in (a._small, a._large) for size, _, _ in pool.keys)


@settings(max_examples=150, deadline=None)
@given(
    ops=OPS,
    expandable=st.booleans(),
    max_split=st.sampled_from([None, 21 * MIB, 48 * MIB]),
    capacity=st.sampled_from([None, 64 * MIB, 256 * MIB]),
)
def test_invariants_hold_on_random_streams(ops, expandable, max_split, capacity):
    a = CachingAllocator(expandable_segments=expandable, max_split_size=max_split, capacity_bytes=capacity)
    live: list[tuple[int, int]] = []
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            try:
                live.append((a.malloc(size), round_size(size)))
            except AllocatorOutOfMemoryError:
                assert capacity is not None
        else:
            a.free(live.pop(pick % len(live))[0])
        assert a.reserved_bytes >= a.allocated_bytes >= sum(s for _, s in live)
        # Every reserved byte is either handed out or cached in a free block.
        assert a.reserved_bytes == a.allocated_bytes + _cached_free_bytes(a)
        assert a.max_reserved_bytes >= a.max_allocated_bytes
        assert a.max_reserved_bytes >= a.reserved_bytes and a.max_allocated_bytes >= a.allocated_bytes
        if capacity is not None:
            assert a.max_reserved_bytes <= capacity
    reserved = a.reserved_bytes
    for handle, _ in live:
        a.free(handle)
    assert a.allocated_bytes == 0 and a.reserved_bytes == reserved
    a.empty_cache()
    assert a.reserved_bytes == 0


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(SIZES, min_size=1, max_size=40))
def test_allocating_without_freeing_reserves_at_most_one_segment_per_request(sizes):
    stats = replay(("alloc", i, s) for i, s in enumerate(sizes))
    assert stats.max_reserved_bytes <= sum(segment_size(round_size(s)) for s in sizes if s)
    assert stats.max_allocated_bytes >= sum(round_size(s) for s in sizes)


def test_replaying_a_traced_training_step_keeps_the_traced_peak():
    # The stream tools/truth records for a tiny model: its 512 B-rounded running sum peaks
    # where the tracker's did, and the replayed allocator reserves at least that.
    import warnings

    from tools.truth.setup import TraceSetup
    from tools.truth.stream import trace_stream

    tiny = {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result, tracker = trace_stream(tiny, TraceSetup(method="full", micro_batch_size=2, seq_len=64))
    sizes, live, peak = {}, 0, 0
    for i, (kind, ident, size) in enumerate(tracker.events):
        if i == tracker.reset_at:
            peak = live
        if kind == "alloc":
            sizes[ident] = round_size(size)
            live += sizes[ident]
        else:
            live -= sizes.pop(ident)
        peak = max(peak, live)
    assert peak == result.peak_bytes
    for expandable in (False, True):
        stats = replay(tracker.events, expandable_segments=expandable)
        assert stats.max_reserved_bytes >= stats.max_allocated_bytes >= result.peak_bytes


def _stepwise(events, **settings):
    """The reference for `replay`: the same events through `malloc` and `free`, one call each."""
    a = CachingAllocator(**settings)
    handles = {}
    try:
        for kind, ident, size in events:
            if kind == "alloc":
                handles[ident] = a.malloc(size)
            else:
                a.free(handles.pop(ident))
    except AllocatorOutOfMemoryError:
        return a.stats(), True
    return a.stats(), False


@settings(max_examples=200, deadline=None)
@given(
    ops=OPS,
    expandable=st.booleans(),
    max_split=st.sampled_from([None, 21 * MIB, 48 * MIB]),
    capacity=st.sampled_from([None, 64 * MIB, 256 * MIB]),
)
def test_replay_equals_malloc_and_free_step_by_step(ops, expandable, max_split, capacity):
    # `replay` inlines malloc/free for speed: every counter must equal the step-by-step path's, OOM included.
    events, live, ident = [], [], 0
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            ident += 1
            events.append(("alloc", ident, size))
            live.append(ident)
        else:
            events.append(("free", live.pop(pick % len(live)), 0))
    settings_ = {"expandable_segments": expandable, "max_split_size": max_split, "capacity_bytes": capacity}
    want, want_oom = _stepwise(events, **settings_)
    a = CachingAllocator(**settings_)
    try:
        got, got_oom = a.replay(events), False
    except AllocatorOutOfMemoryError:
        got, got_oom = a.stats(), True
    assert (got, got_oom) == (want, want_oom)


def test_replay_of_a_planned_step_equals_malloc_and_free_step_by_step():
    # A real stream (a QLoRA step of an 8B model: ~8,000 events) under each allocator setting.
    from aegis.models.resolve import resolve_model
    from aegis.planning.memory.device import allocation_stream
    from aegis.schema import LoRAConfig, TrainConfig

    cfg = TrainConfig(method="qlora", micro_batch_size=4, seq_len=1024, gradient_checkpointing=True, lora=LoRAConfig())
    events = allocation_stream(resolve_model("llama-3.1-8b"), cfg)
    # unlimited; 16.5 GiB: the cache is flushed and retried mid-step (no OOM); 12 GiB: out of memory
    for settings_ in ({}, {"expandable_segments": True}, {"max_split_size": 64 * MIB},
                      {"capacity_bytes": 33 << 29}, {"capacity_bytes": 33 << 29, "expandable_segments": True},
                      {"capacity_bytes": 33 << 29, "max_split_size": 64 * MIB},
                      {"capacity_bytes": 12 << 30}, {"capacity_bytes": 12 << 30, "expandable_segments": True}):
        want, want_oom = _stepwise(events, **settings_)
        a = CachingAllocator(**settings_)
        try:
            got, got_oom = a.replay(events), False
        except AllocatorOutOfMemoryError:
            got, got_oom = a.stats(), True
        assert (got, got_oom) == (want, want_oom), settings_


def test_replay_split_boundaries_equal_malloc_and_free():
    # Remainders of exactly 1 MiB (large pool: kept whole) and 512 B (small pool: split), then frees that merge
    # with the neighbour before and after.
    events = [("alloc", 1, 19 * MIB), ("alloc", 2, MIB), ("alloc", 3, MIB - 512), ("alloc", 4, 512),
              ("alloc", 5, 2 * MIB - 1024), ("alloc", 6, 5 * MIB), ("free", 1, 0), ("alloc", 7, 18 * MIB),
              ("free", 6, 0), ("free", 4, 0), ("free", 3, 0), ("free", 5, 0), ("alloc", 8, 20 * MIB),
              ("free", 7, 0), ("alloc", 9, 0), ("free", 2, 0), ("free", 9, 0)]
    for expandable in (False, True):
        for end in range(1, len(events) + 1):  # the counters after every event, not only the peaks
            want, _ = _stepwise(events[:end], expandable_segments=expandable)
            assert CachingAllocator(expandable_segments=expandable).replay(events[:end]) == want, (expandable, end)


def test_each_stream_has_its_own_pools():
    # CUDACachingAllocator keys free blocks by stream (BlockComparatorSize compares stream first; get_free_block
    # stops at another stream's block): a 5 MiB request on stream 1 cannot take stream 0's cached 20 MiB segment,
    # so it maps a second one; stream 0's next request takes its own cached block again.
    a = CachingAllocator()
    first = a.malloc(5 * MIB)
    a.free(first)
    on_side = a.malloc(5 * MIB, stream=1)
    assert a.reserved_bytes == 40 * MIB
    a.malloc(5 * MIB)  # stream 0: its cached 20 MiB block, split
    assert a.reserved_bytes == 40 * MIB
    a.free(on_side)  # back to stream 1's pool, whoever frees it
    a.malloc(12 * MIB, stream=1)  # fits stream 1's free 20 MiB block
    assert (a.allocated_bytes, a.reserved_bytes) == (17 * MIB, 40 * MIB)
    # small pools are per stream too: two 2 MiB segments for two 512 B requests on two streams
    b = CachingAllocator()
    b.malloc(512)
    b.malloc(512, stream=3)
    assert b.reserved_bytes == 4 * MIB


def test_a_replayed_stream_event_moves_later_allocations_to_that_stream():
    one_stream = [("alloc", 1, 5 * MIB), ("free", 1, 0), ("alloc", 2, 5 * MIB)]
    assert replay(one_stream).max_reserved_bytes == 20 * MIB
    two = [("alloc", 1, 5 * MIB), ("free", 1, 0), ("stream", 1, 0), ("alloc", 2, 5 * MIB), ("stream", 0, 0),
           ("alloc", 3, 5 * MIB)]
    assert replay(two).max_reserved_bytes == 40 * MIB
    # the same as malloc with the stream given
    a = CachingAllocator()
    a.free(a.malloc(5 * MIB))
    a.malloc(5 * MIB, stream=1)
    a.malloc(5 * MIB)
    assert a.stats().max_reserved_bytes == 40 * MIB
    # flushing the cache (capacity reached) frees every stream's whole free segments
    capped = replay([("stream", 1, 0), ("alloc", 1, 15 * MIB), ("free", 1, 0), ("stream", 0, 0),
                     ("alloc", 2, 15 * MIB)], capacity_bytes=20 * MIB)
    assert capped.alloc_retries == 1 and capped.reserved_bytes == 16 * MIB


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 24 * MIB), st.integers(0, 2)), min_size=1, max_size=40))
@settings(max_examples=40, deadline=None)
def test_streams_replay_as_malloc_and_free(ops):
    """`replay` with stream events equals `malloc(size, stream)`/`free` step by step."""
    a = CachingAllocator()
    events, live, handles = [], [], {}
    now = 0
    for ident, (free_one, size, stream) in enumerate(ops, 1):
        if free_one and live:
            victim = live.pop(0)
            events.append(("free", victim, 0))
            a.free(handles.pop(victim))
        else:
            if stream != now:
                events.append(("stream", stream, 0))
                now = stream
            events.append(("alloc", ident, size))
            handles[ident] = a.malloc(size, stream=stream)
            live.append(ident)
    assert replay(events) == a.stats()
