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

