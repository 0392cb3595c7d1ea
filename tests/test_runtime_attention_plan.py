"""AttentionPlan's per-step state without a GPU: the driver's descriptor encoder, the SM count and the
launch are replaced by recorders, so the plan's checks and the parameter values it would launch with are
the real code paths (tests/test_runtime_attention.py covers the argument checks and the TMA recipes)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import aotc.runtime.attention as A
from aotc.common.errors import ArgumentError
from aotc.families.sdpa_prefill_sm90 import PARAMS
from aotc.runtime import tensor
from aotc.runtime.validate import packed_strides
from recorded_launch import record_launches
from test_runtime_attention import fake_kernel

H, H_KV, D, B = 8, 2, 128, 3
GAP = 1 << 36  # between the tensors' base addresses: nothing overlaps


class RecordingSlot:
    """A DescriptorSlot that keeps its recipe instead of encoding."""

    def __init__(self, recipe, address):
        self.recipe, self.address, self.data = recipe, address, bytes(128)

    def update(self, address):
        if address == self.address:
            return None
        self.address = address
        return self.data


class FakeRuntime:
    def __init__(self):
        self.plans = {}

    def device(self):
        return 0

    def field_values(self, family, field, device):
        return {"paged16"}

    def find(self, family, device, candidates):  # the paged kernel only (the decode rows go with it)
        if family == "sdpa_decode":
            return None
        k = fake_kernel(D, 16, 128)
        k.artifact.abi = SimpleNamespace(params=PARAMS)
        return k

    def remember_plan(self, key, plan):
        self.plans[key] = plan


@pytest.fixture
def launches(monkeypatch):
    launched = record_launches(monkeypatch)
    monkeypatch.setattr(A, "DescriptorSlot", RecordingSlot)
    monkeypatch.setattr(A, "multiprocessor_count", lambda device: 132)
    return launched


def step(total_q, *, out_strides=None, lse=False, lse_strides=None, base=1 << 32):
    """q, k, v, out, cu_seqlens_q, seqlens_kv, page_table, lse records of a step of total_q tokens."""
    shape = (total_q, H, D)
    kv = (6, 16, H_KV, D)
    return (tensor(base, shape, packed_strides(shape), "bf16"),
            tensor(base + 2 * GAP, kv, packed_strides(kv), "bf16"), tensor(base + 3 * GAP, kv, packed_strides(kv), "bf16"),
            tensor(base + GAP, shape, out_strides or packed_strides(shape), "bf16"),
            tensor(base + 4 * GAP, (B + 1,), (1,), "int32"), tensor(base + 5 * GAP, (B,), (1,), "int32"),
            tensor(base + 6 * GAP, (B, 4), (4, 1), "int32"),
            tensor(base + 7 * GAP, (H, total_q), lse_strides or (total_q, 1), "fp32") if lse else None)


def test_a_plan_first_seen_at_one_token_steps_over_later_tokens_with_q_s_stride(launches):
    """A warm-up (or decode capture) of one token, then a 100-token prefill step on the same plan: Q's
    descriptor steps over tokens with q's real stride, not the placeholder an extent-1 axis may carry."""
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, _ = step(1)
    A.attention(rt, q, k, v, o, cu, sl, pt, max_seqlen_q=1)
    q2, _, _, o2, *_ = step(100)
    A.attention(rt, q2, k, v, o2, cu, sl, pt, max_seqlen_q=100)
    plan = next(iter(rt.plans.values()))
    assert len({id(p) for p in rt.plans.values()}) == 1
    assert plan._current.descriptor.recipe.dims == (D, H, 100)
    assert plan._current.descriptor.recipe.strides == (D * 2, H * D * 2)


def test_a_later_lse_that_overlaps_itself_is_refused(launches):
    """A cached plan, then lse of the same count broadcast over heads (head stride 0): refused, nothing
    launched (it was silently given the old head stride)."""
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, ls = step(10, lse=True)
    A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    n = len(launches)
    with pytest.raises(ArgumentError, match="lse"):
        A.attention(rt, q, k, v, o, cu, sl, pt, tensor(ls.ptr, (H, 10), (0, 1), "fp32"))
    assert len(launches) == n


def test_out_s_token_stride_is_checked_whatever_the_first_count(launches):
    """out rows not 16-byte apart at one token (legal there) would be misaligned at eight: refused when the
    plan is made, since it serves every count."""
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, _ = step(1, out_strides=(H * D + 4, D, 1))
    with pytest.raises(ArgumentError, match=r"out\.stride\[0\]"):
        A.attention(rt, q, k, v, o, cu, sl, pt)
    assert not launches


def test_a_refused_call_leaves_the_plan_as_it_was(launches):
    """A 1000-token call whose out overlaps q is refused; the plan's next call with the prepared tensors
    launches with the prepared count's descriptor and LSE stride."""
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, ls = step(10, lse=True)
    plan = A.AttentionPlan(rt, q, k, v, o, cu, sl, pt, ls)
    big_q, _, _, _, _, _, _, big_ls = step(1000, lse=True, base=1 << 40)
    with pytest.raises(ArgumentError):
        plan.checked_run(big_q.ptr, big_q.ptr + 64, big_ls.ptr, total_q=1000, lse_stride_h=1000)
    plan.checked_run(q.ptr, o.ptr, ls.ptr)
    assert plan._total_q == 10 and launches[-1]["lse_stride_h"] == 10
    assert plan._current.descriptor.recipe.dims == (D, H, 10)


def test_metadata_left_out_is_the_prepared_tensor_not_the_last_call_s(launches):
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, _ = step(10)
    plan = A.AttentionPlan(rt, q, k, v, o, cu, sl, pt)
    other = tensor(sl.ptr + (1 << 20), sl.shape, sl.strides, "int32")
    plan(q, o, seqlens_kv=other)
    assert launches[-1]["seqlens_kv"] == other.ptr
    plan(q, o)
    assert launches[-1]["seqlens_kv"] == sl.ptr


@pytest.mark.parametrize("bad", ["lse_1d", "causal_1", "dql_true", "max_kv_negative", "max_kv_str"])
def test_bad_scalars_and_ranks_are_argument_errors(launches, bad):
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, ls = step(10, lse=True)
    kw = {"lse": ls}
    if bad == "lse_1d":
        kw["lse"] = tensor(ls.ptr, (10,), (1,), "fp32")
    elif bad == "causal_1":
        kw["causal"] = 1
    elif bad == "dql_true":
        kw["decode_query_len"] = True
    elif bad == "max_kv_negative":
        kw["max_seqlen_kv"] = -1
    else:
        kw["max_seqlen_kv"] = "9000"
    lse = kw.pop("lse")
    with pytest.raises(ArgumentError):
        A.attention(rt, q, k, v, o, cu, sl, pt, lse, **kw)
    assert not launches
