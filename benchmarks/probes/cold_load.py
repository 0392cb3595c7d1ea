"""Cold start of the runtime without a GPU: `import aotc.runtime` and `aotc.runtime.load(bundle)` in a fresh
process, torch imported first when it is installed (as in a serving process).

    python benchmarks/probes/cold_load.py [--bundle artifacts/default.aotc] [--runs 10] [--importtime]

Each run is a new Python process (this file with --child); prints import_ms and load_ms of every run,
then the medians. first_use_ms is what the first kernel call does on the CPU before the driver and that
load() may have left to it: the tensor adapters' import (aotc.runtime.as_tensor) and one member's
checks (header and bytes: LoadedKernel.verified_artifact of the first sdpa_prefill kernel). The run
inherits the environment: with PYTHONDONTWRITEBYTECODE=1 (as on this machine) every aotc module is
compiled from source in every process. --importtime prints the child's `python -X importtime` lines for aotc modules (cumulative
microseconds) once, to see which import costs what.
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


def child(bundle: str) -> dict:
    try:
        import torch  # noqa: F401  (a serving process has it; its import is not the runtime's cost)
    except ImportError:
        pass
    t0 = time.perf_counter()
    import aotc.runtime

    t1 = time.perf_counter()
    rt = aotc.runtime.load(bundle)
    t2 = time.perf_counter()
    aotc.runtime.as_tensor  # noqa: B018  (its import)
    pool = rt.kernels.get("sdpa_prefill") or next(iter(rt.kernels.values()))
    pool[0].verified_artifact()
    t3 = time.perf_counter()
    return {"import_ms": round((t1 - t0) * 1e3, 2), "load_ms": round((t2 - t1) * 1e3, 2),
            "first_use_ms": round((t3 - t2) * 1e3, 2),
            "kernels": sum(len(x) for x in rt.kernels.values()), "torch": "torch" in sys.modules}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--importtime", action="store_true", help="show the aotc lines of -X importtime once")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(child(args.bundle)))
        return
    cmd = [sys.executable, __file__, "--child", "--bundle", args.bundle]
    if args.importtime:
        r = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], capture_output=True, text=True, check=True)
        lines = [ln for ln in r.stderr.splitlines() if "aotc" in ln or "zipfile" in ln or "hashlib" in ln]
        print("\n".join(lines))
    rows = []
    for _ in range(args.runs):
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    imp = statistics.median(r["import_ms"] for r in rows)
    load = statistics.median(r["load_ms"] for r in rows)
    total = statistics.median(r["import_ms"] + r["load_ms"] for r in rows)
    first = statistics.median(r["first_use_ms"] for r in rows)
    print(f"median of {len(rows)}: import_ms {imp:.2f}  load_ms {load:.2f}  import+load {total:.2f}  first_use_ms {first:.2f}"
          f"  ({time.strftime('%Y-%m-%d %H:%M')}, {args.bundle})")


if __name__ == "__main__":
    main()
