"""The attention entry point (rt.attention, rt.prepare_attention, torch.ops.aotc.attention): one call for a
mixed batch (decode rows, short S_q rows, chunked prefill over a prefix already in the cache, empty
sequences) over a paged KV cache, against an fp32 torch reference.

Reference: each sequence's keys and values gathered from the pools through its page table
(paged_cases.PagedCache.dense), the query tokens it owns in cu_seqlens order, then prefill_cases.ref_attention
(fp32 softmax(QK^T * scale + mask) V, GQA by repeating KV heads, LSE, the causal mask aligned bottom-right:
query row i of s_q sees key j iff j < s_kv and j <= i + s_kv - s_q; a row that sees no key: O = 0,
LSE = -inf), over blocks of query rows so a 30000-key prefix fits. Tolerances as for prefill (fp16
4e-3/4e-3, bf16 2e-2/2e-2, LSE 2e-3/2e-3). Outputs and LSE are NaN-poisoned before every call: rows of q
past cu_seqlens_q[-1], the gaps of padded strides and LSE's padding must stay NaN. Pool slots no sequence
owns hold a large finite value (POISON): the pages no sequence owns, the page-table entries past a
sequence's pages (they name one of those pages), and the slots past a sequence's end in its last page,
which a kernel may read (test_nan_past_the_end_in_the_last_page documents why that garbage must be finite).
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from aotc.common.errors import ArgumentError, RuntimeLoadError
from common import check_close
from paged_cases import PagedCache
from prefill_cases import DT, LSE_TOL, TOL, ref_attention

pytestmark = pytest.mark.gpu

POISON = 1.0e4  # finite in fp16 and bf16; a key or value of this size anywhere in a row ruins it

# (s_q, s_kv): decode rows, S_q 4 rows, empty sequences (s_q 0 over 50 keys and over none), and 2048-token
# chunks over prefixes of 0, 1, 15 and 30000 tokens already in the cache; s_kv is often not a multiple of
# the page or of 128 (and sometimes is: 2048, 4096)
MIXED = [(1, 1), (2048, 2048), (1, 17), (4, 4), (0, 50), (2048, 2049), (1, 1000), (0, 0), (4, 130),
         (2048, 2063), (1, 4096), (2048, 32048), (4, 4099)]

# (dtype, D, page, kv_layout, H_q, H_kv, padded): every page size in both layouts, each head dim in both
# dtypes, GQA 1/4/8 and groups up to 64 that do not divide 64; padded: q/out/LSE views into wider buffers and a
# page table of padded row stride
CASES = [
    ("bf16", 128, 16, "NHD", 32, 8, False),
    ("fp16", 128, 32, "HND", 8, 8, True),
    ("bf16", 128, 64, "NHD", 64, 8, True),
    ("fp16", 128, 128, "HND", 32, 8, False),
    ("bf16", 64, 16, "HND", 8, 8, True),
    ("fp16", 64, 128, "NHD", 64, 8, False),
    ("bf16", 256, 16, "NHD", 32, 8, False),
    ("fp16", 256, 16, "HND", 8, 8, True),
    # D256 over pages its 80-key kv blocks are not whole pages of: the Hopper kernel's 16-row boxes inside a page
    # (the default bundle's), else the portable kernel (test_d256_pages_run_on_the_kernel_built)
    ("bf16", 256, 32, "HND", 32, 8, False),
    ("fp16", 256, 64, "NHD", 16, 8, True),
    ("bf16", 256, 128, "NHD", 8, 8, False),
    # groups that do not divide the kernel's 64-row slabs (64 // group tokens a slab, the rest padding), and
    # the widest: Qwen2.5's 40/8 and 28/4, 12/4, 48/1, 64/1 (one token a slab)
    ("fp16", 64, 32, "HND", 40, 8, True),
    ("bf16", 128, 16, "NHD", 28, 4, False),
    ("bf16", 256, 16, "NHD", 12, 4, False),
    ("bf16", 128, 128, "HND", 48, 1, False),
    ("fp16", 128, 64, "NHD", 64, 1, True),
]


def case_id(c):
    return "{}-D{}-page{}-{}-{}x{}".format(*c[:6]) + ("-padded" if c[6] else "")


def reference(q, k, v, causal, scale, budget=1 << 28):
    """ref_attention over blocks of query rows (about `budget` scores each): under the bottom-right mask
    rows [r0, r1) of a sequence see keys below s_kv - s_q + r1 only, so a block runs on those keys alone
    (its own mask offset is then s_kv - s_q + r0, the rows' own)."""
    S_q, H_q, _ = q.shape
    S_kv = k.shape[0]
    if S_q == 0:
        return ref_attention(q, k, v, causal, scale)
    step = max(1, budget // max(1, H_q * S_kv))
    outs, lses = [], []
    for r0 in range(0, S_q, step):
        r1 = min(S_q, r0 + step)
        n = max(0, S_kv - S_q + r1) if causal else S_kv
        o, lse = ref_attention(q[r0:r1], k[:n], v[:n], causal, scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


class IO:
    """q (random), out and lse (NaN) for `rows` query tokens: q/out [rows, H_q, D], lse [H_q, rows]. Padded:
    views into wider buffers (head stride D + 8, token stride (H_q + 1) * (D + 8), LSE row stride rows + 5)."""

    def __init__(self, rows, H_q, D, dtype, padded, gen):
        t = DT[dtype]
        self.rows, self.H_q, self.D, self.padded = rows, H_q, D, padded
        if padded:
            self.q = torch.randn(rows, H_q + 1, D + 8, dtype=t, device="cuda", generator=gen)[:, :H_q, :D]
            self.out_buf = torch.empty(rows, H_q + 1, D + 8, dtype=t, device="cuda")
            self.lse_buf = torch.empty(H_q, rows + 5, device="cuda")
            self.out, self.lse = self.out_buf[:, :H_q, :D], self.lse_buf[:, :rows]
        else:
            self.q = torch.randn(rows, H_q, D, dtype=t, device="cuda", generator=gen)
            self.out = self.out_buf = torch.empty(rows, H_q, D, dtype=t, device="cuda")
            self.lse = self.lse_buf = torch.empty(H_q, rows, device="cuda")
        self.poison()

    def poison(self):
        self.out_buf.fill_(math.nan)
        self.lse_buf.fill_(math.nan)

    def check_untouched(self, written_rows, lse_written, what):
        """Rows past the step's tokens, padded strides' gaps and LSE's padding still NaN (and all of LSE
        when the call had none)."""
        assert torch.isnan(self.out[written_rows:]).all(), f"{what}: rows of out past cu_seqlens_q[-1] written"
        if self.padded:
            assert torch.isnan(self.out_buf[:, self.H_q:]).all(), f"{what}: out's head-padding gap written"
            assert torch.isnan(self.out_buf[:, :, self.D:]).all(), f"{what}: out's head-dim padding gap written"
        if lse_written:
            assert torch.isnan(self.lse[:, written_rows:]).all(), f"{what}: LSE past cu_seqlens_q[-1] written"
            assert torch.isnan(self.lse_buf[:, self.rows:]).all(), f"{what}: LSE's row padding written"
        else:
            assert torch.isnan(self.lse_buf).all(), f"{what}: LSE written by a call without lse"


class PagedBatch:
    """Requests whose keys sit in one PagedCache (request r owns the pages of capacity[r] keys) and the
    metadata of a step: a list of (request, s_q, s_kv) per batch slot; the step's query tokens are packed in
    slot order (cu_seqlens_q), slot b reads request r's pages (page_table row b) and its first s_kv keys.
    The page table is `extra_cols` entries wider than the longest request needs, its row stride
    `pt_pad_cols` more than that; entries past a request's pages name a page no request owns."""

    def __init__(self, capacity, page, H_q, H_kv, D, dtype, layout, gen, *, rows, padded=False, extra_cols=0,
                 pt_pad_cols=0, pad_entry="spare"):
        self.cache = PagedCache(capacity, page, H_kv, D, dtype, layout, gen, pad_entry=pad_entry)
        self.H_q, self.D, self.dtype, self.layout, self.gen = H_q, D, dtype, layout, gen
        self.rows, self.padded = rows, padded
        self.width, self.pt_pad_cols = self.cache.max_pages + extra_cols, pt_pad_cols

    @classmethod
    def of(cls, seqs, page, H_q, H_kv, D, dtype, layout, gen, pad_rows=3, **kw):
        """One request per slot, each at its full length: (batch, step, io)."""
        b = cls([s_kv for _, s_kv in seqs], page, H_q, H_kv, D, dtype, layout, gen,
                rows=sum(s_q for s_q, _ in seqs) + pad_rows, **kw)
        return b, [(i, s_q, s_kv) for i, (s_q, s_kv) in enumerate(seqs)], b.io()

    def io(self, padded=None):
        return IO(self.rows, self.H_q, self.D, self.dtype, self.padded if padded is None else padded, self.gen)

    def _values(self, step):
        assert sum(s_q for _, s_q, _ in step) <= self.rows, "more query tokens than the buffers hold"
        assert all(s_kv <= self.cache.lengths[r] for r, _, s_kv in step), "a length past the request's capacity"
        cu = [0]
        for _, s_q, _ in step:
            cu.append(cu[-1] + s_q)
        return cu, [s_kv for _, _, s_kv in step]

    def metadata(self, step):
        """New (cu_seqlens_q, seqlens_kv, page_table) device tensors for a step."""
        cu, sl = self._values(step)
        buf = torch.empty(len(step), self.width + self.pt_pad_cols, dtype=torch.int32, device="cuda")
        meta = (torch.tensor(cu, dtype=torch.int32, device="cuda"), torch.tensor(sl, dtype=torch.int32, device="cuda"),
                buf[:, :self.width])
        self._rows_into(step, meta[2])
        return meta

    def write(self, step, meta):
        """A step's values into existing metadata tensors, in place (what a CUDA graph replay reads)."""
        cu, sl = self._values(step)
        meta[0].copy_(torch.tensor(cu, dtype=torch.int32))
        meta[1].copy_(torch.tensor(sl, dtype=torch.int32))
        self._rows_into(step, meta[2])

    def _rows_into(self, step, pt):
        pt.fill_(self.cache.pad_entry)
        for slot, (r, _, _) in enumerate(step):
            pt[slot, :self.cache.max_pages] = self.cache.page_table[r]

    def attend(self, rt, io, meta, **kw):
        """rt.attention on the current stream (kw: lse, max_seqlen_q, causal, softmax_scale)."""
        rt.attention(io.q, self.cache.k, self.cache.v, io.out, *meta, kv_layout=self.layout,
                     stream=torch.cuda.current_stream(), **kw)

    def references(self, step, io, causal=True, scale=None):
        scale = self.D ** -0.5 if scale is None else scale
        refs, pos = [], 0
        for r, s_q, s_kv in step:
            refs.append(reference(io.q[pos:pos + s_q], *self.cache.dense(r, s_kv), causal, scale))
            pos += s_q
        return refs

    def check(self, step, io, what, *, lse=True, refs=None, causal=True, scale=None):
        """Every slot's rows of out (and of lse) against the reference; everything else untouched."""
        torch.cuda.synchronize()
        refs = self.references(step, io, causal, scale) if refs is None else refs
        pos = 0
        for slot, ((r, s_q, s_kv), (ro, rl)) in enumerate(zip(step, refs)):
            desc = f"{what}: slot {slot} (request {r}, s_q {s_q}, s_kv {s_kv})"
            check_close(io.out[pos:pos + s_q], ro, TOL[self.dtype], "O " + desc)
            if lse:
                check_close(io.lse[:, pos:pos + s_q], rl, LSE_TOL, "LSE " + desc)
            pos += s_q
        io.check_untouched(pos, lse, what)


def skip_without_kernel(call):
    """call(); a refusal saying no kernel serves the call (e.g. causal=False missing from the bundle) skips."""
    try:
        return call()
    except (ArgumentError, LookupError, RuntimeLoadError) as e:
        if "kernel" in str(e):
            pytest.skip(f"the bundle serves no such call: {e}")
        raise


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_mixed_batch_matches_reference(rt, case):
    """The whole MIXED batch in one call, with LSE and max_seqlen_q given and the decode rows' split (decode
    query length 0: every row on the paged prefill kernel; 1; 4: the S_q 4 rows too on the decode kernel)
    varied over the cases, then again without LSE, with max_seqlen_q left to the runtime and the default
    split."""
    mixed_batch(rt, case, MIXED, CASES.index(case), CASES.index(case), "mixed")


def mixed_batch(rt, case, seqs, index, seed, label):
    """test_mixed_batch_matches_reference's body over the batch `seqs` ((s_q, s_kv) per sequence; the decode
    rows' split from the case's index; test_attention_portable.py runs it on the portable kernels)."""
    dtype, D, page, layout, H_q, H_kv, padded = case
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, step, io = PagedBatch.of(seqs, page, H_q, H_kv, D, dtype, layout, gen, padded=padded,
                                extra_cols=2 if padded else 0, pt_pad_cols=5 if padded else 0)
    b.cache.poison(POISON)
    meta = b.metadata(step)
    refs = b.references(step, io)
    dq = (0, 1, 4)[index % 3]
    # the bounds an engine passes: max_seqlen_kv >= 4096 runs the widest kv tile (D128: 176, at every page size)
    b.attend(rt, io, meta, lse=io.lse, max_seqlen_q=max(s_q for s_q, _ in seqs),
             max_seqlen_kv=max(s_kv for _, s_kv in seqs), decode_query_len=dq)
    b.check(step, io, f"{label} {case_id(case)} decode_query_len {dq}", refs=refs)
    io.poison()
    b.attend(rt, io, meta)
    b.check(step, io, f"{label} {case_id(case)} lse=None", lse=False, refs=refs)


# (s_q, s_kv) batches of fewer GQA-packed tiles than SMs over long contexts: the paged kernel shares each tile's kv
# blocks out to several CTAs (aotc.families.sdpa_prefill_sm90.MAX_KV_SPLITS), the last to arrive merging them
SPLIT_BATCHES = [
    [(128, 128 + 30720)],  # a prefix-cache hit's suffix: 32 tiles at H 32/8, 4 splits each
    [(64, 20064), (1, 5000), (17, 9017), (0, 100), (5, 40005), (2, 2)],  # beside decode rows and an empty sequence
    [(3, 3000)],  # one tile a KV head of 18 blocks: at most 2 splits of MIN_SPLIT_BLOCKS
]
SPLIT_CASES = [CASES[i] for i in (0, 1, 4, 6, 12, 14)]


def split_partials(plan) -> list[float]:
    """The partials of the plan's KV-split workspace on the current stream (the front of its buffer) as floats."""
    import struct

    from aotc.runtime import driver

    torch.cuda.synchronize()
    n = plan.split_partials_bytes
    at = plan.split_partials_at(torch.cuda.current_stream().cuda_stream)
    return list(struct.unpack(f"{n // 4}f", driver.copy_from_device(at, n)))


@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_id)
def test_kv_splits_match_the_reference(rt, case):
    """Each SPLIT_BATCHES batch through a prepared plan whose split workspace was NaN-poisoned first: every row
    matches the reference (a merge reading a slot no split of its tile wrote would give NaN), the splits did run
    (their partials replaced part of the poison), and a second call gives the same bits (the merge adds the splits
    in split order, whichever arrives last)."""
    from aotc.runtime import driver

    dtype, D, page, layout, H_q, H_kv, padded = case
    for i, seqs in enumerate(SPLIT_BATCHES):
        gen = torch.Generator(device="cuda").manual_seed(300 + 10 * SPLIT_CASES.index(case) + i)
        b, step, io = PagedBatch.of(seqs, page, H_q, H_kv, D, dtype, layout, gen, padded=padded,
                                    extra_cols=2 if padded else 0, pt_pad_cols=5 if padded else 0)
        b.cache.poison(POISON)
        meta = b.metadata(step)
        refs = b.references(step, io)
        dq = 1 if i == 1 else 0  # batch 1's decode rows on the decode kernel; every row on the paged one else
        plan = rt.prepare_attention(io.q, b.cache.k, b.cache.v, io.out, *meta, lse=io.lse, kv_layout=layout,
                                    max_seqlen_q=max(s_q for s_q, _ in seqs),
                                    max_seqlen_kv=max(s_kv for _, s_kv in seqs), decode_query_len=dq)
        torch.cuda.synchronize()
        # the stream's split workspace (its first launch there takes the same), NaN but the counters
        at = plan.split_partials_at(torch.cuda.current_stream().cuda_stream)
        driver.memset_d32(at, 0x7FC00000, plan.split_partials_bytes // 4)
        what = f"kv splits {case_id(case)} batch {i} decode_query_len {dq}"
        plan(io.q, io.out, io.lse, stream=torch.cuda.current_stream())
        b.check(step, io, what, refs=refs)
        written = sum(not math.isnan(x) for x in split_partials(plan))
        assert written > 0, f"{what}: no split wrote a partial (the batch ran unsplit)"
        first = io.out.clone()
        io.poison()
        plan(io.q, io.out, io.lse, stream=torch.cuda.current_stream())
        b.check(step, io, what + ", call 2", refs=refs)
        assert torch.equal(io.out.view(torch.int16), first.view(torch.int16)), f"{what}: call 2 gave other bits"


def test_kv_splits_follow_new_metadata_in_a_cuda_graph(rt):
    """One CUDA graph replayed over steps whose tile counts differ (so their split counts do, decided on the
    device at every launch): a short suffix over a long context, a 2048-token chunk (no split), decode rows with
    a 40-token suffix, then the suffix again with its context grown."""
    gen = torch.Generator(device="cuda").manual_seed(321)
    b = PagedBatch([30848, 4096, 700, 12000], 16, 32, 8, 128, "bf16", "NHD", gen, rows=2048 + 8, extra_cols=1)
    b.cache.poison(POISON, tails=False)
    steps = [
        [(0, 128, 30720), (1, 1, 4000), (2, 1, 700), (3, 0, 12000)],
        [(1, 2048, 4096), (0, 1, 30720), (2, 1, 700), (3, 1, 11000)],
        [(3, 40, 12000), (1, 1, 4096), (2, 1, 700), (0, 1, 30721)],
        [(0, 128, 30848), (3, 1, 12000), (2, 0, 700), (1, 1, 4096)],
    ]
    io, meta = b.io(), b.metadata(steps[0])
    plan = rt.prepare_attention(io.q, b.cache.k, b.cache.v, io.out, *meta, max_seqlen_q=2048, max_seqlen_kv=30848,
                                lse=io.lse)

    def call():
        plan(io.q, io.out, io.lse, stream=torch.cuda.current_stream())
    call()
    b.check(steps[0], io, "kv splits eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    replay_steps(graph, b, io, meta, steps, gen, "kv splits graph replay")


@pytest.mark.parametrize("page", [32, 64, 128])
def test_d256_pages_run_on_the_kernel_built(rt, page):
    """D256 at pages of 32-128: the Hopper kernel where the bundle has one for the page (16-row TMA boxes inside
    a page: 80 keys a kv block), else the portable kernel; a mixed batch against the fp32 reference, and the
    plan's family."""
    import aotc.runtime
    from aotc.runtime.attention_portable import HOPPER, PORTABLE

    fresh = aotc.runtime.load(*rt.capabilities()["sources"])  # its plans are this test's alone
    has_hopper = any(k.variant["layout"] == f"paged{page}" and k.variant["head_dim"] == 256
                     for k in fresh.kernels.get(HOPPER, []))
    gen = torch.Generator(device="cuda").manual_seed(700 + page)
    seqs = [(1, 1000), (300, 700), (4, 130), (0, 33), (129, 129), (81, 2 * page + 79)]
    b, step, io = PagedBatch.of(seqs, page, 16, 8, 256, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    skip_without_kernel(lambda: b.attend(fresh, io, b.metadata(step), lse=io.lse, max_seqlen_q=300))
    b.check(step, io, f"D256 page {page}")
    families = {p.prefill_family for p in fresh.plans.values() if hasattr(p, "prefill_family")}
    assert families == {HOPPER if has_hopper else PORTABLE}, families


def _rehomed(x: torch.Tensor, pool: str, which: int) -> torch.Tensor:
    """x's pages (dim 0) in another allocation, NaN around them: K and V pages interleaved in one cache ([pages, 2,
    ...], x at `which`: the page stride twice the pages' rows) or pages padded by 64 elements."""
    n, per = x.shape[0], x[0].numel()
    if pool == "kv_interleaved":
        view = torch.full((n, 2, *x.shape[1:]), float("nan"), dtype=x.dtype, device=x.device)[:, which]
    else:
        view = torch.full((n * (per + 64),), float("nan"), dtype=x.dtype, device=x.device).as_strided(
            x.shape, (per + 64, *x.stride()[1:]))
    view.copy_(x)
    return view


@pytest.mark.parametrize("pool", ["kv_interleaved", "page_padded"])
@pytest.mark.parametrize("D,page,layout", [(128, 16, "NHD"), (128, 64, "HND"), (64, 32, "NHD"), (256, 16, "NHD")])
def test_pools_of_other_page_strides(rt, pool, D, page, layout):
    """Pools of other page strides: K and V pages interleaved in one cache (twice a page's rows apart) and pages
    padded by 64 elements, NaN between the pages, against the fp32 reference. D128's 176-key tile (max_seqlen_kv
    4200) walks the first by its groups of 8 rows and the second page by page (no whole number of 8 token strides:
    one copy an 8-row group); the other tiles copy a column chunk of a box at a time from either."""
    gen = torch.Generator(device="cuda").manual_seed(800 + D + page)
    seqs = [(1, 1000), (300, 700), (4, 130), (0, 33), (129, 129), (81, 2 * page + 79), (600, 4200)]
    b, step, io = PagedBatch.of(seqs, page, 16, 4, D, "bf16", layout, gen)
    b.cache.k, b.cache.v = _rehomed(b.cache.k, pool, 0), _rehomed(b.cache.v, pool, 1)
    b.cache.poison(POISON)
    skip_without_kernel(lambda: b.attend(rt, io, b.metadata(step), lse=io.lse, max_seqlen_q=600,
                                         max_seqlen_kv=4200))
    b.check(step, io, f"{pool} D{D} page {page} {layout}")


def test_rows_that_see_no_key(rt):
    """s_q above s_kv: the first s_q - s_kv rows see no key (O = 0, LSE = -inf); s_kv 0 with new tokens too."""
    gen = torch.Generator(device="cuda").manual_seed(100)
    seqs = [(5, 2), (3, 0), (1, 0), (2, 40), (70, 3), (1, 1)]
    b, step, io = PagedBatch.of(seqs, 16, 8, 2, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    b.attend(rt, io, b.metadata(step), lse=io.lse, max_seqlen_q=70)
    b.check(step, io, "rows that see no key")


def test_custom_softmax_scale(rt):
    gen = torch.Generator(device="cuda").manual_seed(101)
    seqs = [(1, 300), (130, 1000), (4, 4)]
    b, step, io = PagedBatch.of(seqs, 32, 16, 4, 64, "fp16", "HND", gen)
    b.cache.poison(POISON)
    b.attend(rt, io, b.metadata(step), lse=io.lse, softmax_scale=0.05)
    b.check(step, io, "softmax_scale 0.05", scale=0.05)


def test_non_causal(rt):
    """causal=False (when the bundle has such kernels): every row sees all s_kv keys of its sequence."""
    gen = torch.Generator(device="cuda").manual_seed(102)
    seqs = [(1, 100), (300, 700), (0, 9), (4, 0), (2048, 2100)]
    b, step, io = PagedBatch.of(seqs, 16, 32, 8, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    skip_without_kernel(lambda: b.attend(rt, io, b.metadata(step), lse=io.lse, causal=False))
    b.check(step, io, "causal=False", causal=False)


def test_plan_reuse_with_new_tensors_and_metadata(rt):
    """One plan, three calls: the prepared tensors; the prepared metadata tensors rewritten in place with
    another step (other lengths, requests in other slots); then new q/out/lse and new metadata tensors of the
    same layouts. Each call writes its own out only."""
    gen = torch.Generator(device="cuda").manual_seed(103)
    b = PagedBatch([3000, 900, 5000, 40], 32, 16, 4, 64, "fp16", "HND", gen, rows=520, padded=True,
                   extra_cols=3, pt_pad_cols=4)
    b.cache.poison(POISON, tails=False)
    first = [(0, 512, 3000), (1, 1, 900), (2, 4, 5000), (3, 0, 40)]
    second = [(2, 300, 4321), (3, 4, 40), (0, 1, 2000), (1, 200, 900)]
    io, meta = b.io(), b.metadata(first)
    plan = rt.prepare_attention(io.q, b.cache.k, b.cache.v, io.out, *meta, max_seqlen_q=512, lse=io.lse,
                                kv_layout="HND")
    stream = torch.cuda.current_stream()
    plan(io.q, io.out, io.lse, stream=stream)
    b.check(first, io, "plan, prepared tensors")
    io.poison()
    b.write(second, meta)
    plan(io.q, io.out, io.lse, stream=stream)
    b.check(second, io, "plan, metadata rewritten in place")
    kept = io.out_buf.clone()
    io2, meta2 = b.io(), b.metadata(first)
    plan(io2.q, io2.out, io2.lse, cu_seqlens_q=meta2[0], seqlens_kv=meta2[1], page_table=meta2[2], stream=stream)
    b.check(first, io2, "plan, new q/out/lse and metadata tensors")
    assert torch.equal(io.out_buf.view(torch.int16), kept.view(torch.int16)), "a call wrote another call's out"


@pytest.mark.parametrize("via", ["plan", "op"])
def test_cuda_graph_replay_follows_device_metadata(rt, ops, via):
    """One CUDA graph of plan(...) or torch.ops.aotc.attention (warmed up once outside capture), replayed
    after rewriting cu_seqlens_q, seqlens_kv and the page table in place: lengths growing, the long
    sequence moving to another slot with its chunk, then a step of decode rows only (far fewer query
    tokens than q holds: the rest must stay unwritten) with an empty sequence."""
    gen = torch.Generator(device="cuda").manual_seed(104 + (via == "op"))
    b = PagedBatch([6145, 702, 35, 272], 16, 32, 8, 128, "bf16", "NHD", gen, rows=2048 + 6 + 2, extra_cols=1)
    b.cache.poison(POISON, tails=False)
    steps = [
        [(0, 2048, 2048), (1, 1, 700), (2, 1, 33), (3, 4, 260)],
        [(0, 2048, 4096), (1, 1, 701), (2, 1, 34), (3, 4, 264)],  # every length grows
        [(2, 1, 35), (1, 1, 702), (0, 2048, 6144), (3, 4, 268)],  # the long sequence's next chunk, in slot 2
        [(3, 4, 272), (2, 0, 35), (1, 1, 702), (0, 1, 6145)],  # decode rows only; slot 1 empty
    ]
    io, meta = b.io(), b.metadata(steps[0])
    k, v = b.cache.k, b.cache.v
    if via == "plan":
        plan = rt.prepare_attention(io.q, k, v, io.out, *meta, max_seqlen_q=2048, lse=io.lse)

        def call():
            plan(io.q, io.out, io.lse, stream=torch.cuda.current_stream())
    else:
        def call():
            torch.ops.aotc.attention(io.q, k, v, *meta, io.out, io.lse, max_seqlen_q=2048)
    call()  # warm-up outside capture: loads the kernel, prepares the plan
    b.check(steps[0], io, f"{via} eager")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    replay_steps(graph, b, io, meta, steps, gen, f"{via} graph replay")


def replay_steps(graph, b, io, meta, steps, gen, what, after=None):
    """Each step's metadata written in place, new queries, outputs poisoned, the graph replayed, every row checked
    (after: a copy of out the graph makes after the call, which must hold every row the step wrote)."""
    for i, step in enumerate(steps):
        b.write(step, meta)
        io.q.copy_(torch.randn(io.q.shape, dtype=io.q.dtype, device="cuda", generator=gen))
        io.poison()
        graph.replay()
        b.check(step, io, f"{what} {i}")
        if after is not None:
            n = sum(s_q for _, s_q, _ in step)
            assert torch.equal(after[:n].view(torch.int16), io.out[:n].view(torch.int16)), \
                f"{what} {i}: the copy after the call did not see every row"


@pytest.mark.parametrize("sms", [1, 40, 131])
def test_prefill_sms_steps_match_the_reference(rt, ops, sms):
    """prefill_sms: the paged kernel on that many SMs, the decode kernel beside it on the runtime's second stream.
    Every row matches the reference eagerly (Runtime.attention, then torch.ops.aotc.attention), and a CUDA graph
    captured with it (on the capture stream, after an eager forked step) replays with new metadata, including a
    step without a chunk and one without a decode row, and what follows the call on the same
    stream sees both kernels' rows (the graph ends with a copy of out)."""
    gen = torch.Generator(device="cuda").manual_seed(111 + sms)
    b = PagedBatch([6145, 702, 35, 272, 4100], 16, 32, 8, 128, "bf16", "NHD", gen, rows=2048 + 12, extra_cols=1)
    b.cache.poison(POISON, tails=False)
    steps = [
        [(0, 2048, 2048), (1, 1, 700), (2, 1, 33), (3, 4, 260), (4, 1, 4100)],
        [(4, 1, 4100), (1, 1, 701), (0, 2048, 6144), (3, 4, 264), (2, 1, 34)],
        [(3, 4, 272), (2, 0, 35), (1, 1, 702), (0, 1, 6145), (4, 1, 4100)],  # no chunk
        [(0, 2048, 4096), (3, 4, 272), (2, 0, 35), (1, 0, 702), (4, 0, 4100)],  # no decode row
    ]
    io, meta = b.io(), b.metadata(steps[0])
    k, v = b.cache.k, b.cache.v
    b.attend(rt, io, meta, lse=io.lse, max_seqlen_q=2048, prefill_sms=sms)
    b.check(steps[0], io, f"prefill_sms {sms} via Runtime.attention")
    io.poison()
    ops.attention(io.q, k, v, *meta, out=io.out, lse=io.lse, max_seqlen_q=2048, prefill_sms=sms)
    b.check(steps[0], io, f"prefill_sms {sms} via torch.ops.aotc.attention")
    after = torch.empty_like(io.out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.attention(io.q, k, v, *meta, out=io.out, lse=io.lse, max_seqlen_q=2048, prefill_sms=sms)
        after.copy_(io.out)
    replay_steps(graph, b, io, meta, steps, gen, f"prefill_sms {sms} graph replay", after)


def test_unequal_chunks_draw_every_tile_on_every_call(rt):
    """Chunks over prefixes of 0 to 8192 keys (their tiles cost up to 17 times one another) beside decode rows: the
    paged kernel's CTAs draw their tiles from the stream's counter (RaggedTiles). Every tile runs once whoever
    draws it, and each call leaves the counter at 0 for the next: three calls in a row give the reference and the
    same bits (a counter left non-zero would skip tiles: NaN rows); calls queued on two streams at once, each with
    a counter and a decode workspace of its own, each get every row of their own (when the stream's workspaces
    were one arena's buffer, a decode row came out wrong)."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    b = PagedBatch([512, 4096, 8704, 1536, 4100, 700], 16, 32, 8, 128, "bf16", "NHD", gen, rows=2048 + 2)
    b.cache.poison(POISON, tails=False)
    step = [(0, 512, 512), (4, 1, 4100), (1, 512, 4096), (2, 512, 8704), (5, 1, 700), (3, 512, 1536)]
    io, meta = b.io(), b.metadata(step)
    refs = b.references(step, io)
    first = None
    for i in range(3):
        io.poison()
        b.attend(rt, io, meta, lse=io.lse, max_seqlen_q=512, max_seqlen_kv=8704)
        b.check(step, io, f"unequal chunks, call {i}", refs=refs)
        if first is None:
            first = io.out.clone()
        assert torch.equal(io.out.view(torch.int16), first.view(torch.int16)), f"call {i}: other bits than call 0"
    ios = (io, b.io())
    refs2 = (refs, b.references(step, ios[1]))
    attend_on_two_streams(rt, b, ios, meta, 3, max_seqlen_q=512, max_seqlen_kv=8704)
    for s, (x, r) in enumerate(zip(ios, refs2)):
        b.check(step, x, f"unequal chunks on stream {s}", refs=r)


def test_steps_on_two_streams_at_once_keep_their_workspaces_apart(rt):
    """Two micro-batches overlapped on two streams (dual-batch overlap) through one Runtime: the decode rows' chunk
    partials and the paged kernel's KV splits (64-query suffixes over long prefixes: fewer tiles than SMs) go to
    the launch stream's own workspace (aotc.runtime.workspace), so steps queued on both streams at once each get
    every row of their own."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    b = PagedBatch([30000, 16384, 4100, 700], 16, 32, 8, 128, "bf16", "NHD", gen, rows=2 * 64 + 2)
    b.cache.poison(POISON, tails=False)
    step = [(0, 64, 30000), (2, 1, 4100), (1, 64, 16384), (3, 1, 700)]
    meta = b.metadata(step)
    ios = (b.io(), b.io())
    refs = [b.references(step, x) for x in ios]
    attend_on_two_streams(rt, b, ios, meta, 4, max_seqlen_q=64, max_seqlen_kv=30000)
    for s, (x, r) in enumerate(zip(ios, refs)):
        b.check(step, x, f"two streams at once: stream {s}", refs=r)


def attend_on_two_streams(rt, b, ios, meta, rounds, **kw):
    """Each io's outputs poisoned, then `rounds` rt.attention calls of each on a stream of its own, queued so
    that the two streams' steps run at the same time."""
    streams = (torch.cuda.Stream(), torch.cuda.Stream())
    for x in ios:
        x.poison()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for x, st in zip(ios, streams):
            with torch.cuda.stream(st):
                rt.attention(x.q, b.cache.k, b.cache.v, x.out, *meta, lse=x.lse, stream=st, **kw)
    torch.cuda.synchronize()


def test_torch_functional_form(rt, ops):
    """aotc.torch.attention: (out, lse) allocated, or the caller's out/lse filled and returned."""
    gen = torch.Generator(device="cuda").manual_seed(106)
    seqs = [(1, 4000), (0, 3), (17, 17), (300, 1300)]
    b, step, io = PagedBatch.of(seqs, 64, 32, 8, 128, "bf16", "HND", gen, pad_rows=0)
    b.cache.poison(POISON)
    meta = b.metadata(step)
    refs = b.references(step, io)
    out, lse = ops.attention(io.q, b.cache.k, b.cache.v, *meta, max_seqlen_q=300, kv_layout="HND")
    torch.cuda.synchronize()
    assert out.shape == io.q.shape and out.dtype == io.q.dtype
    pos = 0
    for (r, s_q, _), (ro, rl) in zip(step, refs):
        check_close(out[pos:pos + s_q], ro, TOL["bf16"], f"aotc.torch.attention O request {r}")
        if lse is not None:
            assert lse.shape == (32, io.rows) and lse.dtype == torch.float32
            check_close(lse[:, pos:pos + s_q], rl, LSE_TOL, f"aotc.torch.attention LSE request {r}")
        pos += s_q
    got = ops.attention(io.q, b.cache.k, b.cache.v, *meta, out=io.out, lse=io.lse, max_seqlen_q=300,
                        kv_layout="HND")
    assert got[0].data_ptr() == io.out.data_ptr() and got[1].data_ptr() == io.lse.data_ptr()
    b.check(step, io, "aotc.torch.attention(out=, lse=)", refs=refs)



@pytest.mark.parametrize("bound", ["right", "wrong"])
@pytest.mark.parametrize("via", ["runtime", "op"])
def test_a_lower_bound_on_query_counts_keeps_every_row(rt, ops, bound, via):
    """min_seqlen_q > decode_query_len skips the decode kernel's launch and gives the paged kernel every row:
    right (chunks only, over prefixes, and an empty sequence) or wrong (decode rows, S_q 4 rows and a 1-key
    row in the step after all), every row matches the reference and nothing past them is written."""
    gen = torch.Generator(device="cuda").manual_seed(109)
    seqs = [(2048, 2063), (0, 9), (300, 30300), (17, 17)]
    if bound == "wrong":
        seqs += [(1, 4000), (4, 130), (1, 1), (1, 17)]
    b, step, io = PagedBatch.of(seqs, 16, 32, 8, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    meta = b.metadata(step)
    bounds = dict(max_seqlen_q=2048, max_seqlen_kv=30300, min_seqlen_q=17)
    if via == "runtime":
        b.attend(rt, io, meta, lse=io.lse, **bounds)
    else:
        ops.attention(io.q, b.cache.k, b.cache.v, *meta, out=io.out, lse=io.lse, **bounds)
    b.check(step, io, f"min_seqlen_q 17 ({bound}) via {via}")

def _refusals(b, io, meta):
    """(call(**overrides), overrides, names the message may blame): bad arguments of rt.attention."""
    q, out, lse = io.q, io.out, io.lse
    cu, sl, pt = meta
    H_q, D, t = b.H_q, b.D, q.dtype
    q_shifted_buf = torch.randn(io.rows + 1, H_q, D, dtype=t, device="cuda")
    other_dtype = torch.float16 if t == torch.bfloat16 else torch.bfloat16
    q12 = torch.randn(io.rows, 12, D, dtype=t, device="cuda")
    return [
        (dict(cu_seqlens_q=cu.long()), ("cu_seqlens_q",)),
        (dict(page_table=pt[:-1]), ("page_table",)),
        (dict(q=q12, out=torch.full_like(q12, math.nan), lse=None), ("k_cache", "v_cache", "H_kv", "H_q", "q.shape")),
        (dict(out=q), ("out",)),  # out is q
        (dict(q=q_shifted_buf[1:], out=q_shifted_buf[:-1]), ("out",)),  # out overlaps q by all rows but one
        (dict(seqlens_kv=sl.long()), ("seqlens_kv",)),
        (dict(seqlens_kv=sl[:-1]), ("seqlens_kv",)),
        (dict(q=q.float()), ("q",)),
        (dict(k_cache=b.cache.k.to(other_dtype)), ("k_cache",)),
        (dict(lse=lse[:, :-1]), ("lse",)),
        (dict(lse=out.view(-1)[: H_q * io.rows * 2].view(torch.float32).view(H_q, io.rows)), ("lse",)),  # in out
        (dict(kv_layout="NDH"), ("kv_layout",)),
    ]


def test_bad_arguments_refused_before_launch(rt):
    """rt.attention and rt.prepare_attention refuse each bad argument with an ArgumentError naming it, and
    nothing is launched (the poisoned out stays NaN, q unchanged)."""
    gen = torch.Generator(device="cuda").manual_seed(107)
    b, step, io = PagedBatch.of([(1, 100), (20, 60), (0, 5)], 16, 16, 8, 128, "bf16", "NHD", gen)
    meta = b.metadata(step)
    q_before = io.q.clone()
    base = dict(q=io.q, k_cache=b.cache.k, v_cache=b.cache.v, out=io.out, cu_seqlens_q=meta[0],
                seqlens_kv=meta[1], page_table=meta[2], lse=io.lse, max_seqlen_q=20, kv_layout="NHD")
    order = ("q", "k_cache", "v_cache", "out", "cu_seqlens_q", "seqlens_kv", "page_table")
    for over, names in _refusals(b, io, meta):
        args = {**base, **over}
        positional = [args.pop(n) for n in order]
        for entry, extra in ((rt.attention, dict(stream=torch.cuda.current_stream())), (rt.prepare_attention, {})):
            with pytest.raises(ArgumentError) as ei:
                entry(*positional, **args, **extra)
            assert any(n in str(ei.value) for n in names), (sorted(over), names, str(ei.value))
    torch.cuda.synchronize()
    assert torch.isnan(io.out_buf).all() and torch.isnan(io.lse_buf).all(), "a refused call launched"
    assert torch.equal(io.q.view(torch.int16), q_before.view(torch.int16)), "a refused call wrote q"


def test_plan_call_refuses_other_layouts(rt):
    """A prepared plan called with tensors laid out otherwise, of another dtype, or overlapping is refused
    (ArgumentError), after a first call took the checked path; nothing launches."""
    gen = torch.Generator(device="cuda").manual_seed(108)
    b, step, io = PagedBatch.of([(1, 100), (20, 60)], 16, 16, 8, 128, "bf16", "NHD", gen)
    meta = b.metadata(step)
    plan = rt.prepare_attention(io.q, b.cache.k, b.cache.v, io.out, *meta, max_seqlen_q=20, lse=io.lse)
    stream = torch.cuda.current_stream()
    for _ in range(2):
        plan(io.q, io.out, io.lse, stream=stream)
    b.check(step, io, "plan before the refusals")
    fresh = b.io()
    wide = b.io(padded=True)
    cases = [
        (lambda: plan(wide.q, wide.out, wide.lse, stream=stream), ("q", "out", "lse")),  # padded strides
        (lambda: plan(fresh.q.float(), fresh.out, fresh.lse, stream=stream), ("q",)),
        (lambda: plan(fresh.q, fresh.q, fresh.lse, stream=stream), ("out",)),  # out is q
        (lambda: plan(fresh.q, fresh.out, fresh.lse, cu_seqlens_q=meta[0].long(), stream=stream), ("cu_seqlens_q",)),
        (lambda: plan(fresh.q, fresh.out, fresh.lse, page_table=meta[2][:, :-1], stream=stream), ("page_table",)),
    ]
    for call, names in cases:
        with pytest.raises(ArgumentError) as ei:
            call()
        assert any(n in str(ei.value) for n in names), (names, str(ei.value))
    torch.cuda.synchronize()
    for x in (fresh, wide):
        assert torch.isnan(x.out_buf).all() and torch.isnan(x.lse_buf).all(), "a refused call launched"


@pytest.mark.parametrize("decode_query_len", [0, 1])
def test_nan_past_the_end_in_the_last_page(rt, decode_query_len):
    """The slots past a sequence's end in its last page hold NaN: both kernels read them (their scores are
    masked) and must keep them out of P @ V (the paged prefill kernel zeroes those V rows in shared memory,
    the decode kernel never loads them)."""
    gen = torch.Generator(device="cuda").manual_seed(109)
    seqs = [(1, 17), (2048, 2063), (4, 130), (1, 1)]
    b, step, io = PagedBatch.of(seqs, 64, 32, 8, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    b.cache.poison(math.nan, unused=False)
    b.attend(rt, io, b.metadata(step), lse=io.lse, decode_query_len=decode_query_len)
    b.check(step, io, f"NaN past the end in the last page (decode_query_len {decode_query_len})")


def test_page_table_padding_entries_are_never_read(rt):
    """Page-table entries past a sequence's pages hold -1 and the pages no sequence owns are NaN: nothing
    outside a sequence's own pages may be read. Last in the file: a kernel that dereferences -1 faults."""
    gen = torch.Generator(device="cuda").manual_seed(110)
    seqs = [(1, 1), (2048, 2063), (0, 0), (4, 130), (1, 4096)]
    b, step, io = PagedBatch.of(seqs, 16, 32, 8, 128, "bf16", "HND", gen, pad_entry=-1, extra_cols=4)
    b.cache.poison(POISON, unused=False)
    b.cache.poison(math.nan, tails=False)
    b.attend(rt, io, b.metadata(step), lse=io.lse, max_seqlen_q=2048)
    b.check(step, io, "page-table padding -1, unused pages NaN")


def test_one_plan_serves_every_token_count(rt, ops):
    """Eager steps bring q/out/lse of a new token count each time: Runtime.attention (and the torch op)
    reuse one plan per layer, re-encoding only Q's descriptor, and every step is right, including a count
    seen before, a step of 0 tokens, and LSE [H_q, total_q] whose head stride follows the count."""
    gen = torch.Generator(device="cuda").manual_seed(111)
    b = PagedBatch([3000, 900, 5000, 40], 16, 32, 8, 128, "bf16", "NHD", gen, rows=600)
    b.cache.poison(POISON, tails=False)
    steps = [[(0, 512, 3000), (1, 1, 900), (2, 4, 5000), (3, 0, 40)],
             [(0, 1, 3000), (1, 1, 900), (2, 1, 5000), (3, 1, 40)],
             [(2, 300, 4321), (3, 4, 40), (0, 1, 2000), (1, 200, 900)],
             [(0, 512, 3000), (1, 1, 900), (2, 4, 5000), (3, 0, 40)],
             [(0, 0, 3000), (1, 0, 900), (2, 0, 5000), (3, 0, 40)]]
    before = len(rt.plans)
    for i, step in enumerate(steps):
        total = sum(s_q for _, s_q, _ in step)
        q = torch.randn(total, 32, 128, dtype=torch.bfloat16, device="cuda", generator=gen)
        out = torch.full_like(q, math.nan)
        lse = torch.full((32, total), math.nan, device="cuda")
        meta = b.metadata(step)
        if i % 2:
            torch.ops.aotc.attention(q, b.cache.k, b.cache.v, *meta, out, lse, None, True, None, "NHD")
        else:
            rt.attention(q, b.cache.k, b.cache.v, out, *meta, lse=lse, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        pos = 0
        for r, s_q, s_kv in step:
            if s_q:
                o_ref, l_ref = reference(q[pos:pos + s_q], *b.cache.dense(r, s_kv), True, 128 ** -0.5)
                check_close(out[pos:pos + s_q], o_ref, TOL["bf16"], f"step {i} row {r} out")
                check_close(lse[:, pos:pos + s_q], l_ref, LSE_TOL, f"step {i} row {r} lse")
            pos += s_q
    # one Runtime.attention plan (and its torch-layout alias) for the five steps' four token counts
    assert len(rt.plans) - before <= 2, len(rt.plans) - before


@pytest.mark.parametrize("kv_layout,alloc_pad", [("NHD", 0), ("HND", 128)])
def test_dense_kv_without_a_page_table(rt, kv_layout, alloc_pad):
    """page_table=None: dense caches [B, S_max, H_kv, D] (NHD; HND [B, H_kv, S_max, D], here views of a
    cache allocated 128 tokens longer), read as page pools of the same memory with the plan's own page
    table: a mixed batch (decode rows, an S_q 4 row, a chunk over a prefix, an empty sequence) against the
    reference on the dense keys, out and LSE NaN-poisoned; the cached plan's second call too."""
    gen = torch.Generator(device="cuda").manual_seed(77)
    H_q, H_kv, D, S_max = 32, 8, 128, 2304
    seqs = [(1, 1), (4, 700), (300, 2300), (0, 9), (1, 2304)]  # (s_q, s_kv)
    B = len(seqs)
    t = torch.bfloat16
    if kv_layout == "NHD":
        k = torch.randn(B, S_max + alloc_pad, H_kv, D, dtype=t, device="cuda", generator=gen)[:, :S_max]
        v = torch.randn(B, S_max + alloc_pad, H_kv, D, dtype=t, device="cuda", generator=gen)[:, :S_max]
        keys = lambda x, b, n: x[b, :n]  # noqa: E731
    else:
        k = torch.randn(B, H_kv, S_max + alloc_pad, D, dtype=t, device="cuda", generator=gen)[:, :, :S_max]
        v = torch.randn(B, H_kv, S_max + alloc_pad, D, dtype=t, device="cuda", generator=gen)[:, :, :S_max]
        keys = lambda x, b, n: x[b, :, :n].transpose(0, 1)  # noqa: E731
    cu = torch.tensor([0] + list(itertools.accumulate(s for s, _ in seqs)), dtype=torch.int32, device="cuda")
    sl = torch.tensor([n for _, n in seqs], dtype=torch.int32, device="cuda")
    total = int(cu[-1])
    q = torch.randn(total + 3, H_q, D, dtype=t, device="cuda", generator=gen)[:total]
    out = torch.full((total + 3, H_q, D), math.nan, dtype=t, device="cuda")
    lse = torch.full((H_q, total + 3), math.nan, device="cuda")
    scale = 1 / math.sqrt(D)
    for call in range(2):
        out.fill_(math.nan)
        lse.fill_(math.nan)
        skip_without_kernel(lambda: rt.attention(q, k, v, out[:total], cu, sl, None, lse=lse[:, :total],
                                                 kv_layout=kv_layout))
        torch.cuda.synchronize()
        for b, (s_q, s_kv) in enumerate(seqs):
            r0 = int(cu[b])
            o_ref, l_ref = reference(q[r0:r0 + s_q], keys(k, b, s_kv), keys(v, b, s_kv), True, scale)
            check_close(out[r0:r0 + s_q], o_ref, TOL["bf16"], f"dense {kv_layout} seq {b} call {call}")
            check_close(lse[:, r0:r0 + s_q], l_ref, LSE_TOL, f"dense {kv_layout} seq {b} LSE call {call}")
        assert torch.isnan(out[total:]).all() and torch.isnan(lse[:, total:]).all()
