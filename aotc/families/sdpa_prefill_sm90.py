"""sdpa_prefill_sm90: Hopper flash-attention forward (TMA + wgmma, warp-specialized; sm_90a only).

Same feature surface as sdpa_prefill (see aotc.families.sdpa_prefill for the tensor shapes,
the bottom-right causal convention, GQA and the LSE layout); the same runtime API dispatches
to this family on sm_90 devices when the bundle holds a matching variant.

Q, K and V reach the kernel as TMA descriptors (``GridConstant[TensorMap]``, 128 bytes each),
encoded by the runtime with cuTensorMapEncodeTiled from the recipe below and the caller's
pointers and strides:

  dense:  rank 4, dims (D, S, H, B), byte strides (s, h, b) * 2
  ragged: rank 3, dims (D, total_tokens, H), byte strides (s, h) * 2
  box (64, rows, 1[, 1]): 64 head-dim elements (128 bytes, the 128-byte swizzle span) by
  `rows` tokens (64 for Q: one box per consumer warpgroup; block_n for K and V); 128-byte
  swizzle, no interleave, L2 promotion 256 B, out-of-bounds elements read as zero.

O and LSE are written with plain stores through their pointers and Int64 strides.

Ragged sequences share one descriptor over all tokens, so the K/V rows of a tile past a
sequence's end are the next sequence's tokens (zero only past the last token): they are
masked out of the scores, and their P is 0, so finite data cannot leak; NaN or Inf in the
padding tokens of *another* sequence would (0 * Inf), where the portable family zero-fills.

Paged (layout pagedP, the serving entry point Runtime.attention): Q/O ragged [total_q, H_q, D] with
cu_seqlens_q (any query count per sequence, 0 included); K/V in pools of pages of P tokens,
NHD [pages, P, H_kv, D] or HND [pages, H_kv, P, D]; sequence b's token t lives in page
page_table[b, t // P] at slot t % P; seqlens_kv[b] = its full KV length (the new tokens included),
so causal is bottom-right per sequence. One TMA box is kv_box_rows(P, block_n) = gcd(P, block_n)
rows inside one page, a kv block block_n / that many boxes. The tiles of ROW_GROUP_TILES over
16-bit pools: K and V descriptors are rank 5 over the pool's groups of 8 rows, dims
(64, 8, D / 64, groups, H_kv) with byte strides (token, 128, 8 tokens, head), page p's first group
at p * kv_groups_per_page (its page stride over 8 token strides), a box every column of its rows;
where the page stride is no multiple of 8 token strides, dims (64, P, D / 64, H_kv, pages) and a box
an 8-row group. Other tiles: rank 4, dims (D, P, H_kv, pages) with byte strides (token, head, page),
a box 64 columns of its rows (fp8: whole e4m3 rows). A box of tokens past the sequence's end is
loaded from out of the pool (page -1: zeros); a page id the caller put out of [0, pages) reads zeros
too, never another allocation. The rows past seqlens_kv inside a
sequence's last page are masked out of the scores, and the kernel zeroes them in shared memory
before the PV GEMM, so whatever the pool holds there (NaN or Inf included) cannot leak.

Tiles of a paged call are enumerated from the device-side lengths (tile_scheduler.RaggedTiles): per
KV head, ceil(ceil(s_q / tile_tokens) / 2) work items of a sequence of at least min_seqlen_q
queries (a pair of tiles each: GQA-packed rows, each 64-row warpgroup slab the group query heads of
64 // group tokens, any group 1..64; the last tile with the first), so the persistent grid
walks only real tiles whatever the mix of decode rows and long chunks, and a CUDA graph replayed with
other lengths stays balanced. Ragged (unpaged) calls enumerate theirs the same way, per query head
(rows unpacked): a batch of one long sequence among short ones walks no empty tiles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..common.abi import LaunchFacts, Param, ptr, scalars
from ..common.variant import Variant
from . import Family, Field, register
from .features import FEATURE_FIELDS, FEATURE_PARAMS, chain, why_invalid_features
from .kv_dtype import FP8, KV_DTYPE_FIELD, kv_fp8, kv_scale_params, why_invalid_kv_dtype, why_not_paged_fp8
from .sdpa_prefill import ATTENTION_FIELDS, LAYOUTS, PAGE_SIZES, page_size  # noqa: F401 (re-exported)

TMA_BOX_COLS = 64  # head-dim elements per TMA box: 128 bytes, the 128-byte swizzle span
Q_BOX_ROWS = 64    # one Q box per consumer warpgroup
WARPGROUP = 128
REGISTER_FILE = 65536     # 32-bit registers of an SM
REGISTER_GRANULE = 8      # ptxas gives a thread a multiple of 8 registers


def launch_registers(threads: int) -> int:
    """Registers a thread of a CTA of `threads` threads starts with, one CTA an SM: the register file over the
    threads, rounded down to ptxas's granule (384 threads: 168, 512: 128). The cubin's REGCOUNT says what ptxas
    gave (aotc.kernels.compile checks it against the split)."""
    return REGISTER_FILE // threads // REGISTER_GRANULE * REGISTER_GRANULE


def registers_after_setmaxnreg(producer: int, consumer: int, consumer_warpgroups: int) -> int:
    """Registers a CTA's warps hold between them after setmaxnreg: the producer warpgroup's and the consumers'."""
    return WARPGROUP * (producer + consumer_warpgroups * consumer)


