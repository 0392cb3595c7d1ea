"""Per-sequence bounds of the attention kernels (CuTe DSL, imported only to compile)."""
import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def seq_bounds(bidx, seqlen_q, seqlen_kv, cu_seqlens_q, cu_seqlens_kv, ragged: cutlass.Constexpr):
    """(q_start, s_q, kv_start, s_kv) of sequence bidx: dense, the extents; ragged, from cu_seqlens."""
    q_start = Int32(0)
    kv_start = Int32(0)
    s_q = seqlen_q
    s_kv = seqlen_kv
    if cutlass.const_expr(ragged):
        q_start = cu_seqlens_q[bidx]
        s_q = cu_seqlens_q[bidx + 1] - q_start
        kv_start = cu_seqlens_kv[bidx]
        s_kv = cu_seqlens_kv[bidx + 1] - kv_start
    return q_start, s_q, kv_start, s_kv


@cute.jit
def paged_seq_bounds(bidx, cu_seqlens_q, seqlens_kv, max_pages, page: cutlass.Constexpr):
    """(q_start, s_q, s_kv) of sequence bidx of a paged call: its queries from cu_seqlens_q, its keys
    seqlens_kv[bidx], at least 0 and cut at its page-table row's end (max_pages pages: never read past the
    row; compared in 64 bits, so no extent wraps)."""
    q_start = cu_seqlens_q[bidx]
    s_q = cu_seqlens_q[bidx + 1] - q_start
    s_kv = cutlass.max(seqlens_kv[bidx], Int32(0))
    if cutlass.Int64(s_kv) > cutlass.Int64(max_pages) * page:
        s_kv = cutlass.max(max_pages, Int32(0)) * page
    return q_start, s_q, s_kv
