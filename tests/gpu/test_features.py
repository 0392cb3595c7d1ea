"""The attention features on the GPU: sliding window (window_left), soft-cap (softcap) and attention sinks
(sinks), alone and combined, through every entry point that takes them (rt.prefill and rt.prefill_ragged on
both prefill families, rt.decode, rt.attention, torch.ops.aotc.attention), against an fp64 torch reference.

What is checked:
* every feature variant the loaded bundle holds (discovered from rt.kernels[family] and each kernel's
  variant["window"], ["softcap"], ["sinks"]; test_bundle_holds_feature_variants asserts each attention family
  has some, and every test asserts it found the variants it runs, so none passes vacuously), each called with
  exactly its features on, through N_SETTINGS settings: windows 1, 127, 128, 4096 and 100000 (larger than any
  sequence), soft-caps 30 and 50 over scores scaled up to several times the cap (q and k multiplied so
  scale * q.k ~ N(0, (2 * cap)^2)), sinks +20 (dominating), -30 (negligible) and mixed per head (including
  values comparable to the rows' log-sum);
* shapes: causal chunks over a prefix (s_q < s_kv), rows that see no key (s_q > s_kv: O = 0 and LSE = sink, or
  -inf without sinks), 4500 keys for the 4096 window, GQA and MQA, batches of lengths that are not multiples
  of 64 or 128, dense tensors in three memory layouts, ragged (THD) batches, paged pools in NHD and HND;
  decode with S_q 1 and 4 over contexts up to 10000 keys, unsplit (chunks=1) and split across CTAs
  (chunks=7 and the default), so a sink counted more than once in the split merge shows; the serving entry
  point on a mixed batch (decode rows and chunks over a prefix) with decode_query_len 1 and 4;
* repeated calls with the same tensors and new feature values (window, cap, a new sinks tensor, a sinks
  tensor rewritten in place): the one-call APIs cache plans by layout, and each call must follow its values;
* refusals (ArgumentError before any launch: the NaN-poisoned out and LSE stay NaN): window_left -1, a window
  without causal, softcap 0, NaN or negative, sinks of the wrong dtype, shape, device or strides; and a
  feature no loaded kernel has for the call's dtype/head dim (the message names the feature).

Reference (feature_cases.reference): the same fp16/bf16 inputs upcast to fp64; scores scale * q.k, soft-cap
c * tanh(s / c) before masking, the bottom-right causal mask and the window (row i at p = i + s_kv - s_q sees
keys p - w .. p), softmax whose denominator adds exp(sink_h), O = P V, LSE = log(exp(sink_h) + sum exp(s))
(natural log); GQA maps query head h to KV head h // (H_q / H_kv).

Tolerances (|got - ref| <= atol + rtol * |ref|, as the other GPU tests): O bf16 2e-2/2e-2, fp16 4e-3/4e-3;
LSE 2e-3/2e-3. With soft-cap on, the kernels evaluate tanh with tanh.approx.f32 (documented relative error
2^-11), so a capped score may be off by up to softcap * 2^-11: LSE's atol gains softcap * 2^-10 for those calls
(feature_cases.lse_tol); O's tolerance is left as is. (An error that large on every score could move O of a
row over a few keys past bf16's 2e-2; on an H200 tanh.approx.f32 measured a largest relative error of 9.9e-6,
about 2^-16.6, over [-12, 12], so O keeps the plain tolerance.) Outputs and LSE are NaN-poisoned before every
call, and rows of out/LSE a call must not write stay NaN.
"""
from __future__ import annotations

import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from common import check_close
from feature_cases import (DECODE_KEY, FEATURES, N_SETTINGS, PREFILL_FAMILIES, PREFILL_KEY, DenseKV, Features,
                           combo_of, feature_variants, lse_tol, make_sinks, reference, settings, softcap_amplitude)
from paged_cases import PagedCache
from prefill_cases import DT, TOL, alloc

pytestmark = pytest.mark.gpu

ATTENTION_FAMILIES = ("sdpa_prefill", "sdpa_prefill_sm90", "sdpa_decode")
POISON = 1.0e4  # pool slots no sequence owns (finite in fp16 and bf16: a key or value of this size ruins a row)

# (B, S_q, S_kv, H_q, H_kv, layout) and softmax_scale (None: 1/sqrt(D)), one per setting index
DENSE_SHAPES = [
    (2, 200, 333, 4, 2, "bshd"),     # a chunk over a prefix (s_q < s_kv); window 1
    (2, 257, 700, 4, 1, "bhsd"),     # MQA; window 127
    (3, 300, 190, 4, 4, "bshd"),     # s_q > s_kv: causal rows 0..109 see no key; window 128
    (1, 4500, 4500, 2, 1, "bshd"),   # window 4096 over 4500 keys
    (2, 100, 1000, 4, 2, "padded"),  # a window larger than the sequence
]
DENSE_SCALES = (None, None, None, None, 0.05)

# (seqlens_q, seqlens_kv, H_q, H_kv), one per setting index
RAGGED_SHAPES = [
    ([7, 0, 200, 129], [7, 5, 333, 129], 4, 2),
    ([1, 257, 65], [1, 700, 10], 4, 1),  # the last sequence: s_q > s_kv
    ([128, 300, 3], [128, 190, 3], 4, 4),
    ([4200, 17], [4500, 17], 2, 1),      # window 4096
    ([100, 0, 33], [1000, 0, 77], 4, 2),
]