def why_registers_do_not_fit(producer: int, consumer: int, consumer_warpgroups: int) -> str | None:
    """Why a setmaxnreg split cannot run, or None. setmaxnreg only moves registers among a CTA's warps: the split
    must fit the registers the CTA was launched with (threads x launch_registers), not the whole register file.
    A split over it compiles, and the consumers' setmaxnreg.inc then waits forever (a hang, not an error): 32 / 240
    at 384 threads needs 65536 of the 64512 the CTA holds."""
    threads = WARPGROUP * (1 + consumer_warpgroups)
    need = registers_after_setmaxnreg(producer, consumer, consumer_warpgroups)
    held = threads * launch_registers(threads)
    if need > held:
        return (f"registers {producer} + {consumer_warpgroups} x {consumer} a thread of {WARPGROUP}-thread "
                f"warpgroups ({need}) exceed the {held} a CTA of {threads} threads is launched with "
                f"({threads} x {launch_registers(threads)}); setmaxnreg.inc would wait forever")
    return None


# registers per thread of the producer and of each consumer after setmaxnreg, by consumer warpgroups:
# each split fills the CTA's launch registers exactly (why_registers_do_not_fit)
REGISTERS = {2: (24, 240), 3: (32, 160)}
# ragged and paged: the producer warp also scans the lengths for its work items and reads page tables.
# The dense split (24 / 240) spills in those producers (per tile only) and measured 3-6% more SM cycles
# than 40 / 232 at D128: its consumer loops grow more than their softmax gains under PV
# (benchmarks/results/prefill_experiment_ragged_registers_24_240.json)
RAGGED_REGISTERS = {2: (40, 232), 3: (32, 160)}
# fp8 KV (D128, two consumer warpgroups): the conversion warps' staging units in flight need more than 40 registers;
# D128's consumers fit 224 without spilling (benchmarks/results/paged_varlen_experiment_fp8_convert.json)
FP8_REGISTERS = (56, 224)
SMEM_LIMIT = 227 * 1024  # per CTA on sm_90
BARRIER_BYTES = 1024     # the mbarriers, padded to the 1024-byte alignment of the tiles
STATIC_SMEM = 1024       # static shared memory the compiled kernel reserves besides the dynamic


