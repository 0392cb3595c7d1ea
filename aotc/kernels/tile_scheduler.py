"""Device halves of the kernels' tile schedulers: which work item a CTA takes (CuTe DSL, imported only to
compile). Their host halves, the grids, are in aotc.families.schedulers (the runtime imports those).
"""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def snake_order(i, cta, n_ctas):
    """Item i * n_ctas + cta of a persistent grid's round i, the CTAs reversed in odd rounds (so the CTA
    that took a round's last item takes the next round's first): the work of unequal items evens out."""
    pos = cta
    if i % 2 == 1:
        pos = n_ctas - 1 - cta
    return i * n_ctas + pos


@cute.jit
def draw_tile(counter):
    """A CTA's draw of its next tile from the runtime's per-stream counter (aotc.runtime.counters), one thread:
    the counter's value before the increment (then settle_draw())."""
    return cute.arch.atomic_add(counter, Int32(1), sem="relaxed", scope="gpu")


@cute.jit
def settle_draw(counter, taken, last):
    """After the draw that returned `taken`: the launch's last draw (every draw of the launch has happened once
    one returns `last`) puts the counter back to 0 for the next launch."""
    value = cute.make_tensor(counter, cute.make_layout(1))
    if taken == last:
        value[0] = Int32(0)


class PersistentTiles:
    """Host half: aotc.families.schedulers.persistent_grid. A persistent grid of at most one CTA per SM
    walks m_blocks query tiles of each (batch, head), CTA c taking work item i of `rounds`:

    * non-causal (tiles cost the same): tile i * n_ctas + c in snake order (c reversed in odd rounds),
      m_block fastest, so the CTAs of one head share its K/V in L2;
    * causal with pairs (every pair costs the same): items 2k and 2k+1 are the tiles m_blocks-1-j and j
      of one head, pair k * n_ctas + c, j fastest: balanced, and the CTAs running at once cover few
      heads, whose K/V stay in L2; the middle tiles of an odd m_blocks (no partner, half a pair's cost)
      come after every full pair, so they fill in instead of landing on the same CTAs every round;
    * causal without pairs: the longest tiles first, in snake order, which balances to the end;
    * causal with pairs and a tile counter (dense launches): the last rounds' tiles drawn (drawn_plan);
    * non-causal with a split tail (dense launches given a workspace): the last n_ctas + tiles % n_ctas tiles'
      kv blocks cut into one equal range a CTA (tail_plan, tail_piece; aotc.families.sdpa_prefill_sm90's
      TAIL_SPLIT_MIN_BLOCKS says when and why).

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
    def drawn_plan(self, m_blocks, n_bh, n_ctas, rounds, pairs):
        """Causal, tiles drawn in the tail (rounds, pairs: rounds_and_pairs()'s): (static rounds, drawn
        tiles). The pairs run in static rounds while at least one more round of them is left behind (they
        balance and keep the CTAs' K/V in L2); the 1-2 rounds' worth left are single tiles drawn longest
        first (a drawn tile's index: first the CTA's own, then the value of the runtime's per-stream counter
        (aotc.runtime.counters) + n_ctas), so the launch ends on the shortest tiles. The pairs alone left the
        SMs idle 4-5% of a D128 or D256 launch, most of it in their last round (ncu: 95.5% active at D128
        S 16384, 98.6% with the drawn tail, 98.8% when the pairs fill every round;
        benchmarks/results/prefill_drawn_tail.json). Every tile drawn, longest first (FA3's order), measured
        -2.8% to +1.2% cycles against the pairs at S 16384 and 2048: the SMs busier, their tensor pipe 2
        points less. Where the pairs fill every round the draws cost: D128 S 16384 with 33 heads (2112 pairs,
        16 rounds) took 1.5% more cycles. Only D128 and D256 kernels draw (the family's DRAWN_TAIL_HEAD_DIMS;
        D64's measured 2.2-2.6% more cycles drawing). A launch draws exactly `drawn tiles` times (every CTA
        with a drawn tile draws until it gets none): the draw that returns drawn - 1 is its last and puts the
        counter back to 0."""
        static_rounds = rounds
        drawn = Int32(0)
        if pairs != 0:
            n_pairs = (m_blocks + 1) // 2 * n_bh
            k = cutlass.max(n_pairs // n_ctas - 1, Int32(0))
            static_rounds = 2 * k
            full_left = cutlass.max(m_blocks // 2 * n_bh - k * n_ctas, Int32(0))  # pairs of two tiles
            drawn = full_left + (n_pairs - k * n_ctas)  # their tiles, and the middle tiles left
        return static_rounds, drawn

    @cute.jit
    def drawn_tile(self, r, m_blocks, n_bh, n_ctas, pairs, static_rounds, drawn):
        """(m_block, bh) of drawn tile r < drawn (there are drawn tiles only with pairs), longest first: of the
        pairs left (head h0's from its pair j0 on, then every pair of each head after it) the long tiles by
        pair index j, the middle tiles, then the short tiles by j downward."""
        m_block = Int32(0)
        bh = Int32(0)
        if pairs != 0:
            half = cutlass.max(m_blocks // 2, 1)
            p0 = static_rounds // 2 * n_ctas  # the first pair left
            full_left = cutlass.max(m_blocks // 2 * n_bh - p0, Int32(0))
            n_middle = drawn - 2 * full_left
            h0 = p0 // half
            j0 = p0 - h0 * half
            n_whole = n_bh - 1 - h0  # heads with all their pairs left
            # the long tiles' order, L < full_left: j ascending, the heads that have pair j left inside
            short = r >= full_left + n_middle
            L = full_left - 1 - (r - full_left - n_middle) if short else r
            j = L // cutlass.max(n_whole, 1)
            h = h0 + 1 + (L - j * n_whole)
            if L >= j0 * n_whole:
                L2 = L - j0 * n_whole
                j = j0 + L2 // cutlass.max(n_whole + 1, 1)  # (0 only when no pair is left: r is a middle tile)
                h = h0 + L2 % cutlass.max(n_whole + 1, 1)
            bh = h
            m_block = j if short else m_blocks - 1 - j
            if r >= full_left and not short:  # a middle tile
                bh = cutlass.max(p0, m_blocks // 2 * n_bh) + (r - full_left) - m_blocks // 2 * n_bh
                m_block = m_blocks // 2
        return m_block, bh

    @cute.jit
    def tail_plan(self, m_blocks, n_bh, n_ctas, cta, kv_blocks, may_split, min_blocks: cutlass.Constexpr):
        """Non-causal, a split tail allowed (may_split != 0: the runtime gave a workspace): (static rounds, u0, u1,
        work items) of CTA `cta`, the split tail's kv blocks [u0, u1) of its tiles laid end to end
        (aotc.families.sdpa_prefill_sm90.tail_split_pieces is the same plan in plain Python). Without a split the
        static rounds are every round and [u0, u1) is empty. u0 and u1 are 32-bit: the tail's blocks, at most
        (2 n_ctas - 1) * kv_blocks, stay below 2^31 up to 8.1M kv blocks a tile (S_kv of 650M keys at D256, whose K
        alone would be 334 GB)."""
        tiles = m_blocks * n_bh
        static_rounds = (tiles + (n_ctas - 1)) // n_ctas
        full = tiles // n_ctas
        u0 = Int32(0)
        u1 = Int32(0)
        items = static_rounds
        if may_split != 0 and full >= 1 and tiles - full * n_ctas > 0 and kv_blocks >= min_blocks:
            static_rounds = full - 1
            units = cutlass.Int64(tiles - static_rounds * n_ctas) * cutlass.Int64(kv_blocks)
            u0 = Int32(cutlass.Int64(cta) * units // cutlass.Int64(n_ctas))
            u1 = Int32(cutlass.Int64(cta + 1) * units // cutlass.Int64(n_ctas))
            items = static_rounds + (u1 - 1) // kv_blocks - u0 // kv_blocks + 1
        return static_rounds, u0, u1, items

    @cute.jit
    def tail_piece(self, j, u0, u1, kv_blocks, cta, static_rounds, n_ctas):
        """(tile, lo, hi, word) of the CTA's split-tail piece j: the tile's kv blocks [lo, hi) and its split word
        (split | splits << 8 | boundary << 16: split 1 of 2 when it starts inside the tile, at the boundary with the
        CTA before; split 0 of 2 when it ends inside, at the boundary with the CTA after; else 1 split)."""
        t = u0 // kv_blocks + j
        lo = cutlass.max(u0 - t * kv_blocks, Int32(0))
        hi = cutlass.min(u1 - t * kv_blocks, kv_blocks)
        word = Int32(1 << 8)
        if lo > 0:
            word = 1 + (2 << 8) + ((cta - 1) << 16)
        elif hi < kv_blocks:
            word = (2 << 8) + (cta << 16)
        return static_rounds * n_ctas + t, lo, hi, word

    @cute.jit
    def snake(self, i, cta, n_ctas):
        """The tile CTA `cta` takes in round i (may be past the last tile: the caller skips it)."""
        return snake_order(i, cta, n_ctas)

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


@cute.jit
def _warp_sum(x):
    for k in cutlass.range_constexpr(5):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << k, mask=-1, mask_and_clamp=31)
    return x


@cute.jit
def _warp_inclusive_scan(x, lane):
    for k in cutlass.range_constexpr(5):
        up = cute.arch.shuffle_sync_up(x, offset=1 << k, mask=-1)
        x = x + (up if lane >= (1 << k) else Int32(0))
    return x


@cute.jit
def _from_hit(seq, first):
    """(seq, first) of the one lane whose seq is not -1 (RaggedTiles.locate), warp-uniform; (-1, 0) if none."""
    hit = cute.arch.vote_ballot_sync(seq >= 0)
    src = cute.arch.popc((hit & (Int32(0) - hit)) - 1)  # the lowest set bit's lane
    seq = cute.arch.make_warp_uniform(cute.arch.shuffle_sync(seq, src))
    first = cute.arch.make_warp_uniform(cute.arch.shuffle_sync(first, src))
    if hit == 0:
        seq = Int32(-1)
    return seq, first


SEQS_PER_LANE = 4            # KvChunks: sequences a lane holds per round
ROUND = 32 * SEQS_PER_LANE   # sequences per round
SORT_SCRATCH_WORDS = 3 * 32  # RaggedTiles.sorted: (sequence, keys, tiles) of up to 32 sequences


@cute.jit
def _load_round(dst, values, r0, batch, lane, shift: cutlass.Constexpr = 0):
    """dst[i] = values[b + shift] for this lane's sequences b = r0 + SEQS_PER_LANE * lane + i of a round (0 past
    the batch). The schedulers load a round whole before any arithmetic on it: a load behind a branch on a
    loaded value waits for that value, so a round would cost a DRAM round trip per sequence a lane holds."""
    for i in cutlass.range_constexpr(SEQS_PER_LANE):
        b = r0 + SEQS_PER_LANE * lane + i
        dst[i] = Int32(0)
        if b < batch:
            dst[i] = values[b + shift]


class KvChunks:
    """Host half: aotc.families.schedulers.decode_chunks. The work of a decode step, balanced over the GPU
    for any distribution of KV lengths, derived in the kernel from the device-side lengths (so a CUDA graph
    replayed with other lengths stays balanced and correct):

    * the batch holds W kv blocks (block_n keys each) in all; with T target chunks (the runtime's: one
      wave of CTAs per (KV head, row tile)), every chunk is C = max(min_chunk_blocks, ceil(W / T)) blocks;
    * sequence b of n_b blocks has floor(n_b / C) full chunks and, when C does not divide n_b (or n_b = 0,
      whose empty chunk writes O = 0, LSE = -inf), one partial chunk of the rest, unless the rest is under
      C / 4 blocks and the sequence has a full chunk: its last full chunk then takes them (absorbs(): a
      chunk of a few blocks costs a CTA's whole start and merge, and partial chunks run after the wave of
      full ones, so a B16 x 4k window step spent a tenth of its time on 1-block chunks);
    * chunk index y (blockIdx.y) enumerates every full chunk first, in sequence order, then every partial
      one: the largest pieces are dispatched first, so the tail of the launch holds the small ones.
    * windowed (sliding window, window_left w): a sequence's kv blocks are those from its first query's
      first key, kv_first() = max(0, S_kv - S_q - w) rounded down to a block: only they are counted and
      chunked, so the split balances the windowed work and no CTA walks keys no row sees.
    There are at most T + B chunks (sum of ceil(n_b / C) <= W / C + B <= T + B): the grid's y extent; the
    CTAs past the last chunk exit at once. Every warp computes the same answer from the lengths (no
    barrier): three passes over B int32 lengths, a warp reduction or scan each; a batch of at most ROUND
    sequences is read once. The chunk counts of a scan share an int32 (16 bits each): the runtime keeps
    target_chunks + batch below aotc.families.schedulers.MAX_DECODE_CHUNKS.
    """

    def __init__(self, block_n: int, min_chunk_blocks: int, page: int, ragged: bool = False, window: bool = False):
        self.block_n = block_n
        self.min_chunk_blocks = min_chunk_blocks
        self.page = page  # 0: dense KV
        # ragged queries: a sequence of 1 .. max_q queries (cu_seqlens_q) has chunks, any other none (another
        # kernel serves it); its lengths read as -1
        self.ragged = ragged
        self.window = window

    @cute.jit
    def kv_first(self, s_kv, s_q, window_left):
        """Windowed: the first key of a sequence's chunks, its first query's first key rounded down to a kv
        block (a multiple of block_n: a block never crosses a page); 0 without a window."""
        first = Int32(0)
        if cutlass.const_expr(self.window):
            p = s_kv - s_q  # the first query's position, compared before w is subtracted (no wrap-around)
            if p > window_left:
                first = (p - window_left) // self.block_n * self.block_n
        return first

    @cute.jit
    def kv_tokens(self, seqlens_kv, b, max_pages):
        """Keys of sequence b: seqlens_kv[b], at least 0; paged, cut at its page-table row's end (never
        read past the row)."""
        return self.kv_tokens_of(seqlens_kv[b], max_pages)

    @cute.jit
    def kv_tokens_of(self, seqlen_kv, max_pages):
        """kv_tokens() of a sequence whose seqlens_kv entry is seqlen_kv."""
        s = cutlass.max(seqlen_kv, Int32(0))
        if cutlass.const_expr(self.page > 0):
            if cutlass.Int64(s) > cutlass.Int64(max_pages) * self.page:
                s = cutlass.max(max_pages, Int32(0)) * self.page
        return s

    @cute.jit
    def absorbs(self, nb, fb, c):
        """Whether a sequence of nb kv blocks (fb full chunks of c) has its rest in its last full chunk."""
        rest = nb - fb * c
        return fb >= 1 and rest > 0 and 4 * rest < c

    @cute.jit
    def counted(self, n):
        """The keys load_round's n stands for: a ragged batch's -1 (no chunk) counts as 0."""
        if cutlass.const_expr(self.ragged):
            n = cutlass.max(n, Int32(0))
        return n

    @cute.jit
    def load_round(self, nt, seqlens_kv, r0, batch, max_pages, lane, cu_seqlens_q, max_q, window_left):
        """nt[i] = keys of sequence r0 + SEQS_PER_LANE * lane + i from kv_first() on (0 past the batch; ragged,
        -1 past the batch and for a sequence another kernel serves): a round of 32 * SEQS_PER_LANE sequences,
        consecutive ones in each lane, all loaded (_load_round) before any is looked at: a ragged sequence's
        length is read whether or not its query count has it served here."""
        raw = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)  # seqlens_kv[b]
        q_lo = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)  # ragged: cu_seqlens_q[b], cu_seqlens_q[b + 1]
        q_hi = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        _load_round(raw, seqlens_kv, r0, batch, lane)
        if cutlass.const_expr(self.ragged):
            _load_round(q_lo, cu_seqlens_q, r0, batch, lane)
            _load_round(q_hi, cu_seqlens_q, r0, batch, lane, 1)
        for i in cutlass.range_constexpr(SEQS_PER_LANE):
            b = r0 + SEQS_PER_LANE * lane + i
            n = self.kv_tokens_of(raw[i], max_pages)
            if cutlass.const_expr(self.ragged):
                s_q = q_hi[i] - q_lo[i]
                nt[i] = Int32(-1)
                if b < batch and s_q >= 1 and s_q <= max_q:
                    nt[i] = n - self.kv_first(n, s_q, window_left)
            else:
                nt[i] = Int32(0)
                if b < batch:
                    nt[i] = n - self.kv_first(n, max_q, window_left)

    @cute.jit
    def locate(self, seqlens_kv, batch, max_pages, target_chunks, chunk, lane, cu_seqlens_q=None, max_q=None,
               window_left=0):
        """(seq, s_kv, lo, hi, n_seq, first_full, n_full, partial_slot) of chunk `chunk`: its sequence
        (-1 past the last chunk) and that sequence's keys, the chunk's key range [lo, hi), the sequence's
        chunk count, and where its chunks are (full chunk j is chunk first_full + j; its partial chunk,
        if n_seq > n_full, is chunk partial_slot). lane: this thread's lane in its warp. Every value is
        the same over the warp, and marked so (the kernel's addresses derive from them). Windowed, [lo, hi)
        lies past the sequence's kv_first() and s_kv is still its whole length.

        The lengths are read in rounds of ROUND sequences held in registers; a batch of one round (B <=
        128) is read once for all three passes (their latency is paid at the start of every CTA)."""
        bn = self.block_n
        nt = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        w = Int32(0)
        for r0 in range(0, batch, ROUND):
            self.load_round(nt, seqlens_kv, r0, batch, max_pages, lane, cu_seqlens_q, max_q, window_left)
            for i in cutlass.range_constexpr(SEQS_PER_LANE):
                w = w + (self.counted(nt[i]) + (bn - 1)) // bn
        w = _warp_sum(w)
        c = cutlass.max(Int32(self.min_chunk_blocks), (w + (target_chunks - 1)) // target_chunks)
        f = Int32(0)
        for r0 in range(0, batch, ROUND):
            if batch > ROUND:  # else nt holds the one round already
                self.load_round(nt, seqlens_kv, r0, batch, max_pages, lane, cu_seqlens_q, max_q, window_left)
            for i in cutlass.range_constexpr(SEQS_PER_LANE):
                f = f + (self.counted(nt[i]) + (bn - 1)) // bn // c
        f_total = _warp_sum(f)

        seq = Int32(-1)
        s_kv = Int32(0)
        j = Int32(0)
        full = Int32(0)
        first_full = Int32(0)
        n_full = Int32(0)
        partial_slot = Int32(0)
        has_partial = Int32(0)
        base = Int32(0)  # full chunks (high 16 bits) and partial chunks (low 16) of the earlier rounds
        fbv = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        pbv = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        for r0 in range(0, batch, ROUND):
            if batch > ROUND:
                self.load_round(nt, seqlens_kv, r0, batch, max_pages, lane, cu_seqlens_q, max_q, window_left)
            mine = Int32(0)  # this lane's sequences' (full << 16) + partial chunk counts
            for i in cutlass.range_constexpr(SEQS_PER_LANE):
                if cutlass.const_expr(self.ragged):
                    nb = (self.counted(nt[i]) + (bn - 1)) // bn
                    fbv[i] = nb // c
                    pbv[i] = Int32(0)
                    if nt[i] >= 0:  # a sequence this kernel serves
                        if (nb - fbv[i] * c > 0 and not self.absorbs(nb, fbv[i], c)) or nb == 0:
                            pbv[i] = Int32(1)
                else:
                    nb = (nt[i] + (bn - 1)) // bn
                    fbv[i] = nb // c
                    pbv[i] = Int32(0)
                    if r0 + SEQS_PER_LANE * lane + i < batch:
                        if (nb - fbv[i] * c > 0 and not self.absorbs(nb, fbv[i], c)) or nb == 0:
                            pbv[i] = Int32(1)
                mine = mine + (fbv[i] << 16) + pbv[i]
            incl = _warp_inclusive_scan(mine, lane)
            ex = base + incl - mine
            ex_f = ex >> 16
            ex_p = ex & 0xFFFF
            for i in cutlass.range_constexpr(SEQS_PER_LANE):
                b = r0 + SEQS_PER_LANE * lane + i
                fb = fbv[i]
                pb = pbv[i]
                slot_p = f_total + ex_p
                if chunk >= ex_f and chunk < ex_f + fb:
                    seq = b
                    j = chunk - ex_f
                    full = Int32(1)
                if pb != 0 and chunk == slot_p:
                    seq = b
                    j = fb
                if seq == b:
                    s_kv = nt[i]
                    first_full = ex_f
                    n_full = fb
                    partial_slot = slot_p
                    has_partial = pb
                ex_f = ex_f + fb
                ex_p = ex_p + pb
            base = base + cute.arch.shuffle_sync(incl, 31)
        # one lane at most found the chunk: broadcast what it found (past the last chunk, no lane did)
        hit = cute.arch.vote_ballot_sync(seq >= 0)
        src = cute.arch.popc((hit & (Int32(0) - hit)) - 1)  # the lowest set bit's lane

        def bcast(x):
            return cute.arch.make_warp_uniform(cute.arch.shuffle_sync(x, src))

        seq = bcast(seq)
        s_kv = bcast(s_kv)
        j = bcast(j)
        full = bcast(full)
        first_full = bcast(first_full)
        n_full = bcast(n_full)
        partial_slot = bcast(partial_slot)
        has_partial = bcast(has_partial)
        c = cute.arch.make_warp_uniform(c)
        lo = j * c * bn
        hi = s_kv
        if hit == 0:
            seq = Int32(-1)
        elif full != 0:
            hi = cutlass.min(lo + c * bn, s_kv)
            if has_partial == 0 and j == n_full - 1:  # the last full chunk takes the rest (absorbs())
                hi = s_kv
        if cutlass.const_expr(self.window):
            if hit != 0:  # s_kv counted the keys from kv_first() on: shift the range past it
                s_all = self.kv_tokens(seqlens_kv, seq, max_pages)
                s_q = max_q
                if cutlass.const_expr(self.ragged):
                    s_q = cu_seqlens_q[seq + 1] - cu_seqlens_q[seq]
                first = cute.arch.make_warp_uniform(self.kv_first(s_all, s_q, window_left))
                lo = lo + first
                hi = hi + first
                s_kv = cute.arch.make_warp_uniform(s_all)
        return seq, s_kv, lo, hi, n_full + has_partial, first_full, n_full, partial_slot


# K/V bytes of the heads whose tiles of one sequence run interleaved (RaggedTiles.place), so the tiles running at once
# re-read K/V from L2 (FA3 sizes its head swizzle from L2 the same way). 8 MB against 32 MB: 1.013 against 0.994 of
# the static pairs' speed at a 2048-token chunk over 8192 keys (a head a section, against 6), the same elsewhere
# (benchmarks/results/paged_varlen_experiment_schedule.json)
L2_SECTION_BYTES = 8 << 20


class RaggedTiles:
    """The query tiles of a ragged batch, enumerated from the device-side query lengths (host half:
    aotc.families.schedulers.ragged_grid) and drawn at run time by a persistent grid: a CUDA graph replayed with
    other lengths walks the new batch's tiles, and sequences without queries cost nothing.

    Sequence b of s_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] queries has m_b = ceil(s_b / tile_tokens) tiles per
    head: tile_tokens query tokens a tile (unpaged: bm, one query head's rows; paged: the GQA-packed tile's
    tokens, each token's `group` query heads of the KV head in rows of their own, so a decode token's query heads
    share one tile and K/V are read once per KV head; none for a sequence of fewer than min_q queries:
    Runtime.attention gives its decode rows to the decode kernel). Tile r of the heads * sum_b m_b enumerates
    the sequences longest first (the most keys; locate(), sorted(): where the batch has at most ROUND sequences
    and 2 to 32 of them have tiles, else in batch order), and each sequence's tiles by place(): its heads in
    sections whose K/V fit L2_SECTION_BYTES, each section's tiles longest first (m_block from m_b - 1 down: a
    bottom-right causal tile sees more keys than the one before it), the section's heads innermost. CTA c runs
    tile c first, then each tile it draws: the value of the runtime's per-stream counter + n_ctas (draw_tile,
    settle_draw). So a CTA that
    finishes early takes the next tile, and tiles of unequal cost even out whatever their sequences' lengths:
    the static rounds of tile pairs this replaced balanced one chunk's causal tiles, but chunks over different
    prefixes left CTAs with up to twice the mean work (four 512-token chunks over 0-8192 keys: 1.93x faster
    drawn, one chunk the same speed; benchmarks/results/paged_varlen_experiment_schedule.json). A CTA draws once
    its producer has issued the current tile's loads: drawn as the tile started, the next tile was claimed one
    tile ahead and the four chunks ran 1.67x, not 1.93x. The producer warp locates each tile (a warp scan over
    ROUND sequences at a time) and hands it to the other warps whole (the kernel's publish_tile)."""

    def __init__(self, kv_bytes_per_key: int):
        """kv_bytes_per_key: K and V bytes of one key of one KV head (2 * D * their element bytes)."""
        self.keys_in_l2 = L2_SECTION_BYTES // kv_bytes_per_key

    @cute.jit
    def round_tiles(self, nt, cu_seqlens_q, r0, batch, tile_tokens, min_q, lane):
        """nt[i] = tiles per head of sequence b = r0 + SEQS_PER_LANE * lane + i (0 past the batch, and for
        fewer than min_q queries: those sequences are the decode kernel's), the round loaded whole first
        (_load_round)."""
        lo = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        hi = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        _load_round(lo, cu_seqlens_q, r0, batch, lane)
        _load_round(hi, cu_seqlens_q, r0, batch, lane, 1)
        for i in cutlass.range_constexpr(SEQS_PER_LANE):
            s = cutlass.max(hi[i] - lo[i], Int32(0))
            nt[i] = Int32(0)
            if r0 + SEQS_PER_LANE * lane + i < batch and s >= min_q:
                nt[i] = (s + (tile_tokens - 1)) // tile_tokens

    @cute.jit
    def count(self, cu_seqlens_q, batch, tile_tokens, heads, min_q, lane):
        """Tiles of the batch, the same on every lane."""
        w = Int32(0)
        nt = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        for r0 in range(0, batch, ROUND):
            self.round_tiles(nt, cu_seqlens_q, r0, batch, tile_tokens, min_q, lane)
            for i in cutlass.range_constexpr(SEQS_PER_LANE):
                w = w + nt[i]
        return cute.arch.make_warp_uniform(_warp_sum(w) * heads)

    @cute.jit
    def locate(self, r, cu_seqlens_q, batch, tile_tokens, heads, min_q, lane, kv_lengths,
               kv_cumulative: cutlass.Constexpr, scratch):
        """(bidx, local, m_b, q_start, s_q) of tile r (< count()), warp-uniform: its sequence, its index among
        that sequence's heads * m_b tiles (place() maps it to a head and m_block), the sequence's tiles per head
        and query tokens. The sequences with tiles go longest first (their keys: kv_lengths[b], or kv_lengths[b + 1]
        - kv_lengths[b] when kv_cumulative), ties in batch order, where the batch has at most ROUND sequences and
        2 to 32 of them have tiles (sorted()); else in batch order. scratch: SORT_SCRATCH_WORDS int32 of shared
        memory the warp may use."""
        seq = Int32(-1)
        first = Int32(0)  # the sequence's first tile
        nt = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
        if batch <= ROUND:  # one round, its tile counts and keys read once, together
            keys = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
            _load_round(keys, kv_lengths, 0, batch, lane, 1 if kv_cumulative else 0)
            if cutlass.const_expr(kv_cumulative):
                starts = cute.make_rmem_tensor((SEQS_PER_LANE,), Int32)
                _load_round(starts, kv_lengths, 0, batch, lane)
                for i in cutlass.range_constexpr(SEQS_PER_LANE):
                    keys[i] = keys[i] - starts[i]
            self.round_tiles(nt, cu_seqlens_q, 0, batch, tile_tokens, min_q, lane)
            seq, first = self.sorted(r, nt, keys, heads, lane, scratch)
        else:
            base = Int32(0)
            for r0 in range(0, batch, ROUND):
                self.round_tiles(nt, cu_seqlens_q, r0, batch, tile_tokens, min_q, lane)
                seq, first, base = self.round_hit(r, nt, r0, base, seq, first, heads, lane)
            seq, first = _from_hit(seq, first)
        q_start = Int32(0)
        s_q = Int32(0)
        if seq >= 0:
            q_start = cu_seqlens_q[seq]
            s_q = cu_seqlens_q[seq + 1] - q_start
        return seq, r - first, (s_q + (tile_tokens - 1)) // tile_tokens, q_start, s_q

    @cute.jit
    def round_hit(self, r, nt, r0, base, seq, first, heads, lane):
        """Batch order over the round from sequence r0 (nt: round_tiles(); base: the tiles before it): (seq, first)
        of tile r on the one lane holding it (else as given), and the tiles up to the round's end."""
        mine = Int32(0)
        for i in cutlass.range_constexpr(SEQS_PER_LANE):
            mine = mine + nt[i] * heads
        incl = _warp_inclusive_scan(mine, lane)
        ex = base + incl - mine
        for i in cutlass.range_constexpr(SEQS_PER_LANE):
            tiles = nt[i] * heads
            if r >= ex and r < ex + tiles:
                seq = r0 + SEQS_PER_LANE * lane + i
                first = ex
            ex = ex + tiles
        return seq, first, base + cute.arch.shuffle_sync(incl, 31)

    @cute.jit
    def sorted(self, r, nt, keys, heads, lane, scratch):
        """(seq, first) of tile r in a batch of at most ROUND sequences (nt: its round_tiles(); keys: each
        sequence's keys, as locate() reads them), the sequences with tiles longest first when 2 to 32 of them
        have tiles, else in batch order. Those sequences are
        compacted through `scratch` to one a lane, in batch order (b, keys, tiles); each lane counts the tiles of
        the sequences before its own (more keys, or as many and earlier), and the lane whose tiles hold r names
        the tile's sequence."""
        mine = Int32(0)
        for i in cutlass.range_constexpr(SEQS_PER_LANE):
            if nt[i] > 0:
                mine = mine + 1
        incl = _warp_inclusive_scan(mine, lane)
        n_sorted = cute.arch.make_warp_uniform(cute.arch.shuffle_sync(incl, 31))
        seq = Int32(-1)
        first = Int32(0)
        if n_sorted >= 2 and n_sorted <= 32:
            slot = incl - mine
            for i in cutlass.range_constexpr(SEQS_PER_LANE):
                if nt[i] > 0:
                    scratch[3 * slot] = SEQS_PER_LANE * lane + i
                    scratch[3 * slot + 1] = keys[i]
                    scratch[3 * slot + 2] = nt[i] * heads
                    slot = slot + 1
            cute.arch.sync_warp()
            b = Int32(-1)
            key = Int32(-1)
            tiles = Int32(0)
            if lane < n_sorted:
                b = scratch[3 * lane]
                key = scratch[3 * lane + 1]
                tiles = scratch[3 * lane + 2]
            cute.arch.sync_warp()  # every read done before the next call's writes
            start = Int32(0)
            for u in cutlass.range(n_sorted, unroll=1):
                ku = cute.arch.shuffle_sync(key, u)
                tu = cute.arch.shuffle_sync(tiles, u)
                if ku > key or (ku == key and u < lane):
                    start = start + tu
            if lane < n_sorted:
                if r >= start and r < start + tiles:
                    seq = b
                    first = start
        else:
            seq, first, _ = self.round_hit(r, nt, 0, Int32(0), seq, first, heads, lane)
        return _from_hit(seq, first)

    @cute.jit
    def place(self, local, m_b, heads, s_kv, heads_per_kv):
        """(head, m_block) of a sequence's tile `local` (of heads * m_b; s_kv: its keys; heads_per_kv: query heads
        a tile's head stands for, 1 for tiles of KV heads, the GQA group for tiles of query heads, whose consecutive
        heads share a KV head): the heads in sections of g (the most whose K/V fit L2_SECTION_BYTES, whole KV heads,
        at least one), section by section; in a section the tiles longest first, its heads innermost."""
        g = cutlass.min(cutlass.max(Int32(self.keys_in_l2) // cutlass.max(s_kv, Int32(1)), Int32(1))
                        * heads_per_kv, heads)
        per = g * m_b  # the tiles of a whole section
        sec = local // per
        within = local - sec * per
        gs = cutlass.min(g, heads - sec * g)  # the last section's heads may be fewer
        step = within // gs
        return sec * g + within - step * gs, m_b - 1 - step
