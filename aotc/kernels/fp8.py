"""e4m3 (fp8_e4m3fn) conversions of the kernels that read or write an fp8 KV cache (aotc.families.kv_dtype).

Dequantization to fp16 is exact (every e4m3 value, subnormals included, is an fp16 normal):
cvt.rn.f16x2.e4m3x2, two values an instruction (sm_89+), in registers after ldmatrix brought the bytes in
(the warp-MMA kernels, aotc.kernels.sdpa_decode and sdpa_prefill's paged layouts, run their MMAs in fp16 over
fp8 caches through the blocks at the end of this module; the Hopper kernel converts whole tiles in its producer
warpgroup instead, aotc.kernels.sdpa_prefill_sm90). An integer route to bf16 takes five instructions a word
against the conversion's two; decode with it ran at 1.00x the bf16 step against 1.085x with the conversion and
fp16 MMAs (same run, on the H200), so it was dropped.

Fragments (ldmatrix of e4m3 bytes seen as 16-bit pairs, m16n8k16 fp16 B operands; a fragment's 32-bit words
are (v1, n-tile, k-step) = v1 + 2 n + 2 N k over its N n-tiles, with v1 0 for rows 2c, 2c+1 and 1 for rows
2c+8, 2c+9 of the thread's c = lane % 4; fragment_words checks the fragments compact at trace time, and
tests/test_fp8_fragments.py emulates the word moves for every shape the kernels use):
  K (non-transposed ldmatrix): a word holds bytes 4c .. 4c+3 of one key, the d's 4c, 4c+1 | 4c+2, 4c+3 of
      a 16-byte block, converted into the two words of one k16 step; the MMA's k index 2c + e then stands
      for d = 4c + e and 8 + 2c + e for d = 4c + 2 + e (fp8_column), an order Q is stored in too.
  V (ldmatrix.trans): a word holds (key 2c: d 2g, 2g+1 | key 2c+1: d 2g, 2g+1) of a 16-d block; one permute
      makes (keys 2c, 2c+1 at d 2g | at d 2g+1), the B words of two n-tiles: O's n-tile t of a 16-d block
      holds d = 2g + (t % 2), un-permuted when O leaves registers.

Quantization (kv_write): cvt.rn.satfinite.e4m3x2.f32, round to nearest even, saturating to +-448
(NaN stays NaN), sm_89 and later.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

@dsl_user_op
def f32x2_to_e4m3x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Two fp32 values as e4m3 bytes (lo in byte 0, hi in byte 1; bits 16.. zero): round to nearest even,
    saturating to +-448."""
    return Int32(llvm.inline_asm(
        T.i32(), [cutlass.Float32(hi).ir_value(loc=loc, ip=ip), cutlass.Float32(lo).ir_value(loc=loc, ip=ip)],
        "{\n.reg .b16 p;\ncvt.rn.satfinite.e4m3x2.f32 p, $1, $2;\ncvt.u32.u16 $0, p;\n}", "=r,f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def e4m3x4_to_f16x2x2(x, *, loc=None, ip=None) -> tuple:
    """The 4 e4m3 values in x's bytes 0..3 as two words of fp16 pairs (bytes 0, 1 | bytes 2, 3; the lower
    byte in the lower half), exactly: cvt.rn.f16x2.e4m3x2 on each half of x."""
    words = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 2), [Int32(x).ir_value(loc=loc, ip=ip)],
        "{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, $2;\ncvt.rn.f16x2.e4m3x2 $0, lo;\ncvt.rn.f16x2.e4m3x2 $1, hi;\n}",
        "=r,=r,r", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), words, [i], loc=loc, ip=ip)) for i in range(2))


@dsl_user_op
def pow2(e, *, loc=None, ip=None) -> cutlass.Float32:
    """2^e exactly for an int32 e in [-126, 127] (the float with exponent field e + 127)."""
    bits = (Int32(e) + Int32(127)) << Int32(23)
    return cutlass.Float32(llvm.inline_asm(
        T.f32(), [bits.ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=f,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def exponent_of(x, *, loc=None, ip=None) -> Int32:
    """floor(log2(x)) of a positive normal float32 x (its exponent field less 127); 0 gives -127."""
    bits = Int32(llvm.inline_asm(
        T.i32(), [cutlass.Float32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))
    return ((bits >> Int32(23)) & Int32(255)) - Int32(127)


@dsl_user_op
def e4m3_columns_to_f16x2x2(x, *, loc=None, ip=None) -> tuple:
    """x's bytes (a0, a1, b0, b1), a0 a1 one row's two columns and b0 b1 the next row's, as the fp16 pairs
    (a0, b0) and (a1, b1): each column's two rows (V's transposed fragment)."""
    words = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 2), [Int32(x).ir_value(loc=loc, ip=ip)],
        "{\n.reg .b32 t;\n.reg .b16 lo, hi;\nprmt.b32 t, $2, 0, 0x3120;\nmov.b32 {lo, hi}, t;\n"
        "cvt.rn.f16x2.e4m3x2 $0, lo;\ncvt.rn.f16x2.e4m3x2 $1, hi;\n}",
        "=r,=r,r", has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), words, [i], loc=loc, ip=ip)) for i in range(2))


