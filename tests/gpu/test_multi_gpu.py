"""One process, one loaded bundle, launches on every visible GPU (a context per device)."""
from __future__ import annotations

import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from common import check_close

pytestmark = pytest.mark.gpu

if torch.cuda.is_available() and torch.cuda.device_count() < 2:
    pytest.skip("needs two or more GPUs", allow_module_level=True)


def ref_prefill(q, k, v, causal):
    s = torch.einsum("shd,thd->hst", q.float(), k.float()) / math.sqrt(q.shape[-1])
    if causal:
        S_q, S_kv = q.shape[0], k.shape[0]
        mask = torch.arange(S_kv, device=q.device)[None, :] > torch.arange(S_q, device=q.device)[:, None] + (S_kv - S_q)
        s = s.masked_fill(mask, -math.inf)
    return torch.einsum("hst,thd->shd", torch.softmax(s, -1), v.float())


def test_every_device_runs_from_one_runtime(rt):
    kernels_before = {id(k) for ks in rt.kernels.values() for k in ks}
    variants = sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["causal"])
                       for k in rt.kernels["sdpa_prefill"] if k.variant["layout"] == "dense"})
    dtype, D, causal = next(v for v in variants if v[0] == "bf16" and v[1] == 128)
    for dev in range(torch.cuda.device_count()):
        with torch.cuda.device(dev):
            q, k, v = (torch.randn(2, 300, 4, D, dtype=torch.bfloat16, device=f"cuda:{dev}") for _ in range(3))
            out = torch.full_like(q, math.nan)
            rt.prefill(q, k, v, out, causal=causal, stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            for b in range(2):
                check_close(out[b], ref_prefill(q[b], k[b], v[b], causal), (2e-2, 2e-2), f"device {dev}")
            op = torch.randn(3, 1, 1, 8, 128, device=f"cuda:{dev}")
            lp = torch.randn(3, 1, 8, 1, device=f"cuda:{dev}")
            o = torch.full((1, 1, 8, 128), math.nan, device=f"cuda:{dev}")
            rt.combine(op, lp, o)
            torch.cuda.synchronize()
            assert not torch.isnan(o).any()
    # the same LoadedKernel objects served every device: the bundle was loaded once
    assert {id(k) for ks in rt.kernels.values() for k in ks} == kernels_before
    assert any(len(k._smem_ready) > 1 for k in rt.kernels["sdpa_prefill"] if k.loaded)


def test_tensor_on_another_device_is_refused(rt):
    q = torch.randn(1, 16, 2, 128, dtype=torch.bfloat16, device="cuda:1")
    out = torch.full_like(q, math.nan)
    with torch.cuda.device(0):
        with pytest.raises(ArgumentError, match="device"):
            rt.prefill(q, q.clone(), q.clone(), out)
    torch.cuda.synchronize(1)
    assert torch.isnan(out).all()
