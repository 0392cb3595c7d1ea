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
from benchmarks.bench_paged_varlen import CASES, Pool, rounded, time_plans  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle_a")
    ap.add_argument("bundle_b")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rt_a, rt_b = aotc.runtime.load(args.bundle_a), aotc.runtime.load(args.bundle_b)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    for case in CASES:
        if case.kind != "chunk":
            continue
        pool = Pool(case.seqs, seed=1)
        k8, v8, ks, vs = pool.fp8()
        fp8 = {"max_seqlen_kv": max(s for _, s in case.seqs), "k": k8, "v": v8, "k_descale": ks, "v_descale": vs}
        fields, med = time_plans(pool, {"fp8_a": (rt_a, fp8), "fp8_b": (rt_b, fp8), "aa": (rt_a, fp8),
                                        "bf16": (rt_a, {"max_seqlen_kv": fp8["max_seqlen_kv"]})}, flush, args.rounds)
        row = {"case": case.name, "variant": fields["fp8_a_variant"], **fields}
        row.update(x_b=med["fp8_a"] / med["fp8_b"], x_aa=med["fp8_a"] / med["aa"],
                   b_over_bf16=med["fp8_b"] / med["bf16"], a_over_bf16=med["fp8_a"] / med["bf16"])
        print(json.dumps(rounded(row)), flush=True)
        del pool, k8, v8
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
