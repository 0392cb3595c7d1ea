"""Tile tuning for sdpa_decode (build side; no GPU needed): one bundle per (keys per warp, ring slots).

    python benchmarks/tuners/tune_decode.py --out /tmp/tune_decode
    python benchmarks/bench_decode.py --bundle /tmp/tune_decode/<config>.aotc --out /tmp/res_<config>   # GPU

Each configuration is a tile record (aotc.families.sdpa_decode.Tile) for D128 on the big-smem class
(sm_90); the bf16 D128 variants bench_decode uses (paged16, paged64, dense) are compiled with it straight
through compile_variant(tile=...), with keys of their own (the cache's would not see the tile), into a
bundle.
The GPU timings of the configurations: benchmarks/results/tune_decode.jsonl.

    python benchmarks/tuners/tune_decode.py --fp8 64 --out /tmp/tune_f8     # fp8 KV tiles (FP8_CONFIGS)
    python benchmarks/probes/decode_tile_ab.py --base artifacts/default.aotc --tuned kw32=/tmp/tune_f8/... # GPU
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
# fp8 KV at D64 (gpt-oss) and D128 (a key's e4m3 row takes D bytes of the ring); KB per CTA = 228 / CTAs - 1; a
# configuration whose ring does not fit a head dim's limit is skipped at it. Timings:
# benchmarks/results/decode_experiment_fp8_d64_tiles.json (benchmarks/probes/decode_tile_ab.py)
FP8_CONFIGS = {  # name: (KW, ring slots, CTAs per SM, KB of smem a CTA may take); _p: D64's rows packed (Tile.packed_rows)
    "kw16_s6_c4": (16, 6, 4, 56),   # shipped at D128 (and at D64 before decode_experiment_fp8_d64_tiles.json)
    "kw32_s3_c4": (32, 3, 4, 56),   # shipped at D64
    "kw16_s5_c5": (16, 5, 5, 44),
    "kw16_s4_c6": (16, 4, 6, 37),
    "kw16_s8_c3": (16, 8, 3, 74),
    "kw32_s4_c3": (32, 4, 3, 74),
    # D64's rows packed two to a 128-byte line (a slot of 32 keys a warp: 8 KB): more keys in flight or wider
    # blocks in the same shared memory
    "kw32_s3_c4_p": (32, 3, 4, 56),
    "kw32_s6_c4_p": (32, 6, 4, 56),
    "kw32_s5_c4_p": (32, 5, 4, 56),
    "kw64_s3_c4_p": (64, 3, 4, 56),
    "kw32_s4_c5_p": (32, 4, 5, 44),
    "kw16_s12_c4_p": (16, 12, 4, 56),
    "kw32_s3_c6_p": (32, 3, 6, 37),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/tune_decode")
    ap.add_argument("--fp8", type=int, metavar="D", help="sweep FP8_CONFIGS at head dim D (bf16 queries over e4m3 "
                                                          "pools, page 16); bundles f8d<D>_<config>.aotc")
    ap.add_argument("configs", nargs="*")
    args = ap.parse_args()
    from aotc.common.variant import Variant
    from aotc.families.sdpa_decode import Tile, tile
    from benchmarks.tuners.tuning import write_tuning_bundle

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.fp8:
        for name in args.configs or list(FP8_CONFIGS):
            kw, slots, ctas, kb = FP8_CONFIGS[name]
            packed = name.endswith("_p")
            if packed and args.fp8 != 64:
                if args.configs:
                    raise SystemExit(f"{name}: packed rows are D64's")
                continue
            fp8_tile = Tile(kw, slots, ctas, kb * 1024, fp8=True, packed_rows=packed)
            if fp8_tile.smem_bytes(args.fp8) > fp8_tile.smem_limit:
                if args.configs:
                    raise SystemExit(f"{name}: {fp8_tile.smem_bytes(args.fp8)} bytes of smem at D{args.fp8}, "
                                     f"over its {kb} KB")
                print(f"{name}: does not fit D{args.fp8}, skipped")
                continue
            name = f"f8d{args.fp8}_{name}"
            write_tuning_bundle(name, [Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=args.fp8, kv="paged16",
                                                    layout="dense", kv_dtype="fp8_e4m3", sinks=False, softcap=False,
                                                    window=False)], out / f"{name}.aotc",
                                tile=fp8_tile)
        return
    limit = tile(128, "sm_90").smem_limit
    for name in args.configs or list(CONFIGS):
        kw, slots, ctas = CONFIGS[name]
        write_tuning_bundle(name, [Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=128, kv=kv, layout="dense")
                                   for kv in ("paged16", "paged64", "dense")], out / f"{name}.aotc",
                            tile=Tile(kw, slots, ctas, limit))


if __name__ == "__main__":
    main()
