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
