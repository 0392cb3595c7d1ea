"""How fast a plain read of N bytes can go on this GPU, timed like the decode benchmarks (CUDA graph of 10
calls, L2 flushed before each replay, each call reading the next of enough copies that none is still in
L2: bench_fp8_kv's L2_CLEAR_BYTES): the bound on what any decode kernel reading those bytes can reach,
and the effective-bandwidth ratio between reading B bytes and 2B bytes that no kernel with the same launch
and ramp costs can beat (issue 23's fp8_TBps / bf16_TBps goal at B 1 x 32768 compares exactly those sizes).

    python benchmarks/probes/stream_floor.py [--out FILE]

Readers: torch's sum (one reduction kernel over a bf16 view) and torch's amax, of 67,108,864 bytes (the
fp8 K+V of B 1 x 32768 x H_kv 8 x D 128) and of 134,217,728 (bf16), of bench_fp8_kv's skewed batch (2 x 32768 +
62 x 1024 tokens: 264,241,152 bytes in e4m3, 528,482,304 in bf16), and of the windowed decode case's 268,500,992
and plain 2,147,483,648 bytes (issue 22).
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_fp8_kv import L2_CLEAR_BYTES  # noqa: E402
from benchmarks.bench_paged_varlen import rounded  # noqa: E402
from benchmarks.timing import graph_time, interleaved  # noqa: E402

SIZES = {"fp8_b1x32768": 67_108_864, "bf16_b1x32768": 134_217_728,
         "fp8_skewed": 264_241_152, "bf16_skewed": 528_482_304,
         "window_b16x4097": 268_500_992, "plain_b16x32768": 2_147_483_648}
# (the smaller read, the larger one) pairs whose effective-bandwidth ratio a row reports
PAIRS = (("fp8_b1x32768", "bf16_b1x32768"), ("fp8_skewed", "bf16_skewed"), ("window_b16x4097", "plain_b16x32768"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.empty((), dtype=torch.bfloat16, device="cuda")
    contenders = {}

    def reader(op, copies):
        state = {"i": 0}

        def call():
            x = copies[state["i"] % len(copies)]
            state["i"] += 1
            op(x)
        return call

    for n, b in SIZES.items():
        copies = [torch.randn(b // 2, dtype=torch.bfloat16, device="cuda")
                  for _ in range(max(1, math.ceil(L2_CLEAR_BYTES / b)))]
        contenders[f"sum/{n}"] = reader(lambda x: torch.sum(x, dim=0, out=sink), copies)
        contenders[f"amax/{n}"] = reader(lambda x: torch.amax(x, dim=0, out=sink), copies)
    samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush.zero_)) for n, fn in contenders.items()},
                          a.rounds)
    rows = []
    for n, ts in samples.items():
        reader, size = n.split("/")
        us = sorted(ts)[len(ts) // 2]
        rows.append({"reader": reader, "case": size, "bytes": SIZES[size], "us": us, "TBps": SIZES[size] / us / 1e6})
    by = {(r["reader"], r["case"]): r for r in rows}
    for reader in ("sum", "amax"):
        for half, full in PAIRS:
            by[(reader, half)][f"TBps_over_{full}"] = by[(reader, half)]["TBps"] / by[(reader, full)]["TBps"]
    for r in rows:
        print(json.dumps(rounded(r)), flush=True)
    if a.out:
        from datetime import datetime, timezone

        from benchmarks.bench_runtime import git_commit

        header = {"git_commit": git_commit(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "gpu": torch.cuda.get_device_name(), "command": "python benchmarks/probes/stream_floor.py",
                  "rounds": a.rounds}
        Path(a.out).write_text(json.dumps({**header, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
