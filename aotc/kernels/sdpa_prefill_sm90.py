"""CuTe DSL kernel for the sdpa_prefill_sm90 family (see aotc.families.sdpa_prefill_sm90).

Hopper flash-attention forward: TMA loads into a shared-memory ring guarded by mbarriers,
wgmma tensor-core GEMMs, warp specialization, a persistent tile loop.

Work unit: a tile of block_m query rows (TILES: 128, 192 for D64) of one (batch, head), its kv loop in
blocks of block_n keys (the variant's field). The grid has at most one CTA per SM, each running a
fixed sequence of tiles (work_item()). Non-causal: in round i, CTA c
takes tile i * gridDim.x + c (c reversed in odd rounds: a snake), m_block fastest, so the CTAs of
one head share its K/V in L2. Causal, when tile pairs are taken (D128/D256: whenever there are at
least gridDim.x pairs; D64: with more (batch, head) pairs than gridDim.x / 2): CTA c takes the pairs
of tiles (m_blocks-1-j, j) of one head, pair k * gridDim.x + c, j fastest: every pair costs the same,
and the CTAs running together work on a few heads whose K/V stay in L2; an odd m_blocks leaves a
middle tile per head without a partner, and those come after all the full pairs. Otherwise the same snake
over the tiles longest first, which evens out their unequal lengths (but longest-first over 128
heads at S 2048 kept DRAM 77% busy; grouping heads instead left SMs idle 23% of the time).
A CTA is 1 + block_m / 64 warpgroups (3 or 4, 384 or 512 threads; REGISTERS gives the split of the
register file):

  warpgroup 0, producer (24 or 32 registers/thread after setmaxnreg): one elected thread issues the
      TMA loads of each tile: K of its first kv block, then Q (one 64-row box per consumer
      warpgroup and 64-column chunk of D, once the consumers have released Q's buffer), then
      V and the other kv blocks, the last block first, into a `stages`-deep ring. full[s]
      barriers count the bytes in (expect_tx); empty[s] and Q_EMPTY collect one arrive per
      consumer warp.
  warpgroups 1.., consumers (240 or 160 registers/thread): each owns 64 query rows. Block 0:
      S = Q K^T (wgmma, both operands in smem, fp32), [mask], online softmax, P to fp16/bf16 in
      registers. Block t >= 1: S(t) = Q K(t)^T and O += P(t-1) V(t-1) (wgmma with A from
      registers, V^T read MN-major from smem) are issued together; the softmax of S(t) runs
      while the PV GEMM is in flight; then O is rescaled and P(t) replaces P(t-1). Last: O +=
      P V. Q's buffer is released after the tile's last S GEMM, so the next tile's Q loads
      during this one's last GEMM and epilogue. Optional ping-pong named barriers make the
      warpgroups take turns issuing GEMMs, round robin (TILES says per tile).

The ring's stage and phase follow from a running count of kv blocks that producer and
consumers advance alike (ring()), so no pipeline state is exchanged.

Masks, empty rows and LSE follow the portable family (aotc.kernels._attention): key j is
visible to query i iff j < S_kv and, causal (bottom-right), j <= i + S_kv - S_q; blocks needing
a mask run in a loop of their own; a row that sees no key gets O = 0 and LSE = -inf. Rows of
Q/K/V past the tensor end read as zero (TMA out-of-bounds fill).

Epilogue per consumer warpgroup: O / rowsum -> fp16/bf16 -> its O staging slab in smem (its Q
slab for D256 and for D128 at block_n 176, which have no room for one; Q is then released after the
slab is read back) -> 128-bit stores of the rows < S_q; LSE by one thread per quad.
"""
from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warpgroup
from cutlass.experimental import primitives as prims
from cutlass.experimental.cuda.tensor_map import TensorMap, TensorMapSwizzle, create_tensor_map_tiled
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from ..families.sdpa_prefill_sm90 import (PARAMS, Q_BOX_ROWS, REGISTERS, TMA_BOX_COLS, WARPGROUP, consumer_warpgroups,
                                          threads, tile)
from ._attention import (DTYPES, LOG2_E, NEG_INF, VEC, kv_block_range, make_s2g, normalize_rows, seq_bounds,
                         softmax_row, store_converted_pairs)
from ._compile import check_param_kinds, compile_least_spilling, placeholders


_WG = WARPGROUP  # threads per warpgroup
# Causal tile order. D128 and D256 take tile pairs whenever the pairs fill the grid; D64 (192-row tiles,
# three consumer warpgroups) only when a round would hold fewer than _PAIRS_MIN_TILES_PER_HEAD tiles of
# each head, else the longest-first snake. Measured in one run with settled clocks (session 6,
# benchmarks/results/prefill_experiment_causal_pairs_threshold.json), against cuDNN: pairs always
# lifted D128 bf16 S4096 0.99 -> 1.10-1.15x and S8192 1.03-1.05 -> 1.08-1.11x, D256 S8192 0.99-1.03 ->
# 1.08x; D64 lost 5-9% with pairs at S 8192-16384.
_PAIRS_WHENEVER_THEY_FILL_THE_GRID = {64: False, 128: True, 256: True}
_PAIRS_MIN_TILES_PER_HEAD = 2


