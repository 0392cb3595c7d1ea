"""Build variants into the cache on any concurrent.futures executor; one failing variant never stops the others.

The loop submits one :func:`aotc.build.executors.compile_task` per variant the
cache lacks and collects the results as they finish. It does not care which
executor runs them: this machine's compile processes (the default, ``-j N``)
or a Dask client's executor. A task that fails (a compile error, a lock
timeout, a crashed or lost worker) is that variant's result.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..common.artifact import Artifact
from ..common.errors import CacheError, MissingArtifactsError
from ..common.variant import Variant
from ..storage.cache import Cache
from . import executors
from .compile import cache_key
from .pool import ProcessPool, WorkerDiedError

REPORT_SCHEMA_VERSION = 1
STATUSES = ("hit", "compiled", "bypassed", "failed")


@dataclass
class VariantResult:
    variant: Variant
    key: str | None
    status: str  # "hit", "compiled", "bypassed" (compiled, not cacheable), "failed"
    seconds: float = 0.0
    error: str = ""

    def to_json(self) -> dict:
        return {"name": self.variant.name, "key": self.key, "status": self.status,
                "compile_seconds": round(self.seconds, 3), "error": self.error}


@dataclass
class BuildReport:
    results: list[VariantResult]
    elapsed: float
    artifacts: list[Artifact] = field(default_factory=list)

    def by_status(self, status: str) -> list[VariantResult]:
        return [r for r in self.results if r.status == status]

    @property
    def failed(self) -> list[VariantResult]:
        return self.by_status("failed")

    def to_json(self) -> dict:
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "elapsed_seconds": round(self.elapsed, 3),
            "counts": {s: len(self.by_status(s)) for s in STATUSES},
            "variants": [r.to_json() for r in self.results],
        }


def build(variants: Iterable[Variant], *, cache: Cache | None = None, jobs: int = 1, offline: bool = False,
          build_command: str = "aotc build SPEC",
          progress: Callable[[VariantResult], None] | None = None,
          executor: cf.Executor | None = None, shared_cache: bool = True) -> BuildReport:
    """Make every variant present in the cache and return a report (one result per variant, in order).

    Compiles run on `executor` (any concurrent.futures.Executor, e.g. a Dask client's
    ``get_executor()``), or, when None, in a :class:`~aotc.build.pool.ProcessPool` of `jobs`
    spawned processes started for this call. With shared_cache the tasks fill this cache's root and
    lock directory; without it they fill their workers' own caches and the artifacts come back and
    are committed here after their sha256 is checked. Offline: a miss raises MissingArtifactsError
    naming every missing variant. Before anything compiles, a cache or lock directory that cannot be
    written raises CacheError. A variant's failure is its result, never the build's end.
    """
    t0 = time.perf_counter()
    cache = cache or Cache()
    variants = list(dict.fromkeys(variants))
    results: dict[Variant, VariantResult] = {}
    artifacts: dict[Variant, Artifact] = {}

    def finish(result: VariantResult) -> None:
        results[result.variant] = result
        if progress:
            progress(result)

    todo: list[tuple[Variant, str | None]] = []  # key None: uncacheable, compiled but never persisted
    for v in variants:
        key = cache_key(v)
        art = cache.load(key, v) if key is not None else None
        if art is not None:
            artifacts[v] = art
            finish(VariantResult(v, key, "hit"))
        else:
            todo.append((v, key))
    if offline and todo:
        raise MissingArtifactsError([v.name for v, _ in todo], build_command)
    if todo and shared_cache and any(key is not None for _, key in todo):
        require_writable_dir(cache.root, "the cache", "AOTC_CACHE_DIR")
        require_writable_dir(cache.lock_dir, "the cache's lock directory", "AOTC_LOCK_DIR")
    if todo and executor is None:
        with ProcessPool(min(jobs, len(todo))) as pool:
            _run(todo, pool, cache, True, finish, artifacts)
    elif todo:
        _run(todo, executor, cache, shared_cache, finish, artifacts)
    for v, key in todo:  # what the workers committed must verify here before it is reported built
        if key is not None and results[v].status in ("compiled", "hit"):
            art = cache.load(key, v, count=False)
            if art is None:
                results[v] = VariantResult(v, key, "failed", 0.0, "entry vanished or failed verification after commit")
            else:
                artifacts[v] = art
    ordered = [results[v] for v in variants]
    return BuildReport(ordered, time.perf_counter() - t0, [artifacts[v] for v in variants if v in artifacts])


def _run(todo: list[tuple[Variant, str | None]], executor: cf.Executor, cache: Cache, shared_cache: bool,
         finish: Callable[[VariantResult], None], artifacts: dict[Variant, Artifact]) -> None:
    """The build loop: one compile task per variant on `executor`, each result handled as it finishes."""
    where = (str(cache.root), str(cache.lock_dir), cache.lock_timeout) if shared_cache else (None, None, None)
    futures = {executor.submit(executors.compile_task, v.to_json(), key, *where): (v, key) for v, key in todo}
    for fut in cf.as_completed(futures):
        v, key = futures[fut]
        try:
            out = fut.result()
        except WorkerDiedError as e:
            finish(VariantResult(v, key, "failed", 0.0, str(e)))
            continue
        except Exception as e:  # the task raised, or the executor lost it (a Dask worker gone)
            finish(VariantResult(v, key, "failed", 0.0, f"executor task failed: {type(e).__name__}: {e}"))
            continue
        status, seconds, error = out["status"], float(out["seconds"]), out["error"]
        if status != "failed" and (key is None or not shared_cache):
            try:
                art = _returned_artifact(out, v, key)
                if key is None:
                    cache.count(bypassed=1)
                    artifacts[v] = art
                elif cache.load(key, v, count=False) is None:
                    cache.fill(key, v, lambda art=art: art)
            except Exception as e:  # what came back is wrong, or committing it here failed
                status, seconds, error = "failed", 0.0, f"executor task failed: {type(e).__name__}: {e}"
        finish(VariantResult(v, key, status, seconds, error))


def _returned_artifact(out: dict, variant: Variant, key: str | None) -> Artifact:
    art = Artifact.from_header(out["header"], out["cubin"])  # checks size and sha256
    if art.variant != variant or (key is not None and art.key != key):
        raise ValueError(f"worker sent {art.variant.name} under key {art.key[:12]} for {variant.name}")
    return art


def require_writable_dir(path: Path, what: str, setting: str = "") -> None:
    """Raise CacheError unless `path` is a directory this process can write into (created if missing)."""
    problem = writable_dir_problem(path, create=True)
    if problem:
        raise CacheError(f"{what} ({path}) is not writable: {problem}",
                         hint=f"fix its permissions or point {setting} at a writable directory" if setting else None)


def writable_dir_problem(path: Path, *, create: bool = False) -> str | None:
    """Why nothing can be written into directory `path` (None when something can).

    An existing directory is probed with a temporary file, the one test that is right for root, ACLs
    and read-only mounts alike. A missing one is created when `create`; otherwise its nearest
    existing ancestor must be a writable directory on a writable file system."""
    path = Path(path)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"cannot create it: {e.strerror or e}"
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "no existing parent directory"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if probe != path:
        if os.statvfs(probe).f_flag & os.ST_RDONLY:
            return f"{probe} is on a read-only file system"
        if not os.access(probe, os.W_OK | os.X_OK):
            return f"cannot create directories in {probe}"
        return None
    try:
        with tempfile.TemporaryFile(dir=path, prefix=".aotc-write-probe-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None
