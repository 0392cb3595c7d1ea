"""Helpers shared by the GPU tests."""
from __future__ import annotations

import torch


def check_close(got, ref, tol, what):
    """|got - ref| <= atol + rtol*|ref| everywhere; NaN (an unwritten, poisoned element) always fails;
    infinities must match in sign."""
    atol, rtol = tol
    assert not torch.isnan(got).any(), f"{what}: {int(torch.isnan(got).sum())} elements not written (NaN)"
    g, r = got.double(), ref.double()
    same_inf = torch.isinf(g) & torch.isinf(r) & (torch.sign(g) == torch.sign(r))
    err = torch.where(same_inf, torch.zeros_like(g), (g - r).abs())
    bound = atol + rtol * torch.where(torch.isinf(r), torch.zeros_like(r), r.abs())
    bad = err > bound
    assert not bad.any(), f"{what}: {int(bad.sum())}/{bad.numel()} off, max err {float(err.nan_to_num(1e9).max()):.3g}"
