"""e4m3 (fp8_e4m3fn) conversions of the kernels that read or write an fp8 KV cache (aotc.families.kv_dtype).

Dequantization to fp16 is exact (every e4m3 value, subnormals included, is an fp16 normal):
cvt.rn.f16x2.e4m3x2, two values an instruction (sm_89+), in registers after ldmatrix brought the bytes in
(decode's MMAs run in fp16 over fp8 caches, aotc.kernels.sdpa_decode). An integer route to bf16 takes five
instructions a word against the conversion's two; decode with it ran at 1.00x the bf16 step against
1.085x with the conversion and fp16 MMAs (same run, on the H200), so it was dropped.

Fragments (ldmatrix of e4m3 bytes seen as 16-bit pairs, m16n8k16 fp16 B operands; a fragment's 32-bit words
are (v1, n-tile, k-step) = v1 + 2 n + 4 k with v1 0 for rows 2c, 2c+1 and 1 for rows 2c+8, 2c+9 of the
thread's c = lane % 4, as sdpa_decode checks at trace time):
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
    import cutlass.cute as cute

    for i in range(cute.size(frag)):
        if cute.crd2idx(i, frag.layout) != i:
            raise ValueError(f"fragment layout {frag.layout} is not compact column-major")
    flat = cute.make_tensor(frag.iterator, cute.make_layout(cute.size(frag)))
    return cute.recast_tensor(flat, Int32)
