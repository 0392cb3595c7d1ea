"""`aotc doctor`: what this machine has for aotc, and which found bundles would run here.

:func:`collect` gathers a plain dict (the ``--json`` output); :func:`render`
prints it for people. Nothing here imports ``cutlass`` or ``torch`` (versions
come from package metadata), and every probe of the GPU is guarded: a machine
without a driver or a device reports "no GPU" and the reason.
"""
from __future__ import annotations

import importlib.metadata as md
import platform
import sys

from . import __version__
from .common import config

# distributions whose versions matter to aotc (reported when installed; never imported)
PACKAGES = ("cuda-python", "cuda-bindings", "numpy", "click", "filelock", "platformdirs", "torch", "cupy-cuda12x",
            "cupy-cuda13x", "jax", "jaxlib", "dask", "distributed")


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
    except Exception:  # broken metadata is "unknown", not a crash
        return "?"


def versions() -> dict:
    from .common.versions import dsl_versions

    out = {"aotc": __version__, "python": platform.python_version(), "platform": platform.platform()}
    for name in PACKAGES:
        v = _dist_version(name)
        if v is not None:
            out[name] = v
    out.update(dsl_versions())
    return out


def gpu() -> dict:
    """Driver version and every device's name, compute capability and runnable archs; {"devices": []} without."""
    info: dict = {"driver": None, "devices": [], "error": ""}
    try:
        from .runtime import driver
        from .runtime.driver import cu

        driver.init()
        v = int(driver.check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
        info["driver"] = f"{v // 1000}.{v % 1000 // 10}"
        for ordinal in range(driver.device_count()):
            dev = driver.check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
            raw = driver.check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
            name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
            cc = driver.compute_capability(int(dev))
            info["devices"].append({"ordinal": ordinal, "name": name, "compute_capability": f"{cc[0]}.{cc[1]}",
                                    "archs": driver.runnable_archs(cc),
                                    "sms": driver.multiprocessor_count(int(dev))})
    except Exception as e:  # no libcuda, no device, a driver too old: all mean "no GPU here"
        info["error"] = f"{type(e).__name__}: {e}"
    return info


def cache() -> dict:
    from .storage.cache import Cache

    try:
        c = Cache()
        return {"root": str(c.root), "lock_dir": str(c.lock_dir), "lock_timeout": c.lock_timeout,
                "entries": len(c.keys()), "bytes": c.size_bytes(), "counters": c.stats(),
                "no_compile": config.no_compile()}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def bundles(archs_by_device: dict[int, list[str]]) -> list[dict]:
    """Every bundle aotc.load() would find, read and verified, with the kernels each device can run."""
    from .storage.bundle import discover_bundles, read_bundle

    out = []
    for f in discover_bundles():
        row: dict = {"path": None if f.path is None else str(f.path), "origin": f.origin, "error": f.error}
        if not f.error and f.path is not None:
            try:
                b = read_bundle(f.path)
            except Exception as e:  # BundleError, VersionSkewError, an unreadable file
                row["error"] = f"{type(e).__name__}: {e}"
            else:
                row["kernels"] = len(b.artifacts)
                row["archs"] = sorted({a.variant.arch for a in b.artifacts})
                row["families"] = sorted({a.variant.family for a in b.artifacts})
                row["runnable"] = {str(d): sum(a.variant.arch in archs for a in b.artifacts)
                                   for d, archs in archs_by_device.items()}
        out.append(row)
    return out


def collect() -> dict:
    """Everything `aotc doctor` reports, as JSON-ready data."""
    g = gpu()
    archs = {d["ordinal"]: d["archs"] for d in g["devices"]}
    return {
        "versions": versions(),
        "gpu": g,
        "cache": cache(),
        "env": {k: v for k, v in sorted(__import__("os").environ.items()) if k.startswith("AOTC_")},
        "bundle_path": [str(p) for p in config.bundle_path()],
        "bundles": bundles(archs),
        "python_executable": sys.executable,
    }


def render(info: dict) -> str:
    lines = ["versions:"]
    lines += [f"  {k:<30} {v}" for k, v in info["versions"].items()]
    g = info["gpu"]
    if g["devices"]:
        lines.append(f"gpu: driver {g['driver']}")
        for d in g["devices"]:
            lines.append(f"  [{d['ordinal']}] {d['name']}  compute capability {d['compute_capability']}, "
                         f"{d['sms']} SMs, runs {' '.join(d['archs'])}")
    else:
        lines.append("gpu: no GPU" + (f" ({g['error']})" if g["error"] else "") +
                     " - building works; launching needs a GPU node")
    c = info["cache"]
    if "error" in c:
        lines.append(f"cache: {c['error']}")
    else:
        counters = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in c["counters"].items())
        lines += [f"cache: {c['root']}", f"  locks:    {c['lock_dir']} (timeout {c['lock_timeout']:g} s)",
                  f"  entries:  {c['entries']} ({c['bytes']} bytes)", f"  counters: {counters}"]
        if c["no_compile"]:
            lines.append("  AOTC_NO_COMPILE is set: a cache miss is an error")
    for k, v in info["env"].items():
        lines.append(f"env: {k}={v}")
    if not info["bundles"]:
        lines.append("bundles: none found (AOTC_BUNDLE_PATH is empty and no aotc.bundles entry point is installed)")
    else:
        lines.append("bundles:")
        for b in info["bundles"]:
            where = f"{b['path']}  [{b['origin']}]"
            if b["error"]:
                lines.append(f"  BAD {where}: {b['error']}")
                continue
            run = ", ".join(f"{n}/{b['kernels']} run on device {d}" for d, n in b["runnable"].items()) or "no GPU here"
            lines.append(f"  ok  {where}: {b['kernels']} kernels ({' '.join(b['families'])}) for "
                         f"{' '.join(b['archs'])}; {run}")
    return "\n".join(lines)
