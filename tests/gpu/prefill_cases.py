"""Shared cases for the prefill families on the GPU (sdpa_prefill and sdpa_prefill_sm90): every
variant of a family in the default bundle against an fp32 torch reference.

Reference: the same fp16/bf16 inputs upcast to fp32, softmax(QK^T * scale + mask) V in fp32,
bottom-right causal mask, GQA by repeating KV heads. Tolerances (|out-ref| <= atol + rtol*|ref|):
fp16 4e-3/4e-3, bf16 2e-2/2e-2 (output rounding 2^-11 / 2^-8 plus P rounded to the input dtype
for the PV product); LSE 2e-3/2e-3. Outputs are NaN-poisoned before each launch; a query row
that sees no key must give O = 0 and LSE = -inf.
"""
from __future__ import annotations

import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from common import check_close

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {"fp16": (4e-3, 4e-3), "bf16": (2e-2, 2e-2)}
LSE_TOL = (2e-3, 2e-3)


def prefill_variants(rt, family):
    """(dtype, head_dim, causal, layout) of the family's dense and ragged kernels (rt.prefill's; the paged layouts
    are Runtime.attention's: test_attention*.py)."""
    return sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["causal"], k.variant["layout"])
                   for k in rt.kernels.get(family, []) if k.variant["layout"] in ("dense", "ragged")})


