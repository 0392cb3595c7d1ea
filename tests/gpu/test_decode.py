"""sdpa_decode (its chunks merged in the same launch) on the GPU against an fp32 torch reference.

The reference gathers each sequence's keys and values through the page table into dense
[S_kv, H_kv, D] tensors and runs softmax(QK^T*scale + causal mask) V in fp32, the causal mask
aligned bottom-right (new token i sees keys j <= S_kv - S_q + i). Tolerances as for prefill:
fp16 4e-3/4e-3, bf16 2e-2/2e-2, LSE 2e-3/2e-3. Outputs are NaN-poisoned before each step.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from common import check_close
from paged_cases import PagedCache, decode_reference

pytestmark = pytest.mark.gpu

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {"fp16": (4e-3, 4e-3), "bf16": (2e-2, 2e-2)}
LSE_TOL = (2e-3, 2e-3)


def decode_variants(rt, kv=None):
    vs = sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["kv"]) for k in rt.kernels.get("sdpa_decode", [])})
    return [v for v in vs if kv is None or v[2] == kv]


def reference(q, k, v, scale):
    """q [S_q, H_q, D], k/v [S_kv, H_kv, D] -> O [S_q, H_q, D], LSE [H_q, S_q] (fp32, causal bottom-right)."""
    return decode_reference(q, k, v, scale)


def run_and_check(rt, cache, q, out, lse, chunks, what, workspace=None):
    """chunks: the plan's target chunk count (None: the default, one wave); workspace None: the plan's own."""
    B, S_q, H_q, D = q.shape
    dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
    max_len = max(cache.lengths)
    plan = rt.prepare_decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, max_seqlen_kv=max_len,
                             kv_layout=cache.layout, chunks=chunks, workspace=workspace)
    out.fill_(math.nan)
    if lse is not None:
        lse.fill_(math.nan)
    plan(q, out, lse, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    scale = 1.0 / math.sqrt(D)
    for b in range(B):
        k, v = cache.dense(b)
        ro, rl = reference(q[b], k, v, scale)
        check_close(out[b], ro, TOL[dtype], f"O {what} b={b} L={cache.lengths[b]} chunks={plan.chunks}")
        if lse is not None:
            check_close(lse[b], rl, LSE_TOL, f"LSE {what} b={b} chunks={plan.chunks}")
    return plan


LENGTHS = [0, 1, 15, 16, 17, 1000, 32768]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("S_q", [1, 4])
def test_decode_paged_all_variants(rt, layout, S_q):
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    assert variants, "the default bundle has no paged sdpa_decode kernels"
    gen = torch.Generator(device="cuda").manual_seed(S_q + (layout == "HND"))
    for dtype, D, kv in variants:
        page = int(kv[len("paged"):])
        cache = PagedCache(LENGTHS, page, 2, D, dtype, layout, gen)
        B, H_q = len(LENGTHS), 8
        q = torch.randn(B, S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
        out = torch.empty_like(q)
        lse = torch.empty(B, H_q, S_q, device="cuda")
        for chunks in (1, 2, 7, None):
            run_and_check(rt, cache, q, out, lse, chunks, f"{dtype} D{D} {kv} {layout} S_q={S_q}")


def test_decode_dense_kv_and_padded_outputs(rt):
    variants = decode_variants(rt, "dense")
    if not variants:
        pytest.skip("no dense-KV decode kernels in the bundle")
    gen = torch.Generator(device="cuda").manual_seed(5)
    # MQA over [B, S, H_kv, D]; GQA over [B, H_kv, S, D] (the same tensors transposed: HND reads their strides)
    for (dtype, D, _), (layout, H_kv) in itertools.product(variants, (("NHD", 1), ("HND", 2))):
        B, S, H_q, S_q = 3, 700, 16, 2
        k = torch.randn(B, S, H_kv, D, dtype=DT[dtype], device="cuda", generator=gen)
        v = torch.randn(B, S, H_kv, D, dtype=DT[dtype], device="cuda", generator=gen)
        lengths = [700, 0, 333]

        class Dense:
            pass

        cache = Dense()
        cache.k, cache.v = (k, v) if layout == "NHD" else (k.transpose(1, 2), v.transpose(1, 2))
        cache.lengths, cache.layout = lengths, layout
        cache.page_table = None
        cache.seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        cache.dense = lambda b: (k[b, : lengths[b]], v[b, : lengths[b]])
        q = torch.randn(B, S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
        out_buf = torch.empty(B, S_q, H_q + 2, D + 8, dtype=DT[dtype], device="cuda")
        out = out_buf[:, :, :H_q, :D]
        lse = torch.empty(B, H_q, S_q + 3, device="cuda")[:, :, :S_q]
        for chunks in (1, 3, None):
            run_and_check(rt, cache, q, out, lse, chunks, f"dense {layout} {dtype} D{D}")


def test_decode_page_table_batch_stride_beyond_int32(rt):
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    dtype, D, kv = variants[0]
    gen = torch.Generator(device="cuda").manual_seed(9)
    cache = PagedCache([100, 37], int(kv[len("paged"):]), 2, D, dtype, "NHD", gen, pt_batch_stride=(1 << 31) + 64)
    q = torch.randn(2, 1, 4, D, dtype=DT[dtype], device="cuda", generator=gen)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 1, device="cuda")
    run_and_check(rt, cache, q, out, lse, 2, "page table stride > 2^31")
    del cache
    torch.cuda.empty_cache()


def test_decode_cuda_graph_replay_with_changed_inputs(rt):
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    dtype, D, kv = variants[-1]
    gen = torch.Generator(device="cuda").manual_seed(13)
    final = [900 + 51, 64 + 51, 3000 + 51, 1 + 51]  # pages for the longest step; each step grows by 17
    cache = PagedCache(final, int(kv[len("paged"):]), 8, D, dtype, "NHD", gen)
    cache.lengths = [900, 64, 3000, 1]
    cache.seqlens.copy_(torch.tensor(cache.lengths, dtype=torch.int32))
    B, H_q, S_q = 4, 32, 1
    q = torch.randn(B, S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
    out = torch.empty_like(q)
    lse = torch.empty(B, H_q, S_q, device="cuda")
    nbytes = rt.decode_workspace_bytes(B, S_q, H_q, D, 4)
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    plan = rt.prepare_decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse,
                             max_seqlen_kv=max(final), chunks=4, workspace=ws)
    plan(q, out, lse, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(q, out, lse, stream=torch.cuda.current_stream())
    for step in range(3):
        q.copy_(torch.randn(q.shape, dtype=q.dtype, device="cuda", generator=gen))
        cache.lengths = [L + 17 * (step + 1) for L in [900, 64, 3000, 1]]
        cache.seqlens.copy_(torch.tensor(cache.lengths, dtype=torch.int32))
        out.fill_(math.nan), lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        for b in range(B):
            k, v = cache.dense(b)
            ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
            check_close(out[b], ro, TOL[dtype], f"graph step {step} b={b}")
            check_close(lse[b], rl, LSE_TOL, f"graph step {step} LSE b={b}")


def counters_tail(ws, n_counters):
    """The int32 split counters a plan keeps in its workspace's last bytes (see aotc.runtime.decode)."""
    return ws[ws.numel() - (n_counters * 4 + 15) // 16 * 16:].view(torch.int32)[-n_counters:]


def test_decode_back_to_back_steps(rt):
    """Steps enqueued without a sync in between, each with its own Q and O, over a workspace whose bytes
    start as garbage: preparing zeroes the split counters, each step's last split must merge exactly
    its own step's partials and leave the counters at zero for the next step."""
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    dtype, D, kv = variants[0]
    gen = torch.Generator(device="cuda").manual_seed(21)
    cache = PagedCache([5000, 37, 1200], int(kv[len("paged"):]), 4, D, dtype, "NHD", gen)
    B, H_q, S_q, steps = 3, 16, 1, 6
    qs = [torch.randn(B, S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen) for _ in range(steps)]
    outs = [torch.full_like(qs[0], math.nan) for _ in range(steps)]
    lses = [torch.full((B, H_q, S_q), math.nan, device="cuda") for _ in range(steps)]
    ws = torch.full((rt.decode_workspace_bytes(B, S_q, H_q, D, 7),), 0x7F, dtype=torch.uint8, device="cuda")
    plan = rt.prepare_decode(qs[0], cache.k, cache.v, outs[0], cache.seqlens, cache.page_table, lses[0],
                             max_seqlen_kv=5000, chunks=7, workspace=ws)
    n_counters = B * 4  # B x H_kv x one row tile (4 query heads per KV head)
    assert not counters_tail(ws, n_counters).any(), "prepare_decode zeroes the split counters"
    for q, out, lse in zip(qs, outs, lses):
        plan(q, out, lse, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    for i, (q, out, lse) in enumerate(zip(qs, outs, lses)):
        for b in range(B):
            k, v = cache.dense(b)
            ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
            check_close(out[b], ro, TOL[dtype], f"step {i} b={b}")
            check_close(lse[b], rl, LSE_TOL, f"step {i} LSE b={b}")
    assert not counters_tail(ws, n_counters).any(), "every step leaves the split counters at zero"


def test_decode_plans_sharing_one_workspace(rt):
    """Two plans of different shapes and chunk counts alternate on one stream over one workspace sized
    for the larger of each (rows and chunks): one plan's partials never reach the other's counters."""
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    dtype, D, kv = variants[-1]
    page = int(kv[len("paged"):])
    gen = torch.Generator(device="cuda").manual_seed(33)
    big = PagedCache([3000, 0, 17, 999, 2048], page, 2, D, dtype, "HND", gen)  # 5 x 16 rows, 5 chunks
    small = PagedCache([20000], page, 8, D, dtype, "HND", gen)                # 1 x 32 rows, 24 chunks
    qb = torch.randn(5, 1, 16, D, dtype=DT[dtype], device="cuda", generator=gen)
    qs = torch.randn(1, 1, 32, D, dtype=DT[dtype], device="cuda", generator=gen)
    ws = torch.full((rt.decode_workspace_bytes(5, 1, 32, D, 24),), 0x55, dtype=torch.uint8, device="cuda")
    assert ws.numel() >= rt.decode_workspace_bytes(1, 1, 32, D, 24) and ws.numel() >= rt.decode_workspace_bytes(5, 1, 16, D, 5)
    ob, os_ = torch.empty_like(qb), torch.empty_like(qs)
    lb, ls = torch.empty(5, 16, 1, device="cuda"), torch.empty(1, 32, 1, device="cuda")
    pb = rt.prepare_decode(qb, big.k, big.v, ob, big.seqlens, big.page_table, lb, max_seqlen_kv=3000,
                           kv_layout="HND", chunks=5, workspace=ws)
    ps = rt.prepare_decode(qs, small.k, small.v, os_, small.seqlens, small.page_table, ls, max_seqlen_kv=20000,
                           kv_layout="HND", chunks=24, workspace=ws)
    results = []
    for step in range(3):
        for plan, q, cache in ((pb, qb, big), (ps, qs, small)):
            o = torch.full_like(q, math.nan)
            lse = torch.full((q.shape[0], q.shape[2], 1), math.nan, device="cuda")
            plan(q, o, lse, stream=torch.cuda.current_stream())
            results.append((q, o, lse, cache, step))
    torch.cuda.synchronize()
    for q, o, lse, cache, step in results:
        for b in range(q.shape[0]):
            k, v = cache.dense(b)
            ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
            check_close(o[b], ro, TOL[dtype], f"shared workspace step {step} B={q.shape[0]} b={b}")
            check_close(lse[b], rl, LSE_TOL, f"shared workspace step {step} LSE B={q.shape[0]} b={b}")


def test_decode_bad_arguments(rt):
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    dtype, D, kv = variants[0]
    gen = torch.Generator(device="cuda").manual_seed(1)
    cache = PagedCache([50, 60], int(kv[len("paged"):]), 2, D, dtype, "NHD", gen)
    q = torch.randn(2, 1, 4, D, dtype=DT[dtype], device="cuda")
    out = torch.full_like(q, math.nan)
    ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    common = dict(max_seqlen_kv=60, workspace=ws)
    cases = [
        (lambda: rt.decode(q.float(), cache.k, cache.v, out, cache.seqlens, cache.page_table, **common), "q.dtype"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens.long(), cache.page_table, **common), "seqlens_kv"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table.long(), **common), "page_table"),
        (lambda: rt.decode(torch.randn(2, 17, 4, D, dtype=q.dtype, device="cuda"), cache.k, cache.v,
                           torch.empty(2, 17, 4, D, dtype=q.dtype, device="cuda"), cache.seqlens, cache.page_table,
                           **common), "q.shape[1]"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, max_seqlen_kv=10**6,
                           workspace=ws), "page_table.shape[1]"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, max_seqlen_kv=60,
                           chunks=8, workspace=ws[:16]), "workspace"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, chunks=0), "chunks"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse=torch.empty(
            2, 4, 1, device="cuda").as_strided((2, 4, 1), (0, 0, 1))), "lse"),
        (lambda: rt.decode(q, cache.k, cache.v, torch.empty(2, 1, 4, D, dtype=q.dtype, device="cuda").as_strided(
            (2, 1, 4, D), (0, 4 * D, D, 1)), cache.seqlens, cache.page_table), "out"),
        (lambda: rt.decode(q, cache.k, cache.v, q, cache.seqlens, cache.page_table, **common), "out"),  # out is q
    ]
    for call, name in cases:
        with pytest.raises((ArgumentError, TypeError, ValueError)) as ei:
            call()
        assert name in str(ei.value), (name, str(ei.value))
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call launched"


