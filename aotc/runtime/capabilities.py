"""What a runtime's loaded kernels serve on a device: the answer to ``Runtime.capabilities()``.

A serving engine asks once at start-up which dtypes, head dims, page sizes and features each public
call (entry point) serves, instead of finding out from the first request that fails. The answer is
read from the loaded kernels' variant records, kept to the archs the device runs
(aotc.runtime.driver.runnable_archs, as dispatch does) and to the kernels dispatch accepts (their
header and parameter list, Runtime._fits). Which families and variants serve an entry point is said
once, in ENTRY_POINTS; everything else is generic, so a field a family gains (a window, a soft-cap,
a kv dtype) is reported without a change here.

Plain data only (JSON-ready); imports neither torch nor the DSL.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Callable

from ..common.errors import ArgumentError, RuntimeLoadError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Route:
    """Kernels of `family` whose variant passes `where` serve an entry point. `fixed`: (field, value)
    pairs that hold for every such kernel without being a variant field (sdpa_decode is always causal
    within the new tokens), reported as if they were fields. summarized=False: a route that speeds up
    part of the entry point's work (attention's decode rows) without deciding what it serves: listed in
    served_by, left out of the entry point's summary."""

    family: str
    where: Callable[[Any], bool] = lambda variant: True
    fixed: tuple[tuple[str, Any], ...] = ()
    summarized: bool = True


def _layout(test: Callable[[str], bool]) -> Callable[[Any], bool]:
    return lambda variant: test(str(variant.get("layout", "")))


# entry point (the Runtime method an engine calls) -> the routes that serve it, in dispatch's order of
# preference (prefill's family="auto" tries the Hopper family first). attention: the Hopper family's
# "paged<N>" layouts, and sdpa_decode's ragged layout for its decode rows (Runtime.attention runs them
# when loaded, and the paged kernel alone otherwise); where no Hopper kernel serves a call, the portable family's
# "paged<N>" layouts (aotc.runtime.attention_portable).
ENTRY_POINTS: dict[str, tuple[Route, ...]] = {
    "prefill": (Route("sdpa_prefill_sm90", _layout(lambda s: s == "dense")),
                Route("sdpa_prefill", _layout(lambda s: s == "dense"))),
    "prefill_ragged": (Route("sdpa_prefill_sm90", _layout(lambda s: s == "ragged")),
                       Route("sdpa_prefill", _layout(lambda s: s == "ragged"))),
    "attention": (Route("sdpa_prefill_sm90", _layout(lambda s: s.startswith("paged"))),
                  Route("sdpa_prefill", _layout(lambda s: s.startswith("paged"))),
                  Route("sdpa_decode", _layout(lambda s: s == "ragged"), fixed=(("causal", True),), summarized=False)),
    "decode": (Route("sdpa_decode", _layout(lambda s: s in ("", "dense")), fixed=(("causal", True),)),),
    "kv_write": (Route("kv_write"),),
    "combine": (Route("sdpa_combine"),),
}
ROUTED_FAMILIES = tuple(sorted({r.family for routes in ENTRY_POINTS.values() for r in routes}))

# the summary keys read from a variant field of this name
SUMMARY_FIELDS = {"dtypes": "dtype", "head_dims": "head_dim", "causal": "causal"}
# fields that hold a tensor layout: "dense", "ragged" or "paged<page size>"
LAYOUT_FIELDS = ("layout", "kv")
_PAGED = re.compile(r"paged(\d+)")
# every paged family takes a pool's layout as strides (sdpa_decode's kv_layout argument), so any page
# size comes in both; a family whose variants fix it would say so in a kv_layout field, reported instead
POOL_LAYOUTS = ("NHD", "HND")
_ARCH = re.compile(r"sm_(\d+)(\d)a?")


def parse_arch(arch: str) -> tuple[int, int]:
    """The compute capability of a device of `arch` ("sm_90a" and "sm_90" are both 9.0); ArgumentError
    for anything else."""
    m = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if m is None:
        raise ArgumentError("arch", arch, "an arch name such as 'sm_90a', 'sm_90' or 'sm_100a'")
    return int(m.group(1)), int(m.group(2))


