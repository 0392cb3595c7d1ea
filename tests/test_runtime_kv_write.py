"""kv_write's runtime on CPU: every bad argument refused naming the argument before any launch, the K/V pool
overlap rule (interleaved pools accepted), and the plan's launches against the stand-in libcuda (the grid
follows each call's token count, nothing launches for 0 tokens, pointers rechecked per call)."""
from __future__ import annotations

import ctypes

import pytest

from aotc.common.abi import KernelABI
from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families import kv_write as family
from aotc.runtime import validate as V
from aotc.runtime.kv_write import MAX_TOKENS, KvWritePlan, check_kv_write, kv_write
from aotc.runtime.tensors import tensor
from aotc.runtime.validate import packed_strides
from test_runtime_driver import _recorded, stub, stub_library  # noqa: F401  (the stand-in libcuda fixtures)

BASE = 1 << 32
POOL = 1 << 36
H, D, P, PAGES, T = 4, 128, 16, 10, 7


def rec(ptr, shape, dtype="bf16", strides=None, device=0):
    return tensor(ptr, shape, strides or packed_strides(shape), dtype, device)


def pool(ptr, layout="NHD", page=P, heads=H, dim=D, dtype="bf16", pages=PAGES):
    shape = (pages, page, heads, dim) if layout == "NHD" else (pages, heads, page, dim)
    return rec(ptr, shape, dtype)


def args(layout="NHD", tokens=T, rows=None):
    rows = tokens if rows is None else rows
    return {"key": rec(BASE, (rows, H, D)), "value": rec(BASE + (1 << 24), (rows, H, D)),
            "k_cache": pool(POOL, layout), "v_cache": pool(POOL + (1 << 30), layout),
            "slot_mapping": rec(BASE + (2 << 24), (tokens,), "int64")}


class StubRuntime:
    """Stands in for Runtime: the head dims the loaded kernels cover, and (for plans) one fake kv_write
    kernel per dtype and head dim whose launches reach the stand-in libcuda."""

    plans: dict

    def __init__(self):
        self.plans = {}
        self.selected = []

    def device(self):
        return 0

    def field_values(self, family_name, field, device):
        assert (family_name, field) == ("kv_write", "head_dim")
        return {64, 128, 256}

    def select(self, family_name, device, candidates):
        self.selected.append(candidates)
        return FakeKernel(Variant.make("kv_write", "sm_90", **candidates[0]))

    def remember_plan(self, key, plan):
        self.plans[key] = plan


class FakeKernel:
    """What a plan reads of a LoadedKernel."""

    def __init__(self, variant):
        class Art:
            pass

        self.variant = variant
        self.artifact = Art()
        self.artifact.abi = KernelABI("kv_write_kernel", family.PARAMS)
        self.artifact.launch = family.launch_facts(variant)

    def ensure_loaded(self, device):
        return 0x7F00_0000_1000


def check(a, layout="NHD"):
    return check_kv_write(StubRuntime(), 0, a, layout)


# ---- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_good_arguments_pass(layout):
    d = check(args(layout), layout)
    assert (d.heads_kv, d.head_dim, d.page_size, d.num_pages) == (H, D, P, PAGES)
    tok = H * D if layout == "NHD" else D
    head = D if layout == "NHD" else P * D
    assert d.k_strides == d.v_strides == (P * H * D, tok, head)
    check(args(layout, tokens=0), layout)
    check(args(layout, tokens=1), layout)
    check(args(layout, tokens=3, rows=9), layout)  # a padded batch: rows past the slots are not read


def _padded(a, name, strides):
    x = a[name]
    return {**a, name: rec(x.ptr, x.shape, x.dtype, strides)}


def test_padded_and_sliced_inputs_pass():
    a = args()
    qkv_row = (32 + 2 * H) * D  # key = qkv[:, 32:32 + H] of a fused projection [T, 32 + 2H, D]
    check(_padded(_padded(a, "key", (qkv_row, D, 1)), "value", (qkv_row, D, 1)))
    check(_padded(a, "key", (H * (D + 8), D + 8, 1)))  # padded head dim rows


