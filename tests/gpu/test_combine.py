"""sdpa_combine on the GPU, from the default bundle, against an fp64 torch reference.

Tolerances (|out - ref| <= atol + rtol * |ref|): fp32 out 2e-6/2e-5, fp16 1e-3/2e-3,
bf16 8e-3/1.6e-2 (output rounding dominates: 2^-11 and 2^-8 relative); LSE 1e-5/1e-5.
Outputs are poisoned with NaN before every launch, so an element the kernel failed
to write fails the comparison; padding around strided outputs must stay NaN.
"""
from __future__ import annotations

import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from common import check_close

pytestmark = pytest.mark.gpu

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOL = {"fp32": (2e-6, 2e-5), "fp16": (1e-3, 2e-3), "bf16": (8e-3, 1.6e-2)}
LSE_TOL = (1e-5, 1e-5)


def make_partials(splits, B, S, H, D, empty_frac=0.3, empty_rows=True, gen=None):
    dev = "cuda"
    op = torch.randn(splits, B, S, H, D, device=dev, generator=gen)
    lp = torch.randn(splits, B, H, S, device=dev, generator=gen) * 3
    if splits:
        empty = torch.rand(splits, B, H, S, device=dev, generator=gen) < empty_frac
        if empty_rows and B * S * H > 1:
            empty[:, 0, 0, 0] = True  # one row whose splits are all empty
        lp[empty] = -math.inf
        # an empty split's partial output is garbage: the kernel must never read it
        op.masked_fill_(empty.permute(0, 1, 3, 2).unsqueeze(-1).expand_as(op), math.nan)
    return op, lp


def reference(op, lp):
    """fp64 merge: returns (O [B,S,H,D], LSE [B,H,S]); all-empty rows give O = 0, LSE = -inf."""
    splits, B, S, H, D = op.shape
    if splits == 0:
        return torch.zeros(B, S, H, D, dtype=torch.float64, device=op.device), \
            torch.full((B, H, S), -math.inf, dtype=torch.float64, device=op.device)
    lse = lp.double()
    m = lse.max(0).values
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lse - m_safe)  # exp(-inf) = 0 for empty splits
    total = w.sum(0)
    lse_out = torch.where(total > 0, m_safe + torch.log(total), torch.full_like(m, -math.inf))
    wn = torch.where(total > 0, w / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(w))
    wn = wn.permute(0, 1, 3, 2).unsqueeze(-1)  # [splits, B, S, H, 1]
    o = torch.where(wn > 0, op.double(), torch.zeros((), dtype=torch.float64, device=op.device)) * wn
    return o.sum(0), lse_out


def make_out(B, S, H, D, dtype, layout):
    """(out view, the full buffer it lives in) for the layouts under test."""
    t = DTYPES[dtype]
    if layout == "packed":
        buf = torch.empty(B, S, H, D, dtype=t, device="cuda")
        return buf, buf
    if layout == "padded":  # padded head and head-dim strides
        buf = torch.empty(B, S, H + 3, D + 8, dtype=t, device="cuda")
        return buf[:, :, :H, :D], buf
    if layout == "bhsd":  # O stored [B, H, S, D], viewed as [B, S, H, D]
        buf = torch.empty(B, H, S, D, dtype=t, device="cuda")
        return buf.transpose(1, 2), buf
    if layout == "dstride2":  # head-dim stride 2
        buf = torch.empty(B, S, H, 2 * D, dtype=t, device="cuda")
        return buf[..., ::2], buf
    raise ValueError(layout)


