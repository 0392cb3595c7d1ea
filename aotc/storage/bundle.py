"""Bundles: one zip file with manifest.json and the cubins it describes.

    manifest.json          {"format": "aotc-bundle", "format_version": 1, "producer": {...},
                            "created": ..., "artifacts": [{"member", "variant", "key", "abi",
                            "launch", "sha256", "size", "info"}, ...]}
    kernels/<name>.cubin   one member per artifact

Readers never extract member paths to disk: members are read into memory with
size limits, checked against the manifest (size, sha256, arch read off the
cubin) and refused with a message naming the member. Standard library only:
the runtime reads bundles.
"""
from __future__ import annotations

import io
import json
import stat
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .. import __version__
from ..common import config
from ..common.artifact import Artifact
from ..common.errors import BundleError, CheckFailedError, VersionSkewError
from ..common.versions import producer_versions
from .atomic import atomic_write

FORMAT = "aotc-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20


@dataclass
class Bundle:
    path: str
    manifest: dict
    artifacts: list[Artifact]


def member_name(art: Artifact) -> str:
    return f"kernels/{art.variant.name}.cubin"


def write_bundle(path: str | Path, artifacts: Iterable[Artifact]) -> dict:
    """Write a bundle atomically (temporary file, fsync, os.replace). Returns the manifest."""
    arts = sorted({a.key or a.variant.name: a for a in artifacts}.values(), key=lambda a: a.variant.name)
    names = [member_name(a) for a in arts]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise BundleError(f"two artifacts of the same variant with different keys: {dup[:3]}",
                          hint="build every part with the same aotc and DSL versions")
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


def _info(name: str) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # fixed time: same inputs, same bytes
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.external_attr = (stat.S_IFREG | 0o644) << 16
    return zi


def _check_member_name(name: str) -> str | None:
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if "\\" in name or "\0" in name:
        return "backslash or NUL in name"
    if any(part in ("..", ".", "") for part in name.split("/")):
        return "'..', '.' or empty path component"
    return None


def read_bundle(path: str | Path, *, check_arch: bool = True) -> Bundle:
    """Open, check and load every artifact of a bundle. Raises BundleError naming what is wrong."""
    _problems, bundle = _read(path, check_arch=check_arch, collect=False)
    if bundle is None:  # unreachable: collect=False raises on the first problem
        raise BundleError(f"bundle {path}: unreadable")
    return bundle


def verify_bundle(path: str | Path) -> list[str]:
    """Every problem found in the bundle (an empty list means it verifies)."""
    problems, _ = _read(path, check_arch=True, collect=True)
    return problems


