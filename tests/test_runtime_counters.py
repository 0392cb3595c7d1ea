"""The per-stream tile counters (aotc.runtime.counters) without a GPU: every (device, stream) has a counter of
its own that stays its own, a plan's reserve() leaves a slot ready so a first launch on a new stream (a CUDA graph
capture's) allocates nothing, more streams than a buffer holds take another buffer, and a failed allocation is an
error naming the stream. That the prefill plan passes its stream's counter only to kernels that draw tiles is
checked here too, from the family's launch facts."""
from __future__ import annotations

import pytest

from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families.sdpa_prefill_sm90 import PARAMS, launch_facts
from aotc.runtime.counters import TileCounters


class FakeBuffer:
    next_ptr = 1 << 40

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = FakeBuffer.next_ptr
        FakeBuffer.next_ptr += nbytes + 4096


def counters(per_buffer=4):
    made = []

    def allocate(nbytes):
        made.append(FakeBuffer(nbytes))
        return made[-1]

    return TileCounters(allocate, slots_per_buffer=per_buffer), made


def test_each_stream_keeps_a_counter_of_its_own():
    c, made = counters()
    a, b = c.get(0, 0x10), c.get(0, 0x20)
    assert a != b and c.get(0, 0x10) == a and c.get(0, 0x20) == b
    assert c.get(1, 0x10) not in (a, b)  # another device: another buffer
    assert len(made) == 2 and c.nbytes == 2 * 16
    for ptr in (a, b):  # 4-byte slots inside the buffer
        assert made[0].ptr <= ptr <= made[0].ptr + made[0].nbytes - 4 and ptr % 4 == 0


def test_more_streams_than_a_buffer_holds_take_another_buffer():
    c, made = counters(per_buffer=3)
    slots = [c.get(0, s) for s in range(7)]
    assert len(set(slots)) == 7 and len(made) == 3


def test_reserve_leaves_a_free_slot_so_a_new_stream_allocates_nothing():
    c, made = counters(per_buffer=2)
    c.reserve(0)
    assert len(made) == 1
    c.get(0, 1), c.get(0, 2)  # the buffer is full now
    c.reserve(0)  # a plan made now: the next stream's slot is allocated here, not in its first launch
    assert len(made) == 2

    def refuse(nbytes):
        raise RuntimeError("operation not permitted when stream is capturing")

    c._allocate = refuse
    assert c.get(0, 3) not in (c.get(0, 1), c.get(0, 2))  # taken from the reserved buffer
    c.get(0, 4)
    with pytest.raises(ArgumentError, match="'stream'.*0x5.*capturing"):
        c.get(0, 5)


@pytest.mark.parametrize("head_dim,layout,causal,draws", [
    (128, "dense", True, True), (256, "dense", True, True), (64, "dense", True, False), (128, "dense", False, False),
    (128, "ragged", True, True), (64, "ragged", False, True), (128, "paged16", True, True),
    (256, "paged128", False, True)])
def test_ragged_paged_and_dense_causal_d128_d256_variants_draw_tiles(head_dim, layout, causal, draws):
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout=layout, causal=causal,
                     block_n={64: 128, 128: 128, 256: 80}[head_dim])
    assert launch_facts(v).extra["draws_tiles"] is draws
    counter = next(p for p in PARAMS if p.name == "tile_counter")
    assert counter.kind == "ptr" and counter.pointee_align == 4
