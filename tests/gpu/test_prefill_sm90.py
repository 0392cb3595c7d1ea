"""sdpa_prefill_sm90 (Hopper: TMA + wgmma) on the GPU: every variant of the default bundle against
an fp32 torch reference (the portable family's cases and tolerances, prefill_cases.py), at each kv
tile width (block_n) a head dim has, and the dispatch between the two families and between widths."""
from __future__ import annotations

import math

import pytest
import torch

import aotc.runtime

from common import check_close
from prefill_cases import (DENSE_CASES, LSE_TOL, RAGGED_CASES, TILE_CHOICES, TOL, alloc, bundle_artifacts,
                           hopper_tile_runtime, prefill_variants, ref_attention, run_bad_arguments,
                           run_custom_scale_and_no_lse, run_dense, run_large_score_range, run_ragged)

pytestmark = pytest.mark.gpu
FAMILY = "sdpa_prefill_sm90"


@pytest.fixture(scope="module", params=TILE_CHOICES)
def rt_tile(rt, request):
    """The bundle with one kv tile width per head dim: each case runs at the narrowest and the widest."""
    return hopper_tile_runtime(request.param)


@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: "B{}_Sq{}_Skv{}_H{}-{}_{}".format(*c))
def test_prefill_dense_matches_reference(rt_tile, case):
    run_dense(rt_tile, FAMILY, case)


@pytest.mark.parametrize("case", RAGGED_CASES, ids=lambda c: f"q{c[0]}_kv{c[1]}_H{c[2]}-{c[3]}")
def test_prefill_ragged_matches_reference(rt_tile, case):
    run_ragged(rt_tile, FAMILY, case)


def test_ragged_graph_replay_follows_new_lengths(rt):
    """A ragged plan's tiles come from the device-side cu_seqlens (tile_scheduler.RaggedTiles): a CUDA
    graph captured for one batch and replayed with other lengths in the same buffers covers each new
    batch's tiles, and writes every row of it."""
    H_q, H_kv, D, total = 8, 2, 128, 2048
    q = torch.randn(total, H_q, D, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(total, H_kv, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out = torch.empty_like(q)
    lse = torch.empty(H_q, total, device="cuda")
    cu = torch.zeros(5, dtype=torch.int32, device="cuda")
    batches = ([1500, 300, 200, 48], [0, 2000, 1, 47], [512, 512, 512, 512], [2048, 0, 0, 0])
    cu.copy_(torch.tensor([0, 1500, 1800, 2000, 2048], dtype=torch.int32))
    plan = rt.prepare_prefill(q, k, v, out, lse, causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=total,
                              max_seqlen_kv=total, family=FAMILY)
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), cu.data_ptr(), cu.data_ptr())
    plan.run(*args, torch.cuda.current_stream().cuda_stream)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(*args, torch.cuda.current_stream().cuda_stream)
    for lengths in batches:
        bounds = [0] + torch.tensor(lengths).cumsum(0).tolist()
        cu.copy_(torch.tensor(bounds, dtype=torch.int32))
        out.fill_(math.nan), lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        for b, (s, e) in enumerate(zip(bounds, bounds[1:])):
            ro, rl = ref_attention(q[s:e], k[s:e], v[s:e], True, 1.0 / math.sqrt(D))
            check_close(out[s:e], ro, TOL["bf16"], f"O graph replay {lengths} seq {b}")
            check_close(lse[:, s:e], rl, LSE_TOL, f"LSE graph replay {lengths} seq {b}")


def test_prefill_large_score_range(rt_tile):
    run_large_score_range(rt_tile, FAMILY)


def test_prefill_custom_scale_and_no_lse(rt_tile):
    run_custom_scale_and_no_lse(rt_tile, FAMILY)