@dataclass(frozen=True)
class Tile:
    """block_m query rows per CTA (block_m / 64 consumer warpgroups of 64 rows, and one producer
    warpgroup), kv blocks of block_n keys in a `stages`-deep ring, ping-pong of the consumers' GEMM issue.
    fp8 KV (kv_fp8): the ring's K and V tiles are fp16, converted from e4m3 staging tiles (a second ring of
    stages x block_n x D bytes each, filled by TMA) by the producer warpgroup's other warps."""

    block_m: int
    block_n: int
    stages: int
    pingpong: bool

    @property
    def consumer_warpgroups(self) -> int:
        return self.block_m // Q_BOX_ROWS

    @property
    def threads(self) -> int:
        """Threads per CTA: the producer warpgroup and the consumer warpgroups."""
        return WARPGROUP * (1 + self.consumer_warpgroups)

    def staging_bytes(self, head_dim: int, kv_fp8: bool) -> int:
        """fp8 KV: the e4m3 staging rings of K and V (stages x block_n x D bytes each); 0 otherwise."""
        return 2 * self.stages * self.block_n * head_dim if kv_fp8 else 0

    def separate_o(self, head_dim: int, kv_fp8: bool = False) -> bool:
        """Whether an O staging tile fits beside Q and the K/V ring (else O is staged in Q's tile,
        and the next tile's Q waits for the epilogue)."""
        return (BARRIER_BYTES + (2 * self.block_m * head_dim + 2 * self.stages * self.block_n * head_dim) * 2
                + self.staging_bytes(head_dim, kv_fp8) <= SMEM_LIMIT - STATIC_SMEM)

    def smem_bytes(self, head_dim: int, kv_fp8: bool = False) -> int:
        """Q (block_m x D) [+ O staging] + K and V rings (stages x block_n x D) of 2-byte elements [+ the e4m3
        staging rings] + mbarriers."""
        tiles = (self.block_m * head_dim * (2 if self.separate_o(head_dim, kv_fp8) else 1)
                 + 2 * self.stages * self.block_n * head_dim)
        return BARRIER_BYTES + tiles * 2 + self.staging_bytes(head_dim, kv_fp8)



# (head dim, block_n) -> tile. Chosen by measurement on the H200 (benchmarks/tuners/tune_prefill_sm90.py,
# bench_prefill.py --baseline-bundle): D64 runs best at block_n 128, D256 at 80; the ping-pong of the
# consumers' GEMM issue pays for D64 and D256. D64 has three consumer warpgroups (block_m 192): its
# softmax is a larger share of the work, and with two, ncu found the schedulers without an eligible
# warp 56% of the time. D128 has two tiles, one variant each (field block_n), and the runtime picks by
# the kv length (PICKED_FROM_SEQLEN_KV): 176 with ping-pong, FA3's tile, is 2-3% faster from
# S_kv 8192 on (tensor pipe 81% busy under ncu at 16k against 75%), but at S_kv 512 up to a quarter
# slower than 128 (its kv loop is 3 blocks long, the last one a partial; and O is staged in Q's tile,
# as it has no room of its own, so the next tile's Q waits for the epilogue); 192 measured the same as
# 176 (benchmarks/results/prefill_experiment_d128_block_n_176.json).
# FA3 runs its non-causal D128 and D256 tiles in clusters of two CTAs sharing K/V loads (TMA multicast). Built here
# (benchmarks/experiments/kv_multicast.patch), it took 1.0-1.5% more SM cycles under ncu than the same kernel without
# it (6-7.5% in a first version whose branch in the consumers' release serialized the softmax after the PV GEMM;
# benchmarks/results/prefill_experiment_kv_multicast.json).
TILES = {
    (64, 128): Tile(192, 128, 2, True),
    (128, 128): Tile(128, 128, 2, False),
    (128, 176): Tile(128, 176, 2, True),
    (256, 80): Tile(128, 80, 2, True),
}
BLOCK_N = tuple(sorted({bn for _, bn in TILES}))
# (head dim, block_n) -> {"dense" (and ragged) | "paged": the kv length (max_seqlen_kv) from which the runtime runs
# this tile rather than its head dim's narrower ones}, recorded in each variant's launch facts
# (launch.extra["picked_from_seqlen_kv"]; a head dim's narrowest tile records 0) and read by dispatch
# (aotc.runtime.prefill.hopper_candidates), so a bundle carries the choice its tiles were measured for.
# D128-176 dense and ragged from 8192: 1.02-1.03x the 128 tile (geomean of three same-process runs) at
# S_kv 8192-16384, 0.74-0.94x at 512 (benchmarks/results/prefill_experiment_d128_block_n_176.json). At 4096 no
# threshold of its own: dense non-causal 0.97-1.04x (median 1.01 over 18 same-process ratios on an H100, A/A
# 0.97-1.02), causal 0.92-0.99x (benchmarks/results/prefill_experiment_d128_176_non_causal_4096.json).
# Paged from 4096: at page 16, 1.02-1.06x the 128 tile from 4096 keys (chunks of 512 and 2048 queries, a mixed
# step) and 1.00x at 2048 (benchmarks/results/paged_varlen_experiment_tile_threshold.json); pages of 32-128 load
# it in the same 16-row boxes as page 16 (kv_box_rows).
PICKED_FROM_SEQLEN_KV = {(128, 176): {"dense": 8192, "paged": 4096}}


