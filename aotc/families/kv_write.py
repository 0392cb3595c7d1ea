"""kv_write: write the new tokens' K and V into paged KV-cache pools through a slot mapping, the call a
serving engine makes once per layer per step before attention (vLLM's reshape_and_cache_flash).

Tensors (element strides; head-dim stride 1 everywhere, every row 16-byte aligned):
  key, value  [num_tokens, H_kv, D]        strides (token, head), each its own
  k_cache, v_cache  pools of pages: element (page, in-page slot, kv head, d) at
      page*stride_page + slot*stride_token + head*stride_head + d. NHD pools [num_pages, P, H_kv, D] and
      HND pools [num_pages, H_kv, P, D] are both just strides (as for sdpa_decode); K and V own strides.
  slot_mapping int64 [num_tokens], contiguous: token i goes to page slot_mapping[i] >> page_shift at in-page
      slot slot_mapping[i] & (P - 1), P = 2^page_shift. A slot outside [0, num_slots) (num_slots =
      num_pages * P; -1 marks a padding token) is skipped on the device: nothing of that token is written,
      so a bad slot can never write out of bounds (the host cannot see device data to check it).

kv_dtype = dtype: the copy is bitwise. kv_dtype = fp8_e4m3 (aotc.families.kv_dtype): the pools hold e4m3
bytes, e4m3(clamp(x / scale[h], -448, 448)) rounded to nearest even, scale = k_scale (v_scale) fp32 [H_kv]
with scale_stride_h 1 (0: one scale for every head); a thread converts its 16-byte chunk of 8 values into 8
bytes. Launch: grid (ceil(num_tokens / tokens_per_cta),
H_kv, 1), block THREADS: CTA (x, h) copies head h of tokens [x * tokens_per_cta, (x + 1) * tokens_per_cta),
thread t taking 16-byte chunk t % (D / 8) of token x * tokens_per_cta + t // (D / 8), in K and in V. The
page size is a runtime value (page_shift); num_tokens is a per-call scalar (a plan serves every batch size).

"""
from __future__ import annotations

from ..common.abi import LaunchFacts, Param, ptr, scalars
from ..common.variant import Variant
from . import KNOWN_ARCHS, Family, Field, register
from .kv_dtype import KV_DTYPE_FIELD, kv_scale_params, why_invalid_kv_dtype

THREADS = 128
ROWS_PER_THREAD = 2  # (token, head) rows a thread copies: 2 x 32 bytes in flight per thread
VEC_BYTES = 16  # one chunk: a 128-bit load and store
ELEMENT_BYTES = {"fp16": 2, "bf16": 2}
PAGE_SIZES = (16, 32, 64, 128)  # what the runtime accepts (any power of two works in the kernel)
MAX_HEADS_KV = 65535  # grid.y

PARAMS: tuple[Param, ...] = (
    ptr("key", VEC_BYTES), ptr("value", VEC_BYTES), ptr("k_cache", VEC_BYTES), ptr("v_cache", VEC_BYTES),
    ptr("slot_mapping", 8),
    *scalars("i32", "num_tokens", "heads_kv", "page_shift"),
    Param("num_slots", "i64"),
    *scalars("i64", "key_stride_token", "key_stride_head", "value_stride_token", "value_stride_head",
             "k_stride_page", "k_stride_token", "k_stride_head", "v_stride_page", "v_stride_token", "v_stride_head"),
    *kv_scale_params("scale"),  # fp8 pools only (aotc.families.kv_dtype)
)


def chunks_per_row(variant: Variant) -> int:
    """16-byte chunks of one (token, head) row of D elements."""
    return variant["head_dim"] * ELEMENT_BYTES[variant["dtype"]] // VEC_BYTES


def tokens_per_cta(variant: Variant) -> int:
    return THREADS // chunks_per_row(variant) * ROWS_PER_THREAD


def _why_invalid(values: dict) -> str | None:
    row_bytes = values["head_dim"] * ELEMENT_BYTES[values["dtype"]]
    if row_bytes % VEC_BYTES or THREADS % (row_bytes // VEC_BYTES):
        return f"a row of head_dim {values['head_dim']} must be 16-byte chunks dividing {THREADS} threads"
    return why_invalid_kv_dtype(values)


def launch_facts(variant: Variant) -> LaunchFacts:
    return LaunchFacts(
        block=(THREADS, 1, 1),
        dynamic_smem=0,
        grid_rule="grid = (ceil(num_tokens / tokens_per_cta), heads_kv, 1)",
        # the runtime's grid reads it (aotc.runtime.kv_write)
        extra={"tokens_per_cta": tokens_per_cta(variant)},
    )


FAMILY = register(Family(
    name="kv_write",
    doc="write new tokens' K and V into paged NHD/HND pools through an int64 slot mapping (-1 skips)",
    archs=KNOWN_ARCHS,
    fields=(
        Field("dtype", ("fp16", "bf16"), "dtype of key and value (and of the pools unless kv_dtype says fp8)"),
        Field("head_dim", (64, 128, 256), "head dimension D"),
        KV_DTYPE_FIELD,
    ),
    why_invalid=_why_invalid,
    params=lambda v: PARAMS,
    launch=launch_facts,
    kernel_module="aotc.kernels.kv_write",
))