def test_decode_plan_call_after_a_checked_call_still_refuses_other_tensors(rt):
    """Plan(tensors) compares torch layouts with those of the last call it checked in full and then needs
    only pointers: tensors laid out otherwise, on another dtype, or an out that is q must still be refused."""
    dtype, D, kv = [v for v in decode_variants(rt) if v[2] != "dense"][0]
    gen = torch.Generator(device="cuda").manual_seed(2)
    cache = PagedCache([70, 33], int(kv[len("paged"):]), 2, D, dtype, "NHD", gen)
    q = torch.randn(2, 1, 4, D, dtype=DT[dtype], device="cuda", generator=gen)
    out, lse = torch.empty_like(q), torch.empty(2, 4, 1, device="cuda")
    plan = rt.prepare_decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, max_seqlen_kv=70)
    for _ in range(2):  # the second call takes the compared-layouts path
        plan(q, out, lse, stream=torch.cuda.current_stream())
    q2 = torch.randn_like(q)
    out2 = torch.full_like(q, math.nan)
    lse2 = torch.full_like(lse, math.nan)
    plan(q2, out2, lse2, stream=torch.cuda.current_stream())  # new pointers, same layouts: runs
    torch.cuda.synchronize()
    for b in range(2):
        k, v = cache.dense(b)
        ro, rl = reference(q2[b], k, v, 1.0 / math.sqrt(D))
        check_close(out2[b], ro, TOL[dtype], f"fast path O b={b}")
        check_close(lse2[b], rl, LSE_TOL, f"fast path LSE b={b}")
    wide = torch.full((2, 1, 4, D + 8), math.nan, dtype=q.dtype, device="cuda")[..., :D]
    cases = [
        (lambda: plan(q, wide, lse), "out.strides"),  # padded strides
        (lambda: plan(q.float(), out, lse), "q"),
        (lambda: plan(q, out, None), "lse"),
        (lambda: plan(q, q, lse), "out"),  # out overlaps q
        (lambda: plan(q, out, q), "lse"),
    ]
    for call, name in cases:
        with pytest.raises(ArgumentError) as ei:
            call(), torch.cuda.synchronize()
        assert name in str(ei.value), (name, str(ei.value))
    torch.cuda.synchronize()
    assert torch.isnan(wide).all(), "a refused call launched"


