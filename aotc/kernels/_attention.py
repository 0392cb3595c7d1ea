"""What the attention kernels share (CuTe DSL, imported only to compile).

Constants; the quad reduction of accumulator rows; the m16n8k16 (mma.sync) accumulator views
of sdpa_prefill and sdpa_decode; their 64-column swizzled shared-memory tile and its 128-bit
copies; and, for the prefill families, a sequence's bounds and a query tile's kv-block range
under the bottom-right causal convention (key j visible to query i iff j < S_kv and, causal,
j <= i + S_kv - S_q).

The families' source digests cover this file (aotc.families.Family.source_digest): editing it
rebuilds every kernel that uses it.
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import T, dsl_user_op

DTYPES = {"fp16": cutlass.Float16, "bf16": cutlass.BFloat16}

LOG2_E = 1.4426950408889634074
LN_2 = 0.6931471805599453094
NEG_INF = -math.inf
VEC = 8          # 16-bit elements per 128-bit access
ATOM_COLS = 64   # columns of the smem swizzle atom (128 bytes)


def quad_allreduce(val, op):
    """Reduce over the 4 threads of a quad (the threads sharing accumulator rows)."""
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31))
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31))
    return val


@dsl_user_op
def opaque_i32(x, *, loc=None, ip=None) -> Int32:
    """x through a volatile mov: LLVM can neither fold it nor hoist it out of a loop."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    ))


# ---------------------------------------------------------------------------- mma.sync m16n8k16