def _set(name, **kw):
    def mutate(a):
        x = a[name]
        fields = {"ptr": x.ptr, "shape": x.shape, "dtype": x.dtype, "strides": None, "device": 0, **kw}
        if fields["strides"] is None and fields["shape"] == x.shape:
            fields["strides"] = x.strides
        return {**a, name: rec(fields["ptr"], fields["shape"], fields["dtype"], fields["strides"], fields["device"])}
    return mutate


BAD = [
    (_set("key", dtype="fp32"), "key.dtype"),
    (_set("key", dtype="int8"), "key.dtype"),
    (_set("value", dtype="fp16"), "value.dtype"),
    (_set("k_cache", dtype="fp16"), "k_cache.dtype"),
    (_set("v_cache", dtype="fp16"), "v_cache.dtype"),
    (_set("key", shape=(T, H * D)), "key.shape"),
    (_set("value", shape=(T + 1, H, D)), "value.shape[0]"),
    (_set("value", shape=(T, H, 64)), "value.shape[2]"),
    (_set("k_cache", shape=(PAGES, P, H, D, 1)), "k_cache.shape"),
    (_set("v_cache", shape=(PAGES + 1, P, H, D)), "v_cache.shape[0]"),
    (_set("v_cache", shape=(PAGES, 32, H, D)), "v_cache.shape[1]"),
    (lambda a: {**a, "k_cache": pool(POOL, pages=0), "v_cache": pool(POOL + (1 << 30), pages=0)}, "k_cache.shape[0]"),
    (lambda a: {**a, "k_cache": pool(POOL, page=24), "v_cache": pool(POOL + (1 << 30), page=24)}, "k_cache.shape[1]"),
    (lambda a: {**a, "k_cache": pool(POOL, page=8), "v_cache": pool(POOL + (1 << 30), page=8)}, "k_cache.shape[1]"),
    (lambda a: {**a, "k_cache": pool(POOL, page=256), "v_cache": pool(POOL + (1 << 30), page=256)}, "k_cache.shape[1]"),
    (lambda a: {**a, "k_cache": pool(POOL, heads=2), "v_cache": pool(POOL + (1 << 30), heads=2)}, "k_cache.shape[2]"),
    (lambda a: {**a, "k_cache": pool(POOL, dim=64), "v_cache": pool(POOL + (1 << 30), dim=64)}, "k_cache.shape[3]"),
    (lambda a: {**a, "key": rec(BASE, (T, H, 96)), "value": rec(BASE + (1 << 24), (T, H, 96)),
                "k_cache": pool(POOL, dim=96), "v_cache": pool(POOL + (1 << 30), dim=96)}, "key.shape[2]"),
    (lambda a: {**a, "key": rec(BASE, (T, 0, D)), "value": rec(BASE + (1 << 24), (T, 0, D)),
                "k_cache": pool(POOL, heads=0), "v_cache": pool(POOL + (1 << 30), heads=0)}, "key.shape[1]"),
    (_set("slot_mapping", dtype="int32"), "slot_mapping.dtype"),
    (_set("slot_mapping", dtype="fp32"), "slot_mapping.dtype"),
    (_set("slot_mapping", shape=(T, 1)), "slot_mapping.shape"),
    (_set("slot_mapping", shape=(T + 1,)), "slot_mapping.shape[0]"),  # more slots than key rows
    (_set("slot_mapping", strides=(2,)), "slot_mapping.stride[0]"),
    (lambda a: {**a, "slot_mapping": rec(BASE + (2 << 24), (1,), "int64", (2,))}, "slot_mapping.stride[0]"),
    (_set("slot_mapping", ptr=BASE + (2 << 24) + 4), "slot_mapping.data_ptr"),
    (_set("slot_mapping", device=1), "slot_mapping.device"),
    (_set("key", device=1), "key.device"),
    (_set("v_cache", device=1), "v_cache.device"),
    (_set("key", ptr=BASE + 8), "key.data_ptr"),
    (_set("value", ptr=BASE + (1 << 24) + 2), "value.data_ptr"),
    (_set("k_cache", ptr=POOL + 8), "k_cache.data_ptr"),
    (_set("v_cache", ptr=POOL + (1 << 30) + 4), "v_cache.data_ptr"),
    (_set("key", strides=(H * D, D, 2)), "key.stride[2]"),
    (_set("key", strides=(H * D + 4, D, 1)), "key.stride[0]"),
    (_set("value", strides=(H * D, D + 4, 1)), "value.stride[1]"),
    (lambda a: {**a, "key": rec(BASE, (1, H, D), strides=(12, D, 1)), "value": rec(BASE + (1 << 24), (1, H, D)),
                "slot_mapping": rec(BASE + (2 << 24), (1,), "int64")}, "key.stride[0]"),  # fixed for every count
    (_set("key", strides=(-H * D, D, 1)), "key.stride[0]"),
    (_set("k_cache", strides=(P * H * D, H * D, D, 2)), "k_cache.stride[3]"),
    (_set("v_cache", strides=(P * H * D + 4, H * D, D, 1)), "v_cache.stride[0]"),
    (_set("k_cache", strides=(0, H * D, D, 1)), "k_cache.stride[0]"),  # a broadcast pool: pages on one address
    (_set("v_cache", ptr=POOL + 4096), "v_cache"),  # the pools overlap
    (_set("k_cache", ptr=BASE), "k_cache"),  # a pool over key
    (_set("v_cache", ptr=BASE + (2 << 24) - 4096), "v_cache"),  # a pool over the slots
]


