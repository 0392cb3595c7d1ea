"""A split-KV decode step against torch SDPA's cuDNN backend, and the step's cost over split counts.

    python benchmarks/decode_breakdown.py --bundle artifacts/default.aotc --out benchmarks/results

bf16, D 128, H_q/H_kv = 32/8, S_q = 1, NHD pages (shuffled ids). Per shape, each as a CUDA graph of 10
calls after an L2 flush (benchmarks/timing.py: clocks settled first), in interleaved rounds, rotated (median of rounds):
  step       the prepared step: one sdpa_decode launch (with splits, the last split of each
             (sequence, KV head) merges the partials in the same launch)
  cudnn      torch SDPA (cuDNN backend) on dense KV of the same logical shape
and, for B = 1, the step at forced split counts (for B = 64, forced counts 2-4 join the interleaved rounds). Host: the prepared step and a bare cuLaunchKernel of
the decode cubin with the same parameters, 5,000 calls each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.bench_decode import paged_problem, step_enqueue
    from benchmarks.timing import graph_time, interleaved
    from benchmarks.bench_runtime import git_commit

    rt = aotc.runtime.load(args.bundle)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    D, H_q, H_kv = 128, 32, 8
    rows, host = [], {}
    for page, B, S in ((16, 1, 32768), (64, 1, 32768), (16, 8, 8192), (16, 8, 32768), (16, 64, 8192)):
        kv_bytes = 2 * B * S * H_kv * D * 2
        k, v, pt, sl, q, out, ws = paged_problem(rt, page, B, S, H_q, H_kv, D, 256)
        plan = rt.prepare_decode(q, k, v, out, sl, pt, max_seqlen_kv=S, workspace=ws)
        row = {"page": page, "B": B, "S_kv": S, "kv_bytes": kv_bytes, "chunks": plan.chunks}

        def cur():  # graph_time captures on a side stream: launch on whatever stream is current
            return torch.cuda.current_stream().cuda_stream
        contenders = {"step": lambda: plan.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, cur())}
        kd = k[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2).contiguous()
        vd = v[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2).contiguous()
        qt = q.transpose(1, 2)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kd, vd, enable_gqa=True)
        contenders["cudnn"] = cudnn
        if B >= 64:
            # large batches: is the heuristic's split count (1: one wave of CTAs per 2 per SM) the best?
            for splits in (2, 3, 4):
                if splits != plan.chunks:
                    p = rt.prepare_decode(q, k, v, out, sl, pt, max_seqlen_kv=S, workspace=ws, chunks=splits)
                    contenders[f"splits{splits}"] = lambda p=p: p.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, cur())
        # correctness of the step at this shape (fp32 reference on the dense copy)
        plan.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, cur())
        torch.cuda.synchronize()
        if B * S <= 300_000:
            with sdpa_kernel(SDPBackend.MATH):
                ref = F.scaled_dot_product_attention(qt.float(), kd.float(), vd.float(), enable_gqa=True)
            row["max_abs_err_vs_fp32"] = float((out.transpose(1, 2).float() - ref).abs().max())
        samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush)) for n, fn in contenders.items()}, args.rounds)
        for n, ts in samples.items():
            row[f"{n}_us"] = statistics.median(ts)
        row["step_TBps"] = kv_bytes / row["step_us"] / 1e6
        row["x_cudnn"] = row["cudnn_us"] / row["step_us"]
        if B == 1:
            sweep = {}
            for splits in (16, 24, 32, 48, 64, 96, 128, 192, 256):
                p = rt.prepare_decode(q, k, v, out, sl, pt, max_seqlen_kv=S, workspace=ws, chunks=splits)
                sweep[splits] = graph_time(lambda: p.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, cur()), flush)
            row["split_sweep_us"] = sweep
        if page == 16 and B == 1:
            host.update(step_enqueue(plan, q, out, cur(), 5000))
        rows.append(row)
        print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
        del k, v, kd, vd, pt, q, out, ws, plan
        torch.cuda.empty_cache()
    floor = host.get("bare_cuLaunchKernel_decode_cubin", {}).get("median_us")
    for v_ in host.values():
        if floor:
            v_["x_bare_launch"] = v_["median_us"] / floor
    print(json.dumps(host), flush=True)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "git_commit": git_commit(),
              "command": "python benchmarks/decode_breakdown.py " + " ".join(sys.argv[1:]), "rows": rows,
              "host_enqueue": host}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode_breakdown.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
