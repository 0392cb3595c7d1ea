"""Every environment variable aotc reads, declared once with its type and default."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .errors import ConfigError

# the longest AOTC_LOCK_TIMEOUT accepted: a day is longer than any compile; "wait forever" is not offered,
# since a hung holder would hang every build behind it
MAX_LOCK_TIMEOUT = 24 * 3600.0


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """AOTC_CACHE_DIR, else platformdirs' user cache dir for "aotc" (imported lazily: the runtime image may lack it)."""
    env = os.environ.get("AOTC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:  # deployment images may not carry platformdirs
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "aotc"
    return Path(platformdirs.user_cache_dir("aotc", appauthor=False))


def lock_dir() -> Path | None:
    """AOTC_LOCK_DIR: where per-key lock files live (node-local; default: inside the cache)."""
    env = os.environ.get("AOTC_LOCK_DIR")
    return Path(env).expanduser() if env else None


def lock_timeout() -> float:
    """AOTC_LOCK_TIMEOUT seconds to wait for another process's compile of the same key (default 600;
    unset or empty: the default; 0: try once; at most MAX_LOCK_TIMEOUT)."""
    text = os.environ.get("AOTC_LOCK_TIMEOUT", "").strip()
    if not text:
        return 600.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    return check_lock_timeout(value, f"AOTC_LOCK_TIMEOUT={text!r}")


def check_lock_timeout(value: float, what: str = "lock timeout") -> float:
    """A finite number of seconds in [0, MAX_LOCK_TIMEOUT]; anything else (negative, inf, nan) is a
    ConfigError: filelock reads a negative timeout as "wait forever"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_LOCK_TIMEOUT:
        raise ConfigError(f"{what}: expected seconds between 0 and {MAX_LOCK_TIMEOUT:g}",
                          hint="e.g. AOTC_LOCK_TIMEOUT=600 (0 tries the lock once)")
    return float(value)


def no_compile() -> bool:
    """AOTC_NO_COMPILE=1: a cache miss is an error naming the missing variants, never a compile."""
    return _flag("AOTC_NO_COMPILE")


def bundle_path() -> list[Path]:
    """AOTC_BUNDLE_PATH: os.pathsep-separated bundle files or directories the runtime loads by default."""
    env = os.environ.get("AOTC_BUNDLE_PATH", "")
    return [Path(p).expanduser() for p in env.split(os.pathsep) if p]


def libcuda() -> str | None:
    """AOTC_LIBCUDA: the CUDA driver library the runtime loads (a path or a soname; default libcuda.so.1,
    nvcuda.dll on Windows)."""
    return os.environ.get("AOTC_LIBCUDA") or None


def max_member_bytes() -> int:
    """AOTC_BUNDLE_MAX_MEMBER_BYTES: largest cubin a bundle (or a cache entry) may hold (default 256 MiB)."""
    return _byte_count("AOTC_BUNDLE_MAX_MEMBER_BYTES", 256 << 20)


def dask_scheduler() -> str | None:
    """DASK_SCHEDULER_ADDRESS: the Dask scheduler `aotc build --executor dask` uses without --scheduler."""
    return os.environ.get("DASK_SCHEDULER_ADDRESS") or None


def disable_dsl_cache() -> None:
    """CUTE_DSL_NO_CACHE=1 (unless the user set it): aotc's cache sits above the DSL's own; keep one copy."""
    os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")


TEST_KILL_POINT_ENV = "AOTC_TEST_KILL_POINT"


def test_kill_point() -> str:
    """AOTC_TEST_KILL_POINT=<point>[:<n>]: tests only (aotc.storage.atomic.test_kill_point)."""
    return os.environ.get(TEST_KILL_POINT_ENV, "")


TEST_WORKER_SETUP_ENV = "AOTC_TEST_WORKER_SETUP"


def test_worker_setup() -> str:
    """AOTC_TEST_WORKER_SETUP=<file.py>: tests only; every compile process runs the file once when it starts
    (aotc.build.executors), so a test can patch the compile inside the spawned process."""
    return os.environ.get(TEST_WORKER_SETUP_ENV, "")


def max_bundle_bytes() -> int:
    """AOTC_BUNDLE_MAX_BYTES: largest total uncompressed size of a bundle (default 4 GiB)."""
    return _byte_count("AOTC_BUNDLE_MAX_BYTES", 4 << 30)


_SIZE = re.compile(r"(\d+)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _byte_count(name: str, default: int) -> int:
    """A byte count: digits with an optional binary unit (4096, 64k, 10M, 4G, 4GiB); unset or empty: default."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    m = _SIZE.fullmatch(text)
    if not m:
        raise ConfigError(f"{name}={text!r}: expected a byte count such as 268435456, 256M or 4G",
                          hint=f"unset {name} for the default ({default} bytes)")
    return int(m.group(1)) * _UNIT[m.group(2).lower()]
