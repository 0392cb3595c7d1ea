"""Every environment variable aotc reads, declared once with its type and default."""
from __future__ import annotations

import os
from pathlib import Path


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
    """AOTC_LOCK_TIMEOUT seconds to wait for another process's compile of the same key (default 600)."""
    return float(os.environ.get("AOTC_LOCK_TIMEOUT", "600"))


def no_compile() -> bool:
    """AOTC_NO_COMPILE=1: a cache miss is an error naming the missing variants, never a compile."""
    return _flag("AOTC_NO_COMPILE")


def bundle_path() -> list[Path]:
    """AOTC_BUNDLE_PATH: os.pathsep-separated bundle files or directories the runtime loads by default."""
    env = os.environ.get("AOTC_BUNDLE_PATH", "")
    return [Path(p).expanduser() for p in env.split(os.pathsep) if p]


def max_member_bytes() -> int:
    """AOTC_BUNDLE_MAX_MEMBER_BYTES: largest cubin a bundle may hold (default 256 MiB)."""
    return int(os.environ.get("AOTC_BUNDLE_MAX_MEMBER_BYTES", str(256 << 20)))


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
    return int(os.environ.get("AOTC_BUNDLE_MAX_BYTES", str(4 << 30)))
