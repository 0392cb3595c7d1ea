"""The paged entry point's tile schedule, bundle against bundle: Runtime.attention plans of each bundle on steps of
prefill chunks alone (min_seqlen_q given: no decode launch), one chunk over prefixes of 0, 8192 and 30720 keys and
the chunks of several requests over unequal prefixes (bench_paged_varlen's chunk cases), timed side by side in
interleaved rounds of CUDA graphs after L2 flushes, with an A/A twin of the first bundle's plan.

    python benchmarks/probes/paged_schedule_ab.py NAME=BUNDLE [NAME=BUNDLE ...] [--rounds 7]

Prints one JSON line per case: <name>_us, <name>_spread, x_<name> = <first>_us / <name>_us, x_aa, each plan's
variant and max |error| against fp32 attention. Needs only the bundles' paged16 D128 bf16 causal kernels.
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
    ap.add_argument("bundles", nargs="+", help="NAME=PATH, the first the one the others are compared with")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    named = [b.split("=", 1) for b in args.bundles]
    runtimes = {name: aotc.runtime.load(path) for name, path in named}
    first = named[0][0]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    for case in (c for c in CASES if c.kind == "chunk"):
        pool = Pool(case.seqs, seed=1)
        bounds = {"max_seqlen_kv": max(s for _, s in case.seqs), "min_seqlen_q": min(s_q for s_q, _ in case.seqs)}
        contenders = {name: (rt, bounds) for name, rt in runtimes.items()}
        contenders["aa"] = (runtimes[first], bounds)
        row = {"case": case.name}
        fields, med = time_plans(pool, contenders, flush, args.rounds)
        row.update(fields)
        row.update({f"x_{n}": med[first] / t for n, t in med.items() if n != first})
        print(json.dumps(rounded(row)), flush=True)
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