def picked_from_seqlen_kv(variant: Variant, block_n: int) -> int:
    """The launch fact picked_from_seqlen_kv of a variant at kv tile block_n (PICKED_FROM_SEQLEN_KV; 0: picked at
    any length where no wider tile is)."""
    kind = "paged" if page_size(variant) > 0 else "dense"
    return PICKED_FROM_SEQLEN_KV.get((variant["head_dim"], block_n), {}).get(kind, 0)


def kv_box_rows(page: int, block_n: int) -> int:
    """Rows of one K/V TMA box of a paged kernel: the largest that tiles a kv block and lies inside one page
    wherever a block starts, gcd(page, block_n): a whole page (block_n a multiple of the page), the block (the
    page a multiple of block_n), or 16 rows inside a page where neither divides the other (D256's 80 keys, D128's
    176, over pages of 32-128). Every page size of LAYOUTS serves every kv tile."""
    return math.gcd(page, block_n)


# 16-bit paged tiles whose K/V rings hold each 8-row group's 64-column chunks side by side, a box of whole rows loaded
# at a time along the pool's groups of 8 rows (tma_recipe's kv_view "row_groups", the kernel's grouped_kv), where it
# measured faster: D128-176 over 16-token pages, 22 TMA copies a kv block (K and V) against 44, 1.6-3.1% fewer SM
# cycles at S_kv 4096-16384 (H100). D128-128 took 0.5-0.9% more at S_kv 2048 and D256-80 1.0% more (its tensor pipe
# 92% busy); D64's rows are one chunk (nothing to merge): they keep the chunk-major ring
# (benchmarks/results/paged_varlen_experiment_row_groups.json).
ROW_GROUP_TILES = frozenset({(128, 176)})


def row_group_kv(variant: Variant, block_n: int) -> bool:
    """Whether a variant at kv tile block_n loads K/V along the pool's row groups (ROW_GROUP_TILES)."""
    return page_size(variant) > 0 and not kv_fp8(variant) and (variant["head_dim"], block_n) in ROW_GROUP_TILES


def tile(head_dim: int, block_n: int, fp8: bool = False) -> Tile:
    """The tile of a (head dim, block_n) variant; fp8 KV: FP8_TILES's."""
    return FP8_TILES[head_dim, block_n] if fp8 else TILES[head_dim, block_n]


