"""sdpa_prefill: portable flash-attention forward (warp-level mma.sync + cp.async; sm_80 to sm_120).

Tensors (element strides, head-dim stride 1):
  dense:  Q [B, S_q, H_q, D], K and V [B, S_kv, H_kv, D], O [B, S_q, H_q, D]; strides (b, s, h) per tensor
  ragged: Q [total_q, H_q, D], K/V [total_kv, H_kv, D], O [total_q, H_q, D]; sequence b spans
          tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1] (int32, on the device); batch strides unused
  paged:  Q/O ragged as above; K/V in pools of pages of P tokens (layout pagedP, P in 16..128), NHD
          [pages, P, H_kv, D] or HND [pages, H_kv, P, D] as (page, token, head) strides: token t of
          sequence b at page_table[b, t // P] * stride_page + (t % P) * stride_token + kv_head * stride_head;
          seqlens_kv[b] (int32 [B]) = its keys (the new tokens included), cut at the page-table row's end
          (max_pages * P); sequences of fewer than min_seqlen_q queries are skipped (Runtime.attention's
          decode kernel takes them). A page id outside [0, pages) is never dereferenced: its rows read as
          zeros (as the Hopper family's TMA does). Its own parameter list (PAGED_PARAMS).
          fp8 KV (kv_dtype fp8_e4m3, paged layouts, sm_89 and later): e4m3 pools with fp32
          scales k_descale / v_descale [H_kv] (descale_stride_h 1) or [1] (0): attention over k_fp8 *
          k_descale[h], v_fp8 * v_descale[h], as sdpa_decode's (aotc.families.kv_dtype); the kernel converts
          the e4m3 fragments to fp16 in registers and runs its MMAs in fp16 (aotc.kernels.fp8)
  LSE fp32 [B, H_q, S_q] (ragged, paged: [H_q, total_q]) natural log, written when write_lse != 0

Causal masking is aligned bottom-right: query i of a sequence with S_q queries and
S_kv keys sees keys j <= i + (S_kv - S_q). A query row that sees no key (possible when
S_q > S_kv) gets O = 0 and LSE = -inf. GQA/MQA: query head h reads KV head h // (H_q / H_kv).

Every dense and ragged variant shares one parameter list (PARAMS), the paged ones another (PAGED_PARAMS).
The grid is (ceil(max_seqlen_q / block_m), H_q, B), not persistent: for paged calls the runtime takes
max_seqlen_q per call (a bound on the step's query counts), and tiles past a sequence's queries exit at once,
so a CUDA graph captured with a bound replays correctly for any batch whose query counts stay within it; a
paged CTA walks its sequence's query tiles gridDim.x apart, so a longer sequence is still computed whole.
The "packed" stride specialization promises
dense Q/K/V/O contiguous [B, S, H, D] (strides S*H*D, H*D, D) and LSE contiguous, and
ignores the stride parameters (32-bit offsets within a batch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.abi import LaunchFacts, Param, ptr, scalars
from ..common.variant import Variant
from . import Family, Field, register
from .features import FEATURE_FIELDS, FEATURE_PARAMS, chain, why_invalid_features
from .kv_dtype import (FP8, KV_DTYPE_FIELD, e4m3_row_bytes, kv_fp8, kv_scale_params, why_invalid_kv_dtype,
                       why_not_paged_fp8)


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

# paged (layout pagedP): Q/O ragged, K/V gathered through the page table with (page, token, head) strides
# (NHD or HND pools alike), per-sequence KV lengths; `pages` (the pool's page count) bounds the page ids read
PAGED_PARAMS: tuple[Param, ...] = (
    ptr("q", 16), ptr("k", 16), ptr("v", 16), ptr("o", 16), ptr("lse", 4),
    ptr("cu_seqlens_q", 4), ptr("seqlens_kv", 4), ptr("page_table", 4),
    *scalars("i32", "batch", "heads_q", "heads_kv", "write_lse", "pages", "max_pages", "min_seqlen_q"),
    Param("softmax_scale", "f32"),
    *scalars("i64", "q_stride_s", "q_stride_h", "k_stride_page", "k_stride_token", "k_stride_head",
             "v_stride_page", "v_stride_token", "v_stride_head", "o_stride_s", "o_stride_h",
             "lse_stride_h", "lse_stride_s", "pt_stride_b", "pt_stride_p"),
    *FEATURE_PARAMS,
    *kv_scale_params("descale"),  # fp8 KV only (kv_dtype fp8_e4m3; 0 for 16-bit pools)
)

# page sizes of the paged layouts: a multiple of the 16 rows one cp.async pass of a tile copies (a pass never
# crosses a page), powers of two (a token's page and slot are a shift and a mask)
PAGE_SIZES = (16, 32, 64, 128)
LAYOUTS = ("dense", "ragged") + tuple(f"paged{p}" for p in PAGE_SIZES)


def page_size(variant: Variant) -> int:
    """P of a paged layout, 0 for dense and ragged."""
    layout = variant["layout"]
    return int(layout[len("paged"):]) if layout.startswith("paged") else 0


def block_pages(page: int, block_n: int) -> int:
    """Page-table entries a kv block of block_n keys reads: the pages it spans (P < block_n), or the one it
    lies in."""
    return max(1, block_n // page)


def pass_source(row: int, page: int, block_n: int) -> tuple[int, int]:
    """Where the cp.async pass of a K/V tile that starts at tile row `row` (a multiple of the pass's rows,
    which divide P) reads: (j, slot), the block's j-th page-table entry and the pass's first slot in that
    page, counted from the block's first slot in its page (0 unless P > block_n, where the block lies inside
    one page). Plain integers: the kernel's compile-time part of its gather (tests emulate the rest)."""
    if page < block_n:
        return row // page, row % page
    return 0, row


