"""Decode time over forced chunk counts (KvChunks target) for the cases whose bandwidth misses its goal:
fp8 (e4m3) and bf16 pools at B 1 x 32768 and the skewed 2 x 32768 + 62 x 1024 batch (fp8_kv.json), and a
window of 4096 over 16 x 32768 (features.json); bf16 queries, D 128, H 32/8, 16-token NHD pages.

    python benchmarks/probes/decode_chunk_sweep.py BUNDLE                 # the sweep, a line per case
    python benchmarks/probes/decode_chunk_sweep.py BUNDLE once CASE KIND CHUNKS   # two steps, for ncu

Each time is bench_fp8_kv's: a CUDA graph of 10 steps cycling through enough cache copies that no step finds
its K/V in L2. Prints "chunks:us:TB/s" for the default count (first) and each forced one.
"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_decode_varlen import D, H_KV  # noqa: E402
from benchmarks.bench_fp8_kv import L2_CLEAR_BYTES, Cache, cycle  # noqa: E402
from benchmarks.timing import graph_time  # noqa: E402

CASES = {"b1_32768": ([32768], None), "skewed": ([32768] * 2 + [1024] * 62, None),
         "b16_32768_wl4096": ([32768] * 16, 4096)}
SWEEP = (None, 22, 33, 44, 66, 99, 132, 198, 264)


def plans_of(rt, caches, kind, chunks, window):
    feats = {} if window is None else {"window_left": window}
    if kind == "fp8":
        return [rt.prepare_decode(c.q, c.k8, c.v8, c.out8, c.sl, c.pt, k_descale=c.k_scale, v_descale=c.v_scale,
                                  chunks=chunks, **feats) for c in caches], "out8"
    return [rt.prepare_decode(c.q, c.k, c.v, c.out16, c.sl, c.pt, chunks=chunks, **feats) for c in caches], "out16"


def main() -> None:
    rt = aotc.runtime.load(sys.argv[1])
    gen = torch.Generator(device="cuda").manual_seed(1)
    cur = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    if len(sys.argv) > 2 and sys.argv[2] == "once":
        lengths, window = CASES[sys.argv[3]]
        chunks = None if sys.argv[5] == "default" else int(sys.argv[5])
        caches = [Cache(lengths, gen)]
        plans, attr = plans_of(rt, caches, sys.argv[4], chunks, window)
        step = cycle(caches, plans, attr, cur)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        return
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    for case, (lengths, window) in CASES.items():
        keys = sum(min(n, window + 1) if window else n for n in lengths)
        copies = max(1, math.ceil(L2_CLEAR_BYTES / (2 * keys * H_KV * D)))
        caches = [Cache(lengths, gen) for _ in range(copies)]
        for kind in ("fp8", "bf16"):
            nbytes = 2 * keys * H_KV * D * (1 if kind == "fp8" else 2)
            res = []
            for chunks in SWEEP:
                try:
                    plans, attr = plans_of(rt, caches, kind, chunks, window)
                except Exception as e:  # noqa: BLE001 (a count the plan refuses: say so, go on)
                    res.append(f"{chunks}:refused({type(e).__name__})")
                    continue
                us = graph_time(cycle(caches, plans, attr, cur), flush)
                res.append(f"{plans[0].chunks}:{us:.1f}:{nbytes / us / 1e6:.2f}")
            print(case, kind, " ".join(res), flush=True)
        del caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
