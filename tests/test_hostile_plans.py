"""Hostile arguments at the plans' per-step calls and at the choices the checks feed (no GPU: the launch is
recorded, tests/recorded_launch.py): each case here was accepted once and would have made a kernel write
past a tensor, read host memory, overwrite its own inputs, or compute with the wrong strides.

* a decode step's lse of another dtype, seqlens_kv / page_table on another device, inputs or outputs inside
  the split workspace the kernel writes (DecodePlan and AttentionPlan steps);
* the one-call decode's plan cache keyed on a workspace's pointer and shape only (a uint8 buffer of the
  same shape, a quarter of the bytes, took an fp32 buffer's plan);
* dense decode caches in the HND layout read as NHD;
* the portable prefill's packed kernel (32-bit offsets inside a batch) picked for 2^31 elements a batch;
* dense attention over a flipped batch (a negative batch stride: negative page ids);
* the layout errors of a plan's step name the tensor and field that differ;
* caller workspaces shared by plans: sized for each argument's largest value, no plan's partials meet
  another's counters.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aotc.runtime.attention as A
import aotc.runtime.decode as dec
import aotc.runtime.prefill as P
from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families.sdpa_decode import PARAMS as DECODE_PARAMS
from aotc.families.sdpa_prefill_sm90 import PARAMS as PAGED_PARAMS
from aotc.runtime import tensor
from aotc.runtime.prefill import PrefillPlan
from aotc.runtime.tensors import TensorArg
from aotc.runtime.validate import packed_strides
from recorded_launch import COUNTERS, OneTile, record_launches, split_arena, stream_counters
from test_runtime_attention import fake_kernel as paged_kernel
from recorded_launch import RecordingSlot
from test_runtime_workspace import DecodeRuntime

H, H_KV, D, B = 32, 8, 128, 4
GAP = 1 << 36


def rec(ptr, shape, dtype="bf16", strides=None, device=("cuda", 0)):
    t = tensor(ptr, shape, strides or packed_strides(shape), dtype)
    return t if device == ("cuda", 0) else TensorArg(t.ptr, t.shape, t.strides, t.dtype, device)


@pytest.fixture
def launches(monkeypatch):
    launched = record_launches(monkeypatch)
    monkeypatch.setattr(dec.driver, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(dec.driver, "memset_d32", lambda *a: None)
    monkeypatch.setattr(A, "DescriptorSlot", RecordingSlot)
    monkeypatch.setattr(A, "multiprocessor_count", lambda device: 132)
    return launched


def decode_args(base=1 << 48, pool=(64, 16, H_KV, D)):
    """q, k_cache, v_cache, out, seqlens_kv, page_table of a paged decode step, GAP apart."""
    q = (B, 1, H, D)
    return (rec(base, q), rec(base + GAP, pool), rec(base + 2 * GAP, pool), rec(base + 3 * GAP, q),
            rec(base + 4 * GAP, (B,), "int32"), rec(base + 5 * GAP, (B, 16), "int32"))


def test_a_decode_step_checks_lse_dtype_and_the_lengths_device(launches):
    q, k, v, o, sl, pt = decode_args()
    lse = rec(1 << 44, (B, H, 1), "fp32")
    plan = dec.DecodePlan(DecodeRuntime(), q, k, v, o, sl, pt, lse)
    cases = [
        (lambda: plan(q, o, rec(1 << 45, (B, H, 1), "bf16")), "lse.dtype"),  # fp32 stores past its end
        (lambda: plan(q, o, lse, seqlens_kv=rec(1 << 45, (B,), "int32", device=("cpu", 0))), "seqlens_kv.device"),
        (lambda: plan(q, o, lse, page_table=rec(1 << 45, (B, 16), "int32", device=("cuda", 1))), "page_table.device"),
        (lambda: plan(q, o, lse, page_table=rec(1 << 45, (B, 32), "int32")), "page_table.shape"),
        (lambda: plan(rec(1 << 45, (B, 1, H, D), "fp16"), o, lse), "q.dtype"),
        (lambda: plan(q, o, None), "lse"),
    ]
    for call, name in cases:
        with pytest.raises(ArgumentError) as e:
            call()
        assert e.value.name == name, str(e.value)
    assert launches == []
    plan(q, o, lse, seqlens_kv=rec(1 << 45, (B,), "int32"))  # the same layout elsewhere: launched
    assert launches[-1]["seqlens_kv"] == 1 << 45 and launches[-1]["lse"] == lse.ptr


def test_inputs_and_outputs_of_a_step_stay_out_of_the_split_workspace(launches):
    """The kernel writes partials and counters into the workspace: a step's out, q, lengths or page table
    inside it is refused (the prepared ones were)."""
    q, k, v, o, sl, pt = decode_args()
    ws = rec(1 << 44, (1 << 24,), "uint8")
    plan = dec.DecodePlan(DecodeRuntime(), q, k, v, o, sl, pt, workspace=ws, chunks=8)
    inside = ws.ptr + 4096
    for call, name in [(lambda: plan(rec(inside, q.shape), o), "q"),
                       (lambda: plan(q, rec(inside, o.shape)), "out"),
                       (lambda: plan(q, o, seqlens_kv=rec(inside, (B,), "int32")), "seqlens_kv"),
                       (lambda: plan(q, o, page_table=rec(inside, (B, 16), "int32")), "page_table")]:
        with pytest.raises(ArgumentError, match="workspace") as e:
            call()
        assert e.value.name == name
    assert launches == []


def test_the_one_call_decode_keys_its_plan_on_the_workspace_dtype(launches):
    """A uint8 buffer of the fp32 one's pointer and shape holds a quarter of its bytes: its own plan, refused."""
    rt = DecodeRuntime()
    args = decode_args()
    need = dec.workspace_bytes(B, 1, H, D, 8)
    n = -(-need // 4)
    dec.decode(rt, *args, chunks=8, workspace=rec(1 << 44, (n,), "fp32"))
    with pytest.raises(ArgumentError, match=f"at least {need} bytes") as e:
        dec.decode(rt, *args, chunks=8, workspace=rec(1 << 44, (n,), "uint8"))
    assert e.value.name == "workspace" and len(launches) == 1


def test_dense_decode_reads_hnd_caches_with_their_own_strides(launches):
    S = 48
    q, _, _, o, sl, _ = decode_args()
    k, v = rec(1 << 44, (B, H_KV, S, D)), rec(1 << 45, (B, H_KV, S, D))
    plan = dec.DecodePlan(DecodeRuntime(), q, k, v, o, sl, None, kv_layout="HND", max_seqlen_kv=S)
    p = plan.launcher.params.slots
    assert (p["heads_kv"].value, p["k_stride_token"].value, p["k_stride_head"].value, p["k_stride_page"].value) == \
        (H_KV, D, S * D, H_KV * S * D)
    with pytest.raises(ArgumentError) as e:
        dec.DecodePlan(DecodeRuntime(), q, k, v, o, sl, None, kv_layout="HND", max_seqlen_kv=S + 1)
    assert e.value.name == "k_cache.shape[2]"


class AttentionRuntime(OneTile):
    """The paged kernel and a ragged decode kernel for its decode rows."""

    def __init__(self):
        self.plans = {}
        self.workspaces = DecodeRuntime().workspaces
        self.tile_counters = stream_counters()
        self.split_workspaces = split_arena()

    def device(self):
        return 0

    def field_values(self, family, field, device):
        return {"paged16"} if field == "layout" else {D}

    def find(self, family, device, candidates):
        if family == "sdpa_decode":
            v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=D, kv="paged16", layout="ragged",
                             window=False, softcap=False, sinks=False)
            launch = SimpleNamespace(extra={"rows_per_cta": 16, "ctas_per_sm": 2})
            return SimpleNamespace(variant=v, artifact=SimpleNamespace(launch=launch,
                                                                       abi=SimpleNamespace(params=DECODE_PARAMS)))
        k = paged_kernel(D, 16, 128)
        k.artifact.abi = SimpleNamespace(params=PAGED_PARAMS)
        return k

    select = find


