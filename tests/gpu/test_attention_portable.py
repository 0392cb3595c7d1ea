"""The attention entry point on the portable paged kernel (sdpa_prefill, layouts paged16 .. paged128): the path
Runtime.attention takes where no Hopper kernel (sdpa_prefill_sm90) serves the call, run here on an sm_90 device
from a bundle that holds none (tests/gpu/specs/portable_paged.toml: the portable paged kernels for sm_90 and the
ragged decode kernels). Its path comes from AOTC_TEST_PORTABLE_BUNDLE; unset, every test skips with the
command that builds it.

Checks as test_attention.py's (its PagedBatch and blocked fp32 reference, outputs and LSE NaN-poisoned): mixed
batches (decode rows, S_q 4 rows, 2048-token chunks over prefixes of 0, 1, 15 and 3000 tokens, empty sequences)
at every page size, NHD and HND, GQA 1/4/8 and a group of 7 (H_q 28 over H_kv 4: no divisor of the Hopper
kernel's 64-row tiles), D 64/128/256, fp16 and bf16, with and without LSE and max_seqlen_q; NaN in the last
page's tail at every page size, page ids outside the pool (read as zeros), rows that see no key, a
max_seqlen_q below the query counts (the CTAs walk the extra tiles); and, calling
test_attention.py's and test_features.py's own tests with this runtime, page-table padding of -1 over NaN pages,
causal=False, a CUDA graph replayed within its captured max_seqlen_q (plan and torch op), steps of other token
counts on one plan, and the score features the bundle holds; and test_fp8_kv.py's attention checks over e4m3
pools (D 64, 128 and 256). Every test also checks that its plans ran the portable kernel; one loads the Hopper
bundle beside it, where MQA over 128 query heads (past the Hopper kernel's 64-row Q box) must still take the
portable kernel and 64 the Hopper one.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

import test_attention as T
import test_fp8_kv as F8
from test_attention import POISON, PagedBatch, case_id, reference
from test_features import MIXED_SETTINGS, attention_mixed_batch

pytestmark = pytest.mark.gpu

BUNDLE_ENV = "AOTC_TEST_PORTABLE_BUNDLE"
SPEC = "tests/gpu/specs/portable_paged.toml"
PORTABLE, HOPPER = "sdpa_prefill", "sdpa_prefill_sm90"

# (s_q, s_kv): decode rows, S_q 4 rows, empty sequences (over 50 keys and over none), 2048-token chunks over
# prefixes of 0, 1, 15 and 3000 tokens; s_kv mostly not a multiple of the page or of a kv block
MIXED = [(1, 1), (2048, 2048), (1, 17), (4, 4), (0, 50), (2048, 2049), (1, 1000), (0, 0), (4, 130),
         (2048, 2063), (1, 4096), (2048, 5048), (4, 4099)]

# (dtype, D, page, kv_layout, H_q, H_kv, padded): every page size in both layouts at every head dim, both
# dtypes, GQA 1/4/8 and 7 (28 / 4); padded: q/out/LSE views into wider buffers, a padded page table
CASES = [
    ("bf16", 128, 16, "NHD", 32, 8, False),
    ("fp16", 128, 32, "HND", 8, 8, True),
    ("bf16", 128, 64, "NHD", 64, 8, True),
    ("fp16", 128, 128, "HND", 28, 4, False),
    ("bf16", 64, 16, "HND", 8, 8, True),
    ("fp16", 64, 32, "NHD", 28, 4, False),
    ("bf16", 64, 64, "HND", 32, 8, False),
    ("fp16", 64, 128, "NHD", 64, 8, False),
    ("bf16", 256, 16, "NHD", 32, 8, False),
    ("fp16", 256, 32, "NHD", 8, 8, False),
    ("bf16", 256, 64, "HND", 28, 4, True),
    ("fp16", 256, 128, "HND", 32, 8, False),
]


@pytest.fixture(scope="module")
def prt():
    """The portable bundle's runtime (no Hopper kernel in it: Runtime.attention must take the portable path)."""
    path = os.environ.get(BUNDLE_ENV)
    if not path:
        pytest.skip(f"{BUNDLE_ENV} is unset: build the bundle with `python -m aotc build {SPEC} -j 2 --bundle "
                    f"artifacts/portable_paged.aotc` and point {BUNDLE_ENV} at it")
    if not Path(path).exists():
        pytest.fail(f"{BUNDLE_ENV}={path}: no such file (build it from {SPEC})")
    import aotc.runtime

    torch.cuda.init()
    rt = aotc.runtime.load(path)
    assert HOPPER not in rt.kernels, f"{path} holds {HOPPER} kernels: the Hopper path would run, not the portable one"
    assert rt.kernels.get(PORTABLE), f"{path} holds no {PORTABLE} kernel"
    return rt


