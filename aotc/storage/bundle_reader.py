"""Reading bundles: nothing in one is believed until it is checked.

Readers never extract member paths to disk: members are read into memory with size limits, checked
against the manifest (size, sha256) and each artifact against itself, this aotc's families and its
arch (aotc.common.checks), and refused with a message naming the member. Two ways to read:

- read_bundle / verify_bundle check everything at once (``aotc bundle verify|inspect|install``);
- open_bundle checks the zip's directory and the manifest's structure only (format and version,
  member names and sizes, every entry's variant record, key and sha256 types, duplicate members,
  variants and keys, one cubin with two sets of launch facts, members the manifest does not list)
  and hands out members that check the rest of their header (family rules, the key recomputed
  from its parts, launch limits: BundleMember.checked_header) when the runtime first selects them,
  and read, sha256-check and cubin-check their bytes when it first loads them: so
  ``aotc.runtime.load()`` stays fast and still never launches a corrupt or mislabelled member.

Checking the headers at first selection rather than in load() measured (benchmarks/probes/cold_load.py:
default bundle, 116 members, torch imported, no bytecode cache): load() 25.8 -> 13.3 ms. The checks cost
~75 us a member plus ~9 ms of imports (aotc.common.checks, keys, abi, artifact, the families); the
first kernel call now pays those imports and one member's checks, not 116 members' and four families'.

Standard library only: the runtime reads bundles.
"""
from __future__ import annotations

import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from .. import __version__
from ..common import config
from ..common.header import identity
from ..common.errors import BundleError, VersionSkewError
from ..common.untrusted import UntrustedInput, check_plain_json, open_regular_file, parse_json

if TYPE_CHECKING:
    import zipfile

    from ..common.artifact import Artifact

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
    """One manifest entry whose identity (variant, key, sha256, size) is checked against the rest of the
    bundle; checked_header() checks the rest of the header, read() reads and checks the bytes."""

    __slots__ = ("bundle", "member", "entry", "variant", "key", "sha256", "size", "check_arch", "other_sources",
                 "_header")

    def __init__(self, bundle: str, member: str, entry: dict, variant, key: str, sha256: str, size: int,
                 check_arch: bool = True, other_sources: bool = False):
        self.bundle, self.member, self.entry, self.size = bundle, member, entry, size
        self.variant, self.key, self.sha256 = variant, key, sha256
        self.check_arch, self.other_sources = check_arch, other_sources
        self._header: Artifact | None = None

    def __repr__(self) -> str:
        return f"BundleMember({self.bundle!r}, {self.member!r})"

    def checked_header(self) -> Artifact:
        """The manifest entry as an artifact whose cubin is empty, checked (aotc.common.checks: the family's
        fields and rules, the key against its parts, the launch limits) on the first call; BundleError
        names the bundle, the member and what is wrong."""
        if self._header is None:
            why, art = _header(self)
            if why:
                raise BundleError(f"bundle {self.bundle}: member {self.member!r}{why}")
            self._header = art
        return self._header

    def read(self) -> Artifact:
        """The member's bytes, checked against the manifest and as a cubin (after its header); BundleError
        names the member."""
        header = self.checked_header()
        with _open_zip(self.bundle) as zf:
            try:
                return _read_artifact(zf, self, header)
            except BundleError as e:
                raise BundleError(f"bundle {self.bundle}: member {self.member!r}: {e}") from None


class BundleIndex:
    """A bundle whose directory and manifest are checked; its members' bytes are read on demand."""

    __slots__ = ("path", "manifest", "members")

    def __init__(self, path: str, manifest: dict, members: list[BundleMember]):
        self.path, self.manifest, self.members = path, manifest, members


def open_bundle(path: str | Path, *, check_arch: bool = True, other_sources: bool = False) -> BundleIndex:
    """Check a bundle's directory and manifest's structure, without reading its members or checking their
    headers (see the module). Raises BundleError naming what is wrong (VersionSkewError for another format
    version)."""
    path = str(path)

    def fail(msg: str) -> None:
        raise BundleError(f"bundle {path}: {msg}")

    with _open_zip(path) as zf:
        manifest, members = _scan(zf, path, fail, check_arch, other_sources, headers=False)
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
                artifacts.append(_read_artifact(zf, m, m.checked_header()))
            except BundleError as e:
                fail(f"member {m.member!r}: {e}")
    return problems, Bundle(path, manifest, artifacts)


