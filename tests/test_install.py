"""A runtime-only install (`pip install .` into a fresh venv) holds the runtime and nothing it never imports.

It needs pip to reach an index (or its cache) for click, filelock and platformdirs; it
takes a few seconds with the wheels cached. The size it adds to a bare venv is printed (run with -s)
and recorded as the test's `runtime_install_bytes` property.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# distributions a runtime-only install must not bring: the DSL (the compile extra's), torch, numpy
# (no aotc module imports it) and every CUDA Python package (the runtime calls libcuda through ctypes)
FORBIDDEN = ("numpy", "nvidia-cutlass-dsl", "torch", "cuda-core", "cuda-python", "cuda-bindings", "cuda-pathfinder")
# the cuda-python metapackage and numpy made it 122 MB, cuda-bindings alone 37 MB; without any CUDA
# Python package it is a few MB: a bound that catches a heavy dependency coming back
MAX_RUNTIME_INSTALL_BYTES = 10 << 20


def _bytes_under(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if not p.is_dir())


def _distributions(site_packages: Path) -> set[str]:
    return {p.name.split("-")[0].lower().replace("_", "-") for p in site_packages.glob("*.dist-info")}


def _run(cmd: list, env: dict, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def test_runtime_only_install_has_no_numpy_cutlass_or_torch(tmp_path, record_property):
    # a copy of the source tree, so the build writes nothing into the checkout
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "artifacts", "results", ".pytest_cache",
        ".hypothesis", "gpu-logs"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], env, tmp_path)
    bare = _bytes_under(venv)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", src], env, tmp_path)
    added = _bytes_under(venv) - bare
    record_property("runtime_install_bytes", added)
    print(f"\nruntime-only install: {added / 1e6:.1f} MB above a bare venv")

    (site,) = (venv / "lib").glob("python3*/site-packages")
    dists = _distributions(site)
    assert {"aotc", "click", "filelock", "platformdirs"} <= dists, dists
    assert not dists & set(FORBIDDEN), f"a runtime-only install brought {sorted(dists & set(FORBIDDEN))}"
    assert not [n for n in ("numpy", "cutlass", "torch") if (site / n).exists()]
    assert added < MAX_RUNTIME_INSTALL_BYTES, f"{added} bytes above a bare venv"

    # it runs: the runtime imports (no DSL, no torch, no numpy), and doctor says building needs the compile extra
    code = ("import sys, aotc, aotc.runtime, aotc.runtime.driver, aotc.torch\n"
            "print(sorted(m for m in ('numpy', 'torch', 'cutlass', 'cuda') if m in sys.modules))\n")
    assert _run([python, "-c", code], env, tmp_path).stdout.strip() == "[]"
    info = json.loads(_run([venv / "bin" / "aotc", "doctor", "--json"], env, tmp_path).stdout)
    assert info["build"]["can_build"] is False
    assert info["build"]["problem"] == "nvidia-cutlass-dsl is not installed: pip install 'aotc[compile]'"
    assert info["gpu"]["devices"] == [] and "libcuda" in info["gpu"]["error"]  # CI has no driver
