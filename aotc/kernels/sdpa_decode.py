"""CuTe DSL kernel for the sdpa_decode family (see aotc.families.sdpa_decode).

Decode attention: S_q (1..16) new tokens of every query head of one KV head attend over a paged or
dense KV cache. Warp-level tensor cores (mma.sync m16n8k16, fp32 accumulate), 16-byte cp.async and
ldmatrix: the same code for sm_80 .. sm_120a.

CTA = (kv_head * row_tiles + row_tile = blockIdx.x, chunk = blockIdx.y), 128 threads; the chunk's
sequence and key range come from the chunk schedule (tile_scheduler.KvChunks), which every CTA derives
from the device-side lengths at its start.

Rows (GQA packing): the CTA serves ROWS_PER_CTA = 16 packed rows r = row_tile*16 + 0..15 of the
group*S_q rows of its KV head, row r <-> token i = r // group, query head h = kv_head*group + r % group
(rows >= group*S_q are padding: zero Q, never stored). All 16 rows fit one m16 MMA tile, so the
4 warps split the KEYS instead of the rows: kv block n (BLOCK_N = 4*KW tokens) is one smem tile of K
and one of V, and warp w computes S = Q K^T, the online softmax and O += P V for keys
[w*KW, (w+1)*KW) of every block, with its own running max / sum / O (a flash-decoding split inside
the CTA). The epilogue merges the four warps' (max, sum, O) through shared memory. Every warp does a
quarter of the tensor-core work of a block, so the CTA stays memory bound even when only a few of
the 16 rows are real (group 4-8 with S_q = 1 is the common case).

Chunks: the batch's kv blocks are cut into chunks of C blocks (KvChunks); a chunk covers tokens
[lo, hi) of one sequence with lo a multiple of BLOCK_N and of the page size (any partition is valid
for the merge). A sequence of one chunk writes out/lse directly; the chunks of a longer one are its
splits below.

Pipeline: a ring of SLOTS tile buffers in dynamic smem; tiles are issued in the order
K0 V0 K1 V1 ..., tile t into slot t % SLOTS, one cp.async commit group per tile (the Q tile joins
tile 0's group). Per tile t (K step: t = 2n, V step: t = 2n+1):

    cp.async.wait_group(SLOTS-2)    tile t landed (this thread's copies)
    barrier                         everyone's copies of tile t visible; every warp done with t-1
    issue tile t+SLOTS-1 into slot (t-1) % SLOTS   (commit; empty group past the last block)
    K step: S = Q K^T (ldmatrix Q, K), [mask], online softmax (exp2, scale*log2 e), P -> 16 bit
    V step: O += P V  (ldmatrix.trans V, 64-column chunks of D)

so SLOTS-1 tiles (SLOTS-1 times BLOCK_N*D*2 bytes) are in flight while a warp computes.

K/V rows are gathered one 16-byte cp.async at a time from a per-thread row address:
paged  k + page_table[b, t // P] * stride_page + (t % P) * stride_token + kv_head * stride_head
dense  k + b * stride_page + t * stride_token + kv_head * stride_head            (same three slots)
A thread copies rows tid/8 + 16j (j < BLOCK_N/16) of a tile, 8 consecutive 16-byte chunks of a
row across 8 threads; the page of row-iteration j is the block's (16j // P)-th page, so a block needs
only max(1, BLOCK_N/P) page-table entries, the same for every thread. fp8 D64's rows of 64 bytes (32
16-bit pairs) take the first half of a 64-column atom row, copied by its first 4 threads; or, with the tile's
packed_rows, sit in narrow swizzle atoms, two rows a 128-byte line (warp_mma.smem_tile_layout): 4 threads
copy a row, rows tid/4 + 32j, and at page 16 a pass spans two pages, so each thread keeps the page of
each of its rows (BLOCK_N/32 entries). The entries are loaded one tile step
before the K tile that uses them (after the V tile of the previous block is issued), so the
page-table latency overlaps a step of compute. Rows at or past hi are zero-filled in smem and never
read from global memory (no page-table read either). All offsets are Int64; row offsets are
declared multiples of 8 elements (runtime: 16-byte aligned bases, strides multiple of 8 elements).

Masks: key j is visible to row (i, h) iff lo <= j < hi and j <= S_kv - S_q + i. Blocks entirely
below min(hi, S_kv - S_q + 1) run without mask arithmetic (a loop of their own); the rest (the
chunk's tail, or the last S_q - 1 keys of the sequence) are masked. A row that sees no key in a
warp keeps max -inf (exponent offset 0, so every p is 0, never NaN).

Epilogue: wait for every cp.async, barrier, each warp writes its per-row max, sum (quad-reduced)
and unnormalized fp32 O to smem (overlaying Q and the ring; rows padded by 8 floats against bank
conflicts); then each thread merges 8 consecutive columns of a row over the 4 warps:
M = max m_w, e_w = 2^((m_w - M)*scale*log2 e), L = sum e_w l_w, O = sum e_w O_w / L,
LSE = (M*scale*log2 e + log2 L) * ln 2 (natural log); L = 0 (no visible key) gives O = 0 and
LSE = -inf. write_partial == 0: O in fp16/bf16 (one 16-byte store) and LSE when write_lse != 0.
Only rows < group*S_q are stored.

Split sequences (write_partial != 0): fp32 O_partial (two 16-byte stores) and LSE_partial, then the
merge in the same launch (split_arrive, merge_splits): barrier; thread 0 takes a ticket with a
gpu-scope acq_rel atomicAdd on counters[b * gridDim.x + blockIdx.x] (release: the barrier orders every
thread's partial stores before it, and release is cumulative); the CTA that draws ticket
(the sequence's chunk count) - 1 resets the counter to 0 and, after a barrier (which passes the acquire on), reads every
split's partials of its rows in one pass with a running max: O = sum exp(lse_s - m) O_s / L,
L = sum exp(lse_s - m), LSE = m + log L (no live split: O = 0, LSE = -inf), MERGE_UNROLL 16-byte
partial loads in flight per thread. The other CTAs exit. The partials were just written, so the merge
reads L2, and the step needs no second kernel.

Tiles (KW keys per warp per block, BLOCK_N = 4*KW, SLOTS) per head dim and smem class, see CONFIGS:
2 CTAs per SM on sm_90/sm_100 (<= 113 KB each) and on sm_80 (<= 81 KB), 1 CTA on the 99 KB parts.

DSL notes (as in sdpa_prefill): per-thread addresses are rebuilt in every step from an opaque copy
of the thread index (otherwise LLVM hoists dozens of loop-invariant addresses into registers);
helpers are @cute.jit functions taking a namespace (no closures over staged values); dynamic smem
comes from SmemAllocator inside the kernel; ptxas runs at -O3, or -O2 / -O1 when -O3 spills.
"""
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.memory import SmemAllocator

from ..common.abi import has_grid_dependency_control
from ..families.kv_dtype import FP8
from ..families.sdpa_decode import (ACC_PAD, KV_CHOICES, MIN_CHUNK_BLOCKS, PARAMS, ROWS_PER_CTA, THREADS, WARPS, Tile,
                                    launch_facts, variant_tile)
from .compile import PTXAS_LEVELS, KernelBuild, compile_kernel
from .fp8 import gemm_pv_e4m3, gemm_qk_e4m3, o_column, rewrite_q_f16
from .tile_scheduler import KvChunks
from .mask import mask_columns, mask_columns_between
from .softmax import (LN_2, LOG2_E, MAX_SLACK_LOG2, NEG_INF, ScoreScale, quad_allreduce, rescale_rows, softcap_row,
                      softmax_row, with_sink)
from .warp_mma import (ATOM_COLS, DTYPES, NARROW_COLS, VEC, acc_mn_view, acc_to_a_operand, atom_cols, gemm_ldmatrix,
                       ldmatrix_atoms, make_g2s, make_warp_mma, opaque_i32, smem_tile_layout)

_THREADS = THREADS
_WARPS = WARPS
_ROWS = ROWS_PER_CTA  # rows of the CTA tile: one m16 MMA tile
_ACC_PAD = ACC_PAD
MERGE_VEC = 4     # split merge: fp32 columns per thread (one 16-byte load of a partial row)
MERGE_UNROLL = 16  # split merge: partial rows in flight per thread


