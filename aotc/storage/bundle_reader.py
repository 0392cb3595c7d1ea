"""Reading bundles: nothing in one is believed until it is checked.

Readers never extract member paths to disk: members are read into memory with size limits, checked
against the manifest (size, sha256) and each artifact against itself, this aotc's families and its
arch (aotc.common.checks), and refused with a message naming the member. Two ways to read:

- read_bundle / verify_bundle check everything at once (``aotc bundle verify|inspect|install``);
- open_bundle checks the zip's directory and the manifest only (structure, sizes, duplicates,
  variant fields, keys, launch limits) and hands out members that read, sha256-check and
  cubin-check their bytes when first asked: ``aotc.runtime.load()`` stays fast and still never
  launches a corrupt member (the runtime reads it before loading it into the driver).

Standard library only: the runtime reads bundles.
"""
from __future__ import annotations

import dataclasses
import re
import stat
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .. import __version__
from ..common import checks, config
from ..common.artifact import Artifact, sha256_hex
from ..common.errors import BundleError, VersionSkewError
from ..common.untrusted import UntrustedInput, check_plain_json, open_regular_file, parse_json

FORMAT = "aotc-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 64 << 20
_KEY = re.compile(r"[0-9a-f]{64}")


# plain classes rather than dataclasses: a dataclass costs about a millisecond to define, and this module
# is imported by every aotc.runtime.load()

class Bundle:
    """A bundle read whole: its manifest and every artifact, bytes checked."""

    __slots__ = ("path", "manifest", "artifacts")

    def __init__(self, path: str, manifest: dict, artifacts: list[Artifact]):
        self.path, self.manifest, self.artifacts = path, manifest, artifacts

    def __repr__(self) -> str:
        return f"Bundle({self.path!r}, {len(self.artifacts)} artifacts)"


class BundleMember:
    """One manifest entry whose header is checked; read() reads and checks its bytes."""

    __slots__ = ("bundle", "member", "artifact", "size", "check_arch")

    def __init__(self, bundle: str, member: str, artifact: Artifact, size: int, check_arch: bool = True):
        self.bundle, self.member, self.size, self.check_arch = bundle, member, size, check_arch
        self.artifact = artifact  # the header's facts; its cubin is empty: read() returns the checked artifact

    def __repr__(self) -> str:
        return f"BundleMember({self.bundle!r}, {self.member!r})"

    def read(self) -> Artifact:
        """The member's bytes, checked against the manifest and as a cubin; BundleError names the member."""
        with _open_zip(self.bundle) as zf:
            try:
                return _read_artifact(zf, self)
            except BundleError as e:
                raise BundleError(f"bundle {self.bundle}: member {self.member!r}: {e}") from None


class BundleIndex:
    """A bundle whose directory and manifest are checked; its members' bytes are read on demand."""

    __slots__ = ("path", "manifest", "members")

    def __init__(self, path: str, manifest: dict, members: list[BundleMember]):
        self.path, self.manifest, self.members = path, manifest, members


def open_bundle(path: str | Path, *, check_arch: bool = True, other_sources: bool = False) -> BundleIndex:
    """Check a bundle's directory and manifest, without reading its members. Raises BundleError naming
    what is wrong (VersionSkewError for another format version)."""
    path = str(path)

    def fail(msg: str) -> None:
        raise BundleError(f"bundle {path}: {msg}")

    with _open_zip(path) as zf:
        manifest, members = _scan(zf, path, fail, check_arch, other_sources)
    return BundleIndex(path, manifest, members)


def read_bundle(path: str | Path, *, check_arch: bool = True, other_sources: bool = False) -> Bundle:
    """Open, check and load every artifact of a bundle. Raises BundleError naming what is wrong.

    other_sources: accept kernels whose keys record no parts and are not this aotc's (bundles made by
    an earlier aotc): for reading them side by side (`aotc bundle diff`), never for serving them."""
    _problems, bundle = _read(str(path), check_arch=check_arch, collect=False, other_sources=other_sources)
    return bundle


def verify_bundle(path: str | Path) -> list[str]:
    """Every problem found in the bundle (an empty list means it verifies)."""
    problems, _ = _read(str(path), check_arch=True, collect=True)
    return problems


