"""The runtime's launch heuristics, pure arithmetic (no GPU): the decode work partition and its
workspace, and the combine's split groups.

The decode partition is checked with the facts the compiled kernels record (block_n, rows per CTA,
CTAs per SM, the smallest chunk), read off cubins compiled here for every head dim, through the host
half of the schedule (aotc.families.schedulers), whose arithmetic the kernel's device half
(aotc.kernels.tile_scheduler.KvChunks) repeats; the GPU suite checks the kernel's results over the same
kinds of batches.
"""
import math
import random

import pytest

from aotc.families.schedulers import decode_chunks, decode_columns, decode_grid, kv_chunk_partition

SMS = 132  # the H200's SM count


@pytest.fixture(scope="module")
def decode_facts(tmp_path_factory):
    """{head_dim: launch facts} of real sdpa_decode cubins (paged16, sm_90), as the runtime reads them."""
    pytest.importorskip("cutlass")
    from aotc.build.compile import compile_variant
    from aotc.common.variant import Variant

    facts = {}
    for d in (64, 128, 256):
        v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=d, kv="paged16", layout="dense")
        facts[d] = compile_variant(v, key="0" * 64, check_sources=False).launch.extra
    return facts


def _partition(facts, lengths, heads_q, heads_kv, seqlen_q=1):
    bn, min_chunk = int(facts["block_n"]), int(facts["min_chunk_blocks"])
    columns = decode_columns(heads_q, heads_kv, seqlen_q, int(facts["rows_per_cta"]))
    chunks = decode_chunks(columns, SMS, int(facts["ctas_per_sm"]))
    blocks = [math.ceil(n / bn) for n in lengths]
    return blocks, chunks, columns, kv_chunk_partition(blocks, chunks, min_chunk)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("batch", [1, 2, 4, 8])