def run_case(rt, splits, B, S, H, D, dtype, layout, with_lse, gen):
    op, lp = make_partials(splits, B, S, H, D, gen=gen)
    out, out_buf = make_out(B, S, H, D, dtype, layout)
    out_buf.fill_(math.nan)
    lse = None
    if with_lse:
        lse_buf = torch.full((B, H, S + 2), math.nan, device="cuda")
        lse = lse_buf[:, :, :S] if layout != "packed" else torch.full((B, H, S), math.nan, device="cuda")
    plan = rt.prepare_combine(op, lp, out, lse)
    plan(op, lp, out, lse, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(op, lp)
    check_close(out, ref_o, TOL[dtype], f"O splits={splits} D={D} {dtype} {layout}")
    if layout in ("padded", "dstride2"):
        untouched = out_buf.clone()
        if layout == "padded":
            untouched[:, :, :H, :D] = math.nan
        else:
            untouched[..., ::2] = math.nan
        assert torch.isnan(untouched).all(), f"kernel wrote outside O ({layout})"
    if with_lse:
        check_close(lse, ref_lse, LSE_TOL, f"LSE splits={splits} D={D} {dtype} {layout}")
        if layout != "packed":
            assert torch.isnan(lse_buf[:, :, S:]).all(), "kernel wrote outside LSE"
    return plan


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_combine_matches_fp64_reference(rt, D, splits, dtype, layout):
    gen = torch.Generator(device="cuda").manual_seed(hash((D, splits, dtype, layout)) % 2**31)
    plan = run_case(rt, splits, 2, 3, 5, D, dtype, layout, with_lse=True, gen=gen)
    assert plan.variant["strides"] == ("packed" if layout == "packed" else "general")
    assert plan.variant["dtype"] == dtype and plan.variant["head_dim"] == D


@pytest.mark.parametrize("layout", ["bhsd", "dstride2"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_combine_general_strides(rt, layout, dtype):
    gen = torch.Generator(device="cuda").manual_seed(7)
    plan = run_case(rt, 5, 3, 4, 6, 128, dtype, layout, with_lse=True, gen=gen)
    assert plan.variant["strides"] == "general"


@pytest.mark.parametrize("S", [0, 1, 7])
def test_combine_edge_lengths_and_no_lse(rt, S):
    gen = torch.Generator(device="cuda").manual_seed(S)
    run_case(rt, 4, 2, S, 3, 64, "bf16", "packed", with_lse=False, gen=gen)
    run_case(rt, 4, 1, S, 9, 256, "fp16", "padded", with_lse=True, gen=gen)


def test_combine_all_splits_empty_and_zero_splits(rt):
    op = torch.full((3, 2, 2, 4, 128), math.nan, device="cuda")
    lp = torch.full((3, 2, 4, 2), -math.inf, device="cuda")
    out = torch.full((2, 2, 4, 128), math.nan, device="cuda", dtype=torch.bfloat16)
    lse = torch.full((2, 4, 2), math.nan, device="cuda")
    rt.combine(op, lp, out, lse)
    torch.cuda.synchronize()
    assert (out == 0).all() and torch.isneginf(lse).all()
    op0, lp0 = op[:0], lp[:0]
    out.fill_(math.nan), lse.fill_(math.nan)
    rt.combine(op0, lp0, out, lse)
    torch.cuda.synchronize()
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_combine_strides_beyond_int32(rt):
    """A split stride of 2^31 + 4 elements (8.6 GB of fp32): offsets must be 64-bit."""
    splits, B, S, H, D = 2, 1, 2, 2, 64
    stride = (1 << 31) + 4
    base = torch.empty(stride + S * H * D, device="cuda")
    op = base.as_strided((splits, B, S, H, D), (stride, S * H * D, H * D, D, 1))
    op.copy_(torch.randn(splits, B, S, H, D, device="cuda"))
    lp = torch.randn(splits, B, H, S, device="cuda")
    out = torch.full((B, S, H, D), math.nan, device="cuda")
    lse = torch.full((B, H, S), math.nan, device="cuda")
    rt.combine(op, lp, out, lse)
    torch.cuda.synchronize()
    ref_o, ref_lse = reference(op, lp)
    check_close(out, ref_o, TOL["fp32"], "O with 2^31+ strides")
    check_close(lse, ref_lse, LSE_TOL, "LSE with 2^31+ strides")
    del base, op
    torch.cuda.empty_cache()


def test_combine_cuda_graph_replays_with_changed_inputs(rt):
    splits, B, S, H, D = 7, 4, 1, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(3)
    op, lp = make_partials(splits, B, S, H, D, gen=gen)
    out = torch.empty(B, S, H, D, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, H, S, device="cuda")
    plan = rt.prepare_combine(op, lp, out, lse)
    plan(op, lp, out, lse, stream=torch.cuda.current_stream())  # warm: loads the module outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(op, lp, out, lse, stream=torch.cuda.current_stream())
    for trial in range(3):
        new_op, new_lp = make_partials(splits, B, S, H, D, gen=gen)
        op.copy_(new_op), lp.copy_(new_lp)
        out.fill_(math.nan), lse.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = reference(op, lp)
        check_close(out, ref_o, TOL["bf16"], f"graph replay {trial}")
        check_close(lse, ref_lse, LSE_TOL, f"graph replay {trial} LSE")


def test_prepared_run_with_new_pointers(rt):
    splits, B, S, H, D = 3, 2, 2, 4, 64
    gen = torch.Generator(device="cuda").manual_seed(11)
    tensors = [make_partials(splits, B, S, H, D, gen=gen) for _ in range(2)]
    outs = [torch.full((B, S, H, D), math.nan, device="cuda", dtype=torch.float16) for _ in range(2)]
    plan = rt.prepare_combine(tensors[0][0], tensors[0][1], outs[0])
    for (op, lp), out in zip(tensors, outs):
        plan.run(op.data_ptr(), lp.data_ptr(), out.data_ptr(), 0, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    for (op, lp), out in zip(tensors, outs):
        check_close(out, reference(op, lp)[0], TOL["fp16"], "run() with new pointers")


def test_bad_arguments_raise_before_launch(rt):
    op = torch.randn(2, 1, 1, 4, 128, device="cuda")
    lp = torch.randn(2, 1, 4, 1, device="cuda")
    out = torch.full((1, 1, 4, 128), math.nan, device="cuda", dtype=torch.bfloat16)
    cases = [
        ((op.half(), lp, out), "o_partial.dtype"),
        ((op, lp, out.view(1, 4, 128)), "out.shape"),
        ((op[..., :96], lp, out), "o_partial.shape[4]"),  # D=96: no kernel for it
        ((op, lp[:, :, :3], out), "lse_partial.shape"),
        ((op.cpu(), lp, out), "o_partial.device"),
    ]
    for args, name in cases:
        with pytest.raises((ArgumentError, TypeError, ValueError)) as ei:
            rt.combine(*args)
        assert name.split(".")[0] in str(ei.value), (name, str(ei.value))
    # misaligned o_partial (offset by one float): 16-byte alignment is required
    flat = torch.randn(op.numel() + 1, device="cuda")
    with pytest.raises(ArgumentError, match="o_partial.data_ptr"):
        rt.combine(flat[1:].view_as(op), lp, out)
    # out overlapping the partials
    with pytest.raises(ArgumentError, match="overlapping"):
        rt.combine(op, lp, op[0].view(1, 1, 4, 128))
    torch.cuda.synchronize()
    assert torch.isnan(out).all(), "a refused call must not have launched"
