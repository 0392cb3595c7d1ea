"""Build variants into the cache, in a process pool or on a distributed executor; one failing variant never stops the others."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..common.artifact import Artifact
from ..storage.cache import Cache
from .compile import cache_key, compile_variant
from ..common.errors import AotcError, MissingArtifactsError
from ..common.variant import Variant


@dataclass
class VariantResult:
    variant: Variant
    key: str | None
    status: str  # "hit", "compiled", "bypassed" (compiled, not cacheable), "failed"
    seconds: float = 0.0
    error: str = ""


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
            "elapsed_seconds": round(self.elapsed, 3),
            "counts": {s: len(self.by_status(s)) for s in ("hit", "compiled", "bypassed", "failed")},
            "variants": [{"name": r.variant.name, "key": r.key, "status": r.status,
                          "compile_seconds": round(r.seconds, 3), "error": r.error} for r in self.results],
        }


def _compile_into_cache(variant_json: dict, key: str, root: str, lock_dir: str, lock_timeout: float):
    """Pool worker: lock, recheck, compile, commit. Returns (status, seconds, error)."""
    variant = Variant.from_json(variant_json)
    cache = Cache(Path(root).parent, lock_dir=lock_dir, lock_timeout=lock_timeout)
    try:
        art, created = cache.fill(key, variant, lambda: compile_variant(variant, key))
    except AotcError as e:
        return "failed", 0.0, str(e)
    except Exception as e:  # a DSL crash in one variant is that variant's failure
        return "failed", 0.0, f"{type(e).__name__}: {e}"
    return ("compiled" if created else "hit"), float(art.info.get("compile_seconds", 0.0)) if created else 0.0, ""


def build(variants: Iterable[Variant], *, cache: Cache | None = None, jobs: int = 1, offline: bool = False,
          build_command: str = "aotc build SPEC",
          progress: Callable[[VariantResult], None] | None = None,
          executor: cf.Executor | None = None, shared_cache: bool = True) -> BuildReport:
    """Make every variant present in the cache and return a report (one result per variant, in order).

    jobs > 1 compiles in a pool of spawned processes. `executor` (any
    concurrent.futures.Executor, e.g. a Dask client's ``get_executor()``) runs
    each compile as :func:`aotc.executors.compile_task` instead: with
    shared_cache the workers fill this cache's root and lock directory; without
    it they fill their own caches and the artifacts come back and are committed
    here after their sha256 is checked. Offline: a miss raises
    MissingArtifactsError naming every missing variant. A variant's failure
    (compile error, crash, lost worker) is its result, never the build's end.
    """
    t0 = time.perf_counter()
    cache = cache or Cache()
    variants = list(dict.fromkeys(variants))
    results: dict[Variant, VariantResult] = {}
    artifacts: dict[Variant, Artifact] = {}
    todo: list[tuple[Variant, str]] = []
    uncacheable: list[Variant] = []
    for v in variants:
        key = cache_key(v)
        if key is None:
            uncacheable.append(v)
            continue
        art = cache.load(key, v)
        if art is not None:
            results[v] = VariantResult(v, key, "hit")
            artifacts[v] = art
            if progress:
                progress(results[v])
        else:
            todo.append((v, key))
    if offline and (todo or uncacheable):
        raise MissingArtifactsError([v.name for v, _ in todo] + [v.name for v in uncacheable], build_command)

    def finish(v: Variant, key: str | None, status: str, seconds: float, error: str) -> None:
        results[v] = VariantResult(v, key, status, seconds, error)
        if progress:
            progress(results[v])

    if todo and executor is not None:
        from .executors import compile_task

        root, lock_dir = (str(cache.root), str(cache.lock_dir)) if shared_cache else (None, None)
        futures = {executor.submit(compile_task, v.to_json(), key, root, lock_dir,
                                   cache.lock_timeout if shared_cache else None): (v, key) for v, key in todo}
        for fut in cf.as_completed(futures):
            v, key = futures[fut]
            try:
                out = fut.result()
                status, seconds, error = out["status"], float(out["seconds"]), out["error"]
                if status != "failed" and cache.load(key, v, count=False) is None:
                    art = Artifact.from_header(out["header"], out["cubin"])  # checks size and sha256
                    if art.key != key or art.variant != v:
                        raise ValueError(f"worker sent {art.variant.name} under key {art.key[:12]}")
                    cache.fill(key, v, lambda art=art: art)
            except Exception as e:  # the task raised, the worker was lost, or what came back is wrong
                status, seconds, error = "failed", 0.0, f"executor task failed: {type(e).__name__}: {e}"
            finish(v, key, status, seconds, error)
    elif todo and jobs > 1:
        ctx = multiprocessing.get_context("spawn")  # the DSL's native state does not survive fork well
        with cf.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx) as pool:
            futures = {pool.submit(_compile_into_cache, v.to_json(), key, str(cache.root), str(cache.lock_dir),
                                   cache.lock_timeout): (v, key) for v, key in todo}
            for fut in cf.as_completed(futures):
                v, key = futures[fut]
                try:
                    status, seconds, error = fut.result()
                except Exception as e:  # the worker process died (e.g. a crash inside the DSL)
                    status, seconds, error = "failed", 0.0, f"worker process failed: {type(e).__name__}: {e}"
                finish(v, key, status, seconds, error)
    else:
        for v, key in todo:
            finish(v, key, *_compile_into_cache(v.to_json(), key, str(cache.root), str(cache.lock_dir),
                                                cache.lock_timeout))
    for v in uncacheable:  # nothing to key it by: compile, use, never persist
        try:
            art = compile_variant(v)
            artifacts[v] = art
            cache.count(bypassed=1)
            finish(v, None, "bypassed", float(art.info.get("compile_seconds", 0.0)), "")
        except AotcError as e:
            finish(v, None, "failed", 0.0, str(e))
    for v, key in todo:
        if results[v].status in ("compiled", "hit"):
            art = cache.load(key, v, count=False)
            if art is None:
                results[v] = VariantResult(v, key, "failed", 0.0, "entry vanished or failed verification after commit")
            else:
                artifacts[v] = art
    ordered = [results[v] for v in variants]
    return BuildReport(ordered, time.perf_counter() - t0, [artifacts[v] for v in variants if v in artifacts])