def _read(path: str | Path, *, check_arch: bool, collect: bool) -> tuple[list[str], Bundle | None]:
    path = str(path)
    max_member, max_total = config.max_member_bytes(), config.max_bundle_bytes()
    problems: list[str] = []

    def fail(msg: str) -> None:
        if not collect:
            raise BundleError(f"bundle {path}: {msg}")
        problems.append(msg)

    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise BundleError(f"bundle {path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise BundleError(f"bundle {path}: not a readable zip file ({e})") from None
    with zf:
        infos = zf.infolist()
        seen: set[str] = set()
        total = 0
        for zi in infos:
            why = _check_member_name(zi.filename)
            if why:
                fail(f"member {zi.filename!r} refused: {why}")
            if zi.filename in seen:
                fail(f"member {zi.filename!r} appears more than once")
            seen.add(zi.filename)
            mode = zi.external_attr >> 16
            if stat.S_ISLNK(mode):
                fail(f"member {zi.filename!r} refused: symbolic link")
            if zi.is_dir():
                continue
            if zi.file_size > (MAX_MANIFEST_BYTES if zi.filename == MANIFEST else max_member):
                fail(f"member {zi.filename!r} declares {zi.file_size} bytes, over the limit of {max_member} "
                     f"(AOTC_BUNDLE_MAX_MEMBER_BYTES)")
            total += zi.file_size
        if total > max_total:
            fail(f"members declare {total} bytes in all, over the limit of {max_total} (AOTC_BUNDLE_MAX_BYTES)")
        if problems:
            return problems, None
        if MANIFEST not in seen:
            fail("no manifest.json")
            return problems, None
        try:
            manifest = json.loads(_read_member(zf, MANIFEST, MAX_MANIFEST_BYTES))
        except (ValueError, BundleError) as e:
            fail(f"manifest.json unreadable: {e}")
            return problems, None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            fail("manifest.json is not an aotc bundle manifest")
            return problems, None
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            producer = manifest.get("producer") if isinstance(manifest.get("producer"), dict) else {}
            msg = (f"bundle {path}: format version {version!r} (made by aotc {producer.get('aotc', '?')}); "
                   f"this aotc ({__version__}) reads format version {FORMAT_VERSION}")
            raise VersionSkewError(msg, hint=f"use aotc {producer.get('aotc', '?')} to read it, or rebuild the "
                                             f"bundle with this aotc: aotc build SPEC --bundle {path}")
        entries = manifest.get("artifacts")
        if not isinstance(entries, list):
            fail("manifest.json has no artifact list")
            return problems, None
        artifacts: list[Artifact] = []
        listed: set[str] = set()
        for i, entry in enumerate(entries):
            member = entry.get("member") if isinstance(entry, dict) else None
            if not isinstance(member, str) or member not in seen or _check_member_name(member):
                fail(f"manifest entry #{i} names member {member!r}, which the zip does not hold")
                continue
            if member in listed:
                fail(f"member {member!r} listed twice in the manifest")
                continue
            listed.add(member)
            try:
                declared = int(entry["size"])
                if declared != zf.getinfo(member).file_size:
                    fail(f"member {member!r}: the manifest says {declared} bytes, the zip entry "
                         f"{zf.getinfo(member).file_size}")
                    continue
                data = _read_member(zf, member, min(max_member, declared))
                art = Artifact.from_header(entry, data)
            except BundleError as e:
                fail(f"member {member!r}: {e}")
                continue
            except (ValueError, KeyError, TypeError) as e:
                fail(f"member {member!r} does not match the manifest: {e}")
                continue
            if not _is_key(art.key):
                fail(f"member {member!r}: key {art.key[:80]!r} is not a cache key (64 hex digits)")
                continue
            if check_arch:
                from ..common import cubin

                try:
                    arch = cubin.parse(art.cubin).arch
                except cubin.CubinError as e:
                    fail(f"member {member!r} is not a valid cubin: {e}")
                    continue
                if arch != art.variant.arch:
                    fail(f"member {member!r} is a cubin for {arch}, but the manifest says {art.variant.arch}")
                    continue
            artifacts.append(art)
        extra = sorted(seen - listed - {MANIFEST})
        if extra:
            fail(f"members not described by the manifest: {extra[:5]}")
    return problems, Bundle(path, manifest, artifacts)


def _is_key(key: str) -> bool:
    return len(key) == 64 and all(c in "0123456789abcdef" for c in key)


def _read_member(zf: zipfile.ZipFile, name: str, limit: int) -> bytes:
    """Read at most limit bytes; more means the zip lies about its sizes (or is a bomb)."""
    try:
        with zf.open(name) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError) as e:
        # a bad CRC (e.g. a central directory that understates the size), a broken deflate stream, encryption
        raise BundleError(f"{name!r} is corrupt: {e}") from None
    if len(data) > limit:
        raise BundleError(f"{name!r} inflates past {limit} bytes")
    return data


@dataclass
class MergeReport:
    """What `merge_bundles` wrote: the manifest, and per input (path, kernels it holds, kernels it added)."""

    manifest: dict
    inputs: list[tuple[str, int, int]]

    def inputs_json(self) -> list[dict]:
        return [{"path": p, "kernels": n, "new": new} for p, n, new in self.inputs]


def merge_bundles(paths: Iterable[str | Path], out: str | Path, *, expect=None) -> MergeReport:
    """Join bundles into `out` (atomically); returns the manifest written and what each input added.

    The same variant in two inputs must have the same sha256. `expect` (variants,
    e.g. a spec's): refuse, writing nothing, unless every one of them is present.
    """
    arts: dict[str, Artifact] = {}
    inputs: list[tuple[str, int, int]] = []
    for p in paths:
        held = read_bundle(p).artifacts
        new = 0
        for a in held:
            prev = arts.get(a.variant.name)
            if prev is not None and prev.sha256 != a.sha256:
                raise BundleError(f"{a.variant.name} differs between bundles (sha256 {prev.sha256[:12]} vs {a.sha256[:12]}) "
                                  f"in {p}", hint="merge only bundles built by the same aotc and DSL versions")
            new += prev is None
            arts[a.variant.name] = a
        inputs.append((str(p), len(held), new))
    if expect is not None:
        missing = sorted({v.name for v in expect} - set(arts))
        if missing:
            shown = "\n  ".join(missing[:20]) + (f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else "")
            raise IncompleteError(f"the inputs lack {len(missing)} variant(s) of the spec; {out} not written:\n  {shown}",
                                  hint="a shard failed or is missing: rerun its `aotc build --shard I/N` job")
    return MergeReport(write_bundle(out, arts.values()), inputs)


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