@contextmanager
def _open_zip(path: str) -> Iterator[zipfile.ZipFile]:
    """The bundle as a zip; a FIFO or device is refused without blocking. BundleError names the bundle."""
    import zipfile  # already imported where torch is; else 1 ms, paid by the readers only

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
          check_arch: bool, other_sources: bool = False, headers: bool = True) -> tuple[dict, list[BundleMember]]:
    """Directory and manifest checks; returns (manifest, the members that passed). `fail` raises or collects;
    a problem that leaves nothing to check further raises even when collecting. headers: check every
    member's header too (else each checks it on first use: BundleMember.checked_header)."""
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
    members = _scan_entries(zf, path, entries, seen, max_member, problem, check_arch, other_sources, headers)
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
                  check_arch: bool, other_sources: bool = False, headers: bool = True) -> list[BundleMember]:
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
            variant, key, sha, size = identity(entry)
        except (ValueError, KeyError, TypeError) as e:
            problem(f"member {member!r} has a malformed manifest entry: {e}")
            continue
        m = BundleMember(path, member, entry, variant, key, sha, size, check_arch, other_sources)
        if size != zf.getinfo(member).file_size:
            problem(f"member {member!r}: the manifest says {size} bytes, the zip entry {zf.getinfo(member).file_size}")
            continue
        if size > max_member:
            problem(f"member {member!r}: {size} bytes, over the limit of {max_member} (AOTC_BUNDLE_MAX_MEMBER_BYTES)")
            continue
        if not _KEY.fullmatch(key):
            problem(f"member {member!r}: key {key[:80]!r} is not a cache key (64 hex digits)")
            continue
        if headers:
            why, _ = _header(m)
            if why:
                problem(f"member {member!r}{why}")
                continue
        name = variant.name
        if variant in by_variant:
            problem(f"member {member!r}: {name} is also member {by_variant[variant]!r}")
            continue
        if by_key.get(key, name) != name:
            problem(f"member {member!r}: key {key[:16]}... is also the key of {by_key[key]}")
            continue
        # the entry's ABI and launch facts as recorded (JSON: a comparison of plain values, no parsing)
        facts = (entry.get("abi"), entry.get("launch"))
        if by_sha.get(sha, facts) != facts:
            problem(f"member {member!r}: its cubin (sha256 {sha[:16]}...) is also another member's, "
                    f"with other launch facts or ABI")
            continue
        by_variant[variant], by_key[key], by_sha[sha] = member, name, facts
        members.append(m)
    return members


def _header(m: BundleMember) -> tuple[str, Artifact | None]:
    """(what the header check, everything but the bytes, refuses: "" when nothing, else the text that follows
    the member's name; the checked artifact). Where the DSL is installed, a key that records no parts must
    be the one this aotc computes; without it such keys cannot be recomputed."""
    from ..common import checks
    from ..common.artifact import Artifact

    try:
        art, _ = Artifact.describe(m.entry)
    except (ValueError, KeyError, TypeError) as e:
        return f" has a malformed manifest entry: {e}", None
    try:
        status = checks.check_artifact(art, conform=True, with_cubin=False, header="the manifest")
    except checks.Refused as e:
        return f": {e}", None
    if status.state == "unmatched" and status.local_dsl and not m.other_sources:
        return f": {status.reason}; rebuild the bundle with this aotc", None
    return "", art


def _read_artifact(zf: zipfile.ZipFile, m: BundleMember, header: Artifact) -> Artifact:
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
    import dataclasses

    from ..common import checks
    from ..common.artifact import sha256_hex

    art = dataclasses.replace(header, cubin=data)
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
    import zipfile
    import zlib

    try:
        with zf.open(name) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError) as e:
        # a bad CRC (e.g. a central directory that understates the size), a broken deflate stream, encryption
        raise BundleError(f"{name!r} is corrupt: {e}") from None
    if len(data) > limit:
        raise BundleError(f"{name!r} inflates past {limit} bytes")
    return data
