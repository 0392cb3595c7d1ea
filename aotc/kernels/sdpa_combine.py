"""CuTe DSL kernel for the sdpa_combine family (see aotc.families.sdpa_combine).

One CTA of THREADS threads is slices_per_cta(head_dim) slices of head_dim / VECTOR consecutive
threads, each thread owning VECTOR (=4) consecutive head-dim elements. A row (one (b, s, h)) is
served by split_groups consecutive slices (a runtime value, the runtime's choice: 1 for large
combines, more for small ones), slice g taking splits g, g + split_groups, ...:

  pass 1: m = max_i lse_i, L = sum_i exp(lse_i - m), the splits spread over a slice's lanes (up to
          32, one warp) and reduced by shuffles: a few independent loads per lane instead of a chain
          of `splits` dependent ones (the combine of a B = 1 decode with 33 splits is latency bound)
  pass 2: over the slice's splits in groups of UNROLL: load the group's lse (L1 hits), then issue
          the 16-byte O_i loads of every live split of the group, then acc += exp(lse_i - m) * O_i
  sum:    the slices of a row add their acc through shared memory (THREADS * VECTOR floats)
  out:    slice 0: O = acc / L, LSE = m + log(L); O = 0, LSE = -inf when no split is live.

A split whose lse_i is -inf (or whose index is >= splits) never has its O_i loaded.
All address arithmetic is 64-bit.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.memory import SmemAllocator

from ..families import sdpa_combine as family
from ..families.sdpa_combine import THREADS, VECTOR, slices_per_cta, smem_bytes
from .compile import KernelBuild, compile_kernel

# splits per group in pass 2: this many 16-byte O_partial loads in flight per thread
UNROLL = 4

_OUT_DTYPES = {"fp16": cutlass.Float16, "bf16": cutlass.BFloat16, "fp32": cutlass.Float32}

_NEG_INF = -math.inf
_EVICT_FIRST = cute.nvgpu.CacheEvictionPriority.EVICT_FIRST


class SdpaCombine:
    """One (head_dim, dtype of O, strides) variant; see the module docstring for the algorithm."""

    ptxas_levels = (None,)  # ptxas' default: no spills at these sizes

    def __init__(self, variant):
        if variant.family != "sdpa_combine":
            raise ValueError(f"not an sdpa_combine variant: {variant.name}")
        self.variant = variant
        self.params = family.params(variant)
        self.head_dim = head_dim = int(variant["head_dim"])
        self.out_dtype = _OUT_DTYPES[variant["dtype"]]
        self.packed = variant["strides"] == "packed"
        self.tpr = head_dim // VECTOR           # threads per row slice (VECTOR columns each)
        self.slices = slices_per_cta(head_dim)  # slices per CTA; split_groups (a runtime value) of them per row
        self.sub = min(self.tpr, 32)            # lanes sharing pass 1 (within one warp: shuffles)
        if self.tpr * self.slices != THREADS or self.tpr * VECTOR != head_dim:
            raise ValueError(f"head_dim {head_dim} does not tile {THREADS} threads of {VECTOR} columns")

        @cute.struct
        class SharedStorage:
            partial_sums: cute.struct.MemRange[Float32, THREADS * VECTOR]

        if SharedStorage.size_in_bytes() != smem_bytes(head_dim):
            raise RuntimeError(f"shared storage is {SharedStorage.size_in_bytes()} bytes, "
                               f"smem_bytes() says {smem_bytes(head_dim)}")
        self.SharedStorage = SharedStorage

    def __str__(self) -> str:  # the kernel symbol's mangled name includes it
        return type(self).__name__

    def pointee_types(self) -> dict:
        return {"o_partial": Float32, "lse_partial": Float32, "o": self.out_dtype, "lse": Float32}

    def launch_facts(self):
        return family.launch_facts(self.variant)

    @cute.kernel
    def sdpa_combine_kernel(
        self,
        o_partial: cute.Pointer,
        lse_partial: cute.Pointer,
        o: cute.Pointer,
        lse: cute.Pointer,
        splits: Int32,
        batch: Int32,
        seqlen_q: Int32,
        heads: Int32,
        write_lse: Int32,
        split_groups: Int32,
        op_stride_split: Int64,
        op_stride_b: Int64,
        op_stride_s: Int64,
        op_stride_h: Int64,
        lp_stride_split: Int64,
        lp_stride_b: Int64,
        lp_stride_h: Int64,
        lp_stride_s: Int64,
        o_stride_b: Int64,
        o_stride_s: Int64,
        o_stride_h: Int64,
        o_stride_d: Int64,
        lse_stride_b: Int64,
        lse_stride_h: Int64,
        lse_stride_s: Int64,
    ):
        tpr, slices, sub, head_dim, out_dtype, packed = (self.tpr, self.slices, self.sub, self.head_dim,
                                                         self.out_dtype, self.packed)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n_sg = split_groups               # slices per row (a power of two dividing `slices`)
        slice_idx = Int32(tidx) // tpr
        lane = Int32(tidx) % tpr
        sg = slice_idx % n_sg
        row = Int64(bidx) * Int64(slices // n_sg) + Int64(slice_idx // n_sg)
        n_rows = Int64(batch) * Int64(seqlen_q) * Int64(heads)
        valid = row < n_rows
        heads64 = Int64(heads)
        seq64 = Int64(seqlen_q)
        bs = row // heads64
        h = row - bs * heads64
        b = bs // seq64
        s = bs - b * seq64
        d0 = Int64(lane * VECTOR)
        lp_row = b * lp_stride_b + h * lp_stride_h + s * lp_stride_s
        op_row = b * op_stride_b + s * op_stride_s + h * op_stride_h + d0

        # pass 1, spread over the slice's lanes: lane j reads splits j, j + sub, ... (independent loads,
        # not a chain of `splits` dependent ones), then max and sum of weights over the lanes by shuffles
        # (outside any row-dependent branch: every lane of the warp takes part). Every slice of a row
        # computes the same m and L (same loads, same order).
        my_splits = splits if valid else Int32(0)
        sub_lane = lane % sub
        m = Float32(_NEG_INF)
        for i in range(sub_lane, my_splits, sub):
            m = cute.arch.fmax(m, lse_partial[lp_row + Int64(i) * lp_stride_split])
        for k in cutlass.range_constexpr(sub.bit_length() - 1):
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=sub >> (k + 1), mask=-1, mask_and_clamp=31))
        total = Float32(0.0)
        if m > Float32(_NEG_INF):
            for i in range(sub_lane, my_splits, sub):
                total = total + cute.math.exp(lse_partial[lp_row + Int64(i) * lp_stride_split] - m)
        for k in cutlass.range_constexpr(sub.bit_length() - 1):
            total = total + cute.arch.shuffle_sync_bfly(total, offset=sub >> (k + 1), mask=-1, mask_and_clamp=31)

        # pass 2: this slice's splits sg, sg + n_sg, ... in groups of UNROLL
        acc = cute.make_rmem_tensor((VECTOR,), Float32)
        acc.fill(0.0)
        if m > Float32(_NEG_INF):
            n_mine = (my_splits - sg + (n_sg - 1)) // n_sg
            lv = cute.make_rmem_tensor((UNROLL,), Float32)
            wv = cute.make_rmem_tensor((UNROLL,), Float32)
            ov = cute.make_rmem_tensor((VECTOR, UNROLL), Float32)
            for j0 in range(0, n_mine, UNROLL):
                # the group's lse values (-inf past this slice's last split; L1 hits after pass 1)
                for k in cutlass.range_constexpr(UNROLL):
                    lv[k] = Float32(_NEG_INF)
                    if j0 + k < n_mine:
                        lv[k] = lse_partial[lp_row + Int64(sg + (j0 + k) * n_sg) * lp_stride_split]
                # the group's O_i loads, only for live splits
                for k in cutlass.range_constexpr(UNROLL):
                    wv[k] = Float32(0.0)
                    ov[None, k].fill(0.0)
                    if lv[k] > Float32(_NEG_INF):
                        # offsets are multiples of VECTOR elements (16-byte aligned rows and strides),
                        # which keeps o_partial's 16-byte alignment and gives one 128-bit load
                        off = cute.assume(op_row + Int64(sg + (j0 + k) * n_sg) * op_stride_split, divby=VECTOR)
                        src = cute.make_tensor(o_partial + off, cute.make_layout(VECTOR))
                        # O_partial is read exactly once: evict it first from L1, keeping the lse there
                        cute.autovec_copy(src, ov[None, k], l1c_evict_priority=_EVICT_FIRST)
                        wv[k] = cute.math.exp(lv[k] - m)
                for k in cutlass.range_constexpr(UNROLL):
                    acc.store(acc.load() + ov[None, k].load() * wv[k])

        # the row's slices add up their sums through shared memory; slice 0 of the row writes O and LSE
        storage = SmemAllocator().allocate(self.SharedStorage)
        sums = storage.partial_sums.data_ptr()
        if n_sg > 1:  # uniform over the CTA: the barrier is reached by all threads or none
            mine = cute.make_tensor(sums + cute.assume(Int32(tidx) * VECTOR, divby=VECTOR), cute.make_layout(VECTOR))
            mine.store(acc.load())
            cute.arch.barrier()
            if sg == 0:
                for g in range(1, n_sg):
                    other = cute.make_tensor(sums + cute.assume((Int32(tidx) + g * tpr) * VECTOR, divby=VECTOR),
                                             cute.make_layout(VECTOR))
                    acc.store(acc.load() + other.load())

        if valid and sg == 0:
            lse_out = Float32(_NEG_INF)
            if m > Float32(_NEG_INF):
                acc.store(acc.load() * (Float32(1.0) / total))
                lse_out = m + cute.math.log(total)
            res = acc.load().to(out_dtype)
            if cutlass.const_expr(packed):
                o_off = cute.assume(row * head_dim + d0, divby=VECTOR)
                dst = cute.make_tensor(o + o_off, cute.make_layout(VECTOR))
                dst.store(res)
            else:
                o_row = b * o_stride_b + s * o_stride_s + h * o_stride_h
                for j in cutlass.range_constexpr(VECTOR):
                    o[o_row + (d0 + j) * o_stride_d] = res[j]

            if write_lse != 0:
                if lane == 0:
                    if cutlass.const_expr(packed):
                        lse[(b * heads64 + h) * seq64 + s] = lse_out
                    else:
                        lse[b * lse_stride_b + h * lse_stride_h + s * lse_stride_s] = lse_out

    @cute.jit
    def __call__(
        self,
        o_partial: cute.Pointer,
        lse_partial: cute.Pointer,
        o: cute.Pointer,
        lse: cute.Pointer,
        splits: Int32,
        batch: Int32,
        seqlen_q: Int32,
        heads: Int32,
        write_lse: Int32,
        split_groups: Int32,
        op_stride_split: Int64,
        op_stride_b: Int64,
        op_stride_s: Int64,
        op_stride_h: Int64,
        lp_stride_split: Int64,
        lp_stride_b: Int64,
        lp_stride_h: Int64,
        lp_stride_s: Int64,
        o_stride_b: Int64,
        o_stride_s: Int64,
        o_stride_h: Int64,
        o_stride_d: Int64,
        lse_stride_b: Int64,
        lse_stride_h: Int64,
        lse_stride_s: Int64,
    ):
        # The real launch is done by the aotc runtime; this grid only makes the module well formed.
        grid_x = (batch * seqlen_q * heads * split_groups + (self.slices - 1)) // self.slices
        self.sdpa_combine_kernel(
            o_partial, lse_partial, o, lse,
            splits, batch, seqlen_q, heads, write_lse, split_groups,
            op_stride_split, op_stride_b, op_stride_s, op_stride_h,
            lp_stride_split, lp_stride_b, lp_stride_h, lp_stride_s,
            o_stride_b, o_stride_s, o_stride_h, o_stride_d,
            lse_stride_b, lse_stride_h, lse_stride_s,
        ).launch(grid=[grid_x, 1, 1], block=[THREADS, 1, 1])


def compile(variant, *, dump_dir: str, keep_ptx: bool = False) -> KernelBuild:
    """Compile one sdpa_combine variant for variant.arch. The entry's parameters are exactly
    aotc.families.sdpa_combine.params(variant), in order."""
    return compile_kernel(SdpaCombine(variant), variant.arch, dump_dir, keep_ptx=keep_ptx)
