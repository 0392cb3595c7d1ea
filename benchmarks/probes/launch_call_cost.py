"""Python-side cost of one launch call: cuda-bindings' cuLaunchKernel (prebuilt CUkernel/CUstream) against
aotc's ctypes Launcher (cuLaunchKernelEx, four prebuilt arguments), both into a stand-in libcuda whose
entry points return at once, so the difference is the binding layers alone (the driver's own cost is the
same for both).

    cc -O1 -shared -fPIC -o /tmp/libcuda_stub.so tests/stub_driver/libcuda_stub.c
    LD_PRELOAD= AOTC_LIBCUDA=/tmp/libcuda_stub.so python benchmarks/probes/launch_call_cost.py /tmp/libcuda_stub.so

cuda-bindings finds libcuda by its soname, so the stub directory must hold it as libcuda.so.1 and be on
LD_LIBRARY_PATH for the bindings' row (the script makes that link and re-executes itself when needed).
Measured on the 2-core CI-class machine: bindings 0.38-0.40 us; aotc Launcher 0.57-0.66 us with
cuLaunchKernel's eleven ctypes arguments, 0.22 us (bare ctypes call) with cuLaunchKernelEx's four.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def per_call_us(fn, n: int = 200_000, rounds: int = 5) -> float:
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best.append((time.perf_counter_ns() - t0) / n / 1000)
    return statistics.median(best)


def main() -> None:
    stub = Path(sys.argv[1]).resolve()
    soname_dir = stub.parent / "soname"
    if os.environ.get("LD_LIBRARY_PATH") != str(soname_dir):
        soname_dir.mkdir(exist_ok=True)
        link = soname_dir / "libcuda.so.1"
        if not link.exists():
            link.symlink_to(stub)
        os.environ.update(LD_LIBRARY_PATH=str(soname_dir), AOTC_LIBCUDA=str(stub))
        os.execv(sys.executable, [sys.executable, *sys.argv])
    from aotc.runtime import driver

    value = ctypes.c_uint64(0)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(value))  # the stub reads the first parameter
    grid, block = (132, 4, 1), (128, 1, 1)
    launcher = driver.Launcher(1234, grid, block, 0, ctypes.addressof(params))
    rows = {"aotc Launcher (ctypes, prebuilt arguments)": per_call_us(lambda: launcher(0))}
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        pass
    else:
        k, s, launch, addr = cu.CUkernel(1234), cu.CUstream(0), cu.cuLaunchKernel, ctypes.addressof(params)
        rows["cuda-bindings cuLaunchKernel (prebuilt CUkernel, CUstream)"] = per_call_us(
            lambda: launch(k, 132, 4, 1, 128, 1, 1, 0, s, addr, 0))
    rows["empty lambda (the loop's own cost)"] = per_call_us(lambda: None)
    for name, us in rows.items():
        print(f"{us:6.3f} us  {name}")


if __name__ == "__main__":
    main()