# Tiles whose P stays converted to 16 bits the way LLVM does it by itself (one vector conversion), not in
# explicit pairs (_attention.store_converted_pairs). D256 at block_n 80: ptxas then splits its PV GEMM into
# five wgmma groups (the 40-value P is half converted singly and merged with PRMTs between the wgmmas),
# yet in same-process A/B runs the paired conversion, one group, measured 0.94-0.99x of it (session 9,
# benchmarks/results/prefill_experiment_d128_block_n_176.json; session 8: mean 0.98). Every other width
# that is not a power of two needs the pairs: at D128 block_n 176, ptxas serialized all 11 PV wgmmas.
_P_CONVERTED_WHOLE = {(256, 80)}
_SMEM_LIMIT = 227 * 1024  # per CTA on sm_90
_BARRIER_BYTES = 1024     # the mbarriers, padded to the 1024-byte alignment of the tiles
_STATIC_SMEM = 1024       # static shared memory the compiled kernel reserves besides the dynamic


def separate_o(head_dim: int, block_n: int) -> bool:
    """Whether an O staging tile fits beside Q and the K/V ring (else O is staged in Q's tile,
    and the next tile's Q waits for the epilogue)."""
    bm, bn, stages, _ = tile(head_dim, block_n)
    return _BARRIER_BYTES + (2 * bm * head_dim + 2 * stages * bn * head_dim) * 2 <= _SMEM_LIMIT - _STATIC_SMEM


def smem_bytes(head_dim: int, block_n: int) -> int:
    """Q (block_m x D) [+ O staging] + K and V rings (stages x block_n x D) of 2-byte elements + mbarriers."""
    bm, bn, stages, _ = tile(head_dim, block_n)
    tiles = bm * head_dim * (2 if separate_o(head_dim, block_n) else 1) + 2 * stages * bn * head_dim
    return _BARRIER_BYTES + tiles * 2


# ---------------------------------------------------------------------------- layout helpers

def _acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View a wgmma accumulator ((2, 2, N/8), MMA_M, MMA_N) as (rows, cols) of this thread."""
    lay = acc.layout
    mn = cute.make_layout(
        ((lay.shape[0][1], lay.shape[1]), (lay.shape[0][0], lay.shape[0][2], lay.shape[2])),
        stride=((lay.stride[0][1], lay.stride[1]), (lay.stride[0][0], lay.stride[0][2], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, mn)


def _acc_to_a_operand(layout: cute.Layout) -> cute.Layout:
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


def _smem_layout(dtype, rows: int, head_dim: int, stages: int):
    """(rows, D, stages), K-major 128-byte-swizzled wgmma atoms (8 x 64) stacked along rows first,
    then along D: each 64-column chunk of a stage is one contiguous TMA box of rows x 128 bytes."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, head_dim), dtype)
    return cute.tile_to_shape(atom, (rows, head_dim, stages), (0, 1, 2))