@pytest.mark.parametrize("mutate, argname", BAD, ids=[n for _, n in BAD])
def test_bad_arguments_name_the_argument(mutate, argname):
    with pytest.raises(ArgumentError) as ei:
        check(mutate(args()))
    assert ei.value.name == argname, str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_bad_kv_layout():
    for layout in ("nhd", "BSHD", "", None):
        with pytest.raises(ArgumentError, match="kv_layout"):
            check(args(), layout)


def test_hnd_pools_given_as_nhd_are_refused():
    a = args("HND")  # [pages, H, P, D] read as NHD: page size H = 4
    with pytest.raises(ArgumentError, match=r"k_cache.shape\[1\]"):
        check(a, "NHD")


# ---- the K/V pool overlap rule ------------------------------------------------------------------------
def _interleaved(layout="NHD", pages=PAGES, page=P):
    """K and V of one [pages, 2, ...] buffer: kv[:, 0] and kv[:, 1] (FlashInfer's and vLLM's layout)."""
    inner = (page, H, D) if layout == "NHD" else (H, page, D)
    full = packed_strides((pages, 2, *inner))
    strides = (full[0], *full[2:])
    shape = (pages, *inner)
    return rec(POOL, shape, strides=strides), rec(POOL + full[1] * 2, shape, strides=strides)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_interleaved_pools_are_apart(layout):
    k, v = _interleaved(layout)
    check({**args(layout), "k_cache": k, "v_cache": v}, layout)


def test_pools_one_element_apart_overlap():
    k, _ = _interleaved()
    for shift in (2, 16, 256):  # v starts inside k's first row, or one row later
        v = rec(k.ptr + shift, k.shape, strides=k.strides)
        with pytest.raises(ArgumentError, match="v_cache"):
            check({**args(), "k_cache": k, "v_cache": v})
    same = {**args(), "k_cache": k, "v_cache": k}
    with pytest.raises(ArgumentError, match="v_cache"):
        check(same)


