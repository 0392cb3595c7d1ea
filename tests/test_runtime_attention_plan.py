"""AttentionPlan's per-step state without a GPU: the driver's descriptor encoder, the SM count and the
launch are replaced by recorders, so the plan's checks and the parameter values it would launch with are
the real code paths (tests/test_runtime_attention.py covers the argument checks and the TMA recipes)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import aotc.runtime.attention as A
from aotc.common.errors import ArgumentError
from aotc.families.sdpa_prefill_sm90 import MAX_KV_SPLITS, PARAMS, split_workspace_bytes
from aotc.runtime import tensor
from aotc.runtime.validate import packed_strides
from recorded_launch import SPLITS, OneTile, RecordingSlot, record_launches, split_arena, stream_counters
from test_runtime_attention import fake_kernel

H, H_KV, D, B = 8, 2, 128, 3
GAP = 1 << 36  # between the tensors' base addresses: nothing overlaps


class FakeRuntime(OneTile):
    def __init__(self):
        self.plans = {}
        self.tile_counters = stream_counters()
        self.split_workspaces = split_arena()

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


# ---- dense KV (page_table=None): the caches as page pools of the same memory ---------------------------

def dense_cache(batch, s_max, alloc_s=None, kv_layout="NHD", base=1 << 40):
    """k, v [B, S_max, H_kv, D] (NHD) or [B, H_kv, S_max, D] (HND), views of [B, alloc_s, ...] buffers."""
    alloc_s = alloc_s or s_max
    if kv_layout == "NHD":
        shape, strides = (batch, s_max, H_KV, D), (alloc_s * H_KV * D, H_KV * D, D, 1)
    else:
        shape, strides = (batch, H_KV, s_max, D), (alloc_s * H_KV * D, alloc_s * D, D, 1)
    return tensor(base, shape, strides, "bf16"), tensor(base + GAP, shape, strides, "bf16")


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_dense_caches_are_pools_of_the_largest_page_that_divides_them(kv_layout):
    k, v = dense_cache(3, 256, alloc_s=320, kv_layout=kv_layout)  # a padded batch stride: 20 pages of 16
    pool = A.dense_as_pool(k, v, kv_layout, 3, [16, 32, 64, 128])
    # NHD: a batch step of 320 tokens is 5 pages of 64 (not whole pages of 128); HND: of H_kv * 320 token
    # strides, 5 pages of 128 (the heads are inside a page)
    page, step_pages = (64, 5) if kv_layout == "NHD" else (128, 5)
    assert (pool.page, pool.stride_pages, pool.per_seq) == (page, step_pages, 256 // page)
    ss = H_KV * D if kv_layout == "NHD" else D
    assert pool.k_pool.strides[0] == page * ss and pool.k_pool.shape[0] == 2 * step_pages + 256 // page
    assert pool.k_pool.shape[1 if kv_layout == "NHD" else 2] == page
    import array
    assert list(array.array("i", pool.page_table(3))) == [b * step_pages + j for b in range(3) for j in range(256 // page)]
    # the pool spans exactly the dense tensor's memory (the last page ends where S_max does)
    assert pool.k_pool.nbytes_span() == k.nbytes_span() and pool.v_pool.nbytes_span() == v.nbytes_span()


@pytest.mark.parametrize("s_max,alloc_s,served,name", [
    (1000, None, [16, 32, 64, 128], "k_cache.shape[1]"),  # no page size divides 1000
    (256, 264, [16, 32], "k_cache.shape[1]"),          # a batch stride of 264 tokens is no whole pages of 16
    (0, None, [16], "k_cache.shape[1]"),
])
def test_dense_caches_no_page_fits_are_refused(s_max, alloc_s, served, name):
    k, v = dense_cache(2, s_max, alloc_s)
    with pytest.raises(ArgumentError) as e:
        A.dense_as_pool(k, v, "NHD", 2, served)
    assert e.value.name == name and "multiple of a page size" in e.value.expected


def test_dense_k_and_v_must_step_alike():
    k, _ = dense_cache(2, 256, alloc_s=256)
    _, v = dense_cache(2, 256, alloc_s=512)
    with pytest.raises(ArgumentError, match="batch stride"):
        A.dense_as_pool(k, v, "NHD", 2, [16])
    with pytest.raises(ArgumentError, match="B = 3"):
        A.dense_as_pool(k, k, "NHD", 3, [16])


def test_a_dense_plan_launches_with_its_own_page_table(launches, monkeypatch):
    written = {}

    class Buffer:
        def __init__(self, nbytes):
            self.ptr, self.nbytes = 1 << 45, nbytes

    import aotc.runtime.driver as drv
    monkeypatch.setattr(drv, "DeviceBuffer", Buffer)
    monkeypatch.setattr(drv, "copy_to_device", lambda ptr, data: written.update({ptr: data}))
    rt = FakeRuntime()  # serves page 16
    q, _, _, o, cu, sl, _, _ = step(10)
    k, v = dense_cache(B, 128)
    A.attention(rt, q, k, v, o, cu, sl, None)
    got = launches[-1]
    assert got["page_table"] == 1 << 45 and got["max_pages"] == 8 and got["pt_stride_b"] == 8
    import array
    assert list(array.array("i", written[1 << 45])) == [b * 8 + j for b in range(B) for j in range(8)]
    plan = next(iter(rt.plans.values()))
    with pytest.raises(ArgumentError, match="page table of its own"):
        plan.run(q.ptr, o.ptr, page_table=1 << 44)
    A.attention(rt, q, k, v, o, cu, sl, None)  # the cached plan, its own table
    assert launches[-1]["page_table"] == 1 << 45


# ---- bounds and scalars an engine gets wrong ----------------------------------------------------------------
@pytest.fixture
def dense_table(monkeypatch):
    """Dense KV plans write a page table of their own: no device memory here."""
    from aotc.runtime import driver

    monkeypatch.setattr(driver, "DeviceBuffer", lambda nbytes: SimpleNamespace(ptr=1 << 45, nbytes=nbytes))
    monkeypatch.setattr(driver, "copy_to_device", lambda ptr, data: None)


def dense_caches(batch, s_max, base=1 << 40):
    shape = (batch, s_max, H_KV, D)
    return (tensor(base, shape, packed_strides(shape), "bf16"),
            tensor(base + GAP, shape, packed_strides(shape), "bf16"))


def test_a_kv_bound_past_the_page_table_is_refused_before_any_launch(launches):
    """The kernels cut a sequence's keys at its page-table row's end: a step told it may hold more keys than the
    rows do would run and be silently wrong (an engine's block table built for another page size)."""
    q, k, v, o, cu, sl, pt, _ = step(10)  # page_table [B, 4] of 16-key pages: 64 keys a sequence
    A.attention(FakeRuntime(), q, k, v, o, cu, sl, pt, max_seqlen_kv=64)
    assert len(launches) == 1
    for bound in (65, 5000):
        with pytest.raises(ArgumentError, match=r"page_table.shape\[1\].*ceil\(max_seqlen_kv / page_size\)") as e:
            A.attention(FakeRuntime(), q, k, v, o, cu, sl, pt, max_seqlen_kv=bound)
        assert e.value.value == 4 and f"= {-(-bound // 16)} pages" in str(e.value)
        with pytest.raises(ArgumentError, match=r"page_table.shape\[1\]"):
            A.AttentionPlan(FakeRuntime(), q, k, v, o, cu, sl, pt, max_seqlen_kv=bound)
    rt = FakeRuntime()  # a cached plan checks each call's bound too (it keys on whether the bound is long only)
    A.attention(rt, q, k, v, o, cu, sl, pt, max_seqlen_kv=10)
    with pytest.raises(ArgumentError, match=r"page_table.shape\[1\]"):
        A.attention(rt, q, k, v, o, cu, sl, pt, max_seqlen_kv=100)
    assert len(launches) == 2


def test_a_kv_bound_past_dense_caches_is_refused(launches, dense_table):
    q, _, _, o, cu, sl, _, _ = step(10)
    k, v = dense_caches(B, 128)
    A.attention(FakeRuntime(), q, k, v, o, cu, sl, None, max_seqlen_kv=128)
    with pytest.raises(ArgumentError, match=r"k_cache.shape\[1\].*max_seqlen_kv = 100000 \(dense KV\)"):
        A.attention(FakeRuntime(), q, k, v, o, cu, sl, None, max_seqlen_kv=100000)
    assert len(launches) == 1


@pytest.mark.parametrize("cu_len", [0, 1])
def test_dense_kv_without_a_sequence_names_cu_seqlens_q(launches, dense_table, cu_len):
    """Dense KV reads B caches from cu_seqlens_q's B: with none (cu_seqlens_q of 0 or 1 entries) the error
    names cu_seqlens_q, not the caches' batch."""
    q, _, _, o, _, _, _, _ = step(0)
    k, v = dense_caches(max(cu_len - 1, 0), 128)
    cu = tensor(1 << 41, (cu_len,), (1,), "int32")
    sl = tensor(1 << 42, (max(cu_len - 1, 0),), (1,), "int32")
    with pytest.raises(ArgumentError) as e:
        A.attention(FakeRuntime(), q, k, v, o, cu, sl, None)
    assert e.value.name == "cu_seqlens_q.shape[0]" and e.value.value == cu_len
    assert not launches


@pytest.mark.parametrize("name, bad", [("window_left", [127, 0]), ("kv_layout", ["NHD"]), ("softcap", [30.0]),
                                       ("softmax_scale", [0.125]), ("window_left", -1), ("softcap", float("nan"))])
def test_the_key_scalars_are_checked_before_they_are_hashed(launches, name, bad):
    """The one-call path keys its plan on kv_layout, softmax_scale, window_left and softcap: a list (an engine's
    flash-attn style window_size=[left, right]) would raise a bare TypeError in the plan cache."""
    q, k, v, o, cu, sl, pt, _ = step(10)
    with pytest.raises(ArgumentError) as e:
        A.attention(FakeRuntime(), q, k, v, o, cu, sl, pt, **{name: bad})
    assert e.value.name == name
    assert not launches


def test_the_paged_kernel_gets_its_kv_split_workspace(launches):
    """The paged kernel's KV splits: the launch stream's buffer of the runtime's split arena sized for the grid's
    CTAs (split_workspace_bytes), the partials at its front and the counters at its back, at most MAX_KV_SPLITS a
    tile; a step on another stream gets that stream's buffer (two streams' steps may run at once)."""
    rt = FakeRuntime()
    q, k, v, o, cu, sl, pt, _ = step(10)
    A.attention(rt, q, k, v, o, cu, sl, pt)
    partials, counters = split_workspace_bytes(132, 128, D)  # the fake kernel's tile: block_m 128
    got = launches[-1]
    assert (got["split_partials"], got["split_counters"]) == (SPLITS, SPLITS + partials)
    assert got["kv_splits_max"] == MAX_KV_SPLITS and counters == 132 * 2 * 4
    A.attention(rt, q, k, v, o, cu, sl, pt, stream=0x1000)
    A.attention(rt, q, k, v, o, cu, sl, pt)
    on_side, again = launches[-2:]
    assert on_side["stream"] == 0x1000 and on_side["split_partials"] == SPLITS + (0x1000 << 24)
    assert on_side["split_counters"] == on_side["split_partials"] + partials
    assert (again["split_partials"], again["split_counters"]) == (SPLITS, SPLITS + partials)