def test_runtime_decode_one_call_fast_path_still_refuses_other_tensors(rt):
    """Runtime.decode keys its plan cache by torch layouts and the caches' pointers: a repeated layout with
    new q/out/lse pointers launches correctly, and tensors laid out otherwise or overlapping are refused."""
    dtype, D, kv = [v for v in decode_variants(rt) if v[2] != "dense"][0]
    gen = torch.Generator(device="cuda").manual_seed(3)
    cache = PagedCache([90, 1, 0], int(kv[len("paged"):]), 2, D, dtype, "HND", gen)
    stream = torch.cuda.current_stream()
    for step in range(3):  # the first call prepares, the later ones take the fast path with new tensors
        q = torch.randn(3, 1, 8, D, dtype=DT[dtype], device="cuda", generator=gen)
        out = torch.full_like(q, math.nan)
        lse = torch.full((3, 8, 1), math.nan, device="cuda")
        rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, kv_layout="HND", stream=stream)
        torch.cuda.synchronize()
        for b in range(3):
            k, v = cache.dense(b)
            ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
            check_close(out[b], ro, TOL[dtype], f"step {step} O b={b}")
            check_close(lse[b], rl, LSE_TOL, f"step {step} LSE b={b}")
    in_out = out.view(-1).view(torch.float32)[:24].view(3, 8, 1)  # laid out as lse, in out's bytes
    in_k = cache.k.view(-1)[:48].view(torch.float32).view(3, 8, 1)  # laid out as lse, in the K cache
    poisoned = out.clone()
    cases = [
        (lambda: rt.decode(q, cache.k, cache.v, q, cache.seqlens, cache.page_table, lse, kv_layout="HND"), "out"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, in_out, kv_layout="HND"), "lse"),
        (lambda: rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, in_k, kv_layout="HND"), "lse"),
        (lambda: rt.decode(q.float(), cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, kv_layout="HND"),
         "q"),
    ]
    for call, name in cases:
        with pytest.raises(ArgumentError) as ei:
            call(), torch.cuda.synchronize()
        assert name in str(ei.value), (name, str(ei.value))
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), poisoned.view(torch.int16)), "a refused call launched"