def _read(path: str, *, check_arch: bool, collect: bool, other_sources: bool = False) -> tuple[list[str], Bundle | None]:
    problems: list[str] = []

    def fail(msg: str) -> None:
        if not collect:
            raise BundleError(f"bundle {path}: {msg}")
        problems.append(msg)

    with _open_zip(path) as zf:
        try:
            manifest, members = _scan(zf, path, fail, check_arch, other_sources)
        except _Stop:  # only when collecting: the problems found so far leave nothing more to check
            return problems, None
        artifacts = []
        for m in members:
            try:
                artifacts.append(_read_artifact(zf, m))
            except BundleError as e:
                fail(f"member {m.member!r}: {e}")
    return problems, Bundle(path, manifest, artifacts)


@contextmanager
def _open_zip(path: str) -> Iterator[zipfile.ZipFile]:
    """The bundle as a zip; a FIFO or device is refused without blocking. BundleError names the bundle."""
    try:
        f = open_regular_file(path, f"bundle {path}")
    except FileNotFoundError:
        raise BundleError(f"bundle {path}: no such file") from None
    except UntrustedInput as e:
        raise BundleError(str(e)) from None
    except OSError as e:
        raise BundleError(f"bundle {path}: cannot open it ({e.strerror or e})") from None
    with f:  # a ZipFile never closes a file object it was given
        try:
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise BundleError(f"bundle {path}: not a readable zip file ({e})") from None
        with zf:
            yield zf


def _scan(zf: zipfile.ZipFile, path: str, fail: Callable[[str], None],
          check_arch: bool, other_sources: bool = False) -> tuple[dict, list[BundleMember]]:
    """Directory and manifest checks; returns (manifest, the members that passed). `fail` raises or collects;
    a problem that leaves nothing to check further raises even when collecting."""
    max_member, max_total = config.max_member_bytes(), config.max_bundle_bytes()
    n_problems = [0]

    def problem(msg: str) -> None:
        n_problems[0] += 1
        fail(msg)

    def fatal(msg: str):
        problem(msg)
        raise _Stop(path)  # reached only when collecting: stop here

    infos = zf.infolist()
    seen: set[str] = set()
    total = 0
    for zi in infos:
        why = _check_member_name(zi.filename)
        if why:
            problem(f"member {zi.filename!r} refused: {why}")
        if zi.filename in seen:
            problem(f"member {zi.filename!r} appears more than once")
        seen.add(zi.filename)
        if stat.S_ISLNK(zi.external_attr >> 16):
            problem(f"member {zi.filename!r} refused: symbolic link")
        if zi.is_dir():
            continue
        limit = MAX_MANIFEST_BYTES if zi.filename == MANIFEST else max_member
        if zi.file_size > limit:
            problem(f"member {zi.filename!r} declares {zi.file_size} bytes, over the limit of {limit} "
                    f"({'manifest limit' if zi.filename == MANIFEST else 'AOTC_BUNDLE_MAX_MEMBER_BYTES'})")
        total += zi.file_size
    if total > max_total:
        problem(f"members declare {total} bytes in all, over the limit of {max_total} (AOTC_BUNDLE_MAX_BYTES)")
    if n_problems[0]:
        raise _Stop(path)
    if MANIFEST not in seen:
        fatal("no manifest.json")
    try:
        manifest = parse_json(_read_member(zf, MANIFEST, MAX_MANIFEST_BYTES), "manifest.json")
    except (UntrustedInput, BundleError) as e:
        fatal(f"manifest.json unreadable: {e}")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        fatal("manifest.json is not an aotc bundle manifest")
    producer = manifest.get("producer", {})
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        made_by = producer.get("aotc", "?") if isinstance(producer, dict) else "?"
        msg = (f"bundle {path}: format version {version!r} (made by aotc {str(made_by)[:40]}); "
               f"this aotc ({__version__}) reads format version {FORMAT_VERSION}")
        raise VersionSkewError(msg, hint=f"use aotc {str(made_by)[:40]} to read it, or rebuild the "
                                         f"bundle with this aotc: aotc build SPEC --bundle {path}")
    if not isinstance(producer, dict) or not all(isinstance(v, str) for v in producer.values()):
        fatal("manifest.json: 'producer' must map names to version strings")
    try:
        check_plain_json(manifest.get("created"), "manifest.json 'created'")
    except UntrustedInput as e:
        fatal(str(e))
    entries = manifest.get("artifacts")
    if not isinstance(entries, list):
        fatal("manifest.json has no artifact list")
    members = _scan_entries(zf, path, entries, seen, max_member, problem, check_arch, other_sources)
    extra = sorted(seen - {m for m in _listed(entries)} - {MANIFEST})
    if extra:
        problem(f"members not described by the manifest: {extra[:5]}")
    return manifest, members