def test_outputs_apart_is_exact_for_nested_layouts():
    # a [4, 3] row-major block of a [4, 8] buffer and the same block shifted by c columns (in elements)
    a = rec(BASE, (4, 3), "fp32", (8, 1))
    for c in range(-12, 13):
        b = rec(BASE + 4 * c, (4, 3), "fp32", (8, 1))
        overlapping = any(abs((i * 8 + j) - (k * 8 + m + c)) == 0 for i in range(4) for j in range(3)
                          for k in range(4) for m in range(3))
        if overlapping:
            with pytest.raises(ArgumentError):
                V.outputs_apart(a, "a", b, "b")
        else:
            V.outputs_apart(a, "a", b, "b")
    # a shift that is not a whole element: b[0, 0] at bytes 10..14 meets a[0, 2]; at 14..18 nothing
    with pytest.raises(ArgumentError):
        V.outputs_apart(a, "a", rec(BASE + 2 * 4 + 2, (4, 3), "fp32", (8, 1)), "b")
    V.outputs_apart(a, "a", rec(BASE + 3 * 4 + 2, (4, 3), "fp32", (8, 1)), "b")
    # other layouts whose hulls meet are refused
    with pytest.raises(ArgumentError):
        V.outputs_apart(a, "a", rec(BASE + 12, (4, 3), "fp32", (8, 2)), "b")


# ---- plans against the stand-in libcuda ---------------------------------------------------------------------
def _launch(lib):
    """(grid x, grid y, grid z, block x) of the last launch and the launch count."""
    got = _recorded(lib, "stub_launch_args", 12)
    return tuple(got[1:5]), ctypes.c_int.in_dll(lib, "stub_launches").value


def _param(plan, name):
    return plan.launcher.params.slots[name].value