def test_attention_steps_stay_out_of_the_decode_rows_workspace(launches):
    total = 40
    q, o = rec(1 << 48, (total, H, D)), rec((1 << 48) + GAP, (total, H, D))
    k, v = rec((1 << 48) + 2 * GAP, (64, 16, H_KV, D)), rec((1 << 48) + 3 * GAP, (64, 16, H_KV, D))
    cu, sl, pt = rec(1 << 43, (B + 1,), "int32"), rec(1 << 44, (B,), "int32"), rec(1 << 45, (B, 16), "int32")
    ws = rec(1 << 46, (1 << 24,), "uint8")
    plan = A.AttentionPlan(AttentionRuntime(), q, k, v, o, cu, sl, pt, workspace=ws)
    assert plan.decode is not None and plan.decode.workspace is ws
    inside = ws.ptr + 256
    with pytest.raises(ArgumentError, match="workspace") as e:
        plan.checked_run(q.ptr, inside)
    assert e.value.name == "out"
    with pytest.raises(ArgumentError, match="workspace") as e:
        plan.checked_run(inside, o.ptr)
    assert e.value.name == "q"
    assert launches == []
    plan.checked_run(q.ptr, o.ptr)
    assert len(launches) == 2  # the decode rows' kernel and the paged prefill kernel


