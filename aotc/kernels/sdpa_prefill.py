"""CuTe DSL kernel for the sdpa_prefill family (see aotc.families.sdpa_prefill).

FlashAttention-2 forward with warp-level tensor cores, portable from sm_80 to sm_120.

One CTA of 32*warps threads computes a (block_m x D) tile of O for one (batch, head):
CTA = (m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z). Each warp owns 16-row
slabs of the tile (tiled MMA of `warps` x 1 x 1 m16n8k16 atoms, repeated over block_m).

Memory pipeline (one Q buffer, one K buffer, one V buffer in dynamic shared memory):

  prologue:  cp.async Q tile, cp.async K[n_last]                           (commit)
  per kv block n (from the last one down to 0):
     wait all + barrier       K[n] (and Q) visible; every warp is done with V[n+1]
     cp.async V[n]                                                         (commit)
     S = Q K[n]^T             ldmatrix Q/K from smem, mma.sync m16n8k16, fp32 acc
     wait all + barrier       V[n] visible; every warp is done with K[n]
     cp.async K[n-1]          overlaps the softmax and the PV product      (commit)
     mask (only in the "masked" steps), online softmax (exp2, fp32), rescale O
     O += P V[n]              P converted to fp16/bf16 in registers, ldmatrix.trans V

The kv blocks are walked backwards so that the blocks needing a mask (the sequence tail and,
for causal, the blocks crossing the diagonal) come first, in a loop of their own; the rest run
without any mask arithmetic. Loads of the first processed kv block are predicated on the
sequence length (rows past S_kv are zero-filled in smem, so no NaN can come from stale
smem through P*V); every later block is entirely in bounds. Q rows past S_q are zero-filled
too; they are never stored.

Masks: key j is visible to query i iff j < S_kv and (causal) j <= i + S_kv - S_q. A row
that sees no key gets O = 0 and LSE = -inf. softmax_scale must be finite and > 0.

Epilogue: O = acc / rowsum -> dtype -> smem (reusing the Q buffer) -> 128-bit coalesced
stores predicated on rows < S_q; LSE (natural log) by the quad leader of each row.

Addressing: dense general uses Int64 strides from the parameters; dense packed computes the
contiguous [B, S, H, D] strides itself (64-bit batch offset, 32-bit offsets within a batch);
ragged starts sequence b at token cu_seqlens[b]. All offsets are declared multiples of 8
elements (16 bytes) with cute.assume so cp.async stays 128-bit.
"""
import math
import os
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import T, dsl_user_op

from ..families.sdpa_prefill import PARAMS, TILES as _FAMILY_TILES

TILES = dict(_FAMILY_TILES)
for _t in filter(None, os.environ.get("AOTC_DEV_TILES", "").split(";")):
    _d, _v = _t.split(":")
    TILES[int(_d)] = tuple(int(x) for x in _v.split(","))

_DTYPES = {"fp16": cutlass.Float16, "bf16": cutlass.BFloat16}

LOG2_E = 1.4426950408889634074
LN_2 = 0.6931471805599453094
_NEG_INF = -math.inf
_VEC = 8  # elements per 128-bit access (fp16/bf16)
PF_QK = int(os.environ.get("PF_QK", "1"))
PF_PV = int(os.environ.get("PF_PV", "1"))
LAUNDER_TID = int(os.environ.get("LAUNDER_TID", "1"))
LAUNDER_ZERO = int(os.environ.get("LAUNDER_ZERO", "1"))


def smem_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one CTA: Q tile + one K tile + one V tile (2-byte elements)."""
    bm, bn, _ = TILES[head_dim]
    return (bm * head_dim + 2 * bn * head_dim) * 2


def _acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an m16n8 accumulator fragment ((2,2), MMA_M, MMA_N) as (rows, cols) of this thread."""
    lay = cute.make_layout(acc.layout.shape)  # compact column-major over the same shape
    mn = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def _acc_to_a_operand(layout: cute.Layout) -> cute.Layout:
    """(4, MMA_M, MMA_N) accumulator layout -> ((4, 2), MMA_M, MMA_N / 2) A-operand layout.

    Two neighbouring n8 accumulator tiles of an m16n8k16 MMA hold exactly the 16 columns of
    one k16 A fragment (cols 2t, 2t+1 of the first tile are a0/a1 ..., of the second a4/a5 ...).
    """
    d = cute.logical_divide(layout, (None, None, 2))
    return cute.make_layout(
        ((d.shape[0], d.shape[2][0]), d.shape[1], d.shape[2][1]),
        stride=((d.stride[0], d.stride[2][0]), d.stride[1], d.stride[2][1]),
    )


