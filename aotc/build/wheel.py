"""`aotc bundle wheel`: a pip-installable wheel that carries a bundle (standard library only).

The wheel ``NAME-VERSION-py3-none-any.whl`` holds

    PACKAGE/__init__.py            bundle_path() -> the installed bundle's path; BUNDLE_SHA256
    PACKAGE/BUNDLE.aotc            the bundle, as package data (verified before packing)
    NAME-VERSION.dist-info/        METADATA, WHEEL, entry_points.txt, top_level.txt, RECORD

and declares the entry point ``[aotc.bundles] NAME = PACKAGE:bundle_path``,
which :func:`aotc.runtime.load` (no argument) and ``aotc doctor`` discover
through ``importlib.metadata``. The same inputs give the same bytes (fixed
timestamps, sorted members), so rebuilding a wheel does not change its hash.
The wheel declares no dependency unless asked (``--requires 'aotc>=0.1'``):
the deployment image brings its own aotc runtime.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import stat
import zipfile
from pathlib import Path
from typing import Iterable

from .. import __version__
from ..storage.bundle import ENTRY_POINT_GROUP, read_bundle
from ..storage.atomic import atomic_write
from ..common.errors import AotcError

# PEP 508 names; PEP 440 versions (the canonical public form, plus local labels)
_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
_VERSION = re.compile(
    r"^([1-9][0-9]*!)?(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*((a|b|rc)(0|[1-9][0-9]*))?(\.post(0|[1-9][0-9]*))?"
    r"(\.dev(0|[1-9][0-9]*))?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$")
_DATE = (2020, 1, 1, 0, 0, 0)


class WheelError(AotcError):
    """A bad --name/--version/--package (exit code 2: usage)."""

    exit_code = 2


def normalize(name: str) -> str:
    """PEP 503 normalization with '_' (the wheel file name and .dist-info form)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def build_wheel(bundle: str | Path, *, name: str, version: str, out_dir: str | Path = "dist",
                package: str | None = None, requires: Iterable[str] = ()) -> dict:
    """Write NAME-VERSION-py3-none-any.whl carrying `bundle` into out_dir; returns what was written.

    The bundle is read and verified first (a bad bundle raises BundleError and
    nothing is written). Returns {"wheel", "name", "version", "package",
    "entry_point", "bundle_sha256", "kernels"}.
    """
    if not _NAME.match(name):
        raise WheelError(f"--name {name!r} is not a valid distribution name (letters, digits, '.', '-', '_'; "
                         f"starting and ending with a letter or digit)")
    if not _VERSION.match(version):
        raise WheelError(f"--version {version!r} is not a canonical PEP 440 version (e.g. 1.0.0, 2.1rc1, 1.0+cu12)")
    dist = normalize(name)
    package = package or (("_" if dist[0].isdigit() else "") + dist)
    if not package.isidentifier() or package in ("aotc",):
        raise WheelError(f"--package {package!r} is not a usable import name")
    for req in requires:
        if not req.strip() or "\n" in req:
            raise WheelError(f"--requires {req!r}: one requirement per option")
    src = Path(bundle)
    b = read_bundle(src)  # verify before packing: never ship a bad bundle
    data = src.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    member = re.sub(r"[^A-Za-z0-9._-]", "_", src.name)
    if not member.endswith(".aotc") or member.startswith("."):
        member = "bundle.aotc"
    archs = sorted({a.variant.arch for a in b.artifacts})
    families = sorted({a.variant.family for a in b.artifacts})
    init = f'''"""aotc bundle {name} {version}: {len(b.artifacts)} kernels ({", ".join(families)}) for {", ".join(archs)}.

Made by `aotc bundle wheel` (aotc {__version__}). aotc.load() finds it through the
`{ENTRY_POINT_GROUP}` entry point {name!r}.
"""
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent / {member!r}
BUNDLE_SHA256 = {digest!r}


def bundle_path() -> str:
    """The installed bundle's path (the `{ENTRY_POINT_GROUP}` entry point)."""
    return str(BUNDLE)
'''.encode()
    info_dir = f"{dist}-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: aotc kernel bundle ({len(b.artifacts)} kernels for {', '.join(archs) or 'no arch'})",
        *[f"Requires-Dist: {r.strip()}" for r in requires],
        "",
        f"aotc bundle `{member}` (sha256 {digest}), packaged by aotc {__version__}.",
        "",
    ]).encode()
    wheel_meta = "\n".join(["Wheel-Version: 1.0", f"Generator: aotc {__version__}", "Root-Is-Purelib: true",
                            "Tag: py3-none-any", ""]).encode()
    entry_points = f"[{ENTRY_POINT_GROUP}]\n{name} = {package}:bundle_path\n".encode()
    files = [
        (f"{package}/__init__.py", init),
        (f"{package}/{member}", data),
        (f"{info_dir}/METADATA", metadata),
        (f"{info_dir}/WHEEL", wheel_meta),
        (f"{info_dir}/entry_points.txt", entry_points),
        (f"{info_dir}/top_level.txt", f"{package}\n".encode()),
    ]
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, content in files:
        writer.writerow([path, "sha256=" + _b64(hashlib.sha256(content).digest()), str(len(content))])
    writer.writerow([f"{info_dir}/RECORD", "", ""])
    files.append((f"{info_dir}/RECORD", record.getvalue().encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, content in files:  # dist-info last, RECORD last of all (the wheel spec's recommendation)
            zi = zipfile.ZipInfo(path, date_time=_DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = (stat.S_IFREG | 0o644) << 16
            zf.writestr(zi, content)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{version}-py3-none-any.whl"
    atomic_write(wheel, buf.getvalue())
    return {"wheel": str(wheel), "name": name, "version": version, "package": package,
            "entry_point": f"{name} = {package}:bundle_path", "bundle_sha256": digest, "kernels": len(b.artifacts)}


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