def portable_plans(rt) -> list:
    """The runtime's attention plans; each must run the portable kernel."""
    plans = [p for p in rt.plans.values() if hasattr(p, "prefill_family")]
    assert plans, "no attention plan was made"
    assert all(p.prefill_family == PORTABLE for p in plans), [p.prefill_family for p in plans]
    return plans


def test_capabilities_serve_attention(prt):
    a = prt.capabilities()["entry_points"]["attention"]
    assert a["supported"] and a["page_sizes"] == [16, 32, 64, 128] and a["head_dims"] == [64, 128, 256]
    assert a["served_by"][0]["family"] == PORTABLE


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_mixed_batch_matches_reference(prt, case):
    """The whole MIXED batch in one call with LSE and the engine's bounds (decode_query_len 0: every row on the
    portable kernel; 1; 4: the S_q 4 rows on the decode kernel too), then without LSE, with no max_seqlen_q
    (the grid then covers the token count) and the default split."""
    T.mixed_batch(prt, case, MIXED, CASES.index(case), 500 + CASES.index(case), "portable mixed")
    portable_plans(prt)


def test_a_bound_below_the_query_counts_still_covers_every_row(prt):
    """max_seqlen_q below a sequence's query count (a stale bound, or a graph replayed past the one it was
    captured with): the grid is smaller and each CTA walks its sequence's query tiles gridDim.x apart, so every
    row is still written (the Hopper kernel reads the counts on the device and never needed the bound)."""
    gen = torch.Generator(device="cuda").manual_seed(590)
    seqs = [(2048, 2063), (300, 3300), (4, 130), (1, 17), (129, 129)]
    b, step, io = PagedBatch.of(seqs, 32, 32, 8, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    meta = b.metadata(step)
    refs = b.references(step, io)
    for bound in (2, 130, 1000):
        io.poison()
        b.attend(prt, io, meta, lse=io.lse, max_seqlen_q=bound, decode_query_len=1)
        b.check(step, io, f"max_seqlen_q {bound} below the query counts", refs=refs)
    portable_plans(prt)


@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("decode_query_len", [0, 1])
def test_nan_past_the_end_in_the_last_page(prt, page, decode_query_len):
    """The slots past a sequence's end in its last page hold NaN: the portable kernel zero-fills those K/V rows
    in shared memory (never loads them), whether the last kv block is whole pages (page <= block_n) or lies
    inside one page (page 128 > block_n)."""
    gen = torch.Generator(device="cuda").manual_seed(600 + page + decode_query_len)
    seqs = [(1, 17), (2048, 2063), (4, 130), (1, 1), (300, 301), (77, 77)]
    b, step, io = PagedBatch.of(seqs, page, 32, 8, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    b.cache.poison(math.nan, unused=False)
    b.attend(prt, io, b.metadata(step), lse=io.lse, decode_query_len=decode_query_len, max_seqlen_q=2048)
    b.check(step, io, f"NaN past the end, page {page}, decode_query_len {decode_query_len}")
    portable_plans(prt)


def test_page_table_padding_entries_are_never_read(prt):
    """test_attention.py's: page-table entries past a sequence's pages hold -1, the pages no one owns NaN."""
    T.test_page_table_padding_entries_are_never_read(prt)
    portable_plans(prt)


@pytest.mark.parametrize("page", [16, 128])
def test_page_ids_outside_the_pool_read_zeros(prt, page):
    """A page id below 0 or past the pool inside a sequence's pages is never dereferenced: its keys and values
    read as zeros (as the Hopper kernel's TMA reads them), so the reference is the sequence with those rows 0."""
    gen = torch.Generator(device="cuda").manual_seed(620 + page)
    seqs = [(300, 1000), (200, 520), (2, 2)]
    b, step, io = PagedBatch.of(seqs, page, 16, 4, 128, "fp16", "NHD", gen)
    b.cache.poison(POISON)
    meta = b.metadata(step)
    pages = b.cache.k.shape[0]
    bad = {0: {1: pages + 5, 3: -7}, 1: {0: 1 << 30}}  # slot -> {page index: id}
    for slot, cols in bad.items():
        for j, pg in cols.items():
            meta[2][slot, j] = pg
    refs, pos = [], 0
    for slot, (r, s_q, s_kv) in enumerate(step):
        k, v = (x.clone() for x in b.cache.dense(r, s_kv))
        for j in bad.get(slot, {}):
            k[j * page:(j + 1) * page] = 0
            v[j * page:(j + 1) * page] = 0
        refs.append(reference(io.q[pos:pos + s_q], k, v, True, 128 ** -0.5))
        pos += s_q
    b.attend(prt, io, meta, lse=io.lse, max_seqlen_q=300, decode_query_len=0)
    b.check(step, io, f"page ids outside the pool, page {page}", refs=refs)


@pytest.mark.parametrize("decode_query_len", [0, 1])
def test_rows_that_see_no_key_and_empty_sequences(prt, decode_query_len):
    """s_q above s_kv (the first s_q - s_kv rows see no key: O = 0, LSE = -inf), s_kv 0 with new tokens, and
    sequences without queries (over keys and over none) between them."""
    gen = torch.Generator(device="cuda").manual_seed(630 + decode_query_len)
    seqs = [(5, 2), (3, 0), (0, 0), (1, 0), (2, 40), (0, 33), (170, 3), (1, 1), (129, 129)]
    b, step, io = PagedBatch.of(seqs, 32, 28, 4, 64, "bf16", "HND", gen)
    b.cache.poison(POISON)
    b.attend(prt, io, b.metadata(step), lse=io.lse, max_seqlen_q=170, decode_query_len=decode_query_len)
    b.check(step, io, f"rows that see no key, decode_query_len {decode_query_len}")


@pytest.mark.parametrize("heads_q, family", [(128, PORTABLE), (64, HOPPER)])
def test_a_gqa_group_past_the_hopper_q_box_runs_on_the_portable_kernel(rt, prt, heads_q, family):
    """Hopper and portable kernels loaded together (the suite's bundle and this one): MQA over 128 query heads
    (group 128, past the Hopper kernel's 64-row Q box) runs on the portable kernel, 64 on the Hopper one; a mixed
    batch with its decode rows on the decode kernel, against the fp32 reference."""
    import aotc.runtime

    if not rt.kernels.get(HOPPER):
        pytest.skip(f"the suite's bundle ({rt.capabilities()['sources']}) holds no {HOPPER} kernel")
    both = aotc.runtime.load(*rt.capabilities()["sources"], os.environ[BUNDLE_ENV])
    gen = torch.Generator(device="cuda").manual_seed(640 + heads_q)
    seqs = [(1, 1000), (300, 700), (4, 130), (1, 17), (129, 129)]
    b, step, io = PagedBatch.of(seqs, 16, heads_q, 1, 128, "bf16", "NHD", gen)
    b.cache.poison(POISON)
    b.attend(both, io, b.metadata(step), lse=io.lse, max_seqlen_q=300, decode_query_len=1)
    b.check(step, io, f"H_q {heads_q} over one KV head")
    # (the runtime keeps more than one plan of the step: every one must have taken the family)
    assert {p.prefill_family for p in both.plans.values() if hasattr(p, "prefill_family")} == {family}


def test_non_causal(prt):
    T.test_non_causal(prt)
    portable_plans(prt)


@pytest.fixture
def portable_ops(prt):
    """aotc.torch (torch.ops.aotc.*) launching through the portable bundle's runtime."""
    import aotc.torch

    aotc.torch.set_runtime(prt)
    yield aotc.torch
    aotc.torch.set_runtime(None)


@pytest.mark.parametrize("via", ["plan", "op"])
def test_cuda_graph_replay_within_the_captured_bound(prt, portable_ops, via):
    """test_attention.py's graph test: captured with max_seqlen_q 2048 (the portable grid: ceil(2048 / block_m)
    tiles a query head and sequence), replayed after rewriting the metadata in place for steps whose query
    counts stay within it (lengths growing, the long sequence moving slots, decode rows only)."""
    T.test_cuda_graph_replay_follows_device_metadata(prt, portable_ops, via)
    portable_plans(prt)


def test_one_plan_serves_every_token_count(prt, portable_ops):
    """test_attention.py's: eager steps of new token counts (0 included) on one plan, through rt.attention and
    the torch op (the portable kernel's Q is a pointer: nothing re-encoded; its grid follows the count)."""
    T.test_one_plan_serves_every_token_count(prt, portable_ops)
    portable_plans(prt)


@pytest.mark.parametrize("index", MIXED_SETTINGS)
def test_features_mixed_batch(prt, index):
    """test_features.py's mixed batch for the bundle's paged feature variants of the portable family (window +
    sinks, soft-cap; the decode rows on the portable kernel too, the bundle having no decode kernel with them)."""
    attention_mixed_batch(prt, index, PORTABLE)
    portable_plans(prt)


# ---- fp8 KV pools (kv_dtype fp8_e4m3, D 64, 128 and 256): test_fp8_kv.py's checks on the portable kernel

@pytest.mark.parametrize("layout,per_head,heads", F8.ATTN_SETTINGS)
@pytest.mark.parametrize("decode_query_len,max_seqlen_q", [(0, 2048), (1, 2048), (0, 64)])
def test_fp8_mixed_batch(prt, layout, per_head, heads, decode_query_len, max_seqlen_q):
    """test_fp8_kv.py's mixed batch over e4m3 pools with per-head and per-tensor scales, every fp8 variant the
    bundle holds (decode_query_len 0: every row on the portable kernel; 1: the decode rows on the fp8 decode
    kernel; max_seqlen_q 64: a bound below the query counts, so each CTA walks several query tiles, Q rewritten
    in fp16 for each), against fp64 attention over the dequantized cache."""
    F8.fp8_attention_mixed_batch(prt, F8.fp8_attention_variants(prt, PORTABLE), layout, per_head, heads,
                                 decode_query_len, max_seqlen_q)
    portable_plans(prt)


def test_fp8_large_queries_and_graph_replay(prt):
    """|q| ~ 1e6 (Q rewritten in fp16 times a power of two per tile), then CUDA-graph replay with new lengths."""
    for variant in F8.fp8_attention_variants(prt, PORTABLE):
        F8.fp8_attention_large_queries_and_graph_replay(prt, variant)
    portable_plans(prt)


def test_fp8_with_score_features(prt):
    """The bundle's fp8 portable kernels with score features (gpt-oss's sinks, window + sinks at D64) and their
    decode rows' kernels, every feature value, on a mixed batch against fp64 (test_fp8_kv.py's)."""
    assert F8.fp8_attention_with_features(prt, PORTABLE), "the bundle has no fp8 portable kernel with score features"
    portable_plans(prt)
