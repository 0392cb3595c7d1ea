"""aotc.torch custom ops on the GPU: inside torch.compile and a CUDA graph, checked against torch SDPA."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from common import check_close

pytestmark = pytest.mark.gpu

TOL = (2e-2, 2e-2)  # bf16


def sdpa(q, k, v, causal):
    """torch SDPA on [B, S, H, D] tensors (bottom-right causal mask built explicitly for S_q != S_kv)."""
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    S_q, S_kv = q.shape[1], k.shape[1]
    mask = None
    if causal:
        mask = torch.arange(S_kv, device=q.device)[None, :] <= torch.arange(S_q, device=q.device)[:, None] + (S_kv - S_q)
    out = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), attn_mask=mask,
                                         enable_gqa=k.shape[2] != q.shape[2])
    return out.transpose(1, 2)


def test_prefill_op_in_torch_compile(ops):
    q = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(2, 500, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)

    @torch.compile(fullgraph=True)
    def layer(q, k, v):
        out, lse = torch.ops.aotc.prefill(q, k, v, True, None)
        return out * 2.0, lse

    out, lse = layer(q, k, v)
    torch.cuda.synchronize()
    check_close(out / 2.0, sdpa(q, k, v, True), TOL, "torch.compile prefill")
    assert lse.shape == (2, 8, 300) and lse.dtype == torch.float32 and torch.isfinite(lse).all()


def test_prefill_op_in_cuda_graph_with_changed_inputs(ops):
    q = torch.randn(1, 256, 4, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 256, 4, 64, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    ops.prefill(q, k, v, causal=False)  # warm-up outside capture: loads the kernel, prepares the plan
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = ops.prefill(q, k, v, causal=False)
    for _ in range(2):
        q.copy_(torch.randn_like(q)), k.copy_(torch.randn_like(k)), v.copy_(torch.randn_like(v))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(out, sdpa(q, k, v, False), TOL, "graph replay prefill")


def test_decode_op_in_torch_compile_and_cuda_graph(ops):
    B, H_q, H_kv, D, page, L = 4, 32, 8, 128, 16, 1000
    n = math.ceil(L / page)
    k_cache = torch.randn(B * n, page, H_kv, D, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    page_table = torch.randperm(B * n, device="cuda", dtype=torch.int32).view(B, n)
    seqlens = torch.tensor([L, 1, 513, 700], dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda")
    ws = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")

    def reference():
        outs = []
        for b in range(B):
            pages = page_table[b].long()
            kd = k_cache[pages].reshape(-1, H_kv, D)[: int(seqlens[b])][None]
            vd = v_cache[pages].reshape(-1, H_kv, D)[: int(seqlens[b])][None]
            outs.append(sdpa(q[b:b + 1], kd, vd, True))
        return torch.cat(outs)

    @torch.compile(fullgraph=True)
    def step(q):
        out, _ = torch.ops.aotc.decode(q, k_cache, v_cache, seqlens, page_table, ws, "NHD", 4, None)
        return out

    out = step(q)
    torch.cuda.synchronize()
    check_close(out, reference(), TOL, "torch.compile decode")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, _ = ops.decode(q, k_cache, v_cache, seqlens, page_table, workspace=ws, chunks=4)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        seqlens.copy_(torch.randint(1, L + 1, (B,), dtype=torch.int32))
        g_out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(g_out, reference(), TOL, "graph replay decode")


def test_out_ops_write_caller_buffers_and_replay_in_a_graph(ops):
    """decode_out and prefill_out, as a serving backend calls them: into caller buffers, the plan's own
    decode workspace, captured once and replayed with new lengths."""
    B, H_q, H_kv, D, page = 6, 32, 8, 128, 16
    lengths = [4000, 1, 0, 17, 900, 33]
    n = max(math.ceil(L / page) for L in lengths) + 1
    k_cache = torch.randn(B * n, page, H_kv, D, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    page_table = torch.randperm(B * n, device="cuda", dtype=torch.int32).view(B, n)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(B, H_q, 1, device="cuda")

    def reference():
        outs = []
        for b in range(B):
            pages = page_table[b].long()
            kd = k_cache[pages].reshape(-1, H_kv, D)[: int(seqlens[b])][None]
            vd = v_cache[pages].reshape(-1, H_kv, D)[: int(seqlens[b])][None]
            outs.append(sdpa(q[b:b + 1], kd, vd, True) if int(seqlens[b]) else torch.zeros_like(q[b:b + 1]).float())
        return torch.cat(outs)

    torch.ops.aotc.decode_out(q, k_cache, v_cache, seqlens, page_table, out, lse)  # warm-up: prepares the plan
    torch.cuda.synchronize()
    check_close(out, reference(), TOL, "decode_out")
    assert torch.isinf(lse[2]).all() and (lse[2] < 0).all()  # the empty sequence
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.aotc.decode_out(q, k_cache, v_cache, seqlens, page_table, out, lse)
    for step in range(3):
        q.copy_(torch.randn_like(q))
        seqlens.copy_(torch.tensor([L + step for L in lengths[::-1]], dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(out, reference(), TOL, f"decode_out graph replay {step}")

    qp = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16, device="cuda")
    kp = torch.randn(2, 500, 2, 128, dtype=torch.bfloat16, device="cuda")
    vp = torch.randn_like(kp)
    op, lp = torch.full_like(qp, math.nan), torch.full((2, 8, 300), math.nan, device="cuda")
    torch.ops.aotc.prefill_out(qp, kp, vp, op, lp, True, None)
    torch.cuda.synchronize()
    check_close(op, sdpa(qp, kp, vp, True), TOL, "prefill_out")
    assert torch.isfinite(lp).all()


def test_the_python_functions_skip_the_dispatcher_where_nothing_must_see_the_op(ops, monkeypatch):
    """aotc.torch.kv_write and aotc.torch.attention on plain CUDA tensors run the ops' functions directly (the
    dispatcher's boxing was a sixth of the op's host cost): the same bytes as torch.ops.aotc.*, without reaching
    torch.ops.aotc (a stub that fails stands in for it); under a dispatch mode the mode sees the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import aotc.torch as aotc_torch

    H_q, H_kv, D, page = 8, 2, 128, 16
    q_lens, kv_lens = [5, 1, 40], [40, 17, 100]
    n = max(math.ceil(L / page) for L in kv_lens)
    pools = [torch.randn(len(kv_lens) * n, page, H_kv, D, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    page_table = torch.randperm(len(kv_lens) * n, device="cuda", dtype=torch.int32).view(len(kv_lens), n)
    cu = torch.tensor([0, 5, 6, 46], dtype=torch.int32, device="cuda")
    seqlens = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    total = cu[-1].item()
    q = torch.randn(total, H_q, D, dtype=torch.bfloat16, device="cuda")
    key, value = (torch.randn(total, H_kv, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    # each sequence's new tokens are its last q_lens[b] positions
    pos = torch.cat([torch.arange(L - s, L) for s, L in zip(q_lens, kv_lens)]).cuda()
    seq = torch.cat([torch.full((s,), b) for b, s in enumerate(q_lens)]).cuda()
    slots = (page_table[seq, pos // page].long() * page + pos % page)

    by_op = [p.clone() for p in pools]
    torch.ops.aotc.kv_write(key, value, by_op[0], by_op[1], slots, "NHD")
    out_op, lse_op = torch.full_like(q, math.nan), torch.full((H_q, total), math.nan, device="cuda")
    torch.ops.aotc.attention(q, by_op[0], by_op[1], cu, seqlens, page_table, out_op, lse_op)

    class Failing:
        def __getattr__(self, name):
            raise AssertionError(f"torch.ops.aotc.{name} reached: the call did not skip the dispatcher")

    direct = [p.clone() for p in pools]
    out, lse = torch.full_like(q, math.nan), torch.full((H_q, total), math.nan, device="cuda")
    with monkeypatch.context() as m:
        m.setattr(aotc_torch, "_ops", Failing())
        aotc_torch.kv_write(key, value, direct[0], direct[1], slots)
        aotc_torch.attention(q, direct[0], direct[1], cu, seqlens, page_table, out=out, lse=lse)
    torch.cuda.synchronize()
    assert torch.equal(direct[0], by_op[0]) and torch.equal(direct[1], by_op[1])
    assert torch.equal(out, out_op) and torch.equal(lse, lse_op) and not out.isnan().any()

    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Recording():
        aotc_torch.attention(q, direct[0], direct[1], cu, seqlens, page_table, out=out, lse=lse)
    assert "aotc.attention.default" in seen, seen
