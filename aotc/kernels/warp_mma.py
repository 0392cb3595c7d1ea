"""Warp-level tensor-core building blocks (mma.sync m16n8k16, ldmatrix, 128-bit cp.async) shared by the
portable prefill and the decode kernels, which run on every arch from sm_80 (CuTe DSL, imported only to
compile)."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import cpasync, warp
from cutlass.cutlass_dsl import T, dsl_user_op

DTYPES = {"fp16": cutlass.Float16, "bf16": cutlass.BFloat16}
VEC = 8          # 16-bit elements per 128-bit access
ATOM_COLS = 64   # columns of the smem swizzle atom (128 bytes)
NARROW_COLS = 32  # columns of a narrow tile's atom (64 bytes: fp8 D64's rows, smem_tile_layout)


@dsl_user_op
def opaque_i32(x, *, loc=None, ip=None) -> Int32:
    """x through a volatile mov: LLVM can neither fold it nor hoist it out of a loop. The kernels rebuild
    per-thread addresses from an opaque copy of the thread index in every kv step; otherwise LLVM keeps
    dozens of loop-invariant addresses live across the kv loop, where ptxas spills them."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip,
    ))


def make_warp_mma(dtype, warps: int):
    """warps x 1 x 1 m16n8k16 atoms (warp w owns rows 16w..16w+15 of every 16*warps-row slab); the N
    permutation lets ldmatrix.x4 load B."""
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)), (warps, 1, 1), permutation_mnk=(warps * 16, 16, 16))


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
    view of it at any base offset that is a multiple of 512 elements stays consistent. A 32-column tile
    (64-byte rows: fp8 D64's e4m3 rows as 16-bit pairs) takes 8x32 atoms (Swizzle<2,3,3>: two rows a 128-byte
    line, the 8 rows of an ldmatrix still on 8 distinct groups of 4 banks; offset bits < 8)."""
    width = atom_cols(cols)
    chunks_log2 = (width // VEC).bit_length() - 1  # 16-byte chunks of an atom row: 8 (Swizzle<3,3,3>) or 4 (<2,3,3>)
    atom = cute.make_composed_layout(
        cute.make_swizzle(chunks_log2, 3, 3), 0, cute.make_layout((8, width), stride=(width, 1)))
    return cute.tile_to_shape(atom, (rows, cols), (0, 1))


def atom_cols(cols: int) -> int:
    """Columns of the swizzle atom of a (., cols) smem_tile_layout: a row offset r within a tile is r * this."""
    return NARROW_COLS if cols == NARROW_COLS else ATOM_COLS


def make_g2s(dtype, threads: int, row_cols: int = ATOM_COLS):
    """128-bit cp.async, row_cols / 8 threads along a row of row_cols (64, or 32 for a narrow tile)
    columns, threads * 8 / row_cols rows per pass."""
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=128)
    cols = row_cols // VEC
    return cute.make_tiled_copy_tv(
        atom, cute.make_layout((threads // cols, cols), stride=(cols, 1)), cute.make_layout((1, VEC)))


def make_s2g(dtype, threads: int):
    """128-bit smem -> rmem -> gmem copy (of O), the thread arrangement of make_g2s."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    cols = ATOM_COLS // VEC
    return cute.make_tiled_copy_tv(
        atom, cute.make_layout((threads // cols, cols), stride=(cols, 1)), cute.make_layout((1, VEC)))


def ldmatrix_atoms(dtype):
    """(ldmatrix.x4, ldmatrix.x4.trans) copy atoms: Q and K fragments, and V read transposed."""
    return (cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype),
            cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype))


@cute.jit
def gemm_ldmatrix(mma, acc, s2r_a, tCsA, tCrA_v, tCrA, s2r_b, tCsB, tCrB_v, tCrB):
    """acc += A B over the k slices of two smem operands: ldmatrix of slice k+1 (into the retiled views
    tCrA_v / tCrB_v of the fragments) is issued before the MMAs of slice k (a register double buffer)."""
    n_k = cute.size(tCsA.shape[2])
    cute.copy(s2r_a, tCsA[None, None, 0], tCrA_v[None, None, 0])
    cute.copy(s2r_b, tCsB[None, None, 0], tCrB_v[None, None, 0])
    for kk in cutlass.range_constexpr(n_k):
        if cutlass.const_expr(kk + 1 < n_k):
            cute.copy(s2r_a, tCsA[None, None, kk + 1], tCrA_v[None, None, kk + 1])
            cute.copy(s2r_b, tCsB[None, None, kk + 1], tCrB_v[None, None, kk + 1])
        cute.gemm(mma, acc, tCrA[None, None, kk], tCrB[None, None, kk], acc)


# ---------------------------------------------------------------------------- static layout checks

def check_accumulator_views(thr, cS, t0S, who: str) -> list[str]:
    """Layout facts of one thread's slice `thr` of a warp MMA over the S tile's coordinates `cS`
    (evaluated on static layouts, inside a jit trace; t0S: thread 0's accumulator in the mn view):

    1. P, the fp32 S accumulator viewed by acc_to_a_operand, holds at each A-operand slot the
       (row, col) the MMA's A partition of S expects there (P feeds O += P V from registers).
    2. Accumulator coordinates are thread 0's (compile time) plus the thread's first element's
       (masks, row limits and the LSE rows rely on it).
    """
    errors = []
    tScS = thr.partition_C(cS)
    p_view = cute.make_tensor(tScS.iterator, acc_to_a_operand(tScS.layout))
    a_part = thr.partition_A(cS)
    if cute.size(p_view) != cute.size(a_part):
        errors.append(f"P view has {cute.size(p_view)} elements, the A partition {cute.size(a_part)}")
    else:
        for i in range(cute.size(a_part)):
            if tuple(p_view[i]) != tuple(a_part[i]):
                errors.append(f"{who}: P slot {i} holds {p_view[i]}, the MMA wants {a_part[i]}")
                break
    tS = acc_mn_view(tScS)
    r0, c0 = tScS[0]
    for r in range(cute.size(tS, mode=[0])):
        for c in range(cute.size(tS, mode=[1])):
            want = (t0S[r, 0][0] + r0, t0S[0, c][1] + c0)
            if tuple(tS[r, c]) != want:
                errors.append(f"{who}: S element ({r},{c}) is at {tS[r, c]}, not {want}")
    return errors


def run_traced(check, *args) -> list[str]:
    """check(*args) (a function of static layouts returning problems) run inside a jit trace: no GPU."""
    out: list[str] = []

    @cute.jit
    def _trace():
        out.extend(check(*args))

    _trace()
    return out
