"""SM clock and board power while prefill kernels run: why fp16 runs slower than bf16 (aotc beside cuDNN), or why a
kernel that takes fewer SM cycles than FA3 is not faster in time (--contenders aotc,fa3 --dtype bf16).

    python benchmarks/probes/fp16_power_probe.py --bundle artifacts/default.aotc --out benchmarks/results
    python benchmarks/probes/fp16_power_probe.py --contenders aotc,fa3 --dtype bf16 --head-dim 256 \
        --name power_probe_d256_fa3.json
    python benchmarks/probes/fp16_power_probe.py --bundle A.aotc --baseline-bundle B.aotc --contenders aotc,base \
        --dtype bf16 --rounds 3 --name power_ab.json   # two builds of aotc in time at the power limit

B 1 x S 16384 (--seqlen), H 16, D128 (--head-dim), non-causal (--causal), random normal inputs (as bench_prefill).
Each contender (aotc's dispatched kernel; base, base2, ...: the same from each --baseline-bundle; torch SDPA's cuDNN
backend; FA3 from the fa3-fwd wheel on bf16) launches back to back for --seconds while `nvidia-smi -lms 50` samples the
SM clock, power draw and temperature; TFLOP/s comes from CUDA events over the same window. Order per round: every
(contender, dtype), then the same reversed (drift shows, and each contender runs early and late). Writes --name
(fp16_power_probe.json).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def sampled_run(fn, seconds: float) -> dict:
    """Launch fn back to back for `seconds` while nvidia-smi samples: time per call, median clock/power."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50", "-i", "0"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)  # let the sampler start
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 0
    e0.record()
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(8):
            fn()
        calls += 8
        torch.cuda.current_stream().synchronize()  # keep the queue short: the window is the GPU's
    e1.record()
    e1.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    samples = []
    for line in out.strip().splitlines():
        try:
            samples.append(tuple(float(x) for x in line.split(",")))
        except ValueError:
            continue
    return {"ms_per_call": e0.elapsed_time(e1) / calls, "calls": calls, "samples": len(samples),
            "sm_clock_mhz": statistics.median(s[0] for s in samples) if samples else None,
            "power_w": statistics.median(s[1] for s in samples) if samples else None,
            "temp_c": statistics.median(s[2] for s in samples) if samples else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--baseline-bundle", action="append", default=[],
                    help="repeatable: contenders base, base2, ... run these bundles' kernels")
    ap.add_argument("--contenders", default="aotc,cudnn",
                    help="comma-separated: aotc, base, base2, ... (--baseline-bundle), cudnn, fa3 (bf16 only)")
    ap.add_argument("--seqlen", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dtype", action="append", choices=("bf16", "fp16"), help="repeatable (default bf16 and fp16)")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    ap.add_argument("--name", default="fp16_power_probe.json")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.bench_runtime import git_commit, load_baselines

    runtimes = {"aotc": aotc.runtime.load(args.bundle), **load_baselines(args.baseline_bundle)}
    contenders = args.contenders.split(",")
    for name in contenders:
        if name not in (*runtimes, "cudnn", "fa3"):
            raise SystemExit(f"--contenders: {name!r} is not aotc, cudnn, fa3 or one of {sorted(runtimes)}")
    B, S, H, D = 1, args.seqlen, 16, args.head_dim
    flops = 4 * B * H * S * S * D // (2 if args.causal else 1)
    rows = []
    dtypes = args.dtype or ["bf16", "fp16"]
    fa3 = None
    if "fa3" in contenders:
        from benchmarks.bench_runtime import import_fa3
        fa3 = import_fa3()
    pairs = [(c, d) for c in contenders for d in dtypes if c != "fa3" or d == "bf16"]
    for round_ in range(args.rounds):
        for contender, dtype_name in pairs + pairs[::-1]:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
            gen = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, S, H, D, dtype=dt, device="cuda", generator=gen) for _ in range(3))
            out = torch.empty_like(q)
            if contender in runtimes:
                plan = runtimes[contender].prepare_prefill(q, k, v, out, causal=args.causal)
                ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())

                def fn():
                    plan.run(*ptrs, 0, 0, 0, torch.cuda.current_stream().cuda_stream)
            elif contender == "fa3":
                def fn():
                    fa3.flash_attn_func(q, k, v, causal=args.causal)
            else:
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def fn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
            row = {"contender": contender, "dtype": dtype_name, "round": round_, **sampled_run(fn, args.seconds)}
            row["tflops"] = flops / row["ms_per_call"] / 1e9
            rows.append(row)
            print(json.dumps({k_: round(v_, 2) if isinstance(v_, float) else v_ for k_, v_ in row.items()}), flush=True)
            del q, k, v, out
            torch.cuda.empty_cache()
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
              "git_commit": git_commit(),
              "command": "python benchmarks/probes/fp16_power_probe.py " + " ".join(sys.argv[1:]),
              "shape": {"B": B, "S": S, "H": H, "D": D, "causal": args.causal},
              "bundles": {name: str(path) for name, path in zip(runtimes, [args.bundle, *args.baseline_bundle])},
              "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / args.name).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