def fp8_column(d):
    """The MMA k index (within a 16-wide step) that stands for d (0..15) of K's e4m3 fragments: 4c + e ->
    2c + e for e < 2, 8 + 2c + e - 2 otherwise (see the module docstring). Works on ints and Int32."""
    return ((d >> 2) << 1) + (d & 1) + (((d >> 1) & 1) << 3)


def fragment_words(frag):
    """A register fragment's 32-bit words, flat: word w holds the elements of flat (column-major) coordinates
    2w, 2w+1. Checked while tracing: the fragment's layout must be compact column-major (make_fragment_A/B
    follow the smem strides, which for D256 put the k-steps out of order)."""
    for i in range(cute.size(frag)):
        if cute.crd2idx(i, frag.layout) != i:
            raise ValueError(f"fragment layout {frag.layout} is not compact column-major")
    flat = cute.make_tensor(frag.iterator, cute.make_layout(cute.size(frag)))
    return cute.recast_tensor(flat, Int32)


# ---------------------------------------------------------------------------- the attention kernels' fp8 blocks
# Shared by the kernels that read e4m3 K/V with warp-level MMAs (sdpa_decode, sdpa_prefill's paged layouts): the
# ring or tile holds e4m3 rows seen as 16-bit pairs, ldmatrix loads them as it loads 16-bit tiles, the fragments
# are converted in registers and the MMAs run in fp16, Q rewritten in fp16 (rewrite_q_f16).

Q_F16_HEADROOM = 13  # rewrite_q_f16: the largest scaled |q| lies in [2^13, 2^14)


def o_column(c):
    """The column d of O that accumulator column c holds after gemm_pv_e4m3 (its n-tile t of a 16-column group
    holds d = 16 (t // 2) + 2 g + t % 2): bits 0-3 permuted, the rest kept. Works on ints and Int32."""
    return ((c >> 4) << 4) + ((c & 7) << 1) + ((c >> 3) & 1)


@cute.jit
def rewrite_q_f16(thr_copy, sQ, sQ16, q_dtype: cutlass.Constexpr, red, warps: cutlass.Constexpr, tid):
    """Rewrite the Q tile in smem (sQ: q_dtype; sQ16: the same bytes as fp16, same layout) as fp16 times 2^-s,
    s = floor(log2(max |q|)) - Q_F16_HEADROOM over the CTA's rows (the largest scaled |q| in [2^13, 2^14): fp16
    holds every bf16 query to its full precision but for values 2^27 below the largest); returns 2^s, which the
    softmax scale takes. Each thread rewrites the chunks it copied (thr_copy: its slice of the tiled copy that
    brought Q in; landed and visible: the caller waited and synchronized), each value at column fp8_column(d) of
    its 16 (the order in which gemm_qk_e4m3 hands the MMA K's bytes). red: warps fp32 words of scratch smem
    nobody reads or writes meanwhile (the block-wide max). Every thread of the CTA calls it (two barriers)."""
    src = thr_copy.partition_D(sQ)
    x = cute.make_rmem_tensor(src.shape, q_dtype)
    cute.autovec_copy(src, x)
    xf = cute.make_rmem_tensor(src.shape, cutlass.Float32)
    xf.store(x.load().to(cutlass.Float32))
    m = cutlass.Float32(0.0)
    for i in cutlass.range_constexpr(cute.size(xf)):
        m = cute.arch.fmax(m, cute.arch.fmax(xf[i], -xf[i]))
    for off in (16, 8, 4, 2, 1):
        m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=off, mask=-1, mask_and_clamp=31))
    if tid & 31 == 0:
        red[tid >> 5] = m
    cute.arch.barrier()
    for w in cutlass.range_constexpr(warps):
        m = cute.arch.fmax(m, red[w])
    e = cutlass.max(cutlass.min(exponent_of(m) - Q_F16_HEADROOM, Int32(120)), Int32(-120))  # (m = 0: -120)
    xf.store(xf.load() * pow2(-e))
    h = cute.make_rmem_tensor(src.shape, cutlass.Float16)
    h.store(xf.load().to(cutlass.Float16))
    cute.arch.barrier()  # every thread has read its Q (and the maxima) before any is rewritten
    coords = thr_copy.partition_D(cute.make_identity_tensor((cute.size(sQ, mode=[0]), cute.size(sQ, mode=[1]))))
    for i in cutlass.range_constexpr(cute.size(h)):
        r, d = coords[i]
        sQ16[r, (d & ~15) | fp8_column(d & 15)] = h[i]
    return pow2(e)


