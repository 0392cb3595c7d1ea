"""Tile tuning for sdpa_decode (build side; no GPU needed): one bundle per (keys per warp, ring slots).

    python benchmarks/tuners/tune_decode.py --out /tmp/tune_decode
    python benchmarks/bench_decode.py --bundle /tmp/tune_decode/<config>.aotc --out /tmp/res_<config>   # GPU

Each configuration is a tile record (aotc.families.sdpa_decode.Tile) for D128 on the big-smem class
(sm_90); the bf16 D128 variants bench_decode uses (paged16, paged64, dense) are compiled with it straight
through compile_variant(tile=...), with keys of their own (the cache's would not see the tile), into a
bundle.
The GPU timings of the configurations: benchmarks/results/tune_decode.jsonl.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CONFIGS = {  # name: (keys per warp KW, ring slots, CTAs per SM) for D128 on sm_90; BLOCK_N = 4 * KW
    "kw16_s6": (16, 6, 2),   # the shipped configuration
    "kw32_s3": (32, 3, 2),
    "kw16_s5": (16, 5, 2),
    "kw16_s4": (16, 4, 3),   # 68 KB of smem: 3 CTAs per SM
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/tune_decode")
    ap.add_argument("configs", nargs="*", default=list(CONFIGS))
    args = ap.parse_args()
    from aotc.common.variant import Variant
    from aotc.families.sdpa_decode import Tile, tile
    from benchmarks.tuners.tuning import write_tuning_bundle

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limit = tile(128, "sm_90").smem_limit
    for name in args.configs:
        kw, slots, ctas = CONFIGS[name]
        write_tuning_bundle(name, [Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=128, kv=kv, layout="dense")
                                   for kv in ("paged16", "paged64", "dense")], out / f"{name}.aotc",
                            tile=Tile(kw, slots, ctas, limit))


if __name__ == "__main__":
    main()
