"""Tile/schedule tuning for sdpa_prefill_sm90 (build side; no GPU needed).

    python benchmarks/tuners/tune_prefill_sm90.py --out /tmp/tune     # one bundle per configuration
    python benchmarks/tuners/tune_prefill_sm90_gpu.py /tmp/tune/*.aotc   # on the GPU: time each beside cuDNN

Each configuration is a tile record (aotc.families.sdpa_prefill_sm90.Tile: block sizes, stages,
ping-pong); the bf16 dense variants of one head dim (causal and not) are compiled with it straight
through compile_variant(tile=...) (bypassing the cache, whose key does not see the tile) into a bundle. The GPU half's
output for these configurations: benchmarks/results/tune_prefill_sm90.jsonl.

    python benchmarks/tuners/tune_prefill_sm90.py --full --merge artifacts/default.aotc --out /tmp/cand d128_n176

--full compiles every variant of the head dim (both dtypes, dense and ragged, causal and not), and
--merge writes the base bundle with those variants replaced: a candidate the GPU suite can run
(AOTC_TEST_BUNDLE) and bench_prefill.py can time against the base (--baseline-bundle).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CONFIGS = {  # name: (head_dim, (block_m, block_n, stages, pingpong))
    "d128_n128_pp": (128, (128, 128, 2, True)),
    "d128_n128": (128, (128, 128, 2, False)),
    "d128_n176_pp": (128, (128, 176, 2, True)),
    "d128_n176": (128, (128, 176, 2, False)),
    "d64_n128_pp": (64, (128, 128, 2, True)),
    "d64_n128": (64, (128, 128, 2, False)),
    "d64_n192_pp": (64, (128, 192, 2, True)),
    "d64_n256_pp": (64, (128, 256, 2, True)),
    "d256_n64_pp": (256, (128, 64, 2, True)),
    "d256_n80_pp": (256, (128, 80, 2, True)),
    "d256_n80": (256, (128, 80, 2, False)),
    "d256_n64": (256, (128, 64, 2, False)),
    "d64_n128_s3_pp": (64, (128, 128, 3, True)),
    "d64_n128_s3": (64, (128, 128, 3, False)),
    "d128_n128_s3": (128, (128, 128, 3, False)),
    "d128_n128_s3_pp": (128, (128, 128, 3, True)),
    # block_n 96: three stages still leave room for a separate O staging tile
    "d128_n96": (128, (128, 96, 2, False)),
    "d128_n96_s3": (128, (128, 96, 3, False)),
    "d128_n96_s3_pp": (128, (128, 96, 3, True)),
    "d128_n112": (128, (128, 112, 2, False)),
    "d128_n160": (128, (128, 160, 2, False)),
    "d128_n160_pp": (128, (128, 160, 2, True)),
    "d128_n192_pp": (128, (128, 192, 2, True)),
    # three consumer warpgroups (512 threads, 160 registers each)
    "d64_m192_n128_pp": (64, (192, 128, 2, True)),
    "d64_m192_n128": (64, (192, 128, 2, False)),
    "d64_m192_n128_s3_pp": (64, (192, 128, 3, True)),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/tune")
    ap.add_argument("--full", action="store_true", help="every variant of the head dim, not only bf16 dense")
    ap.add_argument("--merge", metavar="BUNDLE", help="write BUNDLE with the configuration's variants replaced")
    ap.add_argument("configs", nargs="*", default=list(CONFIGS))
    args = ap.parse_args()
    from aotc.common.variant import Variant
    from aotc.families.sdpa_prefill_sm90 import Tile
    from benchmarks.tuners.tuning import write_tuning_bundle

    def variants(D, block_n):
        return [Variant.make("sdpa_prefill_sm90", "sm_90a", dtype=dtype, head_dim=D, layout=layout, causal=causal,
                             block_n=block_n)
                for dtype in (("bf16", "fp16") if args.full else ("bf16",))
                for layout in (("dense", "ragged") if args.full else ("dense",))
                for causal in (False, True)]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.configs:
        D, (bm, bn, stages, pingpong) = CONFIGS[name]
        write_tuning_bundle(name, variants(D, bn), out / f"{name}.aotc", merge_into=args.merge,
                            tile=Tile(bm, bn, stages, pingpong))


if __name__ == "__main__":
    main()
