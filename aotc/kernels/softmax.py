"""Online softmax of the attention kernels (CuTe DSL, imported only to compile).

Scores arrive as fp32 accumulator tiles viewed (rows, cols) per thread, already masked with -inf. Each
kv block updates a row's running max and this thread's partial row sum and returns the factor alpha by
which the row's earlier O and sum must be scaled; the end of the kv loop normalizes O and gives the
natural-log LSE. exp2 with softmax_scale * log2(e) folded in; the rows of an m16n8 / wgmma accumulator
are shared by the 4 threads of a quad, so maxima and sums reduce over the quad.

Lazy rescaling (MAX_SLACK_LOG2, where a thread's O tile outnumbers its scores): a row keeps its running
max until a new score exceeds it by more than 2^8 (p <= 2^8: exact in fp32, representable in fp16/bf16),
so alpha is exactly 1 for most kv blocks and a warp whose rows all have alpha = 1 skips the O rescale;
the final O / rowsum and LSE use the same kept max, so the result is unchanged
(benchmarks/results/prefill_experiment_portable_lazy_rescale.json).

Score features (aotc.families.features): soft-cap rewrites a row's scores before the mask
(softcap_row: s -> tanh(s * scale / softcap), and the softmax then runs with scale_log2 =
softcap * log2(e), which folds the cap's multiply into the exponent's FFMA, as FA3 does: ScoreScale gives
both); sinks enter once, when a row is normalized (normalize_rows' sink_log2: the sink logit joins the
denominator and the LSE).

Soft-capped rows against a fixed offset (capped_softmax_row): a soft-capped logit lies within
[-softcap, softcap], so for softcap * log2(e) <= CAPPED_MAX_SCALE_LOG2 every p can be taken relative to one
offset known before the kv loop, the cap minus CAPPED_P_MAX_LOG2, instead of a running max: no row max, no quad
shuffles, no alpha and no O rescale. The row's max is filled with that offset (in tanh units:
capped_row_max) and normalize_rows and the LSE use it as any kept max. The bound keeps every p a normal number
of fp32 and bf16 (2^(64 - 2 * 92) = 2^-120 >= 2^-126) and row sums of 2^31 keys below 2^95, so O stays finite
for |v| < 2^32; fp16's range (2^-24 .. 2^16) is too narrow, so only bf16 P takes it (a kernel picks it at run
time from the softcap value; above the bound it runs the online softmax).
"""
import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2_E = 1.4426950408889634074
LN_2 = 0.6931471805599453094
NEG_INF = -math.inf
MAX_SLACK_LOG2 = 8.0
CAPPED_P_MAX_LOG2 = 64.0  # the largest p of a soft-capped row against its fixed offset: 2^64
CAPPED_MAX_SCALE_LOG2 = 92.0  # softcap * log2(e) up to which the fixed offset serves (softcap <= 63.7)


def quad_allreduce(val, op):
    """Reduce over the 4 threads of a quad (the threads sharing accumulator rows)."""
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=2, mask=-1, mask_and_clamp=31))
    val = op(val, cute.arch.shuffle_sync_bfly(val, offset=1, mask=-1, mask_and_clamp=31))
    return val


@cute.jit
def softmax_row(S_mn, row_max, row_sum, r: cutlass.Constexpr, scale_log2, max_slack_log2: cutlass.Constexpr = 0.0):
    """Online-softmax step for this thread's row r of a score tile (already masked with -inf):
    S_mn[r] becomes p = 2^(s * scale_log2 - max * scale_log2), row_max[r] the running max (over
    the quad), row_sum[r] this thread's partial running sum; returns the factor alpha by which
    the row's earlier O and sum must be scaled. A row that has seen no visible key keeps max
    -inf and takes offset 0, so every p is 2^-inf = 0 (not NaN)."""
    row = S_mn[r, None].load()
    m_prev = row_max[r]
    m_cur = quad_allreduce(row.reduce(cute.ReductionOp.MAX, m_prev, 0), cute.arch.fmax)
    if cutlass.const_expr(max_slack_log2 > 0.0):
        # keep the running max while the new one exceeds it by at most the slack (p <= 2^slack, exact in
        # fp32 and in the P dtype): alpha is then 1 and the O rescale can be skipped. A first finite max
        # replaces -inf (the difference is +inf); -inf - -inf is NaN, which also keeps m_prev = -inf.
        m_cur = m_prev if (m_cur - m_prev) * scale_log2 <= Float32(max_slack_log2) else m_cur
    row_max[r] = m_cur
    m_scaled = (Float32(0.0) if m_cur == Float32(NEG_INF) else m_cur) * scale_log2
    p = cute.math.exp2(row * scale_log2 - m_scaled, fastmath=True)
    alpha = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)
    # per-thread partial row sums; the quad reduction is done once, at the end
    row_sum[r] = row_sum[r] * alpha + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    S_mn[r, None].store(p)
    return alpha


@cute.jit
def capped_softmax_row(S_mn, row_max, row_sum, r: cutlass.Constexpr, scale_log2):
    """softmax_row for a soft-capped row whose max is the fixed offset row_max[r] (capped_row_max): S_mn[r]
    becomes p = 2^(s * scale_log2 - offset), row_sum[r] gains their sum (row_sum None: the caller sums P
    elsewhere); the offset never moves, so there is no factor to return (alpha = 1)."""
    row = S_mn[r, None].load()
    p = cute.math.exp2(row * scale_log2 - row_max[r] * scale_log2, fastmath=True)
    if cutlass.const_expr(row_sum is not None):
        row_sum[r] = row_sum[r] + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    S_mn[r, None].store(p)