def _gemm(tiled_mma, acc, frag_a, frag_b, zero_init: bool):
    """Issue acc (+)= A B over every k slice as one wgmma group (the caller waits with wait_group)."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in range(cute.size(frag_a.shape[2])):  # static: a plain Python loop (not traced)
        cute.gemm(atom, acc, frag_a[None, None, k], frag_b[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


def _build(dtype, head_dim: int, block_n: int, ragged: bool, causal: bool):
    """The @cute.jit host function of one variant (its kernel has exactly PARAMS)."""
    bm, bn, stages, pingpong = tile(head_dim, block_n)
    D = head_dim
    chunks = D // TMA_BOX_COLS
    sep_o = separate_o(head_dim, bn)
    n_wg_rows = Q_BOX_ROWS  # query rows per consumer warpgroup
    n_wg = consumer_warpgroups(head_dim, bn)
    if D % TMA_BOX_COLS or bm % n_wg_rows or n_wg not in REGISTERS or bn % 16:
        raise ValueError(f"unsupported tile {(bm, bn, stages, pingpong)} for head_dim {head_dim}")
    n_threads = threads(head_dim, bn)
    consumer_warps = 4 * n_wg
    producer_regs, consumer_regs = REGISTERS[n_wg]
    elem_bytes = dtype.width // 8
    q_tx = n_wg_rows * D * elem_bytes * n_wg  # every warpgroup's Q slab, on one barrier
    p_whole = (D, bn) in _P_CONVERTED_WHOLE
    kv_tx = bn * D * elem_bytes

    @cute.struct
    class SharedStorage:
        bars: cute.struct.Align[cute.struct.MemRange[Int64, _BARRIER_BYTES // 8], 1024]
        sQ: cute.struct.Align[cute.struct.MemRange[dtype, bm * D], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[dtype, stages * bn * D], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[dtype, stages * bn * D], 1024]
        sO: cute.struct.Align[cute.struct.MemRange[dtype, bm * D if sep_o else 0], 1024]

    smem_size = SharedStorage.size_in_bytes()
    if smem_size != smem_bytes(D, bn):
        raise RuntimeError(f"shared storage is {smem_size} bytes, smem_bytes() says {smem_bytes(D, bn)}")

    # barrier indices in storage.bars
    Q_FULL = 0
    Q_EMPTY = 1

    def k_full(s):
        return 2 + s

    def k_empty(s):
        return 2 + stages + s

    def v_full(s):
        return 2 + 2 * stages + s

    def v_empty(s):
        return 2 + 3 * stages + s

    def ring(g):
        """(stage, phase) of the g-th kv block through the ring (g counts across tiles)."""
        return g % stages, (g // stages) & 1

    @cute.jit
    def snake(i, cta, n_ctas):
        """The tile CTA `cta` takes in round i (may be past the last tile: the caller skips it)."""
        pos = cta
        if i % 2 == 1:
            pos = n_ctas - 1 - cta
        return i * n_ctas + pos

    @cute.jit
    def work_item(i, cta, n_ctas, m_blocks, heads_q, batch, pairs):
        """(valid, m_block, head, batch index) of CTA `cta`'s i-th work item. Non-causal tiles cost the
        same: tile i * n_ctas + cta (snake order), m_block fastest (one head's CTAs share its K/V in
        L2). Causal, pairs != 0 (see _PAIRS_WHENEVER_THEY_FILL_THE_GRID): items 2k and 2k+1 are the
        tiles m_blocks-1-j and j of one head (a pair costs the same for every j), pair k * n_ctas + cta,
        j fastest: balanced, and the CTAs running at once cover few heads, whose K/V stay in L2; the
        middle tiles of an odd m_blocks (no partner) come after every full pair.
        Causal, pairs == 0: longest tiles first in snake order, which balances to the end."""
        n_bh = heads_q * batch
        valid = Int32(0)
        m_block = Int32(0)
        bh = Int32(0)
        if cutlass.const_expr(causal):
            if pairs != 0:
                # full pairs of every head first; with an odd m_blocks the unpaired middle tiles (half a
                # pair's cost) come last, so they fill in after the full pairs instead of landing on the
                # same CTAs every round (132 CTAs, 6 items per head at D64 S 2048: a sixth of the CTAs
                # got only middle tiles, the rest only full pairs)
                half = m_blocks // 2
                p = (i // 2) * n_ctas + cta
                j = p % cutlass.max(half, 1)
                bh = p // cutlass.max(half, 1)
                if p >= half * n_bh:  # a middle tile
                    j = half
                    bh = p - half * n_bh
                m_block = m_blocks - 1 - j
                if i % 2 == 1:
                    m_block = j
                if p < (m_blocks + 1) // 2 * n_bh:
                    if i % 2 == 0 or j != m_blocks - 1 - j:
                        valid = Int32(1)
            else:
                tile = snake(i, cta, n_ctas)
                m_block = m_blocks - 1 - tile // n_bh
                bh = tile % n_bh
                if tile < m_blocks * n_bh:
                    valid = Int32(1)
        else:
            tile = snake(i, cta, n_ctas)
            m_block = tile % m_blocks
            bh = tile // m_blocks
            if tile < m_blocks * n_bh:
                valid = Int32(1)
        return valid, m_block, bh % heads_q, bh // heads_q

    @cute.jit
    def tma_coords(col, row, head, bidx):
        if cutlass.const_expr(ragged):
            return [col, row, head]
        return [col, row, head, bidx]

    @cute.jit
    def load_kv(tma, base, full, empty, g, n, kv_row0, kv_head, bidx, bars):
        stage, phase = ring(g)
        cute.arch.mbarrier_wait(bars + empty(stage), phase ^ 1)  # a fresh barrier passes parity 1
        cute.arch.mbarrier_arrive_and_expect_tx(bars + full(stage), kv_tx)
        for c in cutlass.range_constexpr(chunks):
            prims.cp_async_bulk_tensor_shared_cta_global(
                base + (stage * bn * D + c * bn * TMA_BOX_COLS), tma.get_ptr(),
                tma_coords(c * TMA_BOX_COLS, kv_row0 + n * bn, kv_head, bidx), bars + full(stage))

    @cute.jit
    def producer_tile(tma_q, tma_k, tma_v, storage, q_row0, kv_row0, head, kv_head, bidx, m_block, n_max,
                      g0, q_count):
        """One elected thread: K of the tile's first kv block (it may stream in while the consumers
        still finish the previous tile), Q once the consumers have released Q's buffer, then the
        rest of the kv blocks, last one first. g0: the ring position of this tile's first block."""
        bars = storage.bars.data_ptr()
        sQ = storage.sQ.data_ptr()
        sK = storage.sK.data_ptr()
        sV = storage.sV.data_ptr()
        if n_max > 0:
            load_kv(tma_k, sK, k_full, k_empty, g0, n_max - 1, kv_row0, kv_head, bidx, bars)
        cute.arch.mbarrier_wait(bars + Q_EMPTY, (q_count & 1) ^ 1)
        cute.arch.mbarrier_arrive_and_expect_tx(bars + Q_FULL, q_tx)
        for w in cutlass.range_constexpr(n_wg):
            for c in cutlass.range_constexpr(chunks):
                prims.cp_async_bulk_tensor_shared_cta_global(
                    sQ + (w * n_wg_rows * D + c * n_wg_rows * TMA_BOX_COLS), tma_q.get_ptr(),
                    tma_coords(c * TMA_BOX_COLS, q_row0 + m_block * bm + w * n_wg_rows, head, bidx),
                    bars + Q_FULL)
        if n_max > 0:
            load_kv(tma_v, sV, v_full, v_empty, g0, n_max - 1, kv_row0, kv_head, bidx, bars)
        for t in cutlass.range(1, n_max, unroll=1):
            load_kv(tma_k, sK, k_full, k_empty, g0 + t, n_max - 1 - t, kv_row0, kv_head, bidx, bars)
            load_kv(tma_v, sV, v_full, v_empty, g0 + t, n_max - 1 - t, kv_row0, kv_head, bidx, bars)

    # ---- consumer warpgroups -------------------------------------------------------------
    # Named barriers: 1 .. n_wg are the consumer warpgroups' epilogue barriers, SCHED + w the "may
    # issue GEMMs" barrier of warpgroup w (ping-pong: the warpgroups take turns issuing their GEMMs,
    # in order 0, 1[, 2], 0, ..., so one's softmax runs while another's GEMMs occupy the tensor cores).
    SCHED = 1 + n_wg

    def sched_sync(ctx):
        if pingpong:  # a Python bool: decided while tracing
            cute.arch.barrier(barrier_id=SCHED + ctx.wg_index, number_of_threads=2 * _WG)

    def sched_arrive(ctx):
        if pingpong:  # let the next warpgroup issue
            cute.arch.barrier_arrive(barrier_id=SCHED + ctx.wg_next, number_of_threads=2 * _WG)

    def issue_qk(ctx, s):
        """S = Q K[stage s]^T, issued (one wgmma group), not waited for."""
        acc_S = cute.make_rmem_tensor(ctx.thr_qk.partition_shape_C((n_wg_rows, bn)), Float32)
        _gemm(ctx.mma_qk, acc_S, ctx.tSrQ, ctx.tSrK[None, None, None, s], zero_init=True)
        return acc_S

    def issue_pv(ctx, s):
        """O += P V[stage s] (P from registers), issued, not waited for."""
        _gemm(ctx.mma_pv, ctx.acc_O, ctx.tOrP, ctx.tOrVt[None, None, None, s], zero_init=False)

    @cute.jit
    def softmax(ctx, acc_S, n, masked: cutlass.Constexpr):
        """[mask] kv block n, online softmax: S -> P (in place), row max/sum updated, the O rescale
        factors left in ctx.alpha."""
        S_mn = _acc_mn_view(acc_S)
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        scale_log2 = ctx.scale_log2
        if cutlass.const_expr(masked):
            # key j (tile column c = j - n*bn) is visible to query i (tile row r) iff j < S_kv and,
            # causal, j <= i + S_kv - S_q, i.e. c < limit(r); c = this thread's col0 + thread 0's c
            col_lim = ctx.s_kv - n * bn - ctx.col0
            causal_lim = ctx.row0 + 1 + ctx.s_kv - ctx.s_q - n * bn - ctx.col0
        for r in cutlass.range_constexpr(cute.size(row_max)):
            if cutlass.const_expr(masked):
                lim_r = col_lim
                if cutlass.const_expr(causal):
                    lim_r = cutlass.min(col_lim, causal_lim + ctx.cS_mn[r, 0][0])
                for c in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
                    S_mn[r, c] = S_mn[r, c] if ctx.cS_mn[0, c][1] < lim_r else Float32(NEG_INF)
            alpha = softmax_row(S_mn, row_max, row_sum, r, scale_log2)
            ctx.alpha[r] = alpha

    @cute.jit
    def rescale_o(ctx):
        O_mn = _acc_mn_view(ctx.acc_O)
        for r in cutlass.range_constexpr(cute.size(ctx.alpha)):
            O_mn[r, None].store(O_mn[r, None].load() * ctx.alpha[r])

    @cute.jit
    def release_q(ctx):
        """This warpgroup is done with its Q slab (one arrive per warp on Q_EMPTY)."""
        cute.arch.sync_warp()
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(ctx.bars + Q_EMPTY)

    @cute.jit
    def store_p(ctx, acc_S):
        """P (the softmax'd S tile) to fp16/bf16 into the PV GEMM's A-operand registers."""
        if cutlass.const_expr(p_whole):
            ctx.rP.store(acc_S.load().to(dtype))
        else:
            store_converted_pairs(ctx.rP, acc_S)

    @cute.jit
    def first_block(ctx, n_max, g0):
        """kv iteration 0 (block n_max - 1, always in the masked range): S, softmax, P; O is still 0."""
        bars = ctx.bars
        s, phase = ring(g0)
        cute.arch.mbarrier_wait(bars + k_full(s), phase)
        sched_sync(ctx)
        acc_S = issue_qk(ctx, s)
        sched_arrive(ctx)
        warpgroup.wait_group(0)
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + k_empty(s))
        if cutlass.const_expr(sep_o):
            if n_max == 1:
                release_q(ctx)  # the tile's only S GEMM is done: the next tile's Q may load
        softmax(ctx, acc_S, n_max - 1, True)
        store_p(ctx, acc_S)

    @cute.jit
    def overlapped_block(ctx, t, n_max, g0, masked: cutlass.Constexpr):
        """kv iteration t >= 1 (block n = n_max - 1 - t): S(t) = Q K(t)^T and O += P(t-1) V(t-1) are
        issued together; the softmax of S(t) runs while the PV GEMM is in flight; then O is rescaled
        and P(t) replaces P(t-1) in the A-operand registers."""
        bars = ctx.bars
        s, phase = ring(g0 + t)
        sp, phase_p = ring(g0 + t - 1)
        cute.arch.mbarrier_wait(bars + k_full(s), phase)
        sched_sync(ctx)
        acc_S = issue_qk(ctx, s)
        cute.arch.mbarrier_wait(bars + v_full(sp), phase_p)
        issue_pv(ctx, sp)
        sched_arrive(ctx)
        warpgroup.wait_group(1)  # S(t) done; PV(t-1) may still run
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + k_empty(s))
        if cutlass.const_expr(sep_o):
            if t == n_max - 1:
                release_q(ctx)  # the tile's last S GEMM is done: the next tile's Q may load
        softmax(ctx, acc_S, n_max - 1 - t, masked)
        warpgroup.wait_group(0)  # PV(t-1) done: O and P(t-1) are free
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + v_empty(sp))
        rescale_o(ctx)
        store_p(ctx, acc_S)

    @cute.jit
    def last_block(ctx, n_max, g0):
        """O += P(last) V(last)."""
        bars = ctx.bars
        s, phase = ring(g0 + n_max - 1)
        cute.arch.mbarrier_wait(bars + v_full(s), phase)
        sched_sync(ctx)
        issue_pv(ctx, s)
        sched_arrive(ctx)
        warpgroup.wait_group(0)
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + v_empty(s))

    @cute.jit
    def epilogue(ctx, o, wg_index):
        """O = acc / rowsum -> smem (this warpgroup's Q slab) -> 128-bit stores of rows < S_q; LSE."""
        acc_O = ctx.acc_O
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        n_rows = cute.size(row_max)
        O_mn = _acc_mn_view(acc_O)
        lse_r = cute.make_rmem_tensor((n_rows,), Float32)
        normalize_rows(O_mn, row_max, row_sum, ctx.scale_log2, lse_r)

        rO = cute.make_rmem_tensor_like(acc_O, dtype)
        rO.store(acc_O.load().to(dtype))
        sO = ctx.sO_wg  # this warpgroup's O staging slab (its Q slab when there is no room for one)
        r2s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=32)
        r2s = cute.make_tiled_copy_C(r2s_atom, ctx.mma_pv).get_slice(ctx.wg_tid)
        # every thread of the warpgroup is done reading the slab (previous tile's stores, or its
        # S GEMMs when the slab is Q's) before it is overwritten
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)

        s2g = make_s2g(dtype, _WG)
        s2g_thr = s2g.get_slice(ctx.wg_tid)
        row_base = ctx.m_block * bm + wg_index * n_wg_rows  # first row of this warpgroup's slab
        # the runtime guarantees 16-byte aligned O and strides that are multiples of 8 elements
        # (assumed here, where it is used: a value carried into the tile loop loses its assumptions)
        o_ss = cute.assume(ctx.o_ss, divby=VEC)
        o_tile = o + cute.assume(ctx.o_off + Int64(row_base) * o_ss, divby=VEC)
        gO = cute.make_tensor(o_tile, cute.make_layout((n_wg_rows, D), stride=(o_ss, 1)))
        tOsO = s2g_thr.partition_S(sO)
        tOgO = s2g_thr.partition_D(gO)
        tOrO = cute.make_rmem_tensor_like(tOsO, dtype)
        cute.autovec_copy(tOsO, tOrO)
        if cutlass.const_expr(not sep_o):
            release_q(ctx)  # O staged in Q's slab: read back, the next tile's Q may come
        cO = cute.make_identity_tensor((n_wg_rows, D))
        t0OcO = s2g.get_slice(0).partition_S(cO)
        o_lim = ctx.s_q - row_base - s2g_thr.partition_S(cO)[0][0]
        for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
            if t0OcO[0, m, 0][0] < o_lim:
                cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])

        if ctx.write_lse != 0:
            if ctx.lane % 4 == 0:  # one thread of each quad writes the quad's rows
                row_lim = ctx.s_q - ctx.row0
                for r in cutlass.range_constexpr(n_rows):
                    rr = ctx.cS_mn[r, 0][0]
                    if rr < row_lim:
                        i = Int64(ctx.row0 + rr)
                        ctx.lse[ctx.lse_off + i * ctx.lse_ss] = lse_r[r]

    @cute.kernel
    def sdpa_prefill_sm90_kernel(
        tma_q: cutlass.GridConstant[TensorMap], tma_k: cutlass.GridConstant[TensorMap],
        tma_v: cutlass.GridConstant[TensorMap],
        o: cute.Pointer, lse: cute.Pointer, cu_seqlens_q: cute.Pointer, cu_seqlens_kv: cute.Pointer,
        batch: Int32, seqlen_q: Int32, seqlen_kv: Int32,
        heads_q: Int32, heads_kv: Int32, write_lse: Int32,
        softmax_scale: Float32,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        first_tile, _, _ = cute.arch.block_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        first_tile = Int32(first_tile)
        n_ctas = Int32(n_ctas)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp_idx // 4

        storage = SmemAllocator().allocate(SharedStorage)
        bars = storage.bars.data_ptr()
        if warp_idx == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bars + Q_FULL, 1)
                cute.arch.mbarrier_init(bars + Q_EMPTY, consumer_warps)
                for s in cutlass.range_constexpr(stages):
                    cute.arch.mbarrier_init(bars + k_full(s), 1)
                    cute.arch.mbarrier_init(bars + v_full(s), 1)
                    cute.arch.mbarrier_init(bars + k_empty(s), consumer_warps)
                    cute.arch.mbarrier_init(bars + v_empty(s), consumer_warps)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        # persistent: each CTA runs `rounds` work items (work_item); an item past the end, or past its
        # sequence's end (the grid covers max_seqlen_q), is skipped by every warpgroup alike
        m_blocks = (seqlen_q + (bm - 1)) // bm
        n_bh = heads_q * batch
        rounds = (m_blocks * n_bh + (n_ctas - 1)) // n_ctas
        pairs = Int32(0)
        if cutlass.const_expr(causal):
            # tile pairs (see _PAIRS_WHENEVER_THEY_FILL_THE_GRID): longest-first over many heads streams
            # nearly every head's K/V at once (ncu at S 2048: DRAM 77% busy), and grouping heads instead
            # unbalanced the CTAs (SMs idle 23% of the time); with fewer pairs than CTAs the snake's
            # one tile per CTA is the shorter critical path
            n_pairs = (m_blocks + 1) // 2 * n_bh
            take_pairs = n_bh * _PAIRS_MIN_TILES_PER_HEAD > n_ctas
            if cutlass.const_expr(_PAIRS_WHENEVER_THEY_FILL_THE_GRID[D]):
                take_pairs = n_pairs >= n_ctas
            if take_pairs:
                pairs = Int32(1)
                rounds = 2 * ((n_pairs + (n_ctas - 1)) // n_ctas)
        group = heads_q // heads_kv

        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if warp_idx == 0:
                with cute.arch.elect_one():
                    g0 = Int32(0)       # ring position of the next kv block
                    q_count = Int32(0)  # Q tiles loaded so far
                    for i in cutlass.range(rounds, unroll=1):
                        valid, m_block, head, bidx = work_item(i, first_tile, n_ctas, m_blocks, heads_q, batch,
                                                               pairs)
                        q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q,
                                                                  cu_seqlens_kv, ragged)
                        if valid != 0 and m_block * bm < s_q:
                            n_max, _ = kv_block_range(m_block, s_q, s_kv, bm, bn, causal)
                            producer_tile(tma_q, tma_k, tma_v, storage, q_start, kv_start, head, head // group,
                                          bidx, m_block, n_max, g0, q_count)
                            g0 = g0 + n_max
                            q_count = q_count + 1
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            wg_index = wg - 1
            wg_tid = tidx % _WG
            mma_qk = sm90_utils.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
                atom_layout_mnk=(1, 1, 1), tiler_mn=(n_wg_rows, bn))
            mma_pv = sm90_utils.make_trivial_tiled_mma(
                dtype, dtype, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(1, 1, 1), tiler_mn=(n_wg_rows, D), a_source=warpgroup.OperandSource.RMEM)
            # the swizzle goes into the pointer (wgmma wants affine layouts)
            lq = _smem_layout(dtype, n_wg_rows, D, n_wg)  # (64, D, warpgroup)
            lkv = _smem_layout(dtype, bn, D, stages)   # (bn, D, stage)
            sQ = storage.sQ.get_tensor(lq.outer, swizzle=lq.inner)
            sK = storage.sK.get_tensor(lkv.outer, swizzle=lkv.inner)
            sV = storage.sV.get_tensor(lkv.outer, swizzle=lkv.inner)
            # V^T (D, bn, stage): the same bytes read MN-major
            sVt = cute.make_tensor(sV.iterator, cute.select(sV.layout, mode=[1, 0, 2]))
            thr_qk = mma_qk.get_slice(wg_tid)
            thr_pv = mma_pv.get_slice(wg_tid)
            ctx = SimpleNamespace()
            ctx.bars = bars
            ctx.lane = tidx % 32
            ctx.wg_tid = wg_tid
            ctx.wg_index = wg_index
            ctx.wg_next = (wg_index + 1) % n_wg
            ctx.mma_qk = mma_qk
            ctx.mma_pv = mma_pv
            ctx.thr_qk = thr_qk
            sQ_wg = sQ[None, None, wg_index]
            ctx.sO_wg = sQ_wg
            if cutlass.const_expr(sep_o):
                ctx.sO_wg = storage.sO.get_tensor(lq.outer, swizzle=lq.inner)[None, None, wg_index]
            ctx.tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ_wg))
            ctx.tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
            ctx.tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))
            ctx.acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((n_wg_rows, D)), Float32)
            cS = cute.make_identity_tensor((n_wg_rows, bn))
            # this thread's accumulator coordinates: thread 0's (compile time) + (row, col) offset
            tScS = thr_qk.partition_C(cS)
            ctx.cS_mn = _acc_mn_view(mma_qk.get_slice(0).partition_C(cS))
            ctx.col0 = tScS[0][1]  # this thread's first column in a kv tile
            n_rows = cute.size(ctx.cS_mn, mode=[0])
            ctx.row_max = cute.make_rmem_tensor((n_rows,), Float32)
            ctx.row_sum = cute.make_rmem_tensor((n_rows,), Float32)
            ctx.alpha = cute.make_rmem_tensor((n_rows,), Float32)
            # P (fp16/bf16) in the A-operand layout of the PV GEMM, carried across iterations
            ctx.rP = cute.make_rmem_tensor(thr_qk.partition_shape_C((n_wg_rows, bn)), dtype)
            ctx.tOrP = cute.make_tensor(ctx.rP.iterator, _acc_to_a_operand(ctx.rP.layout))
            ctx.scale_log2 = softmax_scale * Float32(LOG2_E)
            ctx.write_lse = write_lse
            ctx.lse = lse
            ctx.o_ss = o_stride_s
            ctx.lse_ss = lse_stride_s

            if cutlass.const_expr(pingpong):
                if wg_index == 0:  # the first consumer warpgroup issues first
                    cute.arch.barrier_arrive(barrier_id=SCHED, number_of_threads=2 * _WG)
            g0 = Int32(0)
            q_count = Int32(0)
            for i in cutlass.range(rounds, unroll=1):
                valid, m_block, head, bidx = work_item(i, first_tile, n_ctas, m_blocks, heads_q, batch, pairs)
                q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q, cu_seqlens_kv, ragged)
                if valid != 0 and m_block * bm < s_q:
                    n_max, n_mask_min = kv_block_range(m_block, s_q, s_kv, bm, bn, causal)
                    # this tile's values on a copy of ctx (ctx itself keeps one structure across the loop)
                    tile = SimpleNamespace(**vars(ctx))
                    tile.m_block = m_block
                    tile.s_q = s_q
                    tile.s_kv = s_kv
                    tile.row0 = m_block * bm + wg_index * n_wg_rows + tScS[0][0]  # this thread's first row
                    if cutlass.const_expr(ragged):
                        tile.o_off = Int64(q_start) * o_stride_s + Int64(head) * o_stride_h
                        tile.lse_off = Int64(head) * lse_stride_h + Int64(q_start) * lse_stride_s
                    else:
                        tile.o_off = Int64(bidx) * o_stride_b + Int64(head) * o_stride_h
                        tile.lse_off = Int64(bidx) * lse_stride_b + Int64(head) * lse_stride_h
                    ctx.acc_O.fill(0.0)
                    ctx.row_max.fill(NEG_INF)
                    ctx.row_sum.fill(0.0)
                    cute.arch.mbarrier_wait(bars + Q_FULL, q_count & 1)
                    # iterations 0 .. n_masked-1 (blocks n_max-1 .. n_mask_min) with masks, the rest without
                    n_masked = n_max - n_mask_min
                    if n_max > 0:
                        first_block(tile, n_max, g0)
                        for t in cutlass.range(1, n_masked, unroll=1):
                            overlapped_block(tile, t, n_max, g0, True)
                        for t in cutlass.range(cutlass.max(n_masked, 1), n_max, unroll=1):
                            overlapped_block(tile, t, n_max, g0, False)
                        last_block(tile, n_max, g0)
                    else:
                        if cutlass.const_expr(sep_o):
                            release_q(tile)  # no S GEMM at all: Q's buffer is free at once
                    epilogue(tile, o, wg_index)
                    g0 = g0 + n_max
                    q_count = q_count + 1

    @cute.jit
    def sdpa_prefill_sm90_host(
        q: cute.Pointer, k: cute.Pointer, v: cute.Pointer,
        o: cute.Pointer, lse: cute.Pointer, cu_seqlens_q: cute.Pointer, cu_seqlens_kv: cute.Pointer,
        batch: Int32, seqlen_q: Int32, seqlen_kv: Int32,
        heads_q: Int32, heads_kv: Int32, write_lse: Int32,
        softmax_scale: Float32,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
    ):
        # The real launch (and the real descriptors) come from the aotc runtime; this host code
        # only makes the module well formed: descriptors of the right rank, box and swizzle.
        def desc(ptr, rows):
            rank = 3 if ragged else 4
            dims = [D, seqlen_q, heads_q, batch][:rank]
            strides = [heads_q * D * elem_bytes // 16, D * elem_bytes // 16,
                       seqlen_q * heads_q * D * elem_bytes // 16][:rank - 1]
            return create_tensor_map_tiled(
                ptr.toint(), dtype, dims, strides, [TMA_BOX_COLS, rows] + [1] * (rank - 2),
                swizzle=TensorMapSwizzle.s128b)

        sdpa_prefill_sm90_kernel(
            desc(q, Q_BOX_ROWS), desc(k, bn), desc(v, bn),
            o, lse, cu_seqlens_q, cu_seqlens_kv,
            batch, seqlen_q, seqlen_kv, heads_q, heads_kv, write_lse, softmax_scale,
            o_stride_b, o_stride_s, o_stride_h, lse_stride_b, lse_stride_h, lse_stride_s,
        ).launch(
            grid=[132, 1, 1],
            block=[n_threads, 1, 1],
            smem=smem_size,
        )

    return sdpa_prefill_sm90_host


# ---------------------------------------------------------------------------- compile

def _placeholders(dtype) -> list:
    # the host function takes Q, K and V as pointers (it builds stand-in descriptors from them)
    pointers = {n: (dtype, 16) for n in ("tma_q", "tma_k", "tma_v", "o")}
    pointers.update(lse=(Float32, 4), cu_seqlens_q=(Int32, 4), cu_seqlens_kv=(Int32, 4))
    return placeholders(PARAMS, pointers)


def _check_params() -> None:
    check_param_kinds("sdpa_prefill_sm90", PARAMS, ["tensormap"] * 3 + ["ptr"] * 4 + ["i32"] * 6 + ["f32"] + ["i64"] * 6)


def _compile(variant, dump_dir: str, keep_ptx: bool):
    _check_params()
    if variant.family != "sdpa_prefill_sm90":
        raise ValueError(f"not an sdpa_prefill_sm90 variant: {variant.name}")
    if variant.arch != "sm_90a":
        raise ValueError(f"{variant.name}: sdpa_prefill_sm90 needs sm_90a (wgmma, setmaxnreg), got {variant.arch}")
    dtype = DTYPES[variant["dtype"]]
    head_dim, block_n = int(variant["head_dim"]), int(variant["block_n"])
    return compile_least_spilling(
        lambda: _build(dtype, head_dim, block_n, variant["layout"] == "ragged", bool(variant["causal"])),
        _placeholders(dtype), variant.arch, dump_dir, keep_ptx)


def compile(variant, *, dump_dir: str) -> tuple[bytes, str, dict]:
    """Compile one sdpa_prefill_sm90 variant: (cubin bytes, kernel symbol, {"dynamic_smem": bytes}).

    The entry's parameters are exactly aotc.families.sdpa_prefill_sm90.PARAMS; block
    (threads(D, block_n), 1, 1), grid (min(tiles, SMs), 1, 1) with tiles = ceil(max_seqlen_q / block_m)
    * heads_q * batch (the kernel is persistent), dynamic_smem bytes of dynamic shared memory.
    """
    _, cubin, symbol, _, _ = _compile(variant, dump_dir, keep_ptx=False)
    return cubin, symbol, {"dynamic_smem": smem_bytes(int(variant["head_dim"]), int(variant["block_n"]))}


def compile_with_ptx(variant, *, dump_dir: str) -> tuple[bytes, str, dict, str]:
    compiled, cubin, symbol, frame, level = _compile(variant, dump_dir, keep_ptx=True)
    facts = {"dynamic_smem": smem_bytes(int(variant["head_dim"]), int(variant["block_n"])), "ptxas": level,
             "frame_bytes": frame}
    return cubin, symbol, facts, str(compiled.__ptx__)