def ref_attention(q, k, v, causal, scale):
    """q [S_q, H_q, D], k/v [S_kv, H_kv, D] -> (O [S_q, H_q, D] fp32, LSE [H_q, S_q] fp32)."""
    S_q, H_q, D = q.shape
    S_kv, H_kv, _ = k.shape
    if S_q == 0:
        return torch.zeros(0, H_q, D, device=q.device), torch.zeros(H_q, 0, device=q.device)
    rep = H_q // H_kv
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(rep, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(rep, dim=1).transpose(0, 1)
    s = torch.matmul(qf, kf.transpose(1, 2)) * scale  # [H, S_q, S_kv]
    if causal:
        i = torch.arange(S_q, device=q.device)[:, None]
        j = torch.arange(S_kv, device=q.device)[None, :]
        s = s.masked_fill(j > i + (S_kv - S_q), -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows that see nothing
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    o = torch.matmul(p, vf)  # rows that see nothing: p = 0 -> o = 0
    return o.transpose(0, 1), lse


def alloc(B, S, H, D, dtype, layout, fill=None):
    """A [B, S, H, D] view in the given memory layout."""
    t = DT[dtype]
    if layout == "bshd":
        x = torch.empty(B, S, H, D, dtype=t, device="cuda")
    elif layout == "bhsd":
        x = torch.empty(B, H, S, D, dtype=t, device="cuda").transpose(1, 2)
    elif layout == "padded":
        x = torch.empty(B, S + 1, H + 2, D + 16, dtype=t, device="cuda")[:, :S, :H, :D]
    else:
        raise ValueError(layout)
    if fill is None:
        x.normal_()
    else:
        x.fill_(fill)
    return x


DENSE_CASES = [  # (B, S_q, S_kv, H_q, H_kv, layout)
    (1, 1, 1, 1, 1, "bshd"),
    (3, 7, 7, 4, 1, "bhsd"),
    (1, 64, 128, 8, 4, "bshd"),
    (3, 128, 64, 4, 4, "padded"),
    (1, 1000, 1000, 8, 8, "bshd"),
    (1, 0, 64, 4, 4, "bshd"),
    (2, 64, 0, 4, 4, "bshd"),
    (1, 1000, 4097, 8, 1, "bhsd"),
    (3, 1, 1000, 4, 4, "padded"),
    (1, 4097, 4097, 1, 1, "bshd"),
    (3, 4097, 128, 8, 8, "bhsd"),  # S_q > S_kv: causal rows that see no key
    (3, 1000, 1000, 8, 4, "padded"),
    # many (batch, head) pairs (> half the SMs of an H200): the Hopper family's causal tile pairs
    (3, 1000, 1000, 32, 8, "bshd"),
    (5, 300, 450, 16, 4, "padded"),  # 3 query blocks: the middle tile has no partner
    # D64 (192-row tiles): 3 query blocks over 96 (batch, head) pairs: 96 full pairs, then 96 middle tiles
    # that spill into a second round of the Hopper family's causal schedule
    (3, 400, 400, 32, 4, "bshd"),
]


def run_dense(rt, family, case):
    variants = [v for v in prefill_variants(rt, family) if v[3] == "dense"]
    assert variants, f"the default bundle has no dense {family} kernels"
    B, S_q, S_kv, H_q, H_kv, layout = case
    gen_seed = hash(case) % 2**31
    torch.manual_seed(gen_seed)
    for dtype, D, causal, _ in variants:
        q = alloc(B, S_q, H_q, D, dtype, layout)
        k = alloc(B, S_kv, H_kv, D, dtype, layout)
        v = alloc(B, S_kv, H_kv, D, dtype, layout)
        out = alloc(B, S_q, H_q, D, dtype, layout, fill=math.nan)
        lse = torch.full((B, H_q, S_q), math.nan, device="cuda")
        scale = 1.0 / math.sqrt(D)
        plan = rt.prepare_prefill(q, k, v, out, lse, causal=causal, family=family)
        assert plan.variant.family == family, plan.variant.name
        rt.prefill(q, k, v, out, lse, causal=causal, family=family)
        torch.cuda.synchronize()
        if family == "sdpa_prefill":  # dispatch between the stride specializations
            expect_packed = layout == "bshd"
            assert plan.variant["strides"] == ("packed" if expect_packed else "general"), plan.variant.name
        what = f"{dtype} D{D} causal={causal} {case}"
        for b in range(B):
            ro, rl = ref_attention(q[b], k[b], v[b], causal, scale)
            check_close(out[b], ro, TOL[dtype], "O " + what)
            check_close(lse[b], rl, LSE_TOL, "LSE " + what)


RAGGED_CASES = [  # (seqlens_q, seqlens_kv, H_q, H_kv)
    ([7, 0, 1000, 64], [7, 5, 1200, 4097], 8, 2),
    ([1, 128, 4097], [1, 128, 4097], 4, 4),
    ([65, 3], [10, 3], 4, 1),  # S_q > S_kv: causal rows that see no key
    ([7, 0, 1000, 300], [7, 5, 1200, 300], 32, 8),  # many (sequence, head) pairs: causal tile pairs
    # one long sequence among many short ones (and empty and one-token ones), GQA: the ragged tile walk
    ([1500] + [40] * 20 + [0, 1, 129], [1500] + [40] * 20 + [0, 1, 200], 4, 2),
    # keys past L2: each sequence's heads in sections (RaggedTiles.place: one KV head's 3 query heads at D128)
    ([200, 33], [40000, 70000], 12, 4),
    # the tile order: sequences longest first for 2 to 32 with tiles in a batch of at most 128 (RaggedTiles.sorted),
    # else in batch order: 40 with tiles; 131 sequences
    ([70] * 40, [100 + 7 * i for i in range(40)], 4, 2),
    ([3] * 130 + [200], [5] * 130 + [300], 2, 1),
]


def run_ragged(rt, family, case):
    variants = [v for v in prefill_variants(rt, family) if v[3] == "ragged"]
    assert variants, f"the default bundle has no ragged {family} kernels"
    lq, lkv, H_q, H_kv = case
    torch.manual_seed(len(lq))
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_kv = torch.tensor([0] + list(torch.tensor(lkv).cumsum(0)), dtype=torch.int32, device="cuda")
    for dtype, D, causal, _ in variants:
        t = DT[dtype]
        q = torch.randn(sum(lq), H_q, D, dtype=t, device="cuda")
        k = torch.randn(sum(lkv), H_kv, D, dtype=t, device="cuda")
        v = torch.randn(sum(lkv), H_kv, D, dtype=t, device="cuda")
        out = torch.full_like(q, math.nan)
        lse = torch.full((H_q, sum(lq)), math.nan, device="cuda")
        rt.prefill_ragged(q, k, v, out, cu_q, cu_kv, max(lq), max(lkv), lse, causal=causal, family=family)
        torch.cuda.synchronize()
        what = f"ragged {dtype} D{D} causal={causal} {case}"
        for b in range(len(lq)):
            qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_kv[b]), int(cu_kv[b + 1])
            ro, rl = ref_attention(q[qs:qe], k[ks:ke], v[ks:ke], causal, 1.0 / math.sqrt(D))
            check_close(out[qs:qe], ro, TOL[dtype], f"O {what} seq {b}")
            check_close(lse[:, qs:qe], rl, LSE_TOL, f"LSE {what} seq {b}")


def run_large_score_range(rt, family):
    """Scores whose row max climbs by far more than the lazy rescale's slack (2^8) from one kv block to the
    next in the kernels' walk (last block first; keys earlier in the sequence score higher here), beside
    rows of plain random scores: O must be rescaled whenever a warp's max moves, and kept otherwise. Every
    dense variant, against the fp32 reference; LSE checked too."""
    variants = [v for v in prefill_variants(rt, family) if v[3] == "dense"]
    assert variants
    torch.manual_seed(7)
    B, S, H = 2, 700, 4
    for dtype, D, causal, _ in variants:
        q = alloc(B, S, H, D, dtype, "bshd")
        k = alloc(B, S, H, D, dtype, "bshd")
        v = alloc(B, S, H, D, dtype, "bshd")
        # heads 0 and 1: q = 1 and k[j] = ramp(j) * 2 / sqrt(D) * U(0, 1), so the scaled score of key j is
        # about R * (S - j) / S: R = 150 climbs ~20 log2 units per 64-key block of the walk (past the slack:
        # rescaled), R = 40 ~2-5 (within it: the max is kept and p reaches up to 2^8); heads 2, 3 random
        q[:, :, :2] = 1.0
        for h, R in ((0, 150.0), (1, 40.0)):
            ramp = torch.linspace(R, 0.0, S, device="cuda").view(1, S, 1)
            k[:, :, h] = (ramp * 2.0 / math.sqrt(D) * torch.rand(B, S, D, device="cuda")).to(k.dtype)
        out = alloc(B, S, H, D, dtype, "bshd", fill=math.nan)
        lse = torch.full((B, H, S), math.nan, device="cuda")
        rt.prefill(q, k, v, out, lse, causal=causal, family=family)
        torch.cuda.synchronize()
        for b in range(B):
            ro, rl = ref_attention(q[b], k[b], v[b], causal, 1.0 / math.sqrt(D))
            what = f"large score range {dtype} D{D} causal={causal} batch {b}"
            check_close(out[b], ro, TOL[dtype], "O " + what)
            check_close(lse[b], rl, LSE_TOL, "LSE " + what)


def run_custom_scale_and_no_lse(rt, family):
    dtype, D, causal, _ = prefill_variants(rt, family)[0]
    q = alloc(2, 100, 4, D, dtype, "bshd")
    k = alloc(2, 300, 4, D, dtype, "bshd")
    v = alloc(2, 300, 4, D, dtype, "bshd")
    out = alloc(2, 100, 4, D, dtype, "bshd", fill=math.nan)
    rt.prefill(q, k, v, out, causal=causal, softmax_scale=0.05, family=family)
    torch.cuda.synchronize()
    for b in range(2):
        check_close(out[b], ref_attention(q[b], k[b], v[b], causal, 0.05)[0], TOL[dtype], "custom scale")


def run_bad_arguments(rt, family):
    dtype, D, causal, _ = prefill_variants(rt, family)[0]
    q = alloc(1, 16, 4, D, dtype, "bshd")
    k = alloc(1, 16, 2, D, dtype, "bshd")
    out = alloc(1, 16, 4, D, dtype, "bshd", fill=math.nan)
    cases = [
        ((q.float(), k, k, out), "q.dtype"),
        ((q, k.half() if dtype == "bf16" else k.bfloat16(), k, out), "k.dtype"),
        ((q, alloc(1, 16, 3, D, dtype, "bshd"), alloc(1, 16, 3, D, dtype, "bshd"), out), "k.shape"),
        ((q, k, k[:, :8], out), "v.shape"),
        ((q[..., : D // 2], k[..., : D // 2], k[..., : D // 2], out[..., : D // 2]), "q.shape"),
        ((q, k, k, q), "out"),  # out overlaps q
    ]
    for args, name in cases:
        with pytest.raises((ArgumentError, TypeError, ValueError)) as ei:
            rt.prefill(*args, causal=causal, family=family)
        assert name in str(ei.value), (name, str(ei.value))
    with pytest.raises(ArgumentError, match="softmax_scale"):
        rt.prefill(q, k, k, out, causal=causal, softmax_scale=float("nan"), family=family)
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call launched"


def bundle_artifacts():
    """The default bundle's artifacts (to build runtimes holding a subset of them)."""
    from aotc.storage.bundle import read_bundle
    from conftest import BUNDLE

    return read_bundle(BUNDLE).artifacts


TILE_CHOICES = ("narrowest", "widest")


def hopper_tile_runtime(choice):
    """A runtime of the bundle whose Hopper prefill kernels are one kv tile width per head dim, the
    narrowest or the widest (block_n), so a test runs that width whatever the sequence length (the
    runtime itself picks by max_seqlen_kv)."""
    import aotc.runtime

    arts = bundle_artifacts()
    widths = {}
    for a in arts:
        if a.variant.family == "sdpa_prefill_sm90":
            widths.setdefault(a.variant["head_dim"], set()).add(a.variant["block_n"])
    pick = {d: (min if choice == "narrowest" else max)(w) for d, w in widths.items()}
    return aotc.runtime.Runtime([a for a in arts if a.variant.family != "sdpa_prefill_sm90"
                                 or a.variant["block_n"] == pick[a.variant["head_dim"]]])
