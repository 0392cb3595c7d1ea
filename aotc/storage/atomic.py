"""Crash-safe file writes: a temporary name in the same directory, fsync, then os.replace.

Readers of the cache and of bundles need no lock because every file they read appears whole or
not at all. Standard library only (the runtime writes nothing, but reads what this wrote).
"""
from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from ..common import config

# ---- test-only fault injection ---------------------------------------------------------------
# AOTC_TEST_KILL_POINT=<point>[:<n>] (aotc.common.config.test_kill_point) makes the process SIGKILL itself
# the n-th time (default: the first) a commit reaches <point>, so tests/test_hostile_kill.py can land kills
# inside the few milliseconds of a commit. Points, in the cache's commit order: before_cubin (entry
# uncommitted, nothing written), after_cubin_tmp (cubin under its temporary name), after_cubin (cubin in
# place, no meta.json), after_meta_tmp (meta.json under its temporary name), after_meta (committed, lock
# still held). Never set it outside tests; unset, it costs one environment lookup per commit.
_test_kill_hits: dict[str, int] = {}


def test_kill_point(point: str) -> None:
    spec = config.test_kill_point()
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _test_kill_hits[point] = _test_kill_hits.get(point, 0) + 1
    if _test_kill_hits[point] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def atomic_write(path: Path, data: bytes, *, _test_point: str = "") -> None:
    """Write to a temporary name in the same directory, fsync, then os.replace."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if _test_point:
            test_kill_point(_test_point)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
