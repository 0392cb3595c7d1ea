"""The decode plan's split heuristic (pure arithmetic: no GPU needed)."""
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
