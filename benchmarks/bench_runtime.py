"""Runtime figures on a GPU: bundle load, first launch, host enqueue against a bare cuLaunchKernel, combine bandwidth.

    python benchmarks/bench_runtime.py --bundle artifacts/default.aotc --out benchmarks/results

Host enqueue: N calls, each timed alone with perf_counter_ns; the GPU is
synchronized every 256 calls outside the timer so the launch queue never
fills. Every path launches the same combine cubin on the same arguments.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def time_calls(fn, n, sync):
    samples = []
    for i in range(n):
        if i % 256 == 0:
            sync()
        t0 = time.perf_counter_ns()
        fn(i)
        samples.append(time.perf_counter_ns() - t0)
    sync()
    return {"median_us": statistics.median(samples) / 1e3, "p99_us": percentile(samples, 0.99) / 1e3, "calls": n}


def import_fa3():
    """FlashAttention-3's interface from the fa3-fwd wheel, whose interface imports its config under the
    name flash_attn_config: the wheel's fa3_fwd_config module is registered under that name first."""
    import importlib

    sys.modules["flash_attn_config"] = importlib.import_module("fa3_fwd_config")
    return importlib.import_module("fa3_fwd_interface")


def git_commit() -> str:
    """AOTC_GIT_COMMIT when set (the GPU machine gets a copy of the tree whose git history may be older than its
    files), else git's HEAD, with "+uncommitted" when tracked files differ from it: a result file's git_commit
    names the commit whose kernels ran, so a tree that is not that commit never passes for it."""
    env = os.environ.get("AOTC_GIT_COMMIT")
    if env:
        return env
    head = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                             capture_output=True, text=True)
    dirty = changed.returncode != 0 or changed.stdout.strip()
    return head.stdout.strip() + ("+uncommitted" if dirty else "")


def result_header(script: str, args: list[str] | None = None) -> dict:
    """The fields a GPU benchmark's result file starts with: date, gpu, clocks (nvidia-smi: driver, SM clock
    now and at most, memory clock), torch, git_commit, and the command (`script` with `args`, by default
    this process's arguments)."""
    import torch

    try:
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem",
                                 "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError as e:  # no nvidia-smi on this machine: the figures stand without it
        clocks = f"unknown ({e})"
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
            "clocks": clocks, "torch": torch.__version__, "git_commit": git_commit(),
            "command": " ".join(["python", script, *(sys.argv[1:] if args is None else args)])}


def write_rows(path: str, script: str, rows: list[dict]) -> None:
    """A probe's rows as a result file at path: result_header(script)'s fields, then rows."""
    from pathlib import Path

    Path(path).write_text(json.dumps({**result_header(script), "rows": rows}, indent=1) + "\n")


