"""Decode over a paged KV cache against torch SDPA (cuDNN and flash backends) on dense KV, side by side.

    python benchmarks/bench_decode.py --bundle artifacts/default.aotc --out benchmarks/results

bf16, D 128, H_q/H_kv = 32/8, S_q = 1, pages of 16 and 64 tokens (NHD, shuffled page ids).
Each implementation runs as a CUDA graph of 10 calls (so host launch cost does not hide the GPU
time), median of 20 replays after an L2 flush. Effective KV bandwidth = bytes of K and V of the
logical problem (2 * B * S_kv * H_kv * D * 2) / time; torch reads dense [B, H_kv, S_kv, D] with
enable_gqa=True, and so does aotc's dense-KV variant in the "aotc dense" column (page 16 rows only):
the paged figure against it is the cost of the page gather. Also the host enqueue of one prepared decode step (one launch, split-KV) against a
bare cuLaunchKernel of the decode cubin, 10,000 calls each.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def graph_time(fn, flush, calls=10, replays=20):
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        flush()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(times)


def paged_problem(rt, page, B, S, H_q, H_kv, D, max_splits):
    """A bf16 decode problem over an NHD page pool with shuffled page ids, every sequence S long:
    (k, v, page_table, seqlens, q, out, workspace for up to max_splits splits)."""
    import torch

    n_pages = B * S // page
    k = torch.randn(n_pages, page, H_kv, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    pt = torch.randperm(n_pages, device="cuda", dtype=torch.int32).view(B, S // page)
    sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    ws = torch.empty(rt.decode_workspace_bytes(B, 1, H_q, D, max_splits), dtype=torch.uint8, device="cuda")
    return k, v, pt, sl, q, out, ws


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.bench_runtime import time_calls

    rt = aotc.runtime.load(args.bundle)
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    D, H_q, H_kv = 128, 32, 8
    rows = []
    host = {}
    for page in (16, 64):
        for B, S in ((1, 32768), (8, 8192), (64, 8192), (128, 8192), (8, 32768)):
            kv_bytes = 2 * B * S * H_kv * D * 2
            row = {"page": page, "B": B, "S_kv": S, "H_q": H_q, "H_kv": H_kv, "D": D, "kv_bytes": kv_bytes}
            k, v, pt, sl, q, out, ws = paged_problem(rt, page, B, S, H_q, H_kv, D, 64)
            qt = q.transpose(1, 2)
            try:
                plan = rt.prepare_decode(q, k, v, out, sl, pt, max_seqlen_kv=S, workspace=ws)
                # correctness at the benchmark's own shape first (against torch's math on dense KV)
                plan(q, out, stream=torch.cuda.current_stream())
                torch.cuda.synchronize()
            except Exception as e:
                row["aotc_error"] = f"{type(e).__name__}: {e}"
            if "aotc_error" not in row and B * S <= 300_000:
                kd = k[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2)
                vd = v[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2)
                with sdpa_kernel(SDPBackend.MATH):
                    ref = F.scaled_dot_product_attention(qt.float(), kd.float(), vd.float(), enable_gqa=True)
                row["max_abs_err_vs_fp32"] = float((out.transpose(1, 2).float() - ref).abs().max())
                del kd, vd, ref
            try:
                stream_fn = lambda: plan.run(q.data_ptr(), out.data_ptr(), 0, 0, 0,  # noqa: E731
                                             torch.cuda.current_stream().cuda_stream)
                us = graph_time(stream_fn, flush_buf.zero_)
                torch.cuda.synchronize()
                row.update(aotc_us=us, aotc_TBps=kv_bytes / us / 1e6, splits=plan.num_splits, variant=plan.variant.name,
                           workspace_bytes=plan.workspace_bytes)
                if page == 16 and B == 1:  # a split step (the merge runs in the same launch)
                    st = torch.cuda.current_stream().cuda_stream
                    host["aotc_prepared_decode_step"] = time_calls(
                        lambda i: plan.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, st), 10000, torch.cuda.synchronize)
                    from cuda.bindings import driver as cu

                    lau = plan.launcher
                    kern, cs, g, b_ = cu.CUkernel(lau.handle), cu.CUstream(st), lau.grid, lau.block
                    host["bare_cuLaunchKernel_decode_cubin"] = time_calls(
                        lambda i: cu.cuLaunchKernel(kern, g[0], g[1], g[2], b_[0], b_[1], b_[2], lau.smem, cs,
                                                    lau.params.address, 0), 10000, torch.cuda.synchronize)
            except Exception as e:
                row["aotc_error"] = f"{type(e).__name__}: {e}"
            # torch on dense KV of the same logical shape
            kd = k[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2).contiguous()
            vd = v[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2).contiguous()
            del k, v
            if page == 16 and "aotc_error" not in row:
                # aotc's dense-KV variant on cuDNN's very tensors: what the paged gather costs
                try:
                    dense = rt.prepare_decode(q, kd.transpose(1, 2), vd.transpose(1, 2), out, sl, None,
                                              max_seqlen_kv=S, workspace=ws)
                    us = graph_time(lambda: dense.run(q.data_ptr(), out.data_ptr(), 0, 0, 0,
                                                      torch.cuda.current_stream().cuda_stream), flush_buf.zero_)
                    row.update(aotc_dense_us=us, aotc_dense_TBps=kv_bytes / us / 1e6)
                except Exception as e:
                    row["aotc_dense_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                try:
                    def call():
                        with sdpa_kernel(backend):
                            F.scaled_dot_product_attention(qt, kd, vd, enable_gqa=True)
                    us = graph_time(call, flush_buf.zero_)
                    row[f"{name}_us"], row[f"{name}_TBps"] = us, kv_bytes / us / 1e6
                    if "aotc_us" in row:
                        row[f"x_{name}"] = row[f"{name}_us"] / row["aotc_us"]
                    if page == 16 and B == 1 and f"torch_sdpa_{name}" not in host:
                        host[f"torch_sdpa_{name}"] = time_calls(lambda i: call(), 10000, torch.cuda.synchronize)
                except Exception as e:
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
            del kd, vd, pt, q, out, ws
            torch.cuda.empty_cache()
    floor = host.get("bare_cuLaunchKernel_decode_cubin", {}).get("median_us")
    for v_ in host.values():
        if floor and "median_us" in v_:
            v_["x_bare_launch"] = v_["median_us"] / floor
    import subprocess

    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
              "clocks": subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem",
                                        "--format=csv,noheader"], capture_output=True, text=True).stdout.strip(),
              "torch": torch.__version__, "git_commit": os.environ.get("AOTC_GIT_COMMIT", "unknown"),
              "command": "python benchmarks/bench_decode.py " + " ".join(sys.argv[1:]), "rows": rows,
              "host_enqueue": host}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode.json").write_text(json.dumps(result, indent=1))
    print(f"{'page':>4} {'B':>4} {'S_kv':>6} {'splits':>6} {'aotc TB/s':>9} {'cuDNN':>7} {'flash':>7} {'x cuDNN':>8}")
    for r in rows:
        print(f"{r['page']:>4} {r['B']:>4} {r['S_kv']:>6} {r.get('splits', 0):>6} {r.get('aotc_TBps', float('nan')):>9.2f} "
              f"{r.get('cudnn_TBps', float('nan')):>7.2f} {r.get('flash_TBps', float('nan')):>7.2f} "
              f"{r.get('x_cudnn', float('nan')):>8.2f}")
    for n, v_ in host.items():
        print(n, {k_: round(x, 2) for k_, x in v_.items() if isinstance(x, float)})


if __name__ == "__main__":
    main()
