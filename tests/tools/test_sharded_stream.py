"""`tools.truth.sharded`'s allocation-stream recorder on real CPU tensors: storage resizes (FSDP's free and
re-allocation of unsharded flat parameters) and the stream each allocation is made on, in the event format
`aegis.planning.memory.allocator.replay` takes."""

from __future__ import annotations

import torch

from aegis.planning.memory.allocator import replay
from tools.truth.sharded import ShardedStreamLiveBytes, replay_from_setup, single_stream

MIB = 1 << 20


def test_resizes_and_streams_are_recorded_as_the_allocator_sees_them():
    side = torch.cpu.Stream()
    tracker = ShardedStreamLiveBytes()
    with tracker:
        kept = torch.empty(5 * MIB, dtype=torch.uint8)
        tracker.reset_peak()
        flat = torch.empty(4 * MIB, dtype=torch.uint8)
        flat.untyped_storage().resize_(0)  # FSDP frees the unsharded flat parameter
        with torch.cpu.stream(side):
            flat.untyped_storage().resize_(6 * MIB)  # ... and all-gathers into it again, on its unshard stream
        grad = torch.empty(6 * MIB, dtype=torch.uint8)  # back on the default stream
        events = list(tracker.events)
    assert events == [("alloc", 1, 5 * MIB), ("alloc", 2, 4 * MIB), ("free", 2, 0),  # the resize to 0: a free
                      ("stream", 1, 0), ("alloc", 3, 6 * MIB),  # the resize up: a new block, on the side stream
                      ("stream", 0, 0), ("alloc", 4, 6 * MIB)]
    # replayed: the 6 MiB block on the side stream cannot use the default stream's cached 20 MiB segment
    assert replay(events).max_reserved_bytes == 40 * MIB
    assert replay(single_stream(events)).max_reserved_bytes == 20 * MIB
    # from the setup on: the 5 MiB tensor allocated fresh first, then the step
    assert replay_from_setup(events, tracker.reset_at).max_allocated_bytes == 5 * MIB + 6 * MIB + 6 * MIB
    del kept, flat, grad
