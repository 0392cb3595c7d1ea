"""Paged varlen attention: rt.attention (one call for a batch of decode rows and prefill chunks over a paged
KV cache) beside aotc's own ragged-prefill and decode families and FlashAttention-3, in one process.

    python benchmarks/bench_paged_varlen.py --bundle artifacts/default.aotc --fa3 --out DIR [--quick]
        [--fp8] [--model llama|gpt-oss|gpt-oss-sliding|gemma2-27b] [--baseline-bundle OTHER.aotc ...]

bf16, pages of 16 tokens (NHD, page ids shuffled through the pool), causal aligned bottom-right, the attention
shape of --model (MODELS): llama (default; D 128, H_q/H_kv 32/8, Llama 3 8B's), gpt-oss (D 64, H_q/H_kv 64/8,
a learned sink per query head: gpt-oss-120b's full-attention layers), gpt-oss-sliding (the same with its
128-token window, window_left 127: its other layers) or gemma2-27b (D 128, H_q/H_kv 32/16, logits soft-cap 50:
Gemma 2 27B's global layers). Every aotc call, and the reference, gets the model's window, sinks (seeded
per-head sinks, N(0, 2^2)) and soft-cap; FA3 gets the soft-cap too. aotc's calls pass the bounds an engine has
on the host (max_seqlen_q, max_seqlen_kv, min_seqlen_q: the row's "bounds"). Each contender is a CUDA graph of
10 calls, the L2 flushed before every replay, the clocks settled on it first, the contenders interleaved in
rotated order for --rounds rounds (benchmarks/timing.py);
*_us is the median over rounds, *_spread (max - min) / median. Cases (CASES):

* chunk2048_prefix{0,8192,30720}: B 1, 2048 new tokens over a prefix already in the cache (s_kv = prefix +
  2048); chunks4x512_prefix0-8192 and chunks8x256_prefix0-14336_rising: the chunks of several requests in one
  step, each over a prefix of its own (4 x 512 tokens over 0, 3584, 8192 and 1024 keys; 8 x 256 over 0, 2048,
  ..., 14336, the longest last). aotc_tflops = 4 * D * H_q * (the keys each query row sees, summed) / time; the same FLOPs over the
  time of aotc's ragged prefill on the sequence's K/V packed contiguously (rt.prefill_ragged: dense_tflops)
  and of FA3's flash_attn_varlen_func on those packed K/V (fa3_tflops); x_dense, x_fa3 = aotc's rate over theirs.
* suffix128_prefix30720 and suffixes4x64_prefix8192-30720: a prefix-cache hit (a new chat turn, a chunked
  prefill's last chunk): 128 new tokens over 30720 cached, and four requests of 64 over 30720, 8192, 16384 and
  24576; fewer GQA-packed tiles than SMs, so the paged kernel splits each tile's kv blocks (nosplit_us: the same
  call with its splits off), against FA3 as in the chunk rows and with its own split heuristic (fa3_splits_us:
  num_splits=0, what vLLM's FA3 backend asks for).
* mixed_chunk2048_decode63x4096: one 2048-token chunk (prefix 0) and 63 decode rows at 4096 keys in one
  rt.attention call (aotc_us) against FA3 as two calls timed together (fa3_us: flash_attn_varlen_func for
  the chunk, flash_attn_with_kvcache for the 63 rows on dense KV [63, 4096, 8, 128] with cache_seqlens) and
  aotc as two calls (two_calls_us: rt.prefill_ragged for the chunk, rt.decode for the rows); side_us: the same
  call with the prefill_sms that Runtime.step_prefill_sms gives for the step's lengths (side_prefill_sms; no
  side_us where it gives None), x_fa3_side = fa3_us / side_us.
* decode_b64_4096: 64 sequences of one new token over 4096 keys through rt.attention (aotc_us, aotc_TBps =
  K/V bytes / time) against the decode family on the same pools (rt.decode, q viewed [B, 1, H_q, D]:
  decode_us) and FA3's flash_attn_with_kvcache on dense KV [64, 4096, 8, 128] (fa3_us).

FA3's wheel has neither sinks nor local attention: for a model with a window it is left out; for one with
sinks it runs the same shape without them (fa3_max_abs_err is then against the reference without sinks, and
the row says so in fa3_note), a speed anchor for the shape rather than the same function.

With --fp8, every case also times fp8: the same rt.attention call over the pools quantized to e4m3 (per-head
scales amax / 448: the kv_dtype fp8_e4m3 kernels), x_fp8 = fp8_us / aotc_us; its error is against the
unquantized reference, so it holds the quantization's own error.

x_<name> = <name>_us / aotc_us everywhere (above 1: aotc is faster). Every row has an A/A control: a second
aotc plan on the same inputs, timed in the same rounds (aa_us, x_aa: how far two identical contenders land
apart). Every contender's output is checked once against torch's math in fp32 (SDPA on each sequence's
K/V gathered from the pool, KV heads repeated, bottom-right mask): <name>_max_abs_err.

Host rows (kind "host"): a decode step of B 8 over 4096 keys, each call timed alone (perf_counter_ns, the GPU
synchronized every 256 calls outside the timer, as benchmarks/bench_host.py does), median and p99 of --calls
calls: torch.ops.aotc.attention with caller buffers, Runtime.attention, the prepared plan, beside
torch.ops.aotc.decode_out, FA3's flash_attn_with_kvcache and torch SDPA (cuDNN) on the dense equivalent.
The host rows run for llama only. Writes paged_varlen.json (paged_varlen_<model>.json for the others;
header: git_commit, date, gpu, clocks, torch, command, shape; rows).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import graph_time, interleaved, medians  # noqa: E402

PAGE = 16
CHUNK = 2048


class Model(NamedTuple):
    """The attention shape and score features of a model's layer, as bench rows run it."""
    name: str
    head_dim: int
    heads_q: int
    heads_kv: int
    window_left: int | None = None  # keys a row sees to its left (vLLM: sliding_window - 1)
    sinks: bool = False  # one learned logit per query head in every row's softmax denominator
    softcap: float | None = None  # logits soft-cap c: a score s becomes c * tanh(s / c)


