"""Cold start of a serving process: torch already imported and tensors allocated, the time to import
aotc.runtime, load the bundle and finish the first prefill call (no compiler anywhere).

    python benchmarks/cold_start.py --bundle artifacts/default.aotc --runs 5 --out benchmarks/results

Each run is a fresh Python process (this file with --child); the parent writes cold_start.json with one
row per run (import_ms, load_ms, first_call_ms, total_ms, and which of cutlass/torch/numpy/cuda the
runtime's import brought in: none, since torch was imported before and the others never are).

--bytecode compiled (the default) first byte-compiles aotc (python -m compileall), as `pip install`
leaves an installed package; --bytecode source measures a tree with no bytecode cache, where every
process compiles aotc's modules from source (a checkout run with PYTHONDONTWRITEBYTECODE=1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(bundle: str) -> dict:
    import torch

    torch.cuda.init()
    q = torch.randn(1, 512, 16, 128, dtype=torch.bfloat16, device="cuda")
    k, v, out = torch.randn_like(q), torch.randn_like(q), torch.empty_like(q)
    torch.cuda.synchronize()
    before = set(sys.modules)
    t0 = time.perf_counter()
    import aotc.runtime

    t1 = time.perf_counter()
    rt = aotc.runtime.load(bundle)
    t2 = time.perf_counter()
    rt.prefill(q, k, v, out, causal=True, stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    brought = sorted({m.split(".")[0] for m in set(sys.modules) - before} & {"cutlass", "torch", "numpy", "cuda"})
    return {"import_ms": round((t1 - t0) * 1e3, 2), "load_ms": round((t2 - t1) * 1e3, 2),
            "first_call_ms": round((t3 - t2) * 1e3, 2), "total_ms": round((t3 - t0) * 1e3, 2),
            "kernels": sum(len(x) for x in rt.kernels.values()), "runtime_imported": brought,
            "cutlass_in_process": "cutlass" in sys.modules}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--bytecode", choices=("compiled", "source"), default="compiled")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(child(args.bundle)))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_runtime import git_commit

    import shutil

    for cache in (ROOT / "aotc").rglob("__pycache__"):
        shutil.rmtree(cache)
    if args.bytecode == "compiled":
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "aotc")], check=True)
    env = dict(os.environ, **({"PYTHONDONTWRITEBYTECODE": "1"} if args.bytecode == "source" else {}))
    rows = []
    for _ in range(args.runs):
        r = subprocess.run([sys.executable, __file__, "--child", "--bundle", args.bundle], capture_output=True,
                           text=True, check=True, env=env)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    import statistics

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": gpu, "git_commit": git_commit(),
              "command": "python benchmarks/cold_start.py " + " ".join(sys.argv[1:]), "bundle": args.bundle,
              "bytecode": args.bytecode,
              "median_total_ms": statistics.median(r["total_ms"] for r in rows), "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = "cold_start.json" if args.bytecode == "compiled" else "cold_start_source.json"
    (Path(args.out) / name).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
