"""Where `aotc build` runs its compiles: a local process pool, or a Dask distributed cluster.

``aotc build --executor dask --scheduler local`` starts a ``LocalCluster``
(worker processes on this machine, one thread each); ``--scheduler
tcp://host:8786`` (or ``DASK_SCHEDULER_ADDRESS``) uses a cluster that is
already running. Every compile is one task running :func:`compile_task`: the
same check -> lock -> recheck -> compile -> commit as the process pool, so N
workers asking for one variant compile it once and a failing variant fails
alone.

Where results land:

* local cluster: the workers use this process's cache root and lock directory,
  so every compile lands directly in the cache ``aotc build`` reports on;
* remote cluster: each worker fills its *own* cache (its ``AOTC_CACHE_DIR``,
  e.g. a shared file system, and its ``AOTC_LOCK_DIR``) and sends the
  artifact back; the client checks its sha256 and commits it to the local
  cache, so the build's bundle never depends on a shared file system.

A worker whose aotc, DSL or kernel sources differ from the client's computes
other cache keys; its tasks fail with a message naming both sides' versions
rather than put a kernel under the wrong key.

Why Dask rather than Ray: ``dask`` and ``distributed`` are pure-Python wheels
(seconds to install, no native daemon); ``LocalCluster`` runs in-process, so
CI tests the real scheduler with no service to start; and ``Client.get_executor()``
is a ``concurrent.futures.Executor``, so the build loop is the one the process
pool uses. Ray needs its native runtime (a GCS and raylets) even for a local
cluster, a large platform wheel, and seconds of start-up on a 2-core runner.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import socket
import threading
from typing import Iterator

from ..common import config
from ..common.errors import AotcError

KINDS = ("process", "dask")

# The CuTe DSL keeps per-process compile state that two threads must not share (measured: two
# concurrent compiles in one process fail). A worker with several threads compiles one at a time;
# parallelism comes from worker processes (`dask worker --nworkers N --nthreads 1`).
_compile_lock = threading.Lock()


class ExecutorError(AotcError):
    """The executor cannot be started (dask missing, scheduler unreachable): a usage problem, exit 2."""

    exit_code = 2


def compile_task(variant_json: dict, key: str, root: str | None, lock_dir: str | None, lock_timeout: float | None) -> dict:
    """One variant's compile on a worker: locked cache fill, then the artifact sent back.

    root/lock_dir None: the worker's own cache configuration (AOTC_CACHE_DIR, AOTC_LOCK_DIR).
    Returns {"status", "seconds", "error", "host", "header", "cubin"}; header/cubin only on success.
    Never raises for a variant's failure: that is the variant's result.
    """
    from pathlib import Path

    from .builder import _compile_into_cache
    from ..storage.cache import Cache
    from .compile import cache_key
    from ..common.variant import Variant
    from ..common.versions import producer_versions

    config.disable_dsl_cache()
    host = socket.gethostname()
    out = {"status": "failed", "seconds": 0.0, "error": "", "host": host, "header": None, "cubin": None}
    try:
        variant = Variant.from_json(variant_json)
        here = cache_key(variant)
        if here != key:
            out["error"] = (f"worker {host} computes cache key {str(here)[:12]} for {variant.name}, the client "
                            f"{key[:12]}: the worker's aotc, DSL ({_fmt(producer_versions())}) or kernel sources "
                            f"differ from the client's")
            return out
        cache = Cache(None if root is None else Path(root).parent, lock_dir=lock_dir, lock_timeout=lock_timeout)
        with _compile_lock:
            status, seconds, error = _compile_into_cache(variant_json, key, str(cache.root), str(cache.lock_dir),
                                                         cache.lock_timeout)
        out.update(status=status, seconds=seconds, error=error)
        if status == "failed":
            return out
        art = cache.load(key, variant, count=False)
        if art is None:
            out.update(status="failed", error=f"entry vanished or failed verification on worker {host} after commit")
            return out
        out["header"], out["cubin"] = art.header(), art.cubin
    except Exception as e:  # whatever happens on the worker is this variant's failure
        out.update(status="failed", error=f"on worker {host}: {type(e).__name__}: {e}")
    return out


def _fmt(v: dict) -> str:
    return ", ".join(f"{k} {v[k]}" for k in sorted(v))


class DaskExecutor:
    """A started Dask client (and LocalCluster when local) with a concurrent.futures view."""

    def __init__(self, scheduler: str | None, jobs: int):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ExecutorError("--executor dask needs Dask distributed",
                                hint="pip install 'aotc[dask]'  (dask[distributed])") from None
        scheduler = scheduler or config.dask_scheduler() or "local"
        self.local = scheduler == "local"
        self.cluster = None
        try:
            if self.local:
                self.cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                            dashboard_address=":0")
                self.client = Client(self.cluster)
            else:
                self.client = Client(scheduler, timeout="30s")
        except (OSError, TimeoutError) as e:
            self.close()
            raise ExecutorError(f"cannot reach the Dask scheduler {scheduler!r}: {e}",
                                hint="start one (dask scheduler; dask worker ADDRESS) or use --scheduler local") from None
        self.scheduler = scheduler
        self.executor: cf.Executor = self.client.get_executor(pure=False)

    def describe(self) -> str:
        n = len(self.client.scheduler_info().get("workers", {}))
        return f"dask {'LocalCluster' if self.local else self.scheduler} ({n} workers)"

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), self.cluster
        with contextlib.suppress(Exception):
            if client is not None:
                client.close()
        with contextlib.suppress(Exception):
            if cluster is not None:
                cluster.close()


@contextlib.contextmanager
def executor(kind: str, *, jobs: int = 1, scheduler: str | None = None) -> Iterator[DaskExecutor | None]:
    """`process` -> None (build() uses its own process pool); `dask` -> a started DaskExecutor, closed after."""
    if kind == "process":
        if scheduler:
            raise ExecutorError("--scheduler applies only to --executor dask")
        yield None
        return
    if kind != "dask":
        raise ExecutorError(f"unknown executor {kind!r}: expected one of {list(KINDS)}")
    ex = DaskExecutor(scheduler, jobs)
    try:
        yield ex
    finally:
        ex.close()
