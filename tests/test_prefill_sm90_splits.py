"""The paged prefill kernel's KV splits, in plain Python (no GPU): how a tile's kv blocks are cut into splits
(aotc.families.sdpa_prefill_sm90.kv_split_range, which the kernel runs on its Int32s), which blocks each split
masks (the kernel's item_kv_range clamps the tile's mask bounds into the split, then mask.kv_loop_segments cuts
its loop: mirrored here), and the workspace the runtime sizes for the kernel's slots (split_workspace_bytes
against the kernel's split_slot layout). The GPU suite checks the results against the reference
(tests/gpu/test_attention.py::test_kv_splits_*)."""
from __future__ import annotations

import itertools

import pytest

from aotc.families.sdpa_prefill_sm90 import (MAX_KV_SPLITS, MIN_SPLIT_BLOCKS, Q_BOX_ROWS, TILES, WARPGROUP,
                                             kv_split_range, split_workspace_bytes)


def loop_visits(n_min, n_max, n_mask_min, n_left_end, window):
    """[(block, masked)] a consumer's kv loop visits, in the kernel's loops (kv_loop over mask.kv_loop_segments:
    iteration t visits block n_max - 1 - t; t = 0 (first_block) masked, 1 <= t < n_right masked, up to n_plain_end
    plain, then, windowed, masked to n_iter). A masked block takes every bound of its rows (the paged softmax's
    row_lo and row_lim), so only masked or not matters."""
    n_iter = n_max - n_min
    n_right = n_max - n_mask_min
    n_plain_end = max(n_right, n_max - n_left_end)
    ts = [(0, True)] + [(t, True) for t in range(1, n_right)]
    ts += [(t, False) for t in range(max(n_right, 1), n_plain_end)]
    if window:
        ts += [(t, True) for t in range(max(n_plain_end, 1), n_iter)]
    return [(n_max - 1 - t, masked) for t, masked in ts]


def item_range(kv_range, split, splits, clamp=True):
    """The kernel's item_kv_range: the split's blocks, the tile's mask bounds clamped into them."""
    n_min, n_max, n_mask_min, n_left_end = kv_range
    lo, hi = kv_split_range(n_min, n_max, split, splits)
    if not clamp:
        return lo, hi, n_mask_min, n_left_end
    return lo, hi, min(max(n_mask_min, lo), hi), min(max(n_left_end, lo), hi)


def split_visits(kv_range, splits, window, clamp=True):
    """Every split's visits, checked to stay inside its own blocks: {block: masked}."""
    got = {}
    for s in range(splits):
        lo, hi, *bounds = item_range(kv_range, s, splits, clamp)
        for block, masked in loop_visits(lo, hi, *bounds, window):
            assert lo <= block < hi, f"split {s} of {splits} over {kv_range} visits block {block} outside [{lo}, {hi})"
            assert block not in got, f"block {block} visited twice"
            got[block] = masked
    return got


@pytest.mark.parametrize("n_min", [0, 5])
def test_splits_cover_a_tiles_blocks_once_in_order(n_min):
    for n, splits in itertools.product(range(0, 70), range(1, MAX_KV_SPLITS + 1)):
        n_max = n_min + n
        ranges = [kv_split_range(n_min, n_max, s, splits) for s in range(splits)]
        assert ranges[0][1] == n_max and ranges[-1][0] == n_min, (n, splits, ranges)
        for (lo, hi), (lo_next, hi_next) in zip(ranges, ranges[1:]):
            assert hi_next == lo, f"split after [{lo}, {hi}) is [{lo_next}, {hi_next}): a gap or an overlap"
        lengths = [hi - lo for lo, hi in ranges]
        assert max(lengths) - min(lengths) <= 1, (n, splits, lengths)
        if n >= splits:
            assert min(lengths) >= 1, f"{n} blocks over {splits} splits left one empty: {lengths}"


@pytest.mark.parametrize("window", [False, True])
def test_each_block_is_masked_in_its_split_as_in_the_whole_tile(window):
    """Every block the whole tile's loop visits is visited by exactly one split, inside that split's own blocks,
    masked wherever the whole tile masks it (a split's first block is always masked: a plain block masked stays
    the same), for every place the mask bounds can sit and every split count that leaves no split empty (the
    kernel's tile_splits: at least MIN_SPLIT_BLOCKS a split)."""
    for n_min, n in itertools.product((0, 3), range(1, 20)):
        n_max = n_min + n
        lefts = range(n_min, n_max + 1) if window else (n_min,)
        for n_mask_min, n_left_end, splits in itertools.product(range(n_min, n_max + 1), lefts, range(1, min(n, 8) + 1)):
            kv_range = (n_min, n_max, n_mask_min, n_left_end)
            whole = dict(loop_visits(*kv_range, window))
            got = split_visits(kv_range, splits, window)
            assert set(got) == set(whole), (kv_range, splits)
            assert all(got[b] for b, masked in whole.items() if masked), (kv_range, splits, got, whole)


def test_the_check_sees_an_unclamped_mask_bound():
    """Without the clamp, a split inside the tile's masked blocks would run its masked loop past its own blocks
    (n_right over its iterations): the check above must catch that."""
    kv_range = (0, 20, 12, 0)  # blocks [12, 20) masked; split 0 of 4 holds [15, 20)
    with pytest.raises(AssertionError, match="outside"):
        split_visits(kv_range, 4, False, clamp=False)
    split_visits(kv_range, 4, False)


@pytest.mark.parametrize("head_dim,block_n", sorted(TILES))
def test_the_workspace_holds_every_slot_the_kernel_writes(head_dim, block_n):
    """split_workspace_bytes against the kernel's split_slot layout: a launch of C CTAs runs at most C items
    (splits * tiles <= CTAs), item i's consumer warpgroup w at float (i * n_wg + w) * 128 * (frag + 2), frag = a
    thread's O fragment (64 rows x D over 128 threads), then two LSEs a thread; the counters are one a (tile, warpgroup),
    named by the item index of the tile's split 0."""
    tile = TILES[head_dim, block_n]
    n_wg = tile.block_m // Q_BOX_ROWS
    frag = Q_BOX_ROWS * head_dim // WARPGROUP
    for ctas in (1, 66, 132, 144):
        partials, counters = split_workspace_bytes(ctas, tile.block_m, head_dim)
        last_slot_end = ((ctas - 1) * n_wg + (n_wg - 1) + 1) * WARPGROUP * (frag + 2) * 4
        assert partials == last_slot_end
        assert counters == ctas * n_wg * 4
        assert partials % 16 == 0  # each thread's 16-byte vectors stay aligned


def test_split_limits():
    # split and split count share a byte each of the tile record's split word, the item index its high 16 bits
    assert 1 <= MAX_KV_SPLITS <= 255 and MIN_SPLIT_BLOCKS >= 1


def test_which_kernels_split():
    """The launch fact the runtime reads to give a kernel its split workspace: the 16-bit paged kernels only (fp8 KV
    not yet: the split loop spilled its conversion warps)."""
    from aotc.common.variant import Variant
    from aotc.families import get_family
    from aotc.families.sdpa_prefill_sm90 import kv_splits

    def v(layout, kv_dtype="bf16"):
        return Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout=layout, causal=True,
                            block_n=128, kv_dtype=kv_dtype)
    assert [kv_splits(v(layout)) for layout in ("dense", "ragged", "paged16", "paged128")] == [False, False, True, True]
    assert not kv_splits(v("paged16", "fp8_e4m3"))
    assert get_family("sdpa_prefill_sm90").launch(v("paged16")).extra["kv_splits"] is True
