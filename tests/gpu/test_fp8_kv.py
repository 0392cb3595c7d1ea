"""fp8 KV caches on the GPU (kv_dtype fp8_e4m3): decode over e4m3 pools with fp32 scales, and the KV write
that quantizes into them.

Decode: the pools hold e4m3 bytes of a random bf16 cache quantized with per-head scales (amax / 448), with
e4m3 subnormals (bytes 0x01..0x07, 0x81..0x87) and zeros planted among them; the reference is fp64
attention over the dequantized cache (k_fp8 * k_scale[h], v_fp8 * v_scale[h]), at bf16's tolerances
(2e-2 / 2e-2, LSE 2e-3 / 2e-3); outputs are NaN-poisoned before every launch. Scales per KV head ([H_kv])
and per tensor ([1]), NHD and HND, S_q 1 and 4, skewed lengths (0, 1, 15, 16, 17 beside 32768), CUDA-graph
replay with new lengths.

Attention (rt.attention over e4m3 pools): mixed batches of decode rows and prefill chunks against the same fp64
reference, e4m3 NaN bytes (0x7f) in the pool slots no sequence owns, queries far beyond fp16's range, CUDA-graph
replay with new lengths.

KV write: the pools' bytes equal torch's float8_e4m3fn conversion of clamp(x.float() / scale, -448, 448) at
every written slot (inputs reach past +-448 * scale, so saturation is exercised, and near rounding ties),
and every other byte keeps its poison (0x7f, an e4m3 NaN); -1 and out-of-range slots write nothing.
"""
from __future__ import annotations

import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from common import check_close
from feature_cases import combo_of, lse_tol, reference as feature_reference, settings, softcap_amplitude
from paged_cases import PagedCache, decode_reference, pools_after_write

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {"fp16": (4e-3, 4e-3), "bf16": (2e-2, 2e-2)}
LSE_TOL = (2e-3, 2e-3)
E4M3_MAX = 448.0
POISON = 0x7F


def fp8_decode_variants(rt, layout="dense", paged=True):
    """(dtype, head_dim, kv) of the bundle's plain fp8 decode kernels over paged pools (paged=False: dense KV)."""
    vs = sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["kv"]) for k in rt.kernels.get("sdpa_decode", [])
                 if k.variant.get("kv_dtype") == "fp8_e4m3" and k.variant["layout"] == layout
                 and (k.variant["kv"] != "dense") == paged
                 and not any(k.variant.get(f) for f in ("window", "softcap", "sinks"))})
    if not paged and not vs:
        pytest.skip("no dense-KV fp8 decode kernel in this bundle (specs/full.toml builds them)")
    assert vs, "the default bundle has no fp8 sdpa_decode kernels"
    return vs


