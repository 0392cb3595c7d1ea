"""The split tail of the Hopper prefill's dense non-causal launches, without a GPU: the plan
(aotc.families.sdpa_prefill_sm90.tail_split_pieces, the kernel's PersistentTiles.tail_plan and tail_piece in plain
Python) covers every kv block of every tile once, gives each CTA an equal share, cuts a tile at most once, and names
each cut's workspace slot once, inside the workspace the runtime sizes; which variants split (their launch facts);
and the dense plan's launches carrying the stream's split workspace. The GPU suite checks the results against the
reference (tests/gpu/test_prefill_sm90.py::test_split_tail_*)."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

import aotc.runtime.prefill as P
from aotc.common.variant import Variant
from aotc.families import get_family
from aotc.families.sdpa_prefill_sm90 import (PARAMS, TAIL_SPLIT_HEAD_DIMS, TAIL_SPLIT_MIN_BLOCKS, split_workspace_bytes,
                                             tail_split_pieces, tail_splits)
from aotc.runtime import tensor
from aotc.runtime.validate import packed_strides
from recorded_launch import SPLITS, OneTile, RecordingSlot, record_launches, split_arena, stream_counters

SHAPES = [(tiles, ctas, blocks) for tiles, ctas, blocks in itertools.product(
    (1, 7, 131, 132, 133, 200, 263, 264, 265, 2048, 4224), (1, 3, 66, 132), (1, 7, 8, 9, 16, 33, 47, 64))]


def whole_rounds(tiles: int, ctas: int, plan: dict) -> int:
    """Rounds of whole tiles before the split tail (all of them without one)."""
    return tiles // ctas - 1 if plan else -(-tiles // ctas)


@pytest.mark.parametrize("tiles,ctas,blocks", SHAPES)
def test_the_tail_covers_every_block_of_its_tiles_once(tiles, ctas, blocks):
    plan = tail_split_pieces(tiles, ctas, blocks)
    splits = tiles >= ctas and tiles % ctas != 0 and blocks >= TAIL_SPLIT_MIN_BLOCKS
    assert bool(plan) == splits, (tiles, ctas, blocks)
    if not plan:
        return
    first_tail = whole_rounds(tiles, ctas, plan) * ctas
    seen = {}
    for cta, pieces in plan.items():
        for tile, lo, hi, _, _ in pieces:
            assert first_tail <= tile < tiles and 0 <= lo < hi <= blocks, (cta, tile, lo, hi)
            for b in range(lo, hi):
                assert (tile, b) not in seen, f"block {b} of tile {tile}: CTAs {seen[tile, b]} and {cta}"
                seen[tile, b] = cta
    assert len(seen) == (tiles - first_tail) * blocks


@pytest.mark.parametrize("tiles,ctas,blocks", SHAPES)
def test_each_cta_gets_an_equal_share_and_a_tile_is_cut_at_most_once(tiles, ctas, blocks):
    """A CTA's blocks are within one of every other's (the tail's units over the CTAs), at least a tile's worth, so
    a tile goes to one CTA or to two neighbours: the piece ending CTA b's range is split 0 and the piece starting CTA
    b + 1's is split 1 of boundary b, each boundary once, below `ctas` (the workspace's slots and counters)."""
    plan = tail_split_pieces(tiles, ctas, blocks)
    if not plan:
        return
    shares = [sum(hi - lo for _, lo, hi, _, _ in pieces) for pieces in plan.values()]
    assert max(shares) - min(shares) <= 1 and min(shares) >= blocks
    by_tile = {}
    for cta, pieces in plan.items():
        for tile, lo, hi, split, boundary in pieces:
            by_tile.setdefault(tile, []).append((cta, lo, hi, split, boundary))
    boundaries = set()
    for tile, pieces in by_tile.items():
        if len(pieces) == 1:
            assert pieces[0][1:] == (0, blocks, -1, -1), (tile, pieces)
            continue
        assert len(pieces) == 2, f"tile {tile} cut in {len(pieces)} pieces"
        (c0, lo0, hi0, s0, b0), (c1, lo1, hi1, s1, b1) = sorted(pieces)
        assert (c1, lo0, hi0, hi1) == (c0 + 1, 0, lo1, blocks) and (s0, s1) == (0, 1) and b0 == b1 == c0
        assert b0 not in boundaries and 0 <= b0 < ctas
        boundaries.add(b0)


def test_the_tail_ends_the_launch_sooner_at_the_issue_s_shapes():
    """2048 tiles (D128 or D256, 16k tokens a batch, H 16) on 132 SMs: 16 rounds of whole tiles, the last half
    empty; split, 14 rounds and 1 + 68/132 tiles' blocks a CTA."""
    plan = tail_split_pieces(2048, 132, 32)
    share = max(sum(hi - lo for _, lo, hi, _, _ in pieces) for pieces in plan.values())
    assert whole_rounds(2048, 132, plan) == 14 and share == -(-200 * 32 // 132) == 49
    assert (14 * 32 + share) / (16 * 32) < 0.975  # the longest CTA: 2.9% less work than 16 whole rounds


@pytest.mark.parametrize("layout,causal,splits", [("dense", False, True), ("dense", True, False),
                                                  ("ragged", False, False), ("paged16", True, False)])
def test_only_dense_non_causal_d128_and_d256_variants_split_their_tail(layout, causal, splits):
    """D64's kernels keep their rounds whole (TAIL_SPLIT_HEAD_DIMS: split, they took more SM cycles)."""
    for head_dim, block_n in ((64, 128), (128, 128), (128, 176), (256, 80)):
        v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout=layout, causal=causal,
                         block_n=block_n)
        want = splits and head_dim in TAIL_SPLIT_HEAD_DIMS
        assert tail_splits(v) is want and TAIL_SPLIT_HEAD_DIMS == (128, 256)
        assert get_family("sdpa_prefill_sm90").launch(v).extra["tail_splits"] is want