def capabilities(runtime, device: int | None = None, arch: str | None = None) -> dict:
    """See Runtime.capabilities."""
    from .. import __version__
    from . import driver

    if device is not None and arch is not None:
        raise ArgumentError("arch", arch, "None when a device is given (the device's arch is used)")
    if arch is not None:
        cc, info = parse_arch(arch), None
    else:
        if device is None:
            device = runtime.device()
        cc = driver.compute_capability(device)
        info = {"ordinal": device, "name": driver.device_name(device), "compute_capability": f"{cc[0]}.{cc[1]}",
                "sms": driver.multiprocessor_count(device)}
    runs = driver.runnable_archs(cc)
    refused: list[dict] = []
    accepted = _accepted(runtime, runs, refused)
    runnable = [k for pool in runtime.kernels.values() for k in pool if k.variant.arch in runs]
    entry_points = {}
    for name, routes in ENTRY_POINTS.items():
        groups = []  # (route, arch, kernels): one per family and arch, best first
        for route in routes:
            for a in runs:
                ks = [k for k in accepted.get(route.family, ()) if k.variant.arch == a and route.where(k.variant)]
                if ks:
                    groups.append((route, a, ks))
        served = [{"family": r.family, "arch": a, **_summary([(k, r.fixed) for k in ks])} for r, a, ks in groups]
        pairs = [(k, r.fixed) for r, _, ks in groups if r.summarized for k in ks]
        entry_points[name] = {"supported": bool(pairs), **_summary(pairs), "served_by": served}
    return {
        "schema_version": SCHEMA_VERSION,
        "aotc_version": __version__,
        "device": info,
        "arch": arch or runs[0],
        "runs": runs,
        "sources": list(runtime.sources),
        "kernels": len(runnable),
        "other_archs": sorted({k.variant.arch for pool in runtime.kernels.values() for k in pool} - set(runs)),
        "entry_points": entry_points,
        "unmapped_families": sorted({k.variant.family for k in runnable} - set(ROUTED_FAMILIES)),
        "refused": refused,
        "other_abi": sorted(runtime.other_abi),
    }


def _accepted(runtime, runs: list[str], refused: list[dict]) -> dict[str, list]:
    """The kernels of the routed families that run on `runs` and that dispatch accepts (Runtime._fits:
    the header, then the parameter list); a refused header is listed in `refused`, a kernel of another
    parameter list leaves the pool (for runtime.other_abi) as it would at its first selection."""
    out: dict[str, list] = {}
    for family in ROUTED_FAMILIES:
        for k in list(runtime.kernels.get(family, ())):
            if k.variant.arch not in runs:
                continue
            try:
                fits = runtime._fits(k)
            except RuntimeLoadError as e:
                refused.append({"kernel": k.variant.name, "error": str(e)})
                continue
            if fits:
                out.setdefault(family, []).append(k)
    return out


def _summary(pairs: list[tuple[Any, tuple]]) -> dict:
    """What (kernel, fixed fields) pairs serve together: every variant field's values, and from them the
    summary keys (SUMMARY_FIELDS, layouts, page sizes, pool layouts), whether every kernel writes an LSE,
    and the combinations of the summary fields' values that no kernel serves (a spec's excludes)."""
    records = [dict((*k.variant.fields, *fixed)) for k, fixed in pairs]
    values: dict[str, set] = {}
    for r in records:
        for f, v in r.items():
            values.setdefault(f, set()).add(v)
    fields = {f: _sorted(vs) for f, vs in sorted(values.items())}
    out: dict = {"kernels": len(pairs)}
    out.update({key: fields.get(f, []) for key, f in SUMMARY_FIELDS.items()})
    # an lse output when every kernel's parameter list (its recorded ABI) has one
    out["lse"] = bool(pairs) and all(any(p.name == "lse" for p in k.artifact.abi.params) for k, _ in pairs)
    layouts = _sorted({v for f in LAYOUT_FIELDS for v in fields.get(f, ())})
    out["layouts"] = layouts
    out["page_sizes"] = sorted(int(m.group(1)) for m in map(_PAGED.fullmatch, map(str, layouts)) if m)
    out["kv_layouts"] = fields.get("kv_layout") or (list(POOL_LAYOUTS) if out["page_sizes"] else [])
    product = [f for f in (*SUMMARY_FIELDS.values(), *LAYOUT_FIELDS) if f in fields]
    served = {tuple(r.get(f) for f in product) for r in records}
    out["gaps"] = [dict(zip(product, combo)) for combo in itertools.product(*(fields[f] for f in product))
                   if pairs and combo not in served]
    out["fields"] = fields
    return out


def _sorted(values) -> list:
    """Values of one field in a stable order: by type (bools, ints and strings never compare across
    types), strings with their numbers compared as numbers (paged16 before paged128)."""
    def key(v):
        if not isinstance(v, str):
            return type(v).__name__, [(0, v, "")]
        return "str", [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", v)]

    return sorted(values, key=key)