@pytest.mark.parametrize("name, bad", [("max_seqlen_q", -1), ("max_seqlen_q", True), ("min_seqlen_q", "17"),
                                       ("min_seqlen_q", 2.0)])
def test_a_plan_step_checks_its_bounds_on_the_query_counts(launches, name, bad):
    """checked_run's max_seqlen_q / min_seqlen_q decide which kernels launch: -1 would have skipped the paged
    kernel (the longer rows never written), a string raised a bare TypeError."""
    total = 40
    q, o = rec(1 << 48, (total, H, D)), rec((1 << 48) + GAP, (total, H, D))
    k, v = rec((1 << 48) + 2 * GAP, (64, 16, H_KV, D)), rec((1 << 48) + 3 * GAP, (64, 16, H_KV, D))
    cu, sl, pt = rec(1 << 43, (B + 1,), "int32"), rec(1 << 44, (B,), "int32"), rec(1 << 45, (B, 16), "int32")
    plan = A.AttentionPlan(AttentionRuntime(), q, k, v, o, cu, sl, pt)
    with pytest.raises(ArgumentError) as e:
        plan.checked_run(q.ptr, o.ptr, **{name: bad})
    assert e.value.name == name and launches == []
    plan.checked_run(q.ptr, o.ptr, max_seqlen_q=None, min_seqlen_q=None)
    assert len(launches) == 2  # the decode rows' kernel and the paged prefill kernel


class RecordingFork:
    """driver.Fork without a driver: the calls it would make, in order."""

    def __init__(self, calls, side=0x5EED):
        self.calls, self.side = calls, side

    def begin(self, stream):
        self.calls.append(("fork", stream, self.side))
        return self.side

    def end(self, stream):
        self.calls.append(("join", self.side, stream))


def attention_plan():
    total = 40
    q, o = rec(1 << 48, (total, H, D)), rec((1 << 48) + GAP, (total, H, D))
    k, v = rec((1 << 48) + 2 * GAP, (64, 16, H_KV, D)), rec((1 << 48) + 3 * GAP, (64, 16, H_KV, D))
    cu, sl, pt = rec(1 << 43, (B + 1,), "int32"), rec(1 << 44, (B,), "int32"), rec(1 << 45, (B, 16), "int32")
    return A.AttentionPlan(AttentionRuntime(), q, k, v, o, cu, sl, pt), q, o


