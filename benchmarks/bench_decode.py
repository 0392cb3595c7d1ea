"""Decode over a paged KV cache against torch SDPA (cuDNN and flash backends) on dense KV, side by side.

    python benchmarks/bench_decode.py --bundle artifacts/default.aotc --out benchmarks/results

bf16, D 128, H_q/H_kv = 32/8, S_q = 1, pages of 16 and 64 tokens (NHD, shuffled page ids).
Each implementation runs as a CUDA graph of 10 calls (so host launch cost does not hide the GPU
time), median of 20 replays after an L2 flush, once the clocks have settled on it; the
implementations take turns for --rounds rounds in rotated order, median of rounds
(benchmarks/timing.py). Effective KV bandwidth = bytes of K and V of the
logical problem (2 * B * S_kv * H_kv * D * 2) / time; torch reads dense [B, H_kv, S_kv, D] with
enable_gqa=True, and so does aotc's dense-KV variant in the "aotc dense" column (page 16 rows only):
the paged figure against it is the cost of the page gather. Also the host enqueue of one prepared decode step (one launch, split-KV) against a
bare cuLaunchKernel of the decode cubin, 10,000 calls each.

A/B of a kernel change: --baseline-bundle OLD.aotc runs OLD's paged decode kernel as contender "base"
in the same rounds (x_base = base time / aotc time), through benchmarks/legacy.py when its parameter
list is an earlier aotc's; "aa" is a second plan of aotc's own kernel on the same tensors (the A/A
control).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import graph_time, interleaved  # noqa: E402


def paged_problem(rt, page, B, S, H_q, H_kv, D, max_chunks):
    """A bf16 decode problem over an NHD page pool with shuffled page ids, every sequence S long:
    (k, v, page_table, seqlens, q, out, workspace for up to max_chunks chunks)."""
    import torch

    n_pages = B * S // page
    k = torch.randn(n_pages, page, H_kv, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    pt = torch.randperm(n_pages, device="cuda", dtype=torch.int32).view(B, S // page)
    sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    ws = torch.empty(rt.decode_workspace_bytes(B, 1, H_q, D, max_chunks), dtype=torch.uint8, device="cuda")
    return k, v, pt, sl, q, out, ws


def step_enqueue(plan, q, out, stream: int, calls: int) -> dict:
    """Host enqueue of a prepared decode step (new q/out pointers each call, as a serving loop passes them)
    and of a bare cuLaunchKernel of the same cubin with the same parameters: {name: time_calls result}."""
    import torch
    from cuda.bindings import driver as cu

    from benchmarks.bench_runtime import time_calls

    lau = plan.launcher
    kern, cs, g, b = cu.CUkernel(lau.handle), cu.CUstream(stream), lau.grid, lau.block
    return {
        "aotc_prepared_decode_step": time_calls(
            lambda i: plan.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, stream), calls, torch.cuda.synchronize),
        "bare_cuLaunchKernel_decode_cubin": time_calls(
            lambda i: cu.cuLaunchKernel(kern, g[0], g[1], g[2], b[0], b[1], b[2], lau.smem, cs, lau.params.address,
                                        0), calls, torch.cuda.synchronize),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median)")
    ap.add_argument("--baseline-bundle", action="append", default=[],
                    help="another bundle (e.g. built from the previous commit): its decode kernel runs as contender "
                         "'base' on the same tensors in the same rounds (A/B of a kernel change); repeat for "
                         "'base2', ...")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.bench_runtime import load_baselines, result_header, time_calls

    from benchmarks.legacy import LegacyDecode, legacy_decode_kernels

    rt = aotc.runtime.load(args.bundle)
    legacy = {f"base{'' if i == 0 else i + 1}": legacy_decode_kernels(p) for i, p in enumerate(args.baseline_bundle)}
    rt_bases = {n: rt_b for n, rt_b in load_baselines(args.baseline_bundle).items() if not legacy[n]}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    D, H_q, H_kv = 128, 32, 8
    rows = []
    host = {}
    for page in (16, 64):
        for B, S in ((1, 32768), (8, 8192), (64, 8192), (128, 8192), (8, 32768)):
            kv_bytes = 2 * B * S * H_kv * D * 2
            row = {"page": page, "B": B, "S_kv": S, "H_q": H_q, "H_kv": H_kv, "D": D, "kv_bytes": kv_bytes}
            k, v, pt, sl, q, out, ws = paged_problem(rt, page, B, S, H_q, H_kv, D, 2 * sms)
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
            # contenders: one enqueue each, timed as CUDA graphs in interleaved rounds (benchmarks/timing.py)
            st = torch.cuda.current_stream().cuda_stream
            contenders = {}
            if "aotc_error" not in row:
                # (bound through defaults: the loop's names are deleted before the next shape)
                contenders["aotc"] = lambda p=plan, qp=q.data_ptr(), op=out.data_ptr(): p.run(
                    qp, op, 0, 0, 0, torch.cuda.current_stream().cuda_stream)
                aa_out = torch.empty_like(out)
                aa = rt.prepare_decode(q, k, v, aa_out, sl, pt, chunks=plan.chunks)
                contenders["aa"] = lambda p=aa, qp=q.data_ptr(), op=aa_out.data_ptr(): p.run(
                    qp, op, 0, 0, 0, torch.cuda.current_stream().cuda_stream)
                row.update(chunks=plan.chunks, variant=plan.variant.name, workspace_bytes=plan.workspace_bytes)
                for bname, kernels in legacy.items():
                    kern = kernels.get(("bf16", D, f"paged{page}"))
                    if kern is None:
                        continue
                    base = LegacyDecode(kern, q, k, v, torch.empty_like(out), sl, pt, S, sms)
                    row[f"{bname}_splits"] = base.splits
                    contenders[bname] = lambda p=base: p(torch.cuda.current_stream().cuda_stream)
                for bname, rt_b in rt_bases.items():
                    try:  # a bundle of this aotc's decode ABI: the same chunk count, so only the kernel differs
                        base = rt_b.prepare_decode(q, k, v, out, sl, pt, workspace=ws, chunks=plan.chunks)
                        contenders[bname] = lambda p=base, qp=q.data_ptr(), op=out.data_ptr(): p.run(
                            qp, op, 0, 0, 0, torch.cuda.current_stream().cuda_stream)
                    except Exception as e:
                        row[f"{bname}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            # torch on dense KV of the same logical shape
            kd = k[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2).contiguous()
            vd = v[pt.long()].reshape(B, S, H_kv, D).transpose(1, 2).contiguous()
            if page == 16 and "aotc_error" not in row:
                # aotc's dense-KV variant on cuDNN's very tensors: what the paged gather costs
                try:
                    dense = rt.prepare_decode(q, kd.transpose(1, 2), vd.transpose(1, 2), out, sl, None,
                                              max_seqlen_kv=S, workspace=ws)
                    contenders["aotc_dense"] = lambda p=dense, qp=q.data_ptr(), op=out.data_ptr(): p.run(
                        qp, op, 0, 0, 0, torch.cuda.current_stream().cuda_stream)
                except Exception as e:
                    row["aotc_dense_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                for bname, rt_b in rt_bases.items():
                    if "aotc_dense" not in contenders:
                        break
                    try:
                        base = rt_b.prepare_decode(q, kd.transpose(1, 2), vd.transpose(1, 2), out, sl, None,
                                                   max_seqlen_kv=S, workspace=ws, chunks=dense.chunks)
                        contenders[f"{bname}_dense"] = lambda p=base, qp=q.data_ptr(), op=out.data_ptr(): p.run(
                            qp, op, 0, 0, 0, torch.cuda.current_stream().cuda_stream)
                    except Exception as e:
                        row[f"{bname}_dense_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                def call(backend=backend, qt=qt, kd=kd, vd=vd):
                    with sdpa_kernel(backend):
                        F.scaled_dot_product_attention(qt, kd, vd, enable_gqa=True)
                try:
                    call()
                    torch.cuda.synchronize()
                    contenders[name] = call
                except Exception as e:
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            samples = interleaved({n: (lambda fn=fn: graph_time(fn, flush_buf.zero_)) for n, fn in contenders.items()},
                                  args.rounds)
            for n, ts in samples.items():
                us = statistics.median(ts)
                row[f"{n}_us"], row[f"{n}_TBps"] = us, kv_bytes / us / 1e6
            for n in ("cudnn", "flash", "aa", *legacy, *rt_bases):
                if f"{n}_us" in row and "aotc_us" in row:
                    row[f"x_{n}"] = row[f"{n}_us"] / row["aotc_us"]
                if f"{n}_dense_us" in row and "aotc_dense_us" in row:
                    row[f"dense_x_{n}"] = row[f"{n}_dense_us"] / row["aotc_dense_us"]
            if page == 16 and B == 1 and "aotc" in contenders:
                # host enqueue: a prepared split step (the merge runs in the same launch), a bare
                # cuLaunchKernel of its cubin, and torch SDPA
                host.update(step_enqueue(plan, q, out, st, 10000))
                for name in ("cudnn", "flash"):
                    if name in contenders:
                        host[f"torch_sdpa_{name}"] = time_calls(lambda i, c=contenders[name]: c(), 10000,
                                                                torch.cuda.synchronize)
            rows.append(row)
            print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
            del k, v, kd, vd, pt, q, out, ws, contenders
            torch.cuda.empty_cache()
    floor = host.get("bare_cuLaunchKernel_decode_cubin", {}).get("median_us")
    for v_ in host.values():
        if floor and "median_us" in v_:
            v_["x_bare_launch"] = v_["median_us"] / floor
    result = {**result_header("benchmarks/bench_decode.py"), "rows": rows, "host_enqueue": host}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode.json").write_text(json.dumps(result, indent=1))
    bases = ["aa", *legacy, *rt_bases]
    print(f"{'page':>4} {'B':>4} {'S_kv':>6} {'chunks':>6} {'aotc TB/s':>9} {'cuDNN':>7} {'flash':>7} {'x cuDNN':>8}"
          + "".join(f" {b + ' TB/s':>10} {'x ' + b:>8}" for b in bases))
    for r in rows:
        print(f"{r['page']:>4} {r['B']:>4} {r['S_kv']:>6} {r.get('chunks', 0):>6} {r.get('aotc_TBps', float('nan')):>9.2f} "
              f"{r.get('cudnn_TBps', float('nan')):>7.2f} {r.get('flash_TBps', float('nan')):>7.2f} "
              f"{r.get('x_cudnn', float('nan')):>8.2f}"
              + "".join(f" {r.get(b + '_TBps', float('nan')):>10.2f} {r.get('x_' + b, float('nan')):>8.2f}" for b in bases))
    for n, v_ in host.items():
        print(n, {k_: round(x, 2) for k_, x in v_.items() if isinstance(x, float)})


if __name__ == "__main__":
    main()
