"""e4m3 (fp8_e4m3fn) conversions of the kernels that read or write an fp8 KV cache (aotc.families.kv_dtype).

Dequantization to fp16 is exact (every e4m3 value, subnormals included, is an fp16 normal):
cvt.rn.f16x2.e4m3x2, two values an instruction (sm_89+), what decode uses (its MMAs run in fp16 over
fp8 caches, aotc.kernels.sdpa_decode). e4m3x4_to_16bit does the same with integer ops and one fma per two
values, for fp16 or bf16: e4m3's sign-exponent-mantissa bits, placed in a 16-bit float's sign and top
exponent/mantissa bits, are that float's value times 2^-8 (fp16: exponent bias 15 vs 7) or 2^-120 (bf16:
127 vs 7), subnormals included; an fma by 2^8 or 2^120 gives the e4m3 value itself (five instructions a
word against the conversion's two: kept for archs or dtypes the instruction lacks). NaN bytes (0x7f, 0xff)
become finite values (480) there: kv_write never stores them (it saturates).

Quantization (kv_write): cvt.rn.satfinite.e4m3x2.f32, round to nearest even, saturating to +-448
(NaN stays NaN), sm_89 and later.
"""
import cutlass
from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

# per 16-bit dtype: (mask of the shifted exponent/mantissa bits, shift, 2^bias as a 16-bit pair, fma type)
_DEQUANT = {
    "bf16": ("0x07f007f0", 4, "0x7b807b80", "bf16x2"),   # 2^120
    "fp16": ("0x3f803f80", 1, "0x5c005c00", "f16x2"),    # 2^8
}


def dtype_key(dtype) -> str:
    return "bf16" if dtype is cutlass.BFloat16 else "fp16"


@dsl_user_op
def e4m3x4_to_16bit(x, dtype_name: str, *, loc=None, ip=None) -> tuple:
    """The 4 e4m3 values in x's bytes 0..3 as two words of 16-bit pairs (bytes 0, 1 | bytes 2, 3; the
    lower byte in the lower half), exactly."""
    mask, shift, bias, fma_type = _DEQUANT[dtype_name]
    asm = (
        "{\n.reg .b32 lo, hi, t, b, nz;\n"
        # lo = [byte1, 0, byte0, 0], hi = [byte3, 0, byte2, 0]: each value in the top byte of a 16-bit lane
        "prmt.b32 lo, $2, 0, 0x1404;\nprmt.b32 hi, $2, 0, 0x3424;\n"
        f"mov.b32 b, {bias};\nmov.b32 nz, 0x80008000;\n"
        f"shr.b32 t, lo, {shift};\nand.b32 t, t, {mask};\nand.b32 lo, lo, 0x80008000;\nor.b32 lo, lo, t;\n"
        f"shr.b32 t, hi, {shift};\nand.b32 t, t, {mask};\nand.b32 hi, hi, 0x80008000;\nor.b32 hi, hi, t;\n"
        # times 2^bias, plus -0 (keeps the sign of zeros)
        f"fma.rn.{fma_type} $0, lo, b, nz;\nfma.rn.{fma_type} $1, hi, b, nz;\n}}"
    )
    words = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 2), [Int32(x).ir_value(loc=loc, ip=ip)], asm, "=r,=r,r",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), words, [i], loc=loc, ip=ip)) for i in range(2))


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
