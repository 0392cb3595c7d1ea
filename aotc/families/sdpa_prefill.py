"""sdpa_prefill: portable flash-attention forward (warp-level mma.sync + cp.async; sm_80 to sm_120).

Tensors (element strides, head-dim stride 1):
  dense:  Q [B, S_q, H_q, D], K and V [B, S_kv, H_kv, D], O [B, S_q, H_q, D]; strides (b, s, h) per tensor
  ragged: Q [total_q, H_q, D], K/V [total_kv, H_kv, D], O [total_q, H_q, D]; sequence b spans
          tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1] (int32, on the device); batch strides unused
  LSE fp32 [B, H_q, S_q] (ragged: [H_q, total_q]) natural log, written when write_lse != 0

Causal masking is aligned bottom-right: query i of a sequence with S_q queries and
S_kv keys sees keys j <= i + (S_kv - S_q). A query row that sees no key (possible when
S_q > S_kv) gets O = 0 and LSE = -inf. GQA/MQA: query head h reads KV head h // (H_q / H_kv).

Every variant shares one parameter list. The "packed" stride specialization promises
dense Q/K/V/O contiguous [B, S, H, D] (strides S*H*D, H*D, D) and LSE contiguous, and
ignores the stride parameters (32-bit offsets within a batch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.abi import LaunchFacts, Param, ptr, scalars
from ..common.variant import Variant
from . import Family, Field, register
from .features import FEATURE_FIELDS, FEATURE_PARAMS, chain, why_invalid_features


@dataclass(frozen=True)
class Tile:
    """A CTA of 32 * warps threads computes block_m query rows, walking kv blocks of block_n keys."""

    block_m: int
    block_n: int
    warps: int

    @property
    def threads(self) -> int:
        return 32 * self.warps


# the tile each head dim runs (tuners build others: aotc.build.compile.compile_variant(tile=...))
TILES = {64: Tile(128, 64, 4), 128: Tile(128, 32, 4), 256: Tile(64, 64, 4)}

# Q/K/V/O 16-byte aligned (128-bit cp.async and stores); LSE and cu_seqlens 4
PARAMS: tuple[Param, ...] = (
    ptr("q", 16), ptr("k", 16), ptr("v", 16), ptr("o", 16), ptr("lse", 4),
    ptr("cu_seqlens_q", 4), ptr("cu_seqlens_kv", 4),
    *scalars("i32", "batch", "seqlen_q", "seqlen_kv", "heads_q", "heads_kv", "write_lse"),
    Param("softmax_scale", "f32"),
    *scalars("i64", "q_stride_b", "q_stride_s", "q_stride_h", "k_stride_b", "k_stride_s", "k_stride_h",
             "v_stride_b", "v_stride_s", "v_stride_h", "o_stride_b", "o_stride_s", "o_stride_h",
             "lse_stride_b", "lse_stride_h", "lse_stride_s"),
    *FEATURE_PARAMS,
)

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")

# the fields every prefill family has (sdpa_prefill_sm90 shares them)
ATTENTION_FIELDS = (
    Field("dtype", ("fp16", "bf16"), "dtype of Q, K, V and O"),
    Field("head_dim", (64, 128, 256), "head dimension D"),
    Field("layout", ("dense", "ragged"), "dense [B,S,H,D] with Int64 strides, or ragged THD with cu_seqlens"),
    Field("causal", (False, True), "bottom-right aligned causal mask"),
)


def _why_invalid(values: dict) -> str | None:
    if values["layout"] == "ragged" and values["strides"] == "packed":
        return "the packed specialization is for dense layouts (ragged offsets come from cu_seqlens)"
    return None


def smem_bytes(head_dim: int, tile: Tile) -> int:
    """Dynamic shared memory of one CTA: a Q tile, a K tile and a V tile of 2-byte elements."""
    return (tile.block_m * head_dim + 2 * tile.block_n * head_dim) * 2


def launch_facts(variant: Variant, tile: Tile | None = None) -> LaunchFacts:
    tile = tile or TILES[variant["head_dim"]]
    return LaunchFacts(
        block=(tile.threads, 1, 1),
        dynamic_smem=smem_bytes(variant["head_dim"], tile),
        grid_rule="grid = (ceil(max_seqlen_q / block_m), heads_q, batch)",
        extra={"block_m": tile.block_m, "block_n": tile.block_n},
    )


FAMILY = register(Family(
    name="sdpa_prefill",
    doc="flash-attention forward with mma.sync: dense or ragged, causal, GQA, optional LSE",
    archs=ARCHS,
    fields=ATTENTION_FIELDS + (
        Field("strides", ("general", "packed"), "general Int64 strides, or packed contiguous BSHD (dense only)"),
    ) + FEATURE_FIELDS,
    why_invalid=chain(_why_invalid, why_invalid_features),
    params=lambda v: PARAMS,
    launch=launch_facts,
    kernel_module="aotc.kernels.sdpa_prefill",
))
