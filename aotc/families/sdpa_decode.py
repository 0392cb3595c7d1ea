"""sdpa_decode: attention of a few new query tokens (S_q 1..16) over a paged (or dense) KV cache.

Tensors (element strides; head-dim stride 1 everywhere):
  Q   [B, S_q, H_q, D]                     strides (b, s, h)
  K,V paged: pools of pages; token t of sequence b lives in page page_table[b, t // P] at slot t % P;
      element (page, slot, kv_head, d) at page*stride_page + slot*stride_token + kv_head*stride_head + d.
      NHD pools [num_pages, P, H_kv, D] and HND pools [num_pages, H_kv, P, D] are both just strides.
      dense: K/V [B, S_kv_max, H_kv, D] with strides (b, s, h) passed in the same three slots.
  page_table int32 [B, max_pages], strides (b, p) (paged only)
  seqlens_kv int32 [B] on the device: sequence b has seqlens_kv[b] tokens (0 gives O = 0, LSE = -inf)
  O   [B, S_q, H_q, D] (dtype), LSE fp32 [B, H_q, S_q] (optional)
  ragged layout: Q/O [total_q, H_q, D] and LSE [H_q, total_q] with cu_seqlens_q int32 [B + 1]; sequence b's
      s_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] queries are served when 1 <= s_b <= seqlen_q (the
      plan's decode query length), else left alone (another kernel writes them); strides as dense with
      the batch stride 0 and the sequence stride the token stride

fp8 KV (kv_dtype fp8_e4m3, aotc.families.kv_dtype): K/V pools of e4m3 bytes (strides multiples of 16) with
fp32 scales k_descale / v_descale [H_kv] (descale_stride_h 1) or [1] (0); attention over k_fp8 * k_descale[h],
v_fp8 * v_descale[h]. The kernel converts the e4m3 fragments to fp16 in registers after ldmatrix and runs its
MMAs in fp16 (Q rewritten as fp16 times a power of two per CTA), the K scale in the softmax scale, the V scale
in O.

Causal within the new tokens: query i (0-based among S_q) sees keys j <= seqlens_kv[b] - S_q + i.
GQA packing: a CTA serves one (batch, kv head, split) and up to ROWS_PER_CTA (token, query head) rows of
that KV head (all of them when H_q / H_kv * S_q <= 16, the common decode case), so each K/V byte is read
once per split; larger groups take ceil(rows / ROWS_PER_CTA) CTAs along grid.y. The CTA's 4 warps split
each kv block's keys between them and merge their partial softmax states at the end.

Split-KV: num_splits CTAs share a sequence; split s handles tokens [s*chunk, (s+1)*chunk) where
chunk = ceil(ceil(seqlens_kv[b] / num_splits) / BLOCK_N) * BLOCK_N. With write_partial == 0
(num_splits == 1) the kernel writes O (dtype) and LSE directly. With write_partial != 0 every split
writes fp32 O_partial [splits, B, S_q, H_q, D] and LSE_partial [splits, B, H_q, S_q] (a split that sees
no key writes LSE -inf), then takes a ticket from its (b, kv head, row tile)'s int32 counter,
counters[b * gridDim.y + blockIdx.y]; the CTA that draws the last ticket merges the num_splits partials
into O and LSE (as sdpa_combine would) and sets the counter back to 0. So one launch does the whole
step, and the counters must be 0 when a launch starts: the runtime zeroes them when it prepares a
plan, and every launch leaves them 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.abi import LaunchFacts, Param, has_grid_dependency_control, ptr, scalars
from ..common.variant import Variant
from . import Family, Field, register
from .features import FEATURE_FIELDS, FEATURE_PARAMS
from .kv_dtype import FP8, KV_DTYPE_FIELD, e4m3_row_bytes, kv_scale_params, why_invalid_kv_dtype

KV_CHOICES = ("dense", "paged16", "paged32", "paged64", "paged128")
MAX_SEQLEN_Q = 16
ROWS_PER_CTA = 16  # packed (token, query head) rows one CTA serves (one m16 MMA tile; the 4 warps split the keys)
THREADS = 128
WARPS = 4
ACC_PAD = 8        # fp32 padding of a merge-buffer row (bank conflicts of the fragment stores)
MIN_CHUNK_BLOCKS = 4  # kv blocks a chunk holds at least (aotc.kernels.tile_scheduler.KvChunks)


@dataclass(frozen=True)
class Tile:
    """Each of the 4 warps takes keys_per_warp keys of every kv block (block_n = 4 * keys_per_warp keys);
    K and V tiles go through a ring of `slots` shared-memory buffers; ctas_per_sm CTAs fit an SM."""

    keys_per_warp: int
    slots: int
    ctas_per_sm: int
    smem_limit: int
    # fp8 KV: the ring's slots hold e4m3 tiles (half the bytes of a 16-bit tile), converted in registers
    fp8: bool = False
    # fp8 D64: its 64-byte e4m3 rows packed two to a 128-byte line (narrow swizzle atoms, aotc.kernels.sdpa_decode)
    # instead of each in the first half of a 128-byte atom row (kv_dtype.e4m3_row_bytes)
    packed_rows: bool = False

    @property
    def block_n(self) -> int:
        return WARPS * self.keys_per_warp

    def smem_bytes(self, head_dim: int) -> int:
        """max(Q tile + ring, the epilogue's merge buffer, which overlays them), in 1 KiB steps."""
        q_bytes = ROWS_PER_CTA * head_dim * 2
        row_bytes = head_dim * 2
        if self.fp8:
            row_bytes = head_dim if self.packed_rows else e4m3_row_bytes(head_dim)
        ring_bytes = self.slots * self.block_n * row_bytes
        # per warp and row: max and sum (fp32), then per warp a 16 x (D + pad) fp32 O tile
        merge_bytes = WARPS * ROWS_PER_CTA * 2 * 4 + WARPS * ROWS_PER_CTA * (head_dim + ACC_PAD) * 4
        return (max(q_bytes + ring_bytes, merge_bytes) + 1023) // 1024 * 1024


# Shared-memory classes of the archs: big sm_90/sm_90a/sm_100a (228 KB/SM): <= 113 KB per CTA, 2 CTAs
# per SM; a100 sm_80 (164 KB/SM): <= 81 KB per CTA, 2 CTAs per SM; small sm_86/sm_89/sm_120a (100 KB/SM,
# 99 KB per block): 1 CTA per SM.
SMEM_CLASS = {"sm_80": "a100", "sm_86": "small", "sm_89": "small", "sm_90": "big", "sm_90a": "big",
              "sm_100a": "big", "sm_120a": "small"}
_CLASS_LIMITS = {"big": (2, 113 * 1024), "a100": (2, 81 * 1024), "small": (1, 99 * 1024)}
# keys per warp and ring slots per head dim and smem class (benchmarks/tune_decode.py)
_KEYS_PER_WARP = {64: 32, 128: 16, 256: 16}
_SLOTS = {64: {"big": 6, "a100": 4, "small": 6}, 128: {"big": 6, "a100": 4, "small": 5},
          256: {"big": 3, "a100": 2, "small": 2}}


# fp8 KV (the archs with e4m3, big and small classes): (keys per warp, ring slots of e4m3 tiles, CTAs per SM, KB
# per CTA). fp8 decode is bound by instruction latency, not bytes (ncu at 3c6d52b, benchmarks/results/logs/
# ncu_decode_fp8_3c6d52b.txt: 31% of issue slots busy at 2.5 warps a scheduler): D128 runs 4 CTAs an SM (16
# warps; the kernel compiles to at most 128 registers for them) with 5 tiles of 8 KB each in flight
# (benchmarks/results/fp8_kv.json). D64's rows of 64 bytes each take half a 16-bit swizzle atom (128 bytes of
# the ring a row, aotc.kernels.sdpa_decode), so a key costs D128's ring bytes for half the data: D64 takes
# 32 keys a warp in 3 slots (a kv block's fixed work, its barrier and page lookups, over twice the keys), 1.08-1.16x
# the steps of 16 keys in 6 slots at gpt-oss's shape (benchmarks/results/decode_experiment_fp8_d64_tiles.json).
# Tile.packed_rows packs them two to a 128-byte line instead (benchmarks/tuners/tune_decode.py's *_p tiles): the
# (head dim, class) pairs of _PACKED_FP8_ROWS.
_FP8_TILES = {(64, "big"): (32, 3, 4, 56), (128, "big"): (16, 6, 4, 56), (256, "big"): (16, 6, 2, 113),
              (64, "small"): (16, 11, 1, 99), (128, "small"): (16, 11, 1, 99), (256, "small"): (16, 5, 1, 99)}

_PACKED_FP8_ROWS: frozenset = frozenset()

def tile(head_dim: int, arch: str, kv_dtype: str | None = None) -> Tile | None:
    """The tile of a head dim, arch and KV dtype (None: no fp8 tile fits the arch's shared memory)."""
    cls = SMEM_CLASS.get(arch, "small")
    if kv_dtype == FP8:
        fits = _FP8_TILES.get((head_dim, cls))
        if fits is None:
            return None
        keys_per_warp, slots, ctas, limit_kb = fits
        return Tile(keys_per_warp, slots, ctas, limit_kb * 1024, fp8=True,
                    packed_rows=(head_dim, cls) in _PACKED_FP8_ROWS)
    ctas, limit = _CLASS_LIMITS[cls]
    return Tile(_KEYS_PER_WARP[head_dim], _SLOTS[head_dim][cls], ctas, limit)


def variant_tile(variant: Variant) -> Tile:
    t = tile(variant["head_dim"], variant.arch, variant.get("kv_dtype"))
    if t is None:
        raise ValueError(f"{variant.name}: {_why_no_tile(variant['head_dim'], variant.arch)}")
    return t


def _why_no_tile(head_dim: int, arch: str) -> str:
    return f"no fp8 KV tile of head_dim {head_dim} fits the shared memory of {arch}"


def _why_invalid(values: dict) -> str | None:
    reason = why_invalid_kv_dtype(values)
    if reason is None and values.get("kv_dtype") == FP8 and values.get("arch") is not None:
        if tile(values["head_dim"], values["arch"], FP8) is None:
            return _why_no_tile(values["head_dim"], values["arch"])
    return reason

# Q/K/V/O and the fp32 O partials 16-byte aligned (128-bit cp.async and stores); the rest 4
PARAMS: tuple[Param, ...] = (
    ptr("q", 16), ptr("k", 16), ptr("v", 16), ptr("o", 16), ptr("lse", 4),
    ptr("o_partial", 16), ptr("lse_partial", 4), ptr("counters", 4), ptr("page_table", 4), ptr("seqlens_kv", 4),
    ptr("cu_seqlens_q", 4),  # ragged layout only (0 for dense)
    *scalars("i32", "batch", "seqlen_q", "heads_q", "heads_kv", "target_chunks", "max_pages", "write_lse"),
    Param("softmax_scale", "f32"),
    *scalars("i64", "q_stride_b", "q_stride_s", "q_stride_h", "k_stride_page", "k_stride_token", "k_stride_head",
             "v_stride_page", "v_stride_token", "v_stride_head", "o_stride_b", "o_stride_s", "o_stride_h",
             "lse_stride_b", "lse_stride_h", "lse_stride_s", "pt_stride_b", "pt_stride_p",
             "op_stride_chunk", "op_stride_s", "op_stride_h", "lp_stride_chunk", "lp_stride_h", "lp_stride_s"),
    *FEATURE_PARAMS,
    *kv_scale_params("descale"),  # fp8 KV only (aotc.families.kv_dtype)
)

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")


def page_size(variant: Variant) -> int:
    kv = variant["kv"]
    return 0 if kv == "dense" else int(kv[len("paged"):])


def launch_facts(variant: Variant, t: Tile | None = None) -> LaunchFacts:
    t = t or variant_tile(variant)
    return LaunchFacts(
        block=(THREADS, 1, 1),
        dynamic_smem=t.smem_bytes(variant["head_dim"]),
        grid_rule="grid = (heads_kv * ceil(heads_q / heads_kv * seqlen_q / rows_per_cta), target_chunks + batch, 1)",
        # the runtime's split choice reads these (aotc.runtime.decode): keys per kv block, rows per CTA and
        # CTAs resident per SM; pdl_trigger: each CTA starts with griddepcontrol.launch_dependents, so a kernel
        # launched after the step as a programmatic dependent may be dispatched early (it must
        # griddepcontrol.wait before reading O or LSE)
        extra={"block_n": t.block_n, "rows_per_cta": ROWS_PER_CTA, "ctas_per_sm": t.ctas_per_sm, "slots": t.slots,
               "min_chunk_blocks": MIN_CHUNK_BLOCKS,
               "pdl_trigger": has_grid_dependency_control(variant.arch)},
    )


FAMILY = register(Family(
    name="sdpa_decode",
    doc="decode attention over a paged or dense KV cache, GQA-packed, split-KV merged in the same launch",
    archs=ARCHS,
    fields=(
        Field("dtype", ("fp16", "bf16"), "dtype of Q and O (and of K and V unless kv_dtype says fp8)"),
        Field("head_dim", (64, 128, 256), "head dimension D"),
        Field("kv", KV_CHOICES, "dense KV [B, S, H_kv, D], or a paged pool with this page size"),
        Field("layout", ("dense", "ragged"), "Q/O [B, S_q, H_q, D]; or ragged [total_q, H_q, D] with cu_seqlens_q, "
                                             "serving the sequences of 1 .. seqlen_q queries (the decode rows of "
                                             "Runtime.attention; the paged prefill kernel takes the others)"),
        KV_DTYPE_FIELD,
    ) + FEATURE_FIELDS,
    why_invalid=_why_invalid,  # decode is causal: every feature combination is served
    params=lambda v: PARAMS,
    launch=launch_facts,
    kernel_module="aotc.kernels.sdpa_decode",
))
