"""Where `aotc build` runs its compiles: this machine's compile processes, or a Dask distributed cluster.

Every compile, on either, is one :func:`compile_task`: check -> lock -> recheck
-> compile -> commit, returning a picklable result, so N workers asking for
one variant compile it once and a failing variant fails alone. :func:`start`
gives the executor the build loop submits to (aotc.build.builder): a
:class:`~aotc.build.pool.ProcessPool` for ``--executor process -j N`` (``-j 1``
too: no compile runs in the ``aotc build`` process itself), or a Dask client's
``concurrent.futures`` view.

``aotc build --executor dask --scheduler local`` starts a ``LocalCluster``
(worker processes on this machine, one thread each); ``--scheduler
tcp://host:8786`` (or ``DASK_SCHEDULER_ADDRESS``) uses a cluster that is
already running. With a local cluster the workers use this process's cache
root and lock directory, so every compile lands directly in the cache ``aotc
build`` reports on; with a remote one each worker fills its *own* cache (its
``AOTC_CACHE_DIR``, e.g. a shared file system, and its ``AOTC_LOCK_DIR``) and
sends the artifact back; the client checks its sha256 and commits it to the
local cache, so the build's bundle never depends on a shared file system. A
worker whose aotc, DSL or kernel sources differ from the client's computes
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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..common import config
from ..common.errors import AotcError, UsageError
from ..common.variant import Variant
from ..common.versions import producer_versions
from ..storage.cache import Cache
from .compile import cache_key, compile_variant
from .pool import ProcessPool

KINDS = ("process", "dask")

# The CuTe DSL keeps per-process compile state that two threads must not share (measured: two
# concurrent compiles in one process fail). A worker with several threads compiles one at a time;
# parallelism comes from worker processes (`dask worker --nworkers N --nthreads 1`).
_compile_lock = threading.Lock()


class ExecutorError(UsageError):
    """The executor cannot be started (dask missing, a bad or unreachable scheduler): a usage problem, exit 2."""


# ---- the compile task ---------------------------------------------------------------------------
def compile_task(variant_json: dict, key: str | None, root: str | None, lock_dir: str | None,
                 lock_timeout: float | None) -> dict:
    """One variant's compile, wherever it runs: check -> lock -> recheck -> compile -> commit.

    root (a cache's ``v1`` directory) / lock_dir None: this process's own cache configuration
    (AOTC_CACHE_DIR, AOTC_LOCK_DIR). key None: the variant cannot be keyed (unknown DSL versions),
    so it is compiled and sent back, never persisted (status "bypassed").
    Returns {"status", "seconds", "error", "host", "header", "cubin"}; status is "compiled", "hit",
    "bypassed" or "failed", header/cubin are the artifact on success. Never raises for a variant's
    failure: that is the variant's result.
    """
    config.disable_dsl_cache()
    host = socket.gethostname()
    out = {"status": "failed", "seconds": 0.0, "error": "", "host": host, "header": None, "cubin": None}
    try:
        variant = Variant.from_json(variant_json)
        if key is None:
            with _compile_lock:
                art = compile_variant(variant)
            status = "bypassed"
        else:
            here = cache_key(variant)
            if here != key:
                out["error"] = (f"worker {host} computes cache key {str(here)[:12]} for {variant.name}, the client "
                                f"{key[:12]}: the worker's aotc, DSL ({_fmt(producer_versions())}) or kernel "
                                f"sources differ from the client's")
                return out
            cache = Cache(None if root is None else Path(root).parent, lock_dir=lock_dir, lock_timeout=lock_timeout)
            with _compile_lock:
                art, created = cache.load(key, variant, count=False), False  # check (the caller counted it)
                if art is None:
                    art, created = cache.fill(key, variant, lambda: compile_variant(variant, key))
            status = "compiled" if created else "hit"
        out.update(status=status, seconds=float(art.info.get("compile_seconds", 0.0)) if status != "hit" else 0.0,
                   header=art.header(), cubin=art.cubin)
    except AotcError as e:
        out["error"] = str(e)
    except Exception as e:  # a DSL crash in one variant is that variant's failure
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def _fmt(v: dict) -> str:
    return ", ".join(f"{k} {v[k]}" for k in sorted(v))


# ---- choosing the executor ----------------------------------------------------------------------
@dataclass
class Workers:
    """A started executor: where build() submits its compile tasks."""

    executor: cf.Executor
    shared_cache: bool  # the workers fill this machine's cache (else their own; artifacts come back)
    description: str


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
        self.client = None
        try:
            if self.local:
                self.cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                            dashboard_address=":0")
                self.client = Client(self.cluster)
            else:
                self.client = Client(scheduler, timeout="30s")
        except (OSError, TimeoutError, ValueError, TypeError) as e:  # ValueError: not an address
            self.close()
            raise ExecutorError(f"--scheduler {scheduler!r}: cannot reach a Dask scheduler there: {e}",
                                hint="give a running scheduler's address (tcp://host:8786; dask scheduler; "
                                     "dask worker ADDRESS) or use --scheduler local") from None
        self.scheduler = scheduler
        self.executor: cf.Executor = self.client.get_executor(pure=False)

    def describe(self) -> str:
        n = len(self.client.scheduler_info().get("workers", {}))
        return f"dask {'LocalCluster' if self.local else self.scheduler} ({n} workers)"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.client is not None:
                self.client.close()
        with contextlib.suppress(Exception):
            if self.cluster is not None:
                self.cluster.close()


@contextlib.contextmanager
def start(kind: str, *, jobs: int = 1, scheduler: str | None = None) -> Iterator[Workers]:
    """`process`: a ProcessPool of `jobs` compile processes; `dask`: a started Dask client. Closed after."""
    if kind == "process":
        if scheduler:
            raise ExecutorError("--scheduler applies only to --executor dask")
        with ProcessPool(jobs) as pool:
            yield Workers(pool, True, f"{jobs} local compile process{'es' if jobs > 1 else ''}")
        return
    if kind != "dask":
        raise ExecutorError(f"unknown executor {kind!r}: expected one of {list(KINDS)}")
    ex = DaskExecutor(scheduler, jobs)
    try:
        yield Workers(ex.executor, ex.local, ex.describe())
    finally:
        ex.close()