@cute.jit
def gemm_qk_e4m3(mma, thr_mma, s2r_Q, s2r_K, sQ16, sK8, acc_S, head_dim: cutlass.Constexpr):
    """acc_S += Q K^T over e4m3 K: sQ16 the (rows, D) fp16 Q of rewrite_q_f16, sK8 the (keys, D/2) e4m3 pairs.
    K's pairs come in by ldmatrix a 32-byte slice of D at a time (the next slice's before this one's MMAs), each
    slice two k16 steps of fp16 fragments once converted; Q's fragments by ldmatrix a k16 step before its MMAs
    (held across a kv loop they cost registers the decode kernel needed for its CTAs an SM)."""
    tSsQ = s2r_Q.partition_S(sQ16)
    tSsK = s2r_K.partition_S(sK8)
    tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ16))
    tSrQ_v = s2r_Q.retile(tSrQ)
    keys = cute.size(sK8, mode=[0])
    tSrK16 = cute.make_rmem_tensor(thr_mma.partition_shape_B((keys, head_dim)), cutlass.Float16)  # fp16 K
    # the loaded pairs in a compact column-major fragment, so word w is (v1, n-tile, k-step) in order:
    # make_fragment_B follows the smem strides (D256's two swizzle atoms made its k-steps 4, 8, 1, 2, ...)
    tSrK = cute.make_rmem_tensor(thr_mma.make_fragment_B(thr_mma.partition_B(sK8)).shape, cutlass.Float16)
    tSrK_v = s2r_K.retile(tSrK)
    loaded, real = fragment_words(tSrK), fragment_words(tSrK16)
    n_t = cute.size(tSrK.shape[1])
    n_k = cute.size(tSsK.shape[2])
    cute.copy(s2r_K, tSsK[None, None, 0], tSrK_v[None, None, 0])
    for kk in cutlass.range_constexpr(n_k):
        if cutlass.const_expr(kk + 1 < n_k):
            cute.copy(s2r_K, tSsK[None, None, kk + 1], tSrK_v[None, None, kk + 1])
        # word (v1, n-tile, k-step) = v1 + 2 n + 2 n_t k (module docstring): a 32-byte slice kk of the loaded
        # pairs is the k16 steps 2kk (its v1 = 0 words) and 2kk + 1 (v1 = 1) of the MMA's K
        for nt in cutlass.range_constexpr(n_t):
            for j in cutlass.range_constexpr(2):
                lo, hi = e4m3x4_to_f16x2x2(loaded[j + 2 * nt + 2 * n_t * kk])
                real[2 * nt + 2 * n_t * (2 * kk + j)] = lo
                real[1 + 2 * nt + 2 * n_t * (2 * kk + j)] = hi
        for j in cutlass.range_constexpr(2):
            cute.copy(s2r_Q, tSsQ[None, None, 2 * kk + j], tSrQ_v[None, None, 2 * kk + j])
        for j in cutlass.range_constexpr(2):
            cute.gemm(mma, acc_S, tSrQ[None, None, 2 * kk + j], tSrK16[None, None, 2 * kk + j], acc_S)


@cute.jit
def gemm_pv_e4m3(mma, thr_mma, s2r_V, sV8, tOrP, accs):
    """O += P V over e4m3 V: sV8 the (keys, D/2) pairs, tOrP P as the fp16 A operand (its k-steps the keys'
    16s), accs the accumulators of O's 64-column chunks. Per k-step, ldmatrix.trans brings (key, 2 d's) pairs
    of the tile's whole width (a view at a column offset inside a swizzle atom, not a multiple of 512 elements,
    would read other rows: warp_mma.smem_tile_layout), and each word becomes the B words of two n-tiles
    (module docstring): O's n-tile t of a chunk holds d = 16 (t // 2) + 2 g + t % 2 of it (o_column)."""
    cols = cute.size(sV8, mode=[1])
    keys = cute.size(sV8, mode=[0])
    sVt = cute.composition(sV8, cute.make_layout((cols, keys), stride=(keys, 1)))  # (pairs, keys)
    # ((2, 2), cols / 8, keys / 16), compact column-major (as K's loaded pairs in gemm_qk_e4m3)
    pairs = cute.make_rmem_tensor(thr_mma.make_fragment_B(thr_mma.partition_B(sVt)).shape, cutlass.Float16)
    src = s2r_V.partition_S(sVt)
    dst = s2r_V.retile(pairs)
    loaded = fragment_words(pairs)
    n_all = cute.size(pairs.shape[1])   # n-tiles of 8 pairs in the tile
    n_chunks = len(accs)
    n_u = n_all // n_chunks             # of them per 64 columns of D
    n_kk = cute.size(tOrP.shape[2])
    for kk in cutlass.range_constexpr(n_kk):
        cute.copy(s2r_V, src[None, None, kk], dst[None, None, kk])
        for h in cutlass.range_constexpr(n_chunks):
            frag = cute.make_rmem_tensor(thr_mma.partition_shape_B((64, keys)), cutlass.Float16)  # V^T
            real = fragment_words(frag)
            for u in cutlass.range_constexpr(n_u):
                for v1 in cutlass.range_constexpr(2):
                    even, odd = e4m3_columns_to_f16x2x2(loaded[v1 + 2 * (h * n_u + u) + 2 * n_all * kk])
                    real[v1 + 2 * (2 * u) + 4 * n_u * kk] = even
                    real[v1 + 2 * (2 * u + 1) + 4 * n_u * kk] = odd
            cute.gemm(mma, accs[h], tOrP[None, None, kk], frag[None, None, kk], accs[h])
