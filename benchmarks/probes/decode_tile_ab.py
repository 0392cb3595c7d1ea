"""fp8 decode tiles side by side (bf16 queries over e4m3 pools with per-head scales, page 16; by default gpt-oss's
shape, D64 and H_q/H_kv 64/8; --head-dim 128 --heads 32 8 is bench_fp8_kv's): each --tuned bundle's sdpa_decode
fp8 kernel (benchmarks/tuners/tune_decode.py --fp8 D) against the base bundle's fp8 and bf16 kernels, one process, contenders interleaved, CUDA graphs
of 10 steps after an L2 flush (as bench_fp8_kv times decode).

    python benchmarks/probes/decode_tile_ab.py --base artifacts/default.aotc \
        --tuned kw32=artifacts/tune_f8d64/f8d64_kw32_s3_c4.aotc ... --out DIR

Each fp8 contender's output is checked against fp64 attention over the dequantized cache (tolerance 2e-3,
outputs NaN-poisoned first). x_base: the base bundle's fp8 step time over the contender's (> 1: faster);
a tuned bundle of the shipped tile is the A/A control.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_decode_varlen import PAGE  # noqa: E402
from benchmarks.bench_fp8_kv import L2_CLEAR_BYTES, Cache  # noqa: E402  (its pools at any shape, their fp64 reference)

TOLERANCE = 2e-3
CASES = {
    "b64_4096": [4096] * 64,
    "b64_8192": [8192] * 64,
    "b1_32768": [32768],
    "skewed_b64_2x32768_62x1024": [32768] * 2 + [1024] * 62,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="bundle with the shipped fp8 and bf16 D64 decode kernels")
    ap.add_argument("--tuned", action="append", default=[], help="NAME=BUNDLE with a tuned fp8 D64 decode kernel")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--heads", type=int, nargs=2, default=(64, 8), metavar=("H_Q", "H_KV"))
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="folder for decode_tile_ab.json")
    ap.add_argument("--profile", action="store_true",
                    help="for ncu: three fp8 steps of the base bundle, then three bf16 steps, on the first case; no timing")
    args = ap.parse_args()
    import torch

    shape = (args.head_dim, *args.heads)

    import aotc.runtime
    from benchmarks.bench_runtime import result_header
    from benchmarks.timing import graph_time, interleaved

    base = aotc.runtime.load(args.base)
    tuned = {name: aotc.runtime.load(path) for name, path in (t.split("=", 1) for t in args.tuned)}
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    stream = torch.cuda.current_stream
    if args.profile:
        c = Cache(CASES[args.cases[0]], gen, *shape)
        o = torch.empty_like(c.q)
        for _ in range(3):
            base.decode(c.q, c.k8, c.v8, o, c.sl, c.pt, k_descale=c.k_scale, v_descale=c.v_scale)
        for _ in range(3):
            base.decode(c.q, c.k, c.v, o, c.sl, c.pt)
        torch.cuda.synchronize()
        return
    rows = []
    for case in args.cases:
        lengths = CASES[case]
        tokens = sum(lengths)
        fp8_bytes = 2 * tokens * shape[2] * shape[0]
        caches = [Cache(lengths, gen, *shape) for _ in range(max(1, math.ceil(L2_CLEAR_BYTES / fp8_bytes)))]
        contenders, variants, errors = {}, {}, {}
        for name, rt in [("base", base), *tuned.items()]:
            outs = [torch.empty_like(c.q) for c in caches]
            plans = [rt.prepare_decode(c.q, c.k8, c.v8, o, c.sl, c.pt, k_descale=c.k_scale, v_descale=c.v_scale)
                     for c, o in zip(caches, outs)]
            outs[0].fill_(float("nan"))
            plans[0](caches[0].q, outs[0], stream=stream())
            torch.cuda.synchronize()
            check = [0, len(lengths) - 1] if len(lengths) > 1 else [0]
            errors[name] = max(float((outs[0][b].double() - caches[0].reference(b)).abs().max()) for b in check)
            if not errors[name] <= TOLERANCE:
                raise SystemExit(f"{case} {name}: max abs error {errors[name]} against fp64 (tolerance {TOLERANCE})")
            variants[name] = plans[0].variant.name
            contenders[name] = (plans, outs)
        outs16 = [torch.empty_like(c.q) for c in caches]
        plans16 = [base.prepare_decode(c.q, c.k, c.v, o, c.sl, c.pt) for c, o in zip(caches, outs16)]
        contenders["bf16"] = (plans16, outs16)

        def cycle(plans, outs):
            state = {"i": 0}

            def step():
                i = state["i"] % len(plans)
                state["i"] += 1
                plans[i].run(caches[i].q.data_ptr(), outs[i].data_ptr(), 0, 0, 0, stream().cuda_stream)
            return step
        fns = {n: cycle(*po) for n, po in contenders.items()}
        samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush.zero_)) for n, fn in fns.items()}, args.rounds)
        med = {n: statistics.median(ts) for n, ts in samples.items()}
        row = {"case": case, "batch": len(lengths), "tokens": tokens, "fp8_bytes": fp8_bytes, "copies": len(caches),
               "bf16_us": med["bf16"], "bf16_TBps": 2 * fp8_bytes / med["bf16"] / 1e6,
               "chunks": contenders["base"][0][0].chunks}
        for n in ["base", *tuned]:
            row[n] = {"us": med[n], "TBps": fp8_bytes / med[n] / 1e6, "x_base": med["base"] / med[n],
                      "x_bf16": med["bf16"] / med[n], "spread": (max(samples[n]) - min(samples[n])) / med[n],
                      "max_abs_err_vs_fp64": errors[n], "variant": variants[n]}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del caches, contenders, fns
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {**result_header("benchmarks/probes/decode_tile_ab.py"), "rounds": args.rounds,
              "shape": {"D": shape[0], "H_q": shape[1], "H_kv": shape[2], "page": PAGE}, "rows": rows}
    (out / "decode_tile_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