def dist_version(dist: str) -> str | None:
    """The installed version of a distribution (e.g. the fa3-fwd wheel), None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def load_baselines(paths: list[str]) -> dict:
    """--baseline-bundle runtimes by contender name: 'base', 'base2', 'base3', ... in the order given. A
    bundle of an earlier aotc whose parameter lists differ only by the pointee alignments this one records
    is loaded with its ABIs upgraded (benchmarks/legacy.py), so its cubins run beside the current ones."""
    from benchmarks.legacy import load_prefill_runtime

    return {("base" if i == 0 else f"base{i + 1}"): load_prefill_runtime(p) for i, p in enumerate(paths)}


def driver_free() -> int:
    from cuda.bindings import driver as cu

    err, free, _total = cu.cuMemGetInfo()
    return int(free)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--calls", type=int, default=10000)
    args = ap.parse_args()

    t0 = time.perf_counter()
    import aotc.runtime as aotc_rt
    t_import = time.perf_counter() - t0
    t0 = time.perf_counter()
    rt = aotc_rt.load(args.bundle)
    t_load = time.perf_counter() - t0

    import torch
    from cuda.bindings import driver as cu

    torch.cuda.init()
    dev = torch.device("cuda")
    results = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(0),
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "python": platform.python_version(), "torch": torch.__version__,
        "git_commit": git_commit(),
        "bundle": args.bundle, "bundle_bytes": os.path.getsize(args.bundle),
        "import_runtime_s": t_import, "load_bundle_s": t_load, "kernels": sum(len(v) for v in rt.kernels.values()),
    }

    # a decode-shaped combine: B=64, H=32, S_q=1, D=128, 8 splits, bf16 out, LSE out
    splits, B, S, H, D = 8, 64, 1, 32, 128
    op = torch.randn(splits, B, S, H, D, device=dev)
    lp = torch.randn(splits, B, H, S, device=dev)
    out = torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16)
    lse = torch.empty(B, H, S, device=dev)
    t0 = time.perf_counter()
    plan = rt.prepare_combine(op, lp, out, lse)
    t_prepare_first = time.perf_counter() - t0  # includes the lazy cuLibraryLoadData + ABI check
    stream = torch.cuda.current_stream().cuda_stream
    plan.run(op.data_ptr(), lp.data_ptr(), out.data_ptr(), lse.data_ptr(), stream)
    torch.cuda.synchronize()
    results["first_prepare_s"] = t_prepare_first
    results["variant"] = plan.variant.name

    # GPU memory held by loaded modules: lazy loading keeps it proportional to the kernels used
    torch.cuda.synchronize()
    free0 = driver_free()
    loaded = 0
    for kernels in rt.kernels.values():
        for kern in kernels:
            if not kern.loaded:
                kern.ensure_loaded(torch.cuda.current_device())
                loaded += 1
    torch.cuda.synchronize()
    results["gpu_memory"] = {"modules_loaded": loaded, "free_bytes_drop": free0 - driver_free(),
                             "note": "cuMemGetInfo free before/after loading every kernel of the bundle"}


    # the floor: the same cubin launched bare, parameters pre-packed, through cuda.bindings and through ctypes
    lau = plan.launcher
    kernel = cu.CUkernel(lau.handle)
    cstream = cu.CUstream(stream)
    params = lau.params.address
    g, b = lau.grid, lau.block

    def bare_bindings(_):
        cu.cuLaunchKernel(kernel, g[0], g[1], g[2], b[0], b[1], b[2], lau.smem, cstream, params, 0)

    libcuda = ctypes.CDLL("libcuda.so.1")
    fn = libcuda.cuLaunchKernel
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    fn.restype = ctypes.c_int
    handle = lau.handle

    def bare_ctypes(_):
        fn(handle, g[0], g[1], g[2], b[0], b[1], b[2], lau.smem, stream, params, None)

    ptrs = [(op.data_ptr(), lp.data_ptr(), out.data_ptr(), lse.data_ptr())]
    op2, lp2 = op.clone(), lp.clone()
    out2, lse2 = torch.empty_like(out), torch.empty_like(lse)
    ptrs.append((op2.data_ptr(), lp2.data_ptr(), out2.data_ptr(), lse2.data_ptr()))
    same = ptrs[0]

    def prepared_same(_):
        plan.run(same[0], same[1], same[2], same[3], stream)

    def prepared_changed(i):
        p = ptrs[i & 1]
        plan.run(p[0], p[1], p[2], p[3], stream)

    tstream = torch.cuda.current_stream()

    def prepared_tensors(_):
        plan(op, lp, out, lse, stream=tstream)

    def convenience(_):
        rt.combine(op, lp, out, lse, stream=tstream)

    q = torch.randn(1, 32, 1, 128, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(1, 32, 1024, 128, device=dev, dtype=torch.bfloat16)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def torch_sdpa(backend):
        def call(_):
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(q, kv, kv)
        return call

    n = args.calls
    host = {}
    for name, f in [("bare_cuLaunchKernel_cuda_bindings", bare_bindings), ("bare_cuLaunchKernel_ctypes", bare_ctypes),
                    ("aotc_prepared_same_pointers", prepared_same), ("aotc_prepared_changed_pointers", prepared_changed),
                    ("aotc_prepared_tensors", prepared_tensors), ("aotc_convenience_combine", convenience),
                    ("torch_sdpa_cudnn_decode", torch_sdpa(SDPBackend.CUDNN_ATTENTION)),
                    ("torch_sdpa_flash_decode", torch_sdpa(SDPBackend.FLASH_ATTENTION))]:
        try:
            f(0)
            torch.cuda.synchronize()
            time_calls(f, min(n, 1000), torch.cuda.synchronize)  # warm-up
            host[name] = time_calls(f, n, torch.cuda.synchronize)
        except Exception as e:  # a missing torch backend must not hide the rest
            host[name] = {"error": f"{type(e).__name__}: {e}"}
    floor = host["bare_cuLaunchKernel_cuda_bindings"]["median_us"]
    for v in host.values():
        if "median_us" in v:
            v["x_floor_cuda_bindings"] = v["median_us"] / floor
            v["x_floor_ctypes"] = v["median_us"] / host["bare_cuLaunchKernel_ctypes"]["median_us"]
    results["host_enqueue"] = host

    # kernel time and bandwidth for a few combine shapes: 20 launches captured in a CUDA graph, so the
    # host's launch cost does not idle the GPU between them; median over 30 replays (CUDA events), no L2
    # flush (the partials of a decode step are fresh in L2 when the combine reads them)
    from benchmarks.timing import graph_time

    kernel_rows = []
    for splits, B, H, S in [(8, 64, 32, 1), (16, 1, 32, 1), (4, 8, 32, 4), (32, 128, 32, 1), (16, 512, 32, 4)]:
        op = torch.randn(splits, B, S, H, D, device=dev)
        lp = torch.randn(splits, B, H, S, device=dev)
        out = torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16)
        lse = torch.empty(B, H, S, device=dev)
        pl = rt.prepare_combine(op, lp, out, lse)
        us = graph_time(lambda: pl.run(op.data_ptr(), lp.data_ptr(), out.data_ptr(), lse.data_ptr(),
                                       torch.cuda.current_stream().cuda_stream),
                        flush=lambda: None, calls=20, replays=30)
        nbytes = op.numel() * 4 + lp.numel() * 4 + out.numel() * 2 + lse.numel() * 4
        kernel_rows.append({"splits": splits, "B": B, "H": H, "S_q": S, "D": D, "median_us": us,
                            "bytes": nbytes, "GB_per_s": nbytes / us / 1e3})
    results["combine_kernel"] = kernel_rows

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "runtime.json"
    path.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    print(f"\nwrote {path}")
    print(f"{'path':<40} {'median us':>10} {'p99 us':>8} {'x floor':>8}")
    for name, v in host.items():
        if "median_us" in v:
            print(f"{name:<40} {v['median_us']:>10.2f} {v['p99_us']:>8.2f} {v['x_floor_cuda_bindings']:>8.2f}")
        else:
            print(f"{name:<40} {v['error']}")


if __name__ == "__main__":
    main()
