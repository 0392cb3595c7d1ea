"""Bundles: one zip file with manifest.json and the cubins it describes.

    manifest.json          {"format": "aotc-bundle", "format_version": 1, "producer": {...},
                            "created": ..., "artifacts": [{"member", "variant", "key", "abi",
                            "launch", "sha256", "size", "info"}, ...]}
    kernels/<name>.cubin   one member per artifact

This module writes, merges and finds bundles; aotc.storage.bundle_reader reads them (its names are
re-exported here). Standard library only: the runtime reads bundles.
"""
from __future__ import annotations

import io
import json
import stat
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..common import config
from ..common.artifact import Artifact
from ..common.errors import BundleError, CheckFailedError
from .atomic import atomic_write
from .bundle_reader import (FORMAT, FORMAT_VERSION, MANIFEST, MAX_MANIFEST_BYTES, Bundle,  # noqa: F401
                            BundleIndex, BundleMember, open_bundle, read_bundle, verify_bundle)


def member_name(art: Artifact) -> str:
    return f"kernels/{art.variant.name}.cubin"


def write_bundle(path: str | Path, artifacts: Iterable[Artifact]) -> dict:
    """Write a bundle atomically (temporary file, fsync, os.replace). Returns the manifest.

    The same artifact given twice is written once; anything a reader would refuse as ambiguous (one
    variant under two keys or cubins, one key for two variants, one cubin with two sets of launch facts)
    is a BundleError and nothing is written."""
    from ..common.versions import producer_versions  # importlib.metadata: not needed to read bundles

    arts = sorted(_distinct(artifacts), key=lambda a: a.variant.name)
    names = [member_name(a) for a in arts]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "producer": producer_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "artifacts": [{"member": n, **a.header()} for n, a in zip(names, arts)],
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(_info(MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
        for n, a in zip(names, arts):
            zf.writestr(_info(n), a.cubin)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())
    return manifest


def _distinct(artifacts: Iterable[Artifact]) -> list[Artifact]:
    """The artifacts without repeats; BundleError for two that conflict."""
    by_variant: dict = {}
    by_key: dict[str, Artifact] = {}
    by_sha: dict[str, Artifact] = {}
    out = []
    for a in artifacts:
        prev = by_variant.get(a.variant)
        if prev is not None:
            if (prev.key, prev.sha256, prev.abi, prev.launch.to_json()) == (a.key, a.sha256, a.abi, a.launch.to_json()):
                continue  # the same artifact twice
            what = "keys" if prev.key != a.key else "cubins" if prev.sha256 != a.sha256 else "launch facts or ABIs"
            raise BundleError(f"two artifacts of the same variant with different {what}: {a.variant.name}",
                              hint="build every part with the same aotc and DSL versions")
        other = by_key.get(a.key) if a.key else None
        if other is not None:
            raise BundleError(f"{a.variant.name} and {other.variant.name} share the key {a.key[:16]}...: "
                              f"one of them is mislabelled", hint="rebuild both with aotc build")
        same_cubin = by_sha.get(a.sha256)
        if same_cubin is not None and (same_cubin.abi, same_cubin.launch.to_json()) != (a.abi, a.launch.to_json()):
            raise BundleError(f"{a.variant.name} and {same_cubin.variant.name} are one cubin (sha256 "
                              f"{a.sha256[:16]}...) with different launch facts or ABIs: one of them is mislabelled",
                              hint="rebuild both with aotc build")
        by_variant[a.variant] = a
        if a.key:  # an uncacheable build has no key (and readers refuse its bundle)
            by_key[a.key] = a
        by_sha.setdefault(a.sha256, a)
        out.append(a)
    return out


def _info(name: str) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # fixed time: same inputs, same bytes
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.external_attr = (stat.S_IFREG | 0o644) << 16
    return zi


@dataclass
class MergeReport:
    """What `merge_bundles` wrote: the manifest, and per input (path, kernels it holds, kernels it added)."""

    manifest: dict
    inputs: list[tuple[str, int, int]]

    def inputs_json(self) -> list[dict]:
        return [{"path": p, "kernels": n, "new": new} for p, n, new in self.inputs]


def merge_bundles(paths: Iterable[str | Path], out: str | Path, *, expect=None) -> MergeReport:
    """Join bundles into `out` (atomically); returns the manifest written and what each input added.

    The same variant in two inputs must be the same artifact; two variants sharing a key, or one cubin
    with two sets of launch facts, are refused too (write_bundle). `expect` (variants, e.g. a spec's):
    refuse, writing nothing, unless every one of them is present.
    """
    arts: dict[str, Artifact] = {}
    inputs: list[tuple[str, int, int]] = []
    every: list[Artifact] = []
    for p in paths:
        held = read_bundle(p).artifacts
        new = 0
        for a in held:
            prev = arts.get(a.variant.name)
            if prev is not None and prev.sha256 != a.sha256:
                raise BundleError(f"{a.variant.name} differs between bundles (sha256 {prev.sha256[:12]} vs {a.sha256[:12]}) "
                                  f"in {p}", hint="merge only bundles built by the same aotc and DSL versions")
            new += prev is None
            arts.setdefault(a.variant.name, a)
            every.append(a)
        inputs.append((str(p), len(held), new))
    if expect is not None:
        missing = sorted({v.name for v in expect} - set(arts))
        if missing:
            shown = "\n  ".join(missing[:20]) + (f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else "")
            raise IncompleteError(f"the inputs lack {len(missing)} variant(s) of the spec; {out} not written:\n  {shown}",
                                  hint="a shard failed or is missing: rerun its `aotc build --shard I/N` job")
    return MergeReport(write_bundle(out, every), inputs)


class IncompleteError(CheckFailedError):
    """A merge that misses variants it was told to expect (exit code 1: a check failed)."""


def default_bundle_files() -> list[Path]:
    """Bundles named by AOTC_BUNDLE_PATH (files, or directories searched for *.aotc), missing ones included."""
    found = []
    for p in config.bundle_path():
        found.extend(sorted(p.glob("*.aotc")) if p.is_dir() else [p])
    return found


ENTRY_POINT_GROUP = "aotc.bundles"


@dataclass
class FoundBundle:
    """A bundle discovered on this machine: its path, where it was found, and what went wrong finding it."""

    path: Path | None
    origin: str  # "AOTC_BUNDLE_PATH", or "entry point NAME (DIST VERSION)"
    error: str = ""


def installed_bundles() -> list[FoundBundle]:
    """Bundles that installed distributions declare in the `aotc.bundles` entry-point group.

    An entry point names an object (``pkg:bundle_path``); a callable is called.
    It gives a path or a list of paths (str or os.PathLike). A wheel made by
    ``aotc bundle wheel`` declares one. Problems (import error, missing file) are
    reported in FoundBundle.error, never raised here.
    """
    import importlib.metadata as md
    import os

    out: list[FoundBundle] = []
    try:
        eps = md.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as e:  # a broken metadata directory on sys.path
        return [FoundBundle(None, f"entry points {ENTRY_POINT_GROUP}", f"{type(e).__name__}: {e}")]
    seen: set[tuple[str, str]] = set()
    for ep in sorted(eps, key=lambda e: (e.name, e.value)):
        if (ep.name, ep.value) in seen:
            continue
        seen.add((ep.name, ep.value))
        dist = getattr(ep, "dist", None)
        origin = f"entry point {ep.name} = {ep.value}" + (f" ({dist.name} {dist.version})" if dist is not None else "")
        try:
            obj = ep.load()
            value = obj() if callable(obj) else obj
            values = [value] if isinstance(value, (str, os.PathLike)) else list(value)
        except Exception as e:
            out.append(FoundBundle(None, origin, f"{type(e).__name__}: {e}"))
            continue
        for v in values:
            try:
                p = Path(v)
            except TypeError:
                out.append(FoundBundle(None, origin, f"gave {v!r}, not a path"))
                continue
            out.append(FoundBundle(p, origin, "" if p.is_file() else f"{p}: no such file"))
    return out


def discover_bundles(*, env: bool = True, installed: bool = True) -> list[FoundBundle]:
    """AOTC_BUNDLE_PATH bundles first, then installed ones; one entry per file.

    An AOTC_BUNDLE_PATH entry that names nothing is a FoundBundle with an error (loading it is an
    error, as a broken installed bundle is), never skipped: a typo there must not go unnoticed."""
    found = [FoundBundle(p, "AOTC_BUNDLE_PATH", "" if p.is_file() else f"{p}: no such file or directory")
             for p in default_bundle_files()] if env else []
    if installed:
        found += installed_bundles()
    out, seen = [], set()
    for f in found:
        ident = None if f.path is None else str(f.path.resolve())
        if ident is not None and ident in seen:
            continue
        seen.add(ident)
        out.append(f)
    return out