# (KV lengths, H_q, H_kv), one per setting index: each batch holds a context long enough to be split across CTAs
DECODE_SHAPES = [
    ([0, 1, 2, 17, 1000, 6000], 8, 2),  # window 1; length 0 (and 2 with S_q 4): rows that see no key
    ([1, 127, 128, 129, 5000], 8, 1),   # window 127 around the 128 boundary
    ([3, 130, 10000], 16, 2),           # window 128
    ([10000, 4097, 6000], 8, 2),        # window 4096 over long contexts, B = 3: split-KV
    ([3000, 7, 0], 4, 4),               # a window larger than every context
]

# (s_q, s_kv) of the serving entry point's mixed batch: decode rows (S_q 1 and 4) over short and long contexts,
# an empty sequence, rows that see no key (5 over 2), chunks over a prefix of 0 and of thousands of keys
MIXED = [(1, 1), (1, 17), (1, 9000), (4, 4), (4, 130), (4, 4999), (0, 50), (5, 2), (300, 300), (517, 4700),
         (1000, 1129)]
MIXED_SETTINGS = (1, 2, 3)  # windows 127, 128 and 4096 (caps 50, 30, 50; sinks tiny, mixed, big)
# few query tokens over long contexts: fewer GQA-packed tiles than SMs, so the paged kernel splits each tile's kv
# blocks over several CTAs (the sink joins one split's softmax; a window leaves a tile few blocks to split)
SPLIT_MIXED = [(64, 20064), (1, 5000), (5, 40005), (0, 100), (17, 9017)]


def _features_str(combo):
    return "+".join(combo)


def _check(out, lse, ref, dtype, softcap, what):
    ro, rl = ref
    check_close(out, ro, TOL[dtype], "O " + what)
    if lse is not None:
        check_close(lse, rl, lse_tol(softcap), "LSE " + what)


def _ref_kw(kw, causal, scale):
    return dict(causal=causal, scale=scale, window_left=kw["window_left"], softcap=kw["softcap"], sinks=kw["sinks"])


def _prefill_variants(rt, family, layout):
    vs = [v for v in feature_variants(rt, family, PREFILL_KEY) if v[2] == layout]
    assert vs, f"the bundle holds no {layout} {family} kernel with window, softcap or sinks"
    return vs


def _strides_of(rt, family, dtype, D, layout, causal, combo):
    return {k.variant.get("strides") for k in rt.kernels.get(family, [])
            if (k.variant["dtype"], k.variant["head_dim"], k.variant["layout"], k.variant["causal"]) ==
            (dtype, D, layout, causal) and combo_of(k.variant) == combo}


# ---- the bundle ---------------------------------------------------------------------------------------------
def test_bundle_holds_feature_variants(rt):
    """Every attention family holds kernels with features (else the tests below would have nothing to run), and
    a window kernel of a prefill family is causal (a window is defined for causal attention only)."""
    for family in ATTENTION_FAMILIES:
        kernels = rt.kernels.get(family, [])
        combos = {combo_of(k.variant) for k in kernels} - {()}
        assert combos, f"{family}: no loaded kernel has window, softcap or sinks ({len(kernels)} kernels)"
        if family in PREFILL_FAMILIES:
            acausal = [k.variant.name for k in kernels if k.variant.get("window", False) and not k.variant["causal"]]
            assert not acausal, f"window kernels without causal: {acausal[:4]}"


# ---- prefill ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("index", range(N_SETTINGS))
@pytest.mark.parametrize("family", PREFILL_FAMILIES)
def test_prefill_dense(rt, family, index):
    """rt.prefill forced to one family, every dense feature variant at setting `index` (DENSE_SHAPES[index]);
    setting 0 runs once more without lse."""
    B, S_q, S_kv, H_q, H_kv, layout = DENSE_SHAPES[index]
    for dtype, D, _, causal, combo in _prefill_variants(rt, family, "dense"):
        f = settings(combo)[index]
        lay = layout
        if family == "sdpa_prefill" and "general" not in _strides_of(rt, family, dtype, D, "dense", causal, combo):
            lay = "bshd"  # the packed-stride specialization alone carries these features
        torch.manual_seed(1000 * index + D + len(combo))
        scale = DENSE_SCALES[index] or D ** -0.5
        q, k, v = (alloc(B, S, H, D, dtype, lay) for S, H in ((S_q, H_q), (S_kv, H_kv), (S_kv, H_kv)))
        amp = softcap_amplitude(f.softcap, scale, D)
        q.mul_(amp), k.mul_(amp)
        out = alloc(B, S_q, H_q, D, dtype, lay, fill=math.nan)
        lse = torch.full((B, H_q, S_q), math.nan, device="cuda")
        kw = f.kwargs(H_q)
        rt.prefill(q, k, v, out, lse, causal=causal, softmax_scale=DENSE_SCALES[index], family=family, **kw)
        torch.cuda.synchronize()
        what = f"{family} {dtype} D{D} causal={causal} [{_features_str(combo)}] {f} B{B} S_q{S_q} S_kv{S_kv} {lay}"
        refs = [reference(q[b], k[b], v[b], **_ref_kw(kw, causal, scale)) for b in range(B)]
        for b in range(B):
            _check(out[b], lse[b], refs[b], dtype, f.softcap, f"{what} batch {b}")
        if index == 0:
            out.fill_(math.nan)
            rt.prefill(q, k, v, out, causal=causal, softmax_scale=DENSE_SCALES[index], family=family, **kw)
            torch.cuda.synchronize()
            for b in range(B):
                _check(out[b], None, refs[b], dtype, f.softcap, f"{what} lse=None batch {b}")


