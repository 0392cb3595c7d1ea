"""CuTe DSL kernel for the sdpa_prefill family (see aotc.families.sdpa_prefill).

FlashAttention-2 forward with warp-level tensor cores (mma.sync m16n8k16, fp32 accumulate),
cp.async and ldmatrix: the same code for sm_80, sm_86, sm_89, sm_90(a), sm_100a and sm_120a.

One CTA of 32*warps threads computes a (block_m x D) tile of O for one (batch, head):
CTA = (m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z; causal: m_block = gridDim.x - 1 -
blockIdx.x, the costliest tiles of each head dispatched first). The tiled MMA is
warps x 1 x 1 m16n8k16 atoms: warp w owns rows 16w..16w+15 of every (16*warps)-row slab.
Tiles (block_m, block_n, warps) come from aotc.families.sdpa_prefill.TILES.

Pipeline (one Q, one K and one V buffer in dynamic shared memory, 128-byte XOR swizzle):

  prologue:  cp.async the Q tile and the K tile of the last kv block           (commit)
  per kv block n, from the last one down to 0:
     wait all + barrier       K[n] (and Q) landed; every warp is done with V[n+1]
     cp.async V[n]            overlaps S = Q K^T                                 (commit)
     S = Q K[n]^T             ldmatrix Q, K; mma.sync; fp32
     wait all + barrier       V[n] landed; every warp is done with K[n]
     cp.async K[n-1]          overlaps the softmax and O += P V                  (commit)
     [mask], online softmax in fp32 (exp2 with scale*log2(e) folded in), rescale O
                              (D128/D256: lazily, only in warps where a row's max moved)
     O += P V[n]              P converted to fp16/bf16 in registers (the MMA's A operand),
                              ldmatrix.trans V, in 64-column chunks of D

The kv blocks are walked backwards so that the blocks needing a mask (the sequence tail and,
for causal, the blocks crossing the diagonal) come first, in a loop of their own; the other
blocks run without any mask arithmetic. Loads of kv blocks in the masked loop are predicated
on S_kv, rows past it zero-filled in smem (a stale NaN there would survive P*V as 0*NaN); the
blocks of the unmasked loop are entirely in bounds. Q rows past S_q are zero-filled too
(never stored). Nothing is read or written out of bounds.

Masks: key j is visible to query i iff j < S_kv and, causal (bottom-right aligned),
j <= i + S_kv - S_q. Blocks past the causal limit are not visited. A row that sees no key
keeps row max -inf (the exponent offset then uses 0, so every p is 0, not NaN) and gets
O = 0 and LSE = -inf. softmax_scale must be finite and > 0.

Epilogue: O = acc / rowsum -> fp16/bf16 -> smem (the Q buffer) -> 128-bit coalesced
stores of the rows < S_q; LSE = (max * scale * log2(e) + log2(rowsum)) * ln(2), fp32, by
one thread of each quad, when write_lse != 0.

Addressing: "general" strides are the Int64 parameters; "packed" computes contiguous
[B, S, H, D] strides from H and D (64-bit batch offset, 32-bit offsets inside a batch: a
batch's Q, K, V and O must each hold fewer than 2**31 elements) and contiguous
[B, H_q, S_q] LSE; ragged starts sequence b at token cu_seqlens[b] (LSE [H_q, total_q] with
its h/s strides). Offsets are declared multiples of 8 elements with cute.assume (the
runtime guarantees 16-byte aligned bases and strides multiple of 8), which keeps every
cp.async and every O store 128-bit.

Register pressure: per-thread address arithmetic is redone inside each kv iteration from an
opaque copy of the thread index and of the smem base (otherwise LLVM hoists dozens of
loop-invariant addresses into registers for the whole loop), and ptxas runs at -O3, or at
-O2 or -O1 where -O3 needs local memory (chosen by reading the cubin's frame size).
"""
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warp
from cutlass.memory import SmemAllocator

from ..families.kv_dtype import e4m3_row_bytes, kv_fp8
from ..families.sdpa_prefill import (PAGED_PARAMS, PARAMS, TILES, Tile, block_pages, launch_facts, page_size, pass_source,
                                     smem_bytes)
from .compile import PTXAS_LEVELS, KernelBuild, compile_kernel
from .fp8 import gemm_pv_e4m3, gemm_qk_e4m3, o_column, rewrite_q_f16
from .mask import kv_block_range, kv_loop_segments, mask_row, score_limits
from .seqlen import paged_seq_bounds, seq_bounds
from .softmax import (LOG2_E, MAX_SLACK_LOG2, NEG_INF, ScoreScale, normalize_rows, rescale_rows, softcap_row, softmax_row,
                      store_lse_rows)
from .warp_mma import (ATOM_COLS, DTYPES, VEC, acc_mn_view, acc_to_a_operand, check_accumulator_views, gemm_ldmatrix,
                       ldmatrix_atoms, make_g2s, make_s2g, make_warp_mma, opaque_i32, run_traced,
                       smem_tile_layout)


