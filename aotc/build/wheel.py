"""`aotc bundle wheel`: a pip-installable wheel that carries a bundle (standard library, and `packaging` for names).

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

Names, versions and requirements are checked with the ``packaging`` library's
rules (the ones pip applies), and the wheel may not shadow what an image
already imports: its package is never a standard-library module, a module
importable here (unless this same distribution installed it: a new version of
the bundle), or one of the import names aotc runs with; its distribution name
is never one installed here that is not an aotc bundle wheel, nor one of
aotc's own dependencies.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as md
import importlib.util
import io
import keyword
import re
import stat
import sys
import zipfile
from pathlib import Path
from typing import Iterable

from .. import __version__
from ..storage.bundle import ENTRY_POINT_GROUP, read_bundle
from ..storage.atomic import atomic_write
from ..common.errors import UsageError

_DATE = (2020, 1, 1, 0, 0, 0)
_IMPORT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# what a deployment of aotc imports and installs, whether or not this build machine has it
RESERVED_IMPORT_NAMES = frozenset({"aotc", "cuda", "numpy", "click", "filelock", "platformdirs", "cutlass", "torch",
                                   "packaging"})
RESERVED_DISTRIBUTIONS = frozenset({"aotc", "cuda-python", "cuda-bindings", "cuda-core", "numpy", "click", "filelock",
                                    "platformdirs", "nvidia-cutlass-dsl", "torch", "packaging", "pip", "setuptools",
                                    "wheel"})


class WheelError(UsageError):
    """A bad --name/--version/--package/--requires (exit code 2: usage)."""


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
    dist, package, requires = _checked(name, version, package, requires)
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
        *[f"Requires-Dist: {r}" for r in requires],
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


def _checked(name: str, version: str, package: str | None, requires: Iterable[str]) -> tuple[str, str, list[str]]:
    """(wheel file name part, package, requirement lines); WheelError for anything pip would refuse or
    that would shadow an installed module or distribution."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.utils import InvalidName, canonicalize_name
        from packaging.version import InvalidVersion, Version
    except ImportError:
        raise WheelError("aotc bundle wheel needs the packaging library to check names and versions",
                         hint="pip install 'packaging>=24.2' (part of aotc's compile extra)") from None
    try:
        canonical = canonicalize_name(name, validate=True)
    except InvalidName:
        raise WheelError(f"--name {name!r} is not a valid distribution name (letters, digits, '.', '-', '_'; "
                         f"starting and ending with a letter or digit)") from None
    try:
        normal = str(Version(version))
    except InvalidVersion:
        raise WheelError(f"--version {version!r} is not a canonical PEP 440 version (e.g. 1.0.0, 2.1rc1, "
                         f"1.0+cu12)") from None
    if normal != version:  # Version() also accepts 'v1', '1.0-final' spellings and surrounding whitespace
        raise WheelError(f"--version {version!r} is not a canonical PEP 440 version: write {normal!r}")
    if canonical in RESERVED_DISTRIBUTIONS or _installed_elsewhere(canonical):
        raise WheelError(f"--name {name!r} is the name of a distribution that is not this bundle's; installing the "
                         f"wheel would replace it", hint="choose a name of your own, e.g. acme-attention-kernels")
    dist = normalize(name)
    package = package or (("_" if dist[0].isdigit() else "") + dist)
    if not _IMPORT_NAME.fullmatch(package) or keyword.iskeyword(package) or package.startswith("__"):
        raise WheelError(f"--package {package!r} is not a usable import name (an ASCII identifier, not a keyword "
                         f"or a dunder name)")
    if (package in RESERVED_IMPORT_NAMES or package in sys.stdlib_module_names or package in sys.builtin_module_names
            or _importable_elsewhere(package, canonical)):
        raise WheelError(f"--package {package!r} is not a usable import name: a module of that name already exists "
                         f"(the standard library, aotc's own imports, or installed here) and the wheel would shadow "
                         f"it", hint="choose a package name of your own with --package")
    lines = []
    for req in requires:
        try:
            lines.append(str(Requirement(req)))
        except InvalidRequirement as e:
            raise WheelError(f"--requires {req!r} is not a valid requirement (PEP 508): "
                             f"{str(e).splitlines()[0]}") from None
    return dist, package, lines


def _installed_elsewhere(canonical: str) -> bool:
    """An installed distribution of that name that is not an aotc bundle wheel (no aotc.bundles entry point)."""
    from packaging.utils import canonicalize_name

    for d in md.distributions():
        try:
            if canonicalize_name(d.metadata["Name"] or "") != canonical:
                continue
            return not any(ep.group == ENTRY_POINT_GROUP for ep in d.entry_points)
        except Exception:  # broken metadata of an unrelated distribution
            continue
    return False


def _importable_elsewhere(package: str, canonical: str) -> bool:
    """`package` imports here and no installed distribution of this wheel's name provides it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None:  # absent, or a namespace package (directories, nothing to shadow)
        return False
    from packaging.utils import canonicalize_name

    owners = md.packages_distributions().get(package, [])
    return not any(canonicalize_name(o) == canonical for o in owners)


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