class ScoreScale:
    """How raw q.k scores become the softmax's log2-domain logits: (scale_log2, cap_in) with
    p = 2^(s' * scale_log2 - max), s' = s (plain: scale_log2 = scale * log2(e)) or tanh(s * cap_in)
    (soft-cap: cap_in = scale / softcap, scale_log2 = softcap * log2(e)). Built in the kernel from the
    runtime softmax_scale and softcap. Soft-cap also gives capped_row_max, the fixed offset in tanh units
    (1 - CAPPED_P_MAX_LOG2 / scale_log2: p <= 2^64), and fixed_offset, whether it may serve
    (scale_log2 <= CAPPED_MAX_SCALE_LOG2; capped_softmax_row)."""

    def __init__(self, softmax_scale, softcap_value, softcap: bool):
        self.softcap = softcap
        if softcap:
            self.scale_log2 = softcap_value * Float32(LOG2_E)
            self.cap_in = softmax_scale / softcap_value
            self.capped_row_max = Float32(1.0) - Float32(CAPPED_P_MAX_LOG2) / self.scale_log2
            self.fixed_offset = self.scale_log2 <= Float32(CAPPED_MAX_SCALE_LOG2)
        else:
            self.scale_log2 = softmax_scale * Float32(LOG2_E)
            self.cap_in = Float32(0.0)


@cute.jit
def softcap_row(S_mn, r: cutlass.Constexpr, cap_in):
    """Soft-cap row r of a score tile (before its mask): s -> tanh(s * cap_in), tanh.approx.f32 (one MUFU op a
    score, as FA3's); the softcap factor is in ScoreScale.scale_log2."""
    for c in cutlass.range_constexpr(cute.size(S_mn, mode=[1])):
        S_mn[r, c] = cute.math.tanh(S_mn[r, c] * cap_in, approx=True)


@cute.jit
def with_sink(m_log2, total, sink_log2):
    """A row's (max, sum) in the log2 domain, m_log2 the max its sum is relative to (-inf: no key seen),
    joined by a sink logit: (the new max, the new sum, the factor by which O, relative to m_log2, must be
    scaled). A sink of -inf and no key leaves (-inf, 0, 0)."""
    m_new = cute.arch.fmax(m_log2, sink_log2)
    m_safe = Float32(0.0) if m_new == Float32(NEG_INF) else m_new
    factor = cute.math.exp2(m_log2 - m_safe, fastmath=True)  # m_log2 = -inf: 0
    total_new = total * factor + cute.math.exp2(sink_log2 - m_safe, fastmath=True)
    return m_new, total_new, factor


@cute.jit
def rescale_rows(O_mn, alpha):
    """O_mn[r] *= alpha[r] for every row of this thread's accumulator view."""
    for r in cutlass.range_constexpr(cute.size(alpha)):
        O_mn[r, None].store(O_mn[r, None].load() * alpha[r])


@cute.jit
def normalize_rows(O_mn, row_max, row_sum, scale_log2, lse_r, sink_log2=None, o_scale=None):
    """End of the kv loop: O /= row sum (over the quad) and lse_r = natural-log LSE per row; a row
    that saw no key keeps O = 0 (its accumulator is 0) and gets LSE = -inf. sink_log2 (sinks: a tensor of
    each row's sink logit times log2(e)) joins every row's denominator and LSE (a row that saw no key then
    gets LSE = its sink). o_scale (fp8 KV: V's scale) multiplies O, not the LSE."""
    for r in cutlass.range_constexpr(cute.size(row_max)):
        total = quad_allreduce(row_sum[r], lambda a, b_: a + b_)
        m_log2 = row_max[r] * scale_log2
        factor = Float32(1.0)
        if cutlass.const_expr(sink_log2 is not None):
            m_log2, total, factor = with_sink(m_log2, total, sink_log2[r])
        if cutlass.const_expr(o_scale is not None):
            factor = factor * o_scale
        inv = Float32(1.0)
        lse_r[r] = Float32(NEG_INF)
        if total > Float32(0.0):
            inv = cute.arch.rcp_approx(total) * factor
            lse_r[r] = (m_log2 + cute.math.log2(total, fastmath=True)) * Float32(LN_2)
        O_mn[r, None].store(O_mn[r, None].load() * inv)


@cute.jit
def store_lse_rows(lse, lse_off, lse_ss, lse_r, t0_rows, tile_row0, row0, s_q):
    """lse[lse_off + i * lse_ss] = lse_r[r] for this thread's rows i = tile_row0 + row0 + t0_rows[r, 0][0]
    (its first row row0 within a tile starting at query tile_row0) below s_q; the caller picks one thread
    of each quad."""
    row_lim = s_q - tile_row0 - row0
    for r in cutlass.range_constexpr(cute.size(lse_r)):
        rr = t0_rows[r, 0][0]
        if rr < row_lim:
            i = cutlass.Int64(tile_row0 + row0 + rr)
            lse[lse_off + i * lse_ss] = lse_r[r]