class FakeRuntime(OneTile):
    def __init__(self, causal: bool):
        self.causal = causal
        self.tile_counters = stream_counters()
        self.split_workspaces = split_arena()

    def device(self):
        return 0

    def find(self, family, device, candidates):
        v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout="dense",
                         causal=self.causal, block_n=128)
        facts = get_family("sdpa_prefill_sm90").launch(v)
        return SimpleNamespace(variant=v, artifact=SimpleNamespace(launch=facts, abi=SimpleNamespace(params=PARAMS)))


@pytest.fixture
def launches(monkeypatch):
    launched = record_launches(monkeypatch)
    monkeypatch.setattr(P, "DescriptorSlot", RecordingSlot)
    monkeypatch.setattr(P, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(P, "check_prefill", lambda runtime, device, t, *rest: P.PrefillShape(
        t["q"].shape[0], t["q"].shape[1], t["k"].shape[1], t["q"].shape[2], t["k"].shape[2], t["q"].shape[3]))
    return launched


def bshd(base, B, S, H, D=128):
    return tensor(base, (B, S, H, D), packed_strides((B, S, H, D)), "bf16")


@pytest.mark.parametrize("causal", [False, True])
def test_a_dense_non_causal_launch_gets_its_stream_s_split_workspace(launches, causal):
    """The split tail's workspace: the launch stream's buffer of the runtime's split arena, sized for the grid's CTAs
    (split_workspace_bytes), and kv_splits_max 2 (the kernel splits only with it); another stream's launch gets that
    stream's buffer. A causal kernel (no split tail) gets none."""
    q, k, v, o = (bshd(1 << 32 + i, 4, 4096, 16) for i in range(4))
    plan = P.PrefillPlan(FakeRuntime(causal), q, k, v, o, causal=causal)
    plan(q, k, v, o)
    plan(q, k, v, o, stream=0x1000)
    first, side = launches
    assert first["grid"] == (132, 1, 1)
    if causal:
        assert (first["split_partials"], first["split_counters"], first["kv_splits_max"]) == (0, 0, 0)
        return
    partials, counters = split_workspace_bytes(132, 128, 128)
    assert counters == 132 * 2 * 4  # a counter a (boundary, consumer warpgroup)
    assert (first["split_partials"], first["split_counters"], first["kv_splits_max"]) == (SPLITS, SPLITS + partials, 2)
    assert side["stream"] == 0x1000 and side["split_partials"] == SPLITS + (0x1000 << 24)
    assert side["split_counters"] == side["split_partials"] + partials
