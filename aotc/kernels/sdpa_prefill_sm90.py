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
middle tile per head without a partner, and those come after all the full pairs; the pairs of the last
1-2 rounds' worth are split into single tiles that the CTAs draw from the runtime's tile counter, longest
first (PersistentTiles.drawn_plan), so CTAs that finish early take more and the launch ends on the
shortest tiles. Otherwise the same snake
over the tiles longest first, which evens out their unequal lengths (but longest-first over 128
heads at S 2048 kept DRAM 77% busy; grouping heads instead left SMs idle 23% of the time).
Ragged and paged calls enumerate their tiles from the device-side lengths instead (the sequences with the
most keys first, each sequence's tiles in head sections whose K/V fit L2, longest first), and every CTA draws
each tile after its first from the runtime's counter once its producer has issued the current tile's loads
(tile_scheduler.RaggedTiles: unpaged_ragged_tile, paged_tile, draw_next; the producer locates each tile and
hands it to the other warps whole, publish_tile/take_tile). A paged launch of fewer tiles than CTAs splits each
tile's kv blocks over several CTAs (KV splits: item_kv_range, tile_splits), whose fp32 partials the last split of
a tile to arrive merges in its epilogue (split_arrive, merge_splits). A dense non-causal D128 or D256 launch whose tiles
do not fill its last round (the family's tail_splits) runs all but its last two rounds of whole tiles, then the
last gridDim.x + tiles % gridDim.x tiles' kv blocks cut into one equal range a CTA (the split tail:
PersistentTiles.tail_plan, tail_piece); a tile cut between two CTAs is merged by the piece arriving second
(pair_arrive).
A CTA is 1 + block_m / 64 warpgroups (3 or 4, 384 or 512 threads; REGISTERS gives the split of the
registers the CTA is launched with, RAGGED_REGISTERS for ragged and paged layouts, FP8_REGISTERS (56 / 224)
over fp8 pools, whose tiles have two consumer warpgroups):

  warpgroup 0, producer (24 or 32 registers/thread after setmaxnreg): one elected thread issues the
      TMA loads of each tile: K of its first kv block, then Q (one 64-row box per consumer
      warpgroup and 64-column chunk of D, once the consumers have released Q's buffer), then
      V and the other kv blocks, the last block first, into a `stages`-deep ring. full[s]
      barriers count the bytes in (expect_tx); empty[s] and Q_EMPTY collect one arrive per
      consumer warp. Paged over 16-bit pools, where a kv block is up to 11 boxes a 64-column chunk,
      warps 0 and 1 issue alternate boxes of K, warps 2 and 3 of V (issue_kv_share), each arriving
      on full[s] with its boxes' bytes.
  warpgroups 1.., consumers (240 or 160 registers/thread): each owns 64 query rows. Block 0:
      S = Q K^T (wgmma, both operands in smem, fp32), [mask], online softmax, P to fp16/bf16 in
      registers. Block t >= 1: S(t) = Q K(t)^T and O += P(t-1) V(t-1) (wgmma with A from
      registers, V^T read MN-major from smem) are issued together, O rescaled by block t-1's
      factors between the two issues (under the S GEMM); the softmax of S(t) runs while the PV
      GEMM is in flight; then P(t) replaces P(t-1). Last: O rescaled, O += P V. Q's buffer is
      released after the tile's last S GEMM, so the next tile's Q loads during this one's last
      GEMM and epilogue. Optional ping-pong named barriers make the warpgroups take turns
      issuing GEMMs, round robin (TILES says per tile).

The ring's stage and phase follow from a running count of kv blocks that producer and
consumers advance alike (ring()), so no pipeline state is exchanged.

Masks, empty rows and LSE follow the portable family (aotc.kernels.mask, .softmax): key j is
visible to query i iff j < S_kv and, causal (bottom-right), j <= i + S_kv - S_q; blocks needing
a mask run in a loop of their own; a row that sees no key gets O = 0 and LSE = -inf. Rows of
Q/K/V past the tensor end read as zero (TMA out-of-bounds fill).

Epilogue per consumer warpgroup: O / rowsum -> fp16/bf16 -> its O staging slab in smem (its Q
slab for D256 and for D128 at block_n 176, which have no room for one; Q is then released after the
slab is read back) -> 128-bit stores of the rows < S_q; LSE by one thread per quad. Storing O straight from
the accumulator registers instead (4-byte stores) to free Q earlier cost 4-8% more cycles
(benchmarks/results/prefill_experiment_o_direct_stores.json).
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

from ..families.sdpa_prefill_sm90 import (BARRIER_BYTES, FP8_REGISTERS, FP8_TILES, RAGGED_REGISTERS, PARAMS, Q_BOX_ROWS,
                                          REGISTERS, TAIL_SPLIT_MIN_BLOCKS, TMA_BOX_COLS, WARPGROUP, MIN_SPLIT_BLOCKS,
                                          Tile, draws_tiles, kv_box_rows, kv_fp8, kv_split_range, kv_splits,
                                          launch_facts, page_size, registers_after_setmaxnreg, tail_splits,
                                          why_registers_do_not_fit)
from ..families.sdpa_prefill_sm90 import draws_early, row_group_kv
from ..families.sdpa_prefill_sm90 import tile as family_tile
from .compile import PTXAS_LEVELS, KernelBuild, compile_kernel
from .fp8 import e4m3x4_to_f16x2x2, exponent_of, pow2
from .hopper import acc_mn_view, acc_to_a_operand, gemm, smem_layout, store_converted_pairs
from .mask import (kv_block_range, kv_blocks_for_queries, kv_loop_segments, mask_columns, mask_columns_between, mask_row,
                   score_limits)
from .seqlen import seq_bounds
from .softmax import (LN_2, LOG2_E, NEG_INF, ScoreScale, capped_softmax_row, normalize_rows, rescale_rows, softcap_row,
                      softmax_row,
                      store_lse_rows)
from .tile_scheduler import SORT_SCRATCH_WORDS, PersistentTiles, RaggedTiles, draw_tile, settle_draw
from .warp_mma import DTYPES, VEC, make_s2g


_WG = WARPGROUP  # threads per warpgroup
# grouped_kv: a row-group coordinate out of every pool (a box from it is TMA's zero fill), for pages out of the pool
OUT_OF_POOL = -(1 << 30)
OUT_OF_INT32 = 1 << 31
# Causal tile order (aotc.kernels.tile_scheduler.PersistentTiles). D128 and D256 take tile pairs whenever
# the pairs fill the grid; D64 (192-row tiles, three consumer warpgroups) only when a round would hold
# fewer than _PAIRS_MIN_TILES_PER_HEAD tiles of each head, else the longest-first snake. Against cuDNN,
# pairs lifted D128 bf16 S4096 0.99 -> 1.10-1.15x and S8192 1.03-1.05 -> 1.08-1.11x, D256 S8192 0.99-1.03
# -> 1.08x; D64 lost 5-9% with pairs at S 8192-16384
# (benchmarks/results/prefill_experiment_causal_pairs_threshold.json). Dense D128/D256 launches draw their last 1-2 rounds'
# tiles from a counter, longest first (PersistentTiles.drawn_plan, benchmarks/results/prefill_drawn_tail.json);
# drawing every tile (FA3's dynamic scheduler) measured no faster than the pairs
# (prefill_experiment_dynamic_causal_tiles.json).
_PAIRS_WHENEVER_THEY_FILL_THE_GRID = {64: False, 128: True, 256: True}
_PAIRS_MIN_TILES_PER_HEAD = 2


class SdpaPrefillSm90:
    """One Hopper prefill variant: dtype, head dim, dense or ragged, causal or not, and its tile (the
    family's (head_dim, block_n) entry unless a tuner gives another)."""

    ptxas_levels = PTXAS_LEVELS
    params = PARAMS

    def __init__(self, variant, tile: Tile | None = None):
        if variant.family != "sdpa_prefill_sm90":
            raise ValueError(f"not an sdpa_prefill_sm90 variant: {variant.name}")
        if variant.arch != "sm_90a":
            raise ValueError(f"{variant.name}: sdpa_prefill_sm90 needs sm_90a (wgmma, setmaxnreg), got {variant.arch}")
        self.variant = variant
        self.dtype = dtype = DTYPES[variant["dtype"]]
        self.D = D = int(variant["head_dim"])
        self.page = page_size(variant)
        self.paged = self.page > 0
        self.ragged = variant["layout"] == "ragged" or self.paged  # Q/O [total_q, H_q, D] with cu_seqlens_q
        self.causal = causal = bool(variant["causal"])
        # score features (aotc.families.features): compiled in or not, their values are parameters
        self.window, self.softcap, self.sinks = (bool(variant.get(f, False)) for f in ("window", "softcap", "sinks"))
        self.tile = t = tile or family_tile(D, int(variant["block_n"]), kv_fp8(variant))
        self.bm, self.bn, self.stages, self.pingpong = bm, bn, stages, _ = t.block_m, t.block_n, t.stages, t.pingpong
        self.chunks = D // TMA_BOX_COLS
        # fp8 KV (aotc.families.kv_dtype): TMA brings e4m3 pages into staging rings, the producer warpgroup's
        # warps 1..3 convert them to fp16 tiles of the K/V rings (convert_block), the GEMMs run in fp16 (Q
        # rewritten as fp16 times a power of two per warpgroup and tile: q_to_f16), the K scale goes into the
        # softmax scale and the V scale into O
        self.fp8 = kv_fp8(variant)
        if self.fp8 and (not self.paged or (D, t.block_n) not in FP8_TILES):
            raise ValueError(f"{variant.name}: fp8 KV is served by the paged layouts at (head_dim, block_n) in "
                             f"{list(FP8_TILES)}")
        self.mma_dtype = cutlass.Float16 if self.fp8 else dtype
        # soft-cap with bf16 P: a second kv loop whose softmax takes p against the cap's fixed offset (no row max,
        # no O rescale), run when the softcap value allows it (aotc.kernels.softmax: capped_softmax_row)
        self.capped = self.softcap and self.mma_dtype == cutlass.BFloat16
        # and, up to D128, its row sums from the tensor cores: P times a block of ones (an m64n8 wgmma per k slice, in
        # the PV GEMM's group) in place of an FADD a score, in a softmax bound by its instruction issue: D128 4.1% fewer
        # SM cycles; D256, whose tensor pipe is 93% busy, 4.5% more (benchmarks/results/prefill_softcap_sum_mma.json)
        self.sum_by_mma = self.capped and D <= 128
        if self.sum_by_mma and 8 * (self.tile_empty() + 1) > self.ONES_BYTE:
            raise ValueError(f"{variant.name}: {stages} stages' mbarriers overlap the row sums' ones at byte {self.ONES_BYTE}")
        self.sep_o = t.separate_o(D, self.fp8)
        # (a tile without room for an O tile of its own stages O in Q's slab; staging it in the last kv block's V
        # stage instead, FA3's smem_o over smem_v, with Q released after the last S GEMM, took 7% more SM cycles at
        # D128 S 8192: benchmarks/results/prefill_release_q_after_pv.json, its o_in_v rows)
        self.n_wg_rows = n_wg_rows = Q_BOX_ROWS  # query rows per consumer warpgroup
        self.n_wg = n_wg = t.consumer_warpgroups
        if D % TMA_BOX_COLS or bm % n_wg_rows or n_wg not in REGISTERS or bn % 16:
            raise ValueError(f"unsupported tile {t} for head_dim {D}")
        self.n_threads = t.threads
        self.consumer_warps = 4 * n_wg
        self.producer_regs, self.consumer_regs = (RAGGED_REGISTERS if self.ragged else REGISTERS)[n_wg]
        if self.fp8:  # registers for the conversion warps' CONVERT_UNROLL units in flight
            self.producer_regs, self.consumer_regs = FP8_REGISTERS
            if D not in (64, 128):  # convert_block: an e4m3 row is one row of TMA's 64- or 128-byte swizzle
                raise ValueError(f"kv_dtype fp8_e4m3 needs head_dim 64 or 128, not {D}")
        why = why_registers_do_not_fit(self.producer_regs, self.consumer_regs, n_wg)
        if why:
            raise ValueError(f"{variant.name}: {why} (tile {t})")
        self.registers_after_setmaxnreg = registers_after_setmaxnreg(self.producer_regs, self.consumer_regs, n_wg)
        self.elem_bytes = elem_bytes = dtype.width // 8
        self.q_tx = n_wg_rows * D * elem_bytes * n_wg  # every Q slab, on one barrier (paged: its packed rows)
        self.kv_tx = bn * D * (1 if self.fp8 else elem_bytes)  # bytes a K or V block brings (fp8: into staging)
        self.scheduler = PersistentTiles(causal, _PAIRS_WHENEVER_THEY_FILL_THE_GRID[D], _PAIRS_MIN_TILES_PER_HEAD)
        # tiles drawn from the runtime's counter: ragged and paged, every tile after a CTA's first (RaggedTiles);
        # dense causal D128/D256, the tail's, longest first (PersistentTiles.drawn_plan)
        self.draws_tiles = draws_tiles(variant)
        if not (self.SCRATCH_BYTES + 16 * n_wg <= 4 * self.SORT_SCRATCH
                and self.SPLIT_FLAGS + n_wg <= self.SPLIT_WORDS and self.SPLIT_WORDS + 2 <= self.TILE_RECORD):
            raise ValueError(f"{variant.name}: the sort scratch or the split flags overlap the fp8 scratch or the tile "
                             f"record")
        if self.paged:
            # rows of one K/V TMA box (kv_box_rows): a whole page, a block inside one page, or, where neither
            # divides the other (D256's 80 keys over pages of 32-128), 16 rows inside one page
            self.kv_rows = kv_box_rows(self.page, bn)
            # (16 rows keep every box's place in the ring a multiple of the 1024-byte swizzle atom, fp8 D64's too)
            if self.page & (self.page - 1) or self.kv_rows % 16:
                raise ValueError(f"page size {self.page}: a power of two of at least 16 tokens is needed (kv blocks of "
                                 f"{bn} keys load as boxes of {self.kv_rows} rows)")
            self.kv_boxes = bn // self.kv_rows   # boxes per 64 columns of a kv block
            self.log2_page = self.page.bit_length() - 1
        # 16-bit paged: the producer warpgroup's warps share the K/V boxes (issue_kv_share), up to two warps a ring
        # (kv_issuers), boxes alternating between them. One warp issuing a block's 44 TMA copies of 16 rows (D128-176
        # over 16-token pages) held the consumer warps beside it on its SM sub-partition back: 7.8% more SM cycles
        # than the ragged kernel on the same work (benchmarks/results/paged_varlen_experiment_kv_issue.json).
        # fp8 KV keeps warp 0 issuing every box: its warps 1..3 convert.
        self.kv_issuers = min(2, self.kv_boxes) if self.paged and not self.fp8 else 1
        # ROW_GROUP_TILES (16-bit paged D128-176): the K/V rings hold each 8-row group's 64-column chunks side by side
        # (smem_layout chunks_inner: [stage][8-row group][chunk][8 x 64]), so one TMA box of (64 columns, 8 rows, every
        # chunk, kv_rows / 8 groups) brings a box's rows whole: one copy a box where a copy a column chunk took two
        # (22 copies a kv block over 16-token pages, K and V, against 44). The pool's descriptor walks its 8-row groups
        # (tma_recipe's kv_view, kv_groups_per_page); the other tiles keep the chunk-major ring (fp8's conversion
        # warps write it).
        self.grouped_kv = row_group_kv(variant, t.block_n)
        # KV splits (launch_splits; the family's kv_splits: the 16-bit paged kernels)
        self.kv_splits = kv_splits(variant)
        # the split tail of dense non-causal launches (PersistentTiles.tail_plan; the family's tail_splits)
        self.tail_splits = tail_splits(variant)
        # the next work item drawn before the tile's last K block (produce_paged_item; the family's draws_early)
        self.draws_early = draws_early(variant)
        # the warps that take each drawn tile from the producer: the consumers', fp8 KV's conversion warps, and
        # the 16-bit paged kernels' K/V issuers past warp 0
        helpers = 0
        if self.paged:
            helpers = self.CONVERT_WARPS if self.fp8 else 2 * self.kv_issuers - 1
        self.tile_takers = self.consumer_warps + helpers
        if self.ragged:
            self.ragged_tiles = RaggedTiles(2 * D * (1 if self.fp8 else elem_bytes))
        sep_o = self.sep_o
        staging = stages * bn * D if self.fp8 else 0

        @cute.struct
        class SharedStorage:
            bars: cute.struct.Align[cute.struct.MemRange[Int64, BARRIER_BYTES // 8], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, bm * D], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, stages * bn * D], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, stages * bn * D], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dtype, bm * D if sep_o else 0], 1024]
            sK8: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, staging], 1024]
            sV8: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, staging], 1024]

        self.smem_size = SharedStorage.size_in_bytes()
        if self.smem_size != t.smem_bytes(D, self.fp8):
            raise RuntimeError(f"shared storage is {self.smem_size} bytes, the tile says {t.smem_bytes(D, self.fp8)}")
        self.SharedStorage = SharedStorage
        # named barriers: 1 .. n_wg are the consumer warpgroups' epilogue barriers, SCHED + w the "may
        # issue GEMMs" barrier of warpgroup w (ping-pong)
        self.SCHED = 1 + n_wg
        # every consumer thread: paged, after zeroing V rows past the sequence; sum_by_mma, after the ones are written
        self.ZERO_BAR = 1 + 2 * n_wg

    def __str__(self) -> str:  # the kernel symbol's mangled name includes it
        return type(self).__name__

    def pointee_types(self) -> dict:
        # the host function takes Q, K and V as pointers (it builds stand-in descriptors from them)
        kv = cutlass.Uint8 if self.fp8 else self.dtype
        return {"tma_q": self.dtype, "tma_k": kv, "tma_v": kv, "o": self.dtype, "lse": Float32,
                "cu_seqlens_q": Int32, "cu_seqlens_kv": Int32, "page_table": Int32, "seqlens_kv": Int32,
                "sinks": Float32, "k_descale": Float32, "v_descale": Float32, "tile_counter": Int32,
                "split_partials": Float32, "split_counters": Int32}

    def launch_facts(self):
        return launch_facts(self.variant, self.tile)

    # barrier indices in storage.bars
    Q_FULL = 0
    Q_EMPTY = 1
    # a drawn tile as the producer hands it on (publish_tile): up to TILE_WORDS int32, the barrier block's last 32 bytes
    TILE_WORDS = 8
    TILE_RECORD = BARRIER_BYTES // 4 - TILE_WORDS
    TILE_SLOT = BARRIER_BYTES // 8 - 1  # dense causal: a drawn tile's index, the barrier block's last 8 bytes
    SORT_SCRATCH = 576 // 4  # RaggedTiles.sorted's words: past fp8's scratch (SCRATCH_BYTES), before the tile record
    # paged KV splits: a consumer warpgroup's "my split arrived last" flag (split_arrive), one word each past the sort
    # scratch, then the split words of the last two tiles published (publish_tile), before the tile record. The
    # consumers read a tile's split word there in its epilogue: kept in a register across the kv loop, that one
    # more live value moved ptxas's schedule of the soft-capped loop (its tanhs after the PV wait)
    SPLIT_FLAGS = SORT_SCRATCH + SORT_SCRATCH_WORDS
    SPLIT_WORDS = SPLIT_FLAGS + 3

    def k_full(self, s):
        return 2 + s

    def k_empty(self, s):
        return 2 + self.stages + s

    def v_full(self, s):
        return 2 + 2 * self.stages + s

    def v_empty(self, s):
        return 2 + 3 * self.stages + s

    # fp8 KV: the staging rings' barriers (TMA fills, the conversion warps empty)
    def k8_full(self, s):
        return 2 + 4 * self.stages + s

    def k8_empty(self, s):
        return 2 + 5 * self.stages + s

    def v8_full(self, s):
        return 2 + 6 * self.stages + s

    def v8_empty(self, s):
        return 2 + 7 * self.stages + s

    # the tile record's barriers (publish_tile, take_tile)
    def tile_full(self):
        return 2 + 8 * self.stages

    def tile_empty(self):
        return 3 + 8 * self.stages

    CONVERT_WARPS = 3  # fp8 KV: producer warps 1..3 convert the staging tiles
    CONVERT_UNROLL = 6  # fp8 KV: 16-byte units a conversion thread has in flight (8 spilled at 56 registers)
    SCRATCH_BYTES = 512  # fp8 KV: q_to_f16's per-warp maxima, in the barrier block past the mbarriers
    # sum_by_mma: the B operand of the row sums' GEMM, two 8 x 8 core matrices of ones (256 bytes) in the barrier block
    # between the mbarriers (the last is tile_empty) and the scratch; every k slice reads the same two
    ONES_BYTE = 256
    ONES_N = 8  # columns of the row sums' GEMM (wgmma's narrowest); each holds the whole row sum

    def ring(self, g):
        """(stage, phase) of the g-th kv block through the ring (g counts across tiles)."""
        return g % self.stages, (g // self.stages) & 1

    @cute.jit
    def tma_coords(self, col, row, head, bidx):
        if cutlass.const_expr(self.ragged):
            return [col, row, head]
        return [col, row, head, bidx]

    @cute.jit
    def load_kv(self, tma, base, full, empty, g, n, kv_row0, kv_head, bidx, bars):
        stage, phase = self.ring(g)
        cute.arch.mbarrier_wait(bars + empty(stage), phase ^ 1)  # a fresh barrier passes parity 1
        cute.arch.mbarrier_arrive_and_expect_tx(bars + full(stage), self.kv_tx)
        for c in cutlass.range_constexpr(self.chunks):
            prims.cp_async_bulk_tensor_shared_cta_global(
                base + (stage * self.bn * self.D + c * self.bn * TMA_BOX_COLS), tma.get_ptr(),
                self.tma_coords(c * TMA_BOX_COLS, kv_row0 + n * self.bn, kv_head, bidx), bars + full(stage))

    @cute.jit
    def unpaged_ragged_tile(self, r, lane, cu_seqlens_q, cu_seqlens_kv, batch, heads_q, group, scratch):
        """(bidx, head, m_block, q_start, s_q, kv_start, s_kv) of tile r of a ragged (unpaged) batch (RaggedTiles:
        block_m tokens of one query head), so the grid walks only the batch's real tiles."""
        bidx, local, m_b, q_start, s_q = self.ragged_tiles.locate(r, cu_seqlens_q, batch, self.bm, heads_q, 0, lane,
                                                                  cu_seqlens_kv, True, scratch)
        kv_start = cu_seqlens_kv[bidx]
        s_kv = cu_seqlens_kv[bidx + 1] - kv_start
        head, m_block = self.ragged_tiles.place(local, m_b, heads_q, s_kv, group)
        return bidx, head, m_block, q_start, s_q, kv_start, s_kv

    @cute.jit
    def paged_tile(self, r, lane, cu_seqlens_q, seqlens_kv, batch, slab_tokens, heads_kv, min_seqlen_q, max_pages,
                   scratch):
        """(bidx, kv_head, m_block, q_start, s_q, s_kv) of tile r (RaggedTiles: GQA-packed rows, n_wg slabs of
        slab_tokens query tokens, one KV head)."""
        bidx, local, m_b, q_start, s_q = self.ragged_tiles.locate(r, cu_seqlens_q, batch, self.n_wg * slab_tokens,
                                                                  heads_kv, min_seqlen_q, lane, seqlens_kv, False,
                                                                  scratch)
        # keys of the sequence, cut at its page-table row's end (never read past the row)
        s_kv = cutlass.min(cutlass.max(seqlens_kv[bidx], Int32(0)), max_pages * self.page)
        kv_head, m_block = self.ragged_tiles.place(local, m_b, heads_kv, s_kv, 1)
        return bidx, kv_head, m_block, q_start, s_q, s_kv

    @cute.jit
    def paged_kv_range(self, m_block, s_q, s_kv, slab_tokens, window_left):
        """The kv blocks a paged tile's queries see (kv_blocks_for_queries: n_min, n_max, n_mask_min, n_left_end)."""
        tokens = self.n_wg * slab_tokens  # query tokens of a packed tile
        q_first = m_block * tokens
        q_last = cutlass.min(q_first + tokens, s_q) - 1
        return kv_blocks_for_queries(q_first, q_last, s_q, s_kv, self.bn, self.causal, self.window, window_left)

    # Paged KV splits (MAX_KV_SPLITS in aotc.families.sdpa_prefill_sm90): a work item is split `split` of a tile whose
    # kv blocks `splits` CTAs share, told to every taker in one word of the tile record (split_word: split, splits,
    # and where splits > 1 the item index of the tile's split 0, whose counters and partial slots it names)
    @cute.jit
    def item_kv_range(self, kv_range, word):
        """kv_range (paged_kv_range) cut to the item's split (clamp_kv_range)."""
        n_min, n_max, _, _ = kv_range
        lo, hi = kv_split_range(n_min, n_max, word & 255, (word >> 8) & 255)
        return self.clamp_kv_range(kv_range, lo, hi)

    @cute.jit
    def clamp_kv_range(self, kv_range, lo, hi):
        """kv_range cut to its blocks [lo, hi) (a KV split's, a split tail's piece's): (lo, hi, n_mask_min,
        n_left_end) with the mask bounds clamped into [lo, hi], so kv_loop_segments' segments stay inside them."""
        _, _, n_mask_min, n_left_end = kv_range
        return lo, hi, cutlass.min(cutlass.max(n_mask_min, lo), hi), cutlass.min(cutlass.max(n_left_end, lo), hi)

    @cute.jit
    def launch_splits(self, n_tiles, kv_splits_max):
        """A paged launch's split count: its CTAs over its tiles where there are fewer tiles than CTAs (at most
        kv_splits_max), else 1. Recomputed at every item from the tile count and the grid (a special register):
        computed once a launch (fe251c0) it saved 0.1% of the instructions at S 2048 and moved ptxas's D256 kv loop
        (583 -> 608 instructions, 0.7% more SM cycles; benchmarks/results/paged_varlen_h100_fe251c0.json)."""
        n_ctas = Int32(cute.arch.grid_dim()[0])
        splits = Int32(1)
        if n_tiles > 0 and n_tiles < n_ctas:
            splits = cutlass.max(cutlass.min(n_ctas // n_tiles, kv_splits_max), Int32(1))
        return splits

    @cute.jit
    def tile_splits(self, kv_range, splits):
        """The CTAs a tile's blocks go to: the launch's `splits`, at most its blocks over MIN_SPLIT_BLOCKS, at
        least 1."""
        n_min, n_max, _, _ = kv_range
        return cutlass.max(cutlass.min(splits, (n_max - n_min) // MIN_SPLIT_BLOCKS), Int32(1))

    # Drawn tiles (RaggedTiles; PersistentTiles.drawn_plan): the producer puts each tile into the tile record once
    # every taker (each consumer warp, and fp8 KV's conversion warps) took the one before, and arrives on tile_full;
    # each taker reads it and its lane 0 arrives on tile_empty (mbarriers: the takers never wait for each other).
    # Ragged and paged: every tile, located by the producer alone (the takers run no scan), then a record with
    # valid 0 (publish_tile, take_tile); dense causal: the drawn tail's tile indices in TILE_SLOT, a tile past the
    # last ending it (producer_drawn and the consumers' tail: the int32 record's hand-off reshaped ptxas's schedule
    # of the dense kv loops, the soft-capped loop's tanhs no longer under the PV GEMM).

    @cute.jit
    def publish_tile(self, bars, handoff, words, split_word=None):
        """Producer warp: the words (int32, at most TILE_WORDS) into the tile record (its lane 0 writes); paged, the
        tile's split word also into its SPLIT_WORDS slot (handoff's parity), which stays until the tile after next is
        published: after every consumer took the next tile, so after this one's epilogue."""
        record = self.shared_words(bars, self.TILE_RECORD, self.TILE_WORDS)
        split_words = self.shared_words(bars, self.SPLIT_WORDS, 2)
        full = bars + self.tile_full()
        cute.arch.mbarrier_wait(bars + self.tile_empty(), (handoff & 1) ^ 1)  # a fresh barrier passes parity 1
        if cute.arch.lane_idx() == 0:
            for i, w in enumerate(words):
                record[i] = Int32(w)
            if cutlass.const_expr(split_word is not None):
                split_words[handoff & 1] = split_word
            cute.arch.mbarrier_arrive(full)

    @cute.jit
    def take_tile(self, bars, handoff, n: cutlass.Constexpr):
        """A taker warp: the first n words of the tile record, once published. Every lane reads them and then
        arrives itself (tile_empty counts 32 a taker warp), so each read is ordered before the producer's next write
        by the lane's own arrive: compute-sanitizer's racecheck does not see a warp sync and one lane's arrive as
        ordering the other lanes' reads (it reported the record's rewrite racing with them)."""
        record = self.shared_words(bars, self.TILE_RECORD, self.TILE_WORDS)
        cute.arch.mbarrier_wait(bars + self.tile_full(), handoff & 1)
        words = [cute.arch.make_warp_uniform(record[i]) for i in range(n)]
        cute.arch.mbarrier_arrive(bars + self.tile_empty())
        return words

    def shared_words(self, bars, first, n):
        """n int32 of the barrier block from word `first` (the tile record, the sort scratch)."""
        return cute.make_tensor(cute.recast_ptr(bars, dtype=Int32) + first, cute.make_layout(n))

    def sort_scratch(self, bars):
        """The producer warp's shared words for RaggedTiles.sorted, in the barrier block."""
        return self.shared_words(bars, self.SORT_SCRATCH, SORT_SCRATCH_WORDS)

    @cute.jit
    def draw_next(self, tile_counter, n_tiles, n_ctas, lane):
        """Ragged and paged producer warp, once the current tile's loads are all issued: the CTA's next tile
        (past the last: none). Drawn this late, not as the tile starts, so the CTA that finishes first takes the
        next tile: a draw at the start claimed it one tile ahead, and chunks over unequal prefixes then left
        CTAs idle (RaggedTiles); the atomic's latency hides behind the consumers' last kv blocks. The 16-bit
        D128 paged kernels draw a block earlier, in two halves (draw_start, draw_finish; produce_paged_item)."""
        taken = Int32(0)
        if lane == 0:
            taken = draw_tile(tile_counter)
            settle_draw(tile_counter, taken, n_tiles - 1)
        return cute.arch.make_warp_uniform(cute.arch.shuffle_sync(taken, 0)) + n_ctas

    @cute.jit
    def draw_start(self, tile_counter, lane):
        """draw_next's atomic alone: lane 0's draw (its result is not waited for until draw_finish reads it)."""
        taken = Int32(0)
        if lane == 0:
            taken = draw_tile(tile_counter)
        return taken

    @cute.jit
    def draw_finish(self, tile_counter, taken, n_tiles, n_ctas, lane):
        """The rest of draw_next for draw_start's value: the counter settled, the tile shared with the warp."""
        if lane == 0:
            settle_draw(tile_counter, taken, n_tiles - 1)
        return cute.arch.make_warp_uniform(cute.arch.shuffle_sync(taken, 0)) + n_ctas

    @cute.jit
    def page_id(self, ctx, n, lane, first: cutlass.Constexpr = 0, step: cutlass.Constexpr = 1):
        """Lane i's share of kv block n: the page of box first + i * step (one of the boxes load_kv_paged issues
        with the same first and step), -1 past the block's boxes or the sequence's end (the box then lies out of the
        pool's bounds: TMA fills zeros). One register a lane, where an array of every box's page in each lane
        spilled the producer's few registers."""
        box = first + lane * step
        tok = n * self.bn + box * self.kv_rows
        pg = Int32(-1)
        if box < self.kv_boxes and tok >= 0 and tok < ctx.s_kv:  # (a tile that sees no block asks for -1)
            pg = ctx.page_table[ctx.pt_row + Int64(tok >> self.log2_page) * ctx.pt_stride_p]
        if cutlass.const_expr(self.grouped_kv):
            pg = self.row_group(pg, tok, ctx.kv_groups_per_page)
        return pg

    @cute.jit
    def row_group(self, pg, tok, groups_per_page):
        """grouped_kv, over a pool whose page stride is groups_per_page (> 0) strides of 8 rows: the coordinate of the
        8-row group of page pg holding key tok (page row tok % page) along the descriptor's row groups; a page out of
        the pool (-1 past the sequence's end, or an id the caller put out of [0, pages) that would wrap int32) gets
        OUT_OF_POOL, every group of its box out of bounds (TMA's zero fill). groups_per_page 0 keeps the page id."""
        coord = pg
        if groups_per_page != 0:
            at = Int64(pg) * Int64(groups_per_page) + Int64((tok & (self.page - 1)) >> 3)
            coord = Int32(OUT_OF_POOL)
            if at >= Int64(0) and at < Int64(OUT_OF_INT32):
                coord = Int32(at)
        return coord

    @cute.jit
    def load_kv_paged(self, tma, base, full, empty, g, n, pg, kv_head, bars, first: cutlass.Constexpr = 0,
                      step: cutlass.Constexpr = 1, groups_per_page=None):
        """K or V of kv block n from its pages: boxes first, first + step, ... (all of them by default; pg:
        page_id() with the same first and step), box j (kv_rows rows inside one page, from row (n * block_n + j *
        kv_rows) % page) into rows [j * kv_rows, (j + 1) * kv_rows), and this share's bytes expected on the full
        barrier (which waits for one arrive per share); the whole warp calls it, one lane issues. grouped_kv: one copy
        a box along the pool's row groups, or, where the page stride is no multiple of 8 rows' (groups_per_page 0),
        one an 8-row group from its page; other 16-bit tiles: one a 64-column chunk of a box; fp8 KV: into the
        staging ring, each box of whole e4m3 rows (D bytes, swizzled over a row's bytes)."""
        boxes = range(first, self.kv_boxes, step)
        stage, phase = self.ring(g)
        cute.arch.mbarrier_wait(bars + empty(stage), phase ^ 1)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bars + full(stage), self.kv_tx // self.kv_boxes * len(boxes))
        stage_base = base + stage * self.bn * self.D
        by_page = True  # the boxes each from its page (a dynamic flag for the row-group tiles)
        if cutlass.const_expr(self.grouped_kv):
            by_page = groups_per_page == 0
            if groups_per_page != 0:
                for i, j in enumerate(boxes):
                    at = cute.arch.shuffle_sync(pg, i)
                    with cute.arch.elect_one():
                        prims.cp_async_bulk_tensor_shared_cta_global(
                            stage_base + j * self.kv_rows * self.D, tma.get_ptr(), [0, 0, 0, at, kv_head],
                            bars + full(stage))
        if by_page:
            row = self.first_box_row(n)
            for i, j in enumerate(boxes):
                page = cute.arch.shuffle_sync(pg, i)
                box_row = self.box_row(row, j)
                with cute.arch.elect_one():
                    if cutlass.const_expr(self.grouped_kv):  # an 8-row group of every column a copy
                        for r in cutlass.range_constexpr(0, self.kv_rows, 8):
                            prims.cp_async_bulk_tensor_shared_cta_global(
                                stage_base + (j * self.kv_rows + r) * self.D, tma.get_ptr(),
                                [0, box_row + r, 0, kv_head, page], bars + full(stage))
                    elif cutlass.const_expr(self.fp8):
                        prims.cp_async_bulk_tensor_shared_cta_global(
                            stage_base + j * self.kv_rows * self.D, tma.get_ptr(), [0, box_row, kv_head, page],
                            bars + full(stage))
                    else:  # a copy a 64-column chunk of the box, into the chunk's rows of the stage
                        for c in cutlass.range_constexpr(self.chunks):
                            prims.cp_async_bulk_tensor_shared_cta_global(
                                stage_base + self.ring_offset(0, j * self.kv_rows, c), tma.get_ptr(),
                                [c * TMA_BOX_COLS, box_row, kv_head, page], bars + full(stage))

    def first_box_row(self, n):
        """The first box of kv block n's row in its page: 0 where a box is a whole page."""
        if self.page > self.kv_rows:
            return (n * self.bn) & (self.page - 1)
        return Int32(0)

    def box_row(self, row, j: int):
        """Box j's row in its page, the block's first box at `row` (boxes of a part of a page: each its own row)."""
        if j > 0 and self.page > self.kv_rows:
            return (row + j * self.kv_rows) & (self.page - 1)
        return row

    @cute.jit
    def issue_kv_share(self, tma, base, full, empty, bars, ctx, n_max, n_iter, g0, first: cutlass.Constexpr,
                       t0=0):
        """16-bit paged: one warp's share of the boxes (first, first + kv_issuers, ...) of K or V, kv blocks
        n_max - 1 - t for t in t0 .. n_iter - 1 (ring positions g0 + t)."""
        lane = cute.arch.lane_idx()
        for t in cutlass.range(t0, n_iter, unroll=1):
            pg = self.page_id(ctx, n_max - 1 - t, lane, first, self.kv_issuers)
            self.load_kv_paged(tma, base, full, empty, g0 + t, n_max - 1 - t, pg, ctx.kv_head, bars, first,
                               self.kv_issuers, ctx.kv_groups_per_page)

    @cute.jit
    def kv_issuer(self, tma, base, full, empty, bars, first: cutlass.Constexpr, page_table, pt_stride_b, pt_stride_p,
                  slab_tokens, window_left, kv_groups_per_page):
        """16-bit paged, a producer warp past warp 0: its share of K's or V's boxes (issue_kv_share from box
        `first`) over every tile that warp 0 publishes."""
        g0 = Int32(0)
        valid, kv_head, m_block, q_start, s_q, s_kv, bidx, word = self.take_tile(bars, 0, 8)
        handoff = Int32(1)
        while valid != 0:
            n_min, n_max, _, _ = self.item_kv_range(self.paged_kv_range(m_block, s_q, s_kv, slab_tokens, window_left),
                                                    word)
            tile = SimpleNamespace(s_kv=s_kv, kv_head=kv_head, page_table=page_table,
                                   pt_row=Int64(bidx) * pt_stride_b, pt_stride_p=pt_stride_p,
                                   kv_groups_per_page=kv_groups_per_page)
            self.issue_kv_share(tma, base, full, empty, bars, tile, n_max, n_max - n_min, g0, first)
            g0 = g0 + (n_max - n_min)
            valid, kv_head, m_block, q_start, s_q, s_kv, bidx, word = self.take_tile(bars, handoff, 8)
            handoff = handoff + 1

    @cute.jit
    def produce_paged_item(self, tma_q, tma_k, tma_v, storage, tables_p, bidx, kv_head, m_block, q_start, s_kv, n_min,
                           n_max, g0, q_count, draw=None):
        """Paged producer warp 0: one work item's loads, blocks n_min..n_max of its tile (tables_p: the launch's
        GQA group, slab tokens, page table and its strides, row groups a page); the ring position and Q count
        after it. With draw (16-bit paged: draw_start for the CTA's next item) the draw goes before the item's
        last K block, and its value is returned third."""
        group, slab_tokens, page_table, pt_stride_b, pt_stride_p, kv_groups_per_page = tables_p
        tile = SimpleNamespace(s_kv=s_kv, q_start=q_start, kv_head=kv_head, group=group, slab_tokens=slab_tokens,
                               page_table=page_table, pt_row=Int64(bidx) * pt_stride_b, pt_stride_p=pt_stride_p,
                               kv_groups_per_page=kv_groups_per_page)
        n_iter = n_max - n_min
        if cutlass.const_expr(draw is None):
            self.producer_paged(tma_q, tma_k, tma_v, storage, tile, m_block, n_max, n_iter, g0, q_count)
            return g0 + n_iter, q_count + 1
        # the draw before the last K block: its atomic's round trip overlaps the wait for that block's ring slot
        # instead of delaying the next item's first loads (the chunk with no prefix, 128-key tiles of 1-16 blocks:
        # 1.1% fewer SM cycles at S 2048; benchmarks/results/paged_varlen_experiment_draw_early.json)
        t_last = cutlass.max(n_iter - 1, 1)
        self.producer_paged(tma_q, tma_k, tma_v, storage, tile, m_block, n_max, n_iter, g0, q_count, t_last)
        taken = draw()
        self.issue_kv_share(tma_k, storage.sK.data_ptr(), self.k_full, self.k_empty, storage.bars.data_ptr(), tile,
                            n_max, n_iter, g0, 0, t_last)
        return g0 + n_iter, q_count + 1, taken

    @cute.jit
    def producer_paged(self, tma_q, tma_k, tma_v, storage, ctx, m_block, n_max, n_iter, g0, q_count, t_end=None):
        """producer_tile for a paged variant, run by the whole producer warp 0 (the page-table reads and the
        work-item scan are warp-wide; one lane issues): Q of the GQA-packed tile (box (64 columns, group
        heads, 64 / group tokens) per consumer warpgroup) after the first K block, then K/V from their pages, last
        block first, n_iter blocks. 16-bit: its share of the K boxes only (issue_kv_share; the other warps issue
        the rest); fp8 KV: every box of K and V."""
        bars = storage.bars.data_ptr()
        sQ = storage.sQ.data_ptr()
        sK = storage.sK.data_ptr()
        sV = storage.sV.data_ptr()
        k_full, k_empty, v_full, v_empty = self.k_full, self.k_empty, self.v_full, self.v_empty
        if cutlass.const_expr(self.fp8):  # into the staging rings, which the conversion warps empty
            sK = storage.sK8.data_ptr()
            sV = storage.sV8.data_ptr()
            k_full, k_empty, v_full, v_empty = self.k8_full, self.k8_empty, self.v8_full, self.v8_empty
        lane = cute.arch.lane_idx()
        step = self.kv_issuers
        pg = self.page_id(ctx, n_max - 1, lane, 0, step)
        if n_max > 0:
            self.load_kv_paged(tma_k, sK, k_full, k_empty, g0, n_max - 1, pg, ctx.kv_head, bars, 0, step,
                               ctx.kv_groups_per_page)
        cute.arch.mbarrier_wait(bars + self.Q_EMPTY, (q_count & 1) ^ 1)
        with cute.arch.elect_one():
            tokens = ctx.slab_tokens  # tokens of one warpgroup's slab: its first tokens * group rows
            cute.arch.mbarrier_arrive_and_expect_tx(bars + self.Q_FULL,
                                                    self.n_wg * tokens * ctx.group * self.D * self.elem_bytes)
            for w in cutlass.range_constexpr(self.n_wg):
                for c in cutlass.range_constexpr(self.chunks):
                    prims.cp_async_bulk_tensor_shared_cta_global(
                        sQ + (w * self.n_wg_rows * self.D + c * self.n_wg_rows * TMA_BOX_COLS), tma_q.get_ptr(),
                        [c * TMA_BOX_COLS, ctx.kv_head * ctx.group, ctx.q_start + (m_block * self.n_wg + w) * tokens],
                        bars + self.Q_FULL)
        if cutlass.const_expr(self.fp8):
            if n_max > 0:
                self.load_kv_paged(tma_v, sV, v_full, v_empty, g0, n_max - 1, pg, ctx.kv_head, bars)
            for t in cutlass.range(1, n_iter, unroll=1):
                pg = self.page_id(ctx, n_max - 1 - t, lane)
                self.load_kv_paged(tma_k, sK, k_full, k_empty, g0 + t, n_max - 1 - t, pg, ctx.kv_head, bars)
                self.load_kv_paged(tma_v, sV, v_full, v_empty, g0 + t, n_max - 1 - t, pg, ctx.kv_head, bars)
        else:  # 16-bit: warp 0's share of K, blocks up to t_end (produce_paged_item issues the rest)
            self.issue_kv_share(tma_k, sK, k_full, k_empty, bars, ctx, n_max, n_iter if t_end is None else t_end, g0,
                                0, 1)

    @cute.jit
    def convert_block(self, storage, g, valid_rows, ctid, is_v: cutlass.Constexpr):
        """fp8 KV, conversion warps (ctid 0 .. 95): K (or V) of ring position g from its e4m3 staging tile to the
        fp16 tile the GEMMs read (cvt.rn.f16x2.e4m3x2, exact), rows from valid_rows on (past the sequence's end:
        stale pool slots, NaN included) as zeros. A staging row is D (128 or 64) bytes, swizzled by TMA over a row's
        bytes; a 16-byte unit of it (16 values) becomes two 16-byte units of the 128-byte-swizzled K-major tile. Waits
        for the staging tile and for the consumers to free the fp16 stage; fences the writes for wgmma's async
        proxy, then each warp arrives on the stage's full barrier and on the staging tile's empty one."""
        bars = storage.bars.data_ptr()
        src_base = storage.sK8.data_ptr()
        dst_base = storage.sK.data_ptr()
        full8, empty8, full, empty = self.k8_full, self.k8_empty, self.k_full, self.k_empty
        if cutlass.const_expr(is_v):
            src_base = storage.sV8.data_ptr()
            dst_base = storage.sV.data_ptr()
            full8, empty8, full, empty = self.v8_full, self.v8_empty, self.v_full, self.v_empty
        stage, phase = self.ring(g)
        cute.arch.mbarrier_wait(bars + full8(stage), phase)
        cute.arch.mbarrier_wait(bars + empty(stage), phase ^ 1)
        src32 = cute.recast_ptr(src_base, dtype=Int32)
        dst32 = cute.recast_ptr(dst_base, dtype=Int32)
        # Work: (row octet, 16-byte unit) pairs of the tile, one per 8-thread group, a row of the octet per thread.
        # Both tiles are swizzled (the staging tile by TMA: the unit u of row r at u ^ (r % 8) in 128-byte rows,
        # u ^ ((r // 2) % 4) in D64's 64-byte ones), so at D128 the 8 threads of a group, 8 rows apart in r % 8,
        # load 8 different bank quads and store 8 different ones: every 16-byte shared access of a quarter warp in
        # one wavefront (with unswizzled staging and a row per group, each store had two threads on the same banks:
        # twice the wavefronts under ncu, and the fp8 chunk 1.14x slower,
        # benchmarks/results/paged_varlen_experiment_fp8_convert.json)
        lane8 = ctid & 7
        group = ctid >> 3
        groups = self.CONVERT_WARPS * 4
        row_units = self.D // 16  # a staging row's 16-byte units: 8 (D128) or 4 (D64)
        log2_units = row_units.bit_length() - 1
        src_xor = lane8 if row_units == 8 else (lane8 >> 1) & 3  # the staging swizzle of rows r % 8 = lane8
        pairs = (self.bn // 8) * row_units
        src_stage = stage * (self.bn * self.D // 4)  # Int32 words
        dst_stage = stage * (self.bn * self.D * 2 // 4)
        # CONVERT_UNROLL pairs a thread in flight: their loads issue together, then their conversions and stores
        words = cute.make_rmem_tensor((4, self.CONVERT_UNROLL), Int32)
        out = cute.make_rmem_tensor((8,), Int32)
        for p0 in cutlass.range(group, pairs, groups * self.CONVERT_UNROLL, unroll=1):
            for j in cutlass.range_constexpr(self.CONVERT_UNROLL):
                p = cutlass.min(p0 + j * groups, pairs - 1)  # (past the tile: a pair's load again, not stored)
                r = ((p >> log2_units) << 3) + lane8
                src = src_stage + r * (self.D // 4) + (((p & (row_units - 1)) ^ src_xor) << 2)
                words[None, j].store(cute.make_tensor(src32 + cute.assume(src, divby=4), cute.make_layout(4)).load())
            for j in cutlass.range_constexpr(self.CONVERT_UNROLL):
                p = p0 + j * groups
                unit = p & (row_units - 1)
                r = ((p >> log2_units) << 3) + lane8
                if r >= valid_rows:  # e4m3 zeros convert to fp16 zeros
                    for w in cutlass.range_constexpr(4):
                        words[w, j] = Int32(0)
                for w in cutlass.range_constexpr(4):
                    lo, hi = e4m3x4_to_f16x2x2(words[w, j])
                    out[2 * w] = lo
                    out[2 * w + 1] = hi
                if p < pairs:
                    # the unit's 16 values: columns 16 unit .. + 15, two 16-byte units of its 64-column chunk's row
                    row = dst_stage + (unit >> 2) * (self.bn * 128 // 4) + r * 32
                    for h in cutlass.range_constexpr(2):
                        off = row + (((((unit & 3) << 1) + h) ^ lane8) << 2)
                        cute.make_tensor(dst32 + cute.assume(off, divby=4), cute.make_layout(4)).store(
                            cute.make_tensor(out.iterator + 4 * h, cute.make_layout(4)).load())
        cute.arch.fence_view_async_shared()
        cute.arch.sync_warp()
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive(bars + full(stage))
            cute.arch.mbarrier_arrive(bars + empty8(stage))

    @cute.jit
    def producer_tile(self, tma_q, tma_k, tma_v, storage, q_row0, kv_row0, head, kv_head, bidx, m_block, n_max,
                      n_iter, g0, q_count):
        """One elected thread: K of the tile's first kv block (it may stream in while the consumers
        still finish the previous tile), Q once the consumers have released Q's buffer, then the
        rest of the n_iter kv blocks, last one first. g0: the ring position of this tile's first block."""
        bars = storage.bars.data_ptr()
        sQ = storage.sQ.data_ptr()
        sK = storage.sK.data_ptr()
        sV = storage.sV.data_ptr()
        if n_max > 0:
            self.load_kv(tma_k, sK, self.k_full, self.k_empty, g0, n_max - 1, kv_row0, kv_head, bidx, bars)
        cute.arch.mbarrier_wait(bars + self.Q_EMPTY, (q_count & 1) ^ 1)
        cute.arch.mbarrier_arrive_and_expect_tx(bars + self.Q_FULL, self.q_tx)
        for w in cutlass.range_constexpr(self.n_wg):
            for c in cutlass.range_constexpr(self.chunks):
                prims.cp_async_bulk_tensor_shared_cta_global(
                    sQ + (w * self.n_wg_rows * self.D + c * self.n_wg_rows * TMA_BOX_COLS), tma_q.get_ptr(),
                    self.tma_coords(c * TMA_BOX_COLS, q_row0 + m_block * self.bm + w * self.n_wg_rows, head, bidx),
                    bars + self.Q_FULL)
        if n_max > 0:
            self.load_kv(tma_v, sV, self.v_full, self.v_empty, g0, n_max - 1, kv_row0, kv_head, bidx, bars)
        for t in cutlass.range(1, n_iter, unroll=1):
            self.load_kv(tma_k, sK, self.k_full, self.k_empty, g0 + t, n_max - 1 - t, kv_row0, kv_head, bidx, bars)
            self.load_kv(tma_v, sV, self.v_full, self.v_empty, g0 + t, n_max - 1 - t, kv_row0, kv_head, bidx, bars)

    # ---- consumer warpgroups -------------------------------------------------------------
    # Ping-pong (self.SCHED + w: the "may issue GEMMs" barrier of warpgroup w): the warpgroups take turns
    # issuing their GEMMs, in order 0, 1[, 2], 0, ..., so one's softmax runs while another's GEMMs occupy
    # the tensor cores.

    def sched_sync(self, ctx):
        if self.pingpong:  # a Python bool: decided while tracing
            cute.arch.barrier(barrier_id=self.SCHED + ctx.wg_index, number_of_threads=2 * _WG)

    def sched_arrive(self, ctx):
        if self.pingpong:  # let the next warpgroup issue
            cute.arch.barrier_arrive(barrier_id=self.SCHED + ctx.wg_next, number_of_threads=2 * _WG)

    def issue_qk(self, ctx, s):
        """S = Q K[stage s]^T, issued (one wgmma group), not waited for."""
        acc_S = cute.make_rmem_tensor(ctx.thr_qk.partition_shape_C((self.n_wg_rows, self.bn)), Float32)
        gemm(ctx.mma_qk, acc_S, ctx.tSrQ, ctx.tSrK[None, None, None, s], zero_init=True)
        return acc_S

    def issue_pv(self, ctx, s, fixed: cutlass.Constexpr):
        """O += P V[stage s] (P from registers), issued, not waited for; with fixed and sum_by_mma also the row
        sums, acc_L += P ones, in the same group."""
        also = (ctx.mma_sum, ctx.acc_L, ctx.tLrOnes) if fixed and self.sum_by_mma else None
        gemm(ctx.mma_pv, ctx.acc_O, ctx.tOrP, ctx.tOrVt[None, None, None, s], zero_init=False, also=also)

    @cute.jit
    def softmax(self, ctx, acc_S, n, masked: cutlass.Constexpr, fixed: cutlass.Constexpr):
        """[mask] kv block n, online softmax: S -> P (in place), row max/sum updated, the O rescale
        factors left in ctx.alpha. fixed: soft-capped rows against their fixed offset (no max, no factors)."""
        S_mn = acc_mn_view(acc_S)
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        scale_log2 = ctx.scale_log2
        if cutlass.const_expr(masked and not self.paged):
            key_lim, causal_lim = score_limits(ctx.row0, n * self.bn, ctx.col0, ctx.s_q, ctx.s_kv)
        for r in cutlass.range_constexpr(cute.size(row_max)):
            if cutlass.const_expr(self.softcap):
                # tanh and exp2 share the MUFU; moving a quarter of the exp2s to the FMA pipe measured no
                # faster (prefill_experiment_softcap_exp2_fma.json, branch softcap-exp2-fma)
                softcap_row(S_mn, r, ctx.cap_in)
            if cutlass.const_expr(masked):
                if cutlass.const_expr(self.paged):  # GQA-packed rows: each row's own key limits
                    key0 = n * self.bn + ctx.col0
                    if cutlass.const_expr(self.window):
                        mask_columns_between(S_mn, r, ctx.cS_mn, ctx.row_lo[r] - key0, ctx.row_lim[r] - key0)
                    else:
                        mask_columns(S_mn, r, ctx.cS_mn, ctx.row_lim[r] - key0)
                else:
                    mask_row(S_mn, r, ctx.cS_mn, key_lim, causal_lim, self.causal, self.window, ctx.window_left)
            # FA3's order (every row's max and alpha, then the exp2s), or O's rescale written between the exp2s,
            # measured no faster (benchmarks/results/prefill_experiment_softmax_order.json)
            if cutlass.const_expr(fixed):
                capped_softmax_row(S_mn, row_max, None if self.sum_by_mma else row_sum, r, scale_log2)
            else:
                alpha = softmax_row(S_mn, row_max, row_sum, r, scale_log2)
                ctx.alpha[r] = alpha

    @cute.jit
    def rescale_o(self, ctx, fixed: cutlass.Constexpr):
        if cutlass.const_expr(not fixed):  # a fixed offset never moves: nothing to rescale
            rescale_rows(acc_mn_view(ctx.acc_O), ctx.alpha)

    @cute.jit
    def release_q(self, ctx):
        """This warpgroup is done with its Q slab (one arrive per warp on Q_EMPTY)."""
        cute.arch.sync_warp()
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(ctx.bars + self.Q_EMPTY)

    @cute.jit
    def packed_token(self, ctx, local):
        """(query token, query head) of row `local` (0..63) of this warpgroup's GQA-packed slab (paged): the
        slab holds tokens tok0 .. tok0 + slab_tokens - 1, each token's `group` query heads of the KV head in
        rows of their own, token-major. Rows from slab_tokens * group on (a group that does not divide 64)
        are padding: token s_q, never stored (their Q rows are whatever the slab held)."""
        t = local // ctx.group
        tok = ctx.tok0 + t
        if t >= ctx.slab_tokens:
            tok = ctx.s_q
        return tok, ctx.kv_head * ctx.group + local - t * ctx.group

    @cute.jit
    def q_to_f16(self, ctx, wg_index):
        """fp8 KV with bf16 queries: rewrite this warpgroup's Q slab in place as fp16 times 2^-e, e = floor(log2(
        max |q|)) - 13 over the slab's packed rows (the largest scaled |q| in [2^13, 2^14): fp16 holds every bf16
        query to its full precision but for values 2^27 below the largest); returns 2^e, which the softmax scale
        takes. Each thread rewrites the 16-byte units it read (a unit is 8 values of one row, whatever the
        swizzle); the warps' maxima meet in the barrier block's scratch."""
        per_thread = self.n_wg_rows * self.D // VEC // _WG
        slab = cute.recast_ptr(ctx.sQ_ptr + wg_index * self.n_wg_rows * self.D, dtype=self.dtype)
        slab16 = cute.recast_ptr(slab, dtype=cutlass.Float16)
        x = cute.make_rmem_tensor((VEC, per_thread), Float32)
        m = Float32(0.0)
        for k in cutlass.range_constexpr(per_thread):
            u = ctx.wg_tid + k * _WG
            v = cute.make_rmem_tensor((VEC,), self.dtype)
            v.store(cute.make_tensor(slab + cute.assume(u * VEC, divby=VEC), cute.make_layout(VEC)).load())
            x[None, k].store(v.load().to(Float32))
            # 64-column chunks of 64 rows x 8 units: the unit's row; rows past the packed ones hold anything
            if (u % (self.n_wg_rows * 8)) // 8 < ctx.slab_tokens * ctx.group:
                for i in cutlass.range_constexpr(VEC):
                    m = cute.arch.fmax(m, cute.arch.fmax(x[i, k], -x[i, k]))
        for off in (16, 8, 4, 2, 1):
            m = cute.arch.fmax(m, cute.arch.shuffle_sync_bfly(m, offset=off, mask=-1, mask_and_clamp=31))
        red = cute.recast_ptr(ctx.bars + self.SCRATCH_BYTES // 8, dtype=Float32) + wg_index * 4
        if ctx.lane == 0:
            red[ctx.wg_tid // 32] = m
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        for w in cutlass.range_constexpr(4):
            m = cute.arch.fmax(m, red[w])
        e = cutlass.max(cutlass.min(exponent_of(m) - 13, Int32(120)), Int32(-120))  # (m = 0: -120)
        x.store(x.load() * pow2(-e))
        for k in cutlass.range_constexpr(per_thread):
            u = ctx.wg_tid + k * _WG
            h = cute.make_rmem_tensor((VEC,), cutlass.Float16)
            h.store(x[None, k].load().to(cutlass.Float16))
            cute.make_tensor(slab16 + cute.assume(u * VEC, divby=VEC), cute.make_layout(VEC)).store(h.load())
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        return pow2(e)

    @cute.jit
    def store_p(self, ctx, acc_S):
        """P (the softmax'd S tile) to fp16/bf16 into the PV GEMM's A-operand registers, in pairs: D256's 40 values
        a thread converted whole by LLVM (half singly, merged with PRMTs) split its PV GEMM into five wgmma groups,
        and the wait for S then waited for most of PV (hopper.store_converted_pairs). The pairs keep one group; with
        O's rescale after the PV wait they measured 4.8-5.4% more SM cycles than the five groups, with it before the PV
        issue 3.1-4.1% fewer (benchmarks/results/prefill_rescale_before_pv.json)."""
        store_converted_pairs(ctx.rP, acc_S)

    @cute.jit
    def first_block(self, ctx, n_max, n_iter, g0, fixed: cutlass.Constexpr):
        """kv iteration 0 (block n_max - 1, always in the masked range): S, softmax, P; O is still 0."""
        bars = ctx.bars
        s, phase = self.ring(g0)
        cute.arch.mbarrier_wait(bars + self.k_full(s), phase)
        self.sched_sync(ctx)
        acc_S = self.issue_qk(ctx, s)
        self.sched_arrive(ctx)
        warpgroup.wait_group(0)
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + self.k_empty(s))
        if cutlass.const_expr(self.sep_o):
            if n_iter == 1:
                self.release_q(ctx)  # the tile's only S GEMM is done: the next tile's Q may load
        self.softmax(ctx, acc_S, n_max - 1, True, fixed)
        self.store_p(ctx, acc_S)

    @cute.jit
    def overlapped_block(self, ctx, t, n_max, n_iter, g0, masked: cutlass.Constexpr, fixed: cutlass.Constexpr):
        """kv iteration t >= 1 (block n = n_max - 1 - t): S(t) = Q K(t)^T and O += P(t-1) V(t-1) are
        issued together, O rescaled by block t-1's factors between them; the softmax of S(t) runs while
        the PV GEMM is in flight; then P(t) replaces P(t-1) in the A-operand registers."""
        bars = ctx.bars
        s, phase = self.ring(g0 + t)
        sp, phase_p = self.ring(g0 + t - 1)
        cute.arch.mbarrier_wait(bars + self.k_full(s), phase)
        self.sched_sync(ctx)
        acc_S = self.issue_qk(ctx, s)
        # O's rescale (by block t-1's factors) under the S GEMM, not after the PV wait (FA3's order for D > 128): with
        # nothing after the softmax that needs O, ptxas no longer pulls the PV wait up to interleave the rescale with
        # the exp2s. D256 (with P converted in pairs, store_p): 3.1-4.1% fewer SM cycles, D128 and D64 +0.3 to -1.2%
        # (benchmarks/results/prefill_rescale_before_pv.json)
        self.rescale_o(ctx, fixed)
        cute.arch.mbarrier_wait(bars + self.v_full(sp), phase_p)
        self.issue_pv(ctx, sp, fixed)
        self.sched_arrive(ctx)
        warpgroup.wait_group(1)  # S(t) done; PV(t-1) may still run
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + self.k_empty(s))
        self.softmax(ctx, acc_S, n_max - 1 - t, masked, fixed)
        warpgroup.wait_group(0)  # PV(t-1) done: O and P(t-1) are free
        # V(t-1)'s stage is free since this wait. ptxas moves the wait up into the softmax, next to the stage
        # arrives; for the tiles without an O tile of their own (D128-176, D256) the V arrive after P's conversion
        # (then also after O's rescale) left more of the softmax's exp2s before it (D128-176: 17 of 90, against 3) and
        # took 1.7-2.7% fewer SM cycles (D256 0.8%), but 0.8% more for D128-128
        # (benchmarks/results/prefill_release_v_late.json)
        if cutlass.const_expr(self.sep_o):
            if ctx.lane == 0:
                cute.arch.mbarrier_arrive(bars + self.v_empty(sp))
            # the tile's last S GEMM is done: the next tile's Q may load. Not before the softmax: a branch while
            # the PV GEMM is in flight made ptxas wait for it ahead of the whole softmax (D128-128 and D64 lost
            # the softmax's overlap with PV: 2-3.6% more SM cycles; benchmarks/results/prefill_release_q_after_pv.json)
            if t == n_iter - 1:
                self.release_q(ctx)
        self.store_p(ctx, acc_S)
        if cutlass.const_expr(not self.sep_o):
            if ctx.lane == 0:
                cute.arch.mbarrier_arrive(bars + self.v_empty(sp))

    @cute.jit
    def last_block(self, ctx, n_iter, g0, fixed: cutlass.Constexpr):
        """O rescaled by the last block's factors, O += P(last) V(last)."""
        bars = ctx.bars
        s, phase = self.ring(g0 + n_iter - 1)
        self.rescale_o(ctx, fixed)
        cute.arch.mbarrier_wait(bars + self.v_full(s), phase)
        self.sched_sync(ctx)
        self.issue_pv(ctx, s, fixed)
        self.sched_arrive(ctx)
        warpgroup.wait_group(0)
        if ctx.lane == 0:
            cute.arch.mbarrier_arrive(bars + self.v_empty(s))

    @cute.jit
    def epilogue(self, ctx, o, wg_index):
        """O = acc / rowsum and the rows' LSE, then (store_o) O and LSE out; paged KV splits (split_word's splits >
        1): then the split's O and LSE to the workspace too, and the split arriving last stores the merge over what
        every split stored; a split tail's piece of a split tile: the first of its two to arrive writes its O and
        LSE to the workspace, the second merges them into its own before its store (pair_arrive)."""
        acc_O = ctx.acc_O
        row_max = ctx.row_max
        row_sum = ctx.row_sum
        n_rows = cute.size(row_max)
        O_mn = acc_mn_view(acc_O)
        lse_r = cute.make_rmem_tensor((n_rows,), Float32)
        split = Int32(0)
        splits = Int32(1)
        word = Int32(0)
        if cutlass.const_expr(self.kv_splits):
            word = self.shared_words(ctx.bars, self.SPLIT_WORDS, 2)[ctx.q_count & 1]
            split = word & 255
            splits = (word >> 8) & 255
        # a split-tail piece (tail_tile's word), its loop's own copy of the epilogue; the whole rounds' has none
        tail_piece = self.tail_splits and getattr(ctx, "split_word", None) is not None
        if cutlass.const_expr(tail_piece):
            word = ctx.split_word
            split = word & 255
            splits = (word >> 8) & 255
        sink_log2 = None
        if cutlass.const_expr(self.sinks):
            sink_log2 = cute.make_rmem_tensor((n_rows,), Float32)
            for r in cutlass.range_constexpr(n_rows):
                if cutlass.const_expr(self.paged):  # packed row r: its own query head
                    _, head = self.packed_token(ctx, ctx.local0 + ctx.cS_mn[r, 0][0])
                    sink_log2[r] = ctx.sinks[head] * Float32(LOG2_E)
                    if split != 0:  # the sink joins one split's softmax, so the merge counts it once
                        sink_log2[r] = Float32(NEG_INF)
                else:
                    sink_log2[r] = ctx.sinks[ctx.head] * Float32(LOG2_E)
                    if cutlass.const_expr(tail_piece):
                        if split != 0:  # counted once, in split 0's softmax
                            sink_log2[r] = Float32(NEG_INF)
        if cutlass.const_expr(self.fp8):  # O over v_fp8: times the V scale
            acc_O.store(acc_O.load() * ctx.v_scale)
        normalize_rows(O_mn, row_max, row_sum, ctx.scale_log2, lse_r, sink_log2)
        # a KV split stores its own O and LSE like a whole tile, then (split_arrive: its stores ordered before its
        # arrival) the split arriving last merges every split's and stores over them (store_merged). The stores stay
        # out of the split's branch: ptxas scheduled the kv loops otherwise when they depended on it (the PV wait
        # before every exp2 of the D128-176 loop: 5% more SM cycles).
        first = Int32(0)
        if cutlass.const_expr(tail_piece):
            if splits > 1:
                first = self.pair_arrive(acc_O, ctx.wg_tid, ctx.bars, ctx.split_partials, ctx.split_counters, wg_index,
                                         split, (word >> 16) & 0xFFFF, lse_r)
        self.store_o(ctx, o, wg_index, lse_r)
        if cutlass.const_expr(tail_piece):
            if first != 0:
                self.pair_leave(ctx.wg_tid, ctx.split_counters, wg_index, (word >> 16) & 0xFFFF)
        if cutlass.const_expr(self.kv_splits):
            if splits > 1:
                item0 = (word >> 16) & 0xFFFF
                last = self.split_arrive(acc_O, ctx.wg_tid, ctx.bars, ctx.split_partials, ctx.split_counters,
                                         wg_index, split, splits, item0, lse_r)
                if last != 0:
                    self.merge_splits(acc_O, ctx.wg_tid, ctx.split_partials, wg_index, splits, item0, lse_r)
                    rows = (ctx.q_start, ctx.s_q, ctx.tok0, ctx.slab_tokens, ctx.kv_head, ctx.group)
                    self.store_merged(acc_O, ctx.mma_pv, ctx.wg_tid, ctx.lane, o, ctx.lse, ctx.write_lse,
                                      ctx.o_ss, ctx.o_sh, ctx.lse_ss, ctx.lse_sh, rows, lse_r)

    def split_slot(self, acc_O, item, wg_index):
        """The float offset of a warpgroup's partial of work item `item` in split_partials: per consumer thread,
        its O fragment (two rows of an m64 wgmma accumulator) in 16-byte vectors, row by row (vector v of thread t at
        v * 128 + t), then its two rows' LSEs (row r's at r * 128 + t);
        aotc.families.sdpa_prefill_sm90.split_workspace_bytes sizes it."""
        frag = cute.size(acc_O)
        return Int64(item * self.n_wg + wg_index) * Int64(_WG * (frag + 2))

    @cute.jit
    def split_arrive(self, acc_O, t, bars, ws, counters, wg_index, split, splits, item0, lse_r):
        """Paged KV split: this warpgroup's O (normalized, fp32) and LSE to its slot, then a ticket from the
        (tile, warpgroup) counter: 1 for the split arriving last, which resets the counter (the launch leaves every
        counter 0), else 0. The barrier orders every thread's partial stores before thread 0's gpu-scope acq_rel
        atomic (release is cumulative); the second passes its acquire on, so the last split reads the others'
        partials (the decode family's split_arrive, per warpgroup)."""
        self.write_partial(acc_O, t, ws, self.split_slot(acc_O, item0 + split, wg_index), lse_r)
        flags = self.shared_words(bars, self.SPLIT_FLAGS, self.n_wg)
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        if t == 0:
            idx = Int64(item0) * Int64(self.n_wg) + Int64(wg_index)
            ticket = cute.arch.atomic_add(counters + idx, Int32(1), sem="acq_rel", scope="gpu")
            flag = Int32(0)
            if ticket == splits - 1:
                # every split arrived: nothing else touches the counter in this launch, and the next launch
                # (stream-ordered) sees the 0
                cute.make_tensor(counters + idx, cute.make_layout(1))[0] = Int32(0)
                flag = Int32(1)
            flags[wg_index] = flag
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        return flags[wg_index]

    @cute.jit
    def write_partial(self, acc_O, t, ws, base, lse_r):
        """This thread's O fragment (normalized, fp32) and its rows' LSEs into the workspace slot at `base`
        (split_slot's layout)."""
        frag = cute.size(acc_O)
        n_rows = cute.size(lse_r)
        O_mn = acc_mn_view(acc_O)
        n_cols = frag // n_rows
        vec = cute.make_rmem_tensor((4,), Float32)
        for r in cutlass.range_constexpr(n_rows):
            for k in cutlass.range_constexpr(n_cols // 4):
                for e in cutlass.range_constexpr(4):
                    vec[e] = O_mn[r, 4 * k + e]
                off = base + Int64(((r * (n_cols // 4) + k) * _WG + t) * 4)
                cute.make_tensor(ws + cute.assume(off, divby=4), cute.make_layout(4)).store(vec.load())
        for r in cutlass.range_constexpr(n_rows):
            ws[base + Int64(frag * _WG + r * _WG + t)] = lse_r[r]

    # A split tail's split tile (PersistentTiles.tail_piece): two pieces on two CTAs share boundary b's slot and
    # (per consumer warpgroup) its counter, 0 at launch. Thread 0 of a piece's warpgroup adds 1: the first to arrive
    # (ticket 0) writes its partial, stores its O like a whole tile's, then adds 2 (release, after a barrier: every
    # thread's stores before it); the second waits until the counter reads 4 (ticket 3: at once), puts it back to 0,
    # merges the first's partial into its own O and LSE, and stores over the first's O. Only the first, already past
    # its kv loop, is ever waited for, so no piece waits on a CTA that has not started. One partial a split tile, and
    # its merge needs no second store of O (a paged split's last arrival stores the merge over its own store).
    @cute.jit
    def pair_arrive(self, acc_O, t, bars, ws, counters, wg_index, split, boundary, lse_r):
        """A split-tail piece of a split tile: its ticket; the first writes its partial, the second merges the
        first's into acc_O and lse_r. Returns 1 for the first (which then calls pair_leave after its store)."""
        flags = self.shared_words(bars, self.SPLIT_FLAGS, self.n_wg)
        if t == 0:
            idx = Int64(boundary) * Int64(self.n_wg) + Int64(wg_index)
            ticket = cute.arch.atomic_add(counters + idx, Int32(1), sem="acq_rel", scope="gpu")
            if ticket != 0:
                seen = ticket + 1
                while seen != 4:  # the first's release not seen yet
                    seen = cute.arch.atomic_add(counters + idx, Int32(0), sem="acquire", scope="gpu")
                # both arrived: nothing else touches the counter in this launch, and the next launch (stream-
                # ordered) sees the 0
                cute.make_tensor(counters + idx, cute.make_layout(1))[0] = Int32(0)
            flag = Int32(0)
            if ticket == 0:
                flag = Int32(1)
            flags[wg_index] = flag
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)  # passes thread 0's acquire on
        first = flags[wg_index]
        base = self.split_slot(acc_O, boundary, wg_index)
        if first != 0:
            self.write_partial(acc_O, t, ws, base, lse_r)
        else:
            self.merge_pair(acc_O, t, ws, base, split, lse_r)
        return first

    @cute.jit
    def pair_leave(self, t, counters, wg_index, boundary):
        """The first piece of a split tile, its partial and its O stored: the release its second piece waits for."""
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        if t == 0:
            idx = Int64(boundary) * Int64(self.n_wg) + Int64(wg_index)
            cute.arch.atomic_add(counters + idx, Int32(2), sem="release", scope="gpu")

    @cute.jit
    def merge_pair(self, acc_O, t, ws, base, split, lse_r):
        """The second piece of a split tile: its own O and LSE (acc_O, lse_r) merged with the first's partial at
        `base`, as merge_splits merges (weights exp(lse_j - m)), the terms taken in split order whichever arrived
        second, so the bits do not depend on the order of arrival."""
        O_mn = acc_mn_view(acc_O)
        frag = cute.size(acc_O)
        n_rows = cute.size(lse_r)
        n_cols = frag // n_rows
        vec = cute.make_rmem_tensor((4,), Float32)
        for r in cutlass.range_constexpr(n_rows):
            other = ws[base + Int64(frag * _WG + r * _WG + t)]
            m = cute.arch.fmax(lse_r[r], other)
            if m == Float32(NEG_INF):  # neither piece saw a key: every weight 0
                m = Float32(0.0)
            w_own = cute.math.exp2((lse_r[r] - m) * Float32(LOG2_E), fastmath=True)
            w_other = cute.math.exp2((other - m) * Float32(LOG2_E), fastmath=True)
            w0, w1 = w_own, w_other
            if split != 0:
                w0, w1 = w_other, w_own
            total = w0 + w1
            inv = Float32(0.0)
            lse_r[r] = Float32(NEG_INF)
            if total > Float32(0.0):
                inv = cute.arch.rcp_approx(total)
                lse_r[r] = m + cute.math.log2(total, fastmath=True) * Float32(LN_2)
            for k in cutlass.range_constexpr(n_cols // 4):
                off = base + Int64(((r * (n_cols // 4) + k) * _WG + t) * 4)
                cute.autovec_copy(cute.make_tensor(ws + cute.assume(off, divby=4), cute.make_layout(4)), vec)
                for e in cutlass.range_constexpr(4):
                    x0, x1 = O_mn[r, 4 * k + e], vec[e]
                    if split != 0:
                        x0, x1 = vec[e], O_mn[r, 4 * k + e]
                    O_mn[r, 4 * k + e] = (x0 * w0 + x1 * w1) * inv

    @cute.jit
    def merge_splits(self, acc_O, t, ws, wg_index, splits, item0, lse_r):
        """The last split of a tile, per thread over its own fragment: O = sum_j exp(lse_j - m) O_j / L with L =
        sum_j exp(lse_j - m), m the largest lse_j, LSE = m + log L, every split's O_j and lse_j read back from its
        slot (this one's too) and added in split order, so the bits do not depend on which split arrived last. A
        split whose row saw no key has O_j = 0, lse_j = -inf (weight 0); no split that did: O = 0, LSE = -inf."""
        O_mn = acc_mn_view(acc_O)
        frag = cute.size(acc_O)
        n_rows = cute.size(lse_r)
        m = cute.make_rmem_tensor((n_rows,), Float32)
        m.fill(NEG_INF)
        for j in cutlass.range(splits, unroll=1):
            base = self.split_slot(acc_O, item0 + j, wg_index)
            for r in cutlass.range_constexpr(n_rows):
                m[r] = cute.arch.fmax(m[r], ws[base + Int64(frag * _WG + r * _WG + t)])
        for r in cutlass.range_constexpr(n_rows):
            if m[r] == Float32(NEG_INF):  # no split saw a key: every weight 0
                m[r] = Float32(0.0)
        total = cute.make_rmem_tensor((n_rows,), Float32)
        total.fill(0.0)
        acc_O.fill(0.0)
        n_cols = frag // n_rows
        vec = cute.make_rmem_tensor((4,), Float32)
        for j in cutlass.range(splits, unroll=1):
            base = self.split_slot(acc_O, item0 + j, wg_index)
            for r in cutlass.range_constexpr(n_rows):
                w = cute.math.exp2((ws[base + Int64(frag * _WG + r * _WG + t)] - m[r]) * Float32(LOG2_E),
                                   fastmath=True)
                total[r] = total[r] + w
                for k in cutlass.range_constexpr(n_cols // 4):
                    off = base + Int64(((r * (n_cols // 4) + k) * _WG + t) * 4)
                    cute.autovec_copy(cute.make_tensor(ws + cute.assume(off, divby=4), cute.make_layout(4)), vec)
                    for e in cutlass.range_constexpr(4):
                        O_mn[r, 4 * k + e] = O_mn[r, 4 * k + e] + vec[e] * w
        for r in cutlass.range_constexpr(n_rows):
            inv = Float32(0.0)
            lse_r[r] = Float32(NEG_INF)
            if total[r] > Float32(0.0):
                inv = cute.arch.rcp_approx(total[r])
                lse_r[r] = m[r] + cute.math.log2(total[r], fastmath=True) * Float32(LN_2)
            O_mn[r, None].store(O_mn[r, None].load() * inv)

    @cute.jit
    def store_merged(self, acc_O, mma_pv, t, lane, o, lse, write_lse, o_ss, o_sh, lse_ss, lse_sh, rows, lse_r):
        """The merged O of a split tile over what its splits stored: straight from this thread's accumulator
        fragment, two adjacent columns a 4-byte store (the rare path: no staging), and its rows' LSE (one thread
        a quad); rows = (q_start, s_q, tok0, slab_tokens, kv_head, group) place the GQA-packed slab's rows as
        packed_token does, those of tokens < S_q stored."""
        q_start, s_q, tok0, slab_tokens, kv_head, group = rows
        O_mn = acc_mn_view(acc_O)
        cO_mn = acc_mn_view(mma_pv.get_slice(t).partition_C(cute.make_identity_tensor((self.n_wg_rows, self.D))))
        pair = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(cute.size(lse_r)):
            local = cO_mn[r, 0][0]
            k = local // group
            tok = tok0 + k
            head = kv_head * group + local - k * group
            if tok < s_q and k < slab_tokens:
                row = Int64(q_start + tok) * o_ss + Int64(head) * o_sh
                for c in cutlass.range_constexpr(0, cute.size(O_mn, mode=[1]), 2):
                    pair[0] = O_mn[r, c]
                    pair[1] = O_mn[r, c + 1]
                    dst = cute.make_tensor(o + cute.assume(row + Int64(cO_mn[r, c][1]), divby=2), cute.make_layout(2))
                    dst.store(pair.load().to(self.dtype))
                if write_lse != 0:
                    if lane % 4 == 0:
                        lse[Int64(head) * lse_sh + Int64(q_start + tok) * lse_ss] = lse_r[r]

    @cute.jit
    def store_o(self, ctx, o, wg_index, lse_r):
        """O (normalized) -> smem (this warpgroup's Q slab) -> 128-bit stores of rows < S_q; LSE."""
        acc_O = ctx.acc_O
        n_rows = cute.size(lse_r)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        sO = ctx.sO_wg  # this warpgroup's O staging slab (its Q slab when there is no room for one)
        r2s_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32)
        r2s = cute.make_tiled_copy_C(r2s_atom, ctx.mma_pv).get_slice(ctx.wg_tid)
        # every thread of the warpgroup is done reading the slab (previous tile's stores, or its
        # S GEMMs when the slab is Q's) before it is overwritten
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)
        cute.copy(r2s, r2s.retile(rO), r2s.partition_D(sO))
        cute.arch.barrier(barrier_id=1 + wg_index, number_of_threads=_WG)

        s2g = make_s2g(self.dtype, _WG)
        s2g_thr = s2g.get_slice(ctx.wg_tid)
        row_base = ctx.m_block * self.bm + wg_index * self.n_wg_rows  # first row of this warpgroup's slab
        # the runtime guarantees 16-byte aligned O and strides that are multiples of 8 elements
        # (assumed here, where it is used: a value carried into the tile loop loses its assumptions)
        o_ss = cute.assume(ctx.o_ss, divby=VEC)
        o_tile = o + cute.assume(ctx.o_off + Int64(row_base) * o_ss, divby=VEC)
        gO = cute.make_tensor(o_tile, cute.make_layout((self.n_wg_rows, self.D), stride=(o_ss, 1)))
        tOsO = s2g_thr.partition_S(sO)
        tOgO = s2g_thr.partition_D(gO)
        tOrO = cute.make_rmem_tensor_like(tOsO, self.dtype)
        cute.autovec_copy(tOsO, tOrO)
        if cutlass.const_expr(not self.sep_o):
            self.release_q(ctx)  # O staged in Q's slab: read back, the next tile's Q may come
        cO = cute.make_identity_tensor((self.n_wg_rows, self.D))
        t0OcO = s2g.get_slice(0).partition_S(cO)
        if cutlass.const_expr(self.paged):
            # the slab's packed rows are (query token, query head) pairs (packed_token)
            thr_row = s2g_thr.partition_S(cO)[0][0]
            for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
                tok, head = self.packed_token(ctx, thr_row + t0OcO[0, m, 0][0])
                if tok < ctx.s_q:
                    off = Int64(ctx.q_start + tok) * o_ss + Int64(head) * cute.assume(ctx.o_sh, divby=VEC)
                    # a row-stride-0 view: the thread's row coordinate drops out of its partition
                    g_row = cute.make_tensor(o + cute.assume(off, divby=VEC),
                                             cute.make_layout((self.n_wg_rows, self.D), stride=(0, 1)))
                    cute.copy(s2g, tOrO[None, m, None], s2g_thr.partition_D(g_row)[None, m, None])
            if ctx.write_lse != 0:
                if ctx.lane % 4 == 0:
                    for r in cutlass.range_constexpr(n_rows):
                        tok, head = self.packed_token(ctx, ctx.local0 + ctx.cS_mn[r, 0][0])
                        if tok < ctx.s_q:
                            ctx.lse[Int64(head) * ctx.lse_sh + Int64(ctx.q_start + tok) * ctx.lse_ss] = lse_r[r]
        else:
            o_lim = ctx.s_q - row_base - s2g_thr.partition_S(cO)[0][0]
            for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
                if t0OcO[0, m, 0][0] < o_lim:
                    cute.copy(s2g, tOrO[None, m, None], tOgO[None, m, None])

            if ctx.write_lse != 0:
                if ctx.lane % 4 == 0:  # one thread of each quad writes the quad's rows
                    store_lse_rows(ctx.lse, ctx.lse_off, ctx.lse_ss, lse_r, ctx.cS_mn, ctx.row0, 0, ctx.s_q)

    @cute.jit
    def attend_tile(self, tile, o, wg_index, kv_range, g0, q_count):
        """One work item of a consumer warpgroup (tile: a per-item copy of its context): the kv loop over
        blocks n_max-1 .. n_min of kv_range (mask.kv_blocks_for_queries) in its three segments (masked,
        plain, masked: mask.kv_loop_segments), then the epilogue. g0: the ring position of its first
        block."""
        n_min, n_max, n_mask_min, n_left_end = kv_range
        n_iter, n_right, n_plain_end = kv_loop_segments(n_min, n_max, n_mask_min, n_left_end)
        if cutlass.const_expr(self.kv_splits):
            tile.q_count = q_count  # the tile's handoff: its split word's slot (epilogue)
        tile.acc_O.fill(0.0)
        tile.row_max.fill(NEG_INF)
        tile.row_sum.fill(0.0)
        if cutlass.const_expr(self.sum_by_mma):
            tile.acc_L.fill(0.0)
        cute.arch.mbarrier_wait(tile.bars + self.Q_FULL, q_count & 1)
        if cutlass.const_expr(self.fp8):
            # the GEMMs run in fp16: bf16 queries rewritten as fp16 times 2^-e; the K scale and 2^e into the scores
            q_scale = Float32(1.0)
            if cutlass.const_expr(self.dtype != cutlass.Float16):
                q_scale = self.q_to_f16(tile, wg_index)
            score = ScoreScale(tile.softmax_scale * tile.k_scale * q_scale, tile.softcap_value, self.softcap)
            tile.scale_log2 = score.scale_log2
            tile.cap_in = score.cap_in
        padding = False
        if cutlass.const_expr(self.paged):
            # (fp8 KV: the conversion warps wrote those rows as zeros)
            if cutlass.const_expr(not self.fp8):
                if n_max > 0 and tile.s_kv < n_max * self.bn:
                    self.zero_v_tail(tile, wg_index, n_max, g0)
            # GQA-packed: a short tile's last warpgroups may hold no real row
            padding = tile.tok0 >= tile.s_q
        if padding:
            self.idle_tile(tile, n_iter, g0)
        elif n_max > 0:
            if cutlass.const_expr(self.capped):
                if tile.fixed_offset:
                    tile.row_max.fill(tile.capped_row_max)
                    self.kv_loop(tile, n_max, n_iter, n_right, n_plain_end, g0, True)
                    if cutlass.const_expr(self.sum_by_mma):
                        # each thread of a quad holds its rows' whole sums; normalize_rows adds the quad's four
                        # (exactly: quarters of one value)
                        L_mn = acc_mn_view(tile.acc_L)
                        for r in cutlass.range_constexpr(cute.size(tile.row_sum)):
                            tile.row_sum[r] = L_mn[r, 0] * Float32(0.25)
                else:
                    self.kv_loop(tile, n_max, n_iter, n_right, n_plain_end, g0, False)
            else:
                self.kv_loop(tile, n_max, n_iter, n_right, n_plain_end, g0, False)
        else:
            if cutlass.const_expr(self.sep_o):
                self.release_q(tile)  # no S GEMM at all: Q's buffer is free at once
        if not padding:
            self.epilogue(tile, o, wg_index)

    @cute.jit
    def kv_loop(self, tile, n_max, n_iter, n_right, n_plain_end, g0, fixed: cutlass.Constexpr):
        """The kv blocks of a tile with at least one: the first, the masked ones on the right, the plain ones,
        [the window's masked left edge], the last PV. fixed: the soft-capped softmax against its fixed offset
        (the whole loop is compiled once per softmax, so that neither pays a branch inside it)."""
        self.first_block(tile, n_max, n_iter, g0, fixed)
        for t in cutlass.range(1, n_right, unroll=1):
            self.overlapped_block(tile, t, n_max, n_iter, g0, True, fixed)
        for t in cutlass.range(cutlass.max(n_right, 1), n_plain_end, unroll=1):
            self.overlapped_block(tile, t, n_max, n_iter, g0, False, fixed)
        if cutlass.const_expr(self.window):  # the window's left edge
            for t in cutlass.range(cutlass.max(n_plain_end, 1), n_iter, unroll=1):
                self.overlapped_block(tile, t, n_max, n_iter, g0, True, fixed)
        self.last_block(tile, n_iter, g0, fixed)

    def ring_offset(self, s, row, c: int):
        """Element offset of ring row `row`'s 64-column chunk c in stage s (smem_layout, before its swizzle, which
        keeps a 128-byte row in place): grouped_kv holds each 8-row group's chunks side by side."""
        if self.grouped_kv:
            return s * self.bn * self.D + (row >> 3) * (8 * self.D) + c * (8 * TMA_BOX_COLS) + (row & 7) * TMA_BOX_COLS
        return s * self.bn * self.D + c * self.bn * TMA_BOX_COLS + row * TMA_BOX_COLS

    @cute.jit
    def zero_v_tail(self, ctx, wg_index, n_max, g0):
        """Paged: the V rows past the sequence's end in its last kv block (the rest of its last page, read
        as it is) become zeros before any PV GEMM reads them, so whatever the pool holds there (NaN or Inf
        included) meets P = 0 as 0. Every consumer thread waits for the block's V, zeroes a share of those
        rows (a 128-byte row of a 64-column chunk is swizzled within itself), fences them for wgmma's
        async proxy and meets the others at ZERO_BAR."""
        tail = ctx.s_kv - (n_max - 1) * self.bn  # keys of the block, 1 .. block_n - 1
        s, phase = self.ring(g0)
        cute.arch.mbarrier_wait(ctx.bars + self.v_full(s), phase)
        rows = self.bn - tail
        units = rows * (TMA_BOX_COLS // VEC)  # 16-byte units per 64-column chunk
        zeros = cute.make_rmem_tensor((VEC,), self.dtype)
        zeros.fill(0.0)
        for u in cutlass.range(wg_index * _WG + ctx.wg_tid, units * self.chunks, self.n_wg * _WG, unroll=1):
            c = u // units
            r = u - c * units
            off = self.ring_offset(s, tail + r // (TMA_BOX_COLS // VEC), c) + (r % (TMA_BOX_COLS // VEC)) * VEC
            cute.make_tensor(ctx.sV_ptr + cute.assume(off, divby=VEC), cute.make_layout(VEC)).store(zeros.load())
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=self.ZERO_BAR, number_of_threads=self.n_wg * _WG)

    @cute.jit
    def idle_tile(self, ctx, n_iter, g0):
        """A consumer warpgroup whose rows of the tile are all padding (a decode token's group * s_q rows
        fill part of the first warpgroup's 64): it keeps the barrier protocol without computing. Q is
        released at once, each kv block's stages once they have landed (so this warpgroup never runs a
        ring phase ahead), and its turns in the GEMM issue order (ping-pong) are passed on, one per S GEMM
        and one for the last PV GEMM, as the other warpgroups take theirs; it stores nothing."""
        self.release_q(ctx)
        bars = ctx.bars
        for t in cutlass.range(n_iter, unroll=1):
            s, phase = self.ring(g0 + t)
            cute.arch.mbarrier_wait(bars + self.k_full(s), phase)
            self.sched_sync(ctx)
            self.sched_arrive(ctx)
            if ctx.lane == 0:
                cute.arch.mbarrier_arrive(bars + self.k_empty(s))
            cute.arch.mbarrier_wait(bars + self.v_full(s), phase)
            if ctx.lane == 0:
                cute.arch.mbarrier_arrive(bars + self.v_empty(s))
        if n_iter > 0:
            self.sched_sync(ctx)
            self.sched_arrive(ctx)

    @cute.kernel
    def sdpa_prefill_sm90_kernel(
        self,
        tma_q: cutlass.GridConstant[TensorMap], tma_k: cutlass.GridConstant[TensorMap],
        tma_v: cutlass.GridConstant[TensorMap],
        o: cute.Pointer, lse: cute.Pointer, cu_seqlens_q: cute.Pointer, cu_seqlens_kv: cute.Pointer,
        page_table: cute.Pointer, seqlens_kv: cute.Pointer,
        batch: Int32, seqlen_q: Int32, seqlen_kv: Int32,
        heads_q: Int32, heads_kv: Int32, write_lse: Int32, max_pages: Int32, min_seqlen_q: Int32,
        softmax_scale: Float32,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
        pt_stride_b: Int64, pt_stride_p: Int64,
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
        k_descale: cute.Pointer, v_descale: cute.Pointer, descale_stride_h: Int32, tile_counter: cute.Pointer,
        kv_groups_per_page: Int32, split_partials: cute.Pointer, split_counters: cute.Pointer, kv_splits_max: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        first_tile, _, _ = cute.arch.block_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        first_tile = Int32(first_tile)
        n_ctas = Int32(n_ctas)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp_idx // 4

        storage = SmemAllocator().allocate(self.SharedStorage)
        bars = storage.bars.data_ptr()
        if warp_idx == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bars + self.Q_FULL, 1)
                cute.arch.mbarrier_init(bars + self.Q_EMPTY, self.consumer_warps)
                # fp8 KV: the fp16 stages fill by the conversion warps' arrives, the staging tiles by TMA
                # (16-bit paged: an arrive from each of the ring's K/V issuers, with the bytes of its boxes)
                fill = self.CONVERT_WARPS if self.fp8 else self.kv_issuers
                for s in cutlass.range_constexpr(self.stages):
                    cute.arch.mbarrier_init(bars + self.k_full(s), fill)
                    cute.arch.mbarrier_init(bars + self.v_full(s), fill)
                    cute.arch.mbarrier_init(bars + self.k_empty(s), self.consumer_warps)
                    cute.arch.mbarrier_init(bars + self.v_empty(s), self.consumer_warps)
                    if cutlass.const_expr(self.fp8):
                        cute.arch.mbarrier_init(bars + self.k8_full(s), 1)
                        cute.arch.mbarrier_init(bars + self.v8_full(s), 1)
                        cute.arch.mbarrier_init(bars + self.k8_empty(s), self.CONVERT_WARPS)
                        cute.arch.mbarrier_init(bars + self.v8_empty(s), self.CONVERT_WARPS)
                if cutlass.const_expr(self.draws_tiles):
                    cute.arch.mbarrier_init(bars + self.tile_full(), 1)
                    # ragged and paged: every lane of a taker warp arrives (take_tile); the dense tail: its lane 0,
                    # the slot's one reader in its warp
                    takers = 32 * self.tile_takers if self.ragged else self.tile_takers
                    cute.arch.mbarrier_init(bars + self.tile_empty(), takers)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        # persistent: each CTA runs `rounds` work items (PersistentTiles); an item past the end, or past
        # its sequence's end (the grid covers max_seqlen_q), is skipped by every warpgroup alike
        m_blocks = (seqlen_q + (self.bm - 1)) // self.bm
        n_bh = heads_q * batch
        rounds, pairs = self.scheduler.rounds_and_pairs(m_blocks, n_bh, n_ctas)
        group = heads_q // heads_kv

        if cutlass.const_expr(self.paged):
            # GQA packing: a warpgroup's 64-row slab holds the query heads of slab_tokens tokens (the runtime
            # checks group <= 64; a group that does not divide 64 leaves the slab's last rows padding)
            slab_tokens = Int32(self.n_wg_rows) // group
            paged_args = (cu_seqlens_q, seqlens_kv, batch, slab_tokens, heads_kv, min_seqlen_q, max_pages,
                          self.sort_scratch(bars))
        elif cutlass.const_expr(self.ragged):
            # one query head's tokens a tile (no GQA packing); the producer counts the tiles after its setmaxnreg
            # (a count made before it lives across the register cut: D64's producer spilled it)
            ragged_args = (cu_seqlens_q, cu_seqlens_kv, batch, heads_q, group, self.sort_scratch(bars))

        if wg == 0:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if cutlass.const_expr(self.paged):
                if warp_idx == 0:  # the tile scan and the page-table reads are warp-wide; one lane issues
                    g0 = Int32(0)
                    q_count = Int32(0)
                    handoff = Int32(0)
                    n_tiles = self.ragged_tiles.count(cu_seqlens_q, batch, self.n_wg * slab_tokens, heads_kv,
                                                      min_seqlen_q, tidx)
                    r = first_tile
                    tables_p = (group, slab_tokens, page_table, pt_stride_b, pt_stride_p, kv_groups_per_page)
                    if cutlass.const_expr(not self.kv_splits):  # every tile whole
                        while r < n_tiles:
                            bidx, kv_head, m_block, q_start, s_q, s_kv = self.paged_tile(r, tidx, *paged_args)
                            self.publish_tile(bars, handoff, (1, kv_head, m_block, q_start, s_q, s_kv, bidx))
                            handoff = handoff + 1
                            n_min, n_max, _, _ = self.paged_kv_range(m_block, s_q, s_kv, slab_tokens, window_left)
                            g0, q_count = self.produce_paged_item(tma_q, tma_k, tma_v, storage, tables_p, bidx, kv_head,
                                                                  m_block, q_start, s_kv, n_min, n_max, g0, q_count)
                            r = self.draw_next(tile_counter, n_tiles, n_ctas, tidx)
                    else:
                        # KV splits: fewer tiles than CTAs share their blocks out, one wave of items (item r: split
                        # r % splits of tile r // splits; a tile's splits past tile_splits() are skipped)
                        while r < n_tiles * self.launch_splits(n_tiles, kv_splits_max):
                            splits = self.launch_splits(n_tiles, kv_splits_max)
                            t_idx = r // splits
                            split = r - t_idx * splits
                            bidx, kv_head, m_block, q_start, s_q, s_kv = self.paged_tile(t_idx, tidx, *paged_args)
                            kv_range = self.paged_kv_range(m_block, s_q, s_kv, slab_tokens, window_left)
                            tile_splits = self.tile_splits(kv_range, splits)
                            taken = Int32(0)
                            if split < tile_splits:
                                word = split + (tile_splits << 8)
                                if tile_splits > 1:
                                    word = word + ((r - split) << 16)
                                record = (1, kv_head, m_block, q_start, s_q, s_kv, bidx, word)
                                self.publish_tile(bars, handoff, record, word)
                                handoff = handoff + 1
                                n_min, n_max, _, _ = self.item_kv_range(kv_range, word)
                                item = (tma_q, tma_k, tma_v, storage, tables_p, bidx, kv_head, m_block, q_start, s_kv,
                                        n_min, n_max, g0, q_count)
                                if cutlass.const_expr(self.draws_early):
                                    g0, q_count, taken = self.produce_paged_item(
                                        *item, lambda: self.draw_start(tile_counter, tidx))
                                else:
                                    g0, q_count = self.produce_paged_item(*item)
                            else:
                                if cutlass.const_expr(self.draws_early):
                                    taken = self.draw_start(tile_counter, tidx)
                            if cutlass.const_expr(self.draws_early):
                                r = self.draw_finish(tile_counter, taken, n_tiles * splits, n_ctas, tidx)
                            else:
                                r = self.draw_next(tile_counter, n_tiles * splits, n_ctas, tidx)
                    self.publish_tile(bars, handoff, (0,))  # no tile left
                if cutlass.const_expr(self.fp8):
                    if warp_idx > 0:  # warps 1..3, the conversion warps, walk the same blocks
                        g0 = Int32(0)
                        # (fp8 KV takes no KV splits: launch_splits; the whole tile's blocks)
                        valid, kv_head, m_block, q_start, s_q, s_kv = self.take_tile(bars, 0, 6)
                        handoff = Int32(1)
                        while valid != 0:
                            n_min, n_max, _, _ = self.paged_kv_range(m_block, s_q, s_kv, slab_tokens, window_left)
                            for t in cutlass.range(n_max - n_min, unroll=1):
                                valid_rows = s_kv - (n_max - 1 - t) * self.bn
                                self.convert_block(storage, g0 + t, valid_rows, tidx - 32, False)
                                self.convert_block(storage, g0 + t, valid_rows, tidx - 32, True)
                            g0 = g0 + (n_max - n_min)
                            valid, kv_head, m_block, q_start, s_q, s_kv = self.take_tile(bars, handoff, 6)
                            handoff = handoff + 1
                else:
                    # warps 1..3: the other shares of the K and V boxes (kv_issuers per ring: warps 0 and 1 K,
                    # 2 and 3 V; warps 1 and 3 idle where a block is one box)
                    tables = (page_table, pt_stride_b, pt_stride_p, slab_tokens, window_left, kv_groups_per_page)
                    sK, sV = storage.sK.data_ptr(), storage.sV.data_ptr()
                    if warp_idx == 2:
                        self.kv_issuer(tma_v, sV, self.v_full, self.v_empty, bars, 0, *tables)
                    if cutlass.const_expr(self.kv_issuers == 2):
                        if warp_idx == 1:
                            self.kv_issuer(tma_k, sK, self.k_full, self.k_empty, bars, 1, *tables)
                        if warp_idx == 3:
                            self.kv_issuer(tma_v, sV, self.v_full, self.v_empty, bars, 1, *tables)
            elif cutlass.const_expr(self.ragged):
                if warp_idx == 0:  # the tile scan is warp-wide; one lane issues
                    g0 = Int32(0)
                    q_count = Int32(0)
                    handoff = Int32(0)
                    n_tiles = self.ragged_tiles.count(cu_seqlens_q, batch, self.bm, heads_q, 0, tidx)
                    r = first_tile
                    while r < n_tiles:
                        bidx, head, m_block, q_start, s_q, kv_start, s_kv = self.unpaged_ragged_tile(
                            r, tidx, *ragged_args)
                        self.publish_tile(bars, handoff, (1, head, m_block, q_start, s_q, s_kv))
                        handoff = handoff + 1
                        n_min, n_max, _, _ = kv_block_range(m_block, s_q, s_kv, self.bm, self.bn, self.causal,
                                                            self.window, window_left)
                        with cute.arch.elect_one():
                            self.producer_tile(tma_q, tma_k, tma_v, storage, q_start, kv_start, head, head // group,
                                               bidx, m_block, n_max, n_max - n_min, g0, q_count)
                        g0 = g0 + (n_max - n_min)
                        q_count = q_count + 1
                        r = self.draw_next(tile_counter, n_tiles, n_ctas, tidx)
                    self.publish_tile(bars, handoff, (0,))  # no tile left
            elif warp_idx == 0:
                with cute.arch.elect_one():
                    g0 = Int32(0)       # ring position of the next kv block
                    q_count = Int32(0)  # Q tiles loaded so far
                    static_rounds, drawn = rounds, Int32(0)
                    if cutlass.const_expr(self.draws_tiles):
                        static_rounds, drawn = self.scheduler.drawn_plan(m_blocks, n_bh, n_ctas, rounds, pairs)
                    tail = None
                    if cutlass.const_expr(self.tail_splits):
                        tail = (m_blocks, n_bh, n_ctas, first_tile, seqlen_kv, kv_splits_max)
                        static_rounds, _, _, _, _ = self.tail_plan(tail)
                    for i in cutlass.range(static_rounds, unroll=1):
                        valid, m_block, head, bidx = self.scheduler.work_item(i, first_tile, n_ctas, m_blocks, heads_q,
                                                                              batch, pairs)
                        q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q,
                                                                  cu_seqlens_kv, False)
                        if valid != 0 and m_block * self.bm < s_q:
                            n_min, n_max, _, _ = kv_block_range(m_block, s_q, s_kv, self.bm, self.bn, self.causal,
                                                                self.window, window_left)
                            self.producer_tile(tma_q, tma_k, tma_v, storage, q_start, kv_start, head, head // group,
                                               bidx, m_block, n_max, n_max - n_min, g0, q_count)
                            g0 = g0 + (n_max - n_min)
                            q_count = q_count + 1
                    if cutlass.const_expr(self.tail_splits):
                        for j in cutlass.range(self.tail_pieces(tail), unroll=1):
                            m_block, head, bidx, lo, hi, _ = self.tail_tile(j, tail, heads_q)
                            self.producer_tile(tma_q, tma_k, tma_v, storage, 0, 0, head, head // group, bidx, m_block,
                                               hi, hi - lo, g0, q_count)
                            g0 = g0 + (hi - lo)
                            q_count = q_count + 1
                    if cutlass.const_expr(self.draws_tiles):
                        self.producer_drawn(tma_q, tma_k, tma_v, storage, tile_counter, first_tile, n_ctas, m_blocks,
                                            n_bh, seqlen_q, seqlen_kv, heads_q, group, window_left, pairs, static_rounds,
                                            drawn, g0, q_count)
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            wg_index = wg - 1
            wg_tid = tidx % _WG
            mt = self.mma_dtype  # the queries' dtype; fp16 over an fp8 cache
            mma_qk = sm90_utils.make_trivial_tiled_mma(
                mt, mt, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
                atom_layout_mnk=(1, 1, 1), tiler_mn=(self.n_wg_rows, self.bn))
            mma_pv = sm90_utils.make_trivial_tiled_mma(
                mt, mt, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(1, 1, 1), tiler_mn=(self.n_wg_rows, self.D), a_source=warpgroup.OperandSource.RMEM)
            # the swizzle goes into the pointer (wgmma wants affine layouts)
            lq = smem_layout(mt, self.n_wg_rows, self.D, self.n_wg)  # (64, D, warpgroup)
            lkv = smem_layout(mt, self.bn, self.D, self.stages, chunks_inner=self.grouped_kv)   # (bn, D, stage)
            sQ = storage.sQ.get_tensor(lq.outer, swizzle=lq.inner, dtype=mt)
            sK = storage.sK.get_tensor(lkv.outer, swizzle=lkv.inner, dtype=mt)
            sV = storage.sV.get_tensor(lkv.outer, swizzle=lkv.inner, dtype=mt)
            # V^T (D, bn, stage): the same bytes read MN-major
            sVt = cute.make_tensor(sV.iterator, cute.select(sV.layout, mode=[1, 0, 2]))
            thr_qk = mma_qk.get_slice(wg_tid)
            thr_pv = mma_pv.get_slice(wg_tid)
            ctx = SimpleNamespace()
            ctx.bars = bars
            ctx.lane = tidx % 32
            ctx.wg_tid = wg_tid
            ctx.wg_index = wg_index
            ctx.wg_next = (wg_index + 1) % self.n_wg
            ctx.mma_qk = mma_qk
            ctx.mma_pv = mma_pv
            ctx.thr_qk = thr_qk
            sQ_wg = sQ[None, None, wg_index]
            ctx.sO_wg = storage.sQ.get_tensor(lq.outer, swizzle=lq.inner)[None, None, wg_index]  # O in the output dtype
            if cutlass.const_expr(self.sep_o):
                ctx.sO_wg = storage.sO.get_tensor(lq.outer, swizzle=lq.inner)[None, None, wg_index]
            ctx.tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ_wg))
            ctx.tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))
            ctx.tOrVt = thr_pv.make_fragment_B(thr_pv.partition_B(sVt))
            ctx.acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((self.n_wg_rows, self.D)), Float32)
            cS = cute.make_identity_tensor((self.n_wg_rows, self.bn))
            # this thread's accumulator coordinates: thread 0's (compile time) + (row, col) offset
            tScS = thr_qk.partition_C(cS)
            ctx.cS_mn = acc_mn_view(mma_qk.get_slice(0).partition_C(cS))
            ctx.col0 = tScS[0][1]  # this thread's first column in a kv tile
            n_rows = cute.size(ctx.cS_mn, mode=[0])
            ctx.row_max = cute.make_rmem_tensor((n_rows,), Float32)
            ctx.row_sum = cute.make_rmem_tensor((n_rows,), Float32)
            ctx.alpha = cute.make_rmem_tensor((n_rows,), Float32)
            # P (fp16/bf16) in the A-operand layout of the PV GEMM, carried across iterations
            ctx.rP = cute.make_rmem_tensor(thr_qk.partition_shape_C((self.n_wg_rows, self.bn)), mt)
            ctx.tOrP = cute.make_tensor(ctx.rP.iterator, acc_to_a_operand(ctx.rP.layout))
            if cutlass.const_expr(self.sum_by_mma):
                ctx.mma_sum = sm90_utils.make_trivial_tiled_mma(
                    mt, mt, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K, Float32,
                    atom_layout_mnk=(1, 1, 1), tiler_mn=(self.n_wg_rows, self.ONES_N),
                    a_source=warpgroup.OperandSource.RMEM)
                ones = cute.recast_ptr(bars + self.ONES_BYTE // 8, dtype=mt)
                if wg_index == 0:
                    ones[wg_tid] = mt(1.0)
                cute.arch.fence_view_async_shared()
                cute.arch.barrier(barrier_id=self.ZERO_BAR, number_of_threads=self.n_wg * _WG)
                # (ONES_N, block_n) K-major without swizzle: core matrices of 8 x 8 at 64 elements along k, the
                # same two for every k slice of 16
                sOnes = cute.make_tensor(ones, cute.make_layout(((self.ONES_N, 1), (8, (2, self.bn // 16))),
                                                                stride=((8, 0), (1, (64, 0)))))
                thr_sum = ctx.mma_sum.get_slice(wg_tid)
                ctx.tLrOnes = thr_sum.make_fragment_B(thr_sum.partition_B(sOnes))
                ctx.acc_L = cute.make_rmem_tensor(thr_sum.partition_shape_C((self.n_wg_rows, self.ONES_N)), Float32)
            score = ScoreScale(softmax_scale, softcap, self.softcap)
            ctx.scale_log2 = score.scale_log2
            ctx.cap_in = score.cap_in
            if cutlass.const_expr(self.capped):
                ctx.fixed_offset = score.fixed_offset
                ctx.capped_row_max = score.capped_row_max
            ctx.window_left = window_left
            ctx.sinks = sinks
            ctx.write_lse = write_lse
            ctx.lse = lse
            ctx.split_partials = split_partials
            ctx.split_counters = split_counters
            ctx.o_ss = o_stride_s
            ctx.lse_ss = lse_stride_s
            ctx.o_sb, ctx.o_sh = o_stride_b, o_stride_h
            ctx.lse_sb, ctx.lse_sh = lse_stride_b, lse_stride_h
            ctx.local0 = tScS[0][0]  # this thread's first row in its warpgroup's slab
            ctx.sV_ptr = storage.sV.data_ptr()
            ctx.sQ_ptr = storage.sQ.data_ptr()
            ctx.softmax_scale = softmax_scale
            ctx.softcap_value = softcap

            if cutlass.const_expr(self.pingpong):
                if wg_index == 0:  # the first consumer warpgroup issues first
                    cute.arch.barrier_arrive(barrier_id=self.SCHED, number_of_threads=2 * _WG)
            g0 = Int32(0)
            q_count = Int32(0)
            if cutlass.const_expr(self.paged):
                ctx.o_off = Int64(0)
                ctx.group = group
                ctx.slab_tokens = slab_tokens
                valid, kv_head, m_block, q_start, s_q, s_kv, _, word = self.take_tile(bars, 0, 8)
                handoff = Int32(1)
                while valid != 0:
                    kv_range = self.paged_kv_range(m_block, s_q, s_kv, slab_tokens, window_left)
                    if cutlass.const_expr(self.kv_splits):
                        kv_range = self.item_kv_range(kv_range, word)
                    tile = SimpleNamespace(**vars(ctx))
                    tile.m_block = m_block
                    tile.s_q = s_q
                    tile.s_kv = s_kv
                    tile.q_start = q_start
                    tile.kv_head = kv_head
                    tile.tok0 = (m_block * self.n_wg + wg_index) * slab_tokens  # the slab's first query token
                    if cutlass.const_expr(self.fp8):  # the KV head's scales (descale_stride_h 0: one for all)
                        tile.k_scale = k_descale[kv_head * descale_stride_h]
                        tile.v_scale = v_descale[kv_head * descale_stride_h]
                    # each row's exclusive key limit (and, windowed, its first key), from its query token
                    row_lim = cute.make_rmem_tensor((n_rows,), Int32)
                    row_lo = cute.make_rmem_tensor((n_rows,), Int32)
                    for k in cutlass.range_constexpr(n_rows):
                        row_lim[k] = s_kv
                        tok, _ = self.packed_token(tile, ctx.local0 + ctx.cS_mn[k, 0][0])
                        if cutlass.const_expr(self.causal):
                            row_lim[k] = cutlass.min(s_kv, tok + 1 + s_kv - s_q)
                        row_lo[k] = tok + s_kv - s_q - window_left
                    tile.row_lim = row_lim
                    tile.row_lo = row_lo
                    self.attend_tile(tile, o, wg_index, kv_range, g0, q_count)
                    n_min, n_max, _, _ = kv_range
                    g0 = g0 + (n_max - n_min)
                    q_count = q_count + 1
                    valid, kv_head, m_block, q_start, s_q, s_kv, _, word = self.take_tile(bars, handoff, 8)
                    handoff = handoff + 1
            elif cutlass.const_expr(self.ragged):
                handoff = Int32(0)
                valid = Int32(1)
                while valid != 0:
                    valid, head, m_block, q_start, s_q, s_kv = self.take_tile(bars, handoff, 6)
                    handoff = handoff + 1
                    if valid != 0:
                        # (bidx 0: a ragged tile's offsets come from q_start)
                        g0, q_count = self.consumer_tile(ctx, o, wg_index, m_block, head, 0, q_start, s_q, s_kv, g0,
                                                         q_count)
            else:
                static_rounds, drawn = rounds, Int32(0)
                if cutlass.const_expr(self.draws_tiles):
                    static_rounds, drawn = self.scheduler.drawn_plan(m_blocks, n_bh, n_ctas, rounds, pairs)
                tail = None
                if cutlass.const_expr(self.tail_splits):
                    tail = (m_blocks, n_bh, n_ctas, first_tile, seqlen_kv, kv_splits_max)
                    static_rounds, _, _, _, _ = self.tail_plan(tail)
                for i in cutlass.range(static_rounds, unroll=1):
                    valid, m_block, head, bidx = self.scheduler.work_item(i, first_tile, n_ctas, m_blocks, heads_q,
                                                                          batch, pairs)
                    q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q, cu_seqlens_kv,
                                                              False)
                    if valid != 0 and m_block * self.bm < s_q:
                        g0, q_count = self.consumer_tile(ctx, o, wg_index, m_block, head, bidx, q_start, s_q, s_kv,
                                                         g0, q_count)
                if cutlass.const_expr(self.tail_splits):
                    for j in cutlass.range(self.tail_pieces(tail), unroll=1):
                        m_block, head, bidx, lo, hi, word = self.tail_tile(j, tail, heads_q)
                        g0, q_count = self.consumer_tile(ctx, o, wg_index, m_block, head, bidx, 0, seqlen_q, seqlen_kv,
                                                         g0, q_count, (lo, hi, word))
                if cutlass.const_expr(self.draws_tiles):
                    # the drawn tiles: the CTA's own first, each next one the producer's draw (tile_full)
                    slot = cute.make_tensor(bars + self.TILE_SLOT, cute.make_layout(1))
                    r = first_tile
                    handoff = Int32(0)
                    while r < drawn:
                        m_block, bh = self.scheduler.drawn_tile(r, m_blocks, n_bh, n_ctas, pairs, static_rounds, drawn)
                        head = bh % heads_q
                        bidx = bh // heads_q
                        q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q,
                                                                  cu_seqlens_kv, False)
                        g0, q_count = self.consumer_tile(ctx, o, wg_index, m_block, head, bidx, q_start, s_q, s_kv,
                                                         g0, q_count)
                        # lane 0 takes the drawn tile for its warp (the slot's one reader there, so its arrive
                        # orders its own read before the producer's next write) and hands it on
                        cute.arch.mbarrier_wait(bars + self.tile_full(), handoff & 1)
                        taken = Int32(0)
                        if ctx.lane == 0:
                            taken = Int32(slot[0])
                            cute.arch.mbarrier_arrive(bars + self.tile_empty())
                        r = cute.arch.make_warp_uniform(cute.arch.shuffle_sync(taken, 0))
                        handoff = handoff + 1

    # The split tail (tail_splits): the CTA's whole rounds run as every dense launch's static rounds do, then its tail
    # pieces in a loop of their own, a second copy of the kv loop. Carried through one loop with the rounds, the
    # plan's values moved ptxas's schedule of the kv loop (25 more instructions an iteration), and recomputed there
    # from the launch's values they still put D128-176's PV wait before every exp2 (0 of 90 before it, from 24:
    # benchmarks/probes/sass_loops.py). tail: the launch's values the plan derives from (m_blocks, n_bh, n_ctas, the
    # CTA, seqlen_kv, kv_splits_max).
    @cute.jit
    def tail_plan(self, tail):
        """(static rounds, u0, u1, work items, kv blocks a tile) of the CTA (PersistentTiles.tail_plan)."""
        m_blocks, n_bh, n_ctas, cta, seqlen_kv, kv_splits_max = tail
        kv_blocks = (seqlen_kv + (self.bn - 1)) // self.bn
        static_rounds, u0, u1, items = self.scheduler.tail_plan(m_blocks, n_bh, n_ctas, cta, kv_blocks, kv_splits_max,
                                                                TAIL_SPLIT_MIN_BLOCKS)
        return static_rounds, u0, u1, items, kv_blocks

    @cute.jit
    def tail_pieces(self, tail):
        """The CTA's split-tail pieces (0 where the launch does not split)."""
        static_rounds, _, _, items, _ = self.tail_plan(tail)
        return items - static_rounds

    @cute.jit
    def tail_tile(self, j, tail, heads_q):
        """(m_block, head, bidx, lo, hi, split word) of the CTA's split-tail piece j: its kv blocks [lo, hi)."""
        m_blocks, _, n_ctas, cta, _, _ = tail
        static_rounds, u0, u1, _, kv_blocks = self.tail_plan(tail)
        t, lo, hi, word = self.scheduler.tail_piece(j, u0, u1, kv_blocks, cta, static_rounds, n_ctas)
        bh = t // m_blocks
        return t % m_blocks, bh % heads_q, bh // heads_q, lo, hi, word

    @cute.jit
    def consumer_tile(self, ctx, o, wg_index, m_block, head, bidx, q_start, s_q, s_kv, g0, q_count, piece=None):
        """A consumer warpgroup's part of one dense or ragged (unpaged) tile (piece: a split tail's item, its kv
        blocks [lo, hi) and split word); the ring position and Q count after it."""
        kv_range = kv_block_range(m_block, s_q, s_kv, self.bm, self.bn, self.causal, self.window, ctx.window_left)
        # this tile's values on a copy of ctx (ctx itself keeps one structure across the loop)
        tile = SimpleNamespace(**vars(ctx))
        if cutlass.const_expr(piece is not None):
            lo, hi, word = piece
            kv_range = self.clamp_kv_range(kv_range, lo, hi)
            tile.split_word = word
        tile.m_block = m_block
        tile.s_q = s_q
        tile.s_kv = s_kv
        tile.head = head
        tile.row0 = m_block * self.bm + wg_index * self.n_wg_rows + ctx.local0  # this thread's first row
        if cutlass.const_expr(self.ragged):
            tile.o_off = Int64(q_start) * ctx.o_ss + Int64(head) * ctx.o_sh
            tile.lse_off = Int64(head) * ctx.lse_sh + Int64(q_start) * ctx.lse_ss
        else:
            tile.o_off = Int64(bidx) * ctx.o_sb + Int64(head) * ctx.o_sh
            tile.lse_off = Int64(bidx) * ctx.lse_sb + Int64(head) * ctx.lse_sh
        self.attend_tile(tile, o, wg_index, kv_range, g0, q_count)
        n_min, n_max, _, _ = kv_range
        return g0 + (n_max - n_min), q_count + 1

    @cute.jit
    def producer_drawn(self, tma_q, tma_k, tma_v, storage, tile_counter, first_tile, n_ctas, m_blocks, n_bh, seqlen_q,
                       seqlen_kv, heads_q, group, window_left, pairs, static_rounds, drawn, g0, q_count):
        """The elected producer thread's drawn tiles (PersistentTiles.drawn_plan): it draws the CTA's next tile
        as this one's loads start (the atomic's latency hides behind them), issues the loads, then publishes
        the drawn tile to the consumers once they took the previous one."""
        bars = storage.bars.data_ptr()
        slot = cute.make_tensor(bars + self.TILE_SLOT, cute.make_layout(1))
        r = first_tile
        handoff = Int32(0)
        while r < drawn:
            taken = draw_tile(tile_counter)
            m_block, bh = self.scheduler.drawn_tile(r, m_blocks, n_bh, n_ctas, pairs, static_rounds, drawn)
            head = bh % heads_q
            bidx = bh // heads_q
            q_start, s_q, kv_start, s_kv = seq_bounds(bidx, seqlen_q, seqlen_kv, None, None, False)
            n_min, n_max, _, _ = kv_block_range(m_block, s_q, s_kv, self.bm, self.bn, self.causal, self.window,
                                                window_left)
            self.producer_tile(tma_q, tma_k, tma_v, storage, q_start, kv_start, head, head // group, bidx, m_block,
                               n_max, n_max - n_min, g0, q_count)
            g0 = g0 + (n_max - n_min)
            q_count = q_count + 1
            settle_draw(tile_counter, taken, drawn - 1)
            r = taken + n_ctas
            cute.arch.mbarrier_wait(bars + self.tile_empty(), (handoff & 1) ^ 1)  # a fresh barrier passes parity 1
            slot[0] = Int64(r)
            cute.arch.mbarrier_arrive(bars + self.tile_full())
            handoff = handoff + 1

    @cute.jit
    def __call__(
        self,
        tma_q: cute.Pointer, tma_k: cute.Pointer, tma_v: cute.Pointer,
        o: cute.Pointer, lse: cute.Pointer, cu_seqlens_q: cute.Pointer, cu_seqlens_kv: cute.Pointer,
        page_table: cute.Pointer, seqlens_kv: cute.Pointer,
        batch: Int32, seqlen_q: Int32, seqlen_kv: Int32,
        heads_q: Int32, heads_kv: Int32, write_lse: Int32, max_pages: Int32, min_seqlen_q: Int32,
        softmax_scale: Float32,
        o_stride_b: Int64, o_stride_s: Int64, o_stride_h: Int64,
        lse_stride_b: Int64, lse_stride_h: Int64, lse_stride_s: Int64,
        pt_stride_b: Int64, pt_stride_p: Int64,
        sinks: cute.Pointer, window_left: Int32, softcap: Float32,
        k_descale: cute.Pointer, v_descale: cute.Pointer, descale_stride_h: Int32, tile_counter: cute.Pointer,
        kv_groups_per_page: Int32, split_partials: cute.Pointer, split_counters: cute.Pointer, kv_splits_max: Int32,
    ):
        # The real launch (and the real descriptors) come from the aotc runtime; this host code
        # only makes the module well formed: descriptors of the right rank, box and swizzle.
        def desc(ptr, rows, rank, kv=False):
            fp8 = kv and self.fp8  # whole e4m3 rows (the staging rings; the runtime's descriptor swizzles them)
            elem_bytes = 1 if fp8 else self.elem_bytes
            dims = [self.D, seqlen_q, heads_q, batch][:rank]
            strides = [heads_q * self.D * elem_bytes // 16, self.D * elem_bytes // 16,
                       seqlen_q * heads_q * self.D * elem_bytes // 16][:rank - 1]
            return create_tensor_map_tiled(
                ptr.toint(), cutlass.Uint8 if fp8 else self.dtype, dims, strides,
                [self.D if fp8 else TMA_BOX_COLS, rows] + [1] * (rank - 2),
                swizzle=TensorMapSwizzle.none if fp8 else TensorMapSwizzle.s128b)

        def grouped_desc(ptr, groups, heads):  # grouped_kv: (64 columns, 8 rows, chunks, row groups, H_kv)
            row = heads * self.D * self.elem_bytes // 16
            return create_tensor_map_tiled(
                ptr.toint(), self.dtype, [TMA_BOX_COLS, 8, self.chunks, groups, heads],
                [row, TMA_BOX_COLS * self.elem_bytes // 16, 8 * row, self.D * self.elem_bytes // 16],
                [TMA_BOX_COLS, 8, self.chunks, self.kv_rows // 8, 1], swizzle=TensorMapSwizzle.s128b)

        q_rank = 3 if self.ragged else 4
        kv_rank = 4 if self.paged or not self.ragged else 3  # paged: (D, page, H_kv, pages)
        kv_rows = self.kv_rows if self.paged else self.bn
        tma_kv = ((grouped_desc(tma_k, seqlen_kv, heads_kv), grouped_desc(tma_v, seqlen_kv, heads_kv))
                  if self.grouped_kv else (desc(tma_k, kv_rows, kv_rank, True), desc(tma_v, kv_rows, kv_rank, True)))
        self.sdpa_prefill_sm90_kernel(
            desc(tma_q, Q_BOX_ROWS, q_rank), *tma_kv,
            o, lse, cu_seqlens_q, cu_seqlens_kv, page_table, seqlens_kv,
            batch, seqlen_q, seqlen_kv, heads_q, heads_kv, write_lse, max_pages, min_seqlen_q, softmax_scale,
            o_stride_b, o_stride_s, o_stride_h, lse_stride_b, lse_stride_h, lse_stride_s, pt_stride_b, pt_stride_p,
            sinks, window_left, softcap, k_descale, v_descale, descale_stride_h, tile_counter, kv_groups_per_page,
            split_partials, split_counters, kv_splits_max,
        ).launch(
            grid=[132, 1, 1],
            block=[self.n_threads, 1, 1],
            smem=self.smem_size,
        )



# ---------------------------------------------------------------------------- compile

def compile(variant, *, dump_dir: str, keep_ptx: bool = False, tile: Tile | None = None) -> KernelBuild:
    """Compile one sdpa_prefill_sm90 variant (its (head_dim, block_n) tile, or `tile`). The entry's
    parameters are exactly aotc.families.sdpa_prefill_sm90.PARAMS; block (tile.threads, 1, 1), grid
    (min(tiles, SMs), 1, 1) with tiles = ceil(max_seqlen_q / block_m) * heads_q * batch (the kernel is
    persistent), the recorded dynamic shared memory."""
    return compile_kernel(SdpaPrefillSm90(variant, tile), variant.arch, dump_dir, keep_ptx=keep_ptx)