@pytest.mark.parametrize("heads_kv", [1, 2, 4, 8])
def test_decode_partition_never_yields_an_empty_chunk(decode_facts, head_dim, batch, heads_kv):
    facts = decode_facts[head_dim]
    for seqlen in (256, 1000, 4096, 8192, 32768, 65536):
        blocks, chunks, columns, parts = _partition(facts, [seqlen] * batch, heads_kv * 4, heads_kv)
        assert all(n > 0 for _, _, n in parts), f"an empty chunk at S_kv {seqlen}: {parts}"
        # every kv block of every sequence in exactly one chunk
        for b, nb in enumerate(blocks):
            covered = sorted(j for s, lo, n in parts if s == b for j in range(lo, lo + n))
            assert covered == list(range(nb))
        # the grid's chunk extent holds every chunk, and the GPU is filled when there is enough work
        assert len(parts) <= decode_grid(columns, chunks, batch)[1] == chunks + batch
        if sum(blocks) >= chunks * int(facts["min_chunk_blocks"]):
            # chunks of ceil(W / T) blocks: at least T * W / (W + T) of them, 4/5 of a wave with W >= 4 T
            assert len(parts) >= 0.8 * chunks


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_partition_balances_skewed_batches(decode_facts, head_dim):
    """Lengths 0, 1, 15, 16, 17 beside 32768 and more: every chunk is at most the common chunk size, the
    largest chunks come first, and a zero-length sequence gets its (empty) chunk, which writes O = 0."""
    facts = decode_facts[head_dim]
    rng = random.Random(7)
    batches = [[0, 1, 15, 16, 17, 32768, 40000],
               [32768, 32768] + [1024] * 62,
               [32768] + [512] * 7,
               [int(min(65536, 64 * rng.paretovariate(0.8))) for _ in range(128)]]
    for lengths in batches:
        blocks, chunks, columns, parts = _partition(facts, lengths, 32, 8)
        c = max(int(facts["min_chunk_blocks"]), -(-sum(blocks) // chunks))
        # at most the common chunk size, a sequence's last full chunk with a rest under c / 4 (no chunk
        # of a few blocks: each costs a CTA's start and merge)
        assert all(n <= c + (c - 1) // 4 for _, _, n in parts)
        sizes = [n for _, _, n in parts]
        full = sum(nb // c for nb in blocks)
        assert all(c <= n for n in sizes[:full])  # full chunks first, then the partial ones
        assert all(n >= c // 4 or n == nb or n == 0 for (b, _, n), nb in
                   ((p, blocks[p[0]]) for p in parts[full:]))
        for b, nb in enumerate(blocks):
            mine = [(lo, n) for s, lo, n in parts if s == b]
            assert mine, f"sequence {b} has no chunk"
            assert sum(n for _, n in mine) == nb
        # no chunk holds more than 5/4 of ceil(W / T) blocks of work
        assert max(sizes) <= c + (c - 1) // 4 and c <= max(int(facts["min_chunk_blocks"]), math.ceil(sum(blocks) / chunks))


def test_decode_facts_are_the_kernels_own(decode_facts):
    """D64 walks 128 keys per kv block, D128 and D256 64: the runtime reads that off the kernel, where it
    once assumed 64 everywhere (a third of D64 cases then launched an empty split)."""
    assert {d: f["block_n"] for d, f in decode_facts.items()} == {64: 128, 128: 64, 256: 64}
    assert all(f["ctas_per_sm"] == 2 and f["rows_per_cta"] == 16 for f in decode_facts.values())


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("rows", [1, 32, 100, 256, 264, 1000, 2048, 65536])
def test_combine_split_groups(head_dim, rows):
    from aotc.families.sdpa_combine import choose_split_groups, slices_per_cta

    sms = 132
    slices = slices_per_cta(head_dim)
    g = choose_split_groups(slices, rows, sms)
    assert 1 <= g <= slices and slices % g == 0
    ctas = -(-rows * g // slices)
    # the most groups that keep the grid within 2 CTAs per SM (1 group when even that is too many)
    assert g == 1 or ctas <= 2 * sms
    assert g == slices or -(-rows * 2 * g // slices) > 2 * sms


def test_combine_split_groups_by_shape():
    from aotc.families.sdpa_combine import choose_split_groups, slices_per_cta

    d128 = slices_per_cta(128)
    assert choose_split_groups(d128, 32, 132) == 4      # B=1 decode, 32 query heads: one warp per split group
    assert choose_split_groups(d128, 64 * 32, 132) == 1  # B=64: rows fill the GPU, one slice per row


@pytest.mark.parametrize("batch,seqlen_q,heads_q,heads_kv", [(1, 1, 32, 8), (3, 4, 8, 2), (64, 1, 32, 8),
                                                             (2, 16, 64, 1), (5, 1, 16, 16), (1, 3, 40, 8)])
@pytest.mark.parametrize("chunks", [2, 7, 64])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_workspace_layout(batch, seqlen_q, heads_q, heads_kv, chunks, head_dim):
    from aotc.runtime.decode import workspace_bytes, workspace_layout

    need = workspace_bytes(batch, seqlen_q, heads_q, head_dim, chunks)
    slots = chunks + batch  # every chunk the partition can make
    for nbytes in (need, need + 4, need + 1000):
        at = workspace_layout(batch, seqlen_q, heads_q, heads_kv, head_dim, chunks, nbytes)
        rows = seqlen_q * heads_q
        # one counter per decode CTA column (sequence, KV head, row tile of 16 packed rows)
        assert at["n_counters"] == batch * heads_kv * math.ceil(heads_q // heads_kv * seqlen_q / 16)
        assert at["lse_partial"] >= slots * rows * head_dim * 4 and at["lse_partial"] % 16 == 0
        assert at["partials_end"] >= at["lse_partial"] + slots * rows * 4
        assert at["counters"] % 16 == 0 and at["counters"] >= at["partials_end"]
        assert at["counters"] + at["n_counters"] * 4 <= nbytes
    with pytest.raises(ValueError, match="too small"):
        workspace_layout(batch, seqlen_q, heads_q, heads_kv, head_dim, chunks, need - 16)
    assert workspace_bytes(batch, seqlen_q, heads_q, head_dim, 1) == 0  # one chunk: nothing is split


def test_decode_plans_sharing_a_workspace_sized_for_the_largest_never_overlap():
    # every plan's partials end before every other plan's counters start when the buffer is sized with
    # decode_workspace_bytes of the most rows and chunks (what the decode docs advise)
    from aotc.runtime.decode import workspace_bytes, workspace_layout

    configs = [(b, 1, hq, hkv, s) for b in (1, 8, 64) for hq, hkv in ((32, 8), (16, 2), (8, 8)) for s in (2, 24, 64)]
    nbytes = workspace_bytes(64, 1, 32, 128, 64)
    layouts = [workspace_layout(b, sq, hq, hkv, 128, s, nbytes) for b, sq, hq, hkv, s in configs]
    first_counter = min(at["counters"] for at in layouts)
    assert max(at["partials_end"] for at in layouts) <= first_counter


def test_a_rest_of_a_few_blocks_joins_the_last_full_chunk():
    """B16 x 65 blocks over 33 target chunks (a 4096 window over 32k contexts, D128): chunks of 32 leave a
    1-block rest per sequence, which its second chunk takes: 32 chunks, not 48 with 16 of one block."""
    parts = kv_chunk_partition([65] * 16, 33, 4)
    assert len(parts) == 32 and sorted({n for _, _, n in parts}) == [32, 33]
    # a rest of a quarter chunk or more keeps its own chunk; so does a sequence shorter than a chunk
    parts = kv_chunk_partition([72, 10], 3, 4)  # c = 28: 72 = 2 * 28 + 16, 10 < 28
    assert parts == [(0, 0, 28), (0, 28, 28), (0, 56, 16), (1, 0, 10)]