def test_prefill_sms_runs_the_paged_kernel_on_that_many_sms_beside_the_decode_kernel(launches, monkeypatch):
    """A step with both kernels and prefill_sms below the SM count: the paged kernel on (prefill_sms, 1, 1) on the
    caller's stream, the decode kernel on the side stream between the fork and the join; without it (or with the
    SM count or more, or with one kernel only) both run one after the other on the caller's stream, as before."""
    plan, q, o = attention_plan()
    calls = []
    monkeypatch.setattr(plan, "_fork_of", lambda: RecordingFork(calls))
    plan.checked_run(q.ptr, o.ptr, stream=7, prefill_sms=40)
    assert calls == [("fork", 7, 0x5EED), ("join", 0x5EED, 7)]
    paged, decode = launches
    assert (paged["grid"], paged["stream"]) == ((40, 1, 1), 7) and "tma_q" in paged
    assert paged["tile_counter"] == COUNTERS + 7  # the paged kernel draws its tiles from the call stream's counter
    assert decode["stream"] == 0x5EED and "target_chunks" in decode
    for sms in (None, 132, 500):
        launches.clear()
        plan.checked_run(q.ptr, o.ptr, stream=7, prefill_sms=sms)
        assert [(x["grid"][0], x["stream"], "target_chunks" in x) for x in launches] == \
            [(launches[0]["grid"][0], 7, True), (132, 7, False)]
    launches.clear()
    plan.checked_run(q.ptr, o.ptr, stream=9)
    assert launches[-1]["tile_counter"] == COUNTERS + 9  # a step on another stream: that stream's counter
    assert len(calls) == 2  # no fork past the first step
    launches.clear()
    plan.checked_run(q.ptr, o.ptr, stream=7, prefill_sms=40, min_seqlen_q=2)  # no decode row: no fork
    assert [(x["grid"], x["stream"]) for x in launches] == [((132, 1, 1), 7)] and len(calls) == 2
    launches.clear()
    plan.checked_run(q.ptr, o.ptr, stream=7, prefill_sms=40, max_seqlen_q=1)  # decode rows only: no fork
    assert len(launches) == 1 and "target_chunks" in launches[0] and len(calls) == 2


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "40", [40]])
def test_prefill_sms_is_a_positive_int_or_none(launches, bad):
    plan, q, o = attention_plan()
    with pytest.raises(ArgumentError) as e:
        plan.checked_run(q.ptr, o.ptr, prefill_sms=bad)
    assert e.value.name == "prefill_sms" and launches == []


@pytest.mark.parametrize("name, bad", [("window_left", [127, 0]), ("kv_layout", ["NHD"]), ("softcap", [30.0]),
                                       ("max_seqlen_kv", [4096]), ("chunks", {"n": 4})])
def test_the_one_call_decode_names_an_unhashable_scalar(launches, name, bad):
    """Runtime.decode hashes its scalars into its plan key: a list (flash-attn's window_size=[left, right])
    is an ArgumentError naming it, not a bare TypeError from the plan cache."""
    q, k, v, o, sl, pt = decode_args()
    with pytest.raises(ArgumentError) as e:
        dec.decode(DecodeRuntime(), q, k, v, o, sl, pt, **{name: bad})
    assert e.value.name == name and launches == []


@pytest.mark.parametrize("name, bad", [("window_left", [127, 0]), ("softmax_scale", [0.125]),
                                       ("max_seqlen_q", [64]), ("family", ["auto"])])
def test_the_one_call_prefill_names_an_unhashable_scalar(launches, name, bad):
    from aotc.runtime.prefill import prefill

    shape = (2, 64, H, D)
    q, k, v, o = (rec((1 << 48) + i * GAP, shape) for i in range(4))
    with pytest.raises(ArgumentError) as e:
        prefill(DecodeRuntime(), q, k, v, o, causal=True, **{name: bad})
    assert e.value.name == name and launches == []


def test_the_one_call_decode_keys_its_scalars_with_their_types(launches):
    """A scalar refused when a plan is made must not find the plan of an equal valid value: softmax_scale=True
    after softmax_scale=1 (equal, and hashed alike) was served by that plan."""
    q, k, v, o, sl, pt = decode_args()
    rt = DecodeRuntime()
    dec.decode(rt, q, k, v, o, sl, pt, softmax_scale=1)
    assert len(launches) == 1
    with pytest.raises(ArgumentError) as e:
        dec.decode(rt, q, k, v, o, sl, pt, softmax_scale=True)
    assert e.value.name == "softmax_scale" and len(launches) == 1