@dsl_user_op
def _opaque_i32(x, *, loc=None, ip=None) -> Int32:
    """x, hidden from LLVM (a volatile mov): it cannot be hoisted out of a loop or folded."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    ))


def _quad_allreduce(val, op):
    """Reduce over the 4 threads of a quad (the threads sharing accumulator rows)."""
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31))
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31))
    return val


def _build(dtype, head_dim: int, ragged: bool, causal: bool, packed: bool):
    """The @cute.jit host function of one variant (its kernel has exactly PARAMS)."""
    bm, bn, warps = TILES[head_dim]
    D = head_dim
    threads = 32 * warps
    assert D % 64 == 0 and bm % (16 * warps) == 0 and bn % 16 == 0
    assert not (ragged and packed)

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, bm * D], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, bn * D], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, bn * D], 1024]

    smem_size = SharedStorage.size_in_bytes()
    if smem_size != smem_bytes(D):
        raise RuntimeError(f"shared storage is {smem_size} bytes, smem_bytes() says {smem_bytes(D)}")

    # threads along D in a gmem copy: 8 threads x 8 elements = 64 columns = one swizzle atom row
    copy_cols = 64 // _VEC
    copy_rows = threads // copy_cols
    assert bm % copy_rows == 0 and bn % copy_rows == 0

    # ------------------------------------------------------------------ thread-level parts
    # Every per-thread partition is derived from an opaque copy of the thread index, made
    # separately in the prologue, in each kv iteration and in the epilogue. Otherwise LLVM
    # computes the thread's addresses once and keeps them all live across the kv loop (and
    # ptxas spills them): recomputing them costs a few integer ops per iteration.

    @cute.jit
    def load_kv_tile(ctx, tid, gX, sX, n, predicated: cutlass.Constexpr):
        """cp.async the (bn, D) tile n of K or V into sX; predicated: rows >= S_kv are zero-filled."""
        thr = ctx.g2s.get_slice(tid)
        tXgX = thr.partition_S(gX)  # (CPY, CPY_N, CPY_D, n_blocks)
        tXsX = thr.partition_D(sX)
        if cutlass.const_expr(predicated):
            cKV = cute.make_identity_tensor((bn, D))
            t0XcX = ctx.g2s.get_slice(0).partition_S(cKV)
            lim = ctx.s_kv - n * bn - thr.partition_S(cKV)[0][0]
            for r in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
                if t0XcX[0, r, 0][0] < lim:
                    cute.copy(ctx.g2s, tXgX[None, r, None, n], tXsX[None, r, None])
                else:
                    tXsX[None, r, None].fill(0)
        else:
            cute.copy(ctx.g2s, tXgX[None, None, None, n], tXsX)

    @cute.jit
    def prologue(ctx, n_max):
        """cp.async the Q tile (rows >= S_q zero-filled) and the last kv block's K tile."""
        tid = _opaque_i32(ctx.tidx)
        thr = ctx.g2s.get_slice(tid)
        tQgQ = thr.partition_S(ctx.gQ)
        tQsQ = thr.partition_D(ctx.sQ)
        cQ = cute.make_identity_tensor((bm, D))
        t0QcQ = ctx.g2s.get_slice(0).partition_S(cQ)
        lim = ctx.s_q - ctx.m_block * bm - thr.partition_S(cQ)[0][0]
        for m in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
            if t0QcQ[0, m, 0][0] < lim:
                cute.copy(ctx.g2s, tQgQ[None, m, None], tQsQ[None, m, None])
            else:
                tQsQ[None, m, None].fill(0)
        if n_max > 0:
            load_kv_tile(ctx, tid, ctx.gK, ctx.sK, n_max - 1, True)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def kv_block(ctx, n, masked: cutlass.Constexpr):
        """One kv block: S = Q K^T, (mask), online softmax, O += P V; overlaps the V[n] and K[n-1] loads."""
        tid = _opaque_i32(ctx.tidx) if cutlass.const_expr(LAUNDER_TID) else ctx.tidx
        # smem views from an opaque zero offset, so that (base + constant) ldmatrix addresses
        # are not hoisted out of the loop either (the constants stay instruction immediates)
        zero = cute.assume(_opaque_i32(Int32(0)) if cutlass.const_expr(LAUNDER_ZERO) else Int32(0), divby=1024)
        sQ = cute.make_tensor(ctx.sQ.iterator + zero, ctx.sQ.layout)
        sK = cute.make_tensor(ctx.sK.iterator + zero, ctx.sK.layout)
        sV = cute.make_tensor(ctx.sV.iterator + zero, ctx.sV.layout)
        sVt = cute.composition(sV, cute.make_layout((D, bn), stride=(bn, 1)))  # V^T (D, bn)

        tiled_mma = ctx.tiled_mma
        thr_mma = tiled_mma.get_slice(tid)
        s2r_Q = ctx.s2r_Q.get_slice(tid)
        s2r_K = ctx.s2r_K.get_slice(tid)
        s2r_V = ctx.s2r_V.get_slice(tid)
        tSsQ = s2r_Q.partition_S(sQ)
        tSsK = s2r_K.partition_S(sK)
        tOsVt = s2r_V.partition_S(sVt)
        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt))
        tSrQ_v = s2r_Q.retile(tSrQ)
        tSrK_v = s2r_K.retile(tSrK)
        tOrVt_v = s2r_V.retile(tOrVt)
        acc_O = ctx.acc_O
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((bm, bn)), Float32)
        acc_S.fill(0.0)

        # K[n] landed (and Q); every warp is done with V[n+1]: refill V
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        load_kv_tile(ctx, tid, ctx.gV, sV, n, masked)
        cute.arch.cp_async_commit_group()

        # S = Q K^T, the next k-slice's fragments loaded while the current one multiplies
        n_k = cute.size(tSsQ.shape[2])
        for kk in cutlass.range_constexpr(PF_QK):
            cute.copy(s2r_Q, tSsQ[None, None, kk], tSrQ_v[None, None, kk])
            cute.copy(s2r_K, tSsK[None, None, kk], tSrK_v[None, None, kk])
        for kk in cutlass.range_constexpr(n_k):
            if cutlass.const_expr(kk + PF_QK < n_k):
                cute.copy(s2r_Q, tSsQ[None, None, kk + PF_QK], tSrQ_v[None, None, kk + PF_QK])
                cute.copy(s2r_K, tSsK[None, None, kk + PF_QK], tSrK_v[None, None, kk + PF_QK])
            cute.gemm(tiled_mma, acc_S, tSrQ[None, None, kk], tSrK[None, None, kk], acc_S)

        # V[n] landed; every warp is done with K[n]: prefetch K[n-1] (always entirely in bounds)
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n > 0:
            load_kv_tile(ctx, tid, ctx.gK, sK, n - 1, False)
        cute.arch.cp_async_commit_group()

        # mask, online softmax (base 2, scale folded in), rescale O
        S_mn = _acc_mn_view(acc_S)
        O_mn = _acc_mn_view(acc_O)
        cS = cute.make_identity_tensor((bm, bn))
        t0ScS_mn = _acc_mn_view(tiled_mma.get_slice(0).partition_C(cS))
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        scale_log2 = ctx.scale_log2
        if cutlass.const_expr(masked):
            # this thread's accumulator coordinates = thread 0's (compile time) + (row0, col0)
            tScS = thr_mma.partition_C(cS)
            row0 = tScS[0][0]
            col0 = tScS[0][1]
            # key j (tile column c = j - n*bn) is visible to query i iff
            #   j < S_kv  and, causal, j <= i + S_kv - S_q
            col_lim = ctx.s_kv - n * bn - col0
            causal_lim = ctx.m_block * bm + row0 + 1 + ctx.s_kv - ctx.s_q - n * bn - col0
        for r in cutlass.range_constexpr(cute.size(row_max)):
            if cutlass.const_expr(masked):
                lim_r = col_lim
                if cutlass.const_expr(causal):
                    lim_r = cutlass.min(col_lim, causal_lim + t0ScS_mn[r, 0][0])
                for c in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                    S_mn[r, c] = S_mn[r, c] if t0ScS_mn[0, c][1] < lim_r else Float32(_NEG_INF)
            row = S_mn[r, None].load()
            m_prev = row_max[r]
            m_cur = _quad_allreduce(row.reduce(cute.ReductionOp.MAX, m_prev, 0), cute.arch.fmax)
            row_max[r] = m_cur
            # a row with nothing visible yet keeps max -inf: use 0 there, so exp2(-inf - 0) = 0
            m_scaled = (Float32(0.0) if m_cur == Float32(_NEG_INF) else m_cur) * scale_log2
            p = cute.math.exp2(row * scale_log2 - m_scaled, fastmath=True)
            alpha = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
            # per-thread partial row sums; the quad reduction happens once, in the epilogue
            row_sum[r] = row_sum[r] * alpha + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            S_mn[r, None].store(p)
            O_mn[r, None].store(O_mn[r, None].load() * alpha)

        # O += P V, P converted in registers to the A-operand layout
        rP = cute.make_rmem_tensor_like(acc_S, dtype)
        rP.store(acc_S.load().to(dtype))
        tOrP = cute.make_tensor(rP.iterator, _acc_to_a_operand(rP.layout))
        # in 64-column chunks of D (one swizzle atom of V): the V fragments of one chunk are
        # live at a time (plus the prefetched next ones), which keeps D=128/256 under 255 regs
        n_chunks = D // 64
        steps = [(h, kk) for h in range(n_chunks) for kk in range(cute.size(tOrP.shape[2]))]
        acc_O_c = cute.make_tensor(acc_O.iterator, cute.logical_divide(acc_O.layout, (None, None, 8)))

        def v_copy(h, kk):
            if cutlass.const_expr(n_chunks == 1):
                cute.copy(s2r_V, tOsVt[None, None, kk], tOrVt_v[None, None, kk])
            else:
                cute.copy(s2r_V, tOsVt[None, (None, h), kk], tOrVt_v[None, (None, h), kk])

        for i in cutlass.range_constexpr(PF_PV):
            v_copy(*steps[i])
        for i in cutlass.range_constexpr(len(steps)):
            h, kk = steps[i]
            if cutlass.const_expr(i + PF_PV < len(steps)):
                v_copy(*steps[i + PF_PV])
            if cutlass.const_expr(n_chunks == 1):
                cute.gemm(tiled_mma, acc_O, tOrP[None, None, kk], tOrVt[None, None, kk], acc_O)
            else:
                acc_h = acc_O_c[None, None, (None, h)]
                cute.gemm(tiled_mma, acc_h, tOrP[None, None, kk], tOrVt[None, (None, h), kk], acc_h)

    @cute.jit
    def epilogue(ctx):
        """O = acc / rowsum -> smem (the Q buffer) -> 128-bit predicated stores; LSE."""
        tid = _opaque_i32(ctx.tidx)
        tiled_mma = ctx.tiled_mma
        thr_mma = tiled_mma.get_slice(tid)
        acc_O = ctx.acc_O
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        n_rows = cute.size(row_max)
        O_mn = _acc_mn_view(acc_O)
        lse_r = cute.make_rmem_tensor((n_rows,), Float32)
        for r in cutlass.range_constexpr(n_rows):
            total = _quad_allreduce(row_sum[r], lambda a, b_: a + b_)
            inv = Float32(1.0)
            lse_r[r] = Float32(_NEG_INF)  # no visible key: O = 0 (acc is 0), LSE = -inf
            if total > Float32(0.0):
                inv = cute.arch.rcp_approx(total)
                lse_r[r] = (row_max[r] * ctx.scale_log2 + cute.math.log2(total, fastmath=True)) * Float32(LN_2)
            O_mn[r, None].store(O_mn[r, None].load() * inv)

        # all cp.async retired (the Q tile too when no kv block ran) and every warp done with sQ
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        rO = cute.make_rmem_tensor_like(acc_O, dtype)
        rO.store(acc_O.load().to(dtype))
        sO = ctx.sQ
        r2s = ctx.r2s.get_slice(tid)
        cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
        cute.arch.barrier()

        s2g_thr = ctx.s2g.get_slice(tid)
        tOsO = s2g_thr.partition_S(sO)
        tOgO = s2g_thr.partition_D(ctx.gO)
        tOrO = cute.make_rmem_tensor_like(tOsO, dtype)
        cute.autovec_copy(tOsO, tOrO)
        cO = cute.make_identity_tensor((bm, D))
        t0OcO = ctx.s2g.get_slice(0).partition_S(cO)
        o_lim = ctx.s_q - ctx.m_block * bm - s2g_thr.partition_S(cO)[0][0]
        for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
            if t0OcO[0, m, 0][0] < o_lim:
                cute.copy(ctx.s2g, tOrO[None, m, None], tOgO[None, m, None])

        if ctx.write_lse != 0:
            cS = cute.make_identity_tensor((bm, bn))
            tScS = thr_mma.partition_C(cS)
            t0ScS_mn = _acc_mn_view(tiled_mma.get_slice(0).partition_C(cS))
            row0 = tScS[0][0]
            if tScS[0][1] == 0:  # one thread of each quad writes the quad's rows
                row_lim = ctx.s_q - ctx.m_block * bm - row0
                for r in cutlass.range_constexpr(n_rows):
                    rr = t0ScS_mn[r, 0][0]
                    if rr < row_lim:
                        i = Int64(ctx.m_block * bm + row0 + rr)
                        ctx.lse[ctx.lse_off + i * ctx.lse_ss] = lse_r[r]

    @cute.kernel
    def sdpa_prefill_kernel(
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer, o: cute.Pointer, lse: cute.Pointer,
        cu_seqlens_q: cute.Pointer, cu_seqlens_kv: cute.Pointer,
        batch: Int32, seqlen_q: Int32, seqlen_kv: Int32,
        heads_q: Int32, heads_kv: Int32, write_lse: Int32,
        softmax_scale: Float32,
        q_stride_b: Int64, q_stride_s: Int64, q_stride_h: Int64,
        k_stride_b: Int64, k_stride_s: Int64, k_stride_h: Int64,
        v_stride_b: Int64, v_stride_s: Int64, v_stride_h: Int64,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, bidx = cute.arch.block_idx()
        m_block = Int32(m_block)
        head = Int32(head)
        bidx = Int32(bidx)

        # ---------------------------------------------------------------- sequence bounds
        q_start = Int32(0)
        kv_start = Int32(0)
        s_q = seqlen_q
        s_kv = seqlen_kv
        if cutlass.const_expr(ragged):
            q_start = cu_seqlens_q[bidx]
            s_q = cu_seqlens_q[bidx + 1] - q_start
            kv_start = cu_seqlens_kv[bidx]
            s_kv = cu_seqlens_kv[bidx + 1] - kv_start

        if m_block * bm < s_q:
            kv_head = head // (heads_q // heads_kv)

            # -------------------------------------------------------- global tensors
            if cutlass.const_expr(packed):
                # contiguous [B, S, H, D]: 64-bit batch offset, 32-bit offsets inside a batch
                q_row = cute.assume(heads_q * D, divby=_VEC)
                kv_row = cute.assume(heads_kv * D, divby=_VEC)
                q_base = cute.assume(Int64(bidx) * Int64(s_q) * Int64(q_row), divby=_VEC)
                kv_base = cute.assume(Int64(bidx) * Int64(s_kv) * Int64(kv_row), divby=_VEC)
                q_ptr = q + q_base + cute.assume(head * D, divby=_VEC)
                o_ptr = o + q_base + cute.assume(head * D, divby=_VEC)
                k_ptr = k + kv_base + cute.assume(kv_head * D, divby=_VEC)
                v_ptr = v + kv_base + cute.assume(kv_head * D, divby=_VEC)
                q_ss = q_row
                o_ss = q_row
                k_ss = kv_row
                v_ss = kv_row
                lse_off = (Int64(bidx) * Int64(heads_q) + Int64(head)) * Int64(s_q)
                lse_ss = Int64(1)
            else:
                q_ss = cute.assume(q_stride_s, divby=_VEC)
                k_ss = cute.assume(k_stride_s, divby=_VEC)
                v_ss = cute.assume(v_stride_s, divby=_VEC)
                o_ss = cute.assume(o_stride_s, divby=_VEC)
                lse_ss = lse_stride_s
                if cutlass.const_expr(ragged):
                    q_off = Int64(q_start) * q_stride_s + Int64(head) * q_stride_h
                    o_off = Int64(q_start) * o_stride_s + Int64(head) * o_stride_h
                    k_off = Int64(kv_start) * k_stride_s + Int64(kv_head) * k_stride_h
                    v_off = Int64(kv_start) * v_stride_s + Int64(kv_head) * v_stride_h
                    lse_off = Int64(head) * lse_stride_h + Int64(q_start) * lse_stride_s
                else:
                    q_off = Int64(bidx) * q_stride_b + Int64(head) * q_stride_h
                    o_off = Int64(bidx) * o_stride_b + Int64(head) * o_stride_h
                    k_off = Int64(bidx) * k_stride_b + Int64(kv_head) * k_stride_h
                    v_off = Int64(bidx) * v_stride_b + Int64(kv_head) * v_stride_h
                    lse_off = Int64(bidx) * lse_stride_b + Int64(head) * lse_stride_h
                q_ptr = q + cute.assume(q_off, divby=_VEC)
                o_ptr = o + cute.assume(o_off, divby=_VEC)
                k_ptr = k + cute.assume(k_off, divby=_VEC)
                v_ptr = v + cute.assume(v_off, divby=_VEC)

            mQ = cute.make_tensor(q_ptr, cute.make_layout((s_q, D), stride=(q_ss, 1)))
            mO = cute.make_tensor(o_ptr, cute.make_layout((s_q, D), stride=(o_ss, 1)))
            mK = cute.make_tensor(k_ptr, cute.make_layout((s_kv, D), stride=(k_ss, 1)))
            mV = cute.make_tensor(v_ptr, cute.make_layout((s_kv, D), stride=(v_ss, 1)))

            # -------------------------------------------------------- shared memory
            # 64-column (128-byte) rows, 3-bit XOR swizzle of the 16-byte chunks: conflict-free
            # 128-bit cp.async writes and ldmatrix reads
            s_atom = cute.make_composed_layout(
                cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, 64), stride=(64, 1)),
            )
            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)

            # -------------------------------------------------------- copies and MMA
            g2s_atom = cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128,
            )
            thr_layout = cute.make_layout((copy_rows, copy_cols), stride=(copy_cols, 1))
            val_layout = cute.make_layout((1, _VEC))
            s2g_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
            tiled_mma = cute.make_tiled_mma(
                warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)),
                (warps, 1, 1),
                permutation_mnk=(warps * 16, 16, 16),
            )
            ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype)
            ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype)
            r2s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=32)

            ctx = SimpleNamespace(
                tidx=Int32(tidx), m_block=m_block, s_q=s_q, s_kv=s_kv,
                gQ=cute.local_tile(mQ, (bm, D), (m_block, 0)),
                gO=cute.local_tile(mO, (bm, D), (m_block, 0)),
                gK=cute.local_tile(mK, (bn, D), (None, 0)),  # (bn, D, n_blocks)
                gV=cute.local_tile(mV, (bn, D), (None, 0)),
                sQ=storage.sQ.get_tensor(cute.tile_to_shape(s_atom, (bm, D), (0, 1))),
                sK=storage.sK.get_tensor(cute.tile_to_shape(s_atom, (bn, D), (0, 1))),
                sV=storage.sV.get_tensor(cute.tile_to_shape(s_atom, (bn, D), (0, 1))),
                g2s=cute.make_tiled_copy_tv(g2s_atom, thr_layout, val_layout),
                s2g=cute.make_tiled_copy_tv(s2g_atom, thr_layout, val_layout),
                tiled_mma=tiled_mma,
                s2r_Q=cute.make_tiled_copy_A(ldsm, tiled_mma),
                s2r_K=cute.make_tiled_copy_B(ldsm, tiled_mma),
                s2r_V=cute.make_tiled_copy_B(ldsm_t, tiled_mma),
                r2s=cute.make_tiled_copy_C(r2s_atom, tiled_mma),
                scale_log2=softmax_scale * Float32(LOG2_E),
                lse=lse, lse_off=lse_off, lse_ss=lse_ss, write_lse=write_lse,
            )
            # fp32 accumulator of O and the running row max / (per-thread partial) row sum
            ctx.acc_O = cute.make_rmem_tensor(tiled_mma.partition_shape_C((bm, D)), Float32)
            ctx.acc_O.fill(0.0)
            n_rows = cute.size(ctx.acc_O, mode=[0, 1]) * cute.size(ctx.acc_O, mode=[1])
            ctx.row_max = cute.make_rmem_tensor((n_rows,), Float32)
            ctx.row_sum = cute.make_rmem_tensor((n_rows,), Float32)
            ctx.row_max.fill(_NEG_INF)
            ctx.row_sum.fill(0.0)

            # -------------------------------------------------------- kv block range
            n_blocks = (s_kv + (bn - 1)) // bn
            n_max = n_blocks
            n_mask_min = n_max - 1  # non-causal: only the last (sequence-tail) block is masked
            if cutlass.const_expr(causal):
                # the tile's last row sees keys up to m_block*bm + bm - 1 + S_kv - S_q
                lim = m_block * bm + bm + s_kv - s_q
                n_causal = Int32(0)
                if lim > 0:
                    n_causal = (lim + (bn - 1)) // bn
                n_max = cutlass.min(n_blocks, n_causal)
                # blocks n with (n+1)*bn - 1 <= m_block*bm + S_kv - S_q are visible to every row
                first_masked = Int32(0)
                lim_lo = m_block * bm + 1 + s_kv - s_q
                if lim_lo > 0:
                    first_masked = lim_lo // bn
                n_mask_min = cutlass.min(first_masked, n_max - 1)
            # no kv block at all (S_kv = 0, or causal with a tile that sees no key): both loops
            # run 0 times and the epilogue writes O = 0, LSE = -inf
            n_mask_min = cutlass.max(n_mask_min, 0)

            prologue(ctx, n_max)
            # blocks n_max-1 .. n_mask_min with masks (the first one also has predicated loads),
            # then n_mask_min-1 .. 0 without
            for t in cutlass.range(n_max - n_mask_min, unroll=1):
                kv_block(ctx, n_max - 1 - t, True)
            for t in cutlass.range(n_mask_min, unroll=1):
                kv_block(ctx, n_mask_min - 1 - t, False)
            epilogue(ctx)

    @cute.jit
    def sdpa_prefill_host(
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer, o: cute.Pointer, lse: cute.Pointer,
        cu_seqlens_q: cute.Pointer, cu_seqlens_kv: cute.Pointer,
        batch: Int32, seqlen_q: Int32, seqlen_kv: Int32,
        heads_q: Int32, heads_kv: Int32, write_lse: Int32,
        softmax_scale: Float32,
        q_stride_b: Int64, q_stride_s: Int64, q_stride_h: Int64,
        k_stride_b: Int64, k_stride_s: Int64, k_stride_h: Int64,
        v_stride_b: Int64, v_stride_s: Int64, v_stride_h: Int64,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
    ):
        # The real launch is done by the aotc runtime; this one only makes the module well formed.
        sdpa_prefill_kernel(
            q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv,
            batch, seqlen_q, seqlen_kv, heads_q, heads_kv, write_lse, softmax_scale,
            q_stride_b, q_stride_s, q_stride_h,
            k_stride_b, k_stride_s, k_stride_h,
            v_stride_b, v_stride_s, v_stride_h,
            o_stride_b, o_stride_s, o_stride_h,
            lse_stride_b, lse_stride_h, lse_stride_s,
        ).launch(
            grid=[(seqlen_q + (bm - 1)) // bm, heads_q, batch],
            block=[threads, 1, 1],
            smem=smem_size,
        )

    return sdpa_prefill_host


def _placeholders(dtype) -> list:
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem
    args = [make_ptr(dtype, 16, gmem, assumed_align=16) for _ in range(4)]  # q, k, v, o
    args.append(make_ptr(Float32, 16, gmem, assumed_align=4))               # lse
    args.append(make_ptr(Int32, 16, gmem, assumed_align=4))                 # cu_seqlens_q
    args.append(make_ptr(Int32, 16, gmem, assumed_align=4))                 # cu_seqlens_kv
    for p in PARAMS[7:]:
        args.append({"i32": Int32(1), "i64": Int64(8), "f32": Float32(1.0)}[p.kind])
    return args


def _check_params() -> None:
    kinds = [p.kind for p in PARAMS]
    expect = ["ptr"] * 7 + ["i32"] * 6 + ["f32"] + ["i64"] * 15
    if kinds != expect:
        raise RuntimeError(f"sdpa_prefill PARAMS changed ({kinds}); update aotc/kernels/sdpa_prefill.py")


def _compile(variant, dump_dir: str, keep_ptx: bool):
    _check_params()
    if variant.family != "sdpa_prefill":
        raise ValueError(f"not an sdpa_prefill variant: {variant.name}")
    dtype = _DTYPES[variant["dtype"]]
    head_dim = int(variant["head_dim"])
    ragged = variant["layout"] == "ragged"
    causal = bool(variant["causal"])
    packed = variant["strides"] == "packed"
    if ragged and packed:
        raise ValueError(f"{variant.name}: the packed specialization is for dense layouts")
    host = _build(dtype, head_dim, ragged, causal, packed)
    # each compile writes files named after the host function: give each its own dump_dir
    os.makedirs(dump_dir, exist_ok=True)
    opts = f"--gpu-arch {variant.arch} --keep-cubin --dump-dir={dump_dir}" + os.environ.get("AOTC_DEV_OPTS", "")
    if keep_ptx:
        opts += " --keep-ptx"
    compiled = cute.compile(host, *_placeholders(dtype), options=opts)
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise RuntimeError(f"expected one kernel in the module, got {symbols}")
    return compiled, bytes(compiled.__cubin__), str(symbols[0])


def compile(variant, *, dump_dir: str) -> tuple[bytes, str, dict]:
    """Compile one sdpa_prefill variant for variant.arch.

    Returns (cubin bytes, kernel symbol, {"dynamic_smem": bytes}); the entry's parameters are
    exactly aotc.families.sdpa_prefill.PARAMS, in order, and the launch must pass dynamic_smem
    bytes of dynamic shared memory (more than 48 KiB for head_dim 128 and 256: the runtime
    must raise the kernel's max-dynamic-smem attribute).
    """
    _, cubin, symbol = _compile(variant, dump_dir, keep_ptx=False)
    return cubin, symbol, {"dynamic_smem": smem_bytes(int(variant["head_dim"]))}


def compile_with_ptx(variant, *, dump_dir: str) -> tuple[bytes, str, dict, str]:
    """Like compile(), also returning the PTX text (for tests and inspection)."""
    compiled, cubin, symbol = _compile(variant, dump_dir, keep_ptx=True)
    return cubin, symbol, {"dynamic_smem": smem_bytes(int(variant["head_dim"]))}, str(compiled.__ptx__)
