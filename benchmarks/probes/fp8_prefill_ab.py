"""A/B of two bundles' fp8 paged prefill: Runtime.attention over e4m3 pools (bench_paged_varlen's chunk cases),
both bundles loaded in one process, timed in interleaved rounds beside the bf16 call (bundle A) and an A/A twin.

    python benchmarks/probes/fp8_prefill_ab.py BUNDLE_A BUNDLE_B [--rounds 5]

Prints one JSON line per case: fp8_a_us, fp8_b_us, aa_us (A again), bf16_us, x_b = fp8_a_us / fp8_b_us,
x_aa = fp8_a_us / aa_us, and each side's max |error| against fp32 attention over the unquantized pools.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import CASES, Pool, max_abs_err, rounded  # noqa: E402
from benchmarks.timing import graph_time, interleaved, medians  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle_a")
    ap.add_argument("bundle_b")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rt_a, rt_b = aotc.runtime.load(args.bundle_a), aotc.runtime.load(args.bundle_b)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    cur = torch.cuda.current_stream
    for case in CASES:
        if case.kind != "chunk":
            continue
        pool = Pool(case.seqs, seed=1)
        k8, v8, ks, vs = pool.fp8()
        bounds = {"max_seqlen_q": pool.max_q, "max_seqlen_kv": max(s for _, s in case.seqs)}
        outs, fns, plans = {}, {}, {}
        for name, rt, kv in (("fp8_a", rt_a, (k8, v8, ks, vs)), ("fp8_b", rt_b, (k8, v8, ks, vs)),
                             ("aa", rt_a, (k8, v8, ks, vs)), ("bf16", rt_a, (pool.k, pool.v, None, None))):
            out = outs[name] = torch.full_like(pool.out, float("nan"))
            plan = rt.prepare_attention(pool.q, kv[0], kv[1], out, pool.cu, pool.sl, pool.pt, k_descale=kv[2],
                                        v_descale=kv[3], **bounds)
            plans[name] = plan
            fns[name] = lambda plan=plan, out=out, q=pool.q: plan(q, out, stream=cur())
            fns[name]()
        torch.cuda.synchronize()
        row = {"case": case.name, "variant": getattr(getattr(plans["fp8_a"], "variant", None), "name", None)}
        row.update({f"{n}_max_abs_err": max_abs_err(pool, o) for n, o in outs.items()})
        samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush)) for n, fn in fns.items()}, args.rounds)
        med, fields = medians(samples, "us")
        row.update(fields)
        row.update(x_b=med["fp8_a"] / med["fp8_b"], x_aa=med["fp8_a"] / med["aa"],
                   b_over_bf16=med["fp8_b"] / med["bf16"], a_over_bf16=med["fp8_a"] / med["bf16"])
        print(json.dumps(rounded(row)), flush=True)
        del pool, k8, v8, fns, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