def recorded_prefill_plans(monkeypatch) -> list[dict]:
    """PrefillPlan replaced by a stand-in that records the keyword arguments of every plan the one-call prefill
    makes (and launches nothing)."""
    made = []

    class RecordingPlan:
        def __init__(self, runtime, q, k, v, out, lse, **kw):
            made.append(kw)

        def launch_records(self, *args):
            pass

    monkeypatch.setattr(P, "PrefillPlan", RecordingPlan)
    return made


@pytest.mark.parametrize("good, bad", [({"causal": True}, {"causal": 1}),
                                       ({"softmax_scale": 1}, {"softmax_scale": True}),
                                       ({"max_seqlen_q": 1}, {"max_seqlen_q": True})])
def test_the_one_call_prefill_keys_its_scalars_with_their_types(monkeypatch, good, bad):
    """Prefill's plan cache: causal=1 after causal=True (equal, and hashed alike) reused the plan instead of
    reaching PrefillPlan, which refuses it. Each must make a plan of its own (here a recording stand-in)."""
    made = recorded_prefill_plans(monkeypatch)
    rt = DecodeRuntime()
    shape = (2, 64, H, D)
    q, k, v, o = (rec((1 << 48) + i * GAP, shape) for i in range(4))
    for scalars in (good, good, bad):
        P.prefill(rt, q, k, v, o, **scalars)
    (name, good_value), (_, bad_value) = *good.items(), *bad.items()
    assert [type(m[name]) for m in made] == [type(good_value), type(bad_value)]  # the second good one reused the first


class OneCallAttentionRuntime(AttentionRuntime):
    def remember_plan(self, key, plan):
        self.plans[key] = plan


def test_numpy_integers_are_taken_as_ints_at_the_one_call_entry_points(launches, monkeypatch):
    """Engines build step metadata with numpy (np.int64 bounds): every entry point takes any integer with __index__
    as the int it is, one plan for np.int64(n) and n alike; numpy's bool is still refused, naming the argument."""
    np = pytest.importorskip("numpy")
    total = 40
    q, o = rec(1 << 48, (total, H, D)), rec((1 << 48) + GAP, (total, H, D))
    k, v = rec((1 << 48) + 2 * GAP, (64, 16, H_KV, D)), rec((1 << 48) + 3 * GAP, (64, 16, H_KV, D))
    cu, sl, pt = rec(1 << 43, (B + 1,), "int32"), rec(1 << 44, (B,), "int32"), rec(1 << 45, (B, 16), "int32")
    rt = OneCallAttentionRuntime()
    for bounds in ({"max_seqlen_q": np.int64(total), "max_seqlen_kv": np.int32(256), "min_seqlen_q": np.int64(1),
                    "decode_query_len": np.int64(1)},
                   {"max_seqlen_q": total, "max_seqlen_kv": 256, "min_seqlen_q": 1, "decode_query_len": 1}):
        A.attention(rt, q, k, v, o, cu, sl, pt, **bounds)
    assert len(rt.plans) == 1 and len(launches) == 4  # each step: the decode rows' kernel and the paged kernel
    with pytest.raises(ArgumentError) as e:
        A.attention(rt, q, k, v, o, cu, sl, pt, max_seqlen_q=np.True_)
    assert e.value.name == "max_seqlen_q" and len(launches) == 4

    dq, dk, dv, do, dsl, dpt = decode_args()
    drt = DecodeRuntime()
    dec.decode(drt, dq, dk, dv, do, dsl, dpt, chunks=np.int64(4), max_seqlen_kv=np.int64(256))
    dec.decode(drt, dq, dk, dv, do, dsl, dpt, chunks=4, max_seqlen_kv=256)
    assert len(drt.plans) == 1 and len(launches) == 6

    made = recorded_prefill_plans(monkeypatch)
    pq, pk, pv, po = (rec((1 << 48) + i * GAP, (128, H, D)) for i in range(4))
    cuq, cuk = rec(1 << 43, (3,), "int32"), rec(1 << 44, (3,), "int32")
    P.prefill(DecodeRuntime(), pq, pk, pv, po, cu_seqlens_q=cuq, cu_seqlens_kv=cuk, max_seqlen_q=np.int64(64),
              max_seqlen_kv=np.uint16(64), window_left=np.int64(127), causal=True)
    assert [type(made[0][n]) for n in ("max_seqlen_q", "max_seqlen_kv", "window_left")] == [int, int, int]


