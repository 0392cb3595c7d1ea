"""kv_write on the GPU: bitwise against a torch scatter of the same tokens, every other byte untouched.

Pools are poisoned with a NaN bit pattern (0x7FA5 in every 16-bit element: a NaN in fp16 and bf16) and
compared as int16 with a copy scattered by torch (index_put_ on int16 views: bitwise), so a wrong byte
anywhere in a pool fails, written or not. Slots are shuffled, with -1 and out-of-range ones (num_slots,
past it, 2^40, -2, -2^62) among them: the kernel skips those.
"""
from __future__ import annotations

import math

import pytest
import torch

from aotc.common.errors import ArgumentError
from paged_cases import pools_after_write

pytestmark = pytest.mark.gpu

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
POISON = 0x7FA5
PAGE_SIZES = (16, 32, 64, 128)
BAD_SLOTS = (-1, -1, -2, -(1 << 62), 1 << 40)  # and num_slots, num_slots + 7 (see slot_mapping())


def kv_variants(rt):
    vs = sorted({(k.variant["dtype"], k.variant["head_dim"]) for k in rt.kernels.get("kv_write", [])})
    assert vs, "the default bundle has no kv_write kernels"
    return vs


def pools(num_pages, page, H, D, dtype, layout, pad=0):
    """Poisoned K and V pools, NHD or HND; pad > 0: each pool a [..., :D] slice of rows D + pad long."""
    shape = (num_pages, page, H, D + pad) if layout == "NHD" else (num_pages, H, page, D + pad)
    out = []
    for _ in range(2):
        buf = torch.empty(shape, dtype=DT[dtype], device="cuda")
        buf.view(torch.int16).fill_(POISON)
        out.append(buf[..., :D])
    return out


def slot_mapping(tokens, num_slots, gen, bad_every=7):
    """Distinct shuffled slots for `tokens` tokens, every bad_every-th one (the first is always good) a slot
    the kernel must skip."""
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:tokens].clone()
    bad = torch.tensor([*BAD_SLOTS, num_slots, num_slots + 7], dtype=torch.int64, device="cuda")
    if bad_every:
        idx = torch.arange(bad_every - 1, max(tokens, bad_every - 1), bad_every, device="cuda")
        slots[idx] = bad[torch.arange(idx.numel(), device="cuda") % bad.numel()]
    return slots.to(torch.int64)


def reference(key, value, k_cache, v_cache, slots, layout):
    """The pools after the write, computed by torch on int16 views (bitwise); slots outside the pools skip."""
    return pools_after_write((k_cache, v_cache), (key.view(torch.int16), value.view(torch.int16)), slots, layout)


def snapshot(k_cache, v_cache):
    """The pools' bits now, to compare with after calls that must write nothing."""
    return [k_cache.clone().view(torch.int16), v_cache.clone().view(torch.int16)]


def assert_pools(k_cache, v_cache, want, what):
    for name, pool, w in (("k_cache", k_cache, want[0]), ("v_cache", v_cache, want[1])):
        got = pool.view(torch.int16)
        bad = got != w
        assert not bad.any(), f"{what}: {name} has {int(bad.sum())} wrong 16-bit elements"


def assert_padding_untouched(pool, D):
    """The pad columns of a [..., :D] pool slice (its base tensor's columns past D) still hold the poison."""
    base = pool._base if pool._base is not None else pool
    assert (base.view(torch.int16)[..., D:] == POISON).all(), "a pad column was written"


def new_tokens(rows, H, D, dtype, gen, qkv_heads=0, pad=0):
    """key, value [rows, H, D]: slices of a fused qkv [rows, qkv_heads + 2H, D + pad] when asked."""
    if qkv_heads or pad:
        qkv = torch.randn(rows, qkv_heads + 2 * H, D + pad, dtype=DT[dtype], device="cuda", generator=gen)
        return qkv[:, qkv_heads:qkv_heads + H, :D], qkv[:, qkv_heads + H:, :D]
    return (torch.randn(rows, H, D, dtype=DT[dtype], device="cuda", generator=gen),
            torch.randn(rows, H, D, dtype=DT[dtype], device="cuda", generator=gen))


