"""The paged entry point's two D128 kv tiles on steps of fewer than 8192 keys, the measurement that set the paged
176-key tile's launch fact picked_from_seqlen_kv to 4096 (run while the runtime picked it from 8192 keys only, as
dense prefill still does; paged_varlen_experiment_tile_threshold.json): Runtime.attention plans for a 2048-token
chunk over prefixes of 0, 2048 and 4096 tokens (bench_paged_varlen's shapes), a 512-token chunk over 3584, and a
mixed step (a 2048-token chunk over 4096 and 63 decode rows at 4096), one plan with the step's real max_seqlen_kv
and one told max_seqlen_kv = LONG_KV (the 176-key tile), timed in interleaved rounds with an A/A twin of the first.
With today's fact the first plan runs the 176-key tile as well from 4096 keys.

    python benchmarks/probes/paged_tile_ab.py BUNDLE [--rounds 7]

Prints one JSON line per prefix: n128_us, n176_us, aa_us, x_176 = n128_us / n176_us, x_aa, each plan's variant
and max |error| against fp32 attention.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import Case, Pool, chunk_case, rounded, time_plans  # noqa: E402

LONG_KV = 8192  # the bound the 176-key tile's plans are told


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rt = aotc.runtime.load(args.bundle)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    cases = [chunk_case(p) for p in (0, 2048, 4096)] + [
        Case("chunk512_prefix3584", "chunk", ((512, 4096),)),
        Case("mixed_chunk2048_prefix4096_decode63x4096", "mixed", ((2048, 6144),) + ((1, 4096),) * 63)]
    for case in cases:
        pool = Pool(case.seqs, seed=1)
        max_kv = max(s for _, s in case.seqs)
        row = {"case": case.name, "max_seqlen_kv": max_kv}
        least_q = {"min_seqlen_q": min(s_q for s_q, _ in case.seqs)}
        fields, med = time_plans(pool, {"n128": (rt, {"max_seqlen_kv": max_kv, **least_q}),
                                        "n176": (rt, {"max_seqlen_kv": LONG_KV, **least_q}),
                                        "aa": (rt, {"max_seqlen_kv": max_kv, **least_q})}, flush, args.rounds)
        row.update(fields)
        row.update(x_176=med["n128"] / med["n176"], x_aa=med["n128"] / med["aa"])
        print(json.dumps(rounded(row)), flush=True)
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