def params(variant: Variant) -> tuple[Param, ...]:
    return PAGED_PARAMS if page_size(variant) else PARAMS


ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")

# the fields every prefill family has (sdpa_prefill_sm90 shares them)
ATTENTION_FIELDS = (
    Field("dtype", ("fp16", "bf16"), "dtype of Q, K, V and O"),
    Field("head_dim", (64, 128, 256), "head dimension D"),
    Field("layout", ("dense", "ragged"), "dense [B,S,H,D] with Int64 strides, or ragged THD with cu_seqlens"),
    Field("causal", (False, True), "bottom-right aligned causal mask"),
)


# fp8 KV (paged layouts): the K and V tiles hold e4m3 rows as 16-bit pairs, D / 2 of them a row, in the
# 64-column swizzle atoms of the 16-bit tiles (aotc.families.kv_dtype.e4m3_row_bytes)
FP8_HEAD_DIMS = (64, 128, 256)


def _why_invalid(values: dict) -> str | None:
    reason = why_invalid_kv_dtype(values)
    if reason is not None:
        return reason
    if values.get("kv_dtype") == FP8:
        if (not_paged := why_not_paged_fp8(values["layout"])) is not None:
            return not_paged
        if values["head_dim"] not in FP8_HEAD_DIMS:
            return f"kv_dtype {FP8} needs head_dim in {list(FP8_HEAD_DIMS)}, not {values['head_dim']}"
    if values["layout"] == "ragged" and values["strides"] == "packed":
        return "the packed specialization is for dense layouts (ragged offsets come from cu_seqlens)"
    if values["layout"].startswith("paged") and values["strides"] == "packed":
        return (f"the packed specialization is for dense layouts ({values['layout']}: K/V rows are gathered "
                f"through the page table with Int64 strides)")
    return None


def smem_bytes(head_dim: int, tile: Tile, kv_fp8: bool = False) -> int:
    """Dynamic shared memory of one CTA: a Q tile of 2-byte elements, a K tile and a V tile of 2-byte
    elements (fp8 KV: rows of e4m3 bytes, kv_dtype.e4m3_row_bytes)."""
    return tile.block_m * head_dim * 2 + 2 * tile.block_n * (e4m3_row_bytes(head_dim) if kv_fp8 else head_dim * 2)


def launch_facts(variant: Variant, tile: Tile | None = None) -> LaunchFacts:
    tile = tile or TILES[variant["head_dim"]]
    return LaunchFacts(
        block=(tile.threads, 1, 1),
        dynamic_smem=smem_bytes(variant["head_dim"], tile, kv_fp8(variant)),
        grid_rule="grid = (ceil(max_seqlen_q / block_m), heads_q, batch)" + (
            "; max_seqlen_q: the call's bound on its query counts (a CTA walks its sequence's query tiles "
            "gridDim.x apart)" if page_size(variant) else ""),
        extra={"block_m": tile.block_m, "block_n": tile.block_n},
    )


FAMILY = register(Family(
    name="sdpa_prefill",
    doc="flash-attention forward with mma.sync: dense, ragged or ragged over a paged KV cache, causal, GQA, optional LSE",
    archs=ARCHS,
    fields=tuple(f if f.name != "layout" else
                 Field("layout", LAYOUTS, f.doc + "; pagedP: ragged Q over paged K/V pools of page size P "
                                                  "(Runtime.attention)")
                 for f in ATTENTION_FIELDS) + (
        Field("strides", ("general", "packed"), "general Int64 strides, or packed contiguous BSHD (dense only)"),
        KV_DTYPE_FIELD,
    ) + FEATURE_FIELDS,
    why_invalid=chain(_why_invalid, why_invalid_features),
    params=params,
    launch=launch_facts,
    kernel_module="aotc.kernels.sdpa_prefill",
))