def quantize(x, scale, head_axis):
    """e4m3 of x / scale (scale [H] along head_axis, or [1]), saturated: the reference quantizer."""
    shape = [1] * x.dim()
    shape[head_axis] = -1
    s = scale.view(shape) if scale.numel() > 1 else scale
    return (x.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


class Fp8Cache:
    """A PagedCache's pools quantized to e4m3 with per-head (or one) scales; subnormals and zeros planted."""

    def __init__(self, lengths, page, H_kv, D, layout, gen, per_head=True, **kw):
        self.base = PagedCache(lengths, page, H_kv, D, "bf16", layout, gen, **kw)
        head_axis = 2 if layout == "NHD" else 1
        self.layout, self.lengths, self.page_table, self.seqlens = layout, lengths, self.base.page_table, self.base.seqlens
        self.scales = []
        self.pools = []
        for x in (self.base.k, self.base.v):
            dims = [d for d in range(4) if d != head_axis]
            amax = x.float().abs().amax(dim=dims) if per_head else x.float().abs().amax().reshape(1)
            scale = (amax / E4M3_MAX).contiguous()
            q8 = quantize(x, scale, head_axis)
            bits = q8.view(torch.uint8)
            plant = torch.rand(bits.shape, device="cuda", generator=gen)
            sub = torch.randint(1, 8, bits.shape, device="cuda", generator=gen, dtype=torch.uint8)
            sign = (torch.rand(bits.shape, device="cuda", generator=gen) < 0.5).to(torch.uint8) * 0x80
            bits[plant < 0.05] = (sub | sign)[plant < 0.05]   # e4m3 subnormals: +-(1..7) * 2^-9
            bits[(plant >= 0.05) & (plant < 0.07)] = 0
            self.pools.append(q8)
            self.scales.append(scale)
        self.k, self.v = self.pools
        self.k_scale, self.v_scale = self.scales
        self.head_axis = head_axis

    def dense(self, b):
        """Sequence b's dequantized keys and values [L, H_kv, D] in fp64."""
        L, P = self.lengths[b], self.base.page
        pages = self.page_table[b, : math.ceil(L / P)].long()
        out = []
        for pool, scale in ((self.k, self.k_scale), (self.v, self.v_scale)):
            x = pool.view(torch.uint8)  # (fp8 tensors take no advanced indexing)
            x = x if self.layout == "NHD" else x.transpose(1, 2)
            x = x[pages].view(FP8).double() * scale.double().view(1, 1, -1, 1)  # broadcasts a [1] scale
            out.append(x.reshape(-1, x.shape[2], x.shape[3])[:L])
        return out


def reference(q, k, v, scale):
    """fp64 attention: q [S_q, H_q, D], k/v [S_kv, H_kv, D] (causal bottom-right) -> O, LSE [H_q, S_q]."""
    return decode_reference(q, k, v, scale, torch.float64)


def check_step(cache, q, out, lse, what):
    D = q.shape[-1]
    for b in range(q.shape[0]):
        k, v = cache.dense(b)
        ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
        dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
        check_close(out[b], ro, TOL[dtype], f"O {what} b={b} L={cache.lengths[b]}")
        check_close(lse[b], rl, LSE_TOL, f"LSE {what} b={b}")


LENGTHS = [0, 1, 15, 16, 17, 1000, 32768]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("S_q", [1, 4])
@pytest.mark.parametrize("per_head", [True, False])
def test_fp8_decode_against_the_dequantized_cache(rt, layout, S_q, per_head):
    gen = torch.Generator(device="cuda").manual_seed(S_q + 2 * (layout == "HND") + 4 * per_head)
    for dtype, D, kv in fp8_decode_variants(rt):
        page = int(kv[len("paged"):])
        cache = Fp8Cache(LENGTHS, page, 8, D, layout, gen, per_head=per_head)
        q = torch.randn(len(LENGTHS), S_q, 32, D, dtype=DT[dtype], device="cuda", generator=gen)
        out = torch.empty_like(q)
        lse = torch.empty(len(LENGTHS), 32, S_q, device="cuda")
        out.fill_(math.nan), lse.fill_(math.nan)
        rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, kv_layout=layout,
                  k_descale=cache.k_scale, v_descale=cache.v_scale, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        check_step(cache, q, out, lse, f"{dtype} D{D} {kv} {layout} S_q={S_q} per_head={per_head}")


# ---- the serving entry point over fp8 pools (rt.attention: sdpa_prefill_sm90 kv_dtype fp8_e4m3 for the longer
# rows, sdpa_decode layout ragged for the decode rows)

# (s_q, s_kv): decode rows, S_q 4 rows, chunks over prefixes of 0, 1, 15 and 3000 tokens, an empty sequence and
# rows that see no key (s_q > s_kv); lengths often not a multiple of the page or of 128
ATTN_SEQS = [(1, 1), (2048, 2048), (1, 17), (4, 4), (0, 50), (300, 301), (1, 1000), (4, 130), (2048, 2063),
             (1, 4096), (700, 3700), (5, 3)]


def fp8_attention_variants(rt, family="sdpa_prefill_sm90"):
    """(dtype, head_dim, page) of the bundle's plain fp8 paged kernels of `family` (the Hopper one; the portable
    one, sdpa_prefill, from test_attention_portable.py)."""
    vs = sorted({(k.variant["dtype"], k.variant["head_dim"], int(k.variant["layout"][len("paged"):]))
                 for k in rt.kernels.get(family, [])
                 if k.variant.get("kv_dtype") == "fp8_e4m3" and str(k.variant["layout"]).startswith("paged")
                 and not any(k.variant.get(f) for f in ("window", "softcap", "sinks"))})
    assert vs, f"the bundle has no fp8 {family} kernel"
    return vs


def poison_fp8_tails(cache):
    """e4m3 NaN bytes (0x7f) in the slots past each sequence's end in its last page and in the pages no sequence
    owns: a kernel that reads its last page whole must not let them into O."""
    base = cache.base
    for pool in cache.pools:
        x = base.tokens(pool.view(torch.uint8))
        if base.unused:
            x[torch.tensor(base.unused, device="cuda").long()] = POISON
        for b, (L, n) in enumerate(zip(base.lengths, base.need)):
            for p in range(L // base.page, n):
                x[int(base.page_table[b, p]), L - p * base.page if p == L // base.page else 0:] = POISON


ATTN_SETTINGS = [("NHD", True, (32, 8)), ("HND", False, (32, 8)), ("NHD", False, (28, 4)), ("HND", True, (8, 8))]


@pytest.mark.parametrize("layout,per_head,heads", ATTN_SETTINGS)
@pytest.mark.parametrize("decode_query_len", [0, 1, 4])
def test_fp8_attention_mixed_batch(rt, layout, per_head, heads, decode_query_len):
    """One rt.attention call over e4m3 pools for a mixed batch (ATTN_SEQS): every row against fp64 attention over
    the dequantized cache at bf16's tolerances, LSE too, rows past cu_seqlens_q[-1] untouched (NaN); per-head
    and per-tensor scales, NHD and HND, GQA 4, 7 (a group that does not divide the paged kernel's 64-row slabs)
    and 1; decode_query_len 0 puts the decode rows on the paged prefill kernel too."""
    fp8_attention_mixed_batch(rt, fp8_attention_variants(rt), layout, per_head, heads, decode_query_len)


def fp8_attention_mixed_batch(rt, variants, layout, per_head, heads, decode_query_len, max_seqlen_q=2048):
    """test_fp8_attention_mixed_batch for the (dtype, head_dim, page) variants given (max_seqlen_q below the
    query counts: the portable kernel's CTAs walk several query tiles each)."""
    H_q, H_kv = heads
    for dtype, D, page in variants:
        gen = torch.Generator(device="cuda").manual_seed(700 + decode_query_len + 3 * per_head + H_q)
        cache = Fp8Cache([s_kv for _, s_kv in ATTN_SEQS], page, H_kv, D, layout, gen, per_head=per_head)
        poison_fp8_tails(cache)
        total = sum(s_q for s_q, _ in ATTN_SEQS)
        q = torch.randn(total + 3, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
        out = torch.full_like(q, math.nan)
        lse = torch.full((H_q, total + 3), math.nan, device="cuda")
        cu = [0]
        for s_q, _ in ATTN_SEQS:
            cu.append(cu[-1] + s_q)
        cu = torch.tensor(cu, dtype=torch.int32, device="cuda")
        try:
            rt.attention(q, cache.k, cache.v, out, cu, cache.seqlens, cache.page_table, lse=lse, kv_layout=layout,
                         k_descale=cache.k_scale, v_descale=cache.v_scale, decode_query_len=decode_query_len,
                         max_seqlen_q=max_seqlen_q, stream=torch.cuda.current_stream())
        except ArgumentError as e:  # the decode rows' fp8 kernel (layout ragged) may be missing from a bundle
            if decode_query_len and "sdpa_decode" in str(e):
                pytest.skip(f"no ragged fp8 decode kernel: {e}")
            raise
        torch.cuda.synchronize()
        what = f"{dtype} D{D} page{page} {layout} {H_q}/{H_kv} per_head={per_head} decode_query_len={decode_query_len}"
        pos = 0
        for b, (s_q, s_kv) in enumerate(ATTN_SEQS):
            k, v = cache.dense(b)
            ro, rl = reference(q[pos:pos + s_q], k, v, 1.0 / math.sqrt(D))
            check_close(out[pos:pos + s_q], ro, TOL[dtype], f"O {what} seq {b} (s_q {s_q}, s_kv {s_kv})")
            check_close(lse[:, pos:pos + s_q], rl, LSE_TOL, f"LSE {what} seq {b}")
            pos += s_q
        assert torch.isnan(out[total:]).all() and torch.isnan(lse[:, total:]).all(), f"{what}: rows past the step written"


def test_fp8_attention_large_queries_and_graph_replay(rt):
    """Queries far beyond fp16's range (bf16, |q| up to 1e6, the softmax scale 1 / (1e6 sqrt(D)) so the logits stay
    of order 1: the kernel rewrites Q as fp16 times a power of two per warpgroup) against fp64; then the same plan
    captured in a CUDA graph and replayed with new lengths; every plain fp8 Hopper variant (D64's tile has two
    consumer warpgroups where its 16-bit one has three)."""
    for variant in fp8_attention_variants(rt):
        fp8_attention_large_queries_and_graph_replay(rt, variant)


def fp8_attention_large_queries_and_graph_replay(rt, variant):
    """test_fp8_attention_large_queries_and_graph_replay for one (dtype, head_dim, page) variant (fp16 queries:
    |q| up to about 5e4, near fp16's largest, as bf16 ones cannot go past it)."""
    dtype, D, page = variant
    amp = 1e6 if dtype == "bf16" else 1e4
    gen = torch.Generator(device="cuda").manual_seed(77)
    seqs = [(600, 900), (1, 40), (129, 129)]
    cache = Fp8Cache([2000, 2000, 2000], page, 8, D, "NHD", gen)
    total = sum(s_q for s_q, _ in seqs)
    q = (torch.randn(total, 32, D, device="cuda", generator=gen) * amp).to(DT[dtype])
    out = torch.full_like(q, math.nan)
    lse = torch.full((32, total), math.nan, device="cuda")
    cu = torch.tensor([0, 600, 601, 730], dtype=torch.int32, device="cuda")
    lens = torch.tensor([s_kv for _, s_kv in seqs], dtype=torch.int32, device="cuda")
    scale = 1.0 / (amp * math.sqrt(D))
    plan = rt.prepare_attention(q, cache.k, cache.v, out, cu, lens, cache.page_table, lse=lse, softmax_scale=scale,
                                k_descale=cache.k_scale, v_descale=cache.v_scale)

    def check(what):
        torch.cuda.synchronize()
        pos = 0
        for b, (s_q, s_kv) in enumerate(seqs):
            k, v = cache.dense(b)
            ro, rl = reference(q[pos:pos + s_q], k[:s_kv], v[:s_kv], scale)
            check_close(out[pos:pos + s_q], ro, TOL[dtype], f"O {what} seq {b}")
            check_close(lse[:, pos:pos + s_q], rl, LSE_TOL, f"LSE {what} seq {b}")
            pos += s_q

    plan(q, out, lse, stream=torch.cuda.current_stream())
    check(f"eager, |q| ~ {amp:g}")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan(q, out, lse, stream=torch.cuda.current_stream())
    seqs[:] = [(600, 2000), (1, 2000), (129, 1000)]
    lens.copy_(torch.tensor([s_kv for _, s_kv in seqs], dtype=torch.int32))
    out.fill_(math.nan)
    lse.fill_(math.nan)
    g.replay()
    check("graph replay with new lengths")


def test_fp8_attention_with_score_features(rt):
    """rt.attention over e4m3 pools with the paged kernels built with a window, soft-cap or sinks: the Hopper ones
    (the default bundle's gpt-oss D64 kernels; specs/full.toml's others) and the portable ones where a bundle has
    some the Hopper kernels do not serve (test_attention_portable.py runs its bundle's)."""
    ran = [fp8_attention_with_features(rt, family) for family in ("sdpa_prefill", "sdpa_prefill_sm90")]
    if not any(ran):
        pytest.skip("no fp8 paged kernel with score features in this bundle (specs/full.toml builds them)")


# a mixed batch of decode rows, S_q 4 rows, chunks over short and long prefixes, an empty sequence and rows that see
# no key (s_q > s_kv)
FEATURE_SEQS = [(1, 1), (300, 301), (1, 1000), (4, 130), (700, 3700), (5, 3), (0, 50), (1, 4096), (129, 129)]


def fp8_attention_with_features(rt, family):
    """Every fp8 paged kernel of `family` with score features, every feature value of feature_cases.settings, on a
    mixed batch (FEATURE_SEQS; its decode rows on the fp8 decode kernel where one with the same features is
    loaded): against fp64 attention with the features over the dequantized cache, LSE too; queries scaled so
    soft-capped scores reach several times the cap. A variant whose call the runtime gives to another family's
    kernel (the Hopper one serves it too) is not this family's to check: skipped. Returns how many it ran."""
    found = sorted({(k.variant["dtype"], k.variant["head_dim"], int(k.variant["layout"][len("paged"):]),
                     combo_of(k.variant))
                    for k in rt.kernels.get(family, []) if k.variant.get("kv_dtype") == "fp8_e4m3"
                    and str(k.variant["layout"]).startswith("paged") and combo_of(k.variant)}, key=repr)
    gen = torch.Generator(device="cuda").manual_seed(43)
    ran = 0
    total = sum(s_q for s_q, _ in FEATURE_SEQS)
    cu = [0]
    for s_q, _ in FEATURE_SEQS:
        cu.append(cu[-1] + s_q)
    cu = torch.tensor(cu, dtype=torch.int32, device="cuda")
    for dtype, D, page, combo in found:
        H_q, H_kv = (64, 8) if D == 64 else (16, 4)  # gpt-oss's heads at D64
        cache = Fp8Cache([s_kv for _, s_kv in FEATURE_SEQS], page, H_kv, D, "NHD", gen)
        poison_fp8_tails(cache)
        for feat in settings(combo):
            amp = softcap_amplitude(feat.softcap, 1.0 / math.sqrt(D), D) ** 2  # (on q alone: k is the cache's)
            q = (torch.randn(total + 3, H_q, D, device="cuda", generator=gen) * amp).to(DT[dtype])
            out, lse = torch.full_like(q, math.nan), torch.full((H_q, total + 3), math.nan, device="cuda")
            kw = feat.kwargs(H_q)
            plan = rt.prepare_attention(q, cache.k, cache.v, out, cu, cache.seqlens, cache.page_table, lse=lse,
                                        k_descale=cache.k_scale, v_descale=cache.v_scale, max_seqlen_q=700, **kw)
            if plan.prefill_family != family:
                break
            plan(q, out, lse, stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            pos = 0
            for b, (s_q, s_kv) in enumerate(FEATURE_SEQS):
                k, v = cache.dense(b)
                ro, rl = feature_reference(q[pos:pos + s_q], k, v, causal=True, scale=1.0 / math.sqrt(D), **kw)
                what = f"{family} {dtype} D{D} page{page} {feat} seq {b} (s_q {s_q}, s_kv {s_kv})"
                check_close(out[pos:pos + s_q], ro, TOL[dtype], f"O {what}")
                check_close(lse[:, pos:pos + s_q], rl, lse_tol(feat.softcap), f"LSE {what}")
                pos += s_q
            assert torch.isnan(out[total:]).all() and torch.isnan(lse[:, total:]).all(), f"{family}: rows past the step"
        else:
            ran += 1
    return ran


def test_fp8_decode_over_dense_kv(rt):
    """Dense e4m3 caches [B, S_max, H_kv, D] (a padded token stride; rows past a sequence's length hold NaN
    bytes, which no kernel may read), per-head scales, against fp64 over the dequantized cache."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    lengths = [0, 1, 17, 1000, 4100]
    B, S_max, H_kv, H_q = len(lengths), max(lengths), 4, 16
    for dtype, D, _ in fp8_decode_variants(rt, paged=False):
        pools, scales = [], []
        for _ in range(2):
            x = torch.randn(B, S_max, H_kv, D + 16, dtype=torch.bfloat16, device="cuda", generator=gen)[..., :D]
            scale = (x.float().abs().amax(dim=(0, 1, 3)) / E4M3_MAX).contiguous()
            storage = torch.empty(B, S_max, H_kv, D + 16, dtype=FP8, device="cuda")
            storage.view(torch.uint8).fill_(POISON)
            x8 = storage[..., :D]
            x8.copy_(quantize(x, scale, 2))
            for b, L in enumerate(lengths):
                x8[b, L:].view(torch.uint8).fill_(POISON)
            pools.append(x8)
            scales.append(scale)
        seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        q = torch.randn(B, 1, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
        out, lse = torch.full_like(q, math.nan), torch.full((B, H_q, 1), math.nan, device="cuda")
        rt.decode(q, pools[0], pools[1], out, seqlens, None, lse, k_descale=scales[0], v_descale=scales[1],
                  stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        for b, L in enumerate(lengths):
            k, v = (p[b, :L].double() * s.double().view(1, -1, 1)
                    for p, s in zip(pools, scales))
            ro, rl = reference(q[b], k, v, 1.0 / math.sqrt(D))
            check_close(out[b], ro, TOL[dtype], f"O {dtype} D{D} dense b={b} L={L}")
            check_close(lse[b], rl, LSE_TOL, f"LSE {dtype} D{D} dense b={b}")


def test_fp8_decode_with_score_features(rt):
    """fp8 decode kernels built with a sliding window, soft-cap or sinks (specs/full.toml; the default bundle has
    none), every feature value of feature_cases.settings, against fp64 attention with the features over the
    dequantized cache; queries scaled so soft-capped scores reach several times the cap."""
    found = sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["kv"], combo_of(k.variant))
                    for k in rt.kernels.get("sdpa_decode", []) if k.variant.get("kv_dtype") == "fp8_e4m3"
                    and k.variant["layout"] == "dense" and k.variant["kv"] != "dense" and combo_of(k.variant)},
                   key=repr)
    if not found:
        pytest.skip("no fp8 decode kernel with score features in this bundle (specs/full.toml builds them)")
    gen = torch.Generator(device="cuda").manual_seed(41)
    lengths = [0, 1, 130, 1000, 5000]
    for dtype, D, kv, combo in found:
        cache = Fp8Cache(lengths, int(kv[len("paged"):]), 8, D, "NHD", gen)
        for feat in settings(combo):
            amp = softcap_amplitude(feat.softcap, 1.0 / math.sqrt(D), D) ** 2  # (on q alone: k is the cache's)
            q = (torch.randn(len(lengths), 2, 32, D, device="cuda", generator=gen) * amp).to(DT[dtype])
            out, lse = torch.full_like(q, math.nan), torch.full((len(lengths), 32, 2), math.nan, device="cuda")
            kw = feat.kwargs(32)
            rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, k_descale=cache.k_scale,
                      v_descale=cache.v_scale, stream=torch.cuda.current_stream(), **kw)
            torch.cuda.synchronize()
            for b in range(len(lengths)):
                k, v = cache.dense(b)
                ro, rl = feature_reference(q[b], k, v, causal=True, scale=1.0 / math.sqrt(D), **kw)
                what = f"{dtype} D{D} {kv} {feat} b={b} L={lengths[b]}"
                check_close(out[b], ro, TOL[dtype], f"O {what}")
                check_close(lse[b], rl, lse_tol(feat.softcap), f"LSE {what}")


def test_fp8_decode_one_chunk_and_many(rt):
    """chunks=1 (no split: the kernel writes O itself) and 64 (every sequence split; the merge scales V once)."""
    dtype, D, kv = fp8_decode_variants(rt)[0]
    gen = torch.Generator(device="cuda").manual_seed(21)
    cache = Fp8Cache([3000, 5, 777], int(kv[len("paged"):]), 4, D, "NHD", gen)
    q = torch.randn(3, 2, 16, D, dtype=DT[dtype], device="cuda", generator=gen)
    for chunks in (1, 64):
        out, lse = torch.full_like(q, math.nan), torch.full((3, 16, 2), math.nan, device="cuda")
        plan = rt.prepare_decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, chunks=chunks,
                                 k_descale=cache.k_scale, v_descale=cache.v_scale)
        plan(q, out, lse, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        check_step(cache, q, out, lse, f"chunks={chunks}")


def test_fp8_decode_cuda_graph_replay_with_new_lengths(rt):
    dtype, D, kv = fp8_decode_variants(rt)[0]
    gen = torch.Generator(device="cuda").manual_seed(22)
    final = [32768, 40, 1, 2000]
    cache = Fp8Cache(final, int(kv[len("paged"):]), 8, D, "NHD", gen)
    q = torch.randn(4, 1, 32, D, dtype=DT[dtype], device="cuda", generator=gen)
    out, lse = torch.empty_like(q), torch.empty(4, 32, 1, device="cuda")

    def set_lengths(lengths):
        cache.lengths = lengths
        cache.seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))

    set_lengths([1, 40, 1, 17])  # (within the page table: its rows hold the pages of `final` only)
    plan = rt.prepare_decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, max_seqlen_kv=max(final),
                             k_descale=cache.k_scale, v_descale=cache.v_scale)
    plan(q, out, lse, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(q, out, lse, stream=torch.cuda.current_stream())
    for step, lengths in enumerate(([32768, 1, 0, 2000], [5, 39, 1, 1999], [17, 40, 1, 2000])):
        set_lengths(lengths)
        out.fill_(math.nan), lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_step(cache, q, out, lse, f"graph step {step}")


def test_fp8_decode_bad_arguments(rt):
    dtype, D, kv = fp8_decode_variants(rt)[0]
    gen = torch.Generator(device="cuda").manual_seed(23)
    cache = Fp8Cache([100, 7], int(kv[len("paged"):]), 4, D, "NHD", gen)
    q = torch.randn(2, 1, 8, D, dtype=DT[dtype], device="cuda", generator=gen)
    out = torch.empty_like(q)
    args = (q, cache.k, cache.v, out, cache.seqlens, cache.page_table)
    with pytest.raises(ArgumentError, match="k_descale"):
        rt.decode(*args)  # an fp8 cache without its scales
    with pytest.raises(ArgumentError, match="v_descale"):
        rt.decode(*args, k_descale=cache.k_scale)
    with pytest.raises(ArgumentError, match="k_descale.dtype"):
        rt.decode(*args, k_descale=cache.k_scale.half(), v_descale=cache.v_scale)
    with pytest.raises(ArgumentError, match=r"k_descale.shape\[0\]"):
        rt.decode(*args, k_descale=torch.ones(3, device="cuda"), v_descale=cache.v_scale)
    with pytest.raises(ArgumentError, match="k_descale"):
        rt.decode(*args, k_descale=cache.k_scale.cpu(), v_descale=cache.v_scale)
    with pytest.raises(ArgumentError, match="v_descale.shape"):
        rt.decode(*args, k_descale=cache.k_scale, v_descale=cache.v_scale[:1])
    bf16 = cache.base
    with pytest.raises(ArgumentError, match="k_descale"):  # scales with a 16-bit cache
        rt.decode(q, bf16.k, bf16.v, out, cache.seqlens, cache.page_table, k_descale=cache.k_scale,
                  v_descale=cache.v_scale)
    with pytest.raises(ArgumentError, match="v_cache.dtype"):  # K fp8, V bf16
        rt.decode(q, cache.k, bf16.v, out, cache.seqlens, cache.page_table, k_descale=cache.k_scale,
                  v_descale=cache.v_scale)


# ---------------------------------------------------------------------------- KV write

def fp8_write_variants(rt):
    vs = sorted({(k.variant["dtype"], k.variant["head_dim"]) for k in rt.kernels.get("kv_write", [])
                 if k.variant.get("kv_dtype") == "fp8_e4m3"})
    assert vs, "the default bundle has no fp8 kv_write kernels"
    return vs


def fp8_pools(num_pages, page, H, D, layout):
    shape = (num_pages, page, H, D) if layout == "NHD" else (num_pages, H, page, D)
    pools = [torch.empty(shape, dtype=FP8, device="cuda") for _ in range(2)]
    for p in pools:
        p.view(torch.uint8).fill_(POISON)
    return pools


def reference_write(key, value, pools, scales, slots, layout):
    """The pools' bytes after a quantizing write: e4m3 of x / scale at each slot in the pools (paged_cases)."""
    news = [quantize(x, scale, 1).view(torch.uint8) for x, scale in zip((key, value), scales)]
    return pools_after_write(pools, news, slots, layout)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("per_head", [True, False])
def test_fp8_kv_write_bytes(rt, layout, per_head):
    gen = torch.Generator(device="cuda").manual_seed(31 + (layout == "HND") + 2 * per_head)
    for dtype, D in fp8_write_variants(rt):
        for page in (16, 32, 64, 128):
            H, tokens = 4, 300
            num_pages = -(-tokens // page) + 3
            pools = fp8_pools(num_pages, page, H, D, layout)
            key = (torch.randn(tokens, H, D, device="cuda", generator=gen) * 3).to(DT[dtype])
            value = (torch.randn(tokens, H, D, device="cuda", generator=gen) * 3).to(DT[dtype])
            scales = [torch.rand(H if per_head else 1, device="cuda", generator=gen) * 0.005 + 0.002 for _ in range(2)]
            slots = torch.randperm(num_pages * page, device="cuda", generator=gen)[:tokens].to(torch.int64)
            slots[::7] = -1
            slots[3] = num_pages * page  # past the pools: skipped
            want = reference_write(key, value, pools, scales, slots, layout)
            rt.kv_write(key, value, pools[0], pools[1], slots, kv_layout=layout, k_scale=scales[0], v_scale=scales[1],
                        stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            for name, pool, w in zip(("k_cache", "v_cache"), pools, want):
                bad = pool.view(torch.uint8) != w
                assert not bad.any(), (f"{dtype} D{D} {layout} page {page} per_head={per_head}: {name} has "
                                       f"{int(bad.sum())} wrong bytes")
            assert (key.float().abs() / scales[0].max() > E4M3_MAX).any(), "no input reached saturation"


def test_fp8_kv_write_rounds_ties_to_even_and_saturates(rt):
    """Scale 1: values halfway between e4m3 neighbours (normal and subnormal) round to the even one, values
    past 448 (and infinities) saturate to +-448, zeros keep their sign."""
    dtype, D = fp8_write_variants(rt)[0]
    ties = [1.0625, 1.1875, 17.0, 19.0, 0.0029296875, 0.0048828125, 240.0, 464.0, 1e4, math.inf, 0.0, -0.0]
    vals = torch.tensor(ties + [-t for t in ties], dtype=torch.float32)
    row = vals.repeat(-(-D // vals.numel()))[:D].to(DT[dtype])
    key = row.view(1, 1, D).repeat(16, 2, 1).cuda()
    pools = fp8_pools(1, 16, 2, D, "NHD")
    one = torch.ones(1, device="cuda")
    slots = torch.arange(16, dtype=torch.int64, device="cuda")
    rt.kv_write(key, key, pools[0], pools[1], slots, k_scale=one, v_scale=one, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    want = quantize(key, one, 1).view(torch.uint8)
    assert torch.equal(pools[0].view(torch.uint8)[0], want)
    got = pools[0][0, 0, 0, :len(ties)].float().tolist()
    assert got[:8] == [1.0, 1.25, 16.0, 20.0, 0.00390625, 0.00390625, 240.0, 448.0], got
    assert got[8:10] == [448.0, 448.0] and math.copysign(1, got[11]) == -1.0


def test_fp8_write_then_decode(rt):
    """The serving order: kv_write quantizes a step's new tokens into the pools, decode reads them."""
    dtype, D = fp8_write_variants(rt)[0]
    gen = torch.Generator(device="cuda").manual_seed(32)
    lengths = [700, 33]
    cache = Fp8Cache(lengths, 16, 8, D, "NHD", gen)
    new_k = torch.randn(2, 8, D, dtype=DT[dtype], device="cuda", generator=gen) * 0.5
    new_v = torch.randn(2, 8, D, dtype=DT[dtype], device="cuda", generator=gen) * 0.5
    slots = torch.tensor([int(cache.page_table[b, L // 16]) * 16 + L % 16 for b, L in enumerate(lengths)],
                         dtype=torch.int64, device="cuda")
    rt.kv_write(new_k, new_v, cache.k, cache.v, slots, k_scale=cache.k_scale, v_scale=cache.v_scale,
                stream=torch.cuda.current_stream())
    cache.lengths = [L + 1 for L in lengths]
    cache.seqlens.copy_(torch.tensor(cache.lengths, dtype=torch.int32))
    q = torch.randn(2, 1, 32, D, dtype=DT[dtype], device="cuda", generator=gen)
    out, lse = torch.full_like(q, math.nan), torch.full((2, 32, 1), math.nan, device="cuda")
    rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, k_descale=cache.k_scale,
              v_descale=cache.v_scale, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    for b, L in enumerate(lengths):
        got = cache.k[int(cache.page_table[b, L // 16]), L % 16].view(torch.uint8)
        assert torch.equal(got, quantize(new_k[b], cache.k_scale, 0).view(torch.uint8))
    check_step(cache, q, out, lse, "write then decode")


def test_fp8_kv_write_bad_arguments(rt):
    dtype, D = fp8_write_variants(rt)[0]
    pools = fp8_pools(4, 16, 2, D, "NHD")
    key = torch.randn(3, 2, D, dtype=DT[dtype], device="cuda")
    slots = torch.arange(3, dtype=torch.int64, device="cuda")
    scale = torch.ones(2, device="cuda")
    with pytest.raises(ArgumentError, match="k_scale"):
        rt.kv_write(key, key, pools[0], pools[1], slots)
    with pytest.raises(ArgumentError, match=r"v_scale.shape\[0\]"):
        rt.kv_write(key, key, pools[0], pools[1], slots, k_scale=scale, v_scale=torch.ones(5, device="cuda"))
    with pytest.raises(ArgumentError, match="k_scale"):
        bf = torch.empty(4, 16, 2, D, dtype=DT[dtype], device="cuda")
        rt.kv_write(key, key, bf, bf.clone(), slots, k_scale=scale, v_scale=scale)
    assert (pools[0].view(torch.uint8) == POISON).all(), "a refused call wrote"
