"""Runtime.attention's portable paged kernel without a GPU (aotc.runtime.attention_portable, and the sdpa_prefill
family's paged layouts): the family's validity rule as `aotc list --why-not` explains it, an emulation of the
kernel's page gather (its compile-time part is the family's own pass_source) against a direct gather, dispatch
on a real Runtime of stand-in kernels (the Hopper kernel preferred, the portable one where no Hopper one serves
the call on the device), the values and grid a plan launches with, and the refusals. The numbers:
tests/gpu/test_attention_portable.py on the H200."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import aotc.runtime.attention as A
from aotc.cli import main
from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families import get_family
from aotc.families.sdpa_prefill import PAGE_SIZES, TILES, block_pages, pass_source
from aotc.runtime import Runtime, counters, driver, tensor, workspace
from aotc.runtime.attention_portable import HOPPER, PORTABLE
from aotc.runtime.validate import packed_strides
from recorded_launch import record_launches
from recorded_launch import RecordingSlot

GAP = 1 << 36  # between the tensors' base addresses: nothing overlaps
PASS_ROWS = 16  # rows of one cp.async pass of a K/V tile (128 threads, 8 a row)


# ---------------------------------------------------------------------------- the family's paged layouts

def test_paged_layouts_take_general_strides_only():
    fam = get_family(PORTABLE)
    base = {"dtype": "bf16", "head_dim": 128, "causal": True, "window": False, "softcap": False, "sinks": False}
    for page in PAGE_SIZES:
        assert fam.why_invalid({**base, "layout": f"paged{page}", "strides": "general"}) is None
        why = fam.why_invalid({**base, "layout": f"paged{page}", "strides": "packed"})
        assert why.startswith("the packed specialization is for dense layouts") and f"paged{page}" in why
    v = Variant.make(PORTABLE, "sm_80", **base, layout="paged32", strides="general")
    names = [p.name for p in fam.params(v)]
    assert names[:8] == ["q", "k", "v", "o", "lse", "cu_seqlens_q", "seqlens_kv", "page_table"]
    assert {"pages", "max_pages", "min_seqlen_q", "k_stride_page", "v_stride_token", "pt_stride_p"} <= set(names)
    assert fam.launch(v).extra["block_m"] == TILES[128].block_m


def test_list_why_not_explains_packed_paged(tmp_path, capsys):
    spec = tmp_path / "paged.toml"
    spec.write_text('[[family]]\nname = "sdpa_prefill"\narch = ["sm_80"]\ndtype = "bf16"\nhead_dim = 128\n'
                    'layout = ["paged16"]\ncausal = true\nstrides = ["general", "packed"]\n')
    assert main(["list", str(spec), "--why-not", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["variant"]["strides"] for r in doc["variants"]] == ["general"]
    (pruned,) = doc["pruned"]
    assert pruned["values"]["strides"] == "packed" and "K/V rows are gathered through the page table" in pruned["reason"]


# ---------------------------------------------------------------------------- the page gather

def gather_tile(pool, base, s_page, s_tok, pt_row, pages, s_kv, n, bn, page, D, predicated):
    """load_paged_tile (aotc.kernels.sdpa_prefill) in numpy: kv block n's (bn, D) tile from the flat pool, each
    thread's row of each pass as the kernel addresses it; rows it zero-fills stay 0."""
    tile = np.zeros((bn, D), dtype=pool.dtype)
    t0 = n * bn
    col0 = t0 >> (page.bit_length() - 1)
    pgs = [int(pt_row[col0 + j]) if t0 + j * page < s_kv else -1 for j in range(block_pages(page, bn))]
    slot0 = t0 & (page - 1) if page > bn else 0
    for row in range(0, bn, PASS_ROWS):  # thread 0's row of each pass
        j, pass_slot = pass_source(row, page, bn)
        pg = pgs[j]
        for row0 in range(PASS_ROWS):  # each thread's row in the pass
            lim = s_kv - t0 - row0
            if (pg & 0xFFFFFFFF) < pages and (not predicated or row < lim):  # the kernel's unsigned compare
                off = base + pg * s_page + (slot0 + pass_slot) * s_tok + row0 * s_tok
                tile[row + row0] = pool[off:off + D]
    return tile


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("bn", sorted({t.block_n for t in TILES.values()}))
@pytest.mark.parametrize("page", PAGE_SIZES)
def test_the_gather_reads_each_token_s_row_and_zeros_elsewhere(kv_layout, bn, page):
    """Token t < S_kv comes from page_table[t // P] at slot t % P of its KV head; rows past S_kv (the last
    page's tail holds NaN), and the rows of page ids outside [0, pages), are zeros; whole blocks read the same
    without row predicates."""
    rng = np.random.default_rng(page * 1000 + bn)
    D, H_kv, kvh, pages = 64, 3, 2, 64
    shape = (pages, page, H_kv, D) if kv_layout == "NHD" else (pages, H_kv, page, D)
    pool = rng.standard_normal(shape).astype(np.float32)
    s_kv = 5 * bn + 7  # a partial last block; the last page is partial too
    n_pages = -(-s_kv // page)
    pt_row = rng.permutation(pages)[:n_pages + 2].astype(np.int32)  # entries past the sequence: never read
    pt_row[1] = -5 if n_pages > 2 else pt_row[1]  # hostile ids: negative, and past the pool
    pt_row[n_pages - 2] = pages + 9
    last = pt_row[n_pages - 1]
    if kv_layout == "NHD":
        pool[last, s_kv - (n_pages - 1) * page:] = np.nan
        s_page, s_tok, s_head = page * H_kv * D, H_kv * D, D
    else:
        pool[last, :, s_kv - (n_pages - 1) * page:] = np.nan
        s_page, s_tok, s_head = H_kv * page * D, D, page * D
    flat = pool.reshape(-1)

    def want(t):
        if t >= s_kv or not 0 <= int(pt_row[t // page]) < pages:
            return np.zeros(D, np.float32)
        pg = int(pt_row[t // page])
        return pool[pg, t % page, kvh] if kv_layout == "NHD" else pool[pg, kvh, t % page]

    for n in range(-(-s_kv // bn)):
        got = gather_tile(flat, kvh * s_head, s_page, s_tok, pt_row, pages, s_kv, n, bn, page, D, True)
        assert not np.isnan(got).any()
        np.testing.assert_array_equal(got, np.stack([want(n * bn + r) for r in range(bn)]))
        if (n + 1) * bn <= s_kv:  # the kernel's unmasked blocks: in bounds, no row predicate
            np.testing.assert_array_equal(
                gather_tile(flat, kvh * s_head, s_page, s_tok, pt_row, pages, s_kv, n, bn, page, D, False), got)


def test_a_pass_is_one_page_s_consecutive_slots():
    """For any kv-block width a tile might have: pass `row` of the block starting at token t0 reads slots
    slot0 + slot .. + PASS_ROWS - 1 of the block's j-th page, the page and slots of tokens t0 + row .. ."""
    for page in PAGE_SIZES:
        for bn in (16, 32, 64, 128, 256):
            for t0 in range(0, 4 * max(page, bn), bn):
                slot0 = t0 % page if page > bn else 0  # the kernel's t0 & (P - 1)
                for row in range(0, bn, PASS_ROWS):
                    j, slot = pass_source(row, page, bn)
                    assert 0 <= j < block_pages(page, bn) and slot0 + slot + PASS_ROWS <= page
                    assert ((t0 + row) // page, (t0 + row) % page) == (t0 // page + j, slot0 + slot)


# ---------------------------------------------------------------------------- dispatch and launches

def stand_in(family: str, arch: str, **fields):
    """A loaded artifact's stand-in: the variant, its family's parameter list and launch facts."""
    v = Variant.make(family, arch, **fields)
    fam = get_family(family)
    return SimpleNamespace(variant=v, sha256=v.name, abi=fam.abi(v, "kernel"), launch=fam.launch(v))


def portable(page=16, arch="sm_80", dtype="bf16", head_dim=128, **features):
    return stand_in(PORTABLE, arch, dtype=dtype, head_dim=head_dim, layout=f"paged{page}", causal=True,
                    strides="general", **features)


def hopper(page=16, dtype="bf16", head_dim=128, block_n=128):
    return stand_in(HOPPER, "sm_90a", dtype=dtype, head_dim=head_dim, layout=f"paged{page}", causal=True,
                    block_n=block_n)


def decode(page=16, dtype="bf16", head_dim=128):
    return stand_in("sdpa_decode", "sm_90", dtype=dtype, head_dim=head_dim, kv=f"paged{page}", layout="ragged")


class StubDecodePlan:
    """AttentionPlan's decode rows' plan, recorded: what it was made with and its launches."""

    made: list = []

    def __init__(self, runtime, *args, **kw):
        self.kw = kw
        self.workspace = None
        self.launcher = SimpleNamespace(empty=False)
        self.launches = []
        StubDecodePlan.made.append(self)

    def launch_checked(self, *ptrs):
        self.launches.append(ptrs)

    def set_lse_head_stride(self, stride):
        pass


@pytest.fixture
def device(monkeypatch):
    """A device of the compute capability the test sets (dev.cc), and every launch recorded (dev.launches)."""
    dev = SimpleNamespace(cc=(8, 0), launches=record_launches(monkeypatch))
    monkeypatch.setattr(driver, "current_device", lambda: 0)
    monkeypatch.setattr(driver, "compute_capability", lambda d: dev.cc)
    monkeypatch.setattr(A, "multiprocessor_count", lambda d: 132)
    monkeypatch.setattr(A, "DescriptorSlot", RecordingSlot)
    monkeypatch.setattr(A, "DecodePlan", StubDecodePlan)
    # the Hopper paged kernel draws its tiles from a per-stream counter (aotc.runtime.counters): a buffer stand-in
    monkeypatch.setattr(counters, "zeroed_buffer", lambda nbytes, allocate=None: SimpleNamespace(ptr=1 << 40,
                                                                                                 nbytes=nbytes))
    # and its KV splits a workspace of the runtime's split arena (aotc.runtime.workspace): a stand-in too
    monkeypatch.setattr(workspace, "zeroed_buffer", lambda nbytes, allocate=None: SimpleNamespace(ptr=1 << 41,
                                                                                                  nbytes=nbytes))
    monkeypatch.setattr(workspace, "_capturing", lambda stream: False)  # (no driver to ask)
    StubDecodePlan.made = []
    return dev


def step(total_q=300, heads_q=8, heads_kv=2, D=128, page=16, pages=40, batch=3, max_pages=20, kv_layout="NHD",
         dtype="bf16", lse=True):
    """q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, lse of a valid call (packed tensors)."""
    qs = (total_q, heads_q, D)
    kv = (pages, page, heads_kv, D) if kv_layout == "NHD" else (pages, heads_kv, page, D)
    b = 1 << 32
    return (tensor(b, qs, packed_strides(qs), dtype), tensor(b + 2 * GAP, kv, packed_strides(kv), dtype),
            tensor(b + 3 * GAP, kv, packed_strides(kv), dtype), tensor(b + GAP, qs, packed_strides(qs), dtype),
            tensor(b + 4 * GAP, (batch + 1,), (1,), "int32"), tensor(b + 5 * GAP, (batch,), (1,), "int32"),
            tensor(b + 6 * GAP, (batch, max_pages), (max_pages, 1), "int32"),
            tensor(b + 7 * GAP, (heads_q, total_q), (total_q, 1), "fp32") if lse else None)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_without_a_hopper_kernel_the_portable_one_runs_with_pointers_and_strides(device, kv_layout):
    rt = Runtime([portable(page=32)])
    q, k, v, o, cu, sl, pt, ls = step(page=32, kv_layout=kv_layout)
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, kv_layout=kv_layout, max_seqlen_q=300)
    plan = next(iter(rt.plans.values()))
    assert plan.prefill_family == PORTABLE and plan.decode is None and plan.kernel.variant["layout"] == "paged32"
    (got,) = device.launches
    assert (got["q"], got["k"], got["v"], got["o"], got["lse"]) == (q.ptr, k.ptr, v.ptr, o.ptr, ls.ptr)
    assert (got["cu_seqlens_q"], got["seqlens_kv"], got["page_table"]) == (cu.ptr, sl.ptr, pt.ptr)
    token, head = (2 * 128, 128) if kv_layout == "NHD" else (128, 32 * 128)
    for x in "kv":
        assert (got[f"{x}_stride_page"], got[f"{x}_stride_token"], got[f"{x}_stride_head"]) == (32 * 2 * 128, token, head)
    assert (got["q_stride_s"], got["q_stride_h"], got["o_stride_s"], got["o_stride_h"]) == (8 * 128, 128, 8 * 128, 128)
    assert (got["lse_stride_h"], got["lse_stride_s"]) == (300, 1)
    assert (got["pages"], got["max_pages"], got["pt_stride_b"], got["pt_stride_p"]) == (40, 20, 20, 1)
    # no decode kernel: every sequence is the portable kernel's, down to one query
    assert (got["batch"], got["heads_q"], got["heads_kv"], got["min_seqlen_q"], got["write_lse"]) == (3, 8, 2, 1, 1)
    assert got["grid"] == (-(-300 // TILES[128].block_m), 8, 3)


def test_the_grid_follows_each_call_s_bound_on_its_query_counts(device):
    rt = Runtime([portable()])
    q, k, v, o, cu, sl, pt, ls = step(total_q=1000)
    plan = A.AttentionPlan(rt, q, k, v, o, cu, sl, pt, ls, max_seqlen_q=256)
    bm = TILES[128].block_m
    plan(q, o, ls)  # the prepared bound
    plan.checked_run(q.ptr, o.ptr, ls.ptr, max_seqlen_q=700)
    plan.checked_run(q.ptr, o.ptr, ls.ptr, max_seqlen_q=None)  # no bound: the step's token count
    plan.checked_run(q.ptr, o.ptr, ls.ptr, max_seqlen_q=5000)  # a bound past the token count is cut to it
    assert [g["grid"][0] for g in device.launches] == [256 // bm, -(-700 // bm), -(-1000 // bm), -(-1000 // bm)]
    q2, _, _, o2, *_, ls2 = step(total_q=40)
    A.attention(rt, q2, k, v, o2, cu, sl, pt, ls2)  # another plan (no prepared bound), 40 tokens: one m_block
    assert device.launches[-1]["grid"] == (1, 8, 3) and device.launches[-1]["q"] == q2.ptr


def test_a_hopper_kernel_that_serves_the_call_is_preferred(device):
    device.cc = (9, 0)
    rt = Runtime([portable(arch="sm_90"), hopper()])
    q, k, v, o, cu, sl, pt, ls = step()
    A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    plan = next(iter(rt.plans.values()))
    assert plan.prefill_family == HOPPER and "tma_q" in device.launches[-1] and plan.portable is None


@pytest.mark.parametrize("why", ["page size", "arch", "dtype"])
def test_the_portable_kernel_serves_what_the_hopper_ones_do_not(device, why):
    device.cc = (9, 0) if why != "arch" else (8, 9)  # an L40S runs no sm_90a cubin
    page, dtype = (64 if why == "page size" else 16), ("fp16" if why == "dtype" else "bf16")
    # (an sm_80 cubin runs on sm_8x devices only: the sm_90 build is the one for an H100/H200)
    arch = "sm_90" if device.cc == (9, 0) else "sm_80"
    rt = Runtime([hopper(page=16, dtype="bf16"), portable(page=page, arch=arch, dtype=dtype)])
    q, k, v, o, cu, sl, pt, ls = step(page=page, dtype=dtype)
    A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    plan = next(iter(rt.plans.values()))
    assert plan.prefill_family == PORTABLE and "q" in device.launches[-1]


def test_any_gqa_group_runs_on_the_portable_kernel(device):
    """H_q 28 over H_kv 4 (group 7, no divisor of the Hopper kernel's 64-row Q boxes): one query head a CTA."""
    rt = Runtime([portable()])
    q, k, v, o, cu, sl, pt, ls = step(heads_q=28, heads_kv=4)
    A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    got = device.launches[-1]
    assert (got["heads_q"], got["heads_kv"], got["grid"][1]) == (28, 4, 28)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_a_gqa_group_past_the_hopper_kernel_s_q_box_runs_on_the_portable_kernel(device, kv_layout):
    """H_q 128 over one KV head (MQA; group 128 > the Hopper kernel's 64-row Q box): the portable kernel where
    both families are loaded; group 64 stays on the Hopper one; with no portable kernel, the Hopper checks'
    error names the group."""
    device.cc = (9, 0)
    rt = Runtime([portable(arch="sm_90"), hopper()])
    for heads_q, family in ((128, PORTABLE), (64, HOPPER)):
        q, k, v, o, cu, sl, pt, ls = step(heads_q=heads_q, heads_kv=1, kv_layout=kv_layout)
        A.attention(rt, q, k, v, o, cu, sl, pt, ls, kv_layout=kv_layout)
        assert rt.plans[list(rt.plans)[-1]].prefill_family == family, heads_q
    assert device.launches[-2]["heads_q"] == 128 and "tma_q" in device.launches[-1]
    q, k, v, o, cu, sl, pt, ls = step(heads_q=128, heads_kv=1, kv_layout=kv_layout)
    with pytest.raises(ArgumentError, match=r"H_q / H_kv.*128.*1 to 64"):
        A.attention(Runtime([hopper()]), q, k, v, o, cu, sl, pt, ls, kv_layout=kv_layout)


def test_the_decode_rows_still_go_to_the_decode_kernel(device):
    device.cc = (9, 0)
    rt = Runtime([portable(arch="sm_90"), decode()])
    q, k, v, o, cu, sl, pt, ls = step()
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, max_seqlen_q=2048)
    (dec,) = StubDecodePlan.made
    assert dec.kw["decode_query_len"] == 4 and len(dec.launches) == 1
    got = device.launches[-1]
    assert got["min_seqlen_q"] == 5 and got["grid"][0] == -(-300 // TILES[128].block_m)
    # a step of decode rows only (its bound at most decode_query_len): no portable launch
    n = len(device.launches)
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, max_seqlen_q=4)
    assert len(device.launches) == n and len(dec.launches) == 2


def test_a_lower_bound_past_the_decode_rows_gives_the_paged_kernel_every_row(device):
    """min_seqlen_q > decode_query_len (a step an engine knows holds no decode row): the decode kernel is not
    launched, and the paged kernel takes every sequence of 1 query or more, so a wrong bound costs speed, never
    rows; a bound at or below decode_query_len, or none, launches both as before. A plan's prepared bound is its
    calls' default."""
    device.cc = (9, 0)
    rt = Runtime([portable(arch="sm_90"), decode()])
    q, k, v, o, cu, sl, pt, ls = step()
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, max_seqlen_q=2048, min_seqlen_q=5)
    (dec,) = StubDecodePlan.made
    assert not dec.launches and device.launches[-1]["min_seqlen_q"] == 1
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, max_seqlen_q=2048, min_seqlen_q=4)
    assert len(dec.launches) == 1 and device.launches[-1]["min_seqlen_q"] == 5
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, max_seqlen_q=2048)
    assert len(dec.launches) == 2 and device.launches[-1]["min_seqlen_q"] == 5
    plan = A.AttentionPlan(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, min_seqlen_q=2000)
    plan(q, o, ls)  # the prepared bound
    assert len(StubDecodePlan.made[-1].launches) == 0 and device.launches[-1]["min_seqlen_q"] == 1
    plan.checked_run(q.ptr, o.ptr, ls.ptr, min_seqlen_q=None)  # this step: no bound
    assert len(StubDecodePlan.made[-1].launches) == 1 and device.launches[-1]["min_seqlen_q"] == 5
    n = len(device.launches)
    # bounds that contradict each other (max_seqlen_q says decode rows only): the decode kernel's launch alone
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, decode_query_len=4, max_seqlen_q=4, min_seqlen_q=5)
    assert len(device.launches) == n and len(dec.launches) == 3



def test_the_paged_kernel_runs_its_widest_kv_tile_from_its_launch_fact(device):
    """max_seqlen_kv at or past the 176-key tile's launch fact picked_from_seqlen_kv (4096 paged, half dense
    prefill's 8192) picks it, a smaller bound or none the 128-key one; the choice is part of the one-call path's plan
    key, so both plans stay cached, and bounds on one side of the fact share a plan."""
    device.cc = (9, 0)
    rt = Runtime([hopper(block_n=128), hopper(block_n=176)])
    long_kv = rt.kernels[A.FAMILY][1].recorded_fact(A.PICKED_FROM)
    assert long_kv == 4096 and rt.fact_bounds(A.FAMILY, A.PICKED_FROM, 0) == (4096,)
    q, k, v, o, cu, sl, pt, ls = step(max_pages=1 << 16)  # a page table that holds the largest bound's keys
    bounds = (None, 2048, long_kv - 1, long_kv, 1 << 20)
    widths = [A.AttentionPlan(rt, q, k, v, o, cu, sl, pt, ls, max_seqlen_kv=b).kernel.variant["block_n"]
              for b in bounds]
    assert widths == [128, 128, 128, 176, 176]
    for b in bounds:
        A.attention(rt, q, k, v, o, cu, sl, pt, ls, max_seqlen_kv=b)
    assert sorted(p.kernel.variant["block_n"] for p in set(rt.plans.values())) == [128, 176]

@pytest.mark.parametrize("bad", [-1, True, 2.0, "5"])
def test_a_bad_lower_bound_is_an_argument_error(device, bad):
    rt = Runtime([portable(arch="sm_90"), decode()])
    q, k, v, o, cu, sl, pt, ls = step()
    with pytest.raises(ArgumentError, match="min_seqlen_q"):
        A.attention(rt, q, k, v, o, cu, sl, pt, ls, min_seqlen_q=bad)
    assert not device.launches


def test_dense_kv_takes_the_portable_page_sizes(device, monkeypatch):
    monkeypatch.setattr(driver, "DeviceBuffer", lambda nbytes: SimpleNamespace(ptr=1 << 45, nbytes=nbytes))
    monkeypatch.setattr(driver, "copy_to_device", lambda ptr, data: None)
    rt = Runtime([portable(page=64)])
    q, _, _, o, cu, sl, _, ls = step()
    shape = (3, 256, 2, 128)
    k = tensor(1 << 40, shape, packed_strides(shape), "bf16")
    v = tensor((1 << 40) + GAP, shape, packed_strides(shape), "bf16")
    A.attention(rt, q, k, v, o, cu, sl, None, ls)
    got = device.launches[-1]
    assert got["page_table"] == 1 << 45 and got["max_pages"] == 4 and got["k_stride_page"] == 64 * 2 * 128


# ---------------------------------------------------------------------------- refusals

def test_a_page_size_no_portable_kernel_serves_is_refused(device):
    rt = Runtime([portable(page=16), portable(page=128)])
    q, k, v, o, cu, sl, pt, ls = step(page=32)
    with pytest.raises(ArgumentError) as e:
        A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    assert e.value.name == "k_cache.shape[1]" and e.value.value == 32 and "[16, 128]" in e.value.expected
    assert not device.launches


@pytest.mark.parametrize("name,kw", [("B", {"batch": 65536, "max_pages": 1}), ("H_q", {"heads_q": 65536, "heads_kv": 1}),
                                     ("k_cache.shape[0]", {"pages": 1 << 31, "D": 64})])
def test_the_grid_s_y_and_z_limits_and_a_32_bit_page_count(device, name, kw):
    rt = Runtime([portable()])
    q, k, v, o, cu, sl, pt, ls = step(**{"lse": False, **kw})
    with pytest.raises(ArgumentError) as e:
        A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    assert e.value.name == name and ("at most 65535" in e.value.expected or "at most 2147483647" in e.value.expected)
    assert not device.launches


def test_features_no_kernel_has_name_both_families(device):
    rt = Runtime([portable()])
    q, k, v, o, cu, sl, pt, ls = step()
    with pytest.raises(ArgumentError) as e:
        A.attention(rt, q, k, v, o, cu, sl, pt, ls, softcap=30.0)
    assert e.value.name == "softcap" and f"{HOPPER} or {PORTABLE}" in e.value.expected
    rt = Runtime([portable(softcap=True)])
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, softcap=30.0)  # the kernel with the feature
    assert device.launches[-1]["softcap"] == pytest.approx(30.0)


def test_a_misaligned_q_names_the_q_pointer(device):
    rt = Runtime([portable()])
    q, k, v, o, cu, sl, pt, ls = step()
    plan = A.AttentionPlan(rt, q, k, v, o, cu, sl, pt, ls)
    with pytest.raises(ArgumentError) as e:
        plan.run(q.ptr + 8, o.ptr, ls.ptr)
    assert e.value.name == "pointers" and "q 16 bytes" in e.value.expected
    assert not device.launches


# ---------------------------------------------------------------------------- capabilities

def test_capabilities_report_attention_served_by_the_portable_kernels_alone():
    rt = Runtime([portable(page=p, arch="sm_90") for p in (16, 64)] + [decode()])
    a = rt.capabilities(arch="sm_90a")["entry_points"]["attention"]
    assert a["supported"] and a["page_sizes"] == [16, 64] and a["kv_layouts"] == ["NHD", "HND"]
    assert a["kernels"] == 2 and [s["family"] for s in a["served_by"]] == [PORTABLE, "sdpa_decode"]
    assert rt.capabilities(arch="sm_80")["entry_points"]["attention"]["supported"] is False  # sm_90 cubins
    prefill = rt.capabilities(arch="sm_90a")["entry_points"]["prefill"]
    assert not prefill["supported"]  # paged kernels are not the dense entry point's


def test_the_portable_kernel_is_asked_for_the_cache_s_kv_dtype():
    """portable_fields keeps the call's kv_dtype: an fp8 cache finds only fp8 kernels, a 16-bit one only 16-bit
    ones (a record from before the family had the field reads as the queries' dtype: Runtime._first_match)."""
    from aotc.runtime.attention_portable import portable_fields

    wanted = {"dtype": "bf16", "head_dim": 128, "layout": "paged16", "causal": True}
    for kv in ("fp8_e4m3", "bf16"):
        assert portable_fields({**wanted, "kv_dtype": kv}) == [{**wanted, "kv_dtype": kv, "strides": "general"}]


# ---------------------------------------------------------------------------- fp8 KV

def test_fp8_kv_is_for_the_paged_layouts():
    fam = get_family(PORTABLE)
    base = {"dtype": "bf16", "causal": True, "strides": "general", "window": False, "softcap": False,
            "sinks": False, "kv_dtype": "fp8_e4m3"}
    for arch in ("sm_89", "sm_90", "sm_100a", "sm_120a"):
        for D in (64, 128, 256):
            assert fam.why_invalid({**base, "arch": arch, "head_dim": D, "layout": "paged16"}) is None
    why = fam.why_invalid({**base, "arch": "sm_90", "head_dim": 128, "layout": "ragged"})
    assert "for the paged layouts" in why and "not ragged" in why
    assert "e4m3 conversions" in fam.why_invalid({**base, "arch": "sm_80", "head_dim": 128, "layout": "paged16"})
    assert "must be the dtype" in fam.why_invalid({**base, "kv_dtype": "fp16", "arch": "sm_90", "head_dim": 128,
                                                   "layout": "paged16"})
    v = Variant.make(PORTABLE, "sm_90", **{**base, "head_dim": 128, "layout": "paged32"})
    assert [p.name for p in fam.params(v)][-3:] == ["k_descale", "v_descale", "descale_stride_h"]
    for D in (64, 128, 256):
        t = TILES[D]
        v = Variant.make(PORTABLE, "sm_90", **{**base, "head_dim": D, "layout": "paged32"})
        # e4m3 K and V tiles: half the bytes of the 16-bit ones, at least 128 bytes a row (D64's fill half of it)
        assert fam.launch(v).dynamic_smem == t.block_m * D * 2 + 2 * t.block_n * max(D, 128)
        v16 = Variant.make(PORTABLE, "sm_90", **{**base, "kv_dtype": "bf16", "head_dim": D, "layout": "paged32"})
        assert fam.launch(v16).dynamic_smem == (t.block_m + 2 * t.block_n) * D * 2


def fp8_step(heads_kv=2, scale_heads=None, **kw):
    """step() over e4m3 pools (their strides in bytes, multiples of 16) with fp32 scales [H_kv] (or [1])."""
    q, k, v, o, cu, sl, pt, ls = step(heads_kv=heads_kv, **kw)
    k8, v8 = (tensor(x.ptr, x.shape, x.strides, "fp8_e4m3") for x in (k, v))
    n = heads_kv if scale_heads is None else scale_heads
    ks = tensor((1 << 32) + 8 * GAP, (n,), (1,), "fp32")
    vs = tensor((1 << 32) + 9 * GAP, (n,), (1,), "fp32")
    return q, k8, v8, o, cu, sl, pt, ls, ks, vs


@pytest.mark.parametrize("cc,arch", [((8, 9), "sm_89"), ((9, 0), "sm_90")])
@pytest.mark.parametrize("scale_heads", [None, 1])
def test_an_fp8_cache_runs_on_the_portable_kernel_with_its_scales(device, cc, arch, scale_heads):
    """Where no Hopper kernel serves it (an L40S; an H100 whose bundle has no fp8 D256 or D64-class Hopper kernel),
    an fp8 call runs the portable fp8 kernel with the scales' pointers (per head: stride 1; one for all: 0) and
    the pools' strides in bytes; the same call over bf16 pools is not given the fp8 kernel."""
    device.cc = cc
    rt = Runtime([portable(arch=arch, kv_dtype="fp8_e4m3"), hopper(dtype="bf16")])
    q, k, v, o, cu, sl, pt, ls, ks, vs = fp8_step(scale_heads=scale_heads)
    A.attention(rt, q, k, v, o, cu, sl, pt, ls, k_descale=ks, v_descale=vs)
    plan = next(iter(rt.plans.values()))
    assert plan.prefill_family == PORTABLE and plan.kernel.variant["kv_dtype"] == "fp8_e4m3"
    got = device.launches[-1]
    assert (got["k_descale"], got["v_descale"], got["descale_stride_h"]) == (ks.ptr, vs.ptr, 0 if scale_heads else 1)
    assert (got["k"], got["v"], got["k_stride_token"]) == (k.ptr, v.ptr, 2 * 128)
    q, k16, v16, o, cu, sl, pt, ls = step()
    if cc == (9, 0):  # the bf16 Hopper kernel takes the 16-bit call
        A.attention(rt, q, k16, v16, o, cu, sl, pt, ls)
        assert rt.plans[list(rt.plans)[-1]].prefill_family == HOPPER
    else:
        with pytest.raises(ArgumentError, match="kernel"):
            A.attention(rt, q, k16, v16, o, cu, sl, pt, ls)


def test_a_16_bit_cache_passes_no_scales_to_the_portable_kernel(device):
    rt = Runtime([portable()])
    q, k, v, o, cu, sl, pt, ls = step()
    A.attention(rt, q, k, v, o, cu, sl, pt, ls)
    got = device.launches[-1]
    assert (got["k_descale"], got["v_descale"], got["descale_stride_h"]) == (0, 0, 0)