def test_the_packed_prefill_is_not_chosen_for_2_31_elements_a_batch():
    """The portable family's packed kernels offset a batch's rows in 32 bits: one sequence of 2^21 tokens x
    16 heads x 128 takes the general (Int64 strides) kernel."""
    seen = []

    class Candidates:
        def select(self, family, device, candidates):
            seen.append([c["strides"] for c in candidates])
            return SimpleNamespace(variant=None)

    def choose(S):
        t = {n: rec(GAP * (i + 1), (1, S, 16, 128)) for i, n in enumerate(("q", "k", "v", "out"))}
        PrefillPlan._choose(Candidates(), 0, "sdpa_prefill", {"dtype": "bf16"}, None, t, None, False, "bf16", True,
                            False)
        return seen[-1]

    assert choose(1 << 19) == ["packed", "general"]
    assert choose(1 << 20) == ["general"]  # 2^20 x 16 x 128 = 2^31 elements
    assert 1 << 20 == math.ceil(2**31 / (16 * 128))


def test_dense_attention_refuses_a_flipped_batch_naming_its_stride():
    S, row = 64, 64 * 2 * D
    for name, bad in (("k_cache", "k"), ("v_cache", "v")):
        k = rec(1 << 44, (2, S, 2, D), strides=(-row if bad == "k" else row, 2 * D, D, 1))
        v = rec(1 << 45, (2, S, 2, D), strides=(-row if bad == "v" else row, 2 * D, D, 1))
        with pytest.raises(ArgumentError, match="a batch stride of 0 or more") as e:
            A.dense_as_pool(k, v, "NHD", 2, [16, 64])
        assert e.value.name == f"{name}.stride[0]" and e.value.value == -row
    k = rec(1 << 44, (2, S, 2, D), strides=(0, 2 * D, D, 1))  # one cache broadcast over the batch: read alike
    assert A.dense_as_pool(k, k, "NHD", 2, [16, 64]).page == 64


SHAPE = st.tuples(st.integers(1, 300), st.integers(1, 16), st.sampled_from([1, 8, 32, 64]),
                  st.sampled_from([64, 128, 256]), st.integers(2, 400))


@settings(max_examples=400, deadline=None)
@given(st.lists(SHAPE, min_size=2, max_size=4))
def test_plans_sharing_a_workspace_sized_for_every_largest_argument_keep_apart(shapes):
    """README and decode.py: plans may share a buffer of workspace_bytes() of each argument's largest value
    (B, S_q, H_q, D, chunks): no plan's partials reach any plan's counters (the largest plan's own size was
    the documented rule, and let one plan's LSE partials reach another's counters)."""
    nbytes = dec.workspace_bytes(*(max(s[i] for s in shapes) for i in range(5)))
    layouts = [dec.workspace_layout(b, s_q, h, max(1, h // 8), d, c, nbytes) for b, s_q, h, d, c in shapes]
    partials_end = max(at["partials_end"] for at in layouts)
    counters_start = min(at["counters"] for at in layouts)
    assert partials_end <= counters_start


def test_the_largest_plans_own_size_is_not_enough_to_share():
    """The counter-example the audit found: a long split of one sequence beside a wide batch of two."""
    a, b = (1, 1, 32, 128, 100), (64, 1, 32, 64, 2)
    nbytes = max(dec.workspace_bytes(*a), dec.workspace_bytes(*b))
    la = dec.workspace_layout(*a[:3], 4, *a[3:], nbytes)
    lb = dec.workspace_layout(*b[:3], 8, *b[3:], nbytes)
    assert la["partials_end"] > lb["counters"]  # why the rule takes every argument's largest value
