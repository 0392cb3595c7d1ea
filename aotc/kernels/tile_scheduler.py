"""Device halves of the kernels' tile schedulers: which work item a CTA takes (CuTe DSL, imported only to
compile). Their host halves, the grids, are in aotc.families.schedulers (the runtime imports those).
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


class PersistentTiles:
    """Host half: aotc.families.schedulers.persistent_grid. A persistent grid of at most one CTA per SM
    walks m_blocks query tiles of each (batch, head), CTA c taking work item i of `rounds`:

    * non-causal (tiles cost the same): tile i * n_ctas + c in snake order (c reversed in odd rounds),
      m_block fastest, so the CTAs of one head share its K/V in L2;
    * causal with pairs (every pair costs the same): items 2k and 2k+1 are the tiles m_blocks-1-j and j
      of one head, pair k * n_ctas + c, j fastest: balanced, and the CTAs running at once cover few
      heads, whose K/V stay in L2; the middle tiles of an odd m_blocks (no partner, half a pair's cost)
      come after every full pair, so they fill in instead of landing on the same CTAs every round;
    * causal without pairs: the longest tiles first, in snake order, which balances to the end.

    Pairs are taken whenever they fill the grid (pairs_when_they_fill, D128 and D256), or else when a
    round would hold fewer than min_tiles_per_head tiles of each head: longest-first over many heads
    streams nearly every head's K/V at once (ncu at S 2048: DRAM 77% busy), and grouping heads instead
    unbalanced the CTAs (SMs idle 23% of the time); with fewer pairs than CTAs the snake's one tile per
    CTA is the shorter critical path (benchmarks/results/prefill_experiment_causal_pairs_threshold.json,
    prefill_experiment_causal_middle_tiles.json).
    """

    def __init__(self, causal: bool, pairs_when_they_fill: bool, min_tiles_per_head: int = 2):
        self.causal = causal
        self.pairs_when_they_fill = pairs_when_they_fill
        self.min_tiles_per_head = min_tiles_per_head

    @cute.jit
    def rounds_and_pairs(self, m_blocks, n_bh, n_ctas):
        """(work items per CTA, pairs != 0 when causal tiles go in pairs)."""
        rounds = (m_blocks * n_bh + (n_ctas - 1)) // n_ctas
        pairs = Int32(0)
        if cutlass.const_expr(self.causal):
            n_pairs = (m_blocks + 1) // 2 * n_bh
            take_pairs = n_bh * self.min_tiles_per_head > n_ctas
            if cutlass.const_expr(self.pairs_when_they_fill):
                take_pairs = n_pairs >= n_ctas
            if take_pairs:
                pairs = Int32(1)
                rounds = 2 * ((n_pairs + (n_ctas - 1)) // n_ctas)
        return rounds, pairs

    @cute.jit
    def snake(self, i, cta, n_ctas):
        """The tile CTA `cta` takes in round i (may be past the last tile: the caller skips it)."""
        pos = cta
        if i % 2 == 1:
            pos = n_ctas - 1 - cta
        return i * n_ctas + pos

    @cute.jit
    def work_item(self, i, cta, n_ctas, m_blocks, heads_q, batch, pairs):
        """(valid, m_block, head, batch index) of CTA `cta`'s i-th work item."""
        n_bh = heads_q * batch
        valid = Int32(0)
        m_block = Int32(0)
        bh = Int32(0)
        if cutlass.const_expr(self.causal):
            if pairs != 0:
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
                tile = self.snake(i, cta, n_ctas)
                m_block = m_blocks - 1 - tile // n_bh
                bh = tile % n_bh
                if tile < m_blocks * n_bh:
                    valid = Int32(1)
        else:
            tile = self.snake(i, cta, n_ctas)
            m_block = tile % m_blocks
            bh = tile // m_blocks
            if tile < m_blocks * n_bh:
                valid = Int32(1)
        return valid, m_block, bh % heads_q, bh // heads_q
