"""Hopper (sm_90a) building blocks: wgmma accumulator views, 128-byte-swizzled K-major smem for TMA and
wgmma, one-group GEMM issue, and the register conversion of P (CuTe DSL, imported only to compile)."""
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View a wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) as (rows, cols) of this thread (N = 8: ((2, 2),
    MMA_M, MMA_N))."""
    lay = acc.layout
    n8, n8_stride = (lay.shape[0][2], lay.stride[0][2]) if len(lay.shape[0]) == 3 else (1, 0)
    mn = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], n8, lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], n8_stride, lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, mn)


def acc_to_a_operand(layout: cute.Layout) -> cute.Layout:
    """((2, 2, N/8), MMA_M, MMA_N) accumulator layout -> ((2, 2, 2), MMA_M, (N/16, MMA_N)).

    Two neighbouring n8 column groups of the first GEMM's accumulator are exactly the 16 k
    values of one k16 slice of the second GEMM's A operand (registers a0..a7).
    """
    d = cute.logical_divide(layout, ((None, None, 2), None, None))
    return cute.make_layout(
        ((d.shape[0][0], d.shape[0][1], d.shape[0][2][0]), d.shape[1], (d.shape[0][2][1], d.shape[2])),
        stride=((d.stride[0][0], d.stride[0][1], d.stride[0][2][0]), d.stride[1],
                (d.stride[0][2][1], d.stride[2])),
    )


def smem_layout(dtype, rows: int, head_dim: int, stages: int, chunks_inner: bool = False):
    """(rows, D, stages), K-major 128-byte-swizzled wgmma atoms (8 x 64) stacked along rows first,
    then along D: each 64-column chunk of a stage is one contiguous TMA box of rows x 128 bytes. chunks_inner:
    along D first, then rows: each 8-row group's chunks side by side ([stage][8-row group][chunk][8 x 64]), so a
    box of whole rows (every chunk) of 8-row groups is contiguous (wgmma then steps 8-row groups by D x 16 bytes)."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, head_dim), dtype)
    return cute.tile_to_shape(atom, (rows, head_dim, stages), (1, 0, 2) if chunks_inner else (0, 1, 2))


def gemm(tiled_mma, acc, frag_a, frag_b, zero_init: bool, also=None):
    """Issue acc (+)= A B over every k slice as one wgmma group (the caller waits with wait_group).
    also: (tiled_mma, acc, frag_b) of a second GEMM of the same A, accumulated into its acc in the same group."""
    warpgroup.fence()
    gemms = [(tiled_mma, acc, frag_b, zero_init)] + ([(also[0], also[1], also[2], False)] if also else [])
    for mma, c, b, zero in gemms:
        atom = cute.make_mma_atom(mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, not zero)
        for k in range(cute.size(frag_a.shape[2])):  # static: a plain Python loop (not traced)
            cute.gemm(atom, c, frag_a[None, None, k], b[None, None, k], c)
            atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


@cute.jit
def store_converted_pairs(dst: cute.Tensor, src: cute.Tensor):
    """dst = src in dst's element type. src and dst: register tensors of one compact layout.

    A length that is not a power of two goes two neighbouring elements at a time (one
    cvt.rn.bf16x2.f32 or f16x2 per pair): converted whole (40 values per thread for a 64 x 80 tile),
    LLVM converted half the bf16 values one by one and merged the halves with PRMTs, and in
    the Hopper prefill at D256 ptxas scheduled those merges between the PV wgmmas that read the pairs and
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
