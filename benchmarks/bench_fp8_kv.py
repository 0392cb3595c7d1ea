"""Decode over an fp8 (e4m3) KV cache beside the same batch over the bf16 cache it was quantized from.

    python benchmarks/bench_fp8_kv.py --bundle artifacts/default.aotc [--rounds 5] [--out DIR]

bf16 queries, D 128, H_q/H_kv 32/8, S_q 1, pages of 16 tokens (NHD, shuffled page ids), per-head scales
(amax / 448). Per case, in interleaved rounds with settled clocks (benchmarks/timing.py), each contender a
CUDA graph of 10 steps that cycles through enough copies of the case's cache (and plans) that no step finds
its K/V in the 50 MB L2 (each copy at least 200 MB behind its next use):

* fp8: the decode plan over the e4m3 pools (k_descale / v_descale per KV head);
* bf16: the same batch over the bf16 pools the fp8 ones were quantized from (the 16-bit decode kernel);
* aa: a second fp8 plan on the same tensors (the A/A control).

fp8_TBps = e4m3 bytes of K and V read (2 * tokens * H_kv * D) / time; bf16_TBps likewise with 2 bytes an
element. Errors, every case: max |fp8 - fp64 attention over the dequantized cache| and max |fp8 - fp64
attention over the unquantized bf16 cache| (the quantization's own error). Writes fp8_kv.json (rows: case,
batch, tokens, aotc_fp8_us, aotc_bf16_us, fp8_TBps, bf16_TBps, x_bf16 = aotc_bf16_us / aotc_fp8_us, ...).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_decode_varlen import D, H_KV, PAGE, Paged  # noqa: E402
from benchmarks.timing import graph_time, interleaved  # noqa: E402

E4M3_MAX = 448.0
L2_CLEAR_BYTES = 200 << 20

CASES = {
    "b64_8192": [8192] * 64,
    "b1_32768": [32768],
    "skewed_b64_2x32768_62x1024": [32768] * 2 + [1024] * 62,
}


class Cache(Paged):
    """bench_decode_varlen's bf16 NHD pool (shuffled page ids, q/out [B, 1, H_q, D]; its D and heads unless
    `shape` = (d, h_q, h_kv) says) and its e4m3 copy with per-head scales (amax / 448)."""

    def __init__(self, lengths, gen, *shape):
        import torch

        super().__init__(lengths, gen, *shape)
        self.k_scale = (self.k.float().abs().amax(dim=(0, 1, 3)) / E4M3_MAX).contiguous()
        self.v_scale = (self.v.float().abs().amax(dim=(0, 1, 3)) / E4M3_MAX).contiguous()
        self.k8 = (self.k.float() / self.k_scale.view(1, 1, -1, 1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        self.v8 = (self.v.float() / self.v_scale.view(1, 1, -1, 1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        self.out8 = self.out
        self.out16 = torch.empty_like(self.q)

    def reference(self, b: int, fp8: bool = True):
        """fp64 attention of sequence b's query [1, H_q, D] over the dequantized e4m3 cache (fp8) or the bf16 one."""
        import torch

        d, h_q, h_kv = self.shape
        n = self.lengths[b]
        pages = self.pt[b, : math.ceil(n / PAGE)].long()
        if fp8:  # (e4m3 pages gathered as bytes: index ops on float8 tensors are not everywhere)
            k = self.k8.view(torch.uint8)[pages].view(torch.float8_e4m3fn).double() * self.k_scale.double().view(1, 1, -1, 1)
            v = self.v8.view(torch.uint8)[pages].view(torch.float8_e4m3fn).double() * self.v_scale.double().view(1, 1, -1, 1)
        else:
            k, v = self.k[pages].double(), self.v[pages].double()
        kf = k.reshape(-1, h_kv, d)[:n].repeat_interleave(h_q // h_kv, 1).transpose(0, 1)
        vf = v.reshape(-1, h_kv, d)[:n].repeat_interleave(h_q // h_kv, 1).transpose(0, 1)
        qf = self.q[b].double().transpose(0, 1)  # [H_q, 1, D]
        p = torch.softmax(torch.matmul(qf, kf.transpose(1, 2)) / math.sqrt(d), -1)
        return torch.matmul(p, vf).transpose(0, 1)

    def errors(self, b: int) -> tuple[float, float]:
        """Sequence b's max abs error of the fp8 output against fp64 attention over the dequantized cache and
        over the bf16 cache."""
        return tuple(float((self.out8[b].double() - self.reference(b, fp8)).abs().max()) for fp8 in (True, False))


def cycle(caches, plans, out_attr: str, stream):
    """One decode step a call, the next copy's plan each time (a CUDA graph of several calls reads no cache
    twice while it is still in L2)."""
    state = {"i": 0}

    def step():
        i = state["i"] % len(plans)
        state["i"] += 1
        c = caches[i]
        plans[i].run(c.q.data_ptr(), getattr(c, out_attr).data_ptr(), 0, 0, 0, stream())
    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    import aotc.runtime
    from benchmarks.bench_runtime import result_header

    rt = aotc.runtime.load(args.bundle)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    cur = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    rows = []
    for case, lengths in CASES.items():
        B, tokens = len(lengths), sum(lengths)
        fp8_bytes = 2 * tokens * H_KV * D
        copies = max(1, math.ceil(L2_CLEAR_BYTES / fp8_bytes))
        caches = [Cache(lengths, gen) for _ in range(copies)]
        plans8 = [rt.prepare_decode(c.q, c.k8, c.v8, c.out8, c.sl, c.pt, k_descale=c.k_scale, v_descale=c.v_scale)
                  for c in caches]
        aa8 = [rt.prepare_decode(c.q, c.k8, c.v8, torch.empty_like(c.out8), c.sl, c.pt, k_descale=c.k_scale,
                                 v_descale=c.v_scale) for c in caches]
        plans16 = [rt.prepare_decode(c.q, c.k, c.v, c.out16, c.sl, c.pt) for c in caches]
        c0 = caches[0]
        plans8[0](c0.q, c0.out8, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
        check = [b for b in range(B) if b < 3 or lengths[b] != lengths[0]][:6]  # the first and the odd ones
        errs = [c0.errors(b) for b in check]
        row = {"case": case, "batch": B, "tokens": tokens, "fp8_bytes": fp8_bytes, "copies": copies,
               "max_abs_err_vs_dequantized_fp64": max(e[0] for e in errs),
               "max_abs_err_vs_bf16_cache_fp64": max(e[1] for e in errs), "checked_sequences": check,
               "chunks": plans8[0].chunks, "variant_fp8": plans8[0].variant.name,
               "variant_bf16": plans16[0].variant.name}

        for c in caches:
            c.aa_out = torch.empty_like(c.out8)
        contenders = {"fp8": cycle(caches, plans8, "out8", cur), "bf16": cycle(caches, plans16, "out16", cur),
                      "aa": cycle(caches, aa8, "aa_out", cur)}
        samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush.zero_)) for n, fn in contenders.items()},
                              args.rounds)
        med = {n: statistics.median(ts) for n, ts in samples.items()}
        row.update(aotc_fp8_us=med["fp8"], aotc_bf16_us=med["bf16"], aa_fp8_us=med["aa"],
                   fp8_TBps=fp8_bytes / med["fp8"] / 1e6, bf16_TBps=2 * fp8_bytes / med["bf16"] / 1e6,
                   aa_TBps=fp8_bytes / med["aa"] / 1e6, x_bf16=med["bf16"] / med["fp8"], x_aa=med["aa"] / med["fp8"],
                   **{f"{n}_spread": (max(ts) - min(ts)) / med[n] for n, ts in samples.items()})
        row["fp8_TBps_over_bf16_TBps"] = row["fp8_TBps"] / row["bf16_TBps"]
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        del caches, plans8, plans16, aa8, contenders
        torch.cuda.empty_cache()
    result = {**result_header("benchmarks/bench_fp8_kv.py"), "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fp8_kv.json").write_text(json.dumps(result, indent=1))
    print(f"{'case':<30} {'fp8 us':>8} {'bf16 us':>8} {'x_bf16':>7} {'fp8 TB/s':>9} {'bf16 TB/s':>9} {'x_aa':>6}")
    for r in rows:
        print(f"{r['case']:<30} {r['aotc_fp8_us']:>8.1f} {r['aotc_bf16_us']:>8.1f} {r['x_bf16']:>7.3f} "
              f"{r['fp8_TBps']:>9.2f} {r['bf16_TBps']:>9.2f} {r['x_aa']:>6.3f}")


if __name__ == "__main__":
    main()