# Q/K/V as TMA descriptors (their tensors 16-byte aligned), O 16 (128-bit stores), LSE, cu_seqlens, the
# page table and seqlens_kv 4 (the last two are read by paged variants only: 0 for the others); the fp8 KV
# scales last (read by kv_dtype fp8_e4m3 variants only: 0 for the others)
PARAMS: tuple[Param, ...] = (
    Param("tma_q", "tensormap", 16), Param("tma_k", "tensormap", 16), Param("tma_v", "tensormap", 16),
    ptr("o", 16), ptr("lse", 4), ptr("cu_seqlens_q", 4), ptr("cu_seqlens_kv", 4),
    ptr("page_table", 4), ptr("seqlens_kv", 4),
    *scalars("i32", "batch", "seqlen_q", "seqlen_kv", "heads_q", "heads_kv", "write_lse", "max_pages", "min_seqlen_q"),
    Param("softmax_scale", "f32"),
    *scalars("i64", "o_stride_b", "o_stride_s", "o_stride_h", "lse_stride_b", "lse_stride_h", "lse_stride_s",
             "pt_stride_b", "pt_stride_p"),
    *FEATURE_PARAMS,
    *kv_scale_params("descale"),
    # dense causal D128/D256 variants (draws_tiles()): an int32 that is 0 at launch, drawn from and left 0
    # (aotc.kernels.tile_scheduler.PersistentTiles.drawn_plan; the runtime's per-stream counters,
    # aotc.runtime.counters); 0 for the other variants
    ptr("tile_counter", 4),
    # the paged variants of ROW_GROUP_TILES (tma_recipe's kv_view "row_groups"): the pool's page stride in strides
    # of 8 rows, the row-group coordinate of a page's first 8 rows (0: no whole number of them, one copy an 8-row
    # group from its page); 0 for the other variants
    Param("kv_groups_per_page", "i32"),
    # the paged variants' KV splits (kv_splits): a tile's kv blocks shared by up to kv_splits_max CTAs, their fp32
    # partials in split_partials and arrivals counted in split_counters (int32, 0 at launch and left 0), of
    # split_workspace_bytes(); the dense non-causal variants' split tail (tail_splits) the same, kv_splits_max 2;
    # 0 for the other variants (and kv_splits_max 0 or 1: no split)
    ptr("split_partials", 16), ptr("split_counters", 4), Param("kv_splits_max", "i32"),
)

# Paged KV splits. A step of few new tokens over long contexts (a prefix-cache hit's short suffix, a chunked
# prefill's last chunk) has fewer GQA-packed tiles than SMs, each a whole context long: 128 tokens of Llama 3 8B
# make 32 tiles for 132 SMs. The kernel then splits each tile's kv blocks over S CTAs, S = the CTAs over the tiles
# (one wave), at most kv_splits_max and at most a tile's blocks over MIN_SPLIT_BLOCKS; each split writes its
# normalized O and LSE (fp32) to the workspace and the last of a tile's splits to arrive merges them in the same
# launch (no second kernel), as the decode family's split chunks do.
MAX_KV_SPLITS = 16
MIN_SPLIT_BLOCKS = 8  # the fewest kv blocks a split takes: a split's start and merge cost a few blocks' time


def kv_splits(variant: Variant) -> bool:
    """Whether the variant's kernel splits a launch's tiles (launch fact kv_splits: the runtime gives it a workspace):
    the 16-bit paged kernels. Over fp8 pools not yet: the split loop spilled their conversion warps (56 registers)."""
    return variant["layout"].startswith("paged") and not kv_fp8(variant)


def kv_split_range(n_min, n_max, split, splits):
    """(lo, hi): the kv blocks [lo, hi) of split `split` of `splits` over a tile's blocks [n_min, n_max): split 0
    the highest (the diagonal's masked blocks), every split within one block of the others' length and none
    empty while n_max - n_min >= splits. Plain integer arithmetic: the kernel runs it on its Int32s."""
    n = n_max - n_min
    return n_min + n * (splits - 1 - split) // splits, n_min + n * (splits - split) // splits