@pytest.mark.parametrize("causal", [False, True])
def test_long_kv_runs_the_widest_tile(rt, causal):
    """From the widest kv tile's launch fact picked_from_seqlen_kv (8192 keys, dense) on the runtime picks it,
    below it the narrowest; the long call is checked against the reference (a 8192-key loop of the wide tile,
    GQA, LSE)."""
    from aotc.runtime.prefill import PICKED_FROM

    D = 128
    tiles = {k.variant["block_n"]: k.recorded_fact(PICKED_FROM) for k in rt.kernels[FAMILY]
             if k.variant["head_dim"] == D and k.variant["layout"] == "dense"}
    widths = sorted(tiles)
    LONG_KV = tiles[widths[-1]]
    assert LONG_KV == 8192, tiles
    q = alloc(1, 300, 4, D, "bf16", "bshd")
    k, v = alloc(1, LONG_KV, 2, D, "bf16", "bshd"), alloc(1, LONG_KV, 2, D, "bf16", "bshd")
    out = alloc(1, 300, 4, D, "bf16", "bshd", fill=math.nan)
    lse = torch.full((1, 4, 300), math.nan, device="cuda")
    short = rt.prepare_prefill(q, k[:, :LONG_KV - 1], v[:, :LONG_KV - 1], out, causal=causal)
    assert short.variant["block_n"] == widths[0]
    plan = rt.prepare_prefill(q, k, v, out, lse, causal=causal)
    assert plan.variant.family == FAMILY and plan.variant["block_n"] == widths[-1]
    rt.prefill(q, k, v, out, lse, causal=causal)
    torch.cuda.synchronize()
    ref, ref_lse = ref_attention(q[0], k[0], v[0], causal, D ** -0.5)
    check_close(out[0], ref, TOL["bf16"], f"S_kv {LONG_KV} causal={causal}")
    check_close(lse[0], ref_lse, LSE_TOL, "lse")


def test_prefill_bad_arguments(rt):
    run_bad_arguments(rt, FAMILY)


def test_dispatch_prefers_hopper_and_falls_back(rt):
    """auto runs sdpa_prefill_sm90 on this sm_90 device; without it in the runtime, sdpa_prefill; a
    stride TMA cannot express (zero, for a broadcast K/V) falls back too, and forcing it is refused."""
    q = alloc(1, 64, 4, 128, "bf16", "bshd")
    k = alloc(1, 64, 4, 128, "bf16", "bshd")
    out = alloc(1, 64, 4, 128, "bf16", "bshd", fill=math.nan)
    assert rt.prepare_prefill(q, k, k, out).variant.family == FAMILY
    portable_only = aotc.runtime.Runtime([a for a in bundle_artifacts() if a.variant.family != FAMILY])
    assert portable_only.prepare_prefill(q, k, k, out).variant.family == "sdpa_prefill"
    kb = k[:1].expand(3, 64, 4, 128)  # batch stride 0
    qb, ob = alloc(3, 64, 4, 128, "bf16", "bshd"), alloc(3, 64, 4, 128, "bf16", "bshd", fill=math.nan)
    assert rt.prepare_prefill(qb, kb, kb, ob).variant.family == "sdpa_prefill"
    with pytest.raises(Exception, match="family"):
        rt.prepare_prefill(qb, kb, kb, ob, family=FAMILY)