# 63 and 64: either side of the fixed-offset bound of the soft-capped softmax (softcap * log2(e) <= 92, softcap
# <= 63.77: aotc.kernels.softmax.CAPPED_MAX_SCALE_LOG2), which bf16 Hopper kernels take below it and leave above
@pytest.mark.parametrize("softcap", [30.0, 50.0, 63.0, 64.0])
@pytest.mark.parametrize("family", PREFILL_FAMILIES)
def test_softcap_logits_within_and_beyond_the_cap(rt, family, softcap):
    """Soft-cap over logits within the cap (most logits of the models that use one; test_prefill_dense's reach
    several times the cap) and beyond it, in one launch: head 0's logits about N(0, (softcap / 8)^2), head 1's
    about N(0, (2 softcap)^2), head 2's like head 0's but for a few keys 24 times larger, head 3's all about
    -3 softcap and head 4's all about +3 softcap (every capped logit of a row within 0.5% of -softcap or
    +softcap: the extremes of the fixed offset's range, p about 2^(64 - 2 softcap log2 e) and 2^64); every
    soft-cap dense variant, against the fp64 reference."""
    vs = [v for v in _prefill_variants(rt, family, "dense") if "softcap" in v[4]]
    if not vs:
        pytest.skip(f"the bundle holds no dense {family} kernel with softcap")
    S, H = 1000, 5
    for dtype, D, _, causal, combo in vs:
        torch.manual_seed(D + int(softcap))
        scale = D ** -0.5
        q, k, v = (alloc(1, S, H, D, dtype, "bshd") for _ in range(3))
        for h, sigma in enumerate((softcap / 8, 2 * softcap, softcap / 8)):
            amp = math.sqrt(sigma / (scale * math.sqrt(D)))
            q[:, :, h].mul_(amp), k[:, :, h].mul_(amp)
        k[:, 100::300, 2].mul_(24.0)
        # heads 3 and 4: q and k along one unit direction u (plus 0.1 N(0, 1) noise), scale * q.k = -/+ 3 softcap
        u = torch.nn.functional.normalize(torch.randn(D, device="cuda"), dim=0)
        amp = math.sqrt(3 * softcap / scale)
        for h, sign in ((3, -1.0), (4, 1.0)):
            q[:, :, h] = (sign * amp * u + 0.1 * torch.randn(S, D, device="cuda")).to(DT[dtype])
            k[:, :, h] = (amp * u + 0.1 * torch.randn(S, D, device="cuda")).to(DT[dtype])
        out = alloc(1, S, H, D, dtype, "bshd", fill=math.nan)
        lse = torch.full((1, H, S), math.nan, device="cuda")
        sinks = make_sinks("mixed", H) if "sinks" in combo else None
        kw = {"window_left": 127 if "window" in combo else None, "softcap": softcap, "sinks": sinks}
        rt.prefill(q, k, v, out, lse, causal=causal, family=family, **kw)
        torch.cuda.synchronize()
        ref = reference(q[0], k[0], v[0], **_ref_kw(kw, causal, scale))
        _check(out[0], lse[0], ref, dtype, softcap, f"{family} {dtype} D{D} causal={causal} [{_features_str(combo)}] "
                                                    f"softcap {softcap} within and beyond the cap")


@pytest.mark.parametrize("index", range(N_SETTINGS))
@pytest.mark.parametrize("family", PREFILL_FAMILIES)
def test_prefill_ragged(rt, family, index):
    """rt.prefill_ragged forced to one family, every ragged feature variant at setting `index`
    (RAGGED_SHAPES[index]); LSE [H_q, total_q]."""
    lq, lkv, H_q, H_kv = RAGGED_SHAPES[index]
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_kv = torch.tensor([0] + list(torch.tensor(lkv).cumsum(0)), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(2000 + index)
    for dtype, D, _, causal, combo in _prefill_variants(rt, family, "ragged"):
        f = settings(combo)[index]
        t = DT[dtype]
        scale = D ** -0.5
        amp = softcap_amplitude(f.softcap, scale, D)
        q = (torch.randn(sum(lq), H_q, D, device="cuda", generator=gen) * amp).to(t)
        k = (torch.randn(sum(lkv), H_kv, D, device="cuda", generator=gen) * amp).to(t)
        v = torch.randn(sum(lkv), H_kv, D, device="cuda", generator=gen).to(t)
        out = torch.full_like(q, math.nan)
        lse = torch.full((H_q, sum(lq)), math.nan, device="cuda")
        kw = f.kwargs(H_q)
        rt.prefill_ragged(q, k, v, out, cu_q, cu_kv, max(lq), max(lkv), lse, causal=causal, family=family, **kw)
        torch.cuda.synchronize()
        what = f"ragged {family} {dtype} D{D} causal={causal} [{_features_str(combo)}] {f}"
        for b in range(len(lq)):
            qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_kv[b]), int(cu_kv[b + 1])
            ref = reference(q[qs:qe], k[ks:ke], v[ks:ke], **_ref_kw(kw, causal, scale))
            _check(out[qs:qe], lse[:, qs:qe], ref, dtype, f.softcap, f"{what} seq {b} (s_q {qe - qs}, s_kv {ke - ks})")