@pytest.mark.parametrize("layout, D_", [("NHD", 128), ("HND", 64), ("NHD", 256)])
def test_plan_grid_follows_the_token_count(stub, layout, D_):
    a = args(layout)
    if D_ != D:
        a = {**a, "key": rec(BASE, (T, H, D_)), "value": rec(BASE + (1 << 24), (T, H, D_)),
             "k_cache": pool(POOL, layout, dim=D_), "v_cache": pool(POOL + (1 << 30), layout, dim=D_)}
    rt = StubRuntime()
    plan = KvWritePlan(rt, *a.values(), kv_layout=layout)
    assert rt.selected == [[{"dtype": "bf16", "head_dim": D_, "kv_dtype": "bf16"}]]  # (16-bit pools: the queries' dtype)
    tpc = family.THREADS // (D_ // 8) * family.ROWS_PER_THREAD
    assert plan.tokens_per_cta == tpc
    assert _param(plan, "page_shift") == 4 and _param(plan, "num_slots") == PAGES * P
    assert _param(plan, "heads_kv") == H
    tok = H * D_ if layout == "NHD" else D_
    assert (_param(plan, "k_stride_page"), _param(plan, "k_stride_token"), _param(plan, "v_stride_token")) == (
        P * H * D_, tok, tok)
    launches = _launch(stub)[1]
    for n in (1, tpc - 1, tpc, tpc + 1, 5000, 0, 3):
        plan.run(BASE, BASE + (1 << 24), BASE + (2 << 24), n, 0)
        grid, count = _launch(stub)
        if n == 0:
            assert count == launches, "0 tokens launched"
            continue
        launches += 1
        assert count == launches and grid == (-(-n // tpc), H, 1, family.THREADS)
        assert _param(plan, "num_tokens") == n


def test_plan_call_checks_rows_pointers_and_overlap(stub):
    rt = StubRuntime()
    a = args(rows=20)
    plan = KvWritePlan(rt, *a.values())
    key, value = a["key"], a["value"]
    for n in (0, 5, 20):
        plan(key, value, rec(BASE + (2 << 24), (n,), "int64"))
        assert _param(plan, "num_tokens") == (n or 7)  # 0: nothing written, nothing launched
    cases = [
        (lambda: plan(key, value, rec(BASE + (2 << 24), (21,), "int64")), "slot_mapping.shape[0]"),
        (lambda: plan(key, rec(value.ptr, (19, H, D)), rec(BASE + (2 << 24), (5,), "int64")), "value.shape[0]"),
        (lambda: plan(rec(BASE, (20, H, D), strides=(2 * H * D, D, 1)), value, rec(BASE + (2 << 24), (5,), "int64")),
         "key.strides"),
        (lambda: plan(key, value, rec(BASE + (2 << 24), (5,), "int32")), "slot_mapping.dtype"),
        (lambda: plan(key, value, rec(BASE + (2 << 24), (5,), "int64", (2,))), "slot_mapping.strides"),
        (lambda: plan(rec(POOL + 4096, (20, H, D)), value, rec(BASE + (2 << 24), (5,), "int64")), "key"),
        (lambda: plan(key, value, rec(POOL + (1 << 30), (5,), "int64")), "slot_mapping"),
        (lambda: plan(rec(BASE + 16 * 3 + 8, (20, H, D)), value, rec(BASE + (2 << 24), (5,), "int64")), "pointers"),
        (lambda: plan.run(BASE, BASE + (1 << 24), BASE + (2 << 24) + 4, 5), "pointers"),
        (lambda: plan.run(BASE, BASE + (1 << 24), BASE + (2 << 24), -1), "num_tokens"),
        (lambda: plan.run(BASE, BASE + (1 << 24), BASE + (2 << 24), MAX_TOKENS + 1), "num_tokens"),
    ]
    launched = _launch(stub)[1]
    for call, name in cases:
        with pytest.raises(ArgumentError) as ei:
            call()
        assert ei.value.name == name, (name, str(ei.value))
    assert _launch(stub)[1] == launched, "a refused call launched"
    # the overlap check covers exactly the rows of this call's tokens: a key whose 6th row would reach
    # the pool is fine for 5 tokens
    row = H * D * 2
    below, value6 = rec(POOL - 5 * row, (6, H, D)), rec(value.ptr, (6, H, D))
    plan(below, value6, rec(BASE + (2 << 24), (5,), "int64"))
    with pytest.raises(ArgumentError) as ei:
        plan(below, value6, rec(BASE + (2 << 24), (6,), "int64"))
    assert ei.value.name == "key"


def test_one_call_api_reuses_the_plan_for_every_token_count(stub):
    rt = StubRuntime()
    a = args(rows=64)
    for n in (64, 1, 17, 0, 40):
        kv_write(rt, a["key"], a["value"], a["k_cache"], a["v_cache"], rec(BASE + (2 << 24), (n,), "int64"))
    assert len(rt.plans) == 1 and len(rt.selected) == 1
    plan = next(iter(rt.plans.values()))
    assert _param(plan, "num_tokens") == 40 and _launch(stub)[0][0] == -(-40 // plan.tokens_per_cta)
    # other pools, another layout or other key strides: another plan
    kv_write(rt, a["key"], a["value"], pool(POOL + (2 << 30)), a["v_cache"], rec(BASE + (2 << 24), (3,), "int64"))
    hnd = args("HND", rows=64)
    kv_write(rt, hnd["key"], hnd["value"], hnd["k_cache"], hnd["v_cache"], rec(BASE + (2 << 24), (3,), "int64"),
             kv_layout="HND")
    assert len(rt.plans) == 3
    with pytest.raises(ArgumentError, match="kv_layout"):
        kv_write(rt, a["key"], a["value"], a["k_cache"], a["v_cache"], rec(BASE + (2 << 24), (3,), "int64"),
                 kv_layout="BHSD")
    assert len(rt.plans) == 3


@pytest.mark.parametrize("layout", [["NHD"], ("NHD",), b"NHD"])
def test_the_one_call_path_checks_kv_layout_before_keying_a_plan_on_it(stub, layout):
    """kv_layout goes into the plan key: a list would raise a bare TypeError (unhashable) there."""
    a, before = args(), _launch(stub)[1]
    with pytest.raises(ArgumentError, match="kv_layout"):
        kv_write(StubRuntime(), *a.values(), kv_layout=layout)
    assert _launch(stub)[1] == before
