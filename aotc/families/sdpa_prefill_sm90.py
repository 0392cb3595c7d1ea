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
"""
from __future__ import annotations

from ..common.abi import LaunchFacts, Param
from ..common.variant import Variant
from . import Family, Field, register
from .sdpa_prefill import ATTENTION_FIELDS

# (head dim, block_n) -> (block_m, kv stages, ping-pong): per CTA, block_m / 64 consumer warpgroups of
# 64 query rows each (2 or 3) and one producer warpgroup; block_n keys per kv block. Chosen by
# measurement on the H200 (benchmarks/tuners/tune_prefill_sm90.py, bench_prefill.py --baseline-bundle):
# D64 runs best at block_n 128, D256 at 80; the ping-pong of the consumers' GEMM issue pays for D64 and
# D256. D64 has three consumer warpgroups (block_m 192): its softmax is a larger share of the work, and
# with two, ncu found the schedulers without an eligible warp 56% of the time.
# D128 has two tiles, one variant each (field block_n), and the runtime picks by the kv length
# (aotc.runtime.prefill.LONG_KV): 176 with ping-pong, FA3's tile, is 2-3% faster from S_kv 8192 on
# (tensor pipe 81% busy under ncu at 16k against 75%; session 9,
# benchmarks/results/prefill_experiment_d128_block_n_176.json), but at S_kv 512 up to a quarter slower
# than 128 (its kv loop is 3 blocks long, the last one a partial; and O is staged in Q's tile, as it
# has no room of its own, so the next tile's Q waits for the epilogue). 192 measured the same as 176.
TILES = {
    (64, 128): (192, 2, True),
    (128, 128): (128, 2, False),
    (128, 176): (128, 2, True),
    (256, 80): (128, 2, True),
}
BLOCK_N = tuple(sorted({bn for _, bn in TILES}))
TMA_BOX_COLS = 64  # head-dim elements per TMA box: 128 bytes, the 128-byte swizzle span
Q_BOX_ROWS = 64    # one Q box per consumer warpgroup
WARPGROUP = 128
# registers per thread of the producer and of each consumer after setmaxnreg, by consumer warpgroups:
# within the 64K registers of the SM (one CTA per SM)
REGISTERS = {2: (24, 240), 3: (32, 160)}


def tile(head_dim: int, block_n: int) -> tuple[int, int, int, bool]:
    """(block_m, block_n, kv stages, ping-pong) of a variant's head dim and block_n."""
    bm, stages, pingpong = TILES[head_dim, block_n]
    return bm, block_n, stages, pingpong


def consumer_warpgroups(head_dim: int, block_n: int) -> int:
    return tile(head_dim, block_n)[0] // Q_BOX_ROWS


def threads(head_dim: int, block_n: int) -> int:
    """Threads per CTA: the producer warpgroup and the consumer warpgroups."""
    return WARPGROUP * (1 + consumer_warpgroups(head_dim, block_n))


PARAMS: tuple[Param, ...] = (
    Param("tma_q", "tensormap"), Param("tma_k", "tensormap"), Param("tma_v", "tensormap"),
    Param("o", "ptr"), Param("lse", "ptr"), Param("cu_seqlens_q", "ptr"), Param("cu_seqlens_kv", "ptr"),
    Param("batch", "i32"), Param("seqlen_q", "i32"), Param("seqlen_kv", "i32"),
    Param("heads_q", "i32"), Param("heads_kv", "i32"), Param("write_lse", "i32"),
    Param("softmax_scale", "f32"),
    Param("o_stride_b", "i64"), Param("o_stride_s", "i64"), Param("o_stride_h", "i64"),
    Param("lse_stride_b", "i64"), Param("lse_stride_h", "i64"), Param("lse_stride_s", "i64"),
)

ARCHS = ("sm_90a",)


def _why_invalid(values: dict) -> str | None:
    if (values["head_dim"], values["block_n"]) not in TILES:
        tuned = sorted(bn for d, bn in TILES if d == values["head_dim"])
        return f"block_n {values['block_n']} is not a tile of head_dim {values['head_dim']} (tuned: {tuned})"
    return None


def tma_recipe(variant: Variant) -> dict:
    """How the runtime encodes the three descriptors (plain data, recorded in the bundle)."""
    bn = variant["block_n"]
    return {
        "rank": 3 if variant["layout"] == "ragged" else 4,
        "box_cols": TMA_BOX_COLS,
        "box_rows": {"q": Q_BOX_ROWS, "k": bn, "v": bn},
        "swizzle_bytes": 128,
        "l2_promotion_bytes": 256,
        "oob_fill": "zero",
    }


def _launch(variant: Variant) -> LaunchFacts:
    bm, bn, stages, pingpong = tile(variant["head_dim"], variant["block_n"])
    return LaunchFacts(
        block=(threads(variant["head_dim"], bn), 1, 1),
        dynamic_smem=-1,  # filled in by the compiler from the kernel's shared storage
        grid_rule="persistent: grid = (min(ceil(max_seqlen_q / block_m) * heads_q * batch, SMs), 1, 1)",
        extra={"block_m": bm, "block_n": bn, "stages": stages, "pingpong": pingpong, "persistent": True,
               "tma": tma_recipe(variant)},
    )


FAMILY = register(Family(
    name="sdpa_prefill_sm90",
    doc="Hopper flash-attention forward: TMA + wgmma, producer/consumer warpgroups; dense or ragged, causal, GQA, LSE",
    archs=ARCHS,
    fields=ATTENTION_FIELDS + (
        Field("block_n", BLOCK_N, "keys per kv block (the tile table pairs each head dim with its tuned widths)"),
    ),
    why_invalid=_why_invalid,
    params=lambda v: PARAMS,
    launch=_launch,
    kernel_module="aotc.kernels.sdpa_prefill_sm90",
))
