"""Seconds from a fresh process to the first finished combine call, loading from a bundle (no compiler).

    python benchmarks/cold_start.py artifacts/default.aotc
Prints one JSON line; run it several times (each run is a fresh process).
"""
import json
import sys
import time

T0 = time.perf_counter()
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import aotc.runtime as aotc_rt  # noqa: E402
from aotc.runtime import driver  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402

t_import = time.perf_counter() - T0
rt = aotc_rt.load(sys.argv[1] if len(sys.argv) > 1 else "artifacts/default.aotc")
t_load = time.perf_counter() - T0
driver.current_device()
# explicit records: no torch in this process, the buffers come from the driver itself
splits, B, S, H, D = 4, 1, 1, 32, 128
nbytes = {"op": splits * B * S * H * D * 4, "lp": splits * B * H * S * 4, "o": B * S * H * D * 2, "lse": B * H * S * 4}
ptr = {k: int(driver.check(cu.cuMemAlloc(n), "cuMemAlloc")) for k, n in nbytes.items()}
for k, n in nbytes.items():
    driver.check(cu.cuMemsetD8(ptr[k], 0, n), "cuMemsetD8")
plan = rt.prepare_combine(aotc_rt.tensor(ptr["op"], (splits, B, S, H, D), (B * S * H * D, S * H * D, H * D, D, 1), "fp32"),
                          aotc_rt.tensor(ptr["lp"], (splits, B, H, S), (B * H * S, H * S, S, 1), "fp32"),
                          aotc_rt.tensor(ptr["o"], (B, S, H, D), (S * H * D, H * D, D, 1), "bf16"),
                          aotc_rt.tensor(ptr["lse"], (B, H, S), (H * S, S, 1), "fp32"))
plan.launcher.launch(0)
driver.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
total = time.perf_counter() - T0
print(json.dumps({"import_s": round(t_import, 4), "import_and_load_bundle_s": round(t_load, 4),
                  "first_call_done_s": round(total, 4), "variant": plan.variant.name}))
