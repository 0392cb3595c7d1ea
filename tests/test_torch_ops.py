"""aotc.torch on the CPU: op registration, fake (meta) implementations, opcheck, torch.compile tracing.

The real kernels need a GPU (tests/gpu/ runs them); here the ops launch through a
torch reference "runtime" (set_runtime accepts any object with the Runtime's
methods), which is enough for torch.library.opcheck to compare the fake
implementations against real outputs and for torch.compile to run end to end.
Skipped where torch is not installed (CI installs no torch).
"""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "register_fake"):
    pytest.skip("aotc.torch needs torch >= 2.4", allow_module_level=True)

import aotc.torch as aotc_torch  # noqa: E402
from conftest import aotc_env  # noqa: E402


# ---- a torch reference with the Runtime's interface (CPU) -----------------------------------------
def _attend(q, k, v, scale, allowed):
    """q [S_q, H_q, D], k/v [S_kv, H_kv, D], allowed [S_q, S_kv] bool -> (out [S_q, H_q, D] f32, lse [H_q, S_q])."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v), lse


def _bottom_right(s_q, s_kv, causal):
    i = torch.arange(s_q)[:, None]
    j = torch.arange(s_kv)[None, :]
    return (j <= i + (s_kv - s_q)) if causal else torch.ones(s_q, s_kv, dtype=torch.bool)


class Reference:
    """What aotc.runtime.Runtime does, in torch math (records each call, and the score features it was given:
    their math is the GPU suite's, tests/gpu/test_features.py)."""

    def __init__(self):
        self.calls = []
        self.features = []

    def prefill(self, q, k, v, out, lse=None, *, causal=False, softmax_scale=None, stream=None, **features):
        self.calls.append(("prefill", stream))
        self.features.append(features)
        scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
        for b in range(q.shape[0]):
            o, l = _attend(q[b], k[b], v[b], scale, _bottom_right(q.shape[1], k.shape[1], causal))
            out[b].copy_(o)
            if lse is not None:
                lse[b].copy_(l)

    def prefill_ragged(self, q, k, v, out, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, lse=None, *,
                       causal=False, softmax_scale=None, stream=None, **features):
        self.calls.append(("prefill_ragged", stream))
        self.features.append(features)
        scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_kv.tolist()
        for b in range(len(cq) - 1):
            qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            o, l = _attend(q[qs], k[ks], v[ks], scale, _bottom_right(cq[b + 1] - cq[b], ck[b + 1] - ck[b], causal))
            out[qs].copy_(o)
            if lse is not None:
                lse[:, qs].copy_(l)

    def decode_workspace_bytes(self, batch, seqlen_q, heads_q, head_dim, chunks):
        return 0 if chunks <= 1 else (chunks + batch) * seqlen_q * heads_q * (head_dim + 1) * 4

    def decode(self, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *, max_seqlen_kv=None,
               kv_layout="NHD", chunks=None, workspace=None, softmax_scale=None, stream=None, **features):
        self.calls.append(("decode", stream, chunks, None if workspace is None else workspace.numel()))
        self.features.append(features)
        if workspace is not None:
            workspace.zero_()  # the kernel writes its partials there
        scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
        s_q = q.shape[1]
        for b in range(q.shape[0]):
            n = int(seqlens_kv[b])
            if page_table is None:
                k, v = k_cache[b, :n], v_cache[b, :n]
            else:
                page = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
                t = torch.arange(n)
                pages = page_table[b, t // page].long()
                if kv_layout == "NHD":
                    k, v = k_cache[pages, t % page], v_cache[pages, t % page]
                else:
                    k, v = k_cache[pages, :, t % page], v_cache[pages, :, t % page]
            allowed = torch.arange(n)[None, :] <= (n - s_q + torch.arange(s_q))[:, None]
            o, l = _attend(q[b], k, v, scale, allowed)
            out[b].copy_(o)
            if lse is not None:
                lse[b].copy_(l)


    def kv_write(self, key, value, k_cache, v_cache, slot_mapping, *, kv_layout="NHD", stream=None, k_scale=None,
                 v_scale=None):
        assert k_scale is None and v_scale is None, "the reference copies 16-bit pools"  # (fp8: the GPU suite)
        self.calls.append(("kv_write", stream, kv_layout))
        page = k_cache.shape[1] if kv_layout == "NHD" else k_cache.shape[2]
        slots = slot_mapping.long()
        rows = torch.nonzero((slots >= 0) & (slots < k_cache.shape[0] * page)).flatten()
        pages, offs = slots[rows] // page, slots[rows] % page
        for pool, new in ((k_cache, key), (v_cache, value)):
            if kv_layout == "NHD":
                pool[pages, offs] = new[rows]
            else:
                pool[pages, :, offs] = new[rows]


@pytest.fixture
def ref():
    r = Reference()
    aotc_torch.set_runtime(r)
    yield r
    aotc_torch.set_runtime(None)


def dense(b=2, s_q=5, s_kv=7, h_q=4, h_kv=2, d=64, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, d, generator=g).to(dtype)
    k = torch.randn(b, s_kv, h_kv, d, generator=g).to(dtype)
    v = torch.randn(b, s_kv, h_kv, d, generator=g).to(dtype)
    return q, k, v


def paged(b=2, s_q=1, h_q=4, h_kv=2, d=64, page=16, pages=8, layout="NHD", seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, d, generator=g)
    shape = (pages, page, h_kv, d) if layout == "NHD" else (pages, h_kv, page, d)
    k, v = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    page_table = torch.randperm(pages, generator=g)[: b * 3].reshape(b, 3).to(torch.int32)
    seqlens = torch.tensor([37, 20][:b], dtype=torch.int32)
    return q, k, v, seqlens, page_table


# ---- registration and import discipline ----------------------------------------------------------
def test_importing_aotc_torch_does_not_import_torch():
    code = ("import sys, aotc.torch, aotc.runtime\n"
            "assert 'torch' not in sys.modules, 'aotc.torch imported torch'\n"
            "import torch\n"
            "aotc.torch.register()\n"
            "print(torch.ops.aotc.prefill.default._schema)\n")
    r = subprocess.run([sys.executable, "-c", code], env=aotc_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("aotc::prefill(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, "
                                       "int? window_left=None, float? softcap=None, Tensor? sinks=None)")


def test_ops_are_registered_with_their_schemas():
    aotc_torch.register()
    aotc_torch.register()  # idempotent
    for name, schema in aotc_torch.SCHEMAS.items():
        op = getattr(torch.ops.aotc, name).default
        assert str(op._schema) == f"aotc::{name}{schema}"
    assert torch.ops.aotc.decode.default._schema.arguments[5].alias_info.is_write  # workspace is written
    written = {a.name for a in torch.ops.aotc.decode_out.default._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"out", "lse", "workspace"}  # the caller's buffers are declared mutated
    assert {a.name for a in torch.ops.aotc.prefill_out.default._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write} == {"out", "lse"}
    kv = torch.ops.aotc.kv_write.default._schema
    assert {a.name for a in kv.arguments if a.alias_info is not None and a.alias_info.is_write} == {"k_cache", "v_cache"}
    assert [a.name for a in kv.arguments] == ["key", "value", "k_cache", "v_cache", "slot_mapping", "kv_layout",
                                              "k_scale", "v_scale"]
    assert kv.arguments[5].default_value == "NHD" and not kv.returns
    assert [a.name for a in torch.ops.aotc.decode.default._schema.arguments][-2:] == ["k_descale", "v_descale"]


# ---- fake implementations --------------------------------------------------------------------------
def test_fake_shapes_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(3, 9, 8, 128, dtype=torch.bfloat16)
        k = torch.empty(3, 33, 2, 128, dtype=torch.bfloat16)
        out, lse = torch.ops.aotc.prefill(q, k, k, True, None)
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (3, 8, 9), torch.float32)
        assert out.is_contiguous() and lse.is_contiguous()
        qr, kr = torch.empty(20, 8, 64, dtype=torch.float16), torch.empty(30, 2, 64, dtype=torch.float16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse = torch.ops.aotc.prefill_varlen(qr, kr, kr, cu, cu, 9, 12, False, None)
        assert (out.shape, out.dtype, lse.shape) == (qr.shape, torch.float16, (8, 20))
        qd = torch.empty(4, 2, 8, 128, dtype=torch.float16)
        kc = torch.empty(64, 16, 2, 128, dtype=torch.float16)
        out, lse = aotc_torch.decode(qd, kc, kc, torch.empty(4, dtype=torch.int32),
                                     torch.empty(4, 16, dtype=torch.int32))
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == (qd.shape, torch.float16, (4, 8, 2), torch.float32)


def kv_problem(layout="NHD", tokens=9, rows=None, h_kv=2, d=64, page=16, pages=4, dtype=torch.float16, seed=3):
    """key/value [rows, H_kv, D] as slices of a fused qkv, NaN-poisoned pools, shuffled slots with a -1 and
    an out-of-range one among them."""
    g = torch.Generator().manual_seed(seed)
    rows = tokens if rows is None else rows
    qkv = torch.randn(rows, 4 + 2 * h_kv, d, generator=g).to(dtype)
    key, value = qkv[:, 4:4 + h_kv], qkv[:, 4 + h_kv:]
    shape = (pages, page, h_kv, d) if layout == "NHD" else (pages, h_kv, page, d)
    k_cache, v_cache = torch.full(shape, math.nan, dtype=dtype), torch.full(shape, math.nan, dtype=dtype)
    slots = torch.randperm(pages * page, generator=g)[:tokens]
    if tokens >= 3:
        slots[1], slots[-1] = -1, pages * page + 5
    return key, value, k_cache, v_cache, slots.to(torch.int64)


def test_fake_kv_write_under_fake_tensor_mode_and_meta():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        key = torch.empty(5, 2, 128, dtype=torch.bfloat16)
        pool = torch.empty(8, 16, 2, 128, dtype=torch.bfloat16)
        assert aotc_torch.kv_write(key, key, pool, pool.clone(), torch.empty(5, dtype=torch.int64)) is None
    key = torch.empty(5, 2, 128, device="meta", dtype=torch.float16)
    pool = torch.empty(8, 2, 16, 128, device="meta", dtype=torch.float16)
    assert torch.ops.aotc.kv_write(key, key, pool, pool, torch.empty(5, device="meta", dtype=torch.int64), "HND") is None


def test_fake_implementations_on_meta_tensors():
    q = torch.empty(2, 5, 4, 64, device="meta", dtype=torch.float16)
    out, lse = aotc_torch.prefill(q, q, q)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (2, 4, 5)
    with pytest.raises(ValueError, match=r"q must be q \[B, S_q, H_q, D\]"):
        aotc_torch.prefill(q[0], q[0], q[0])


# ---- opcheck: schema, fake vs real, autograd registration, AOT dispatch ---------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_prefill(ref, causal):
    q, k, v = dense()
    torch.library.opcheck(torch.ops.aotc.prefill.default, (q, k, v, causal, None))
    torch.library.opcheck(torch.ops.aotc.prefill.default, (q, k, v, causal, 0.3))


def test_opcheck_prefill_varlen(ref):
    q, k, v = dense(b=1, s_q=9, s_kv=12)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    torch.library.opcheck(torch.ops.aotc.prefill_varlen.default, (q[0], k[0], v[0], cu_q, cu_k, 5, 7, True, None))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_opcheck_decode(ref, layout):
    q, k, v, seqlens, pt = paged(layout=layout)
    torch.library.opcheck(torch.ops.aotc.decode.default, (q, k, v, seqlens, pt, None, layout, None, None))
    ws = torch.zeros(ref.decode_workspace_bytes(2, 1, 4, 64, 2), dtype=torch.uint8)
    torch.library.opcheck(torch.ops.aotc.decode.default, (q, k, v, seqlens, pt, ws, layout, 2, None))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 1)
    torch.library.opcheck(torch.ops.aotc.decode_out.default, (q, k, v, seqlens, pt, out, lse, ws, layout, 2, None))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_opcheck_kv_write(ref, layout):
    key, value, k_cache, v_cache, slots = kv_problem(layout)
    k_cache, v_cache = k_cache.zero_(), v_cache.zero_()  # opcheck compares outputs: no NaN
    torch.library.opcheck(torch.ops.aotc.kv_write.default, (key, value, k_cache, v_cache, slots, layout))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_kv_write_op_writes_exactly_the_slots(ref, layout):
    key, value, k_cache, v_cache, slots = kv_problem(layout, tokens=9, rows=12)
    aotc_torch.kv_write(key, value, k_cache, v_cache, slots, kv_layout=layout)
    assert ref.calls[-1] == ("kv_write", None, layout)
    page, n_slots = 16, k_cache.shape[0] * 16
    written = torch.zeros(n_slots, dtype=torch.bool)
    for i, slot in enumerate(slots.tolist()):
        if not 0 <= slot < n_slots:
            continue  # -1 and past the pools: skipped
        written[slot] = True
        p, o = divmod(slot, page)
        for pool, new in ((k_cache, key), (v_cache, value)):
            got = pool[p, o] if layout == "NHD" else pool[p, :, o]
            assert torch.equal(got.view(torch.int16), new[i].view(torch.int16))
    for pool in (k_cache, v_cache):
        per_slot = pool.transpose(1, 2) if layout == "HND" else pool
        assert torch.isnan(per_slot.reshape(n_slots, -1)[~written]).all(), "a byte outside the slots was written"
    assert int(written.sum()) == 7  # 9 tokens, one -1 and one past the pools; rows 9..11 never read


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_out_variants(ref, causal):
    q, k, v = dense()
    out, lse = torch.empty_like(q), torch.empty(2, 4, 5)
    torch.library.opcheck(torch.ops.aotc.prefill_out.default, (q, k, v, out, lse, causal, None))
    torch.library.opcheck(torch.ops.aotc.prefill_out.default, (q, k, v, out, None, causal, 0.2))
    q, k, v = dense(b=1, s_q=9, s_kv=12)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    out, lse = torch.empty_like(q[0]), torch.empty(4, 9)
    torch.library.opcheck(torch.ops.aotc.prefill_varlen_out.default,
                          (q[0], k[0], v[0], cu_q, cu_k, 5, 7, out, lse, causal, None))


def test_out_variants_write_the_callers_buffers(ref):
    q, k, v = dense(s_q=6, s_kv=9)
    want_out, want_lse = aotc_torch.prefill(q, k, v, causal=True)
    out, lse = torch.full_like(q, math.nan), torch.full((2, 4, 6), math.nan)
    got = aotc_torch.prefill(q, k, v, causal=True, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    qd, kc, vc, seqlens, pt = paged()
    want_out, want_lse = aotc_torch.decode(qd, kc, vc, seqlens, pt)
    out, lse = torch.full_like(qd, math.nan), torch.full((2, 4, 1), math.nan)
    aotc_torch.decode(qd, kc, vc, seqlens, pt, out=out, lse=lse)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_the_ops_pass_the_score_features_to_the_runtime(ref):
    """window_left, softcap and sinks reach the runtime from every op (None when left out)."""
    sinks = torch.zeros(4)
    off = {"window_left": None, "softcap": None, "sinks": None}
    q, k, v = dense(s_q=6, s_kv=9)
    aotc_torch.prefill(q, k, v, causal=True)
    assert ref.features[-1] == off
    aotc_torch.prefill(q, k, v, causal=True, window_left=3, softcap=30.0, sinks=sinks)
    got = ref.features[-1]
    assert (got["window_left"], got["softcap"]) == (3, 30.0) and got["sinks"] is sinks
    out, lse = torch.empty_like(q), torch.empty(2, 4, 6)
    torch.ops.aotc.prefill_out(q, k, v, out, lse, True, None, 5, None, sinks)
    assert ref.features[-1]["window_left"] == 5 and ref.features[-1]["sinks"] is sinks
    qd, kc, vc, seqlens, pt = paged()
    aotc_torch.decode(qd, kc, vc, seqlens, pt, window_left=127, softcap=50.0)
    assert ref.features[-1] == {"window_left": 127, "softcap": 50.0, "sinks": None, "k_descale": None,
                                "v_descale": None}
    scales = torch.ones(2), torch.ones(2)  # an fp8 cache's scales reach the runtime too
    aotc_torch.decode(qd, kc, vc, seqlens, pt, k_descale=scales[0], v_descale=scales[1])
    assert ref.features[-1]["k_descale"] is scales[0] and ref.features[-1]["v_descale"] is scales[1]


def test_ops_compute_what_the_runtime_computes(ref):
    q, k, v = dense(s_q=7, s_kv=5)
    out, lse = aotc_torch.prefill(q, k, v, causal=True)
    exp_out, exp_lse = torch.empty_like(q), torch.empty(2, 4, 7)
    Reference().prefill(q, k, v, exp_out, exp_lse, causal=True)
    assert torch.equal(out, exp_out) and torch.equal(lse, exp_lse)
    assert torch.isinf(lse[:, :, :2]).all() and (out[:, :2] == 0).all()  # S_q > S_kv: first queries see nothing
    assert ref.calls[-1] == ("prefill", None)  # CPU tensors: no stream
    # against torch's own SDPA where the masks agree (non-causal)
    q, k, v = dense(h_kv=4)
    out, _ = aotc_torch.prefill(q, k, v)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    torch.testing.assert_close(out, sdpa.transpose(1, 2))
    # decode: the op allocates no workspace (a CUDA plan has its own); a caller's one reaches the runtime
    qd, kc, vc, seqlens, pt = paged()
    out, lse = aotc_torch.decode(qd, kc, vc, seqlens, pt, chunks=3)
    assert ref.calls[-1] == ("decode", None, 3, None)
    assert out.shape == qd.shape and torch.isfinite(lse).all()
    ws = torch.zeros(ref.decode_workspace_bytes(2, 1, 4, 64, 3), dtype=torch.uint8)
    aotc_torch.decode(qd, kc, vc, seqlens, pt, chunks=3, workspace=ws)
    assert ref.calls[-1] == ("decode", None, 3, ws.numel())


# ---- torch.compile -----------------------------------------------------------------------------------
def _attention_block(q, k, v, kc, vc, seqlens, pt):
    out, lse = torch.ops.aotc.prefill(q, k, v, True, None)
    kv_new = k[:, -1].contiguous()  # the last token of each sequence, written at slot 16 * b + 3
    slots = torch.arange(kv_new.shape[0], dtype=torch.int64) * 16 + 3
    torch.ops.aotc.kv_write(kv_new, kv_new, kc, vc, slots, "NHD")
    dec, dlse = aotc_torch.decode(q[:, -1:], kc, vc, seqlens, pt)
    return out * 2 + 1, lse.exp().sum(-1), dec.sum(), dlse


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_aot_eager(ref, dynamic):
    torch._dynamo.reset()
    q, k, v = dense()
    _, kc, vc, seqlens, pt = paged()
    compiled = torch.compile(_attention_block, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    got = compiled(q, k, v, kc, vc, seqlens, pt)
    want = _attention_block(q, k, v, kc, vc, seqlens, pt)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # another shape: recompiles (static) or reuses the dynamic graph; the fake impls give the new shapes
    q2, k2, v2 = dense(b=1, s_q=3, s_kv=11)
    got = compiled(q2, k2, v2, kc, vc, seqlens[:1], pt[:1])
    assert got[0].shape == q2.shape and got[1].shape == (1, 4)


def test_torch_compile_traces_with_meta_tensors():
    torch._dynamo.reset()

    def f(q, k, v):
        out, lse = torch.ops.aotc.prefill(q, k, v, False, 0.125)
        return out.float() + lse.transpose(1, 2)[..., None]

    q = torch.empty(2, 5, 4, 64, device="meta", dtype=torch.bfloat16)
    got = torch.compile(f, fullgraph=True, backend="eager")(q, q, q)
    assert got.shape == q.shape and got.dtype == torch.float32 and got.device.type == "meta"


def test_graph_has_the_custom_ops_and_no_breaks(ref):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    q, k, v = dense()
    _, kc, vc, seqlens, pt = paged()
    torch.compile(_attention_block, fullgraph=True, backend=counter)(q, k, v, kc, vc, seqlens, pt)
    assert counter.frame_count == 1
    targets = {str(n.target) for gm in counter.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert {"aotc.prefill", "aotc.decode"} <= {t.removesuffix(".default") for t in targets}, targets
    assert "aotc.kv_write" in targets, targets  # the in-place op traced into the graph, no break


# ---- the module-level runtime ------------------------------------------------------------------------
def test_get_runtime_loads_aotc_load_once(tmp_path, monkeypatch, fake_artifact):
    pytest.importorskip("cutlass")  # real cubins
    from aotc.storage.bundle import write_bundle

    arts = [fake_artifact("a"), fake_artifact("b")]
    write_bundle(tmp_path / "x.aotc", arts)
    monkeypatch.setenv("AOTC_BUNDLE_PATH", str(tmp_path))
    aotc_torch.set_runtime(None)
    try:
        rt = aotc_torch.get_runtime()
        assert rt is aotc_torch.get_runtime()
        assert sorted(k.variant.name for k in rt.kernels["sdpa_combine"]) == sorted(a.variant.name for a in arts)
        aotc_torch.set_runtime(tmp_path / "x.aotc")
        assert aotc_torch.get_runtime() is not rt and aotc_torch.get_runtime().sources == [str(tmp_path / "x.aotc")]
    finally:
        aotc_torch.set_runtime(None)


def test_the_readme_lists_every_op_schema_as_registered():
    """README's schema table is SCHEMAS, row for row (it went stale once when the attention ops grew)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `aotc::")]
    assert rows == [f"| `aotc::{name}` | `{schema}` |" for name, schema in aotc_torch.SCHEMAS.items()]