# ---- decode -------------------------------------------------------------------------------------------------
def _decode_variants(rt):
    vs = [v for v in feature_variants(rt, "sdpa_decode", DECODE_KEY) if v[3] == "dense"]  # q [B, S_q, H_q, D]
    assert vs, "the bundle holds no sdpa_decode kernel with window, softcap or sinks"
    return vs


def _decode_cache(kv, lengths, H_kv, D, dtype, layout, gen, amp):
    cache = (DenseKV(lengths, H_kv, D, dtype, gen) if kv == "dense" else
             PagedCache(lengths, int(kv[len("paged"):]), H_kv, D, dtype, layout, gen))
    cache.k.mul_(amp)
    cache.poison(POISON)
    return cache


def _decode_check(cache, q, out, lse, kw, softcap, dtype, what):
    torch.cuda.synchronize()
    D = q.shape[-1]
    for b in range(q.shape[0]):
        ref = reference(q[b], *cache.dense(b), **_ref_kw(kw, True, D ** -0.5))
        _check(out[b], lse[b], ref, dtype, softcap, f"{what} b={b} L={cache.lengths[b]}")


@pytest.mark.parametrize("index", range(N_SETTINGS))
def test_decode(rt, index):
    """rt.decode, every feature variant at setting `index` (DECODE_SHAPES[index]), S_q 1 and 4, unsplit
    (chunks=1) and split across CTAs (chunks=7, and the default: one wave)."""
    lengths, H_q, H_kv = DECODE_SHAPES[index]
    layout = ("NHD", "HND")[index % 2]
    gen = torch.Generator(device="cuda").manual_seed(3000 + index)
    for dtype, D, kv, _, combo in _decode_variants(rt):
        f = settings(combo)[index]
        amp = softcap_amplitude(f.softcap, D ** -0.5, D)
        cache = _decode_cache(kv, lengths, H_kv, D, dtype, layout, gen, amp)
        kw = f.kwargs(H_q)
        for S_q in (1, 4):
            q = torch.randn(len(lengths), S_q, H_q, D, dtype=DT[dtype], device="cuda", generator=gen).mul_(amp)
            out, lse = torch.empty_like(q), torch.empty(len(lengths), H_q, S_q, device="cuda")
            for chunks in (1, 7, None):
                out.fill_(math.nan), lse.fill_(math.nan)
                rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, max_seqlen_kv=max(lengths),
                          kv_layout=cache.layout, chunks=chunks, stream=torch.cuda.current_stream(), **kw)
                _decode_check(cache, q, out, lse, kw, f.softcap, dtype,
                              f"decode {dtype} D{D} {kv} {cache.layout} [{_features_str(combo)}] {f} S_q={S_q} "
                              f"chunks={chunks}")
        del cache
    torch.cuda.empty_cache()


# ---- the serving entry point ----------------------------------------------------------------------------------
def _paged_variants(rt, family="sdpa_prefill_sm90"):
    vs = [v for v in feature_variants(rt, family, PREFILL_KEY) if str(v[2]).startswith("paged")]
    assert vs, f"the bundle holds no paged {family} kernel with window, softcap or sinks"
    return vs


def _heads(D, odd_group=False):
    """D64: gpt-oss's 64 query heads over 8 KV heads; odd_group: a group that does not divide the kernel's 64-row
    slabs (7 for D64, 5 otherwise: Qwen2.5's 28/4 and 40/8), whose sinks and masks follow each packed row."""
    if odd_group:
        return (56, 8) if D == 64 else (20, 4)
    return (64, 8) if D == 64 else (16, 4)


class Mixed:
    """A mixed batch (MIXED-like (s_q, s_kv) per sequence) over one PagedCache: q [total_q + 3, H_q, D] (3 rows
    past cu_seqlens_q[-1] that must stay unwritten), out and LSE NaN-poisoned, the metadata tensors."""

    def __init__(self, seqs, page, H_q, H_kv, D, dtype, kv_layout, gen, amp=1.0):
        self.seqs, self.dtype, self.H_q, self.D = list(seqs), dtype, H_q, D
        self.cache = PagedCache([s_kv for _, s_kv in seqs], page, H_kv, D, dtype, kv_layout, gen, pad_entry="spare")
        self.cache.k.mul_(amp)
        self.cache.poison(POISON)
        self.total = sum(s_q for s_q, _ in seqs)
        self.rows = self.total + 3
        self.q = torch.randn(self.rows, H_q, D, dtype=DT[dtype], device="cuda", generator=gen).mul_(amp)
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(H_q, self.rows, device="cuda")
        cu = [0]
        for s_q, _ in seqs:
            cu.append(cu[-1] + s_q)
        self.cu = torch.tensor(cu, dtype=torch.int32, device="cuda")
        self.meta = (self.cu, self.cache.seqlens, self.cache.page_table)
        self.bounds = dict(max_seqlen_q=max(s_q for s_q, _ in seqs), max_seqlen_kv=max(s_kv for _, s_kv in seqs))
        self.poison()

    def poison(self):
        self.out.fill_(math.nan)
        self.lse.fill_(math.nan)

    def attend(self, rt, kw, **extra):
        rt.attention(self.q, self.cache.k, self.cache.v, self.out, *self.meta, lse=self.lse,
                     kv_layout=self.cache.layout, stream=torch.cuda.current_stream(), **self.bounds, **extra, **kw)

    def references(self, kw, scale=None):
        scale = self.D ** -0.5 if scale is None else scale
        refs, pos = [], 0
        for b, (s_q, s_kv) in enumerate(self.seqs):
            refs.append(reference(self.q[pos:pos + s_q], *self.cache.dense(b, s_kv), **_ref_kw(kw, True, scale)))
            pos += s_q
        return refs

    def check(self, refs, softcap, what):
        torch.cuda.synchronize()
        pos = 0
        for b, ((s_q, s_kv), ref) in enumerate(zip(self.seqs, refs)):
            _check(self.out[pos:pos + s_q], self.lse[:, pos:pos + s_q], ref, self.dtype, softcap,
                   f"{what}: seq {b} (s_q {s_q}, s_kv {s_kv})")
            pos += s_q
        assert torch.isnan(self.out[pos:]).all(), f"{what}: rows of out past cu_seqlens_q[-1] written"
        assert torch.isnan(self.lse[:, pos:]).all(), f"{what}: LSE past cu_seqlens_q[-1] written"