MODELS = {m.name: m for m in (
    Model("llama", 128, 32, 8),
    Model("gpt-oss", 64, 64, 8, sinks=True),
    Model("gpt-oss-sliding", 64, 64, 8, window_left=127, sinks=True),
    Model("gemma2-27b", 128, 32, 16, softcap=50.0),  # its global layers (the others add a 4096 window)
)}


class Case(NamedTuple):
    name: str
    kind: str  # "chunk", "mixed" or "decode": which contenders run and which rates the row gets
    seqs: tuple  # ((s_q, s_kv), ...): new tokens and the full KV length (new tokens included) per sequence


def chunk_case(prefix: int) -> Case:
    return Case(f"chunk{CHUNK}_prefix{prefix}", "chunk", ((CHUNK, prefix + CHUNK),))


CASES = (
    chunk_case(0),
    chunk_case(8192),
    chunk_case(30720),
    # chunks of several requests over unequal prefixes in one step: tiles that cost up to 17x one another
    Case("chunks4x512_prefix0-8192", "chunk", ((512, 512), (512, 4096), (512, 8704), (512, 1536))),
    Case("chunks8x256_prefix0-14336_rising", "chunk", tuple((256, 256 + 2048 * i) for i in range(8))),
    # a prefix-cache hit: a short suffix over a long cached context (a new chat turn; a chunked prefill's last
    # chunk): 32 GQA-packed tiles, far fewer than the SMs, each a whole context long
    Case("suffix128_prefix30720", "chunk", ((128, 128 + 30720),)),
    Case("suffixes4x64_prefix8192-30720", "chunk", tuple((64, 64 + p) for p in (30720, 8192, 16384, 24576))),
    Case(f"mixed_chunk{CHUNK}_decode63x4096", "mixed", ((CHUNK, CHUNK),) + ((1, 4096),) * 63),
    Case("decode_b64_4096", "decode", ((1, 4096),) * 64),
)
QUICK_SKIPS = ("chunk2048_prefix8192",)
HOST_SEQS = ((1, 4096),) * 8  # the host rows' decode step


# ---- pure Python: FLOPs, bytes, metadata ---------------------------------------------------------------
def visible_keys(s_q: int, s_kv: int, causal: bool = True, window_left: int | None = None) -> int:
    """Keys the s_q query rows of a sequence see, summed over its rows. Causal (bottom-right): row i, at
    position p = i + s_kv - s_q, sees key j iff j < s_kv and j <= p (and p - window_left <= j with a window), so
    the last n = min(s_q, s_kv) rows see s_kv - n + 1, ..., s_kv keys (each at most window_left + 1) and the
    others none; non-causal: every row all s_kv keys."""
    if not causal:
        return s_q * s_kv
    n = min(s_q, s_kv)
    if window_left is None:
        return n * (s_kv - n) + n * (n + 1) // 2
    cap = window_left + 1
    return sum(min(p + 1, cap) for p in range(s_kv - n, s_kv))


def attention_flops(seqs, heads_q: int = 32, head_dim: int = 128, causal: bool = True,
                    window_left: int | None = None) -> int:
    """4 * D * H_q per (query row, visible key): QK^T and PV, a multiply and an add each."""
    return 4 * head_dim * heads_q * sum(visible_keys(s_q, s_kv, causal, window_left) for s_q, s_kv in seqs)


def kv_bytes(seqs, heads_kv: int = 8, head_dim: int = 128, elem_bytes: int = 2,
             window_left: int | None = None) -> int:
    """Bytes of K and V a call must read at least: every sequence's keys and values its rows can see, once (all
    s_kv of them; with a window, from the first row's window start)."""
    def read(s_q, s_kv):
        if window_left is None or s_q == 0:
            return s_kv
        return s_kv - max(0, s_kv - min(s_q, s_kv) - window_left)
    return 2 * sum(read(s_q, s_kv) for s_q, s_kv in seqs) * heads_kv * head_dim * elem_bytes


