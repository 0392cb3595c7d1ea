"""The persistent, content-addressed artifact cache.

Layout under the root (AOTC_CACHE_DIR or platformdirs' user cache dir):

    v1/entries/<key[:2]>/<key>/kernel.cubin   the machine code
    v1/entries/<key[:2]>/<key>/meta.json      header (variant, ABI, launch, sha256, ...): the commit marker, written last
    v1/locks/<key>.lock                       per-key lock held across a compile (AOTC_LOCK_DIR moves them)
    v1/quarantine/<key>.<time>/               entries that failed verification, kept for inspection
    v1/stats.json                             counters shared by every process using the cache

Readers take no lock: files are written under temporary names, fsynced and
``os.replace``d, and an entry counts only once meta.json exists and the cubin's
sha256 matches it. Writers hold the key's lock across check, compile and commit,
so N processes asking for one cold key compile it once.

Every read checks the entry with aotc.common.checks: an entry whose cubin is not
what meta.json says (another arch, a missing symbol, another parameter table,
launch facts past the arch's limits, a key that is not its variant's) is invalid
and quarantined. An entry whose key is not the one this aotc computes for its
variant (made by another aotc, DSL or kernel sources) is stale: valid for whoever
made it, never served by the runtime, listed as such by ``aotc cache ls``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..common import checks, config, keys
from ..common.artifact import Artifact, sha256_hex
from ..common.errors import CacheError, LockTimeoutError
from ..common.untrusted import UntrustedInput, parse_json, read_regular_file
from ..common.variant import Variant
from .atomic import atomic_write, test_kill_point

LAYOUT = "v1"
COUNTERS = ("hits", "misses", "compiles", "bypassed", "invalid")
MAX_META_BYTES = 4 << 20  # a meta.json is a few KiB
MAX_STATS_BYTES = 1 << 20
_KEY = re.compile(r"[0-9a-f]{64}")  # a cache key is a sha256 hex digest; nothing else becomes a path


def _checked(key: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise CacheError(f"not a cache key: {key!r} (expected 64 lowercase hex digits)")
    return key


@dataclass
class EntryStatus:
    key: str
    path: Path
    state: str  # "ok", "stale" (valid, but not this aotc's key for its variant), "missing", "partial", "invalid"
    reason: str = ""


class Cache:
    def __init__(self, root: str | Path | None = None, lock_dir: str | Path | None = None,
                 lock_timeout: float | None = None):
        self.root = (Path(root) if root is not None else config.cache_dir()) / LAYOUT
        lock_env = config.lock_dir()
        self.lock_dir = Path(lock_dir) if lock_dir is not None else (lock_env or self.root / "locks")
        self._lock_timeout = None if lock_timeout is None else config.check_lock_timeout(lock_timeout)

    @property
    def lock_timeout(self) -> float:
        """Seconds to wait for a key's lock: the constructor's, else AOTC_LOCK_TIMEOUT, read when first
        needed (readers take no lock, so a bad value never stops them)."""
        if self._lock_timeout is None:
            self._lock_timeout = config.lock_timeout()
        return self._lock_timeout

    # ---- paths -------------------------------------------------------------
    @property
    def entries_dir(self) -> Path:
        return self.root / "entries"

    def entry_dir(self, key: str) -> Path:
        return self.entries_dir / key[:2] / _checked(key)

    def lock_path(self, key: str) -> Path:
        return self.lock_dir / f"{_checked(key)}.lock"

    # ---- locking -----------------------------------------------------------
    @contextmanager
    def locked(self, key: str, what: str = "", timeout: float | None = None) -> Iterator[None]:
        """Hold the key's lock; flock-based, so a killed holder releases it. timeout=0: try once."""
        import filelock  # the runtime reads the cache without it

        timeout = self.lock_timeout if timeout is None else config.check_lock_timeout(timeout)
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.lock_path(key)), timeout=timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise LockTimeoutError(
                f"timed out after {timeout:g} s waiting for the lock on {what or key} "
                f"({self.lock_path(key)}): another process is compiling it or hung",
                hint="raise AOTC_LOCK_TIMEOUT, or find the process holding the lock (e.g. `fuser` on the lock file)",
            ) from None
        try:
            yield
        finally:
            lock.release()

    # ---- counters ----------------------------------------------------------
    def count(self, **deltas: float) -> None:
        """Add to the shared counters (a locked read-modify-write of stats.json)."""
        try:
            import filelock
        except ImportError:  # a runtime-only image: counters are best effort
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with filelock.FileLock(str(self.root / "stats.lock"), timeout=60):
                for stale in self.root.glob(".stats.json.tmp-*"):  # left by a process killed mid-count
                    stale.unlink(missing_ok=True)
                stats = self.stats()
                for k, v in deltas.items():
                    stats[k] = stats.get(k, 0) + v
                atomic_write(self.root / "stats.json", json.dumps(stats, sort_keys=True).encode())
        except (OSError, filelock.Timeout):
            pass  # a counter is never worth failing a build or a load

    def stats(self) -> dict:
        """The counters; whatever stats.json holds that is not a count (a string, a list, null, inf) reads
        as 0, and the next count() rewrites it."""
        try:
            data = parse_json(read_regular_file(self.root / "stats.json", MAX_STATS_BYTES), "stats.json")
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        out = {k: int(_count(data.get(k))) for k in COUNTERS}
        out["compile_seconds"] = float(_count(data.get("compile_seconds")))
        return out

    # ---- reading -----------------------------------------------------------
    def check(self, key: str, variant: Variant | None = None) -> tuple[EntryStatus, Artifact | None]:
        """Read and verify one entry without side effects (and that it holds `variant`, when given).

        The artifact comes back for "ok" and "stale" entries. Passing `variant` says the caller computed
        `key` for it (a build's lookup): the entry is then held to the family's rules, as a current one is."""
        d = self.entry_dir(key)
        try:
            meta_bytes = read_regular_file(d / "meta.json", MAX_META_BYTES, "meta.json")
        except FileNotFoundError:
            state = "partial" if d.exists() else "missing"
            return EntryStatus(key, d, state, "no meta.json" if state == "partial" else ""), None
        except UntrustedInput as e:
            return EntryStatus(key, d, "invalid", str(e)), None
        except OSError as e:
            return EntryStatus(key, d, "invalid", f"meta.json unreadable: {e}"), None
        try:
            header = parse_json(meta_bytes, "meta.json")
            if not isinstance(header, dict):
                return EntryStatus(key, d, "invalid", f"meta.json holds a {type(header).__name__}, not an object"), None
            if header.get("key") != key:
                return EntryStatus(key, d, "invalid", f"meta.json names key {str(header.get('key'))[:16]}..."), None
            cubin = read_regular_file(d / "kernel.cubin", config.max_member_bytes(), "kernel.cubin")
            art = Artifact.from_header(header, cubin)
        except FileNotFoundError:
            return EntryStatus(key, d, "invalid", "kernel.cubin missing"), None
        except (OSError, ValueError, KeyError, TypeError) as e:
            reason = str(e) if isinstance(e, UntrustedInput) else f"{type(e).__name__}: {e}"
            return EntryStatus(key, d, "invalid", reason), None
        if variant is not None and art.variant != variant:
            return EntryStatus(key, d, "invalid", f"entry holds {art.variant.name}, not {variant.name}"), None
        current = variant is not None or keys.is_this_aotcs_key(art.variant, key, art.info)
        try:
            checks.check_artifact(art, conform=current, header="meta.json")
        except checks.Refused as e:
            return EntryStatus(key, d, "invalid", str(e)), None
        if not current:
            return EntryStatus(key, d, "stale", "not the key this aotc computes for its variant"), art
        return EntryStatus(key, d, "ok"), art

    def load(self, key: str, variant: Variant | None = None, *, count: bool = True) -> Artifact | None:
        """The verified artifact, or None on a miss. A bad entry is counted invalid and quarantined.

        Without `variant`, a stale entry is a miss (left in place: it is valid for the aotc that made it)."""
        status, art = self.check(key, variant)
        if art is not None and status.state == "stale" and variant is None:
            art = None
        if art is not None:
            try:
                os.utime(status.path / "meta.json")  # last use, for LRU eviction
            except OSError:
                pass
            if count:
                self.count(hits=1)
            return art
        if status.state == "invalid":
            # a reader never waits on a writer: whoever holds the key's lock is rewriting or removing the
            # entry (and what looked invalid may be that write in progress); the next use rechecks it
            self.quarantine(key, status.reason, variant, wait=False)
        if count:
            self.count(misses=1)
        return None

    def quarantine(self, key: str, reason: str, variant: Variant | None = None, *, wait: bool = True,
                   strict: bool = False) -> bool:
        """Move a bad entry aside (under its lock) and count it invalid; True when this call moved it.

        wait=False tries the lock once and skips when another process holds it. A lock timeout is
        skipped too, unless strict (then LockTimeoutError, naming the lock, propagates)."""
        try:
            with self.locked(key, timeout=None if wait else 0):
                return self._quarantine_locked(key, reason, variant)
        except LockTimeoutError:
            if strict:
                raise
            return False
        except (ImportError, OSError):
            return False

    def _quarantine_locked(self, key: str, reason: str, variant: Variant | None = None) -> bool:
        """quarantine() for a caller that already holds the key's lock (flock does not nest across fds)."""
        status, _ = self.check(key, variant)
        if status.state not in ("invalid", "partial"):
            return False  # another process already repaired it
        dest = self.root / "quarantine" / f"{key}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(status.path, dest)
        try:
            (dest / "REASON").write_text(reason + "\n")
        except OSError:
            pass
        if status.state == "invalid":
            self.count(invalid=1)
        return True

    # ---- writing -----------------------------------------------------------
    def commit(self, art: Artifact) -> None:
        """Write an entry: cubin first, meta.json last (the commit marker). Caller holds the key's lock."""
        if sha256_hex(art.cubin) != art.sha256:
            raise CacheError(f"refusing to commit {art.variant.name}: cubin does not match its sha256")
        try:  # what a read would quarantine is never written
            checks.check_artifact(art, conform=True)
        except checks.Refused as e:
            raise CacheError(f"refusing to commit {art.variant.name}: {e}") from None
        d = self.entry_dir(art.key)
        d.mkdir(parents=True, exist_ok=True)
        (d / "meta.json").unlink(missing_ok=True)  # uncommit first if we are repairing
        for stale in d.glob(".*.tmp-*"):  # left by a writer killed mid-commit (we hold the key's lock)
            stale.unlink(missing_ok=True)
        test_kill_point("before_cubin")
        atomic_write(d / "kernel.cubin", art.cubin, _test_point="after_cubin_tmp")
        test_kill_point("after_cubin")
        atomic_write(d / "meta.json", json.dumps(art.header(), sort_keys=True, indent=1).encode(),
                     _test_point="after_meta_tmp")
        test_kill_point("after_meta")

    def get_or_create(self, key: str, variant: Variant, create: Callable[[], Artifact]) -> tuple[Artifact, bool]:
        """check -> lock -> recheck -> create -> commit. Returns (artifact, created)."""
        art = self.load(key, variant)
        if art is not None:
            return art, False
        return self.fill(key, variant, create)

    def fill(self, key: str, variant: Variant, create: Callable[[], Artifact]) -> tuple[Artifact, bool]:
        """After a miss: lock -> recheck -> create -> commit, so concurrent processes create a key once."""
        with self.locked(key, variant.name):
            # check(), not load(): load() quarantines a bad entry under the key's lock, which we hold
            status, art = self.check(key, variant)
            if art is not None:  # another process committed it while we waited
                try:
                    os.utime(status.path / "meta.json")
                except OSError:
                    pass
                self.count(hits=1)
                return art, False
            if status.state == "invalid":
                try:
                    self._quarantine_locked(key, status.reason, variant)
                except OSError:
                    pass  # commit() overwrites it anyway
            art = create()
            self.commit(art)
        self.count(compiles=1, compile_seconds=float(art.info.get("compile_seconds", 0.0)))
        return art, True

    # ---- maintenance -------------------------------------------------------
    def current_artifacts(self) -> list[Artifact]:
        """Every entry whose key this aotc computes for its variant, verified (what the runtime serves).
        Stale entries are skipped; invalid ones are quarantined when their lock is free."""
        out = []
        for key in self.keys():
            status, art = self.check(key)
            if status.state == "ok":
                out.append(art)
            elif status.state == "invalid":
                self.quarantine(key, status.reason, wait=False)
        return out

    def keys(self) -> list[str]:
        if not self.entries_dir.exists():
            return []
        return sorted(p.name for sub in self.entries_dir.iterdir() if sub.is_dir()
                      for p in sub.iterdir() if p.is_dir() and _KEY.fullmatch(p.name) and sub.name == p.name[:2])

    def size_bytes(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(dirpath, f))
                except OSError:
                    pass
        return total

    def verify(self, repair: bool = True) -> list[EntryStatus]:
        """Check every entry; bad and partial ones are quarantined when repair is set.

        With repair, a key whose lock cannot be had within the lock timeout raises LockTimeoutError
        (naming the lock) rather than leaving the entry in place while reporting it quarantined. An entry
        that turns out fine under its lock was another process's write in progress, not a problem."""
        problems = []
        for key in self.keys():
            status, _ = self.check(key)
            if status.state in ("ok", "stale"):  # a stale entry is valid for the aotc that made it
                continue
            if repair and not self.quarantine(key, status.reason or status.state, strict=True):
                if self.check(key)[0].state in ("ok", "stale", "missing"):
                    continue
            problems.append(status)
        return problems

    def remove(self, key: str) -> bool:
        """Delete one entry under its lock: renamed away first so readers never see half of it."""
        with self.locked(key):
            d = self.entry_dir(key)
            if not d.exists():
                return False
            trash = self.root / "trash" / f"{key}.{uuid.uuid4().hex[:8]}"
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.replace(d, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def gc(self, max_bytes: int) -> list[str]:
        """Evict least-recently-used entries until the entries take at most max_bytes."""
        entries = []
        for key in self.keys():
            d = self.entry_dir(key)
            try:
                used = (d / "meta.json").stat().st_mtime
                size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            except OSError:  # removed by another process meanwhile
                continue
            entries.append((used, key, size))
        total = sum(e[2] for e in entries)
        evicted = []
        for used, key, size in sorted(entries):
            if total <= max_bytes:
                break
            if self.remove(key):
                total -= size
                evicted.append(key)
        shutil.rmtree(self.root / "trash", ignore_errors=True)
        return evicted

    def clear(self) -> int:
        n = 0
        for key in self.keys():
            n += self.remove(key)
        for sub in ("quarantine", "trash"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        (self.root / "stats.json").unlink(missing_ok=True)
        return n


def _count(value) -> float:
    """A counter's value as stats.json holds it: a finite number >= 0, else 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return value if 0 <= value < 2 ** 63 else 0