class _Stop(BundleError):
    """Raised while collecting problems when those found leave nothing more to check."""

    def __init__(self, path: str):
        super().__init__(f"bundle {path}: refused")


def _listed(entries: list) -> list[str]:
    return [e["member"] for e in entries if isinstance(e, dict) and isinstance(e.get("member"), str)]


def _scan_entries(zf: zipfile.ZipFile, path: str, entries: list, seen: set[str], max_member: int, problem,
                  check_arch: bool, other_sources: bool = False) -> list[BundleMember]:
    members: list[BundleMember] = []
    by_member: set[str] = set()
    by_variant: dict = {}
    by_key: dict[str, str] = {}
    by_sha: dict[str, tuple] = {}
    for i, entry in enumerate(entries):
        member = entry.get("member") if isinstance(entry, dict) else None
        if not isinstance(member, str) or member not in seen or _check_member_name(member):
            problem(f"manifest entry #{i} names member {str(member)[:120]!r}, which the zip does not hold")
            continue
        if member in by_member:
            problem(f"member {member!r} listed twice in the manifest")
            continue
        by_member.add(member)
        try:
            art, size = Artifact.describe(entry)
        except (ValueError, KeyError, TypeError) as e:
            problem(f"member {member!r} has a malformed manifest entry: {e}")
            continue
        if size != zf.getinfo(member).file_size:
            problem(f"member {member!r}: the manifest says {size} bytes, the zip entry {zf.getinfo(member).file_size}")
            continue
        if size > max_member:
            problem(f"member {member!r}: {size} bytes, over the limit of {max_member} (AOTC_BUNDLE_MAX_MEMBER_BYTES)")
            continue
        if not _KEY.fullmatch(art.key):
            problem(f"member {member!r}: key {art.key[:80]!r} is not a cache key (64 hex digits)")
            continue
        why = _header_problem(art, other_sources)
        if why:
            problem(f"member {member!r}: {why}")
            continue
        name = art.variant.name
        if art.variant in by_variant:
            problem(f"member {member!r}: {name} is also member {by_variant[art.variant]!r}")
            continue
        if by_key.get(art.key, name) != name:
            problem(f"member {member!r}: key {art.key[:16]}... is also the key of {by_key[art.key]}")
            continue
        facts = (art.abi, art.launch.to_json())
        if by_sha.get(art.sha256, facts) != facts:
            problem(f"member {member!r}: its cubin (sha256 {art.sha256[:16]}...) is also another member's, "
                    f"with other launch facts or ABI")
            continue
        by_variant[art.variant], by_key[art.key], by_sha[art.sha256] = member, name, facts
        members.append(BundleMember(path, member, art, size, check_arch))
    return members


def _header_problem(art: Artifact, other_sources: bool = False) -> str | None:
    """What the header check (everything but the bytes) refuses. Where the DSL is installed, a key that
    records no parts must be the one this aotc computes; without it such keys cannot be recomputed."""
    try:
        status = checks.check_artifact(art, conform=True, with_cubin=False, header="the manifest")
    except checks.Refused as e:
        return str(e)
    if status.state == "unmatched" and status.local_dsl and not other_sources:
        return status.reason + "; rebuild the bundle with this aotc"
    return None


def _read_artifact(zf: zipfile.ZipFile, m: BundleMember) -> Artifact:
    """Read one member's bytes and check them (size, sha256, the cubin); BundleError says what is wrong."""
    try:
        zi = zf.getinfo(m.member)
    except KeyError:
        raise BundleError("no longer in the bundle file") from None
    if zi.file_size != m.size:
        raise BundleError(f"the zip entry is {zi.file_size} bytes, the manifest says {m.size}")
    data = _read_member(zf, m.member, m.size)
    if len(data) != m.size:
        raise BundleError(f"holds {len(data)} bytes, the manifest says {m.size}")
    art = dataclasses.replace(m.artifact, cubin=data)
    digest = sha256_hex(data)
    if digest != art.sha256:
        raise BundleError(f"does not match the manifest: sha256 {digest[:16]}... != recorded {art.sha256[:16]}...")
    try:
        checks.check_artifact(art, conform=True, check_arch=m.check_arch, header="the manifest")
    except checks.Refused as e:
        raise BundleError(str(e)) from None
    return art


def _check_member_name(name: str) -> str | None:
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if "\\" in name or "\0" in name:
        return "backslash or NUL in name"
    if any(part in ("..", ".", "") for part in name.split("/")):
        return "'..', '.' or empty path component"
    return None


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
