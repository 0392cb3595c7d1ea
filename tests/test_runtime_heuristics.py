"""The runtime's launch heuristics: decode split counts, combine split groups (pure arithmetic: no GPU needed)."""
import math

import pytest

from aotc.runtime.decode import BLOCK_N, CTAS_PER_SM, MAX_SPLITS, choose_splits


def test_b1_long_context_fills_one_wave_without_an_empty_split():
    # H200: 132 SMs, 2 CTAs each; B=1, 8 KV heads -> 33 would fit, but 512 blocks in 33 splits are
    # 32 splits of 16 blocks and one empty split: 32
    assert choose_splits(1, 8, 1, 32768, 132) == 32


@pytest.mark.parametrize("batch", [1, 2, 3, 8, 64, 128])
@pytest.mark.parametrize("heads_kv", [1, 4, 8, 32])
@pytest.mark.parametrize("seqlen", [0, 1, 63, 64, 300, 4097, 32768, 131072])
def test_splits_fit_one_wave_and_each_gets_blocks(batch, heads_kv, seqlen):
    sms = 132
    n = choose_splits(batch, heads_kv, 1, seqlen, sms)
    assert 1 <= n <= MAX_SPLITS
    ctas = batch * heads_kv
    assert n == 1 or n * ctas <= sms * CTAS_PER_SM
    blocks = max(1, math.ceil(seqlen / BLOCK_N))
    assert n == 1 or math.ceil(blocks / n) >= 4  # at least 4 blocks of work per split
    per_split = math.ceil(blocks / n)
    assert (n - 1) * per_split < blocks, f"{n} splits of {per_split} blocks leave the last one empty"


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
@pytest.mark.parametrize("splits", [2, 7, 64])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_workspace_layout(batch, seqlen_q, heads_q, heads_kv, splits, head_dim):
    from aotc.runtime.decode import workspace_bytes, workspace_layout

    need = workspace_bytes(batch, seqlen_q, heads_q, head_dim, splits)
    for nbytes in (need, need + 4, need + 1000):
        at = workspace_layout(batch, seqlen_q, heads_q, heads_kv, head_dim, splits, nbytes)
        rows = batch * seqlen_q * heads_q
        # one counter per decode CTA column (sequence, KV head, row tile of 16 packed rows)
        assert at["n_counters"] == batch * heads_kv * math.ceil(heads_q // heads_kv * seqlen_q / 16)
        assert at["lse_partial"] >= splits * rows * head_dim * 4 and at["lse_partial"] % 16 == 0
        assert at["partials_end"] >= at["lse_partial"] + splits * rows * 4
        assert at["counters"] % 16 == 0 and at["counters"] >= at["partials_end"]
        assert at["counters"] + at["n_counters"] * 4 <= nbytes
    with pytest.raises(ValueError, match="too small"):
        workspace_layout(batch, seqlen_q, heads_q, heads_kv, head_dim, splits, need - 16)


def test_decode_plans_sharing_a_workspace_sized_for_the_largest_never_overlap():
    # every plan's partials end before every other plan's counters start when the buffer is sized with
    # decode_workspace_bytes of the most rows and splits (what the decode docs advise)
    from aotc.runtime.decode import workspace_bytes, workspace_layout

    configs = [(b, 1, hq, hkv, s) for b in (1, 8, 64) for hq, hkv in ((32, 8), (16, 2), (8, 8)) for s in (2, 24, 64)]
    nbytes = workspace_bytes(64, 1, 32, 128, 64)
    layouts = [workspace_layout(b, sq, hq, hkv, 128, s, nbytes) for b, sq, hq, hkv, s in configs]
    first_counter = min(at["counters"] for at in layouts)
    assert max(at["partials_end"] for at in layouts) <= first_counter
