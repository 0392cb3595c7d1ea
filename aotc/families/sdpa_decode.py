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

from ..common.abi import LaunchFacts, Param, has_grid_dependency_control
from ..common.variant import Variant
from . import Family, Field, register

KV_CHOICES = ("dense", "paged16", "paged32", "paged64", "paged128")
MAX_SEQLEN_Q = 16
ROWS_PER_CTA = 16  # packed (token, query head) rows one CTA serves (one m16 MMA tile; the 4 warps split the keys)

PARAMS: tuple[Param, ...] = (
    Param("q", "ptr"), Param("k", "ptr"), Param("v", "ptr"), Param("o", "ptr"), Param("lse", "ptr"),
    Param("o_partial", "ptr"), Param("lse_partial", "ptr"), Param("counters", "ptr"), Param("page_table", "ptr"),
    Param("seqlens_kv", "ptr"),
    Param("batch", "i32"), Param("seqlen_q", "i32"), Param("heads_q", "i32"), Param("heads_kv", "i32"),
    Param("num_splits", "i32"), Param("max_pages", "i32"), Param("write_lse", "i32"), Param("write_partial", "i32"),
    Param("softmax_scale", "f32"),
    Param("q_stride_b", "i64"), Param("q_stride_s", "i64"), Param("q_stride_h", "i64"),
    Param("k_stride_page", "i64"), Param("k_stride_token", "i64"), Param("k_stride_head", "i64"),
    Param("v_stride_page", "i64"), Param("v_stride_token", "i64"), Param("v_stride_head", "i64"),
    Param("o_stride_b", "i64"), Param("o_stride_s", "i64"), Param("o_stride_h", "i64"),
    Param("lse_stride_b", "i64"), Param("lse_stride_h", "i64"), Param("lse_stride_s", "i64"),
    Param("pt_stride_b", "i64"), Param("pt_stride_p", "i64"),
    Param("op_stride_split", "i64"), Param("op_stride_b", "i64"), Param("op_stride_s", "i64"),
    Param("op_stride_h", "i64"),
    Param("lp_stride_split", "i64"), Param("lp_stride_b", "i64"), Param("lp_stride_h", "i64"),
    Param("lp_stride_s", "i64"),
)

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")


def page_size(variant: Variant) -> int:
    kv = variant["kv"]
    return 0 if kv == "dense" else int(kv[len("paged"):])


def _launch(variant: Variant) -> LaunchFacts:
    return LaunchFacts(
        block=(128, 1, 1),
        dynamic_smem=-1,  # reported by the compile
        grid_rule="grid = (num_splits, heads_kv * ceil(heads_q / heads_kv * seqlen_q / ROWS_PER_CTA), batch)",
        # pdl_trigger: each CTA starts with griddepcontrol.launch_dependents: a kernel launched after the step as a
        # programmatic dependent may be dispatched early (it must griddepcontrol.wait before reading O or LSE)
        extra={"pdl_trigger": has_grid_dependency_control(variant.arch)},
    )


FAMILY = register(Family(
    name="sdpa_decode",
    doc="decode attention over a paged or dense KV cache, GQA-packed, split-KV merged in the same launch",
    archs=ARCHS,
    fields=(
        Field("dtype", ("fp16", "bf16"), "dtype of Q, K, V and O"),
        Field("head_dim", (64, 128, 256), "head dimension D"),
        Field("kv", KV_CHOICES, "dense KV [B, S, H_kv, D], or a paged pool with this page size"),
    ),
    why_invalid=lambda values: None,
    params=lambda v: PARAMS,
    launch=_launch,
    kernel_module="aotc.kernels.sdpa_decode",
))
