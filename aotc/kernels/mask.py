"""Which keys a query row sees, written once for every attention kernel (CuTe DSL, imported only to compile).

Bottom-right causal alignment: in a sequence with S_q queries and S_kv keys, query i sees key j iff
j < S_kv and, causal, j <= i + S_kv - S_q (the queries are the last S_q positions). A kernel walks kv
blocks of bn keys: kv_block_range() gives the blocks a query tile visits and the first that needs a
mask; inside a masked block, a thread masks each of its rows with one upper key limit per row,
relative to its first column (score_limits(), then mask_row() or mask_columns()).

Sliding window (window_left w, with causal): query i sees keys p - w <= j <= p, p = i + S_kv - S_q. The
blocks wholly left of every row's window are not visited (kv_blocks_for_queries' n_min), and those
crossing a row's left edge are masked like the diagonal ones (n_left_end); a kernel's kv loop runs its
iterations t = 0, 1, .. over blocks n_max-1-t in three segments (kv_loop_segments): masked (diagonal,
sequence tail), unmasked, masked (window's left edge).
"""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .softmax import NEG_INF


@cute.jit
def kv_block_range(m_block, s_q, s_kv, bm: cutlass.Constexpr, bn: cutlass.Constexpr, causal: cutlass.Constexpr,
                   window: cutlass.Constexpr = False, window_left=0):
    """kv_blocks_for_queries for query tile m_block (bm rows)."""
    return kv_blocks_for_queries(m_block * bm, m_block * bm + bm - 1, s_q, s_kv, bn, causal, window, window_left)


@cute.jit
def kv_blocks_for_queries(q_first, q_last, s_q, s_kv, bn: cutlass.Constexpr, causal: cutlass.Constexpr,
                          window: cutlass.Constexpr = False, window_left=0):
    """(n_min, n_max, n_mask_min, n_left_end) for the queries q_first .. q_last of a tile (a GQA-packed tile
    holds several query heads of each of its tokens: its rows cover fewer queries than rows) over kv
    blocks of bn keys: blocks n_min .. n_max-1 are visited, n_mask_min .. n_max-1 need a mask (the
    sequence tail; causal, the blocks crossing the diagonal), and, with a window, n_min .. n_left_end-1
    too (a row's window starts inside them). No visible block (S_kv = 0, or a causal tile that sees no
    key): n_max = 0. Without a window n_min = n_left_end = 0."""
    n_blocks = (s_kv + (bn - 1)) // bn
    n_max = n_blocks
    n_mask_min = n_max - 1  # non-causal: only the last (sequence-tail) block is masked
    n_min = Int32(0)
    n_left_end = Int32(0)
    if cutlass.const_expr(causal):
        # the tile's last query sees keys up to q_last + S_kv - S_q
        lim = q_last + 1 + s_kv - s_q
        n_causal = Int32(0)
        if lim > 0:
            n_causal = (lim + (bn - 1)) // bn
        n_max = cutlass.min(n_blocks, n_causal)
        # blocks n with (n+1)*bn - 1 <= q_first + S_kv - S_q are visible to every row
        first_masked = Int32(0)
        lim_lo = q_first + 1 + s_kv - s_q
        if lim_lo > 0:
            first_masked = lim_lo // bn
        n_mask_min = cutlass.min(first_masked, n_max - 1)
        if cutlass.const_expr(window):
            # the first query's window starts at key q_first + S_kv - S_q - w; a block starting at or past the
            # last query's start is inside every row's window. The position is compared with w before w is
            # subtracted: a position below 0 minus a w near 2^31 would wrap around
            p_first = q_first + s_kv - s_q
            if p_first > window_left:
                n_min = cutlass.min((p_first - window_left) // bn, cutlass.max(n_max - 1, 0))
            p_last = q_last + s_kv - s_q
            if p_last > window_left:
                n_left_end = (p_last - window_left + (bn - 1)) // bn
            n_left_end = cutlass.max(cutlass.min(n_left_end, n_max), n_min)
    return n_min, n_max, cutlass.max(n_mask_min, 0), n_left_end


@cute.jit
def kv_loop_segments(n_min, n_max, n_mask_min, n_left_end):
    """(n_iter, n_right, n_plain_end) of a kv loop whose iteration t visits block n_max-1-t: n_iter
    iterations; t < n_right masked (diagonal, tail), n_right <= t < n_plain_end unmasked, the rest masked
    (the window's left edge; none without a window)."""
    n_iter = n_max - n_min
    n_right = n_max - n_mask_min
    n_plain_end = cutlass.max(n_right, n_max - n_left_end)
    return n_iter, n_right, n_plain_end


@cute.jit
def score_limits(row_first, block_key0, col0, s_q, s_kv):
    """(key_lim, causal_lim): this thread's column c (thread 0's column plus col0, in a kv block whose
    first key is block_key0) holds a key below S_kv iff c < key_lim, and, for its row r (thread 0's row
    plus row_first, a query index), a key the causal mask lets through iff c < causal_lim + r."""
    key_lim = s_kv - block_key0 - col0
    causal_lim = row_first + 1 + s_kv - s_q - block_key0 - col0
    return key_lim, causal_lim


@cute.jit
def mask_columns(S_mn, r: cutlass.Constexpr, t0_coords, lim):
    """Row r of a score tile: columns whose (thread 0) column coordinate is >= lim become -inf."""
    for c in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
        S_mn[r, c] = S_mn[r, c] if t0_coords[0, c][1] < lim else Float32(NEG_INF)


@cute.jit
def mask_columns_between(S_mn, r: cutlass.Constexpr, t0_coords, lo, lim):
    """Row r of a score tile: columns whose (thread 0) column coordinate is outside [lo, lim) become -inf."""
    for c in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
        col = t0_coords[0, c][1]
        S_mn[r, c] = S_mn[r, c] if col < lim and col >= lo else Float32(NEG_INF)


@cute.jit
def mask_row(S_mn, r: cutlass.Constexpr, t0_coords, key_lim, causal_lim, causal: cutlass.Constexpr,
             window: cutlass.Constexpr = False, window_left=0):
    """Mask row r of a score tile with the limits of score_limits() (and the window's left edge: the row's
    query p sees keys from p - window_left, i.e. columns from causal_lim + row - 1 - window_left)."""
    lim_r = key_lim
    if cutlass.const_expr(causal):
        lim_r = cutlass.min(key_lim, causal_lim + t0_coords[r, 0][0])
    if cutlass.const_expr(window):
        mask_columns_between(S_mn, r, t0_coords, causal_lim + t0_coords[r, 0][0] - 1 - window_left, lim_r)
    else:
        mask_columns(S_mn, r, t0_coords, lim_r)
