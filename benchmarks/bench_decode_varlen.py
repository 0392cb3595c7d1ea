"""Decode over batches of unequal KV lengths, beside the same batch size with equal lengths and FA3.

    python benchmarks/bench_decode_varlen.py --bundle artifacts/default.aotc --fa3 [--baseline-bundle OLD.aotc]

bf16, D 128, H_q/H_kv 32/8, S_q 1, pages of 16 tokens (NHD, shuffled page ids). Per case (a list of KV
lengths), in interleaved rounds with settled clocks (benchmarks/timing.py), each contender a CUDA graph
of 10 steps:

* aotc: the decode plan over the case's batch (its default chunk count: one wave of CTAs);
* uniform: the same plan kind over a batch of the same size and the same total tokens, equal lengths;
* fa3: FlashAttention-3's flash_attn_with_kvcache (the fa3-fwd wheel) on dense KV [B, max_len, H_kv, D]
  with cache_seqlens = the case's lengths (it reads only those tokens);
* aa: a second plan of the same kernel on the same tensors (the A/A control: how far two identical
  contenders land apart);
* base (with --baseline-bundle): the previous aotc's decode kernel on the case's batch, through
  benchmarks/legacy.py: a bundle from before the chunk schedule (one split count per plan, from the
  longest length) as that aotc launched it, a later one through this runtime's DecodePlan: the A/B of the
  kernel change.

Effective bandwidth = bytes of K and V actually read (2 * tokens * H_kv * D * 2) / time. Every case is
first checked against torch's math on dense KV (max abs error). Writes decode_varlen.json (rows: case,
batch, tokens, aotc_TBps, uniform_TBps, fa3_TBps, aa_TBps, base_TBps, ...).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import graph_time, interleaved  # noqa: E402

D, H_Q, H_KV, PAGE = 128, 32, 8, 16


def heavy_tailed(batch: int, seed: int = 20261201) -> list[int]:
    """Lengths of a heavy-tailed batch: 64 * Pareto(alpha 0.9) tokens, cut to [64, 65536] (most sequences
    are a few hundred tokens, a few are tens of thousands)."""
    rng = random.Random(seed)
    return [int(min(65536, max(64, 64 * rng.paretovariate(0.9)))) for _ in range(batch)]


CASES = {
    "uniform_b64_2048": [2048] * 64,
    "skewed_b64_2x32768_62x1024": [32768] * 2 + [1024] * 62,
    "uniform_b8_4544": [4544] * 8,
    "skewed_b8_1x32768_7x512": [32768] + [512] * 7,
    "heavy_tailed_b128": heavy_tailed(128),
}


class Paged:
    """A bf16 NHD pool holding `lengths`, shuffled page ids; q/out [B, 1, H_q, D] (this benchmark's D and heads
    unless given)."""

    def __init__(self, lengths, gen, d=D, h_q=H_Q, h_kv=H_KV):
        import torch

        self.lengths = lengths
        self.shape = (d, h_q, h_kv)
        need = [max(1, math.ceil(n / PAGE)) for n in lengths]
        total = sum(need)
        self.k = torch.randn(total, PAGE, h_kv, d, dtype=torch.bfloat16, device="cuda", generator=gen)
        self.v = torch.randn_like(self.k)
        perm = torch.randperm(total, device="cuda", generator=gen).to(torch.int32)
        self.pt = torch.zeros(len(lengths), max(need), dtype=torch.int32, device="cuda")
        pos = 0
        for b, n in enumerate(need):
            self.pt[b, :n] = perm[pos:pos + n]
            pos += n
        self.sl = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        self.q = torch.randn(len(lengths), 1, h_q, d, dtype=torch.bfloat16, device="cuda", generator=gen)
        self.out = torch.empty_like(self.q)

    def dense(self):
        """K/V [B, max_len, H_kv, D] holding each sequence's tokens first (FA3's kvcache layout)."""
        import torch

        d, _, h_kv = self.shape
        L = max(self.lengths)
        kd = torch.zeros(len(self.lengths), L, h_kv, d, dtype=torch.bfloat16, device="cuda")
        vd = torch.zeros_like(kd)
        for b, n in enumerate(self.lengths):
            pages = self.pt[b, : math.ceil(n / PAGE)].long()
            kd[b, :n] = self.k[pages].reshape(-1, h_kv, d)[:n]
            vd[b, :n] = self.v[pages].reshape(-1, h_kv, d)[:n]
        return kd, vd


def check(cache, plan_out, kd, vd) -> float:
    """Max abs error of aotc's output against torch's math on the dense copy, every sequence."""

    import torch.nn.functional as F

    err = 0.0
    for b, n in enumerate(cache.lengths):
        qt = cache.q[b:b + 1].transpose(1, 2).float()
        kt, vt = kd[b:b + 1, :n].transpose(1, 2).float(), vd[b:b + 1, :n].transpose(1, 2).float()
        ref = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True).transpose(1, 2)
        err = max(err, float((plan_out[b:b + 1].float() - ref).abs().max()))
    return err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fa3", action="store_true", help="time FlashAttention-3 (the fa3-fwd wheel) too")
    ap.add_argument("--baseline-bundle", help="the previous aotc's bundle: its decode kernel as contender 'base'")
    args = ap.parse_args()
    import torch

    import aotc.runtime
    from benchmarks.bench_runtime import import_fa3, result_header

    fa3 = import_fa3() if args.fa3 else None
    rt = aotc.runtime.load(args.bundle)
    legacy = base_rt = None
    if args.baseline_bundle:
        from benchmarks.legacy import LegacyDecode, legacy_decode_kernels, load_old_runtime

        legacy = legacy_decode_kernels(args.baseline_bundle).get(("bf16", 128, "paged16"))
        if legacy is None:  # the chunk schedule's parameters (less any this aotc added)
            base_rt = load_old_runtime(args.baseline_bundle, ("sdpa_decode",))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    cur = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    rows = []
    for case, lengths in CASES.items():
        B, tokens = len(lengths), sum(lengths)
        kv_bytes = 2 * tokens * H_KV * D * 2
        cache = Paged(lengths, gen)
        uniform = Paged([tokens // B] * B, gen)
        row = {"case": case, "batch": B, "tokens": tokens, "max_len": max(lengths), "kv_bytes": kv_bytes}
        plan = rt.prepare_decode(cache.q, cache.k, cache.v, cache.out, cache.sl, cache.pt)
        aa = rt.prepare_decode(cache.q, cache.k, cache.v, torch.empty_like(cache.out), cache.sl, cache.pt,
                               chunks=plan.chunks)
        uplan = rt.prepare_decode(uniform.q, uniform.k, uniform.v, uniform.out, uniform.sl, uniform.pt)
        plan(cache.q, cache.out, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        kd, vd = cache.dense()
        row["max_abs_err_vs_fp32"] = check(cache, cache.out, kd, vd)
        row.update(chunks=plan.chunks, workspace_bytes=plan.workspace_bytes, variant=plan.variant.name)
        contenders = {
            "aotc": lambda p=plan, c=cache: p.run(c.q.data_ptr(), c.out.data_ptr(), 0, 0, 0, cur()),
            "aa": lambda p=aa, c=cache: p.run(c.q.data_ptr(), c.out.data_ptr(), 0, 0, 0, cur()),
            "uniform": lambda p=uplan, c=uniform: p.run(c.q.data_ptr(), c.out.data_ptr(), 0, 0, 0, cur()),
        }
        if legacy is not None:
            base = LegacyDecode(legacy, cache.q, cache.k, cache.v, torch.empty_like(cache.out), cache.sl, cache.pt,
                                max(lengths), sms)
            row["base_splits"] = base.splits
            contenders["base"] = lambda p=base: p(cur())
        if base_rt is not None:
            base_out = torch.empty_like(cache.out)
            base = base_rt.prepare_decode(cache.q, cache.k, cache.v, base_out, cache.sl, cache.pt)
            row["base_chunks"] = base.chunks
            contenders["base"] = lambda p=base, c=cache, o=base_out: p.run(c.q.data_ptr(), o.data_ptr(), 0, 0, 0, cur())
        if fa3 is not None:
            def fa3_call(q=cache.q, kd=kd, vd=vd, sl=cache.sl):
                fa3.flash_attn_with_kvcache(q, kd, vd, cache_seqlens=sl, causal=True)
            try:
                fa3_call()
                torch.cuda.synchronize()
                contenders["fa3"] = fa3_call
            except Exception as e:
                row["fa3_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush.zero_)) for n, fn in contenders.items()},
                              args.rounds)
        uniform_bytes = 2 * (tokens // B) * B * H_KV * D * 2
        for n, ts in samples.items():
            us = statistics.median(ts)
            row[f"{n}_us"] = us
            row[f"{n}_TBps"] = (uniform_bytes if n == "uniform" else kv_bytes) / us / 1e6
            row[f"{n}_spread"] = (max(ts) - min(ts)) / us
        for n in ("uniform", "fa3", "base", "aa"):
            if f"{n}_TBps" in row:
                row[f"x_{n}"] = row["aotc_TBps"] / row[f"{n}_TBps"]
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        del cache, uniform, kd, vd, contenders, plan, aa, uplan
        torch.cuda.empty_cache()
    result = {**result_header("benchmarks/bench_decode_varlen.py"),
              "heavy_tailed_lengths": "64 * Pareto(alpha 0.9) tokens, cut to [64, 65536], seed 20261201",
              "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode_varlen.json").write_text(json.dumps(result, indent=1))
    print(f"{'case':<30} {'aotc':>6} {'unif':>6} {'fa3':>6} {'base':>6} {'aa':>6}  x_unif x_fa3 x_base x_aa")
    for r in rows:
        g = lambda k: r.get(k, float("nan"))  # noqa: E731
        print(f"{r['case']:<30} {g('aotc_TBps'):>6.2f} {g('uniform_TBps'):>6.2f} {g('fa3_TBps'):>6.2f} "
              f"{g('base_TBps'):>6.2f} {g('aa_TBps'):>6.2f}  {g('x_uniform'):.3f} {g('x_fa3'):.3f} "
              f"{g('x_base'):.3f} {g('x_aa'):.3f}")


if __name__ == "__main__":
    main()