def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an m16n8 accumulator fragment ((2,2), MMA_M, MMA_N) as (rows, cols) of this thread."""
    lay = cute.make_layout(acc.layout.shape)  # compact column-major over the same shape
    mn = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def acc_to_a_operand(layout: cute.Layout) -> cute.Layout:
    """(4, MMA_M, MMA_N) accumulator layout -> ((4, 2), MMA_M, MMA_N / 2) A-operand layout.

    Two neighbouring n8 accumulator tiles of an m16n8k16 MMA hold exactly the 16 columns of one
    k16 A fragment (cols 2t, 2t+1 of the first tile are a0/a1 and a2/a3, of the second a4..a7).
    The kernels' verify_mappings() check this against the MMA's own A partition.
    """
    d = cute.logical_divide(layout, (None, None, 2))
    return cute.make_layout(
        ((d.shape[0], d.shape[2][0]), d.shape[1], d.shape[2][1]),
        stride=((d.stride[0], d.stride[2][0]), d.stride[1], d.stride[2][1]),
    )


def smem_tile_layout(rows: int, cols: int):
    """(rows, cols) in 8x64 atoms, XOR-swizzled 16-byte chunks (Swizzle<3,3,3>): conflict-free
    128-bit cp.async stores and ldmatrix loads. The swizzle acts on offset bits < 9 (elements), so a
    view of it at any base offset that is a multiple of 512 elements stays consistent."""
    atom = cute.make_composed_layout(
        cute.make_swizzle(3, 3, 3), 0, cute.make_layout((8, ATOM_COLS), stride=(ATOM_COLS, 1)))
    return cute.tile_to_shape(atom, (rows, cols), (0, 1))


def make_g2s(dtype, threads: int):
    """128-bit cp.async, 8 threads along a 64-column row, threads/8 rows per pass."""
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128)
    cols = ATOM_COLS // VEC
    return cute.make_tiled_copy_tv(
        atom, cute.make_layout((threads // cols, cols), stride=(cols, 1)), cute.make_layout((1, VEC)))


def make_s2g(dtype, threads: int):
    """128-bit smem -> rmem -> gmem copy (of O), the thread arrangement of make_g2s."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    cols = ATOM_COLS // VEC
    return cute.make_tiled_copy_tv(
        atom, cute.make_layout((threads // cols, cols), stride=(cols, 1)), cute.make_layout((1, VEC)))


# ---------------------------------------------------------------------------- prefill tiles

@cute.jit
def seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q, cu_seqlens_kv, ragged: cutlass.Constexpr):
    """(q_start, s_q, kv_start, s_kv) of sequence bidx: dense, the extents; ragged, from cu_seqlens."""
    q_start = Int32(0)
    kv_start = Int32(0)
    s_q = seqlen_q
    s_kv = seqlen_kv
    if cutlass.const_expr(ragged):
        q_start = cu_seqlens_q[bidx]
        s_q = cu_seqlens_q[bidx + 1] - q_start
        kv_start = cu_seqlens_kv[bidx]
        s_kv = cu_seqlens_kv[bidx + 1] - kv_start
    return q_start, s_q, kv_start, s_kv


@cute.jit
def kv_block_range(m_block, s_q, s_kv, bm: cutlass.Constexpr, bn: cutlass.Constexpr, causal: cutlass.Constexpr):
    """(n_max, n_mask_min) for query tile m_block (bm rows) over kv blocks of bn keys: blocks
    0 .. n_max-1 are visited, n_mask_min .. n_max-1 need a mask (the sequence tail; causal, the
    blocks crossing the diagonal). No visible block (S_kv = 0, or a causal tile that sees no key):
    n_max = 0."""
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
    return n_max, cutlass.max(n_mask_min, 0)


# ---------------------------------------------------------------------------- online softmax

# Lazy rescaling (the portable prefill kernel, where D > block_n): a row's running max is kept until a
# new score exceeds it by more than this many log2 units, so p <= 2^8 (exact in fp32, representable in
# fp16/bf16) and alpha is exactly 1 for most kv blocks; a warp whose rows all have alpha = 1 then skips
# the O rescale. The final O / rowsum and LSE use the same kept max, so the result is unchanged.
MAX_SLACK_LOG2 = 8.0


@cute.jit
def softmax_row(S_mn, row_max, row_sum, r: cutlass.Constexpr, scale_log2, max_slack_log2: cutlass.Constexpr = 0.0):
    """Online-softmax step for this thread's row r of a score tile (already masked with -inf):
    S_mn[r] becomes p = 2^(s * scale_log2 - max * scale_log2), row_max[r] the running max (over
    the quad), row_sum[r] this thread's partial running sum; returns the factor alpha by which
    the row's earlier O and sum must be scaled. A row that has seen no visible key keeps max
    -inf and takes offset 0, so every p is 2^-inf = 0 (not NaN)."""
    row = S_mn[r, None].load()
    m_prev = row_max[r]
    m_cur = quad_allreduce(row.reduce(cute.ReductionOp.MAX, m_prev, 0), cute.arch.fmax)
    if cutlass.const_expr(max_slack_log2 > 0.0):
        # keep the running max while the new one exceeds it by at most the slack (p <= 2^slack, exact in
        # fp32 and in the P dtype): alpha is then 1 and the O rescale can be skipped. A first finite max
        # replaces -inf (the difference is +inf); -inf - -inf is NaN, which also keeps m_prev = -inf.
        m_cur = m_prev if (m_cur - m_prev) * scale_log2 <= Float32(max_slack_log2) else m_cur
    row_max[r] = m_cur
    m_scaled = (Float32(0.0) if m_cur == Float32(NEG_INF) else m_cur) * scale_log2
    p = cute.math.exp2(row * scale_log2 - m_scaled, fastmath=True)
    alpha = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
    # per-thread partial row sums; the quad reduction is done once, at the end
    row_sum[r] = row_sum[r] * alpha + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    S_mn[r, None].store(p)
    return alpha


@cute.jit
def store_converted_pairs(dst: cute.Tensor, src: cute.Tensor):
    """dst = src in dst's element type. src and dst: register tensors of one compact layout.

    A length that is not a power of two goes two neighbouring elements at a time (one
    cvt.rn.bf16x2.f32 or f16x2 per pair): converted whole (40 values per thread for a 64 x 80 tile),
    LLVM converted half the bf16 values one by one and merged the halves with PRMTs, and in
    sdpa_prefill_sm90 D256 ptxas scheduled those merges between the PV wgmmas that read the pairs and
    split the GEMM into one wgmma group each: the wait for S then also waited for 4/5 of PV. At D128
    block_n 176 (88 values) the 16-bit halves were packed with movs right before each PV wgmma, and
    ptxas gave every one of the 11 its own warpgroup.arrive and wait (ptxas -v: "warpgroup.arrive is
    injected ... to allow use of registers in GMMA"), which made that tile 0.63-0.83x the 128-wide one."""
    n = cute.size(src)
    if cutlass.const_expr(n & (n - 1) == 0):  # a power of two: LLVM pairs them all by itself
        dst.store(src.load().to(dst.element_type))
    else:
        src2 = cute.make_tensor(src.iterator, cute.make_layout((2, n // 2)))
        dst2 = cute.make_tensor(dst.iterator, cute.make_layout((2, n // 2)))
        for j in cutlass.range_constexpr(n // 2):
            dst2[None, j].store(src2[None, j].load().to(dst.element_type))


@cute.jit
def normalize_rows(O_mn, row_max, row_sum, scale_log2, lse_r):
    """End of the kv loop: O /= row sum (over the quad) and lse_r = natural-log LSE per row; a row
    that saw no key keeps O = 0 (its accumulator is 0) and gets LSE = -inf."""
    for r in cutlass.range_constexpr(cute.size(row_max)):
        total = quad_allreduce(row_sum[r], lambda a, b_: a + b_)
        inv = Float32(1.0)
        lse_r[r] = Float32(NEG_INF)
        if total > Float32(0.0):
            inv = cute.arch.rcp_approx(total)
            lse_r[r] = (row_max[r] * scale_log2 + cute.math.log2(total, fastmath=True)) * Float32(LN_2)
        O_mn[r, None].store(O_mn[r, None].load() * inv)