SKEWED = [0, 1, 15, 16, 17, 32768, 40000] + [3, 64, 100, 255, 511, 1000, 2047, 4096] * 2


@pytest.mark.parametrize("S_q", [1, 4])
def test_decode_skewed_batches(rt, S_q):
    """Lengths 0, 1, 15, 16, 17 beside 32768 and 40000 and a tail of short ones in one batch, every head dim
    and page size, both pool layouts: the chunk partition (long sequences in many chunks, short ones in one)
    computes every sequence's attention; outputs NaN-poisoned, LSE checked."""
    variants = [v for v in decode_variants(rt) if v[2] != "dense" and v[0] == "bf16"]
    gen = torch.Generator(device="cuda").manual_seed(40 + S_q)
    for i, (dtype, D, kv) in enumerate(variants):
        layout = ("NHD", "HND")[i % 2]
        cache = PagedCache(SKEWED, int(kv[len("paged"):]), 4, D, dtype, layout, gen)
        B, H_q = len(SKEWED), 16
        q = torch.randn(B, S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
        out, lse = torch.empty_like(q), torch.empty(B, H_q, S_q, device="cuda")
        plan = run_and_check(rt, cache, q, out, lse, None, f"skewed {dtype} D{D} {kv} {layout} S_q={S_q}")
        assert plan.chunks > 1 and plan.workspace_bytes > 0  # the default splits the long sequences
        del cache
    torch.cuda.empty_cache()


def test_decode_graph_replay_with_the_distribution_moving(rt):
    """One CUDA graph captured with the long sequence in slot 0, replayed with it in slot 5, then with every
    length growing by one per step: the partition follows the device-side lengths at every replay (no
    schedule frozen at capture). The plan's own workspace."""
    variants = [v for v in decode_variants(rt) if v[2] == "paged16" and v[0] == "bf16"]
    dtype, D, kv = variants[0]
    gen = torch.Generator(device="cuda").manual_seed(77)
    B, H_q, H_kv, S_q = 8, 32, 8, 1
    cache = PagedCache([33000] * B, 16, H_kv, D, dtype, "NHD", gen)  # every slot can hold the long sequence
    first = [32768] + [512] * 7
    cache.lengths = list(first)
    cache.seqlens.copy_(torch.tensor(first, dtype=torch.int32))
    q = torch.randn(B, S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
    out, lse = torch.empty_like(q), torch.empty(B, H_q, S_q, device="cuda")
    plan = rt.prepare_decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse)
    plan(q, out, lse, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(q, out, lse, stream=torch.cuda.current_stream())
    moved = [512] * 5 + [32768] + [512] * 2
    steps = [first, moved] + [[n + k for n in moved] for k in (1, 2, 3)] + [[0, 1, 15, 16, 17, 32999, 3, 4]]
    for step, lengths in enumerate(steps):
        q.copy_(torch.randn(q.shape, dtype=q.dtype, device="cuda", generator=gen))
        cache.lengths = list(lengths)
        cache.seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(math.nan), lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        for b in range(B):
            k, v = cache.dense(b)
            ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
            check_close(out[b], ro, TOL[dtype], f"replay {step} lengths {lengths} b={b}")
            check_close(lse[b], rl, LSE_TOL, f"replay {step} LSE b={b}")
    del cache
    torch.cuda.empty_cache()


def test_decode_one_chunk_needs_no_workspace(rt):
    variants = [v for v in decode_variants(rt) if v[2] != "dense"]
    dtype, D, kv = variants[0]
    gen = torch.Generator(device="cuda").manual_seed(5)
    cache = PagedCache([5000, 3, 0], int(kv[len("paged"):]), 2, D, dtype, "NHD", gen)
    q = torch.randn(3, 1, 8, D, dtype=DT[dtype], device="cuda", generator=gen)
    out, lse = torch.empty_like(q), torch.empty(3, 8, 1, device="cuda")
    plan = run_and_check(rt, cache, q, out, lse, 1, "chunks=1")
    assert plan.workspace_bytes == 0