def page_size_of(kv: str) -> int:
    if kv not in KV_CHOICES:
        raise ValueError(f"unknown kv {kv!r}")
    return 0 if kv == "dense" else int(kv[len("paged"):])


class SdpaDecode:
    """One decode variant: dtype, head dim, dense KV or a page size, the arch (its shared-memory class
    picks the tile) and the tile (the family's unless a tuner gives another)."""

    ptxas_levels = PTXAS_LEVELS
    params = PARAMS

    def __init__(self, variant, tile_: Tile | None = None):
        if variant.family != "sdpa_decode":
            raise ValueError(f"not an sdpa_decode variant: {variant.name}")
        self.variant = variant
        self.dtype = dtype = DTYPES[variant["dtype"]]
        self.D = D = int(variant["head_dim"])
        self.page = page = page_size_of(variant["kv"])
        arch = variant.arch
        self.tile = t = tile_ or variant_tile(variant)
        # fp8 KV: e4m3 tiles in the ring, converted by each thread (its own cp.async chunks) into K's or V's
        # 16-bit tile before the step's barrier; the K scale joins the softmax scale, the V scale the output
        self.KV8 = KV8 = variant.get("kv_dtype") == FP8
        if KV8 != t.fp8:
            raise ValueError(f"tile {t} is not a tile of kv_dtype {variant.get('kv_dtype')}")
        # fp8: the MMAs run in fp16 (e4m3 -> fp16 is exact and one instruction per two values; to bf16 it
        # takes five), P in fp16, Q rewritten in smem as fp16 times 2^-s, s per CTA from its rows' largest |q|
        # (so any bf16 query fits fp16's range), 2^s joining the softmax scale. The ring holds e4m3 tiles seen
        # as 16-bit pairs (KV_COLS = D/2 "elements" a row, the 16-bit tiles' swizzle), which ldmatrix loads as
        # it loads 16-bit tiles; each register's 4 bytes are converted in registers (aotc.kernels.fp8's
        # gemm_qk_e4m3, gemm_pv_e4m3: shared with sdpa_prefill's paged layouts), so no converted tile is stored
        self.MMA_DTYPE = cutlass.Float16 if KV8 else dtype
        self.KV_COLS = D // 2 if KV8 else D
        # a tile row's pitch: fp8 D64's rows of 32 pairs (64 bytes) sit in the first half of a 64-column swizzle
        # atom (128 bytes), which ldmatrix reads as a (keys, 32) view, the other half never read; or, with the
        # tile's packed_rows, in narrow 32-column atoms (warp_mma.smem_tile_layout): 4 threads copy a row, 32 rows
        # a pass, and a ring slot holds twice the keys
        if t.packed_rows and not (KV8 and self.KV_COLS == NARROW_COLS):
            raise ValueError(f"tile {t}: packed rows are fp8 D64's, not {variant.name}'s")
        self.KV_PITCH = self.KV_COLS if t.packed_rows else max(self.KV_COLS, ATOM_COLS)
        self.KV_PAD = self.KV_COLS < self.KV_PITCH
        self.ATOM_W = atom_cols(self.KV_PITCH)   # a tile row's offset within its atom column (the warp views')
        self.TPR = self.ATOM_W // VEC            # copy threads a row
        self.LOG2_TPR = self.TPR.bit_length() - 1
        self.RPP = _THREADS // self.TPR          # rows a copy pass covers: 16, or 32 for narrow rows
        self.KW = KW = t.keys_per_warp
        self.BN = BN = t.block_n
        self.SLOTS = SLOTS = t.slots
        self.TILE = BN * self.KV_PITCH           # 16-bit elements of a K or V tile (fp8: pairs of e4m3 bytes)
        self.ROW_ITERS = BN // self.RPP          # rows a thread copies per tile
        self.N_CHUNKS = D // ATOM_COLS           # 64-column chunks of D (O accumulators, V^T fragments)
        self.PAGED = PAGED = page > 0
        # ragged: Q/O [total_q, H_q, D] with cu_seqlens_q; a sequence of 1 .. seqlen_q queries is served, any
        # other is left to the kernel that takes longer ones (the serving entry point's decode rows)
        self.RAGGED = variant["layout"] == "ragged"
        # score features (aotc.families.features): compiled in or not, their values are parameters
        self.WINDOW, self.SOFTCAP, self.SINKS = (bool(variant.get(f, False)) for f in ("window", "softcap", "sinks"))
        self.PDL = has_grid_dependency_control(arch)  # trigger programmatic dependents (griddepcontrol)
        # page-table entries a thread keeps per block: the block's, the same for every thread, or where a copy
        # pass spans two pages (narrow rows, page 16) the page of each of its own rows
        self.PG_PER_ROW = PAGED and page < self.RPP
        self.N_PG = (self.ROW_ITERS if self.PG_PER_ROW else max(1, BN // page)) if PAGED else 0
        self.LOG2_P = page.bit_length() - 1 if PAGED else 0
        self.ACC_LD = D + _ACC_PAD               # fp32 row stride of the merge buffer
        self.ML_FLOATS = _WARPS * _ROWS * 2
        self.OUT_CHUNKS = _ROWS * D // VEC // _THREADS  # 8-column output chunks per thread
        self.MERGE_TPR = D // MERGE_VEC              # split merge: threads per row
        self.MERGE_ROWS = _THREADS // self.MERGE_TPR  # rows merged at a time (D 256: 2 rows of 64 threads)
        smem = t.smem_bytes(D)
        if (SLOTS < 2 or KW % 16 or D % ATOM_COLS or BN % self.RPP or (_ROWS * D // VEC) % _THREADS
                or (self.KV_COLS % ATOM_COLS and self.KV_COLS != NARROW_COLS)  # whole 64-column atoms or one narrow
                or (PAGED and (page & (page - 1) or page % 16))  # a pass's rows lie in one page, or two of 16
                or smem > t.smem_limit):
            raise ValueError(f"unsupported tile {t} for head_dim {D}, page {page} ({smem} bytes of smem)")
        ring_elems = (smem - _ROWS * D * 2) // 2  # 16-bit elements (fp8: pairs of e4m3 bytes)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, _ROWS * D], 1024]
            sKV: cute.struct.Align[cute.struct.MemRange[self.MMA_DTYPE, ring_elems], 1024]

        self.smem_size = SharedStorage.size_in_bytes()
        if self.smem_size != smem:
            raise RuntimeError(f"shared storage is {self.smem_size} bytes, the tile says {smem}")
        self.SharedStorage = SharedStorage
        self.schedule = KvChunks(BN, MIN_CHUNK_BLOCKS, page, self.RAGGED, self.WINDOW)

    def __str__(self) -> str:  # the kernel symbol's mangled name includes it
        return type(self).__name__

    def pointee_types(self) -> dict:
        kv = cutlass.Uint8 if self.KV8 else self.dtype
        return {"q": self.dtype, "k": kv, "v": kv, "o": self.dtype, "lse": Float32,
                "o_partial": Float32, "lse_partial": Float32, "counters": Int32, "page_table": Int32,
                "seqlens_kv": Int32, "cu_seqlens_q": Int32, "sinks": Float32, "k_descale": Float32,
                "v_descale": Float32}

    def launch_facts(self):
        return launch_facts(self.variant, self.tile)


    # ------------------------------------------------------------------ row addresses
    # token i of the CTA's sequence: dense Q/O [B, S_q, H_q, D] and LSE [B, H_q, S_q]; ragged Q/O
    # [total_q, H_q, D] and LSE [H_q, total_q] from the sequence's first query row q_row0

    @cute.jit
    def q_offset(self, ctx, i, h):
        if cutlass.const_expr(self.RAGGED):
            return Int64(ctx.q_row0 + i) * ctx.q_stride_s + Int64(h) * ctx.q_stride_h
        return Int64(ctx.bidx) * ctx.q_stride_b + Int64(i) * ctx.q_stride_s + Int64(h) * ctx.q_stride_h

    @cute.jit
    def o_offset(self, ctx, i, h):
        if cutlass.const_expr(self.RAGGED):
            return Int64(ctx.q_row0 + i) * ctx.o_stride_s + Int64(h) * ctx.o_stride_h
        return Int64(ctx.bidx) * ctx.o_stride_b + Int64(i) * ctx.o_stride_s + Int64(h) * ctx.o_stride_h

    @cute.jit
    def lse_offset(self, ctx, i, h):
        if cutlass.const_expr(self.RAGGED):
            return Int64(h) * ctx.lse_stride_h + Int64(ctx.q_row0 + i) * ctx.lse_stride_s
        return Int64(ctx.bidx) * ctx.lse_stride_b + Int64(h) * ctx.lse_stride_h + Int64(i) * ctx.lse_stride_s

    # ------------------------------------------------------------------ global -> smem copies

    # Tracer rule: inside a staged (dynamic) if/for body, never pass ctx to a function nor store
    # through ctx.<attr>[...]: the tracer would thread ctx itself through the branch, and values
    # created inside a loop body would escape it. Bodies read ctx attributes only.

    @cute.jit
    def copy_row(self, g2s, thr, base, off, dst, rows: cutlass.Constexpr, cols: cutlass.Constexpr):
        """cp.async this thread's chunks of one (., cols) row of 16-bit elements at base + off into dst
        (CPY, its 64-column chunks of the row; a narrow row is one): the source is a row-stride-0 (rows, cols)
        view (rows: the copy's rows a pass), so the thread's row coordinate drops out."""
        src = cute.make_tensor(base + cute.assume(off, divby=VEC), cute.make_layout((rows, cols), stride=(0, 1)))
        cute.copy(g2s, thr.partition_S(src)[None, 0, None], dst)

    @cute.jit
    def copy_kv_row(self, g2s, thr, base_bytes, off_bytes, dst):
        """copy_row of a K/V row at byte offset off_bytes from base_bytes (a Uint8 pointer): byte offsets
        let the page term be one wide multiply-add into the address (kv_thread_bases)."""
        row = cute.recast_ptr(base_bytes + cute.assume(off_bytes, divby=16), dtype=self.MMA_DTYPE)
        self.copy_row(g2s, thr, row, Int64(0), dst, self.RPP, self.KV_PITCH)

    @cute.jit
    def load_pages(self, ctx, tid, m):
        """Page-table entries of block m into ctx.pg (0 for pages at or past hi: never used): the block's
        j-th page in pg[j], or (PG_PER_ROW) the page of the thread's row of copy pass j."""
        # (tensors written inside staged branches are plain locals: an attribute store through ctx
        # would make the tracer thread ctx itself through the branch)
        pg = ctx.pg
        t0 = ctx.lo + m * self.BN
        row = ctx.pt_row_ptr + Int64(t0 >> self.LOG2_P) * ctx.pt_stride_p  # the block's first entry
        if cutlass.const_expr(self.PG_PER_ROW):
            # pass j's rows RPP j + r of the block (r = tid / TPR) lie in its page (RPP j + r) / P
            first = (tid >> self.LOG2_TPR) >> self.LOG2_P
            for j in cutlass.range_constexpr(self.N_PG):
                e = first + j * (self.RPP // self.page)
                pg[j] = Int32(0)
                if t0 + e * self.page < ctx.hi:
                    pg[j] = row[Int64(e) * ctx.pt_stride_p]
        else:
            for j in cutlass.range_constexpr(self.N_PG):
                tok = t0 + j * self.page if cutlass.const_expr(self.page < self.BN) else t0
                pg[j] = Int32(0)
                if tok < ctx.hi:
                    pg[j] = row[Int64(j) * ctx.pt_stride_p] if cutlass.const_expr(j > 0) else row[0]

    @cute.jit
    def kv_thread_bases(self, ctx, tid, k, v, k_strides, v_strides):
        """K's and V's byte pointers at this thread's fixed part of every row it copies (loop-invariant, so
        load_tile adds only the page's or token's term): kv head, the row's token within its page (t0 is a
        multiple of BN, so for P <= BN it is r + RPP j mod P, r = tid / TPR, whose j part load_tile adds), and for
        dense KV the sequence. Returns (k_base, v_base, K's (page, token) byte strides, V's)."""
        r = tid >> self.LOG2_TPR
        if cutlass.const_expr(self.PG_PER_ROW):
            r = r & (self.page - 1)  # the row's token within its page (the page: load_pages)
        elem = 1 if cutlass.const_expr(self.KV8) else self.dtype.width // 8  # the pools' bytes an element
        out = []
        for base, (s_page, s_tok, s_head) in ((k, k_strides), (v, v_strides)):
            s_page, s_tok, s_head = s_page * elem, s_tok * elem, s_head * elem
            fixed = Int64(ctx.kvh) * s_head + Int64(r) * s_tok
            if cutlass.const_expr(not self.PAGED):
                fixed = fixed + Int64(ctx.bidx) * s_page
            out.append((cute.recast_ptr(base, dtype=cutlass.Uint8) + cute.assume(fixed, divby=16), s_page, s_tok))
        return out[0][0], out[1][0], out[0][1:], out[1][1:]

    @cute.jit
    def load_tile(self, ctx, tid, slot, m, is_v: cutlass.Constexpr):
        """cp.async K (or V) of block m into ring slot `slot`; rows >= hi zero-filled. Row j of the thread
        is token t0 + tid / TPR + RPP j: its address is the thread's base (kv_thread_bases) plus the page
        term (paged) or t0's (dense) and, where the rows of a page span passes, RPP j's."""
        if m < ctx.n_blocks:
            g2s = ctx.g2s_kv
            thr = g2s.get_slice(tid)
            ring_off = cute.assume(slot * self.TILE, divby=512)
            sT = cute.make_tensor(ctx.ring_ptr + ring_off, ctx.tile_layout)
            tXs = thr.partition_D(sT)  # (CPY, BN/RPP, KV_PITCH/64 or 1)
            base = ctx.v_base if cutlass.const_expr(is_v) else ctx.k_base
            s_page, s_tok = ctx.v_strides if cutlass.const_expr(is_v) else ctx.k_strides
            t0 = ctx.lo + m * self.BN
            tile_off = Int64(0)
            if cutlass.const_expr(not self.PAGED):
                tile_off = Int64(t0) * s_tok
            elif cutlass.const_expr(self.page > self.BN):  # the block starts inside its page
                tile_off = Int64(t0 & (self.page - 1)) * s_tok
            tok0 = t0 + (tid >> self.LOG2_TPR)
            pgs = [ctx.pg[i] for i in range(self.N_PG)] if cutlass.const_expr(self.PAGED) else []
            if cutlass.const_expr(self.KV_PAD):
                # fp8 D64 unpacked: the threads of a row's first KV_COLS / 8 chunks copy it (the others would read
                # past the row); the atom's other half is never read
                in_row = (tid & (self.TPR - 1)) * VEC < self.KV_COLS
                for j in cutlass.range_constexpr(self.ROW_ITERS):
                    if in_row and tok0 + self.RPP * j < ctx.hi:
                        self.copy_kv_row(g2s, thr, base, self.row_offset(j, tile_off, pgs, s_page, s_tok),
                                         tXs[None, j, None])
                    else:
                        tXs[None, j, None].fill(0)
            elif t0 + self.BN <= ctx.hi:  # a whole block (all but a chunk's last): no row checks, no zero rows
                for j in cutlass.range_constexpr(self.ROW_ITERS):
                    self.copy_kv_row(g2s, thr, base, self.row_offset(j, tile_off, pgs, s_page, s_tok),
                                     tXs[None, j, None])
            else:
                for j in cutlass.range_constexpr(self.ROW_ITERS):
                    if tok0 + self.RPP * j < ctx.hi:
                        self.copy_kv_row(g2s, thr, base, self.row_offset(j, tile_off, pgs, s_page, s_tok),
                                         tXs[None, j, None])
                    else:
                        tXs[None, j, None].fill(0)

    @cute.jit
    def row_offset(self, j: cutlass.Constexpr, tile_off, pgs, s_page, s_tok):
        """Byte offset of the thread's row j of a tile from its base (kv_thread_bases): the tile's token term,
        the row's page term (pgs: the block's page ids, or PG_PER_ROW the thread's row's) and, where the rows
        of a page span passes (RPP <= P <= BN) or the block is a run of tokens (P > BN, dense), RPP j's."""
        off = tile_off
        if cutlass.const_expr(self.PAGED):
            if cutlass.const_expr(self.PG_PER_ROW):
                pg = pgs[j]
            else:
                pg = pgs[(self.RPP * j) // self.page if cutlass.const_expr(self.page < self.BN) else 0]
            # page ids are non-negative (the caller's contract): widened unsigned, the term is one 32 x 64-bit
            # multiply-add
            off = off + Int64(cutlass.Uint32(pg)) * s_page
        j_rows = self.RPP * j
        if cutlass.const_expr(self.PAGED and self.page <= self.BN):
            j_rows = self.RPP * (j % (self.page // self.RPP)) if cutlass.const_expr(self.page >= self.RPP) else 0
        if cutlass.const_expr(j_rows > 0):
            off = off + Int64(j_rows) * s_tok
        return off

    @cute.jit
    def q_to_f16(self, ctx, tid):
        """fp8 KV: rewrite the Q tile in smem as fp16 times 2^-s (aotc.kernels.fp8.rewrite_q_f16), returning 2^s;
        the block-wide max goes through the ring's last slot, which step 0 fills only after two more barriers."""
        red = cute.recast_ptr(ctx.ring_ptr + (self.SLOTS - 1) * self.TILE, dtype=Float32)
        return rewrite_q_f16(ctx.g2s.get_slice(tid), cute.make_tensor(ctx.sQ_ptr, ctx.q_layout),
                             cute.make_tensor(ctx.sQ_mma, ctx.q_layout), self.dtype, red, _WARPS, tid)

    @cute.jit
    def issue(self, ctx, tid, t_issue, m, is_v: cutlass.Constexpr):
        """Issue tile t_issue (block m, K or V), commit its group; after a V tile, prefetch the
        next block's page-table entries (used by the next K tile, one step later)."""
        self.load_tile(ctx, tid, t_issue % self.SLOTS, m, is_v)
        cute.arch.cp_async_commit_group()
        if cutlass.const_expr(self.PAGED and is_v):
            self.load_pages(ctx, tid, m + 1)

    @cute.jit
    def prologue(self, ctx):
        """Q tile (rows past group*S_q zero-filled) + tiles 0 .. SLOTS-2 of the ring."""
        tid = opaque_i32(ctx.tidx) & (_THREADS - 1)
        g2s = ctx.g2s
        q = ctx.q
        thr = g2s.get_slice(tid)
        sQ = cute.make_tensor(ctx.sQ_ptr, ctx.q_layout)
        tQs = thr.partition_D(sQ)  # (CPY, 1, D/64)
        rr = ctx.row_tile * _ROWS + (tid >> 3)
        if rr < ctx.n_rows:
            i = rr // ctx.group
            h = ctx.kvh * ctx.group + (rr - i * ctx.group)
            self.copy_row(g2s, thr, q, self.q_offset(ctx, i, h), tQs[None, 0, None], 16, self.D)
        else:
            tQs[None, 0, None].fill(0)
        if cutlass.const_expr(self.PAGED):
            self.load_pages(ctx, tid, Int32(0))
        for t in cutlass.range_constexpr(self.SLOTS - 1):
            self.issue(ctx, tid, Int32(t), Int32(t // 2), t % 2 == 1)

    # ------------------------------------------------------------------ per-step compute

    @cute.jit
    def k_step(self, ctx, n, masked: cutlass.Constexpr):
        """Tile 2n (K of block n): S = Q K_w^T over this warp's KW keys, [mask], online softmax, P."""
        tid = opaque_i32(ctx.tidx) & (_THREADS - 1)
        t = 2 * n
        cute.arch.cp_async_wait_group(self.SLOTS - 2)
        cute.arch.barrier()
        # tile t + SLOTS - 1: block n + (SLOTS-1)//2, a V tile iff SLOTS is even
        self.issue(ctx, tid, t + (self.SLOTS - 1), n + (self.SLOTS - 1) // 2, self.SLOTS % 2 == 0)

        lane = tid & 31
        wn = tid >> 5
        zero = cute.assume(opaque_i32(Int32(0)), divby=512)
        sQ = cute.make_tensor(ctx.sQ_mma + zero, ctx.q_layout)
        k_off = cute.assume((t % self.SLOTS) * self.TILE + wn * (self.KW * self.ATOM_W), divby=512)
        sK = cute.make_tensor(ctx.ring_ptr + k_off, ctx.warp_layout)  # (KW, KV_COLS): this warp's keys

        mma = ctx.mma
        thr_mma = mma.get_slice(lane)
        s2r_Q = ctx.s2r_Q.get_slice(lane)
        s2r_K = ctx.s2r_K.get_slice(lane)
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((_ROWS, self.KW)), Float32)
        acc_S.fill(0.0)
        if cutlass.const_expr(self.KV8):
            gemm_qk_e4m3(mma, thr_mma, s2r_Q, s2r_K, sQ, sK, acc_S, self.D)
        else:
            tSsQ = s2r_Q.partition_S(sQ)
            tSsK = s2r_K.partition_S(sK)
            tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
            tSrK_v = s2r_K.retile(tSrK)
            tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
            tSrQ_v = s2r_Q.retile(tSrQ)
            gemm_ldmatrix(mma, acc_S, s2r_Q, tSsQ, tSrQ_v, tSrQ, s2r_K, tSsK, tSrK_v, tSrK)

        S_mn = acc_mn_view(acc_S)
        cS = cute.make_identity_tensor((_ROWS, self.KW))
        t0ScS_mn = acc_mn_view(mma.get_slice(0).partition_C(cS))  # compile-time coordinates
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        scale_log2 = ctx.scale_log2
        if cutlass.const_expr(masked):
            # key j = lo + n*BN + wn*KW + c of row r is visible iff j < row_lim[r] (and, windowed, j >= row_lo[r])
            col0 = thr_mma.partition_C(cS)[0][1]
            key0 = ctx.lo + n * self.BN + wn * self.KW + col0
        if cutlass.const_expr(self.KV8):
            # lazy O rescale (aotc.kernels.softmax.MAX_SLACK_LOG2): fp8 decode is bound by instructions, not
            # bytes, and the O rescale was a tenth of them
            alphas = cute.make_rmem_tensor((2,), Float32)
            O_views = [acc_mn_view(ctx.acc_O[h]) for h in range(self.N_CHUNKS)]
            key0_ = key0 if cutlass.const_expr(masked) else None
            self.score_mods(S_mn, 0, t0ScS_mn, ctx.cap_in, ctx.row_lo[0], ctx.row_lim[0], key0_, masked)
            alphas[0] = softmax_row(S_mn, row_max, row_sum, 0, scale_log2, MAX_SLACK_LOG2)
            alphas[1] = Float32(1.0)
            # rows 8..15 of the tile (each thread's r = 1) are padding when the CTA serves 8 rows or fewer (GQA
            # 4 to 8 at S_q 1): their softmax is skipped, in a loop of 0 or 1 trips as the rescale below. Their
            # scores are those of zero Q rows, so their P is 0 (or NaN where K is), their O never stored
            cap_in, lo1, lim1 = ctx.cap_in, ctx.row_lo[1], ctx.row_lim[1]
            for _ in cutlass.range(opaque_i32(ctx.upper_rows), unroll=1):
                self.score_mods(S_mn, 1, t0ScS_mn, cap_in, lo1, lim1, key0_, masked)
                alphas[1] = softmax_row(S_mn, row_max, row_sum, 1, scale_log2, MAX_SLACK_LOG2)
            changed = (alphas[0] != Float32(1.0)) | (alphas[1] != Float32(1.0))
        for r in cutlass.range_constexpr(0 if cutlass.const_expr(self.KV8) else 2):
            self.score_mods(S_mn, r, t0ScS_mn, ctx.cap_in, ctx.row_lo[r], ctx.row_lim[r],
                            key0 if cutlass.const_expr(masked) else None, masked)
            alpha = softmax_row(S_mn, row_max, row_sum, r, scale_log2)
            for h in cutlass.range_constexpr(self.N_CHUNKS):
                O_mn = acc_mn_view(ctx.acc_O[h])
                O_mn[r, None].store(O_mn[r, None].load() * alpha)
        if cutlass.const_expr(self.KV8):
            # warp-uniform: skipped while no row of the warp moved its max. A loop of 0 or 1 trips, its count
            # opaque: as an `if`, ptxas predicated the 64 multiplies and issued them in every block (ncu: a
            # tenth of the fp8 step's instructions)
            for _ in cutlass.range(opaque_i32(Int32(cute.arch.vote_any_sync(changed))), unroll=1):
                for h in cutlass.range_constexpr(self.N_CHUNKS):
                    rescale_rows(O_views[h], alphas)
        ctx.rP.store(acc_S.load().to(self.MMA_DTYPE))

    @cute.jit
    def score_mods(self, S_mn, r: cutlass.Constexpr, t0ScS_mn, cap_in, row_lo, row_lim, key0,
                   masked: cutlass.Constexpr):
        """Soft-cap and mask of the thread's row r before its softmax (no ctx: the fp8 padding rows call it
        inside a staged loop). key0: the thread's first key (masked blocks only)."""
        if cutlass.const_expr(self.SOFTCAP):
            softcap_row(S_mn, r, cap_in)
        if cutlass.const_expr(masked):
            if cutlass.const_expr(self.WINDOW):
                mask_columns_between(S_mn, r, t0ScS_mn, row_lo - key0, row_lim - key0)
            else:
                mask_columns(S_mn, r, t0ScS_mn, row_lim - key0)

    @cute.jit
    def v_step(self, ctx, n):
        """Tile 2n+1 (V of block n): O += P V_w over this warp's KW keys, 64 columns of D at a time."""
        tid = opaque_i32(ctx.tidx) & (_THREADS - 1)
        t = 2 * n + 1
        cute.arch.cp_async_wait_group(self.SLOTS - 2)
        cute.arch.barrier()
        # tile t + SLOTS - 1: block n + SLOTS//2, a V tile iff SLOTS is odd
        self.issue(ctx, tid, t + (self.SLOTS - 1), n + self.SLOTS // 2, self.SLOTS % 2 == 1)

        lane = tid & 31
        wn = tid >> 5
        v_off = cute.assume((t % self.SLOTS) * self.TILE + wn * (self.KW * self.ATOM_W), divby=512)
        sV = cute.make_tensor(ctx.ring_ptr + v_off, ctx.warp_layout)  # (KW, KV_COLS): this warp's keys
        mma = ctx.mma
        thr_mma = mma.get_slice(lane)
        s2r_V = ctx.s2r_V.get_slice(lane)
        tOrP = cute.make_tensor(ctx.rP.iterator, acc_to_a_operand(ctx.rP.layout))
        n_kk = cute.size(tOrP.shape[2])
        if cutlass.const_expr(self.KV8):
            gemm_pv_e4m3(ctx.mma, thr_mma, s2r_V, sV, tOrP, ctx.acc_O)
        else:
            self.pv(ctx, thr_mma, s2r_V, sV, tOrP, n_kk)

    @cute.jit
    def pv(self, ctx, thr_mma, s2r_V, sV, tOrP, n_kk):
        """O += P V over 16-bit V: ldmatrix.trans fragments, 64 columns of D at a time, the next step's
        fragments loaded before this step's MMAs."""
        mma = ctx.mma
        srcs = []
        frags = []
        views = []
        for h in cutlass.range_constexpr(self.N_CHUNKS):
            sV_h = cute.local_tile(sV, (self.KW, ATOM_COLS), (0, h))
            sVt_h = cute.composition(sV_h, cute.make_layout((ATOM_COLS, self.KW), stride=(self.KW, 1)))  # V^T
            frag = thr_mma.make_fragment_B(thr_mma.partition_B(sVt_h))
            srcs.append(s2r_V.partition_S(sVt_h))
            frags.append(frag)
            views.append(s2r_V.retile(frag))
        steps = [(h, kk) for h in range(self.N_CHUNKS) for kk in range(n_kk)]
        h0, kk0 = steps[0]
        cute.copy(s2r_V, srcs[h0][None, None, kk0], views[h0][None, None, kk0])
        for i in cutlass.range_constexpr(len(steps)):
            h, kk = steps[i]
            if cutlass.const_expr(i + 1 < len(steps)):
                h1, kk1 = steps[i + 1]
                cute.copy(s2r_V, srcs[h1][None, None, kk1], views[h1][None, None, kk1])
            acc = ctx.acc_O[h]
            cute.gemm(mma, acc, tOrP[None, None, kk], frags[h][None, None, kk], acc)

    @cute.jit
    def epilogue(self, ctx):
        """Merge the 4 warps' (max, sum, O) through smem; write O / LSE or the partials."""
        tid = opaque_i32(ctx.tidx) & (_THREADS - 1)
        lane = tid & 31
        wn = tid >> 5
        mma = ctx.mma
        thr_mma = mma.get_slice(lane)
        # every cp.async retired, every warp done with Q and the ring: the merge buffer overlays them
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        mbase = ctx.merge_ptr
        cS = cute.make_identity_tensor((_ROWS, self.KW))
        tScS = thr_mma.partition_C(cS)
        t0ScS_mn = acc_mn_view(mma.get_slice(0).partition_C(cS))
        row0 = tScS[0][0]
        for r in cutlass.range_constexpr(2):
            total = quad_allreduce(ctx.row_sum[r], lambda a, b_: a + b_)
            if tScS[0][1] == 0:  # one thread of each quad writes the quad's rows
                idx = (wn * _ROWS + row0 + t0ScS_mn[r, 0][0]) * 2
                mbase[idx] = ctx.row_max[r]
                mbase[idx + 1] = total
        acc_base = mbase + cute.assume(self.ML_FLOATS + wn * (_ROWS * self.ACC_LD), divby=32)
        for h in cutlass.range_constexpr(self.N_CHUNKS):
            sAcc = cute.make_tensor(acc_base + h * ATOM_COLS,
                                    cute.make_layout((_ROWS, ATOM_COLS), stride=(self.ACC_LD, 1)))
            if cutlass.const_expr(self.KV8):  # O's columns in the fp8 order (gemm_pv_e4m3), back in order of d
                coords = thr_mma.partition_C(cute.make_identity_tensor((_ROWS, ATOM_COLS)))
                for i in cutlass.range_constexpr(cute.size(coords)):
                    r, c = coords[i]
                    sAcc[r, o_column(c)] = ctx.acc_O[h][i]
            else:
                cute.autovec_copy(ctx.acc_O[h], thr_mma.partition_C(sAcc))
        cute.arch.barrier()

        scale_log2 = ctx.scale_log2
        lse = ctx.lse
        lse_partial = ctx.lse_partial
        for j in cutlass.range_constexpr(self.OUT_CHUNKS):
            qc = tid + _THREADS * j
            row = qc // (self.D // VEC)
            c0 = (qc - row * (self.D // VEC)) * VEC
            rr = ctx.row_tile * _ROWS + row
            if rr < ctx.n_rows:
                m_all = Float32(NEG_INF)
                for w in cutlass.range_constexpr(_WARPS):
                    m_all = cute.arch.fmax(m_all, mbase[(w * _ROWS + row) * 2])
                m_s = (Float32(0.0) if m_all == Float32(NEG_INF) else m_all) * scale_log2
                total = Float32(0.0)
                acc = cute.make_rmem_tensor((VEC,), Float32)
                acc.fill(0.0)
                for w in cutlass.range_constexpr(_WARPS):
                    e = cute.math.exp2(mbase[(w * _ROWS + row) * 2] * scale_log2 - m_s, fastmath=True)
                    total = total + e * mbase[(w * _ROWS + row) * 2 + 1]
                    src = cute.make_tensor(
                        mbase + cute.assume(self.ML_FLOATS + (w * _ROWS + row) * self.ACC_LD + c0, divby=VEC),
                        cute.make_layout(VEC))
                    acc.store(acc.load() + src.load() * e)
                i = rr // ctx.group
                h = ctx.kvh * ctx.group + (rr - i * ctx.group)
                factor = Float32(1.0)
                if cutlass.const_expr(self.SINKS):
                    if ctx.n_seq == 1:  # the sink joins the final softmax only (a split's partials go without)
                        m_s, total, factor = with_sink(m_s, total, ctx.sinks[h] * Float32(LOG2_E))
                inv = Float32(0.0)
                lse_v = Float32(NEG_INF)  # no visible key (and no sink): O = 0, LSE = -inf
                if total > Float32(0.0):
                    inv = factor * ctx.v_scale / total  # (v_scale: fp8 KV's V scale, else 1)
                    lse_v = (m_s + cute.math.log2(total, fastmath=True)) * Float32(LN_2)
                res = acc.load() * inv
                if ctx.n_seq > 1:
                    off = (Int64(ctx.chunk) * ctx.op_stride_chunk
                           + Int64(i) * ctx.op_stride_s + Int64(h) * ctx.op_stride_h + Int64(c0))
                    dst = cute.make_tensor(ctx.o_partial + cute.assume(off, divby=4), cute.make_layout(VEC))
                    dst.store(res)
                    if c0 == 0:
                        lse_partial[Int64(ctx.chunk) * ctx.lp_stride_chunk
                                    + Int64(h) * ctx.lp_stride_h + Int64(i) * ctx.lp_stride_s] = lse_v
                else:
                    off = self.o_offset(ctx, i, h) + Int64(c0)
                    dst = cute.make_tensor(ctx.o + cute.assume(off, divby=VEC), cute.make_layout(VEC))
                    dst.store(res.to(self.dtype))
                    if ctx.write_lse != 0:
                        if c0 == 0:
                            lse[self.lse_offset(ctx, i, h)] = lse_v
        if ctx.n_seq > 1:
            self.split_arrive(ctx, tid)
            if mbase[0] != Float32(0.0):
                self.merge_splits(ctx, tid)

    @cute.jit
    def split_arrive(self, ctx, tid):
        """Split-KV: after this CTA's partials are stored, draw a ticket from the (b, kv head, row tile)
        counter; True (1.0 in smem) for the CTA drawing the last one, which resets the counter."""
        mbase = ctx.merge_ptr
        counters = ctx.counters
        # every thread's partial stores (and its reads of the merge buffer) are done. Thread 0's ticket
        # is a gpu-scope acq_rel atomic: its release covers the whole CTA's stores (ordered before it
        # by the barrier; release is cumulative) and its acquire, passed on by the next barrier, makes
        # the other splits' partials visible to every thread (the same pattern as a cooperative-groups
        # grid sync, whose relaxed atomics need explicit fences where this one carries them).
        cute.arch.barrier()
        if tid == 0:
            idx = Int64(ctx.bidx) * Int64(ctx.n_cols) + Int64(ctx.col)
            ticket = cute.arch.atomic_add(counters + idx, Int32(1), sem="acq_rel", scope="gpu")
            flag = Float32(0.0)
            if ticket == ctx.n_seq - 1:
                # every split has arrived: no one else touches the counter in this launch, and the
                # next launch (stream-ordered) sees the 0
                counters[idx] = Int32(0)
                flag = Float32(1.0)
            mbase[0] = flag
        cute.arch.barrier()

    @cute.jit
    def merge_splits(self, ctx, tid):
        """The last split's CTA: O = sum_s exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s), over the
        CTA's real rows; MERGE_TPR threads (MERGE_VEC fp32 columns each) per row, MERGE_ROWS rows at a
        time, each thread one pass over the splits with MERGE_UNROLL 16-byte partial loads in flight
        (the partials were just written: L2 hits). Every partial is finite (an empty split stores
        O = 0, LSE = -inf), so a zero weight never meets a NaN."""
        slice_idx = tid // self.MERGE_TPR
        lane = tid - slice_idx * self.MERGE_TPR
        n_real = cutlass.min(ctx.n_rows - ctx.row_tile * _ROWS, Int32(_ROWS))
        splits = ctx.n_seq
        lse_partial = ctx.lse_partial
        o_partial = ctx.o_partial
        o = ctx.o
        lse = ctx.lse
        lp_split = ctx.lp_stride_chunk
        op_split = ctx.op_stride_chunk
        first_full = ctx.first_full
        n_full = ctx.n_full
        partial_slot = ctx.partial_slot
        for it in cutlass.range((n_real + (self.MERGE_ROWS - 1)) // self.MERGE_ROWS, unroll=1):
            row = it * self.MERGE_ROWS + slice_idx
            valid = row < n_real
            rr = ctx.row_tile * _ROWS + row
            i = rr // ctx.group
            h = ctx.kvh * ctx.group + (rr - i * ctx.group)
            lp_row = Int64(h) * ctx.lp_stride_h + Int64(i) * ctx.lp_stride_s
            op_row = Int64(i) * ctx.op_stride_s + Int64(h) * ctx.op_stride_h + Int64(lane * MERGE_VEC)
            # one pass over the splits, MERGE_UNROLL at a time with a running max (online softmax):
            # acc = sum_s exp(lse_s - m) O_s, total = sum_s exp(lse_s - m), rescaled when m grows.
            # No load sits behind a guard: an index past the last split is clamped to it and its
            # weight multiplied by 0 (not chosen by a conditional, which LLVM turns into a branch and
            # sinks the load into), so a group's loads are all in flight before any is used.
            my_splits = splits if valid else Int32(0)
            last = my_splits - 1
            lv = cute.make_rmem_tensor((MERGE_UNROLL,), Float32)
            ov = cute.make_rmem_tensor((MERGE_VEC, MERGE_UNROLL), Float32)
            acc = cute.make_rmem_tensor((MERGE_VEC,), Float32)
            acc.fill(0.0)
            m = Float32(NEG_INF)
            total = Float32(0.0)
            for s0 in range(0, my_splits, MERGE_UNROLL):
                for k in cutlass.range_constexpr(MERGE_UNROLL):
                    # the sequence's j-th chunk: its full chunks are consecutive, its partial one apart
                    sj = cutlass.min(s0 + k, last)
                    sp = first_full + sj
                    if sj >= n_full:
                        sp = partial_slot
                    lv[k] = lse_partial[lp_row + Int64(sp) * lp_split]
                    off = cute.assume(op_row + Int64(sp) * op_split, divby=MERGE_VEC)
                    cute.autovec_copy(cute.make_tensor(o_partial + off, cute.make_layout(MERGE_VEC)), ov[None, k])
                m_new = m
                for k in cutlass.range_constexpr(MERGE_UNROLL):
                    m_new = cute.arch.fmax(m_new, lv[k])  # repeats of the last split change no max
                m_s = Float32(0.0) if m_new == Float32(NEG_INF) else m_new  # no live split yet: weights 0
                rescale = cute.math.exp2((m - m_s) * Float32(LOG2_E), fastmath=True)  # m = -inf: 0
                acc.store(acc.load() * rescale)
                total = total * rescale
                for k in cutlass.range_constexpr(MERGE_UNROLL):
                    w = cute.math.exp2((lv[k] - m_s) * Float32(LOG2_E), fastmath=True) * Float32(s0 + k <= last)
                    acc.store(acc.load() + ov[None, k].load() * w)
                    total = total + w
                m = m_new
            m_s = Float32(0.0) if m == Float32(NEG_INF) else m
            if valid:
                m_l2 = m_s * Float32(LOG2_E)
                factor = Float32(1.0)
                if cutlass.const_expr(self.SINKS):  # the sink joins the merged softmax, once
                    m_l2, total, factor = with_sink(m_l2, total, ctx.sinks[h] * Float32(LOG2_E))
                inv = Float32(0.0)
                lse_v = Float32(NEG_INF)  # no visible key in any split (and no sink): O = 0, LSE = -inf
                if total > Float32(0.0):
                    inv = factor / total
                    lse_v = (m_l2 + cute.math.log2(total, fastmath=True)) * Float32(LN_2)
                off = self.o_offset(ctx, i, h) + Int64(lane * MERGE_VEC)
                dst = cute.make_tensor(o + cute.assume(off, divby=MERGE_VEC), cute.make_layout(MERGE_VEC))
                dst.store((acc.load() * inv).to(self.dtype))
                if ctx.write_lse != 0:
                    if lane == 0:
                        lse[self.lse_offset(ctx, i, h)] = lse_v

    @cute.kernel
    def sdpa_decode_kernel(
        self,
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer, o: cute.Pointer, lse: cute.Pointer,
        o_partial: cute.Pointer, lse_partial: cute.Pointer, counters: cute.Pointer, page_table: cute.Pointer,
        seqlens_kv: cute.Pointer, cu_seqlens_q: cute.Pointer,
        batch: Int32, seqlen_q: Int32, heads_q: Int32, heads_kv: Int32,
        target_chunks: Int32, max_pages: Int32, write_lse: Int32,
        softmax_scale: Float32,
        q_stride_b: Int64, q_stride_s: Int64, q_stride_h: Int64,
        k_stride_page: Int64, k_stride_token: Int64, k_stride_head: Int64,
        v_stride_page: Int64, v_stride_token: Int64, v_stride_head: Int64,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
        pt_stride_b: Int64, pt_stride_p: Int64,
        op_stride_chunk: Int64, op_stride_s: Int64, op_stride_h: Int64,
        lp_stride_chunk: Int64, lp_stride_h: Int64, lp_stride_s: Int64,
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
        k_descale: cute.Pointer, v_descale: cute.Pointer, descale_stride_h: Int32,
    ):
        if cutlass.const_expr(self.PDL):
            # a kernel the caller launches next as a programmatic dependent (e.g. the output projection,
            # which must griddepcontrol.wait before reading O) may be dispatched now, hiding its launch
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        col, chunk, _ = cute.arch.block_idx()
        col = Int32(col)
        chunk = Int32(chunk)

        group = heads_q // heads_kv
        n_rows = group * seqlen_q
        row_tiles = (n_rows + (_ROWS - 1)) // _ROWS
        kvh = col // row_tiles
        row_tile = col - kvh * row_tiles

        # ------------------------------------------------------------ this chunk's sequence and kv range
        bidx, s_kv, lo, hi, n_seq, first_full, n_full, partial_slot = self.schedule.locate(
            seqlens_kv, batch, max_pages, target_chunks, chunk, Int32(tidx) & 31, cu_seqlens_q, seqlen_q, window_left)
        if bidx >= 0:  # past the last chunk: nothing to do (uniform over the CTA)
            q_row0 = Int32(0)
            s_q = seqlen_q
            if cutlass.const_expr(self.RAGGED):  # this sequence's queries; a row tile it does not fill exits
                q_row0 = cu_seqlens_q[bidx]
                s_q = cu_seqlens_q[bidx + 1] - q_row0
            if cutlass.const_expr(not self.RAGGED) or row_tile * _ROWS < group * s_q:
                self.attend(
                    q, k, v, o, lse, o_partial, lse_partial, counters, page_table, s_q, heads_kv, write_lse,
                    softmax_scale, q_stride_b, q_stride_s, q_stride_h, k_stride_page, k_stride_token, k_stride_head,
                    v_stride_page, v_stride_token, v_stride_head, o_stride_b, o_stride_s, o_stride_h,
                    lse_stride_b, lse_stride_h, lse_stride_s, pt_stride_b, pt_stride_p,
                    op_stride_chunk, op_stride_s, op_stride_h, lp_stride_chunk, lp_stride_h, lp_stride_s,
                    Int32(tidx), col, chunk, bidx, s_kv, lo, hi, n_seq, first_full, n_full, partial_slot,
                    group, group * s_q, kvh, row_tile, row_tiles, q_row0, sinks, window_left, softcap,
                    k_descale, v_descale, descale_stride_h)

    @cute.jit
    def attend(self, q, k, v, o, lse, o_partial, lse_partial, counters, page_table, seqlen_q, heads_kv, write_lse,
               softmax_scale, q_stride_b, q_stride_s, q_stride_h, k_stride_page, k_stride_token, k_stride_head,
               v_stride_page, v_stride_token, v_stride_head, o_stride_b, o_stride_s, o_stride_h,
               lse_stride_b, lse_stride_h, lse_stride_s, pt_stride_b, pt_stride_p,
               op_stride_chunk, op_stride_s, op_stride_h, lp_stride_chunk, lp_stride_h, lp_stride_s,
               tidx, col, chunk, bidx, s_kv, lo, hi, n_seq, first_full, n_full, partial_slot,
               group, n_rows, kvh, row_tile, row_tiles, q_row0, sinks, window_left, softcap,
               k_descale, v_descale, descale_stride_h):
        """The CTA's work on its chunk: keys [lo, hi) of sequence bidx (seqlen_q queries, the first at row
        q_row0 of a ragged Q) for its (KV head, row tile)."""
        n_blocks = Int32(0)
        if hi > lo:
            n_blocks = (hi - lo + (self.BN - 1)) // self.BN
        # blocks below min(hi, S_kv - S_q + 1) are visible to every row: no mask
        lim_all = cutlass.min(hi, s_kv - seqlen_q + 1)
        n_unmasked = Int32(0)
        if lim_all > lo:
            n_unmasked = (lim_all - lo) // self.BN
        # windowed: blocks below the last query's first key, s_kv - 1 - window_left, hold keys some row's
        # window leaves out (masked); the blocks n_left .. n_plain - 1 need no mask
        n_left = Int32(0)
        if cutlass.const_expr(self.WINDOW):
            first_all = s_kv - 1 - window_left
            if first_all > lo:
                n_left = cutlass.min((first_all - lo + (self.BN - 1)) // self.BN, n_blocks)
        n_plain = cutlass.max(n_left, n_unmasked)

        storage = SmemAllocator().allocate(self.SharedStorage)
        tiled_mma = make_warp_mma(self.MMA_DTYPE, 1)
        ldsm, ldsm_t = ldmatrix_atoms(self.MMA_DTYPE)
        sQ_ptr = storage.sQ.data_ptr()
        ring_ptr = storage.sKV.data_ptr()
        tile_layout = smem_tile_layout(self.BN, self.KV_PITCH)
        if cutlass.const_expr(self.KV8):  # e4m3 pools read as 16-bit pairs (offsets halved in load_tile)
            k = cute.recast_ptr(k, dtype=cutlass.Float16)
            v = cute.recast_ptr(v, dtype=cutlass.Float16)
        ctx = SimpleNamespace(
            tidx=tidx, chunk=chunk, bidx=bidx, kvh=kvh, row_tile=row_tile, q_row0=q_row0,
            group=group, n_rows=n_rows, s_q=seqlen_q, lo=lo, hi=hi, n_blocks=n_blocks,
            q=q, k=k, v=v, o=o, lse=lse, o_partial=o_partial, lse_partial=lse_partial, counters=counters,
            n_seq=n_seq, first_full=first_full, n_full=n_full, partial_slot=partial_slot,
            col=col, n_cols=heads_kv * row_tiles,
            pt_row_ptr=page_table + Int64(bidx) * pt_stride_b, pt_stride_p=pt_stride_p,
            q_stride_b=q_stride_b, q_stride_s=q_stride_s, q_stride_h=q_stride_h,
            o_stride_b=o_stride_b, o_stride_s=o_stride_s, o_stride_h=o_stride_h,
            lse_stride_b=lse_stride_b, lse_stride_h=lse_stride_h, lse_stride_s=lse_stride_s,
            op_stride_chunk=op_stride_chunk, op_stride_s=op_stride_s, op_stride_h=op_stride_h,
            lp_stride_chunk=lp_stride_chunk, lp_stride_h=lp_stride_h, lp_stride_s=lp_stride_s,
            write_lse=write_lse,
            sinks=sinks,
            sQ_ptr=sQ_ptr, ring_ptr=ring_ptr,
            sQ_mma=cute.recast_ptr(sQ_ptr, dtype=self.MMA_DTYPE),  # fp8 KV: Q rewritten in fp16 (q_to_f16)
            merge_ptr=cute.recast_ptr(sQ_ptr, dtype=Float32),
            q_layout=smem_tile_layout(_ROWS, self.D),
            tile_layout=tile_layout,
            # rows [0, KW) of a tile: the layout of a warp's keys at offset wn*KW*ATOM_W elements
            warp_layout=cute.local_tile(cute.make_tensor(ring_ptr, tile_layout), (self.KW, self.KV_COLS), (0, 0)).layout,
            g2s=make_g2s(self.dtype, _THREADS),
            g2s_kv=make_g2s(self.MMA_DTYPE, _THREADS, self.TPR * VEC),
            mma=tiled_mma,
            s2r_Q=cute.make_tiled_copy_A(ldsm, tiled_mma),
            s2r_K=cute.make_tiled_copy_B(ldsm, tiled_mma),
            s2r_V=cute.make_tiled_copy_B(ldsm_t, tiled_mma),
        )
        ctx.k_base, ctx.v_base, ctx.k_strides, ctx.v_strides = self.kv_thread_bases(
            ctx, Int32(tidx) & (_THREADS - 1), k, v, (k_stride_page, k_stride_token, k_stride_head),
            (v_stride_page, v_stride_token, v_stride_head))
        ctx.v_scale = Float32(1.0)
        if cutlass.const_expr(self.KV8):
            # the KV head's scales: attention over k_fp8 * k_scale and v_fp8 * v_scale
            softmax_scale = softmax_scale * k_descale[Int64(kvh) * Int64(descale_stride_h)]
            ctx.v_scale = v_descale[Int64(kvh) * Int64(descale_stride_h)]
        ctx.softmax_scale, ctx.softcap = softmax_scale, softcap
        if cutlass.const_expr(not self.KV8):
            score = ScoreScale(softmax_scale, softcap, self.SOFTCAP)
            ctx.scale_log2, ctx.cap_in = score.scale_log2, score.cap_in
        if cutlass.const_expr(self.PAGED):
            ctx.pg = cute.make_rmem_tensor((self.N_PG,), Int32)
        # per-warp state: fp32 O in 64-column chunks, running row max, per-thread partial row sums
        thr_mma0 = tiled_mma.get_slice(tidx & 31)
        ctx.acc_O = []
        for h in cutlass.range_constexpr(self.N_CHUNKS):
            acc = cute.make_rmem_tensor(thr_mma0.partition_shape_C((_ROWS, ATOM_COLS)), Float32)
            acc.fill(0.0)
            ctx.acc_O.append(acc)
        ctx.row_max = cute.make_rmem_tensor((2,), Float32)
        ctx.row_sum = cute.make_rmem_tensor((2,), Float32)
        ctx.row_max.fill(NEG_INF)
        ctx.row_sum.fill(0.0)
        ctx.rP = cute.make_rmem_tensor(thr_mma0.partition_shape_C((_ROWS, self.KW)), self.MMA_DTYPE)
        # key limit of this thread's two rows: j < min(hi, S_kv - S_q + 1 + i)
        cS = cute.make_identity_tensor((_ROWS, self.KW))
        t0ScS_mn = acc_mn_view(tiled_mma.get_slice(0).partition_C(cS))
        row0 = thr_mma0.partition_C(cS)[0][0]
        row_lim = cute.make_rmem_tensor((2,), Int32)
        row_lo = cute.make_rmem_tensor((2,), Int32)  # windowed: the row's first key
        for r in cutlass.range_constexpr(2):
            i_r = (row_tile * _ROWS + row0 + t0ScS_mn[r, 0][0]) // group
            row_lim[r] = cutlass.min(hi, s_kv - seqlen_q + 1 + i_r)
            row_lo[r] = s_kv - seqlen_q + i_r - window_left
        ctx.row_lim = row_lim
        ctx.row_lo = row_lo
        ctx.upper_rows = Int32(n_rows - row_tile * _ROWS > 8)  # fp8: rows 8..15 of the tile are real ones

        self.prologue(ctx)
        if cutlass.const_expr(self.KV8):
            cute.arch.cp_async_wait_group(self.SLOTS - 2)  # tile 0's group, Q with it
            q_scale = self.q_to_f16(ctx, opaque_i32(ctx.tidx) & (_THREADS - 1))
            cute.arch.barrier()  # every thread's fp16 Q in smem (k_step loads its fragments from there)
            score = ScoreScale(ctx.softmax_scale * q_scale, ctx.softcap, self.SOFTCAP)
            ctx.scale_log2, ctx.cap_in = score.scale_log2, score.cap_in
        if cutlass.const_expr(self.WINDOW):
            for t in cutlass.range(n_left, unroll=1):
                self.k_step(ctx, t, True)
                self.v_step(ctx, t)
        for t in cutlass.range(n_plain - n_left, unroll=1):
            self.k_step(ctx, n_left + t, False)
            self.v_step(ctx, n_left + t)
        for t in cutlass.range(n_blocks - n_plain, unroll=1):
            self.k_step(ctx, n_plain + t, True)
            self.v_step(ctx, n_plain + t)
        self.epilogue(ctx)

    @cute.jit
    def __call__(
        self,
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer, o: cute.Pointer, lse: cute.Pointer,
        o_partial: cute.Pointer, lse_partial: cute.Pointer, counters: cute.Pointer, page_table: cute.Pointer,
        seqlens_kv: cute.Pointer, cu_seqlens_q: cute.Pointer,
        batch: Int32, seqlen_q: Int32, heads_q: Int32, heads_kv: Int32,
        target_chunks: Int32, max_pages: Int32, write_lse: Int32,
        softmax_scale: Float32,
        q_stride_b: Int64, q_stride_s: Int64, q_stride_h: Int64,
        k_stride_page: Int64, k_stride_token: Int64, k_stride_head: Int64,
        v_stride_page: Int64, v_stride_token: Int64, v_stride_head: Int64,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
        pt_stride_b: Int64, pt_stride_p: Int64,
        op_stride_chunk: Int64, op_stride_s: Int64, op_stride_h: Int64,
        lp_stride_chunk: Int64, lp_stride_h: Int64, lp_stride_s: Int64,
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
        k_descale: cute.Pointer, v_descale: cute.Pointer, descale_stride_h: Int32,
    ):
        # The real launch is done by the aotc runtime; this one only makes the module well formed,
        # with the same block and dynamic smem.
        group = heads_q // heads_kv
        row_tiles = (group * seqlen_q + (_ROWS - 1)) // _ROWS
        self.sdpa_decode_kernel(
            q, k, v, o, lse, o_partial, lse_partial, counters, page_table, seqlens_kv, cu_seqlens_q,
            batch, seqlen_q, heads_q, heads_kv, target_chunks, max_pages, write_lse,
            softmax_scale,
            q_stride_b, q_stride_s, q_stride_h,
            k_stride_page, k_stride_token, k_stride_head,
            v_stride_page, v_stride_token, v_stride_head,
            o_stride_b, o_stride_s, o_stride_h,
            lse_stride_b, lse_stride_h, lse_stride_s,
            pt_stride_b, pt_stride_p,
            op_stride_chunk, op_stride_s, op_stride_h,
            lp_stride_chunk, lp_stride_h, lp_stride_s,
            sinks, window_left, softcap, k_descale, v_descale, descale_stride_h,
        ).launch(
            grid=[heads_kv * row_tiles, target_chunks + batch, 1],
            block=[_THREADS, 1, 1],
            smem=self.smem_size,
            # fp8: ptxas fits the tile's CTAs an SM in registers (the carveout is the runtime's; given here
            # only so that the DSL does not ask a device for one)
            min_blocks_per_mp=self.tile.ctas_per_sm if self.KV8 else 0,
            preferred_smem_carveout=100 if self.KV8 else None,
        )



# ---------------------------------------------------------------------------- compile

def compile(variant, *, dump_dir: str, keep_ptx: bool = False, tile: Tile | None = None) -> KernelBuild:
    """Compile one sdpa_decode variant for variant.arch (the family's tile for its head dim and arch, or
    `tile`). The entry's parameters are exactly aotc.families.sdpa_decode.PARAMS; the launch is block
    (128, 1, 1), grid (num_splits, heads_kv * ceil(group * seqlen_q / ROWS_PER_CTA), batch) with the
    recorded dynamic shared memory (over 48 KiB: the runtime raises the kernel's attribute)."""
    return compile_kernel(SdpaDecode(variant, tile), variant.arch, dump_dir, keep_ptx=keep_ptx)
