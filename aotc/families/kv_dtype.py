"""The KV cache's dtype as a variant field of the families that read or write the cache (sdpa_decode, kv_write,
and the paged layouts of sdpa_prefill and sdpa_prefill_sm90): the queries' dtype as before, or fp8 e4m3 (plain
data).

fp8_e4m3 pools hold e4m3fn bytes (no infinities; 0x7f/0xff are NaN; largest finite 448) with fp32 scales per
KV head or per tensor, the same tensors for writing and reading, as vLLM's k_scale / v_scale:

  kv_write  stores  e4m3(clamp(x / scale[h], -448, 448))   round to nearest even (cvt.rn.satfinite)
  attention reads   k = k_fp8 * k_scale[h], v = v_fp8 * v_scale[h]   (exactly: the kernels fold the scales
                    into the softmax scale and the output, aotc.kernels.sdpa_decode)

The scales are runtime pointers to fp32 [H_kv]; scale_stride_h is 1, or 0 to broadcast one scale
(a per-tensor scale of shape [1]). The parameters end the ABI of every variant of these families (unused
when the cache is 16-bit).
"""
from __future__ import annotations

from ..common.abi import Param, ptr
from . import Field

FP8 = "fp8_e4m3"
E4M3_MAX = 448.0
# e4m3 conversion instructions (cvt.rn.satfinite.e4m3x2.f32) are sm_89 and later
FP8_ARCHS = ("sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")

KV_DTYPE_FIELD = Field(
    "kv_dtype", ("fp16", "bf16", FP8),
    "dtype of the K/V cache: the queries' dtype, or fp8_e4m3 with fp32 scales per KV head (or per tensor)",
    unlisted_from="dtype")

# (decode names them k_descale / v_descale, kv_write k_scale / v_scale: the same tensors)
def kv_scale_params(prefix: str) -> tuple[Param, ...]:
    return (ptr(f"k_{prefix}", 4), ptr(f"v_{prefix}", 4), Param(f"{prefix}_stride_h", "i32"))


def kv_fp8(variant) -> bool:
    """Whether a variant reads (or writes) an fp8 cache."""
    return variant.get("kv_dtype") == FP8


def why_not_paged_fp8(layout: str) -> str | None:
    """The prefill families take fp8 pools through their paged layouts only (an fp8 cache is a paged one)."""
    if not layout.startswith("paged"):
        return f"kv_dtype {FP8} is for the paged layouts (an fp8 KV cache), not {layout}"
    return None


# The warp-MMA kernels (sdpa_decode, sdpa_prefill) hold e4m3 rows in the 64-column swizzle atoms of their 16-bit
# tiles, read as 16-bit pairs: a row takes D bytes, and at least one atom row of 128 (D64's fill half of it; a
# decode tile with packed_rows puts two in a 128-byte line instead, aotc.kernels.warp_mma.smem_tile_layout)
E4M3_MIN_ROW_BYTES = 128


def e4m3_row_bytes(head_dim: int) -> int:
    """Shared-memory bytes one e4m3 row of head_dim values takes in those kernels' K/V tiles."""
    return max(head_dim, E4M3_MIN_ROW_BYTES)


def why_invalid_kv_dtype(values: dict) -> str | None:
    kv, dtype, arch = values.get("kv_dtype"), values.get("dtype"), values.get("arch")
    if kv is None or kv == dtype:
        return None
    if kv != FP8:
        return f"kv_dtype {kv} must be the dtype ({dtype}) or {FP8}"
    if arch is not None and arch not in FP8_ARCHS:
        return f"kv_dtype {FP8} needs an arch with e4m3 conversions ({', '.join(FP8_ARCHS)}), not {arch}"
    return None