def test_descriptors_reencoded_only_for_new_pointers(rt):
    q = alloc(2, 300, 4, 64, "bf16", "bshd")
    k = alloc(2, 300, 4, 64, "bf16", "bshd")
    v = alloc(2, 300, 4, 64, "bf16", "bshd")
    out = alloc(2, 300, 4, 64, "bf16", "bshd", fill=math.nan)
    plan = rt.prepare_prefill(q, k, v, out, family=FAMILY)
    before = [d.data for d in plan.inputs.descriptors]  # the TMA launch strategy holds them
    plan.run(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    assert [d.data for d in plan.inputs.descriptors] == before  # same pointers: nothing encoded
    k2, v2, out2 = k.clone(), v.clone() * 2, torch.full_like(out, math.nan)
    plan.run(q.data_ptr(), k2.data_ptr(), v2.data_ptr(), out2.data_ptr())
    assert plan.inputs.descriptors[0].data == before[0] and plan.inputs.descriptors[1].data != before[1]
    torch.cuda.synchronize()
    ref = torch.empty_like(out)
    rt.prefill(q, k2, v2, ref, family="sdpa_prefill")
    torch.cuda.synchronize()
    assert not torch.isnan(out2).any()
    assert torch.allclose(out2.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_batch_stride_beyond_2_31_elements(rt):
    """q and out with a batch stride of 2^31 + 256 elements (byte offsets past 4 GiB) against the reference."""
    D, S, H = 64, 100, 2
    stride_b = 2**31 + 256
    variants = [v for v in prefill_variants(rt, FAMILY) if v[3] == "dense" and v[1] == D and v[0] == "bf16"]
    assert variants
    qbuf = torch.randn(stride_b + S * H * D, dtype=torch.bfloat16, device="cuda")
    obuf = torch.full((stride_b + S * H * D,), math.nan, dtype=torch.bfloat16, device="cuda")
    q = qbuf.as_strided((2, S, H, D), (stride_b, H * D, D, 1))
    out = obuf.as_strided((2, S, H, D), (stride_b, H * D, D, 1))
    k = alloc(2, S, H, D, "bf16", "bshd")
    v = alloc(2, S, H, D, "bf16", "bshd")
    for _, _, causal, _ in variants:
        out.fill_(math.nan)
        rt.prefill(q, k, v, out, causal=causal, family=FAMILY)
        torch.cuda.synchronize()
        for b in range(2):
            check_close(out[b], ref_attention(q[b], k[b], v[b], causal, D ** -0.5)[0], TOL["bf16"],
                        f"batch {b} causal={causal}")
    del qbuf, obuf


# dense causal launches whose last rounds' tiles are drawn from the stream's tile counter
# (PersistentTiles.drawn_plan): B, S, H_q, H_kv, D. Their tile pairs outnumber the 132 SMs of the H200 (an odd
# tile count per head leaves middle tiles among the drawn ones), and S_kv > S_q shifts the diagonal. The D64
# case keeps the static order (its kernels draw nothing) through the same checks.
DRAWN_CASES = [(1, 4096, 33, 11, 128), (2, 2048, 40, 8, 256), (3, 1000, 47, 47, 64), (1, 8192, 17, 17, 128),
               (2, 1100, 37, 37, 128)]


def _dense_causal(B, S, H_q, H_kv, D, S_kv=None):
    S_kv = S_kv or S
    q = torch.randn(B, S, H_q, D, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(B, S_kv, H_kv, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    ref = torch.stack([ref_attention(q[b], k[b], v[b], True, D ** -0.5)[0] for b in range(B)])
    return q, k, v, ref


@pytest.mark.parametrize("case", DRAWN_CASES, ids=lambda c: "B{}_S{}_H{}-{}_D{}".format(*c))
def test_drawn_tiles_cover_every_tile_on_every_call(rt, case):
    """Every tile runs once whoever draws it, and the counter is 0 again after each launch: five launches in a
    row give the reference and the same bits (a counter left non-zero would skip tiles: NaN rows)."""
    q, k, v, ref = _dense_causal(*case, S_kv=case[1] + 77)
    first = None
    for _ in range(5):
        out = torch.full_like(q, float("nan"))
        rt.prefill(q, k, v, out, causal=True, family=FAMILY)
        check_close(out, ref, TOL["bf16"], f"drawn tiles {case}")
        if first is None:
            first = out
        assert torch.equal(out, first)


def _on_two_streams(rt, q, k, v, causal: bool, reference):
    """Four launches on each of two streams, queued so they run at the same time, the second stream's on other
    queries: each gets its own call's result (reference(q, k, v) -> O)."""
    q2 = torch.randn_like(q)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    outs = [[torch.full_like(q, float("nan")) for _ in range(4)] for _ in streams]
    torch.cuda.synchronize()
    for i in range(4):
        for s, st in enumerate(streams):
            with torch.cuda.stream(st):
                rt.prefill((q, q2)[s], k, v, outs[s][i], causal=causal, stream=st.cuda_stream, family=FAMILY)
    torch.cuda.synchronize()
    for s, r in enumerate((reference(q, k, v), reference(q2, k, v))):
        for i in range(4):
            check_close(outs[s][i], r, TOL["bf16"], f"stream {s} launch {i}")


def _graph_replays(rt, q, k, v, causal: bool, reference):
    """A launch captured in a CUDA graph (its plan made outside the capture), replayed three times over new
    queries: each replay gives the reference (reference(q, k, v) -> O)."""
    out = torch.empty_like(q)
    rt.prefill(q, k, v, out, causal=causal, family=FAMILY)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rt.prefill(q, k, v, out, causal=causal, stream=torch.cuda.current_stream().cuda_stream, family=FAMILY)
    for i in range(3):
        q.normal_()
        out.fill_(float("nan"))
        graph.replay()
        check_close(out, reference(q, k, v), TOL["bf16"], f"replay {i}")


def _reference(q, k, v, causal=False):
    """The fp32 reference of a dense batch: (O, LSE)."""
    outs, lses = zip(*(ref_attention(q[b], k[b], v[b], causal, q.shape[-1] ** -0.5) for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(lses)


def test_drawn_tiles_on_two_streams_at_once(rt):
    """Each stream draws from a counter of its own: launches queued on two streams run at the same time and
    each gets every tile of its own call."""
    q, k, v, _ = _dense_causal(1, 8192, 16, 16, 128)
    _on_two_streams(rt, q, k, v, True, lambda q, k, v: _reference(q, k, v, True)[0])


def test_drawn_tiles_in_a_cuda_graph(rt):
    """A captured launch keeps its capture stream's counter; every replay leaves it 0 for the next."""
    q, k, v, _ = _dense_causal(2, 2048, 40, 8, 128)
    _graph_replays(rt, q, k, v, True, lambda q, k, v: _reference(q, k, v, True)[0])


# The split tail of dense non-causal launches (aotc.families.sdpa_prefill_sm90.TAIL_SPLIT_MIN_BLOCKS): more tiles than
# SMs, not a whole number of rounds, and at least 8 kv blocks a tile, at D128 (both tiles: S_kv 8269 runs the 176 one)
# and D256; S_kv past a block's multiple puts the masked last block in a split piece, S_q past block_m's a short tile
# among the pieces. D64 keeps its rounds whole (TAIL_SPLIT_HEAD_DIMS): its case checks the same shape class unsplit.
# (B, S_q, S_kv, H_q, H_kv, D); the tiles' count and rounds on 132 SMs in the comment.
SPLIT_TAIL_CASES = [
    (2, 1024, 1100, 40, 8, 128),  # 640 tiles: 4 rounds + 112, 9 kv blocks a tile
    (1, 1000, 3000, 35, 7, 128),  # 280: 2 + 16, 24 blocks, the last query tile of 104 rows
    (1, 8192, 8269, 17, 17, 128),  # 1088: 8 + 32, 47 blocks of 176
    (3, 1000, 1000, 47, 47, 64),  # 846 tiles of 192 rows: 6 + 54, 8 blocks
    (2, 2048, 2048, 40, 8, 256),  # 1280: 9 + 92, 26 blocks of 80
]


def _dense(B, S_q, S_kv, H_q, H_kv, D, dtype=torch.bfloat16):
    q = torch.randn(B, S_q, H_q, D, dtype=dtype, device="cuda")
    k, v = (torch.randn(B, S_kv, H_kv, D, dtype=dtype, device="cuda") for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("case", SPLIT_TAIL_CASES, ids=lambda c: "B{}_Sq{}_Skv{}_H{}-{}_D{}".format(*c))
def test_split_tail_matches_reference_with_the_same_bits_every_launch(rt, case, dtype):
    """Every split tile's two pieces merge into the reference's O and LSE whichever arrives first (five launches
    give the same bits), and every launch leaves the counters 0 (a counter left non-zero would merge a piece with a
    stale partial or wait forever)."""
    q, k, v = _dense(*case, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
    ref, ref_lse = _reference(q, k, v)
    first = None
    for i in range(5):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((case[0], case[3], case[1]), float("nan"), device="cuda")
        rt.prefill(q, k, v, out, lse, causal=False, family=FAMILY)
        check_close(out, ref, TOL[dtype], f"split tail {case} launch {i}")
        check_close(lse, ref_lse, LSE_TOL, f"split tail {case} LSE launch {i}")
        if first is None:
            first = (out, lse)
        assert torch.equal(out, first[0]) and torch.equal(lse, first[1]), f"launch {i}: other bits than launch 0"


def test_split_tail_on_two_streams_at_once(rt):
    """Each stream merges through a split workspace of its own: launches queued on two streams run at the same time
    and each gets its own call's result."""
    _on_two_streams(rt, *_dense(*SPLIT_TAIL_CASES[0]), False, lambda q, k, v: _reference(q, k, v)[0])


def test_split_tail_in_a_cuda_graph(rt):
    """A captured launch keeps its capture stream's split workspace; every replay leaves its counters 0."""
    _graph_replays(rt, *_dense(*SPLIT_TAIL_CASES[4]), False, lambda q, k, v: _reference(q, k, v)[0])
