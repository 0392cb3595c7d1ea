"""The serving entry point at every page size, two bundles side by side: Runtime.attention on bench_paged_varlen's
steps (a 2048-token chunk over prefixes of 0 and 8192 tokens, and one chunk beside 63 decode rows at 4096) over
pools of 16-, 32-, 64- and 128-token pages holding the same keys, timed in interleaved rounds, with an A/A twin
of the base bundle's plan.

    python benchmarks/probes/page_size_ab.py --base BUNDLE --cand BUNDLE [--head-dim 256] [--heads 16/8] \
        [--rounds 7] [--out FILE]

Written for the Hopper kernel's 16-row boxes inside a page (kv_box_rows): at D256 a base bundle whose pages of
32-128 run the portable kernel against a candidate whose pages all run the Hopper one, and the candidate's page 16
(the same tile and boxes) as the yardstick. One JSON line per (case, page): base_us, cand_us, aa_us, x_cand =
base_us / cand_us, x_aa, cand_x_page16 = the candidate at page 16 / at this page, each plan's family and variant,
and max |error| against fp32 attention.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import CASES, Model, Pool, chunk_case, rounded, time_plans  # noqa: E402
from benchmarks.bench_runtime import write_rows  # noqa: E402

PAGES = (16, 32, 64, 128)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--cand", required=True)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--heads", default="16/8", help="H_q/H_kv")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", help="also write the rows to this JSON file")
    args = ap.parse_args()
    heads_q, heads_kv = (int(h) for h in args.heads.split("/"))
    model = Model(f"D{args.head_dim}", args.head_dim, heads_q, heads_kv)
    rts = {"base": aotc.runtime.load(args.base), "cand": aotc.runtime.load(args.cand)}
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    cases = [chunk_case(0), chunk_case(8192), next(c for c in CASES if c.kind == "mixed")]
    rows = []
    for case in cases:
        cand_page16 = None
        for page in PAGES:
            pool = Pool(case.seqs, seed=1, model=model, page=page)
            bounds = {"max_seqlen_kv": max(s for _, s in case.seqs),
                      "min_seqlen_q": min(s_q for s_q, _ in case.seqs)}
            fields, med = time_plans(pool, {"base": (rts["base"], bounds), "cand": (rts["cand"], bounds),
                                            "aa": (rts["base"], bounds)}, flush, args.rounds)
            row = {"case": case.name, "page": page, "head_dim": args.head_dim, "heads": args.heads, **fields}
            cand_page16 = med["cand"] if page == 16 else cand_page16
            row.update(x_cand=med["base"] / med["cand"], x_aa=med["base"] / med["aa"],
                       cand_x_page16=cand_page16 / med["cand"])
            rows.append(rounded(row))
            print(json.dumps(rows[-1]), flush=True)
            del pool
            torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, "benchmarks/probes/page_size_ab.py", rows)


if __name__ == "__main__":
    main()