def cu_seqlens(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def assign_pages(lengths, page: int, seed: int, extra: int = 0) -> tuple[int, list[list[int]]]:
    """(pages in the pool, each sequence's page ids): ceil(length / page) pages per sequence, taken from a
    random permutation of the pool (at least one page; `extra` more than the sequences use)."""
    need = [-(-n // page) for n in lengths]
    ids = list(range(max(1, sum(need) + extra)))
    random.Random(seed).shuffle(ids)
    rows, pos = [], 0
    for n in need:
        rows.append(ids[pos:pos + n])
        pos += n
    return len(ids), rows


def page_table(rows, width: int | None = None, pad: int = 0) -> list[list[int]]:
    """The page table's rows, `width` entries each (default: the longest row, at least 1), padded with `pad`."""
    width = max(1, max((len(r) for r in rows), default=0)) if width is None else width
    return [list(r) + [pad] * (width - len(r)) for r in rows]


def derive(row: dict, kind: str) -> None:
    """From a row's <name>_us: <name>_tflops (chunk rows, from row["flops"]) or <name>_TBps (decode rows,
    from row["kv_bytes"]), and x_<name> = <name>_us / aotc_us for every contender but aotc."""
    us = {k[:-3]: v for k, v in row.items() if k.endswith("_us")}
    for name, t in us.items():
        if kind == "chunk":
            row[f"{name}_tflops"] = row["flops"] / t / 1e6
        elif kind == "decode":  # (fp8: e4m3 bytes, one an element)
            row[f"{name}_TBps"] = row["kv_bytes"] / (2 if name == "fp8" else 1) / t / 1e6
    if "aotc" in us:
        for name, t in us.items():
            if name != "aotc":
                row[f"x_{name}"] = t / us["aotc"]
    if "side" in us and "fa3" in us:  # the mixed step's side-by-side call against FA3's two calls
        row["x_fa3_side"] = us["fa3"] / us["side"]


# ---- on the GPU ------------------------------------------------------------------------------------------
class Pool:
    """bf16 NHD pools holding each sequence's s_kv keys in shuffled pages of `page` tokens; the page table,
    seqlens_kv and cu_seqlens_q (int32 on the GPU; cu_list on the host); q [total_q, H_q, D] (random) and out;
    the model's score features as every call takes them (features: window_left, sinks)."""

    def __init__(self, seqs, seed: int, model: Model = MODELS["llama"], page: int = PAGE):
        import torch

        self.seqs, self.model = tuple(seqs), model
        D, H_Q, H_KV = model.head_dim, model.heads_q, model.heads_kv
        n_pages, self.rows = assign_pages([s_kv for _, s_kv in self.seqs], page, seed)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.k, self.v = (torch.randn(n_pages, page, H_KV, D, dtype=torch.bfloat16, device="cuda", generator=gen)
                          for _ in range(2))
        self.pt = torch.tensor(page_table(self.rows), dtype=torch.int32, device="cuda")
        self.sl = torch.tensor([s_kv for _, s_kv in self.seqs], dtype=torch.int32, device="cuda")
        self.cu_list = cu_seqlens(s_q for s_q, _ in self.seqs)
        self.cu = torch.tensor(self.cu_list, dtype=torch.int32, device="cuda")
        self.max_q = max(s_q for s_q, _ in self.seqs)
        self.q = torch.randn(self.cu_list[-1], H_Q, D, dtype=torch.bfloat16, device="cuda", generator=gen)
        self.out = torch.empty_like(self.q)
        sinks = (torch.randn(H_Q, device="cuda", generator=gen) * 2.0) if model.sinks else None
        self.features = {"window_left": model.window_left, "sinks": sinks, "softcap": model.softcap}

    def fp8(self):
        """The pools as e4m3 with per-head scales (amax / 448): (k8, v8, k_scale, v_scale)."""
        import torch

        out = []
        for x in (self.k, self.v):
            scale = (x.float().abs().amax(dim=(0, 1, 3)) / 448.0).contiguous()
            out.append(((x.float() / scale.view(1, 1, -1, 1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale))
        (k8, ks), (v8, vs) = out
        return k8, v8, ks, vs

    def keys(self, b: int):
        """Sequence b's K and V [s_kv, H_kv, D], gathered through its pages."""
        import torch

        pages = torch.tensor(self.rows[b], dtype=torch.long, device="cuda")
        s_kv, kv_heads, D = self.seqs[b][1], self.model.heads_kv, self.model.head_dim
        return self.k[pages].reshape(-1, kv_heads, D)[:s_kv], self.v[pages].reshape(-1, kv_heads, D)[:s_kv]

    def packed(self, which):
        """K and V of the sequences `which` packed contiguously [sum s_kv, H_kv, D], their cu_seqlens_kv
        (int32 on the GPU) and the longest length."""
        import torch

        which = list(which)
        ks, vs = zip(*(self.keys(b) for b in which))
        lengths = [self.seqs[b][1] for b in which]
        cu = torch.tensor(cu_seqlens(lengths), dtype=torch.int32, device="cuda")
        return torch.cat(ks), torch.cat(vs), cu, max(lengths)

    def dense(self, which):
        """K and V of the sequences `which` as [n, longest, H_kv, D], zero past each length (FA3's kvcache
        layout, torch SDPA's after a transpose)."""
        import torch

        which = list(which)
        L = max(self.seqs[b][1] for b in which)
        kd = torch.zeros(len(which), L, self.model.heads_kv, self.model.head_dim, dtype=torch.bfloat16, device="cuda")
        vd = torch.zeros_like(kd)
        for i, b in enumerate(which):
            k, v = self.keys(b)
            kd[i, :k.shape[0]], vd[i, :v.shape[0]] = k, v
        return kd, vd


def rows_of(result, model: Model):
    """A contender's output as [total_q, H_q, D] rows in the pool's order (parts concatenated)."""
    import torch

    parts = result if isinstance(result, tuple) else (result,)
    return torch.cat([p.reshape(-1, model.heads_q, model.head_dim) for p in parts])


def reference(q, k, v, s_kv: int, window_left: int | None, sinks, softcap: float | None = None):
    """Attention of one sequence in fp32, computed apart from the kernels: q [s_q, H_q, D], k/v [s_kv, H_kv, D];
    scores q.k / sqrt(D) (soft-capped: softcap * tanh(score / softcap)), key j visible to row i (position
    p = i + s_kv - s_q) iff j <= p and, with a window, p - window_left <= j; a sink adds exp(sinks[h]) to the
    softmax denominator. One KV head's group at a time."""
    import torch

    s_q, H_q, D = q.shape
    group = H_q // k.shape[1]
    p = torch.arange(s_q, device=q.device)[:, None] + (s_kv - s_q)
    j = torch.arange(s_kv, device=q.device)[None, :]
    hidden = (j > p) if window_left is None else (j > p) | (j < p - window_left)
    out = torch.empty(s_q, H_q, D, dtype=torch.float32, device=q.device)
    for g in range(k.shape[1]):
        heads = slice(g * group, (g + 1) * group)
        s = torch.einsum("ihd,jd->hij", q[:, heads].float(), k[:, g].float()) * D ** -0.5
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        s.masked_fill_(hidden, float("-inf"))
        if sinks is not None:  # the sink as one more logit of every row, with no value
            s = torch.cat([s, sinks[heads].float().view(-1, 1, 1).expand(-1, s_q, 1)], dim=2)
        w = torch.softmax(s, dim=2)[..., :s_kv].nan_to_num_(0.0)  # a row that sees nothing: 0
        out[:, heads] = torch.einsum("hij,jd->ihd", w, v[:, g].float())
    return out


def max_abs_err(pool: Pool, out, q=None, sinks: bool = True) -> float:
    """Max |out - ref| over every sequence's rows; ref: reference() on the sequence's gathered K/V with the
    pool's window and sinks (sinks=False: without the sinks, for a contender that has none). q: the queries
    out was computed from (pool.q)."""
    q = pool.q if q is None else q
    err = 0.0
    for b, (s_q, s_kv) in enumerate(pool.seqs):
        lo, hi = pool.cu_list[b], pool.cu_list[b + 1]
        if s_q == 0:
            continue
        k, v = pool.keys(b)
        ref = reference(q[lo:hi], k, v, s_kv, pool.model.window_left, pool.features["sinks"] if sinks else None,
                        pool.model.softcap)
        e = float((out[lo:hi].float() - ref).abs().max())
        if e != e:  # NaN: an unwritten or broken row must show, not vanish in max()
            return e
        err = max(err, e)
    return err


def time_plans(pool: Pool, contenders: dict, flush, rounds: int) -> tuple[dict, dict]:
    """Runtime.attention plans over `pool` side by side (the probes' A/B runs): contenders maps a name to
    (runtime, prepare_attention keywords; "k" and "v" replace the pool's caches), each plan writes its own
    NaN-poisoned out, runs once, is checked against fp32 attention, then all are timed in interleaved rounds of
    CUDA graphs after L2 flushes. Returns (row fields: {name}_variant, {name}_family, {name}_max_abs_err,
    {name}_us, {name}_spread; the median us by name)."""
    import torch

    cur = torch.cuda.current_stream
    fns, outs, row = {}, {}, {}
    for name, (rt, kw) in contenders.items():
        kw = {"max_seqlen_q": pool.max_q, **kw}
        k, v = kw.pop("k", pool.k), kw.pop("v", pool.v)
        out = outs[name] = torch.full_like(pool.out, float("nan"))
        plan = rt.prepare_attention(pool.q, k, v, out, pool.cu, pool.sl, pool.pt, **kw)
        row[f"{name}_variant"] = getattr(getattr(plan, "variant", None), "name", None)
        row[f"{name}_family"] = getattr(plan, "prefill_family", None)
        fns[name] = lambda plan=plan, out=out, q=pool.q: plan(q, out, stream=cur())
        fns[name]()
    torch.cuda.synchronize()
    row.update({f"{n}_max_abs_err": max_abs_err(pool, o) for n, o in outs.items()})
    med, fields = medians(interleaved({n: (lambda fn=fn: graph_time(fn, flush)) for n, fn in fns.items()}, rounds),
                          "us")
    row.update(fields)
    return row, med


def _first(result):
    """FA3's output whether or not it came with its LSE."""
    return result[0] if isinstance(result, tuple) else result


def contenders_of(rt, fa3, case: Case, pool: Pool, fp8: bool = False, bases: dict | None = None) -> tuple[dict, dict]:
    """({name: fn() -> its output}, facts for the row): aotc, its A/A twin, the same call through each baseline
    bundle's runtime (bases: name -> runtime, --baseline-bundle), and the case's kind's others (fp8: the same call
    over the pools in e4m3). Every aotc call takes the model's window, sinks and soft-cap; FA3 (no window, no sinks
    in its wheel) takes the soft-cap, runs without sinks, and not at all for a model with a window."""
    import torch

    model, feats = pool.model, pool.features
    cap = {"softcap": model.softcap} if model.softcap else {}  # FA3's soft-cap (0.0, its default, is none)
    H_Q, D = model.heads_q, model.head_dim
    if model.window_left is not None:
        fa3 = None  # the wheel is built without local attention (FLASHATTENTION_DISABLE_LOCAL)
    cur = torch.cuda.current_stream  # graph_time captures on a stream of its own: launch on the current one
    # the step's bounds, as an engine knows them on the host (vLLM: max_query_len, max_seq_len, and from its
    # batch split the fewest queries a sequence has: a chunk alone is no decode row, so no decode launch)
    bounds = {"max_seqlen_q": pool.max_q, "max_seqlen_kv": max(s_kv for _, s_kv in case.seqs),
              "min_seqlen_q": min(s_q for s_q, _ in case.seqs)}
    plan = rt.prepare_attention(pool.q, pool.k, pool.v, pool.out, pool.cu, pool.sl, pool.pt, **bounds, **feats)
    aa_out = torch.empty_like(pool.out)
    aa = rt.prepare_attention(pool.q, pool.k, pool.v, aa_out, pool.cu, pool.sl, pool.pt, **bounds, **feats)
    # the paged kernel's variant, and the decode kernel's where the plan gives the decode rows one (None: the paged
    # kernel takes every row)
    decode_plan = getattr(plan, "decode", None)
    facts = {"aotc_variant": getattr(getattr(plan, "variant", None), "name", None),
             "aotc_decode_variant": decode_plan.variant.name if decode_plan is not None else None, "bounds": bounds}
    if fa3 is not None and model.sinks:
        facts["fa3_note"] = "FA3 without sinks (its wheel has none): the same shape, not the same function"
    fns = {"aotc": lambda: (plan(pool.q, pool.out, stream=cur()), pool.out)[1],
           "aa": lambda: (aa(pool.q, aa_out, stream=cur()), aa_out)[1]}
    for name, rt_b in (bases or {}).items():
        b_out = torch.empty_like(pool.out)
        b_plan = rt_b.prepare_attention(pool.q, pool.k, pool.v, b_out, pool.cu, pool.sl, pool.pt, **bounds, **feats)
        facts[f"{name}_variant"] = getattr(getattr(b_plan, "variant", None), "name", None)
        fns[name] = lambda b_plan=b_plan, b_out=b_out: (b_plan(pool.q, b_out, stream=cur()), b_out)[1]
    if fp8:
        k8, v8, ks, vs = pool.fp8()
        out8 = torch.empty_like(pool.out)
        try:
            plan8 = rt.prepare_attention(pool.q, k8, v8, out8, pool.cu, pool.sl, pool.pt, k_descale=ks, v_descale=vs,
                                         **bounds, **feats)
            facts["fp8_variant"] = plan8.variant.name
            # a plan holds the pools' and scales' pointers, not the tensors: the closure keeps them alive
            fns["fp8"] = lambda keep=(k8, v8, ks, vs): (plan8(pool.q, out8, stream=cur()), out8)[1]
        except Exception as e:  # a bundle without the fp8 kernels: the row says why
            facts["fp8_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    B = len(case.seqs)
    if case.kind == "chunk":
        # the same call with the paged kernel's KV splits off (its kv_splits_max 1): what splitting a launch of
        # fewer tiles than SMs buys (x_nosplit); elsewhere a second A/A
        ns_out = torch.empty_like(pool.out)
        ns = rt.prepare_attention(pool.q, pool.k, pool.v, ns_out, pool.cu, pool.sl, pool.pt, **bounds, **feats)
        for slot in ns.slots("kv_splits_max"):
            slot.value = 1
        fns["nosplit"] = lambda: (ns(pool.q, ns_out, stream=cur()), ns_out)[1]
        kp, vp, cu_kv, max_kv = pool.packed(range(B))
        d_out = torch.empty_like(pool.out)
        fns["dense"] = lambda: (rt.prefill_ragged(pool.q, kp, vp, d_out, pool.cu, cu_kv, pool.max_q, max_kv,
                                                  causal=True, stream=cur(), **feats), d_out)[1]
        if fa3 is not None:
            # FA3 aligns causal bottom-right as aotc does: fa3_fwd_interface's docstrings (flash_attn_func and
            # flash_attn_with_kvcache, fa3-fwd 0.0.3) say "If causal=True, the causal mask is aligned to the
            # bottom right corner of the attention matrix"; flash_attn_varlen_func has no docstring of its own
            # and runs the same forward (_flash_attn_forward) per sequence. fa3_max_abs_err checks it.
            fns["fa3"] = lambda: _first(fa3.flash_attn_varlen_func(pool.q, kp, vp, pool.cu, cu_kv, pool.max_q,
                                                                   max_kv, causal=True, **cap))
            # num_splits=0: FA3's own split-KV heuristic, what vLLM's FA3 backend asks for outside CUDA graphs (the
            # wheel's varlen default, 1, never splits)
            fns["fa3_splits"] = lambda: _first(fa3.flash_attn_varlen_func(
                pool.q, kp, vp, pool.cu, cu_kv, pool.max_q, max_kv, causal=True, num_splits=0, **cap))
    elif case.kind == "mixed":  # sequence 0 the chunk, then B - 1 decode rows
        c = pool.cu_list[1]
        q_c, q_d = pool.q[:c], pool.q[c:].view(B - 1, 1, H_Q, D)
        kp, vp, cu_kv, max_kv = pool.packed([0])
        cu_c, sl_d, pt_d = pool.cu[:2], pool.sl[1:], pool.pt[1:]
        two = torch.empty_like(pool.out)
        o_c, o_d = two[:c], two[c:].view(B - 1, 1, H_Q, D)

        def two_calls():
            rt.prefill_ragged(q_c, kp, vp, o_c, cu_c, cu_kv, c, max_kv, causal=True, stream=cur(), **feats)
            rt.decode(q_d, pool.k, pool.v, o_d, sl_d, pt_d, stream=cur(), **feats)
            return two

        fns["two_calls"] = two_calls
        # the decode kernel beside the paged one where the step's lengths say it pays (Runtime.step_prefill_sms)
        sms = rt.step_prefill_sms([s_q for s_q, _ in case.seqs], [s_kv for _, s_kv in case.seqs], heads_q=H_Q,
                                  heads_kv=model.heads_kv, head_dim=D, window_left=model.window_left)
        facts["side_prefill_sms"] = sms
        if sms is not None:
            side_out = torch.empty_like(pool.out)
            side = rt.prepare_attention(pool.q, pool.k, pool.v, side_out, pool.cu, pool.sl, pool.pt, **bounds, **feats)
            fns["side"] = lambda: (side(pool.q, side_out, stream=cur(), prefill_sms=sms), side_out)[1]
        if fa3 is not None:
            kd, vd = pool.dense(range(1, B))

            def fa3_two_calls():
                return (_first(fa3.flash_attn_varlen_func(q_c, kp, vp, cu_c, cu_kv, c, max_kv, causal=True, **cap)),
                        _first(fa3.flash_attn_with_kvcache(q_d, kd, vd, cache_seqlens=sl_d, causal=True, **cap)))

            fns["fa3"] = fa3_two_calls
    elif case.kind == "decode":
        q4, o4 = pool.q.view(B, 1, H_Q, D), torch.empty(B, 1, H_Q, D, dtype=pool.q.dtype, device="cuda")
        fns["decode"] = lambda: (rt.decode(q4, pool.k, pool.v, o4, pool.sl, pool.pt, stream=cur(), **feats), o4)[1]
        if fa3 is not None:
            kd, vd = pool.dense(range(B))
            fns["fa3"] = lambda: _first(fa3.flash_attn_with_kvcache(q4, kd, vd, cache_seqlens=pool.sl, causal=True,
                                                                    **cap))
    else:
        raise ValueError(f"case {case.name}: unknown kind {case.kind!r}")
    return fns, facts


def run_case(rt, fa3, case: Case, seed: int, rounds: int, flush, fp8: bool = False,
             model: Model = MODELS["llama"], bases: dict | None = None) -> dict:
    """One row: every contender checked once against the reference, then timed in interleaved rounds."""
    import torch

    pool = Pool(case.seqs, seed, model)
    shape = {"heads_q": model.heads_q, "head_dim": model.head_dim, "window_left": model.window_left}
    row = {"case": case.name, "kind": case.kind, "model": model.name, "batch": len(case.seqs),
           "new_tokens": pool.cu_list[-1], "kv_tokens": sum(s_kv for _, s_kv in case.seqs),
           "flops": attention_flops(case.seqs, **shape),
           "kv_bytes": kv_bytes(case.seqs, heads_kv=model.heads_kv, head_dim=model.head_dim,
                                window_left=model.window_left)}
    fns, facts = contenders_of(rt, fa3, case, pool, fp8, bases)
    row.update(facts)
    for name, fn in list(fns.items()):
        try:
            result = fn()
            torch.cuda.synchronize()
            has_sinks = not (name == "fa3" and model.sinks)
            row[f"{name}_max_abs_err"] = max_abs_err(pool, rows_of(result, model), sinks=has_sinks)
        except Exception as e:  # one contender's failure (a shape FA3 refuses) must not hide the others
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            del fns[name]
    samples = interleaved({name: (lambda fn=fn: graph_time(fn, flush)) for name, fn in fns.items()}, rounds)
    for name, ts in samples.items():
        us = statistics.median(ts)
        row[f"{name}_us"], row[f"{name}_spread"] = us, (max(ts) - min(ts)) / us
    derive(row, case.kind)
    return row


def host_rows(rt, fa3, calls: int, seed: int) -> list[dict]:
    """Host cost of one eager call (decode step of HOST_SEQS): new q/out/lse from a ring of 8 every call."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.torch
    from benchmarks.bench_runtime import time_calls

    model = MODELS["llama"]
    H_Q, D = model.heads_q, model.head_dim
    pool = Pool(HOST_SEQS, seed, model)
    B, ring, sync = len(HOST_SEQS), 8, torch.cuda.synchronize
    qs = [pool.q] + [torch.randn_like(pool.q) for _ in range(ring - 1)]
    outs = [pool.out] + [torch.empty_like(pool.out) for _ in range(ring - 1)]
    lses = [torch.empty(H_Q, B, device="cuda") for _ in range(ring)]
    q4s, o4s = [q.view(B, 1, H_Q, D) for q in qs], [o.view(B, 1, H_Q, D) for o in outs]
    lse4s = [torch.empty(B, H_Q, 1, device="cuda") for _ in range(ring)]
    stream = torch.cuda.current_stream().cuda_stream
    op = torch.ops.aotc
    try:
        plan = rt.prepare_attention(qs[0], pool.k, pool.v, outs[0], pool.cu, pool.sl, pool.pt, max_seqlen_q=1,
                                    lse=lses[0])
    except Exception as e:  # its row says why; the other rows still run
        def plan(*args, error=e, **kwargs):
            raise error
    kd, vd = pool.dense(range(B))
    kdt, vdt = kd.transpose(1, 2).contiguous(), vd.transpose(1, 2).contiguous()  # [B, H_kv, S, D] for SDPA
    qts = [q.transpose(1, 2) for q in q4s]

    def sdpa(i):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qts[i % ring], kdt, vdt, enable_gqa=True)

    calls_of = {
        "host_op_attention": ("torch.ops.aotc.attention (caller buffers)", True, lambda i: op.attention(
            qs[i % ring], pool.k, pool.v, pool.cu, pool.sl, pool.pt, outs[i % ring], lses[i % ring], max_seqlen_q=1)),
        "host_fn_attention": ("aotc.torch.attention (caller buffers; the op's function, no dispatcher)", True,
                              lambda i: aotc.torch.attention(qs[i % ring], pool.k, pool.v, pool.cu, pool.sl, pool.pt,
                                                             out=outs[i % ring], lse=lses[i % ring], max_seqlen_q=1)),
        "host_rt_attention": ("Runtime.attention (one call, cached plan)", True, lambda i: rt.attention(
            qs[i % ring], pool.k, pool.v, outs[i % ring], pool.cu, pool.sl, pool.pt, max_seqlen_q=1,
            lse=lses[i % ring], stream=stream)),
        "host_plan_attention": ("attention plan(q, out, lse) torch tensors", True, lambda i: plan(
            qs[i % ring], outs[i % ring], lses[i % ring], stream=stream)),
        "host_op_decode_out": ("torch.ops.aotc.decode_out (caller buffers)", True, lambda i: op.decode_out(
            q4s[i % ring], pool.k, pool.v, pool.sl, pool.pt, o4s[i % ring], lse4s[i % ring])),
        "host_torch_sdpa_cudnn": ("torch SDPA cuDNN (decode step, dense KV)", False, sdpa),
    }
    if fa3 is not None:
        calls_of["host_fa3_kvcache"] = ("FA3 flash_attn_with_kvcache (its op, dense KV)", False, lambda i: (
            fa3.flash_attn_with_kvcache(q4s[i % ring], kd, vd, cache_seqlens=pool.sl, causal=True)))
    rows = []
    for case, (call, is_aotc, fn) in calls_of.items():
        row = {"case": case, "kind": "host", "call": call, "batch": B, "context": HOST_SEQS[0][1]}
        try:
            if is_aotc:
                outs[0].fill_(float("nan"))
            fn(0)  # q = pool.q into pool.out
            sync()
            if is_aotc:
                row["max_abs_err"] = max_abs_err(pool, outs[0].view(-1, H_Q, D))
            time_calls(fn, min(calls, 500), sync)  # warm-up
            r = time_calls(fn, calls, sync)
            row.update(median_us=r["median_us"], p99_us=r["p99_us"], calls=calls)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(json.dumps(rounded(row)), flush=True)
    ref = {r["case"]: r.get("median_us") for r in rows}
    for r in rows:
        for base, key in (("host_torch_sdpa_cudnn", "x_torch_sdpa"), ("host_fa3_kvcache", "x_fa3_op")):
            if r.get("median_us") and ref.get(base):
                r[key] = r["median_us"] / ref[base]
    return rows


def rounded(row: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="writes DIR/paged_varlen.json")
    ap.add_argument("--fa3", action="store_true", help="time FlashAttention-3 (the fa3-fwd wheel) too")
    ap.add_argument("--quick", action="store_true", help=f"2 rounds, 300 host calls, without {', '.join(QUICK_SKIPS)}")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per case (default 5; 2 with --quick)")
    ap.add_argument("--calls", type=int, help="host-cost calls per row (default 3000; 300 with --quick)")
    ap.add_argument("--fp8", action="store_true", help="time every case over e4m3 pools too (kv_dtype fp8_e4m3)")
    ap.add_argument("--baseline-bundle", action="append", default=[],
                    help="time the same rt.attention call through this bundle's kernels too (repeat: base, base2, ...; "
                         "x_base = base_us / aotc_us)")
    ap.add_argument("--case", action="append", choices=[c.name for c in CASES],
                    help="only these cases (repeatable; default all), and no host rows")
    ap.add_argument("--model", choices=sorted(MODELS), default="llama",
                    help="the attention shape and score features (MODELS; default llama: D 128, H 32/8)")
    args = ap.parse_args(argv)
    model = MODELS[args.model]
    rounds = args.rounds or (2 if args.quick else 5)
    calls = args.calls or (300 if args.quick else 3000)
    import torch

    import aotc.runtime
    import aotc.torch
    from benchmarks.bench_runtime import dist_version, import_fa3, result_header

    fa3 = import_fa3() if args.fa3 else None
    rt = aotc.runtime.load(args.bundle)
    bases = {("base" if i == 0 else f"base{i + 1}"): aotc.runtime.load(p) for i, p in enumerate(args.baseline_bundle)}
    aotc.torch.set_runtime(rt)
    aotc.torch.register()
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for seed, case in enumerate(CASES):
        if (args.quick and case.name in QUICK_SKIPS) or (args.case and case.name not in args.case):
            continue
        try:
            row = run_case(rt, fa3, case, seed + 1, rounds, flush_buf.zero_, args.fp8, model, bases)
        except Exception as e:  # e.g. no kernel for the case: the other cases still run
            row = {"case": case.name, "kind": case.kind, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(row)
        print(json.dumps(rounded(row)), flush=True)
        torch.cuda.empty_cache()
    if model.name == "llama" and not args.case:
        rows += host_rows(rt, fa3, calls, seed=100)
    result = {**result_header("benchmarks/bench_paged_varlen.py", sys.argv[1:] if argv is None else argv),
              "fa3": dist_version("fa3-fwd") if fa3 is not None else None,
              "shape": {"model": model.name, "dtype": "bf16", "D": model.head_dim, "H_q": model.heads_q,
                        "H_kv": model.heads_kv, "page": PAGE, "kv_layout": "NHD", "window_left": model.window_left,
                        "softcap": model.softcap,
                        "sinks": "N(0, 2^2) per query head" if model.sinks else None},
              "rounds": rounds, "rows": rows}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "paged_varlen.json" if model.name == "llama" else f"paged_varlen_{model.name}.json"
    (out_dir / name).write_text(json.dumps(result, indent=1))
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    nan = float("nan")
    print(f"{'case':<34} {'aotc us':>9} {'rate':>8} {'aa x':>6} {'x dense':>7} {'x 2call':>7} {'x decode':>8} "
          f"{'x fa3':>6} {'x fa3s':>6} {'x fp8':>6} {'x base':>6} {'max err':>8}")
    for r in rows:
        if r["kind"] == "host" or "error" in r:
            continue
        rate = r.get("aotc_tflops", r.get("aotc_TBps", nan))
        print(f"{r['case']:<34} {r.get('aotc_us', nan):>9.1f} {rate:>8.2f} {r.get('x_aa', nan):>6.3f} "
              f"{r.get('x_dense', nan):>7.3f} {r.get('x_two_calls', nan):>7.3f} {r.get('x_decode', nan):>8.3f} "
              f"{r.get('x_fa3', nan):>6.3f} {r.get('x_fa3_splits', nan):>6.3f} {r.get('x_fp8', nan):>6.3f} "
              f"{r.get('x_base', nan):>6.3f} "
              f"{r.get('aotc_max_abs_err', nan):>8.1e}")
    for r in rows:
        if r["kind"] == "host":
            error = f"  {r['error']}" if "error" in r else ""
            print(f"{r.get('median_us', nan):8.2f} us  p99 {r.get('p99_us', nan):8.2f}  "
                  f"x sdpa {r.get('x_torch_sdpa', nan):5.2f}  {r['call']}{error}")
    for r in rows:
        if "error" in r and r["kind"] != "host":
            print(f"{r['case']}: {r['error']}")


if __name__ == "__main__":
    main()
