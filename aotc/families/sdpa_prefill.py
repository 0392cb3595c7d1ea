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

from ..common.abi import LaunchFacts, Param
from ..common.variant import Variant
from . import Family, Field, register

# (block_m, block_n, warps) per head dim: the tile shapes the kernel uses.
TILES = {64: (128, 64, 4), 128: (128, 32, 4), 256: (64, 64, 4)}

PARAMS: tuple[Param, ...] = (
    Param("q", "ptr"), Param("k", "ptr"), Param("v", "ptr"), Param("o", "ptr"), Param("lse", "ptr"),
    Param("cu_seqlens_q", "ptr"), Param("cu_seqlens_kv", "ptr"),
    Param("batch", "i32"), Param("seqlen_q", "i32"), Param("seqlen_kv", "i32"),
    Param("heads_q", "i32"), Param("heads_kv", "i32"), Param("write_lse", "i32"),
    Param("softmax_scale", "f32"),
    Param("q_stride_b", "i64"), Param("q_stride_s", "i64"), Param("q_stride_h", "i64"),
    Param("k_stride_b", "i64"), Param("k_stride_s", "i64"), Param("k_stride_h", "i64"),
    Param("v_stride_b", "i64"), Param("v_stride_s", "i64"), Param("v_stride_h", "i64"),
    Param("o_stride_b", "i64"), Param("o_stride_s", "i64"), Param("o_stride_h", "i64"),
    Param("lse_stride_b", "i64"), Param("lse_stride_h", "i64"), Param("lse_stride_s", "i64"),
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


def _launch(variant: Variant) -> LaunchFacts:
    bm, bn, warps = TILES[variant["head_dim"]]
    return LaunchFacts(
        block=(32 * warps, 1, 1),
        dynamic_smem=-1,  # filled in by the compiler from the kernel's shared storage (see kernels)
        grid_rule="grid = (ceil(max_seqlen_q / block_m), heads_q, batch)",
        extra={"block_m": bm, "block_n": bn},
    )


FAMILY = register(Family(
    name="sdpa_prefill",
    doc="flash-attention forward with mma.sync: dense or ragged, causal, GQA, optional LSE",
    archs=ARCHS,
    fields=ATTENTION_FIELDS + (
        Field("strides", ("general", "packed"), "general Int64 strides, or packed contiguous BSHD (dense only)"),
    ),
    why_invalid=_why_invalid,
    params=lambda v: PARAMS,
    launch=_launch,
    kernel_module="aotc.kernels.sdpa_prefill",
))
