"""The README's CuPy and JAX examples on the GPU: their arrays go in through DLPack, results checked with torch."""
from __future__ import annotations

import math
import os

import pytest
import torch

from common import check_close

pytestmark = pytest.mark.gpu
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # let JAX share the GPU with torch


def reference(q, k, v, causal):
    """fp32 attention on torch tensors [B, S, H, D]."""
    qt, kt, vt = (x.float().transpose(1, 2) for x in (q, k, v))
    S_q, S_kv = q.shape[1], k.shape[1]
    s = qt @ kt.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.arange(S_kv, device=q.device)[None, :] > torch.arange(S_q, device=q.device)[:, None] + (S_kv - S_q)
        s = s.masked_fill(mask, -math.inf)
    return (torch.softmax(s, -1) @ vt).transpose(1, 2)


def test_cupy_arrays(rt):
    cp = pytest.importorskip("cupy")
    q = cp.random.randn(2, 300, 4, 128, dtype=cp.float32).astype(cp.float16)
    k = cp.random.randn(2, 300, 4, 128, dtype=cp.float32).astype(cp.float16)
    v = cp.random.randn(2, 300, 4, 128, dtype=cp.float32).astype(cp.float16)
    out = cp.full_like(q, cp.nan)
    lse = cp.full((2, 4, 300), cp.nan, dtype=cp.float32)
    stream = cp.cuda.get_current_stream()
    rt.prefill(q, k, v, out, lse, causal=True, stream=stream)
    stream.synchronize()
    tq, tk, tv, tout = (torch.from_dlpack(x) for x in (q, k, v, out))
    check_close(tout, reference(tq, tk, tv, True), (4e-3, 4e-3), "CuPy prefill")
    assert not cp.isnan(lse).any()


def test_jax_arrays(rt):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    from cuda.bindings import driver as cu

    key = jax.random.PRNGKey(0)
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (2, 256, 4, 128), dtype=jnp.bfloat16)
    k = jax.random.normal(kk, (2, 256, 4, 128), dtype=jnp.bfloat16)
    v = jax.random.normal(kv, (2, 256, 4, 128), dtype=jnp.bfloat16)
    out = jnp.full_like(q, jnp.nan)
    for x in (q, k, v, out):
        x.block_until_ready()
    rt.prefill(q, k, v, out, causal=False, stream=0)
    cu.cuCtxSynchronize()
    tq, tk, tv, tout = (torch.from_dlpack(x) for x in (q, k, v, out))
    check_close(tout, reference(tq, tk, tv, False), (2e-2, 2e-2), "JAX prefill")
