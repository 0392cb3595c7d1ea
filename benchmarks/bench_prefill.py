"""Prefill kernel time against torch SDPA (flash and cuDNN backends), side by side in one process.

    python benchmarks/bench_prefill.py --bundle artifacts/default.aotc --out benchmarks/results

Two aotc columns: "aotc" is what the runtime dispatches to (the Hopper family sdpa_prefill_sm90 on
an H100/H200 when the bundle holds it), "portable" the mma.sync family sdpa_prefill on the same tensors.

Problem: 16k tokens in all, B = 16384 / S, H = 16, packed BSHD, bf16 (and fp16 for D128).
Time (benchmarks/timing.py): each contender first runs untimed for 100 ms of GPU time (the clocks
settle on its power draw), then CUDA events around 10 back-to-back launches, median of 5 trials, an
L2 flush (a 256 MB memset) before each trial; the contenders take turns for `--rounds` rounds, the
order rotated every round, and each reports the median of its rounds (spread: (max - min) / median
over rounds). TFLOP/s = 4*B*H*S*S*D / t, halved when causal.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import event_time, interleaved  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--causal-only", action="store_true", help="only the causal shapes")
    ap.add_argument("--head-dim", type=int, action="append", choices=(64, 128, 256),
                    help="only these head dims (repeatable; default all)")
    ap.add_argument("--dtype", action="append", choices=("bf16", "fp16"),
                    help="these dtypes at every head dim (repeatable; default bf16 and fp16 at D128, bf16 at D64/D256)")
    ap.add_argument("--skip-portable", action="store_true", help="leave out the portable family (A/B runs of sm90)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median)")
    ap.add_argument("--baseline-bundle", action="append", default=[],
                    help="another bundle (e.g. built from the previous commit): its kernel runs as contender 'base' in "
                         "the same rounds (A/B of a kernel change); repeat for 'base2', 'base3', ...")
    ap.add_argument("--baseline-family", default="auto", choices=("auto", "sdpa_prefill"),
                    help="the baseline bundle's family: auto (compared with 'aotc') or sdpa_prefill (with 'portable')")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.bench_runtime import load_baselines, result_header

    rt = aotc.runtime.load(args.bundle)
    rt_bases = load_baselines(args.baseline_bundle)
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    flush = flush_buf.zero_
    rows = []
    shapes = []
    for D, dtypes, seqs in [(128, ("bf16", "fp16"), (512, 2048, 4096, 8192, 16384)), (64, ("bf16",), (2048, 8192, 16384)),
                            (256, ("bf16",), (2048, 8192, 16384))]:
        for dtype in args.dtype or dtypes:
            for S in seqs:
                for causal in (False, True):
                    shapes.append((D, dtype, S, causal))
    if args.quick:
        shapes = [s for s in shapes if s[2] in (2048, 8192)]
    if args.head_dim:
        shapes = [s for s in shapes if s[0] in args.head_dim]
    if args.causal_only:
        shapes = [s for s in shapes if s[3]]
    for D, dtype, S, causal in shapes:
        H, B = 16, max(1, 16384 // S)
        t = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        q, k, v = (torch.randn(B, S, H, D, dtype=t, device="cuda") for _ in range(3))
        out = torch.empty_like(q)
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = {"D": D, "dtype": dtype, "S": S, "B": B, "H": H, "causal": causal, "flops": flops}
        stream = torch.cuda.current_stream().cuda_stream
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # torch SDPA wants [B, H, S, D]
        # contenders: "aotc" is what the runtime dispatches to (the Hopper family on an H100/H200 when
        # the bundle has it), "portable" the mma.sync family on the same tensors, then torch's backends
        contenders = {}
        for label, family in (("aotc", "auto"),) + ((("portable", "sdpa_prefill"),) if not args.skip_portable else ()):
            try:
                plan = rt.prepare_prefill(q, k, v, out, causal=causal, family=family)
                row["variant" if label == "aotc" else "portable_variant"] = plan.variant.name
                contenders[label] = (lambda p=plan: p.run(*ptrs, 0, 0, 0, stream))
                if label == "portable" and D == 128 and dtype == "bf16":
                    # what the packed stride specialization buys, same tensors
                    general = rt.prepare_prefill(q, k, v, out, causal=causal, specialize=False, family=family)
                    row["general_variant"] = general.variant.name
                    contenders["general"] = (lambda p=general: p.run(*ptrs, 0, 0, 0, stream))
            except Exception as e:
                row[f"{label}_error"] = f"{type(e).__name__}: {e}"
        for bname, rt_b in rt_bases.items():
            try:
                base = rt_b.prepare_prefill(q, k, v, out, causal=causal, family=args.baseline_family)
                row[f"{bname}_variant"] = base.variant.name
                contenders[bname] = (lambda p=base: p.run(*ptrs, 0, 0, 0, stream))
            except Exception as e:
                row[f"{bname}_error"] = f"{type(e).__name__}: {e}"
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def call(backend=backend):
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            try:
                call()
                contenders[name] = call
            except Exception as e:
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"
        # interleaved rounds in rotated order, each contender settled first (benchmarks/timing.py):
        # clock and power drift hits every contender alike instead of whichever ran last
        samples = interleaved({name: (lambda fn=fn: event_time(fn, flush)[0]) for name, fn in contenders.items()},
                              args.rounds)
        for name, ts in samples.items():
            ms = statistics.median(ts)
            row[f"{name}_ms"], row[f"{name}_tflops"] = ms, flops / ms / 1e9
            row[f"{name}_spread"] = (max(ts) - min(ts)) / ms
        for base in ("flash", "cudnn"):
            if f"{base}_ms" in row:
                for label in ("aotc", "portable"):
                    if f"{label}_ms" in row:
                        row[("" if label == "aotc" else "portable_") + f"x_{base}"] = row[f"{base}_ms"] / row[f"{label}_ms"]
        against = "portable" if args.baseline_family == "sdpa_prefill" else "aotc"
        for bname in rt_bases:
            if f"{bname}_ms" in row and f"{against}_ms" in row:
                row[f"x_{bname}"] = row[f"{bname}_ms"] / row[f"{against}_ms"]
                if "cudnn_ms" in row:
                    row[f"{bname}_x_cudnn"] = row["cudnn_ms"] / row[f"{bname}_ms"]
        if "general_ms" in row and "portable_ms" in row:
            row["packed_speedup"] = row["general_ms"] / row["portable_ms"]
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "flops"}),
              flush=True)
        del q, k, v, out, qt, kt, vt
    result = {**result_header("benchmarks/bench_prefill.py"), "rows": rows}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "prefill.json").write_text(json.dumps(result, indent=1))
    nan = float("nan")
    print(f"{'D':>4} {'dt':>5} {'S':>6} {'causal':>6} {'aotc TF/s':>10} {'portable':>9} {'flash':>8} {'cudnn':>8} "
          f"{'x cudnn':>8} {'port x flash':>12}" + "".join(f" {b + ' x cudnn':>14} {'x ' + b:>8}" for b in rt_bases))
    for r in rows:
        print(f"{r['D']:>4} {r['dtype']:>5} {r['S']:>6} {str(r['causal']):>6} {r.get('aotc_tflops', nan):>10.1f} "
              f"{r.get('portable_tflops', nan):>9.1f} {r.get('flash_tflops', nan):>8.1f} {r.get('cudnn_tflops', nan):>8.1f} "
              f"{r.get('x_cudnn', nan):>8.2f} {r.get('portable_x_flash', nan):>12.2f}"
              + "".join(f" {r.get(b + '_x_cudnn', nan):>14.2f} {r.get('x_' + b, nan):>8.2f}" for b in rt_bases))


if __name__ == "__main__":
    main()