@pytest.mark.parametrize("index", MIXED_SETTINGS)
def test_attention_mixed_batch(rt, index):
    """rt.attention on a mixed batch (MIXED) for every paged feature variant of sdpa_prefill_sm90 (its decode
    rows on sdpa_decode's ragged kernels), decode_query_len 1 and 4 (the S_q 4 rows on either kernel)."""
    attention_mixed_batch(rt, index)


@pytest.mark.parametrize("index", MIXED_SETTINGS)
def test_attention_kv_splits_with_the_features(rt, index):
    """test_attention_mixed_batch on SPLIT_MIXED: the paged kernel's KV splits with every feature variant."""
    attention_mixed_batch(rt, index, seqs=SPLIT_MIXED)


def attention_mixed_batch(rt, index, family="sdpa_prefill_sm90", seqs=MIXED):
    """test_attention_mixed_batch for the paged feature variants of `family` (test_attention_portable.py runs
    it for the portable family's, on a bundle without Hopper kernels), over the batch `seqs`."""
    gen = torch.Generator(device="cuda").manual_seed(4000 + index)
    for n, (dtype, D, layout, causal, combo) in enumerate(_paged_variants(rt, family)):
        assert causal, f"paged {family} {dtype} D{D} {layout} [{_features_str(combo)}]: not causal"
        f = settings(combo)[index]
        H_q, H_kv = _heads(D, odd_group=index == 2)
        kv_layout = ("NHD", "HND")[(n + index) % 2]
        b = Mixed(seqs, int(layout[len("paged"):]), H_q, H_kv, D, dtype, kv_layout, gen,
                  softcap_amplitude(f.softcap, D ** -0.5, D))
        kw = f.kwargs(H_q)
        refs = b.references(kw)
        for dq in (1, 4):
            b.poison()
            b.attend(rt, kw, decode_query_len=dq)
            b.check(refs, f.softcap, f"attention {dtype} D{D} {layout} {kv_layout} H{H_q}/{H_kv} "
                                     f"[{_features_str(combo)}] {f} decode_query_len={dq}")
        del b
    torch.cuda.empty_cache()


def test_torch_op_attention_with_the_features(rt, ops):
    """torch.ops.aotc.attention with window_left, softcap and sinks as keyword arguments (those the variant lacks
    passed as None): a paged feature variant (window + sinks first, as gpt-oss) on a mixed batch."""
    vs = _paged_variants(rt)
    dtype, D, layout, _, combo = sorted(vs, key=lambda v: (v[4] != ("window", "sinks"), v[1] != 64, repr(v)))[0]
    f = settings(combo)[1]
    H_q, H_kv = _heads(D)
    gen = torch.Generator(device="cuda").manual_seed(5000)
    b = Mixed(MIXED[:8] + [(300, 1300)], int(layout[len("paged"):]), H_q, H_kv, D, dtype, "NHD", gen,
              softcap_amplitude(f.softcap, D ** -0.5, D))
    kw = f.kwargs(H_q)
    ops.register()  # idempotent: torch.ops.aotc.* defined whatever was imported first
    torch.ops.aotc.attention(b.q, b.cache.k, b.cache.v, *b.meta, b.out, b.lse, kv_layout="NHD",
                             max_seqlen_q=b.bounds["max_seqlen_q"], window_left=kw["window_left"],
                             softcap=kw["softcap"], sinks=kw["sinks"])
    b.check(b.references(kw), f.softcap, f"torch.ops.aotc.attention {dtype} D{D} {layout} [{_features_str(combo)}] {f}")


# ---- repeated calls with new feature values ----------------------------------------------------------------
def _calls(combo, H_q):
    """Three calls' feature values: setting 1, setting 2 (another window and cap, a new sinks tensor), setting 1
    again with its sinks tensor rewritten in place (same pointer, new values)."""
    s = settings(combo)
    first = make_sinks(s[1].sinks, H_q)
    calls = [(s[1], first), (s[2], make_sinks(s[2].sinks, H_q)), (s[1], first)]
    for n, (f, sinks) in enumerate(calls):
        if n == 2 and sinks is not None:
            sinks.copy_(make_sinks("mixed", H_q).flip(0))
        yield n, f, {"window_left": f.window_left, "softcap": f.softcap, "sinks": sinks}


