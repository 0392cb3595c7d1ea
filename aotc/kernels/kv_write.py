"""CuTe DSL kernel for the kv_write family (see aotc.families.kv_write).

CTA (x, h) = (block_idx.x, block_idx.y) of THREADS threads copies KV head h of TOKENS = R * TPC tokens
from token x * TOKENS on: rows of CPR = D / 8 chunks of 16 bytes, TPC = THREADS / CPR rows at a time,
R = ROWS_PER_THREAD times. Thread t takes chunk c = t % CPR of the tokens x * TOKENS + t // CPR + r * TPC
(r < R), so a warp reads 32 / CPR whole rows at a time (two 256-byte rows at D128) and writes them whole.
Per thread, every load first, all independent and in flight together:

    for r < R:  slot_r = slot_mapping[token_r]                 (8 bytes; a row's CPR threads read one address)
                k_r, v_r = key[token_r, h, 8c : 8c + 8], value[...]   (one 128-bit load each)
    for r < R:  if token_r < num_tokens and 0 <= slot_r < num_slots:   (one unsigned compare: -1 and every
                                                                         bad slot skip)
                    page, off = slot_r >> page_shift, slot_r & (2^page_shift - 1)
                    k_cache[page, off, h, 8c : 8c + 8] = k_r, v_cache[...] = v_r   (one 128-bit store each)

A token past num_tokens (the grid's last CTA) loads the last token's row instead (always input memory) and
writes nothing; a skipped token's row is read for nothing. Every offset is Int64 (pools beyond 2^31
elements); the runtime checks 16-byte aligned bases and strides that are multiples of 8 elements, which
the parameters' .align and the 128-bit accesses rely on. The same code serves every arch from sm_80 to
sm_120a. fp8 pools (kv_dtype fp8_e4m3, sm_89 and later): each chunk's 8 values are divided by the head's
scale (IEEE division, as a reference quantizer's x / scale) and converted to 8 e4m3 bytes
(aotc.kernels.fp8), one 64-bit store; pool offsets are in bytes, strides multiples of 16.
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..families import kv_write as family
from ..families.kv_write import ROWS_PER_THREAD, THREADS, VEC_BYTES
from ..families.kv_dtype import FP8
from .compile import KernelBuild, compile_kernel
from .fp8 import f32x2_to_e4m3x2
from .warp_mma import DTYPES


# 16-byte global accesses as volatile asm on four 32-bit words (the copy is bitwise): LLVM sinks a plain
# load into the branch that uses its value, which would make the key/value loads wait for the slot load
@dsl_user_op
def load_16b(ptr, *, loc=None, ip=None) -> tuple:
    words = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4), [ptr.to_llvm_ptr(loc=loc, ip=ip)],
        "ld.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), words, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def store_16b(ptr, words: tuple, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [ptr.to_llvm_ptr(loc=loc, ip=ip), *(Int32(w).ir_value(loc=loc, ip=ip) for w in words)],
        "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def store_8b(ptr, words: tuple, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [ptr.to_llvm_ptr(loc=loc, ip=ip), *(Int32(w).ir_value(loc=loc, ip=ip) for w in words)],
        "st.global.v2.b32 [$0], {$1, $2};", "l,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


class KvWrite:
    """One (dtype, head dim) variant: the chunk mapping above."""

    ptxas_levels = (None,)  # ptxas' default: a handful of registers, nothing to spill
    params = family.PARAMS

    def __init__(self, variant):
        if variant.family != "kv_write":
            raise ValueError(f"not a kv_write variant: {variant.name}")
        self.variant = variant
        self.dtype = DTYPES[variant["dtype"]]
        self.FP8 = variant.get("kv_dtype") == FP8
        self.VEC = VEC_BYTES * 8 // self.dtype.width  # elements of one 16-byte chunk
        self.CPR = family.chunks_per_row(variant)
        self.TPC = THREADS // self.CPR  # tokens a CTA covers with one row per thread
        self.TOKENS = family.tokens_per_cta(variant)  # ROWS_PER_THREAD times that
        if self.CPR & (self.CPR - 1) or self.TPC * ROWS_PER_THREAD != self.TOKENS:
            raise ValueError(f"head_dim {variant['head_dim']} does not tile {THREADS} threads of 16-byte chunks")
        self.LOG2_CPR = self.CPR.bit_length() - 1

    def __str__(self) -> str:  # the kernel symbol's mangled name includes it
        return type(self).__name__

    def pointee_types(self) -> dict:
        pool = cutlass.Uint8 if self.FP8 else self.dtype
        return {"key": self.dtype, "value": self.dtype, "k_cache": pool, "v_cache": pool,
                "slot_mapping": Int64, "k_scale": cutlass.Float32, "v_scale": cutlass.Float32}

    @cute.jit
    def quantize(self, words, scale):
        """8 16-bit values (4 words) -> 8 e4m3 bytes (2 words) of x / scale."""
        raw = cute.make_rmem_tensor((4,), Int32)
        for i in cutlass.range_constexpr(4):
            raw[i] = words[i]
        x = cute.recast_tensor(raw, self.dtype).load().to(cutlass.Float32)
        vals = cute.make_rmem_tensor((8,), cutlass.Float32)
        vals.store(x)
        out = []
        for w in cutlass.range_constexpr(2):
            b01 = f32x2_to_e4m3x2(vals[4 * w] / scale, vals[4 * w + 1] / scale)
            b23 = f32x2_to_e4m3x2(vals[4 * w + 2] / scale, vals[4 * w + 3] / scale)
            out.append(b01 | (b23 << 16))
        return tuple(out)

    def launch_facts(self):
        return family.launch_facts(self.variant)

    @cute.kernel
    def kv_write_kernel(
        self,
        key: cute.Pointer, value: cute.Pointer, k_cache: cute.Pointer, v_cache: cute.Pointer,
        slot_mapping: cute.Pointer,
        num_tokens: Int32, heads_kv: Int32, page_shift: Int32, num_slots: Int64,
        key_stride_token: Int64, key_stride_head: Int64, value_stride_token: Int64, value_stride_head: Int64,
        k_stride_page: Int64, k_stride_token: Int64, k_stride_head: Int64,
        v_stride_page: Int64, v_stride_token: Int64, v_stride_head: Int64,
        k_scale: cute.Pointer, v_scale: cute.Pointer, scale_stride_h: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bx, head, _ = cute.arch.block_idx()
        tid = Int32(tidx)
        first = Int32(bx) * self.TOKENS + (tid >> self.LOG2_CPR)
        col = Int64((tid & (self.CPR - 1)) * self.VEC)
        h64 = Int64(head)
        # every load first, none behind a branch: a thread past the last token reads the last token's row
        # (clamped, so always a row of the inputs) and writes nothing
        slots, ks, vs = [], [], []
        for r in cutlass.range_constexpr(ROWS_PER_THREAD):
            t64 = Int64(cutlass.min(first + r * self.TPC, num_tokens - 1))
            slots.append(slot_mapping[t64])
            ks.append(load_16b(key + (t64 * key_stride_token + h64 * key_stride_head + col)))
            vs.append(load_16b(value + (t64 * value_stride_token + h64 * value_stride_head + col)))
        if cutlass.const_expr(self.FP8):
            ks_h = k_scale[h64 * Int64(scale_stride_h)]
            vs_h = v_scale[h64 * Int64(scale_stride_h)]
        mask = (Int64(1) << Int64(page_shift)) - Int64(1)
        for r in cutlass.range_constexpr(ROWS_PER_THREAD):
            slot = slots[r]
            # 0 <= slot < num_slots in one comparison: a negative slot is above every int64 as unsigned
            if first + r * self.TPC < num_tokens:
                if cutlass.Uint64(slot) < cutlass.Uint64(num_slots):
                    page = slot >> Int64(page_shift)
                    off = slot & mask
                    k_dst = k_cache + (page * k_stride_page + off * k_stride_token + h64 * k_stride_head + col)
                    v_dst = v_cache + (page * v_stride_page + off * v_stride_token + h64 * v_stride_head + col)
                    if cutlass.const_expr(self.FP8):
                        store_8b(k_dst, self.quantize(ks[r], ks_h))
                        store_8b(v_dst, self.quantize(vs[r], vs_h))
                    else:
                        store_16b(k_dst, ks[r])
                        store_16b(v_dst, vs[r])

    @cute.jit
    def __call__(
        self,
        key: cute.Pointer, value: cute.Pointer, k_cache: cute.Pointer, v_cache: cute.Pointer,
        slot_mapping: cute.Pointer,
        num_tokens: Int32, heads_kv: Int32, page_shift: Int32, num_slots: Int64,
        key_stride_token: Int64, key_stride_head: Int64, value_stride_token: Int64, value_stride_head: Int64,
        k_stride_page: Int64, k_stride_token: Int64, k_stride_head: Int64,
        v_stride_page: Int64, v_stride_token: Int64, v_stride_head: Int64,
        k_scale: cute.Pointer, v_scale: cute.Pointer, scale_stride_h: Int32,
    ):
        # The real launch is done by the aotc runtime; this one only makes the module well formed.
        self.kv_write_kernel(
            key, value, k_cache, v_cache, slot_mapping, num_tokens, heads_kv, page_shift, num_slots,
            key_stride_token, key_stride_head, value_stride_token, value_stride_head,
            k_stride_page, k_stride_token, k_stride_head, v_stride_page, v_stride_token, v_stride_head,
            k_scale, v_scale, scale_stride_h,
        ).launch(grid=[(num_tokens + (self.TOKENS - 1)) // self.TOKENS, heads_kv, 1], block=[THREADS, 1, 1])


def compile(variant, *, dump_dir: str, keep_ptx: bool = False) -> KernelBuild:
    """Compile one kv_write variant for variant.arch. The entry's parameters are exactly
    aotc.families.kv_write.PARAMS; the launch is block (THREADS, 1, 1), grid
    (ceil(num_tokens / tokens_per_cta), heads_kv, 1), no shared memory."""
    return compile_kernel(KvWrite(variant), variant.arch, dump_dir, keep_ptx=keep_ptx)
