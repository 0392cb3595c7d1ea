"""`aotc doctor`: what this machine has for aotc, and which found bundles would run here.

:func:`collect` gathers a plain dict (the ``--json`` output); :func:`render`
prints it for people. Nothing here imports ``cutlass`` or ``torch`` (versions
come from package metadata, the DSL is only located), and every probe of the GPU
is guarded: a machine without a driver or a device reports "no GPU" and the
reason. It says whether the driver is new enough for the runtime (the rule is
aotc.runtime.driver's, the one the runtime enforces) and whether this machine
can build (the compile extra installed), instead of assuming either.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import platform
import re
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
    """The driver (its library, CUDA version and release, and whether the runtime can use it) and every
    device's name, compute capability, SM count and runnable archs; without a usable GPU, {"devices": []}
    and the reason in "error"."""
    info: dict = {"driver": None, "driver_release": None, "libcuda": None, "driver_problem": "", "devices": [],
                  "error": ""}
    try:
        from .runtime import driver

        version = driver.driver_version()  # needs no cuInit, so it answers even for a driver too old to use
        info["libcuda"] = driver.library_name()
        info["driver"] = f"{version // 1000}.{version % 1000 // 10}"
        info["driver_release"] = driver.driver_release()
        problem = driver.version_problem(version, info["driver_release"])
        if problem is not None:  # driver.init() would refuse with this error: say it once, here
            info["driver_problem"] = f"{problem}: {problem.hint}"
            info["error"] = "the driver is older than aotc's runtime needs"
            return info
        for ordinal in range(driver.device_count()):
            dev = driver.device_handle(ordinal)
            cc = driver.compute_capability(dev)
            info["devices"].append({"ordinal": ordinal, "name": driver.device_name(dev),
                                    "compute_capability": f"{cc[0]}.{cc[1]}", "archs": driver.runnable_archs(cc),
                                    "sms": driver.multiprocessor_count(dev)})
    except Exception as e:  # no libcuda, no device, a failed call: "no GPU here", and why
        info["error"] = f"{type(e).__name__}: {e}"
        if getattr(e, "hint", None):
            info["hint"] = e.hint
    return info


def _compile_pin() -> str | None:
    """The nvidia-cutlass-dsl version aotc's compile extra pins (from aotc's metadata), if it is installed."""
    try:
        requires = md.requires("aotc") or []
    except md.PackageNotFoundError:  # run from a source tree that was never installed
        return None
    for req in requires:
        m = re.match(r"nvidia-cutlass-dsl\s*==\s*([\w.]+)\s*;.*extra\s*==\s*['\"]compile['\"]", req)
        if m:
            return m.group(1)
    return None


def build_side() -> dict:
    """Whether this machine can compile: the CuTe DSL (nvidia-cutlass-dsl) installed and its `cutlass`
    package locatable, found through package metadata and importlib.util.find_spec, never imported."""
    dsl = _dist_version("nvidia-cutlass-dsl")
    try:
        found = importlib.util.find_spec("cutlass") is not None  # locates the package; imports nothing
    except (ImportError, ValueError):  # a broken or half-imported cutlass
        found = False
    info = {"can_build": dsl is not None and found, "nvidia-cutlass-dsl": dsl, "pinned": _compile_pin(),
            "problem": ""}
    if dsl is None:
        info["problem"] = "nvidia-cutlass-dsl is not installed: pip install 'aotc[compile]'"
    elif not found:
        info["problem"] = (f"nvidia-cutlass-dsl {dsl} is installed but its cutlass package cannot be found: "
                           f"reinstall 'aotc[compile]'")
    elif info["pinned"] and dsl != info["pinned"]:
        info["problem"] = f"nvidia-cutlass-dsl {dsl} is not the {info['pinned']} aotc's compile extra pins"
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


def capabilities(found: list[dict], devices: list[dict], arch: str | None = None) -> list[dict]:
    """Runtime.capabilities() of the readable bundles in `found` (bundles()' rows; the cache is not
    included): for a device of `arch` when given, else for every device; [] without either. A failure
    is an entry {"error", and "arch" or "ordinal"}."""
    from .runtime import Runtime
    from .storage.bundle_reader import open_bundle

    paths = [b["path"] for b in found if not b["error"] and b["path"] is not None]
    targets = [{"arch": arch}] if arch is not None else [{"ordinal": d["ordinal"]} for d in devices]
    try:
        rt = Runtime([m for p in paths for m in open_bundle(p).members], paths)
    except Exception as e:  # a bundle replaced since bundles() read it
        return [{**t, "error": f"{type(e).__name__}: {e}"} for t in targets]
    out = []
    for t in targets:
        try:
            if "arch" in t:
                out.append(rt.capabilities(arch=arch))
            else:
                from .runtime import driver

                out.append(rt.capabilities(driver.device_handle(t["ordinal"])))
        except Exception as e:  # a driver call failed: reported, the rest of the report stands
            out.append({**t, "error": f"{type(e).__name__}: {e}"})
    return out


def collect(arch: str | None = None) -> dict:
    """Everything `aotc doctor` reports, as JSON-ready data; capabilities for a device of `arch` when
    given, else for every device found."""
    g = gpu()
    archs = {d["ordinal"]: d["archs"] for d in g["devices"]}
    found = bundles(archs)
    return {
        "versions": versions(),
        "gpu": g,
        "build": build_side(),
        "cache": cache(),
        "env": {k: v for k, v in sorted(__import__("os").environ.items()) if k.startswith("AOTC_")},
        "bundle_path": [str(p) for p in config.bundle_path()],
        "bundles": found,
        "capabilities": capabilities(found, g["devices"], arch),
        "python_executable": sys.executable,
    }


def render(info: dict) -> str:
    lines = ["versions:"]
    lines += [f"  {k:<30} {v}" for k, v in info["versions"].items()]
    g = info["gpu"]
    if g.get("driver"):
        release = f", release {g['driver_release']}" if g.get("driver_release") else ""
        line = f"driver: CUDA {g['driver']}{release}"
        if g.get("driver_problem"):
            line += f"; TOO OLD: {g['driver_problem']}"
        elif g.get("libcuda"):
            line += f" ({g['libcuda']})"
        lines.append(line)
    if g["devices"]:
        lines.append("gpu:")
        for d in g["devices"]:
            lines.append(f"  [{d['ordinal']}] {d['name']}  compute capability {d['compute_capability']}, "
                         f"{d['sms']} SMs, runs {' '.join(d['archs'])}")
    else:
        lines.append("gpu: no GPU" + (f" ({g['error']})" if g["error"] else "") +
                     (f"\n  hint: {g['hint']}" if g.get("hint") else "; launching needs a GPU node"))
    b = info.get("build")
    if b is not None:
        if not b["can_build"]:
            lines.append(f"build: cannot compile here ({b['problem']}); bundles and the cache still load")
        else:
            lines.append(f"build: can compile (nvidia-cutlass-dsl {b['nvidia-cutlass-dsl']})"
                         + (f"; note: {b['problem']}" if b["problem"] else ""))
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
    lines += render_capabilities(info.get("capabilities", []))
    return "\n".join(lines)


def render_capabilities(reports: list[dict]) -> list[str]:
    """A few lines per capabilities() report: per entry point what it serves and which families serve it."""
    if not reports:
        return ["capabilities: no usable GPU; `aotc doctor --arch sm_90a` gives them for a device of that arch"]
    lines = []
    for c in reports:
        if "error" in c:
            where = f"device {c['ordinal']}" if "ordinal" in c else c.get("arch")
            lines.append(f"capabilities ({where}): {c['error']}")
            continue
        where = f"device {c['device']['ordinal']} ({c['arch']})" if c["device"] else f"arch {c['arch']} (no device)"
        lines.append(f"capabilities on {where} of the bundles found ({c['kernels']} kernels run there):")
        for name, e in c["entry_points"].items():
            lines.append(f"  {name:<15} {_entry_line(e)}")
        for r in c["refused"]:
            lines.append(f"  REFUSED {r['kernel']}: {r['error']}")
    return lines


def _entry_line(e: dict) -> str:
    from .runtime.capabilities import LAYOUT_FIELDS, SUMMARY_FIELDS

    if not e["supported"]:
        return "none"
    parts = [" ".join(map(str, e["dtypes"])), "head dims " + " ".join(map(str, e["head_dims"]))]
    if e["causal"]:
        parts.append("causal " + "/".join("yes" if v else "no" for v in e["causal"]))
    if e["lse"]:
        parts.append("lse")
    if e["page_sizes"]:
        parts.append(f"pages {' '.join(map(str, e['page_sizes']))} ({' '.join(e['kv_layouts'])})")
    parts += [v for v in e["layouts"] if not str(v).startswith("paged")]
    parts += [f"{f} {'/'.join(map(str, vs))}" for f, vs in e["fields"].items()
              if f not in (*SUMMARY_FIELDS.values(), *LAYOUT_FIELDS)]
    if e["gaps"]:
        parts.append(f"{len(e['gaps'])} combinations not served (--json lists them)")
    served = ", ".join(f"{s['family']} ({s['arch']}) {s['kernels']}" for s in e["served_by"])
    return f"{', '.join(parts)}; by {served}"