def _one_per_combo(vs, causal_at=None):
    """One variant per feature combination (a causal one first where causal_at names the causal field)."""
    pick = {}
    for v in sorted(vs, key=lambda v: (causal_at is not None and not v[causal_at], repr(v))):
        pick.setdefault(v[-1], v)
    return [pick[c] for c in sorted(pick)]


@pytest.mark.parametrize("entry", ["prefill", "decode", "attention"])
def test_repeated_calls_follow_new_feature_values(rt, entry):
    """The one-call APIs cache a plan per layout: the same tensors called again with another window, cap or
    sinks tensor, and with the sinks tensor rewritten in place, must give each call's own result (one variant
    of each loaded feature combination)."""
    gen = torch.Generator(device="cuda").manual_seed(6000)
    cap = 30.0  # q and k scaled for the lower cap: several times either cap
    if entry == "prefill":
        for family in PREFILL_FAMILIES:
            for dtype, D, _, causal, combo in _one_per_combo(_prefill_variants(rt, family, "dense"), causal_at=3):
                torch.manual_seed(6001)
                amp = softcap_amplitude(cap if "softcap" in combo else None, D ** -0.5, D)
                q, k = alloc(2, 300, 4, D, dtype, "bshd").mul_(amp), alloc(2, 700, 2, D, dtype, "bshd").mul_(amp)
                v = alloc(2, 700, 2, D, dtype, "bshd")
                out = alloc(2, 300, 4, D, dtype, "bshd", fill=math.nan)
                lse = torch.full((2, 4, 300), math.nan, device="cuda")
                for n, f, kw in _calls(combo, 4):
                    out.fill_(math.nan), lse.fill_(math.nan)
                    rt.prefill(q, k, v, out, lse, causal=causal, family=family, **kw)
                    torch.cuda.synchronize()
                    for b in range(2):
                        _check(out[b], lse[b], reference(q[b], k[b], v[b], **_ref_kw(kw, causal, D ** -0.5)), dtype,
                               f.softcap, f"{family} {dtype} D{D} [{_features_str(combo)}] call {n} ({f}) batch {b}")
    elif entry == "decode":
        for dtype, D, kv, _, combo in _one_per_combo(_decode_variants(rt)):
            amp = softcap_amplitude(cap if "softcap" in combo else None, D ** -0.5, D)
            cache = _decode_cache(kv, [5000, 130, 0], 2, D, dtype, "NHD", gen, amp)
            q = torch.randn(3, 4, 8, D, dtype=DT[dtype], device="cuda", generator=gen).mul_(amp)
            out, lse = torch.empty_like(q), torch.empty(3, 8, 4, device="cuda")
            for n, f, kw in _calls(combo, 8):
                out.fill_(math.nan), lse.fill_(math.nan)
                rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, kv_layout=cache.layout,
                          stream=torch.cuda.current_stream(), **kw)
                _decode_check(cache, q, out, lse, kw, f.softcap, dtype,
                              f"decode {dtype} D{D} {kv} [{_features_str(combo)}] call {n} ({f})")
    else:
        for dtype, D, layout, _, combo in _one_per_combo(_paged_variants(rt)):
            amp = softcap_amplitude(cap if "softcap" in combo else None, D ** -0.5, D)
            H_q, H_kv = _heads(D)
            b = Mixed([(1, 3000), (4, 200), (300, 1000), (0, 9)], int(layout[len("paged"):]), H_q, H_kv, D, dtype,
                      "HND", gen, amp)
            for n, f, kw in _calls(combo, H_q):
                b.poison()
                b.attend(rt, kw)
                b.check(b.references(kw), f.softcap, f"attention {dtype} D{D} {layout} [{_features_str(combo)}] "
                                                     f"call {n} ({f})")


# ---- refusals -----------------------------------------------------------------------------------------------
def test_missing_feature_kernel_is_an_argument_error(rt):
    """A feature asked of a dtype/head dim no loaded kernel serves with it is an ArgumentError naming the feature
    (prefill, family auto: neither family has it; decode), before any launch."""
    ran = 0
    plain, capped = set(), set()
    for family in PREFILL_FAMILIES:
        for k in rt.kernels.get(family, []):
            v = k.variant
            if v["layout"] == "dense":
                (capped if v.get("softcap", False) else plain).add((v["dtype"], v["head_dim"], v["causal"]))
    gaps = sorted(x for x in plain if x[:2] not in {c[:2] for c in capped})
    if gaps:
        dtype, D, causal = gaps[0]
        q, k = alloc(1, 64, 4, D, dtype, "bshd"), alloc(1, 64, 2, D, dtype, "bshd")
        out = alloc(1, 64, 4, D, dtype, "bshd", fill=math.nan)
        lse = torch.full((1, 4, 64), math.nan, device="cuda")
        with pytest.raises(ArgumentError, match="softcap"):
            rt.prefill(q, k, k, out, lse, causal=causal, softcap=30.0)
        torch.cuda.synchronize()
        assert torch.isnan(out).all() and torch.isnan(lse).all(), "a refused prefill launched"
        ran += 1
    plain, capped = set(), set()
    for k in rt.kernels.get("sdpa_decode", []):
        v = k.variant
        if v["layout"] == "dense" and v["kv"] != "dense":
            (capped if v.get("softcap", False) else plain).add((v["dtype"], v["head_dim"], v["kv"]))
    gaps = sorted(x for x in plain if x not in capped)
    if gaps:
        dtype, D, kv = gaps[0]
        gen = torch.Generator(device="cuda").manual_seed(7000)
        cache = PagedCache([50, 60], int(kv[len("paged"):]), 2, D, dtype, "NHD", gen)
        q = torch.randn(2, 1, 4, D, dtype=DT[dtype], device="cuda", generator=gen)
        out = torch.full_like(q, math.nan)
        with pytest.raises(ArgumentError, match="softcap"):
            rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, softcap=30.0)
        torch.cuda.synchronize()
        assert torch.isnan(out).all(), "a refused decode launched"
        ran += 1
    if not ran:
        pytest.skip("every loaded dtype/head dim has a softcap kernel: no gap to ask for")


