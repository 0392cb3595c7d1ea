"""sdpa_combine: merge split-KV partial attention outputs.

Inputs (fp32, written by a split-KV attention kernel):
  O_partial   [splits, B, S_q, H, D]  head-dim stride 1, 16-byte aligned rows
  LSE_partial [splits, B, H, S_q]     natural-log sum-exp of each split
Outputs:
  O   [B, S_q, H, D] in fp16, bf16 or fp32, any Int64 strides
  LSE [B, H, S_q] fp32 (optional: written when write_lse != 0)

O = sum_i exp(lse_i - lse) * O_i with lse = log(sum_i exp(lse_i)). A split
whose lse_i is -inf contributes nothing (its O_i is never read); when every
split is empty, O = 0 and LSE = -inf.

Every variant of the family shares one parameter list; the "packed" stride
specialization promises that O is contiguous [B, S_q, H, D] and LSE contiguous
[B, H, S_q] and ignores the O/LSE stride parameters.
"""
from __future__ import annotations

from ..common.abi import LaunchFacts, Param, ptr, scalars
from ..common.variant import Variant
from . import KNOWN_ARCHS, Family, Field, register

THREADS = 128
VECTOR = 4  # fp32 elements per thread per load (16 bytes)

OUT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def params(variant: Variant) -> tuple[Param, ...]:
    """The kernel's parameters; O's pointee alignment is a whole VECTOR of outputs when packed (one vector
    store), one element otherwise."""
    out_bytes = OUT_BYTES[variant["dtype"]]
    return (
        ptr("o_partial", 16), ptr("lse_partial", 4),
        ptr("o", VECTOR * out_bytes if variant["strides"] == "packed" else out_bytes), ptr("lse", 4),
        *scalars("i32", "splits", "batch", "seqlen_q", "heads", "write_lse", "split_groups"),
        *scalars("i64", "op_stride_split", "op_stride_b", "op_stride_s", "op_stride_h",
                 "lp_stride_split", "lp_stride_b", "lp_stride_h", "lp_stride_s",
                 "o_stride_b", "o_stride_s", "o_stride_h", "o_stride_d",
                 "lse_stride_b", "lse_stride_h", "lse_stride_s"),
    )


def slices_per_cta(head_dim: int) -> int:
    """Slices of head_dim / VECTOR threads (VECTOR columns each) in one CTA."""
    return THREADS // (head_dim // VECTOR)


def choose_split_groups(slices: int, rows: int, sm_count: int) -> int:
    """Slices per row (a power of two dividing `slices`, a cubin's slices_per_cta), each taking every
    split_groups-th split: the most that keeps the grid within two CTAs per SM. A small combine (a
    B = 1 decode: 32 rows, 33 splits) is a chain of dependent loads per thread, shortened by spreading
    the splits; a large one is bandwidth bound and wants its rows over as few, full CTAs as possible."""
    groups = slices
    while groups > 1 and -(-rows * groups // slices) > 2 * sm_count:
        groups //= 2
    return groups


def smem_bytes(head_dim: int) -> int:
    """The fp32 buffer where a row's split groups add up their partial sums (one VECTOR per thread)."""
    return THREADS * VECTOR * 4


def _why_invalid(values: dict) -> str | None:
    if values["head_dim"] % (VECTOR * 8) != 0 or THREADS % (values["head_dim"] // VECTOR) != 0:
        return f"head_dim {values['head_dim']} must be a multiple of 32 dividing {THREADS * VECTOR}"
    return None


def launch_facts(variant: Variant) -> LaunchFacts:
    return LaunchFacts(
        block=(THREADS, 1, 1),
        dynamic_smem=smem_bytes(variant["head_dim"]),
        grid_rule="grid.x = ceil(batch * seqlen_q * heads * split_groups / slices_per_cta)",
        extra={"slices_per_cta": slices_per_cta(variant["head_dim"])},
    )


FAMILY = register(Family(
    name="sdpa_combine",
    doc="merge split-KV partial outputs and log-sum-exps into O and LSE",
    archs=KNOWN_ARCHS,
    fields=(
        Field("dtype", ("fp16", "bf16", "fp32"), "dtype of O (partials and LSE are fp32)"),
        Field("head_dim", (64, 128, 256), "head dimension D (compile-time)"),
        Field("strides", ("general", "packed"),
              "general: Int64 strides for O and LSE; packed: O contiguous [B,S_q,H,D], LSE contiguous [B,H,S_q]"),
    ),
    why_invalid=_why_invalid,
    params=params,
    launch=launch_facts,
    kernel_module="aotc.kernels.sdpa_combine",
))
