"""The split-decode workspace arena (aotc.runtime.workspace) without a GPU: plans share a device's buffer
where it fits, a larger one is allocated (and the old kept) where not, no plan's partials ever meet another
plan's counters in one buffer, and a plan the cache evicts leaves its buffer alive for graphs that
captured its launches."""
from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest

from aotc.common.errors import ArgumentError
from hypothesis import given, settings
from hypothesis import strategies as st

import aotc.runtime.decode as dec
from aotc.families.sdpa_decode import PARAMS
from aotc.runtime import tensor
from aotc.runtime.validate import packed_strides
from aotc.runtime.workspace import GROWTH, WorkspaceArena
from aotc.common.variant import Variant
from recorded_launch import record_launches


class FakeBuffer:
    """Device memory as the arena sees it: an address and a size; addresses never reused."""

    next_ptr = 1 << 40

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = FakeBuffer.next_ptr
        FakeBuffer.next_ptr += (nbytes + (1 << 20)) // 16 * 16


def test_plans_share_a_buffer_that_fits_and_a_larger_need_gets_a_new_one():
    arena = WorkspaceArena(FakeBuffer)
    a = arena.take(0, 1000, 64)
    assert a.nbytes >= 1064 and a.nbytes % 16 == 0
    assert arena.take(0, 800, 32) is a  # fits beside the first plan's
    b = arena.take(0, 5000, 64)  # does not: a new buffer, at least 1.5x, for every later plan too
    assert b is not a and b.nbytes >= max(5064, int(a.nbytes * GROWTH))
    assert arena.take(0, 1000, 64) is b
    assert arena.take(1, 10, 16) is not b  # another device, its own arena
    assert arena.nbytes == sum(x.nbytes for x in {id(x): x for x in (a, b, arena.take(1, 10, 16))}.values())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 22), st.integers(0, 1 << 14)), min_size=1, max_size=30))
def test_no_plan_s_partials_meet_another_plan_s_counters(requests):
    """Each plan writes [0, partials) and [nbytes - counters, nbytes) of the buffer it is given (partials
    from the front, counters ending at the back: decode.workspace_layout); in one buffer, no plan's
    partials may overlap any plan's counters (two plans' counters may overlap: every step leaves them 0)."""
    arena = WorkspaceArena(FakeBuffer)
    given_to: dict[int, list] = {}
    for partials, counters in requests:
        buf = arena.take(0, partials, counters)
        assert buf.nbytes >= partials + counters
        given_to.setdefault(id(buf), [buf, []])[1].append((partials, counters))
    for buf, plans in given_to.values():
        assert max(p for p, _ in plans) + max(c for _, c in plans) <= buf.nbytes


# ---- DecodePlan on the arena, the launch recorded (as tests/test_runtime_attention_plan.py does) --------

H, H_KV, D = 32, 8, 128
GAP = 1 << 36


def decode_kernel():
    v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=D, kv="paged16", layout="dense", window=False,
                     softcap=False, sinks=False)
    launch = SimpleNamespace(extra={"rows_per_cta": 16, "ctas_per_sm": 2, "block_n": 64, "min_chunk_blocks": 4})
    return SimpleNamespace(variant=v, artifact=SimpleNamespace(launch=launch, abi=SimpleNamespace(params=PARAMS)))


class DecodeRuntime:
    MAX_PLANS = 2

    def __init__(self):
        self.plans = {}
        self.workspaces = WorkspaceArena(FakeBuffer)

    def device(self):
        return 0

    def field_values(self, family, field, device):
        return {D}

    def find(self, family, device, candidates):
        return decode_kernel()

    select = find

    def remember_plan(self, key, plan):
        if len(self.plans) >= self.MAX_PLANS:
            self.plans.pop(next(iter(self.plans)))
        self.plans[key] = plan


@pytest.fixture
def launches(monkeypatch):
    launched = record_launches(monkeypatch)
    monkeypatch.setattr(dec.driver, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(dec.driver, "memset_d32", lambda *a: pytest.fail("an arena buffer is zeroed once, when made"))
    return launched


def step(batch, base):
    q = (batch, 1, H, D)
    pool = (64, 16, H_KV, D)
    return (tensor(base, q, packed_strides(q), "bf16"), tensor(base + GAP, pool, packed_strides(pool), "bf16"),
            tensor(base + 2 * GAP, pool, packed_strides(pool), "bf16"), tensor(base + 3 * GAP, q, packed_strides(q), "bf16"),
            tensor(base + 4 * GAP, (batch,), (1,), "int32"), tensor(base + 5 * GAP, (batch, 4), (4, 1), "int32"))


def test_decode_plans_of_every_batch_size_share_the_arena(launches):
    rt = DecodeRuntime()
    small = dec.DecodePlan(rt, *step(2, 1 << 32))
    large = dec.DecodePlan(rt, *step(64, 1 << 33))
    again = dec.DecodePlan(rt, *step(8, 1 << 34))
    bufs = {id(p._arena_buffer) for p in (small, large, again)}
    assert len(bufs) <= 2 and again._arena_buffer is large._arena_buffer
    for p in (small, large, again):
        ws = p._arena_buffer
        vals = p.launcher.params.slots
        assert ws.ptr <= vals["o_partial"].value < vals["lse_partial"].value < vals["counters"].value < ws.ptr + ws.nbytes


def test_an_evicted_plan_s_workspace_stays_alive(launches):
    """The one-call API's cache drops its oldest plan; a CUDA graph that captured that plan's launches still
    writes its partials: the buffer must outlive the plan (it is the runtime's)."""
    rt = DecodeRuntime()
    args = step(4, 1 << 32)
    dec.decode(rt, *args)
    first = next(iter(rt.plans.values()))
    buf = weakref.ref(first._arena_buffer)
    counters = launches[-1]["counters"]
    del first
    for i in range(3):  # other layouts push the first plan out of the two-plan cache
        dec.decode(rt, *step(4 + i, (1 << 33) + i * (1 << 38)))
    gc.collect()
    assert buf() is not None and buf().ptr <= counters < buf().ptr + buf().nbytes


def test_a_call_on_another_stream_reuses_the_plan(launches):
    """torch.cuda.graph captures on a stream of its own after a warm-up call on the current one: the capture
    must find the warm-up's plan (a plan made under capture would allocate and copy), so plans are not per
    stream (a first version keyed them so, and the GPU suite's graph tests failed)."""
    rt = DecodeRuntime()
    args = step(4, 1 << 32)
    dec.decode(rt, *args, stream=0x1000)
    dec.decode(rt, *args, stream=0x2000)
    assert len({id(p) for p in rt.plans.values()}) == 1 and launches[-1]["counters"] == launches[-2]["counters"]


def test_a_caller_s_workspace_may_not_overlap_the_sinks(launches):
    rt = DecodeRuntime()
    q, k, v, o, sl, pt = step(4, 1 << 32)
    ws = tensor(1 << 41, (1 << 22,), (1,), "uint8")
    sinks = tensor((1 << 41) + 64, (H,), (1,), "fp32")  # inside the workspace
    with pytest.raises(ArgumentError, match="sinks"):
        dec.DecodePlan(rt, q, k, v, o, sl, pt, workspace=ws, sinks=sinks)