class Target:
    """An entry point's call on small tensors of a dtype/head dim whose kernels carry a feature: call(causal,
    **features), the NaN-poisoned outputs, the chosen variant's combo and causal, check(features, what)."""

    def __init__(self, rt, entry, feature, gen):
        H_q, H_kv = 8, 2
        self.heads_q = H_q
        if entry in ("prefill", "prefill_ragged"):
            layout = "dense" if entry == "prefill" else "ragged"
            vs = [v for fam in PREFILL_FAMILIES for v in feature_variants(rt, fam, PREFILL_KEY) if v[2] == layout]
            assert vs, f"the bundle holds no {layout} prefill kernel with window, softcap or sinks"
            dtype, D, _, self.causal, self.combo = _with(vs, feature, causal_at=3)
            lead = (1,) if entry == "prefill" else ()
            q = torch.randn(*lead, 64, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
            k = torch.randn(*lead, 64, H_kv, D, dtype=DT[dtype], device="cuda", generator=gen)
            out = torch.full_like(q, math.nan)
            lse = torch.full((*lead, H_q, 64), math.nan, device="cuda")
            cu = torch.tensor([0, 64], dtype=torch.int32, device="cuda")

            def call(causal, **kw):
                if entry == "prefill":
                    rt.prefill(q, k, k, out, lse, causal=causal, **kw)
                else:
                    rt.prefill_ragged(q, k, k, out, cu, cu, 64, 64, lse, causal=causal, **kw)

            def check(kw, what):
                torch.cuda.synchronize()
                qq, kk, oo, ll = (q[0], k[0], out[0], lse[0]) if entry == "prefill" else (q, k, out, lse)
                _check(oo, ll, reference(qq, kk, kk, **_ref_kw(kw, self.causal, D ** -0.5)), dtype, kw["softcap"],
                       what)
        elif entry == "decode":
            dtype, D, kv, _, self.combo = _with(_decode_variants(rt), feature)
            self.causal = True  # decode has no causal argument
            cache = _decode_cache(kv, [50, 60], H_kv, D, dtype, "NHD", gen, 1.0)
            q = torch.randn(2, 1, H_q, D, dtype=DT[dtype], device="cuda", generator=gen)
            out, lse = torch.full_like(q, math.nan), torch.full((2, H_q, 1), math.nan, device="cuda")

            def call(causal, **kw):
                assert causal
                rt.decode(q, cache.k, cache.v, out, cache.seqlens, cache.page_table, lse, kv_layout=cache.layout,
                          **kw)

            def check(kw, what):
                _decode_check(cache, q, out, lse, kw, kw["softcap"], dtype, what)
        else:
            dtype, D, layout, self.causal, self.combo = _with(_paged_variants(rt), feature, causal_at=3)
            b = Mixed([(1, 50), (20, 60)], int(layout[len("paged"):]), H_q, H_kv, D, dtype, "NHD", gen)
            out, lse = b.out, b.lse

            def call(causal, **kw):
                b.attend(rt, kw, causal=causal)

            def check(kw, what):
                b.check(b.references(kw), kw["softcap"], what)

        self.call, self.check, self.outputs = call, check, (out, lse)
        self.what = f"{entry} {dtype} D{D} [{_features_str(self.combo)}]"


def _with(vs, feature, causal_at=None):
    """A variant carrying `feature` (any feature variant where none does), a causal one first."""
    pool = [v for v in vs if feature in v[-1]] or list(vs)
    if causal_at is not None:
        pool.sort(key=lambda v: not v[causal_at])
    return pool[0]


def _bad_cases(H_q):
    """(what, the feature whose kernels the tensors suit, causal (None: the variant's), features, words one of
    which the message must have)."""
    f32 = dict(dtype=torch.float32, device="cuda")
    return [
        ("window_left=-1", "window", True, dict(window_left=-1), ("window_left",)),
        ("window_left without causal", "window", False, dict(window_left=64), ("window", "causal")),
        ("softcap=0", "softcap", None, dict(softcap=0.0), ("softcap",)),
        ("softcap=nan", "softcap", None, dict(softcap=float("nan")), ("softcap",)),
        ("softcap=-30", "softcap", None, dict(softcap=-30.0), ("softcap",)),
        ("sinks bf16", "sinks", None, dict(sinks=torch.zeros(H_q, dtype=torch.bfloat16, device="cuda")), ("sinks",)),
        ("sinks [H_q + 1]", "sinks", None, dict(sinks=torch.zeros(H_q + 1, **f32)), ("sinks",)),
        ("sinks [1, H_q]", "sinks", None, dict(sinks=torch.zeros(1, H_q, **f32)), ("sinks",)),
        ("sinks on the CPU", "sinks", None, dict(sinks=torch.zeros(H_q, dtype=torch.float32)), ("sinks",)),
        ("sinks not contiguous", "sinks", None, dict(sinks=torch.zeros(2 * H_q, **f32)[::2]), ("sinks",)),
    ]


@pytest.mark.parametrize("entry", ["prefill", "prefill_ragged", "decode", "attention"])
def test_bad_feature_arguments_refused_before_launch(rt, entry):
    """Each bad feature argument is an ArgumentError naming it, raised before any launch (out and LSE stay NaN),
    on tensors whose dtype/head dim has kernels carrying that feature; then a valid call of each target's
    features on the same tensors runs and matches the reference (the tensors were not why the calls failed)."""
    gen = torch.Generator(device="cuda").manual_seed(8000)
    targets = {feature: Target(rt, entry, feature, gen) for feature in FEATURES}
    for what, feature, causal, kw, words in _bad_cases(8):
        t = targets[feature]
        if entry == "decode" and causal is False:
            continue  # decode is always causal: no causal argument to contradict a window
        with pytest.raises(ArgumentError) as ei:
            t.call(t.causal if causal is None else causal, **kw)
        assert any(w in str(ei.value) for w in words), (entry, what, str(ei.value))
    torch.cuda.synchronize()
    for feature, t in targets.items():
        assert all(torch.isnan(x).all() for x in t.outputs), f"{t.what}: a refused call launched"
    for t in targets.values():
        f = Features(16 if "window" in t.combo else None, 30.0 if "softcap" in t.combo else None,
                     "mixed" if "sinks" in t.combo else None)
        kw = f.kwargs(t.heads_q)
        t.call(t.causal, **kw)
        t.check(kw, f"{t.what} valid call {f}")


@pytest.mark.parametrize("family", PREFILL_FAMILIES)
def test_a_window_near_int32_max_sees_what_causal_sees(rt, family):
    """window_left = 2^31 - 1 (as wide as the runtime takes) with more queries than keys (the first rows'
    positions are negative: position - window once wrapped around int32 and skipped kv block 0) equals the
    causal attention; decode over a zero-length sequence beside others (its kv_first once broke the chunk
    scan) too."""
    big = 2 ** 31 - 1
    vs = [v for v in feature_variants(rt, family, PREFILL_KEY) if v[2] == "ragged" and combo_of_window_only(v)]
    assert vs, f"no ragged {family} window-only variant loaded"
    dtype, D = vs[0][0], vs[0][1]
    gen = torch.Generator(device="cuda").manual_seed(97)
    lq, lkv = [150, 1, 300], [100, 0, 333]
    cu_q = torch.tensor([0, 150, 151, 451], dtype=torch.int32, device="cuda")
    cu_kv = torch.tensor([0, 100, 100, 433], dtype=torch.int32, device="cuda")
    t, H_q, H_kv = DT[dtype], 4, 2
    q = torch.randn(sum(lq), H_q, D, dtype=t, device="cuda", generator=gen)
    k = torch.randn(sum(lkv), H_kv, D, dtype=t, device="cuda", generator=gen)
    v = torch.randn(sum(lkv), H_kv, D, dtype=t, device="cuda", generator=gen)
    out, lse = torch.full_like(q, math.nan), torch.full((H_q, sum(lq)), math.nan, device="cuda")
    rt.prefill_ragged(q, k, v, out, cu_q, cu_kv, max(lq), max(lkv), lse, causal=True, family=family, window_left=big)
    torch.cuda.synchronize()
    for b in range(3):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_kv[b]), int(cu_kv[b + 1])
        ref = reference(q[qs:qe], k[ks:ke], v[ks:ke], causal=True, scale=D ** -0.5)
        _check(out[qs:qe], lse[:, qs:qe], ref, dtype, None, f"{family} window 2^31-1 seq {b}")
    dec = [v for v in _decode_variants(rt) if combo_of_window_only(v)]
    if family == "sdpa_prefill_sm90" and dec:  # decode once, beside the Hopper case
        dtype, D, kv = dec[0][0], dec[0][1], dec[0][2]
        cache = _decode_cache(kv, [0, 700, 1, 4100], 2, D, dtype, "NHD", gen, 1.0)
        qd = torch.randn(4, 2, 16, D, dtype=DT[dtype], device="cuda", generator=gen)
        od, ld = torch.full_like(qd, math.nan), torch.full((4, 16, 2), math.nan, device="cuda")
        rt.decode(qd, cache.k, cache.v, od, cache.seqlens, cache.page_table, ld, kv_layout=cache.layout,
                  window_left=big)
        # the reference without a window: one as wide as int32 holds sees every causal key
        _decode_check(cache, qd, od, ld, {"window_left": None, "softcap": None, "sinks": None}, None, dtype,
                      "decode window 2^31-1")


def combo_of_window_only(v) -> bool:
    return tuple(v[-1]) == ("window",)