def split_workspace_bytes(ctas: int, block_m: int, head_dim: int) -> tuple[int, int]:
    """(partials, counters) bytes of the KV splits' workspace of a launch of `ctas` CTAs: a split runs on one CTA,
    and S * tiles <= CTAs, so a slot a CTA: each consumer thread's O fragment (block_m * head_dim fp32 a CTA) and
    its rows' LSEs (two a thread), and an arrival counter per (tile, consumer warpgroup). A split tail (tail_splits)
    uses a slot and a counter per boundary between two CTAs' ranges: fewer than `ctas` of each."""
    warpgroups = block_m // Q_BOX_ROWS
    partials = ctas * (block_m * head_dim + 2 * WARPGROUP * warpgroups) * 4
    return partials, ctas * warpgroups * 4

# The split tail of dense non-causal launches. Their tiles all cost the same, and a launch of T tiles on a persistent
# grid of n CTAs runs ceil(T / n) rounds: at the shapes (2048 D128 or D256 tiles on 132 SMs, 15.5 rounds) the
# last round leaves half the SMs idle (prefill_drawn_tail.json's tail_probe: 3.3% more SM cycles a head at H 16 than
# at H 33, whose tiles fill the rounds). With a split tail the CTAs run ceil(T / n) - 2 whole rounds of tiles, then
# cut the last n + T % n tiles' kv blocks into n equal ranges in tile order, one a CTA (stream-K's partition): a
# range is at least a tile long, so a tile's blocks go to one CTA or two, and each boundary between two CTAs' ranges
# that falls inside a tile splits it in two pieces. The piece that arrives first writes its normalized fp32 O and LSE
# to the boundary's workspace slot; the second merges them with its own before its one store of O
# (aotc.kernels.sdpa_prefill_sm90: pair_arrive). A launch splits when every CTA has a whole round to run (T >= n),
# T % n > 0 and a tile has at least TAIL_SPLIT_MIN_BLOCKS kv blocks: a piece's Q load, partial and merge cost about a
# block's time. Measured under ncu at base clocks (SM cycles, bf16, H 16; benchmarks/results/prefill_split_tail.json):
# D128 1.5-2.2% fewer at S 4096-16384, D256 1.3-3.1% at S 2048-16384, SMs active 98.5-99.8% of the launch against
# 95.3-96.5%, and the same cycles (0.1%) at H 33, whose launches do not split. D64 took 1.3% more at S 4096 (its
# tensor pipe 56% busy against 59%: its kernel's loops as ptxas scheduled them with the tail's copy), so D64 keeps
# its rounds whole (TAIL_SPLIT_HEAD_DIMS).
TAIL_SPLIT_MIN_BLOCKS = 8
TAIL_SPLIT_HEAD_DIMS = (128, 256)


def tail_splits(variant: Variant) -> bool:
    """Whether the variant's kernel splits its launch's tail (launch fact tail_splits: the runtime gives it a split
    workspace and kv_splits_max 2): the dense non-causal kernels of TAIL_SPLIT_HEAD_DIMS."""
    return (variant["layout"] == "dense" and not variant["causal"]
            and int(variant["head_dim"]) in TAIL_SPLIT_HEAD_DIMS)