def run_case(rt, dtype, D, layout, page, tokens, gen, H=4, extra_pages=3, qkv_heads=0, pad=0, pool_pad=0,
             rows=None, what=""):
    num_pages = max(1, -(-tokens // page)) + extra_pages
    k_cache, v_cache = pools(num_pages, page, H, D, dtype, layout, pool_pad)
    key, value = new_tokens(rows or tokens, H, D, dtype, gen, qkv_heads, pad)
    slots = slot_mapping(tokens, num_pages * page, gen)
    want = reference(key, value, k_cache, v_cache, slots, layout)
    rt.kv_write(key, value, k_cache, v_cache, slots, kv_layout=layout, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, what or f"{dtype} D{D} {layout} page {page} tokens {tokens}")
    if pool_pad:
        assert_padding_untouched(k_cache, D), assert_padding_untouched(v_cache, D)
    return key, value, k_cache, v_cache, slots


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_every_variant_layout_and_page_size(rt, layout):
    gen = torch.Generator(device="cuda").manual_seed(1 + (layout == "HND"))
    for dtype, D in kv_variants(rt):
        for page in PAGE_SIZES:
            for tokens in (1, 37, 300):
                run_case(rt, dtype, D, layout, page, tokens, gen)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_padded_inputs_and_pools(rt, layout):
    """key/value slices of a fused qkv projection (key = qkv[:, H_q:H_q + H_kv]), rows with a padded head
    dim, pools whose rows are padded (pad columns must stay untouched), a padded batch (rows past the
    slots never read)."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    for dtype, D in kv_variants(rt):
        run_case(rt, dtype, D, layout, 16, 129, gen, H=8, qkv_heads=32, what=f"qkv slice {dtype} D{D}")
        run_case(rt, dtype, D, layout, 64, 77, gen, H=2, pad=8, pool_pad=16, what=f"padded rows {dtype} D{D}")
        run_case(rt, dtype, D, layout, 32, 40, gen, rows=64, what=f"padded batch {dtype} D{D}")


def test_zero_and_one_token(rt):
    gen = torch.Generator(device="cuda").manual_seed(12)
    dtype, D = kv_variants(rt)[0]
    k_cache, v_cache = pools(4, 16, 2, D, dtype, "NHD")
    untouched = snapshot(k_cache, v_cache)
    key, value = new_tokens(5, 2, D, dtype, gen)
    empty = torch.empty(0, dtype=torch.int64, device="cuda")
    rt.kv_write(key, value, k_cache, v_cache, empty)  # no slots: nothing written
    rt.kv_write(key[:0], value[:0], k_cache, v_cache, empty)  # no tokens at all
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, untouched, "0 tokens")
    one = torch.tensor([37], dtype=torch.int64, device="cuda")
    want = reference(key[:1], value[:1], k_cache, v_cache, one, "NHD")
    rt.kv_write(key[:1], value[:1], k_cache, v_cache, one)
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, "1 token")
    skipped = torch.tensor([-1], dtype=torch.int64, device="cuda")
    rt.kv_write(key[1:2], value[1:2], k_cache, v_cache, skipped)
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, "1 token at slot -1")


def test_every_slot_out_of_range_writes_nothing(rt):
    gen = torch.Generator(device="cuda").manual_seed(13)
    for dtype, D in kv_variants(rt):
        k_cache, v_cache = pools(3, 16, 4, D, dtype, "HND")
        untouched = snapshot(k_cache, v_cache)
        key, value = new_tokens(64, 4, D, dtype, gen)
        n = 3 * 16
        slots = torch.tensor([-1, n, n + 1, -2, 1 << 40, -(1 << 63), (1 << 63) - 1, 16 * n] * 8, dtype=torch.int64,
                             device="cuda")
        rt.kv_write(key, value, k_cache, v_cache, slots, kv_layout="HND")
        torch.cuda.synchronize()
        assert_pools(k_cache, v_cache, untouched, f"bad slots {dtype} D{D}")


def test_large_token_counts_and_pools_beyond_int32(rt):
    """A prefill chunk of 65536 tokens over 8 heads into a pool of more than 2^31 elements, its tokens at
    the far end of the pool (Int64 offsets), then 262144 tokens at once."""
    gen = torch.Generator(device="cuda").manual_seed(14)
    dtype, D, H, page = "bf16", 128, 8, 16
    if (dtype, D) not in kv_variants(rt):
        dtype, D = kv_variants(rt)[-1]
    per_page = page * H * D
    num_pages = (1 << 31) // per_page + 4096 + 64  # the last 4096 pages lie wholly past element 2^31
    k_cache, v_cache = pools(num_pages, page, H, D, dtype, "NHD")
    assert k_cache.numel() > 1 << 31
    tokens = 65536
    key, value = new_tokens(tokens, H, D, dtype, gen)
    far = (num_pages - 4096) * page
    assert far * H * D > 1 << 31
    slots = (far + torch.randperm(4096 * page, device="cuda", generator=gen)[:tokens]).to(torch.int64)
    slots[::1000] = -1
    want = reference(key, value, k_cache, v_cache, slots, "NHD")
    rt.kv_write(key, value, k_cache, v_cache, slots)
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, "pool beyond 2^31 elements")
    del k_cache, v_cache, want
    torch.cuda.empty_cache()
    run_case(rt, dtype, D, "HND", 16, 262144, gen, H=8, extra_pages=1, what="262144 tokens")


def test_interleaved_kv_pools(rt):
    """K and V in one [pages, 2, page, H, D] buffer (k = kv[:, 0], v = kv[:, 1]): accepted, and each write
    lands in its own half."""
    gen = torch.Generator(device="cuda").manual_seed(15)
    for dtype, D in kv_variants(rt):
        for layout in ("NHD", "HND"):
            inner = (16, 4, D) if layout == "NHD" else (4, 16, D)
            kv = torch.empty(9, 2, *inner, dtype=DT[dtype], device="cuda")
            kv.view(torch.int16).fill_(POISON)
            k_cache, v_cache = kv[:, 0], kv[:, 1]
            key, value = new_tokens(100, 4, D, dtype, gen)
            slots = slot_mapping(100, 9 * 16, gen)
            want = reference(key, value, k_cache, v_cache, slots, layout)
            rt.kv_write(key, value, k_cache, v_cache, slots, kv_layout=layout)
            torch.cuda.synchronize()
            assert_pools(k_cache, v_cache, want, f"interleaved {layout} {dtype} D{D}")


def test_one_plan_serves_every_token_count(rt):
    """Runtime.kv_write keeps one plan per pool set and layout: steps of 256, 1, 8192, 0 and 77 tokens (new
    tensors each time, as an engine's steps) reuse it, torch fast path included."""
    gen = torch.Generator(device="cuda").manual_seed(16)
    dtype, D = kv_variants(rt)[0]
    k_cache, v_cache = pools(1024, 16, 8, D, dtype, "NHD")

    def kv_plans():
        return {id(p) for p in rt.plans.values() if getattr(p, "family", "") == "kv_write"}

    before = kv_plans()
    for tokens in (256, 1, 8192, 0, 77):
        key, value = new_tokens(tokens, 8, D, dtype, gen)
        slots = slot_mapping(tokens, 1024 * 16, gen)
        want = reference(key, value, k_cache, v_cache, slots, "NHD")
        rt.kv_write(key, value, k_cache, v_cache, slots, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert_pools(k_cache, v_cache, want, f"step of {tokens} tokens")
    assert len(kv_plans() - before) == 1


def test_prepared_plan_and_raw_pointers(rt):
    gen = torch.Generator(device="cuda").manual_seed(17)
    dtype, D = kv_variants(rt)[-1]
    k_cache, v_cache = pools(64, 32, 2, D, dtype, "HND")
    key, value = new_tokens(512, 2, D, dtype, gen, qkv_heads=4)
    slots = slot_mapping(512, 64 * 32, gen)
    plan = rt.prepare_kv_write(key, value, k_cache, v_cache, slots, kv_layout="HND")
    for n in (512, 3, 100):  # the tensors' first n tokens
        want = reference(key[:n], value[:n], k_cache, v_cache, slots[:n], "HND")
        plan(key, value, slots[:n], stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        assert_pools(k_cache, v_cache, want, f"plan call, {n} tokens")
    slots2 = slot_mapping(200, 64 * 32, gen, bad_every=3)
    want = reference(key[:200], value[:200], k_cache, v_cache, slots2, "HND")
    plan.run(key.data_ptr(), value.data_ptr(), slots2.data_ptr(), 200, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, "raw pointers")


def test_cuda_graph_replay_with_new_slots_and_tokens(rt):
    """Captured once (after a warm-up call prepared the plan), replayed with new slot_mapping contents
    (padding slots -1 included) and new key/value contents: every replay writes the new slots."""
    gen = torch.Generator(device="cuda").manual_seed(18)
    dtype, D = kv_variants(rt)[0]
    k_cache, v_cache = pools(256, 16, 8, D, dtype, "NHD")
    tokens = 256
    key, value = new_tokens(tokens, 8, D, dtype, gen, qkv_heads=32)
    slots = slot_mapping(tokens, 256 * 16, gen)
    plan = rt.prepare_kv_write(key, value, k_cache, v_cache, slots)
    plan(key, value, slots, stream=torch.cuda.current_stream())  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan(key, value, slots, stream=torch.cuda.current_stream())
    for step in range(3):
        key.copy_(torch.randn(key.shape, dtype=key.dtype, device="cuda", generator=gen))
        value.copy_(torch.randn(value.shape, dtype=value.dtype, device="cuda", generator=gen))
        slots.copy_(slot_mapping(tokens, 256 * 16, gen, bad_every=5 + step))
        want = reference(key, value, k_cache, v_cache, slots, "NHD")
        graph.replay()
        torch.cuda.synchronize()
        assert_pools(k_cache, v_cache, want, f"graph replay {step}")


@pytest.fixture(scope="module")
def ops(rt):
    import aotc.torch

    aotc.torch.set_runtime(rt)
    yield aotc.torch
    aotc.torch.set_runtime(None)


def test_torch_op_eager_compiled_and_in_a_graph(ops):
    gen = torch.Generator(device="cuda").manual_seed(19)
    dtype, D = "bf16", 128
    k_cache, v_cache = pools(128, 16, 8, D, dtype, "HND")
    qkv = torch.randn(300, 32 + 16, D, dtype=DT[dtype], device="cuda", generator=gen)
    key, value = qkv[:, 32:40], qkv[:, 40:]
    slots = slot_mapping(300, 128 * 16, gen)
    want = reference(key, value, k_cache, v_cache, slots, "HND")
    torch.ops.aotc.kv_write(key, value, k_cache, v_cache, slots, "HND")
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, "torch.ops.aotc.kv_write")

    @torch.compile(fullgraph=True)
    def layer(qkv, slots):
        ops.kv_write(qkv[:, 32:40], qkv[:, 40:], k_cache, v_cache, slots, kv_layout="HND")
        return qkv[:, :32].float().sum()

    qkv.copy_(torch.randn(qkv.shape, dtype=qkv.dtype, device="cuda", generator=gen))
    slots = slot_mapping(300, 128 * 16, gen)
    want = reference(key, value, k_cache, v_cache, slots, "HND")
    layer(qkv, slots)
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, want, "torch.compile kv_write")

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.aotc.kv_write(key, value, k_cache, v_cache, slots, "HND")
    for step in range(2):
        qkv.copy_(torch.randn(qkv.shape, dtype=qkv.dtype, device="cuda", generator=gen))
        slots.copy_(slot_mapping(300, 128 * 16, gen, bad_every=4))
        want = reference(key, value, k_cache, v_cache, slots, "HND")
        graph.replay()
        torch.cuda.synchronize()
        assert_pools(k_cache, v_cache, want, f"graph replay of the op {step}")


def test_bad_arguments_are_refused_before_any_launch(rt):
    gen = torch.Generator(device="cuda").manual_seed(20)
    dtype, D = kv_variants(rt)[0]
    k_cache, v_cache = pools(8, 16, 2, D, dtype, "NHD")
    untouched = snapshot(k_cache, v_cache)
    key, value = new_tokens(10, 2, D, dtype, gen)
    slots = torch.arange(10, dtype=torch.int64, device="cuda")
    flat = torch.empty(10 * 2 * D + 8, dtype=DT[dtype], device="cuda")
    misaligned = flat[1:1 + 10 * 2 * D].view(10, 2, D)  # 2 bytes off a 16-byte boundary
    in_pool = k_cache.view(-1)[: 10 * 2 * D].view(10, 2, D)
    odd_page = torch.empty(8, 24, 2, D, dtype=DT[dtype], device="cuda")
    cases = [
        (lambda: rt.kv_write(key.float(), value.float(), k_cache, v_cache, slots), "key.dtype"),
        (lambda: rt.kv_write(key, value.to(torch.float16 if dtype == "bf16" else torch.bfloat16), k_cache, v_cache,
                             slots), "value.dtype"),
        (lambda: rt.kv_write(key, value, k_cache, v_cache, slots.int()), "slot_mapping.dtype"),
        (lambda: rt.kv_write(key, value, k_cache, v_cache, slots.cpu()), "slot_mapping.device"),
        (lambda: rt.kv_write(key, value[:9], k_cache, v_cache, slots), "value.shape[0]"),
        (lambda: rt.kv_write(key, value, k_cache, v_cache, torch.arange(11, dtype=torch.int64, device="cuda")),
         "slot_mapping.shape[0]"),
        (lambda: rt.kv_write(key, value, k_cache, v_cache, torch.arange(20, dtype=torch.int64, device="cuda")[::2]),
         "slot_mapping.stride[0]"),
        (lambda: rt.kv_write(misaligned, value, k_cache, v_cache, slots), "key.data_ptr"),
        (lambda: rt.kv_write(in_pool, value, k_cache, v_cache, slots), "k_cache"),
        (lambda: rt.kv_write(key, value, k_cache, k_cache, slots), "v_cache"),
        (lambda: rt.kv_write(key, value, k_cache, v_cache, slots, kv_layout="BHSD"), "kv_layout"),
        (lambda: rt.kv_write(key, value, odd_page, odd_page.clone(), slots), "k_cache.shape[1]"),
        (lambda: rt.kv_write(key, value, k_cache, v_cache, slots, kv_layout="HND"), "k_cache.shape[2]"),
    ]
    for call, name in cases:
        with pytest.raises(ArgumentError) as ei:
            call()
        assert ei.value.name == name, (name, str(ei.value))
    # the fast path of a prepared layout still checks the per-call pointers and rows
    rt.kv_write(key, value, k_cache, v_cache, torch.full((10,), -1, dtype=torch.int64, device="cuda"))
    for call, name in [(lambda: rt.kv_write(in_pool, value, k_cache, v_cache, slots), "key"),
                       (lambda: rt.kv_write(key, value[:9], k_cache, v_cache, slots[:9]), "value.shape[0]")]:
        with pytest.raises(ArgumentError) as ei:
            call()
        assert ei.value.name == name, (name, str(ei.value))
    torch.cuda.synchronize()
    assert_pools(k_cache, v_cache, untouched, "refused calls")
    assert math.isnan(float(k_cache.view(-1)[0]))  # the poison is a NaN (and still there)