def _chunked_n(t: cute.Tensor) -> cute.Tensor:
    """(V, M, N) accumulator -> (V, M, (8, N/8)): mode (None, h) is the h-th 64 columns."""
    return cute.make_tensor(t.iterator, cute.logical_divide(t.layout, (None, None, ATOM_COLS // 8)))


class SdpaPrefill:
    """One portable prefill variant: dtype, head dim, dense or ragged, causal or not, general or packed
    strides, and the tile it runs (the family's for the head dim unless a tuner gives another)."""

    ptxas_levels = PTXAS_LEVELS
    params = PARAMS

    def __init__(self, variant, tile: Tile | None = None):
        if variant.family != "sdpa_prefill":
            raise ValueError(f"not an sdpa_prefill variant: {variant.name}")
        self.variant = variant
        self.dtype = dtype = DTYPES[variant["dtype"]]
        self.D = D = int(variant["head_dim"])
        self.ragged = ragged = variant["layout"] == "ragged"
        # paged (layout pagedP): ragged Q/O, K/V rows gathered through the page table (SdpaPrefillPaged)
        self.page = page = page_size(variant)
        self.paged = paged = page > 0
        if paged != (type(self).params is PAGED_PARAMS):
            raise ValueError(f"{variant.name}: a {'paged' if paged else 'dense or ragged'} variant is compiled by "
                             f"{'SdpaPrefillPaged' if paged else 'SdpaPrefill'} (sdpa_prefill.compile picks it)")
        self.causal = variant["causal"]
        # score features (aotc.families.features): compiled in or not, their values are parameters
        self.window, self.softcap, self.sinks = (bool(variant.get(f, False)) for f in ("window", "softcap", "sinks"))
        self.packed = packed = variant["strides"] == "packed"
        self.tile = tile or TILES[D]
        self.bm, self.bn, self.warps = bm, bn, warps = self.tile.block_m, self.tile.block_n, self.tile.warps
        self.threads = threads = self.tile.threads
        if D % ATOM_COLS or bm % (16 * warps) or bn % 16 or bm % (threads // 8) or bn % (threads // 8):
            raise ValueError(f"unsupported tile {self.tile} for head_dim {D}")
        if (ragged or paged) and packed:
            raise ValueError(f"{variant.name}: the packed specialization is for dense layouts")
        # a cp.async pass of a tile copies threads/8 consecutive rows: in one page (a power of two, a multiple
        # of the pass) they share one page id, and a kv block is whole pages or lies inside one
        self.pass_rows = threads // 8
        if paged and (page & (page - 1) or page % self.pass_rows):
            raise ValueError(f"{variant.name}: page {page} is not a power of two multiple of {self.pass_rows} rows")
        self.log2_page = page.bit_length() - 1 if paged else 0
        self.block_pages = block_pages(page, bn) if paged else 0  # page-table entries a kv block reads
        # lazy O rescale (aotc.kernels.softmax.MAX_SLACK_LOG2) where a thread's O tile outnumbers its scores
        # (D > block_n: 4x for D128 and D256), +1-4% on the H200; D64 (equal tiles) lost 1-2% with it
        self.lazy_rescale = D > bn
        # fp8 KV (paged): the K and V tiles hold e4m3 rows as 16-bit pairs (kv_cols = D/2 of them a row, the 16-bit
        # tiles' swizzle), loaded by ldmatrix as 16-bit tiles are and converted in registers (aotc.kernels.fp8, as
        # sdpa_decode does); the MMAs run in fp16, Q rewritten in fp16 times a power of two per tile
        self.kv8 = kv8 = kv_fp8(variant)
        if kv8 and not paged:
            raise ValueError(f"{variant.name}: fp8 KV is for the paged layouts")
        self.mma_dtype = cutlass.Float16 if kv8 else dtype
        self.kv_cols = kv_cols = D // 2 if kv8 else D
        # a tile row's pitch: fp8 D64's rows of 32 pairs (64 bytes) sit in the first half of a 64-column swizzle
        # atom; ldmatrix reads a (bn, 32) view of the tile, the other half is never read
        self.kv_pitch = kv_pitch = e4m3_row_bytes(D) // 2 if kv8 else D
        self.kv_pad = kv_cols < kv_pitch
        if kv_cols % ATOM_COLS and kv_cols != ATOM_COLS // 2:
            raise ValueError(f"{variant.name}: fp8 KV rows of {kv_cols} 16-bit pairs are not whole or half swizzle atoms")

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, bm * D], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.mma_dtype, bn * kv_pitch], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.mma_dtype, bn * kv_pitch], 1024]

        self.smem_size = SharedStorage.size_in_bytes()
        want = smem_bytes(D, self.tile, kv8)
        if self.smem_size != want:
            raise RuntimeError(f"shared storage is {self.smem_size} bytes, smem_bytes() says {want}")
        self.SharedStorage = SharedStorage

    def __str__(self) -> str:  # the kernel symbol's mangled name includes it
        return type(self).__name__

    def pointee_types(self) -> dict:
        kv = cutlass.Uint8 if self.kv8 else self.dtype
        return {"q": self.dtype, "k": kv, "v": kv, "o": self.dtype, "lse": Float32,
                "cu_seqlens_q": Int32, "cu_seqlens_kv": Int32, "seqlens_kv": Int32, "page_table": Int32,
                "sinks": Float32, "k_descale": Float32, "v_descale": Float32}

    def launch_facts(self):
        return launch_facts(self.variant, self.tile)

    # Every per-thread partition below is derived from an opaque copy of the thread index, made
    # separately in the prologue, in each kv iteration and in the epilogue. Otherwise LLVM
    # computes the thread's addresses once and keeps them all live across the kv loop (where
    # ptxas spills them); recomputing them costs a few integer ops per iteration.

    @cute.jit
    def load_kv_tile(self, ctx, tid, gX, sX, n, predicated: cutlass.Constexpr):
        """cp.async the (bn, D) tile n of K or V into sX; predicated: rows >= S_kv are zero-filled."""
        if cutlass.const_expr(self.paged):
            self.load_paged_tile(ctx, tid, gX, sX, n, predicated)
        else:
            self.load_dense_tile(ctx, tid, gX, sX, n, predicated)

    @cute.jit
    def load_paged_tile(self, ctx, tid, src, sX, n, predicated: cutlass.Constexpr):
        """load_kv_tile from the pools: src holds K's or V's base at this KV head and its (page, token)
        strides, ctx.paged the sequence's page-table row. Row pass r of the tile (pass_rows rows from thread
        0's row r, a multiple of pass_rows) lies in one page, the block's (row // P)-th (P < bn) or the one
        the block lies in (P >= bn), whose id is read once per page; a pass's rows at or past S_kv
        (predicated) and the rows of a page id outside [0, pages) are zero-filled in smem, never read."""
        thr = ctx.g2s_kv.get_slice(tid)
        tXsX = thr.partition_D(sX)  # (CPY, passes, kv_pitch/64)
        cKV = cute.make_identity_tensor((self.bn, self.kv_pitch))
        t0XcX = ctx.g2s_kv.get_slice(0).partition_S(cKV)  # compile-time row offsets
        t0 = n * self.bn  # the block's first token
        lim = ctx.s_kv - t0 - thr.partition_S(cKV)[0][0]
        pt = ctx.paged
        # the block's page ids: entry (t0 >> log2 P) + j of the row; -1 for a page past S_kv (a partial
        # last block of a short sequence: its rows are zero-filled, its entry may lie past the row's end)
        col0 = t0 >> self.log2_page
        pgs = []
        for j in cutlass.range_constexpr(self.block_pages):
            pg = Int32(-1)
            if t0 + j * self.page < ctx.s_kv:
                pg = pt.row[Int64(col0 + j) * pt.stride_p]
            pgs.append(pg)
        # where the block starts inside its page (P > bn; 0 otherwise: a block is whole pages)
        slot0 = Int32(0)
        if cutlass.const_expr(self.page > self.bn):
            slot0 = t0 & (self.page - 1)
        if cutlass.const_expr(self.kv_pad):
            # fp8 D64: the threads of a row's first kv_cols / 8 chunks copy it (the others would read past the row)
            in_row = (tid & 7) * VEC < self.kv_cols
        for r in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
            row = t0XcX[0, r, 0][0]  # the pass's first row in the block (compile time)
            j, pass_slot = pass_source(row, self.page, self.bn)
            slot = slot0 + pass_slot
            pg = pgs[j]
            # one unsigned compare: a page id outside [0, pages) is never dereferenced
            if cutlass.const_expr(self.kv_pad):
                if in_row and cutlass.Uint32(pg) < cutlass.Uint32(pt.pages) and row < lim:
                    self.copy_page_rows(ctx.g2s_kv, thr, src, pg, slot, tXsX[None, r, None])
                else:
                    tXsX[None, r, None].fill(0)
            elif cutlass.const_expr(predicated):
                if cutlass.Uint32(pg) < cutlass.Uint32(pt.pages) and row < lim:
                    self.copy_page_rows(ctx.g2s_kv, thr, src, pg, slot, tXsX[None, r, None])
                else:
                    tXsX[None, r, None].fill(0)
            else:
                if cutlass.Uint32(pg) < cutlass.Uint32(pt.pages):
                    self.copy_page_rows(ctx.g2s_kv, thr, src, pg, slot, tXsX[None, r, None])
                else:
                    tXsX[None, r, None].fill(0)

    @cute.jit
    def copy_page_rows(self, g2s, thr, src, pg, slot, dst):
        """cp.async this thread's part of pass_rows rows of page pg from slot `slot` on into dst (CPY, kv_cols/64)."""
        off = Int64(pg) * src.s_page + Int64(slot) * src.s_tok
        rows = cute.make_tensor(src.base + cute.assume(off, divby=VEC),
                                cute.make_layout((self.pass_rows, self.kv_pitch), stride=(src.s_tok, 1)))
        cute.copy(g2s, thr.partition_S(rows)[None, 0, None], dst)

    @cute.jit
    def load_dense_tile(self, ctx, tid, gX, sX, n, predicated: cutlass.Constexpr):
        """load_kv_tile from a contiguous K/V: gX its (bn, D, n_blocks) tiles."""
        thr = ctx.g2s.get_slice(tid)
        tXgX = thr.partition_S(gX)  # (CPY, CPY_N, CPY_D, n_blocks)
        tXsX = thr.partition_D(sX)
        if cutlass.const_expr(predicated):
            cKV = cute.make_identity_tensor((self.bn, self.D))
            t0XcX = ctx.g2s.get_slice(0).partition_S(cKV)  # compile-time row offsets
            lim = ctx.s_kv - n * self.bn - thr.partition_S(cKV)[0][0]
            for r in cutlass.range_constexpr(cute.size(tXsX.shape[1])):
                if t0XcX[0, r, 0][0] < lim:
                    cute.copy(ctx.g2s, tXgX[None, r, None, n], tXsX[None, r, None])
                else:
                    tXsX[None, r, None].fill(0)
        else:
            cute.copy(ctx.g2s, tXgX[None, None, None, n], tXsX)

    @cute.jit
    def prologue(self, ctx, n_max):
        """cp.async the Q tile (rows >= S_q zero-filled) and the K tile of block n_max - 1."""
        tid = opaque_i32(ctx.tidx) & (self.threads - 1)  # the mask tells LLVM 0 <= tid < threads
        thr = ctx.g2s.get_slice(tid)
        tQgQ = thr.partition_S(ctx.gQ)
        tQsQ = thr.partition_D(ctx.sQ)
        cQ = cute.make_identity_tensor((self.bm, self.D))
        t0QcQ = ctx.g2s.get_slice(0).partition_S(cQ)
        lim = ctx.s_q - ctx.m_block * self.bm - thr.partition_S(cQ)[0][0]
        for m in cutlass.range_constexpr(cute.size(tQsQ.shape[1])):
            if t0QcQ[0, m, 0][0] < lim:
                cute.copy(ctx.g2s, tQgQ[None, m, None], tQsQ[None, m, None])
            else:
                tQsQ[None, m, None].fill(0)
        if n_max > 0:
            self.load_kv_tile(ctx, tid, ctx.gK, ctx.sK, n_max - 1, True)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def kv_block(self, ctx, n, masked: cutlass.Constexpr):
        """kv block n: S = Q K^T, [mask], online softmax, O += P V; overlaps the V[n], K[n-1] loads."""
        tid = opaque_i32(ctx.tidx) & (self.threads - 1)  # the mask tells LLVM 0 <= tid < threads
        # smem views from an opaque zero offset, so that (base + constant) ldmatrix addresses
        # are not hoisted out of the loop either: the constants stay instruction immediates
        zero = cute.assume(opaque_i32(Int32(0)), divby=1024)
        sQ_ = ctx.sQ16 if cutlass.const_expr(self.kv8) else ctx.sQ  # fp8 KV: Q rewritten in fp16 (attend)
        sQ = cute.make_tensor(sQ_.iterator + zero, sQ_.layout)
        sK = cute.make_tensor(ctx.sK.iterator + zero, ctx.sK.layout)  # fp8 KV: (bn, kv_cols) e4m3 pairs
        sV = cute.make_tensor(ctx.sV.iterator + zero, ctx.sV.layout)
        if cutlass.const_expr(self.kv_pad):  # fp8 D64: the first half of each row's atom
            sK = cute.local_tile(sK, (self.bn, self.kv_cols), (0, 0))
            sV = cute.local_tile(sV, (self.bn, self.kv_cols), (0, 0))

        tiled_mma = ctx.tiled_mma
        thr_mma = tiled_mma.get_slice(tid)
        s2r_Q = ctx.s2r_Q.get_slice(tid)
        s2r_K = ctx.s2r_K.get_slice(tid)
        s2r_V = ctx.s2r_V.get_slice(tid)
        if cutlass.const_expr(not self.kv8):
            sVt = cute.composition(sV, cute.make_layout((self.D, self.bn), stride=(self.bn, 1)))  # V^T (D, bn)
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
        acc_S = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.bm, self.bn)), Float32)
        acc_S.fill(0.0)

        # K[n] (and Q) landed; every warp is done with V[n+1]: refill the V buffer
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        self.load_kv_tile(ctx, tid, ctx.gV, sV, n, masked)
        cute.arch.cp_async_commit_group()

        # S = Q K^T; the next k-slice's fragments are loaded while the current one multiplies
        if cutlass.const_expr(self.kv8):
            gemm_qk_e4m3(tiled_mma, thr_mma, s2r_Q, s2r_K, sQ, sK, acc_S, self.D)
        else:
            gemm_ldmatrix(tiled_mma, acc_S, s2r_Q, tSsQ, tSrQ_v, tSrQ, s2r_K, tSsK, tSrK_v, tSrK)

        # V[n] landed; every warp is done with K[n]: prefetch K[n-1] (entirely in bounds), unless n is the
        # loop's last block (n_min: 0, or the first block of the window)
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        if n > ctx.n_min:
            self.load_kv_tile(ctx, tid, ctx.gK, sK, n - 1, False)
        cute.arch.cp_async_commit_group()

        # [mask], online softmax, rescale O
        S_mn = acc_mn_view(acc_S)
        O_mn = acc_mn_view(acc_O)
        cS = cute.make_identity_tensor((self.bm, self.bn))
        t0ScS_mn = acc_mn_view(tiled_mma.get_slice(0).partition_C(cS))  # compile-time coords
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        scale_log2 = ctx.scale_log2
        if cutlass.const_expr(masked):
            # this thread's accumulator coordinates = thread 0's (compile time) + (row0, col0)
            tScS = thr_mma.partition_C(cS)
            row0 = tScS[0][0]
            col0 = tScS[0][1]
            key_lim, causal_lim = score_limits(ctx.m_block * self.bm + row0, n * self.bn, col0, ctx.s_q, ctx.s_kv)
        if cutlass.const_expr(self.lazy_rescale):
            alpha = cute.make_rmem_tensor((cute.size(row_max),), Float32)
            changed = False
        for r in cutlass.range_constexpr(cute.size(row_max)):
            if cutlass.const_expr(self.softcap):
                softcap_row(S_mn, r, ctx.cap_in)
            if cutlass.const_expr(masked):
                mask_row(S_mn, r, t0ScS_mn, key_lim, causal_lim, self.causal, self.window, ctx.window_left)
            if cutlass.const_expr(self.lazy_rescale):
                alpha[r] = softmax_row(S_mn, row_max, row_sum, r, scale_log2, MAX_SLACK_LOG2)
                changed = changed | (alpha[r] != Float32(1.0))
            else:
                O_mn[r, None].store(O_mn[r, None].load() * softmax_row(S_mn, row_max, row_sum, r, scale_log2))
        if cutlass.const_expr(self.lazy_rescale):
            if cute.arch.vote_any_sync(changed):  # warp-uniform: skipped while no row of the warp moved its max
                rescale_rows(O_mn, alpha)

        # O += P V; P converted in registers and viewed as the A operand
        rP = cute.make_rmem_tensor_like(acc_S, self.mma_dtype)
        rP.store(acc_S.load().to(self.mma_dtype))
        tOrP = cute.make_tensor(rP.iterator, acc_to_a_operand(rP.layout))
        # in 64-column chunks of D (one smem atom of V): only one chunk's V fragments (and the
        # next prefetched ones) are live at a time
        n_chunks = self.D // ATOM_COLS
        acc_O_c = _chunked_n(acc_O)
        if cutlass.const_expr(self.kv8):  # O's columns in the fp8 order (o_column), put back by the epilogue
            gemm_pv_e4m3(tiled_mma, thr_mma, s2r_V, sV, tOrP,
                         [acc_O] if n_chunks == 1 else [acc_O_c[None, None, (None, h)] for h in range(n_chunks)])
        else:
            steps = [(h, kk) for h in range(n_chunks) for kk in range(cute.size(tOrP.shape[2]))]

            def v_copy(h, kk):
                if cutlass.const_expr(n_chunks == 1):
                    cute.copy(s2r_V, tOsVt[None, None, kk], tOrVt_v[None, None, kk])
                else:
                    cute.copy(s2r_V, tOsVt[None, (None, h), kk], tOrVt_v[None, (None, h), kk])

            v_copy(*steps[0])
            for i in cutlass.range_constexpr(len(steps)):
                h, kk = steps[i]
                if cutlass.const_expr(i + 1 < len(steps)):
                    v_copy(*steps[i + 1])
                if cutlass.const_expr(n_chunks == 1):
                    cute.gemm(tiled_mma, acc_O, tOrP[None, None, kk], tOrVt[None, None, kk], acc_O)
                else:
                    acc_h = acc_O_c[None, None, (None, h)]
                    cute.gemm(tiled_mma, acc_h, tOrP[None, None, kk], tOrVt[None, (None, h), kk], acc_h)

    @cute.jit
    def epilogue(self, ctx):
        """O = acc / rowsum -> smem (the Q buffer) -> 128-bit stores of rows < S_q; LSE."""
        tid = opaque_i32(ctx.tidx) & (self.threads - 1)  # the mask tells LLVM 0 <= tid < threads
        tiled_mma = ctx.tiled_mma
        thr_mma = tiled_mma.get_slice(tid)
        acc_O = ctx.acc_O
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        n_rows = cute.size(row_max)
        O_mn = acc_mn_view(acc_O)
        lse_r = cute.make_rmem_tensor((n_rows,), Float32)
        sink_log2 = None
        if cutlass.const_expr(self.sinks):  # every row of the tile is of one query head
            sink_log2 = cute.make_rmem_tensor((n_rows,), Float32)
            sink_log2.fill(ctx.sinks[ctx.head] * Float32(LOG2_E))
        # (fp8 KV: O in units of V's scale, which the normalization takes)
        normalize_rows(O_mn, row_max, row_sum, ctx.scale_log2, lse_r, sink_log2, ctx.v_scale)

        # every cp.async retired (the Q tile too when no kv block ran), every warp done with sQ
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        sO = ctx.sQ
        if cutlass.const_expr(self.kv8):  # O's columns in the fp8 order (gemm_pv_e4m3), back in order of d
            coords = thr_mma.partition_C(cute.make_identity_tensor((self.bm, self.D)))
            for i in cutlass.range_constexpr(cute.size(rO)):
                r, c = coords[i]
                sO[r, o_column(c)] = rO[i]
        else:
            r2s = ctx.r2s.get_slice(tid)
            cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
        cute.arch.barrier()

        s2g_thr = ctx.s2g.get_slice(tid)
        tOsO = s2g_thr.partition_S(sO)
        tOgO = s2g_thr.partition_D(ctx.gO)
        tOrO = cute.make_rmem_tensor_like(tOsO, self.dtype)
        cute.autovec_copy(tOsO, tOrO)
        cO = cute.make_identity_tensor((self.bm, self.D))
        t0OcO = ctx.s2g.get_slice(0).partition_S(cO)
        o_lim = ctx.s_q - ctx.m_block * self.bm - s2g_thr.partition_S(cO)[0][0]
        for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
            if t0OcO[0, m, 0][0] < o_lim:
                cute.copy(ctx.s2g, tOrO[None, m, None], tOgO[None, m, None])

        if ctx.write_lse != 0:
            cS = cute.make_identity_tensor((self.bm, self.bn))
            tScS = thr_mma.partition_C(cS)
            t0ScS_mn = acc_mn_view(tiled_mma.get_slice(0).partition_C(cS))
            if tScS[0][1] == 0:  # one thread of each quad writes the quad's rows
                store_lse_rows(ctx.lse, ctx.lse_off, ctx.lse_ss, lse_r, t0ScS_mn, ctx.m_block * self.bm, tScS[0][0],
                               ctx.s_q)

    @cute.jit
    def tile_coords(self):
        """(thread, m_block, query head, sequence) of this CTA: grid (m_blocks, H_q, B)."""
        tidx, _, _ = cute.arch.thread_idx()
        m_block, head, bidx = cute.arch.block_idx()
        m_block = Int32(m_block)
        if cutlass.const_expr(self.causal):
            # longest first: under the bottom-right mask a tile's cost grows with m_block, and the
            # blocks are dispatched in blockIdx order, so the last (most expensive) tiles of each
            # head would otherwise start last and leave a long tail
            n_m, _, _ = cute.arch.grid_dim()
            m_block = Int32(n_m) - 1 - m_block
        return tidx, m_block, Int32(head), Int32(bidx)

    @cute.jit
    def attend(self, tidx, m_block, head, s_q, s_kv, mQ, mO, gK, gV, paged, lse, lse_off, lse_ss, write_lse,
               softmax_scale, softcap, sinks, window_left, v_scale=None):
        """One (block_m x D) tile of O for query head `head` of a sequence of s_q queries (mQ, mO: its (s_q, D)
        rows) and s_kv keys: gK, gV the (bn, D, n_blocks) tiles of a contiguous K/V (dense, ragged), or, paged,
        the pools' row sources (load_paged_tile), `paged` the sequence's page-table row. fp8 KV: softmax_scale
        has K's scale in it, v_scale is V's."""
        storage = SmemAllocator().allocate(self.SharedStorage)
        tiled_mma = make_warp_mma(self.mma_dtype, self.warps)
        ldsm, ldsm_t = ldmatrix_atoms(self.mma_dtype)
        r2s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32)
        ctx = SimpleNamespace(
            tidx=Int32(tidx), m_block=m_block, s_q=s_q, s_kv=s_kv,
            gQ=cute.local_tile(mQ, (self.bm, self.D), (m_block, 0)),
            gO=cute.local_tile(mO, (self.bm, self.D), (m_block, 0)),
            gK=gK, gV=gV, paged=paged,
            sQ=storage.sQ.get_tensor(smem_tile_layout(self.bm, self.D)),
            sQ16=cute.make_tensor(cute.recast_ptr(storage.sQ.data_ptr(), dtype=self.mma_dtype),
                                  smem_tile_layout(self.bm, self.D)),  # fp8 KV: Q rewritten (rewrite_q_f16)
            sK=storage.sK.get_tensor(smem_tile_layout(self.bn, self.kv_pitch)),
            sV=storage.sV.get_tensor(smem_tile_layout(self.bn, self.kv_pitch)),
            g2s=make_g2s(self.dtype, self.threads),
            g2s_kv=make_g2s(self.mma_dtype, self.threads),
            s2g=make_s2g(self.dtype, self.threads),
            tiled_mma=tiled_mma,
            s2r_Q=cute.make_tiled_copy_A(ldsm, tiled_mma),
            s2r_K=cute.make_tiled_copy_B(ldsm, tiled_mma),
            s2r_V=cute.make_tiled_copy_B(ldsm_t, tiled_mma),
            r2s=cute.make_tiled_copy_C(r2s_atom, tiled_mma),
            lse=lse, lse_off=lse_off, lse_ss=lse_ss, write_lse=write_lse,
            head=head, sinks=sinks, window_left=window_left, v_scale=v_scale,
        )
        if cutlass.const_expr(not self.kv8):
            score = ScoreScale(softmax_scale, softcap, self.softcap)
            ctx.scale_log2, ctx.cap_in = score.scale_log2, score.cap_in
        # fp32 O accumulator, running row max and per-thread partial row sum
        ctx.acc_O = cute.make_rmem_tensor(tiled_mma.partition_shape_C((self.bm, self.D)), Float32)
        ctx.acc_O.fill(0.0)
        n_rows = cute.size(acc_mn_view(ctx.acc_O), mode=[0])
        ctx.row_max = cute.make_rmem_tensor((n_rows,), Float32)
        ctx.row_sum = cute.make_rmem_tensor((n_rows,), Float32)
        ctx.row_max.fill(NEG_INF)
        ctx.row_sum.fill(0.0)

        # kv blocks n_max-1 .. n_min (mask.kv_blocks_for_queries); with none at all (S_kv = 0, or a causal
        # tile that sees no key) every loop runs 0 times and the epilogue writes O = 0, LSE = -inf
        n_min, n_max, n_mask_min, n_left_end = kv_block_range(m_block, s_q, s_kv, self.bm, self.bn, self.causal,
                                                              self.window, window_left)
        n_iter, n_right, n_plain_end = kv_loop_segments(n_min, n_max, n_mask_min, n_left_end)
        ctx.n_min = n_min

        self.prologue(ctx, n_max)
        if cutlass.const_expr(self.kv8):
            # Q (and the first K tile) landed: Q rewritten in fp16 times 2^-s, 2^s joining the softmax scale; the
            # block-wide max goes through the V tile, whose first load comes after the next barrier
            cute.arch.cp_async_wait_group(0)
            cute.arch.barrier()
            tid = opaque_i32(ctx.tidx) & (self.threads - 1)
            q_scale = rewrite_q_f16(ctx.g2s.get_slice(tid), ctx.sQ, ctx.sQ16, self.dtype,
                                    cute.recast_ptr(storage.sV.data_ptr(), dtype=Float32), self.warps, tid)
            cute.arch.barrier()  # every thread's fp16 Q in smem before any warp loads its fragments
            score = ScoreScale(softmax_scale * q_scale, softcap, self.softcap)
            ctx.scale_log2, ctx.cap_in = score.scale_log2, score.cap_in
        # blocks n_max-1 .. n_mask_min with masks and predicated loads, then the plain ones, then (a window)
        # the masked blocks of its left edge
        for t in cutlass.range(n_right, unroll=1):
            self.kv_block(ctx, n_max - 1 - t, True)
        for t in cutlass.range(n_right, n_plain_end, unroll=1):
            self.kv_block(ctx, n_max - 1 - t, False)
        if cutlass.const_expr(self.window):
            for t in cutlass.range(n_plain_end, n_iter, unroll=1):
                self.kv_block(ctx, n_max - 1 - t, True)
        self.epilogue(ctx)

    @cute.kernel
    def sdpa_prefill_kernel(
        self,
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
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
    ):
        tidx, m_block, head, bidx = self.tile_coords()
        q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q, cu_seqlens_kv, self.ragged)

        # the grid covers max_seqlen_q: tiles past this sequence's end do nothing
        if m_block * self.bm < s_q:
            kv_head = head // (heads_q // heads_kv)

            # -------------------------------------------------------- global tensors
            if cutlass.const_expr(self.packed):
                # contiguous [B, S, H, D]: 64-bit batch offset, 32-bit offsets inside a batch
                q_row = cute.assume(heads_q * self.D, divby=VEC)
                kv_row = cute.assume(heads_kv * self.D, divby=VEC)
                q_base = cute.assume(Int64(bidx) * Int64(s_q) * Int64(q_row), divby=VEC)
                kv_base = cute.assume(Int64(bidx) * Int64(s_kv) * Int64(kv_row), divby=VEC)
                q_ptr = q + q_base + cute.assume(head * self.D, divby=VEC)
                o_ptr = o + q_base + cute.assume(head * self.D, divby=VEC)
                k_ptr = k + kv_base + cute.assume(kv_head * self.D, divby=VEC)
                v_ptr = v + kv_base + cute.assume(kv_head * self.D, divby=VEC)
                q_ss = q_row
                o_ss = q_row
                k_ss = kv_row
                v_ss = kv_row
                lse_off = (Int64(bidx) * Int64(heads_q) + Int64(head)) * Int64(s_q)  # [B, H, S]
                lse_ss = Int64(1)
            else:
                q_ss = cute.assume(q_stride_s, divby=VEC)
                k_ss = cute.assume(k_stride_s, divby=VEC)
                v_ss = cute.assume(v_stride_s, divby=VEC)
                o_ss = cute.assume(o_stride_s, divby=VEC)
                lse_ss = lse_stride_s
                if cutlass.const_expr(self.ragged):
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
                q_ptr = q + cute.assume(q_off, divby=VEC)
                o_ptr = o + cute.assume(o_off, divby=VEC)
                k_ptr = k + cute.assume(k_off, divby=VEC)
                v_ptr = v + cute.assume(v_off, divby=VEC)

            mQ = cute.make_tensor(q_ptr, cute.make_layout((s_q, self.D), stride=(q_ss, 1)))
            mO = cute.make_tensor(o_ptr, cute.make_layout((s_q, self.D), stride=(o_ss, 1)))
            mK = cute.make_tensor(k_ptr, cute.make_layout((s_kv, self.D), stride=(k_ss, 1)))
            mV = cute.make_tensor(v_ptr, cute.make_layout((s_kv, self.D), stride=(v_ss, 1)))
            self.attend(tidx, m_block, head, s_q, s_kv, mQ, mO,
                        cute.local_tile(mK, (self.bn, self.D), (None, 0)),  # (bn, D, n_blocks)
                        cute.local_tile(mV, (self.bn, self.D), (None, 0)), None,
                        lse, lse_off, lse_ss, write_lse, softmax_scale, softcap, sinks, window_left)

    @cute.jit
    def __call__(
        self,
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
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
    ):
        # The real launch is done by the aotc runtime (grid from max_seqlen_q); this one only
        # makes the module well formed, with the same block and dynamic smem.
        self.sdpa_prefill_kernel(
            q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv,
            batch, seqlen_q, seqlen_kv, heads_q, heads_kv, write_lse, softmax_scale,
            q_stride_b, q_stride_s, q_stride_h,
            k_stride_b, k_stride_s, k_stride_h,
            v_stride_b, v_stride_s, v_stride_h,
            o_stride_b, o_stride_s, o_stride_h,
            lse_stride_b, lse_stride_h, lse_stride_s,
            sinks, window_left, softcap,
        ).launch(
            grid=[(seqlen_q + (self.bm - 1)) // self.bm, heads_q, batch],
            block=[self.threads, 1, 1],
            smem=self.smem_size,
        )


class SdpaPrefillPaged(SdpaPrefill):
    """A paged variant (layout pagedP, Runtime.attention's portable kernel): ragged Q/O, K/V rows gathered
    through the page table (load_paged_tile), the family's PAGED_PARAMS; everything past the sequence's
    bounds and addresses is SdpaPrefill.attend."""

    params = PAGED_PARAMS

    @cute.kernel
    def sdpa_prefill_paged_kernel(
        self,
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer, o: cute.Pointer, lse: cute.Pointer,
        cu_seqlens_q: cute.Pointer, seqlens_kv: cute.Pointer, page_table: cute.Pointer,
        batch: Int32, heads_q: Int32, heads_kv: Int32, write_lse: Int32, pages: Int32, max_pages: Int32,
        min_seqlen_q: Int32,
        softmax_scale: Float32,
        q_stride_s: Int64, q_stride_h: Int64,
        k_stride_page: Int64, k_stride_token: Int64, k_stride_head: Int64,
        v_stride_page: Int64, v_stride_token: Int64, v_stride_head: Int64,
        o_stride_s: Int64, o_stride_h: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
        pt_stride_b: Int64, pt_stride_p: Int64,
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
        k_descale: cute.Pointer, v_descale: cute.Pointer, descale_stride_h: Int32,
    ):
        tidx, m_block, head, bidx = self.tile_coords()
        q_start, s_q, s_kv = paged_seq_bounds(bidx, cu_seqlens_q, seqlens_kv, max_pages, self.page)

        # a sequence of fewer than min_seqlen_q queries is the decode kernel's; the grid's x extent comes from
        # the call's max_seqlen_q, and a CTA walks its query tiles m_block, m_block + gridDim.x, ... (one when
        # the bound holds; tiles past this sequence's queries do nothing), so no bound makes a row unwritten
        if m_block * self.bm < s_q and s_q >= min_seqlen_q:
            kv_head = head // (heads_q // heads_kv)
            if cutlass.const_expr(self.kv8):
                # e4m3 pools read as 16-bit pairs: strides (multiples of 16 bytes) halved; the KV head's scales:
                # attention over k_fp8 * k_scale (the softmax scale takes it) and v_fp8 * v_scale (O takes it)
                k_pairs = cute.recast_ptr(k, dtype=self.mma_dtype)
                v_pairs = cute.recast_ptr(v, dtype=self.mma_dtype)
                k_st = (k_stride_page // 2, k_stride_token // 2, k_stride_head // 2)
                v_st = (v_stride_page // 2, v_stride_token // 2, v_stride_head // 2)
                scale = softmax_scale * k_descale[Int64(kv_head) * Int64(descale_stride_h)]
                v_scale = v_descale[Int64(kv_head) * Int64(descale_stride_h)]
            else:
                k_pairs, v_pairs = k, v
                k_st = (k_stride_page, k_stride_token, k_stride_head)
                v_st = (v_stride_page, v_stride_token, v_stride_head)
                scale = softmax_scale
                v_scale = None
            q_off = Int64(q_start) * q_stride_s + Int64(head) * q_stride_h
            o_off = Int64(q_start) * o_stride_s + Int64(head) * o_stride_h
            mQ = cute.make_tensor(q + cute.assume(q_off, divby=VEC),
                                  cute.make_layout((s_q, self.D), stride=(cute.assume(q_stride_s, divby=VEC), 1)))
            mO = cute.make_tensor(o + cute.assume(o_off, divby=VEC),
                                  cute.make_layout((s_q, self.D), stride=(cute.assume(o_stride_s, divby=VEC), 1)))
            # K and V at this KV head, stepped by page and by token (load_paged_tile)
            gK = SimpleNamespace(base=k_pairs + cute.assume(Int64(kv_head) * k_st[2], divby=VEC),
                                 s_page=cute.assume(k_st[0], divby=VEC), s_tok=cute.assume(k_st[1], divby=VEC))
            gV = SimpleNamespace(base=v_pairs + cute.assume(Int64(kv_head) * v_st[2], divby=VEC),
                                 s_page=cute.assume(v_st[0], divby=VEC), s_tok=cute.assume(v_st[1], divby=VEC))
            paged = SimpleNamespace(row=page_table + Int64(bidx) * pt_stride_b, stride_p=pt_stride_p, pages=pages)
            lse_off = Int64(head) * lse_stride_h + Int64(q_start) * lse_stride_s
            n_m, _, _ = cute.arch.grid_dim()
            m_tiles = (s_q + (self.bm - 1)) // self.bm
            for m in cutlass.range(m_block, m_tiles, Int32(n_m), unroll=1):
                self.attend(tidx, m, head, s_q, s_kv, mQ, mO, gK, gV, paged,
                            lse, lse_off, lse_stride_s, write_lse, scale, softcap, sinks, window_left, v_scale)
                # every warp done reading the epilogue's O from the Q buffer before the next tile's Q lands there
                cute.arch.barrier()

    @cute.jit
    def __call__(
        self,
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer, o: cute.Pointer, lse: cute.Pointer,
        cu_seqlens_q: cute.Pointer, seqlens_kv: cute.Pointer, page_table: cute.Pointer,
        batch: Int32, heads_q: Int32, heads_kv: Int32, write_lse: Int32, pages: Int32, max_pages: Int32,
        min_seqlen_q: Int32,
        softmax_scale: Float32,
        q_stride_s: Int64, q_stride_h: Int64,
        k_stride_page: Int64, k_stride_token: Int64, k_stride_head: Int64,
        v_stride_page: Int64, v_stride_token: Int64, v_stride_head: Int64,
        o_stride_s: Int64, o_stride_h: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
        pt_stride_b: Int64, pt_stride_p: Int64,
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
        k_descale: cute.Pointer, v_descale: cute.Pointer, descale_stride_h: Int32,
    ):
        # The real launch is done by the aotc runtime (grid from the call's max_seqlen_q); this one only
        # makes the module well formed, with the same block and dynamic smem.
        self.sdpa_prefill_paged_kernel(
            q, k, v, o, lse, cu_seqlens_q, seqlens_kv, page_table,
            batch, heads_q, heads_kv, write_lse, pages, max_pages, min_seqlen_q, softmax_scale,
            q_stride_s, q_stride_h, k_stride_page, k_stride_token, k_stride_head,
            v_stride_page, v_stride_token, v_stride_head, o_stride_s, o_stride_h, lse_stride_h, lse_stride_s,
            pt_stride_b, pt_stride_p, sinks, window_left, softcap, k_descale, v_descale, descale_stride_h,
        ).launch(
            grid=[max_pages, heads_q, batch],
            block=[self.threads, 1, 1],
            smem=self.smem_size,
        )


# ---------------------------------------------------------------------------- static checks

# threads whose mappings verify_mappings() checks: every thread-index bit alone, and all of them
# (the partitions are affine in the thread index bits)
_CHECK_THREADS = (1, 2, 4, 8, 16, 32, 64, 127)


def _check_mappings_traced(dtype, head_dim: int, tile: Tile) -> list[str]:
    """The layout facts the kernel relies on, evaluated on static layouts (inside a jit trace).

    1-2. warp_mma.check_accumulator_views on the S tile (bm, bn) of each checked thread.
    3. gmem<->smem copies: each copy row-iteration r of a thread covers one row, thread 0's
       row r plus the thread's first row (row predicates), and iteration r is the pass of rows
       r * threads/8 .. (r+1) * threads/8 - 1 (a paged gather reads each pass from one page).
    4. O += P V in 64-column chunks: for chunk h, the accumulator tiles and the V fragment tiles
       have the same columns, the ldmatrix view of chunk h writes exactly the registers the
       chunk's MMAs read, and A and B agree on the k-slice.
    """
    bm, bn, warps = tile.block_m, tile.block_n, tile.warps
    D = head_dim
    threads = 32 * warps
    errors = []
    tiled_mma = make_warp_mma(dtype, warps)
    g2s = make_g2s(dtype, threads)
    ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype)
    s2r_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma)
    cS = cute.make_identity_tensor((bm, bn))
    cO = cute.make_identity_tensor((bm, D))
    cVt = cute.make_identity_tensor((D, bn))
    sV = cute.make_tensor(cute.make_ptr(dtype, 0, cute.AddressSpace.smem, assumed_align=1024), smem_tile_layout(bn, D))
    sVt = cute.composition(sV, cute.make_layout((D, bn), stride=(bn, 1)))
    t0S = acc_mn_view(tiled_mma.get_slice(0).partition_C(cS))
    n_chunks = D // ATOM_COLS
    for t in _CHECK_THREADS:
        if t >= threads:
            continue
        thr = tiled_mma.get_slice(t)
        errors += check_accumulator_views(thr, cS, t0S, f"thread {t}")  # 1, 2
        # 3
        for shape in ((bm, D), (bn, D)):
            cX = cute.make_identity_tensor(shape)
            tX = g2s.get_slice(t).partition_S(cX)
            t0X = g2s.get_slice(0).partition_S(cX)
            row0 = tX[0][0]
            # paged gathers (load_paged_tile): pass r is rows r*pass_rows .. +pass_rows-1, so it lies in one page
            if row0 >= threads // 8:
                errors.append(f"thread {t}: first copy row {row0} is not inside the first pass of {threads // 8} rows")
            for r in range(cute.size(tX, mode=[1])):
                if t0X[0, r, 0][0] != r * (threads // 8):
                    errors.append(f"copy row-iteration {r} of {shape} starts at row {t0X[0, r, 0][0]}, "
                                  f"not {r * (threads // 8)}")
                sub = tX[None, r, None]
                for i in range(cute.size(sub)):
                    if sub[i][0] != t0X[0, r, 0][0] + row0:
                        errors.append(f"thread {t}: copy row-iteration {r} of {shape} spans row {sub[i][0]}")
                        break
        # 4
        tOcO = _chunked_n(thr.partition_C(cO))
        tOcVt = thr.partition_B(cVt)  # (n, k) coordinates of the V^T fragment
        a_p = thr.partition_A(cS)     # (m, k) coordinates of P as the A operand
        frag = thr.make_fragment_B(thr.partition_B(sVt))
        F = frag.layout
        R = s2r_V.get_slice(t).retile(frag).layout
        n_kk = cute.size(F, mode=[2])
        if n_chunks > 1 and (cute.size(F, mode=[1]) != 8 * n_chunks or cute.size(R, mode=[1]) != 4 * n_chunks):
            errors.append(f"V fragment N modes {F.shape[1]} / {R.shape[1]} are not 64-column chunks")
            continue
        for h in range(n_chunks):
            for j in range(8):
                # the n8 tile (column // 8) of accumulator tile j of chunk h and of V tile j + 8h
                acc_cols = {tOcO[v, m, (j, h)][1] // 8 for v in range(4) for m in range(cute.size(tOcO, mode=[1]))}
                b_cols = {tOcVt[v, j + 8 * h, kk][0] // 8 for v in range(cute.size(tOcVt, mode=[0])) for kk in range(n_kk)}
                if len(acc_cols) != 1 or acc_cols != b_cols:
                    errors.append(f"thread {t}: chunk {h} tile {j}: acc cols {sorted(acc_cols)} != V cols {sorted(b_cols)}")
            for kk in range(n_kk):
                mma_regs = {F((v, j, kk)) for v in range(cute.size(F, mode=[0])) for j in range(8 * h, 8 * h + 8)} \
                    if n_chunks > 1 else {F((v, j, kk)) for v in range(cute.size(F, mode=[0])) for j in range(cute.size(F, mode=[1]))}
                cp_regs = {R((v, j, kk)) for v in range(cute.size(R, mode=[0])) for j in range(4 * h, 4 * h + 4)} \
                    if n_chunks > 1 else {R((v, j, kk)) for v in range(cute.size(R, mode=[0])) for j in range(cute.size(R, mode=[1]))}
                if mma_regs != cp_regs:
                    errors.append(f"thread {t}: chunk {h} k-slice {kk}: ldmatrix writes {sorted(cp_regs)}, mma reads {sorted(mma_regs)}")
                a_k = {a_p[v, m, kk][1] // 16 for v in range(cute.size(a_p, mode=[0])) for m in range(cute.size(a_p, mode=[1]))}
                b_k = {tOcVt[v, j, kk][1] // 16 for v in range(cute.size(tOcVt, mode=[0])) for j in range(cute.size(tOcVt, mode=[1]))}
                if a_k != {kk} or b_k != {kk}:
                    errors.append(f"thread {t}: k-slice {kk}: A in {a_k}, B in {b_k}")
    return errors


def verify_mappings(head_dim: int, dtype_name: str = "bf16", tile: Tile | None = None) -> list[str]:
    """Run the static layout checks for one head dim (no GPU needed); [] when all hold."""
    return run_traced(_check_mappings_traced, DTYPES[dtype_name], head_dim, tile or TILES[head_dim])


# ---------------------------------------------------------------------------- compile

def compile(variant, *, dump_dir: str, keep_ptx: bool = False, tile: Tile | None = None) -> KernelBuild:
    """Compile one sdpa_prefill variant for variant.arch (the family's tile for its head dim, or `tile`).

    The entry's parameters are exactly aotc.families.sdpa_prefill.PARAMS (paged: PAGED_PARAMS), in order;
    the launch is block (32*warps, 1, 1), grid (ceil(max_seqlen_q / block_m), heads_q, batch) with the recorded
    dynamic shared memory (over 48 KiB for head_dim 256: the runtime raises the kernel's attribute).
    """
    cls = SdpaPrefillPaged if page_size(variant) else SdpaPrefill
    return compile_kernel(cls(variant, tile), variant.arch, dump_dir, keep_ptx=keep_ptx)