def tail_split_pieces(tiles: int, ctas: int, kv_blocks: int) -> dict[int, list[tuple[int, int, int, int, int]]]:
    """The split tail's plan in plain Python, as the kernel computes it (PersistentTiles.tail_plan, tail_piece):
    {CTA: [(tile, lo, hi, split, boundary)]} of the pieces after the whole rounds, each tile's kv blocks [lo, hi),
    split 0 or 1 of the boundary's two pieces (-1: a whole tile); {} when the launch does not split. For tests and
    reports."""
    full = tiles // ctas
    if full < 1 or tiles % ctas == 0 or kv_blocks < TAIL_SPLIT_MIN_BLOCKS:
        return {}
    static_rounds = full - 1
    units = (tiles - static_rounds * ctas) * kv_blocks
    plan = {}
    for c in range(ctas):
        u0, u1 = c * units // ctas, (c + 1) * units // ctas
        pieces = []
        for t in range(u0 // kv_blocks, (u1 - 1) // kv_blocks + 1):
            lo, hi = max(u0 - t * kv_blocks, 0), min(u1 - t * kv_blocks, kv_blocks)
            split, boundary = (1, c - 1) if lo > 0 else ((0, c) if hi < kv_blocks else (-1, -1))
            pieces.append((static_rounds * ctas + t, lo, hi, split, boundary))
        plan[c] = pieces
    return plan


ARCHS = ("sm_90a",)
# fp8 KV: (head dim, block_n) -> the tile. The conversion warps of the producer warpgroup need registers the
# D64 tile's three consumer warpgroups leave no room for (32 a thread): D64 over fp8 runs two (block_m 128, the
# FP8_REGISTERS split), its e4m3 rows of 64 bytes 64-byte swizzled; D256's and D128-176's rings leave no shared
# memory for the staging rings (the portable paged kernel serves those). D128 at kv blocks of 128: the default
# spec's fp8 variant, vLLM's bf16 queries over an fp8 cache of page 16.
FP8_TILES = {(128, 128): TILES[128, 128], (64, 128): Tile(128, 128, 2, True)}


def _why_invalid(values: dict) -> str | None:
    if (values["head_dim"], values["block_n"]) not in TILES:
        tuned = sorted(bn for d, bn in TILES if d == values["head_dim"])
        return f"block_n {values['block_n']} is not a tile of head_dim {values['head_dim']} (tuned: {tuned})"
    layout = values["layout"]
    reason = why_invalid_kv_dtype(values)
    if reason is None and values.get("kv_dtype") == FP8:
        if (not_paged := why_not_paged_fp8(layout)) is not None:
            return not_paged
        if (values["head_dim"], values["block_n"]) not in FP8_TILES:
            return (f"kv_dtype {FP8}: no tile of head_dim {values['head_dim']} and block_n {values['block_n']} has room "
                    f"for the e4m3 staging rings and their conversion warps (served: {list(FP8_TILES)}; the portable "
                    f"paged kernel, sdpa_prefill, takes the others)")
    return reason


def tma_recipe(variant: Variant, block_n: int) -> dict:
    """How the runtime encodes the three descriptors (plain data, recorded in the bundle). fp8 KV: K and V boxes
    are whole e4m3 rows (D bytes), swizzled over a row's bytes (128, or 64 at D64), into the staging rings
    (kv_box_cols, kv_swizzle_bytes; a record without them: box_cols and swizzle_bytes, as Q's)."""
    page = page_size(variant)
    kv_rows = kv_box_rows(page, block_n) if page else block_n
    fp8 = ({"kv_box_cols": variant["head_dim"], "kv_swizzle_bytes": min(128, variant["head_dim"])}
           if kv_fp8(variant) else {})
    # ROW_GROUP_TILES: K/V rank 5 over the pool's 8-row groups, (64 columns, 8 rows, D / 64 chunks, row groups, H_kv),
    # a box kv_rows whole rows (box_rows / 8 groups), or where the page stride is no multiple of 8 rows' (the
    # kernel's kv_groups_per_page 0), (64 columns, P rows, chunks, H_kv, pages) and boxes of 8 rows
    grouped = {"kv_view": "row_groups"} if row_group_kv(variant, block_n) else {}
    return {
        # paged: Q ragged (rank 3), K/V rank 4 over the pool (D, P, H_kv, pages), or 5 (kv_view row_groups)
        "rank": 3 if variant["layout"] != "dense" else 4,
        "kv_rank": (5 if grouped else 4) if variant["layout"] != "ragged" else 3,
        **grouped,
        "box_cols": TMA_BOX_COLS,
        "box_rows": {"q": Q_BOX_ROWS, "k": kv_rows, "v": kv_rows},
        "swizzle_bytes": 128,
        **fp8,
        "l2_promotion_bytes": 256,
        "oob_fill": "zero",
    }


# head dims whose dense causal kernels draw the tiles of their last rounds from a per-stream counter
# (aotc.kernels.tile_scheduler.PersistentTiles.drawn_plan): D128 and D256, whose tile pairs fill the grid. D64's
# kernels, which take pairs only with many heads, measured 2-3% more SM cycles drawing at S 8192-16384
# (benchmarks/results/prefill_drawn_tail.json).
DRAWN_TAIL_HEAD_DIMS = (128, 256)


def draws_tiles(variant: Variant) -> bool:
    """Whether the variant's kernel takes the tile_counter parameter's counter (the runtime passes its stream's):
    every ragged and paged kernel (they draw every tile after their first: aotc.kernels.tile_scheduler.RaggedTiles),
    and the dense causal D128 and D256 ones (their tail)."""
    if variant["layout"] != "dense":
        return True
    return bool(variant["causal"]) and int(variant["head_dim"]) in DRAWN_TAIL_HEAD_DIMS


# head dims whose 16-bit paged kernels draw a CTA's next work item before issuing its tile's last K block, the atomic's
# round trip hidden behind the wait for that block's ring slot (the kernel's produce_paged_item): D128, whose 128-key
# tile over a chunk's short causal tiles took 1.1% fewer SM cycles so (S 2048, A/A 1.000). D64 and D256 keep the draw
# after the tile's loads: the change rescheduled ptxas's D256 kv loops (583 -> 608 instructions; the same loop cost
# 0.7% more SM cycles in fe251c0) for no measured gain (benchmarks/results/paged_varlen_experiment_draw_early.json).
EARLY_DRAW_HEAD_DIMS = (128,)


def draws_early(variant: Variant) -> bool:
    """Whether the variant's paged producer draws its next work item before its tile's last K block."""
    return kv_splits(variant) and int(variant["head_dim"]) in EARLY_DRAW_HEAD_DIMS


def launch_facts(variant: Variant, t: Tile | None = None) -> LaunchFacts:
    t = t or tile(variant["head_dim"], variant["block_n"], kv_fp8(variant))
    return LaunchFacts(
        block=(t.threads, 1, 1),
        dynamic_smem=t.smem_bytes(variant["head_dim"], kv_fp8(variant)),
        grid_rule=("persistent: grid = (min(ceil(max_seqlen_q / block_m) * heads_q * batch, SMs), 1, 1); ragged and "
                   "paged: the tiles enumerated from the device-side lengths; paged: (SMs, 1, 1)"),
        extra={"block_m": t.block_m, "block_n": t.block_n, "stages": t.stages, "pingpong": t.pingpong,
               "persistent": True, "tma": tma_recipe(variant, t.block_n),
               "draws_tiles": draws_tiles(variant), "kv_splits": kv_splits(variant),
               "tail_splits": tail_splits(variant),
               "picked_from_seqlen_kv": picked_from_seqlen_kv(variant, t.block_n)},
    )


FAMILY = register(Family(
    name="sdpa_prefill_sm90",
    doc=("Hopper flash-attention forward: TMA + wgmma, producer/consumer warpgroups; dense, ragged or ragged "
         "queries over a paged KV cache, causal, GQA, LSE"),
    archs=ARCHS,
    fields=tuple(f if f.name != "layout" else
                 Field("layout", LAYOUTS, f.doc + "; pagedP: ragged Q over paged K/V pools of page size P")
                 for f in ATTENTION_FIELDS) + (
        Field("block_n", BLOCK_N, "keys per kv block (the tile table pairs each head dim with its tuned widths)"),
        KV_DTYPE_FIELD,
    ) + FEATURE_FIELDS,
    why_invalid=chain(_why_invalid, why_invalid_features),
    params=lambda v: PARAMS,
    launch=launch_facts,
    kernel_module="aotc.kernels.sdpa_prefill_sm90",
))
