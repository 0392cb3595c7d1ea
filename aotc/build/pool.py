"""This machine's compile processes: a concurrent.futures.Executor in which a crash fails one task only.

The CuTe DSL can crash the process it runs in (a segfault), so no compile runs
in the ``aotc build`` process itself. A :class:`ProcessPool` spawns up to N
compile processes, each running one task at a time; a process that dies fails
only the task it was running (:class:`WorkerDiedError` names the signal or exit
code) and the next task of its slot starts a fresh process.

Stopping: SIGTERM to a compile process unwinds it (its temporary directories
are removed, its locks released) before it dies of the signal; Ctrl-C is
ignored there and left to the parent, which stops its compile processes that
way (:meth:`ProcessPool.terminate`, also what leaving a ``with`` block by an
exception does). A compile process whose parent is gone exits after its
current task.

Test-only hook: ``AOTC_TEST_WORKER_SETUP=<file.py>`` (aotc.common.config) makes
every compile process run that file once when it starts, so a test can patch
the compile inside the spawned process (make one variant raise, or SIGKILL
itself). Never set it outside tests.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import pickle
import queue
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

from ..common import config, signals
from ..common.errors import AotcError

# How long a compile process stopped with SIGTERM may take to unwind before it is SIGKILLed: a compile
# inside the DSL's native code notices the signal only when it returns to Python.
STOP_GRACE_S = 10.0


class WorkerDiedError(AotcError):
    """A compile process died while running a task (a crash inside the DSL, a kill): that task's failure."""

    exit_code = 3
    kind = "worker_died"


class _Stop(BaseException):
    """SIGTERM in a compile process; a BaseException, so no `except Exception` on the way swallows it."""


def _worker_main(read_fd: int, write_fd: int) -> None:
    """A compile process: run (fn, args, kwargs) messages one at a time until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    # once: a process-group SIGTERM and the parent's own terminate() both reach it; the second must not
    # interrupt the unwinding the first started
    with signals.raise_on_signal(signal.SIGTERM, _Stop, once=True):
        _serve(read_fd, write_fd)


def _serve(read_fd: int, write_fd: int) -> None:
    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    try:
        config.disable_dsl_cache()
        setup = config.test_worker_setup()
        if setup:
            runpy.run_path(setup, run_name="aotc_test_worker_setup")
        while True:
            try:
                message = inbox.recv()
            except (EOFError, OSError):  # the parent is gone
                return
            if message is None:
                return
            fn, args, kwargs = message
            try:
                reply = (True, fn(*args, **kwargs))
            except Exception as e:
                reply = (False, e)
            try:
                outbox.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError) as e:
                outbox.send((False, RuntimeError(f"the task's result cannot be sent back: {type(e).__name__}: {e}")))
            except OSError:
                return
    except _Stop:
        # unwound: temporary directories removed, locks released; now die of the signal, as asked
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def describe_exit(returncode: int | None) -> str:
    """'signal 9 (SIGKILL)' or 'exit code 3' for a process's return code (negative: the signal that ended it)."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"signal {-returncode} ({name})"
    return f"exit code {returncode}"


# A plain interpreter, not a multiprocessing child: nothing of the parent's __main__ is re-imported (a
# script that calls build() needs no `if __name__ == "__main__"` guard) and no resource tracker is left.
# It imports the aotc the parent runs (its package root first on sys.path).
_WORKER_CODE = ("import sys; sys.path.insert(0, sys.argv[1]); from aotc.build.pool import _worker_main; "
                "_worker_main(int(sys.argv[2]), int(sys.argv[3]))")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class _Worker:
    """One compile process and the two pipes to it (its stdout goes to our stderr: never into --json output)."""

    def __init__(self):
        # its temporary files (the DSL's dump directories) go into a directory of ours, removed when it
        # ends: a compile process that crashes or is killed mid-compile cannot remove its own
        self.tmpdir = tempfile.mkdtemp(prefix="aotc-worker-")
        task_r, task_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, _PACKAGE_ROOT, str(task_r), str(result_w)],
                pass_fds=(task_r, result_w), stdin=subprocess.DEVNULL, stdout=_stderr_fd(),
                env={**os.environ, "TMPDIR": self.tmpdir})
        except BaseException:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            raise
        finally:
            os.close(task_r)
            os.close(result_w)
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(result_r, writable=False)

    def run(self, fn, args, kwargs):
        """(ok, result or exception) of fn(*args, **kwargs) in the process; WorkerDiedError if it dies."""
        try:
            self.tasks.send((fn, args, kwargs))
            return self.results.recv()  # EOF: the process is gone (nobody else holds the pipe's write end)
        except (EOFError, OSError):  # BrokenPipeError: it was gone before the task was sent
            pass
        returncode = self.process.wait()
        self._release()
        raise WorkerDiedError(f"worker died: {describe_exit(returncode)} "
                              f"(compile process {self.process.pid}; a crash inside the DSL, or a kill)")

    def close(self, timeout: float = STOP_GRACE_S) -> None:
        with contextlib.suppress(OSError):
            self.tasks.send(None)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._release()

    def _release(self) -> None:
        """After the process has ended: close the pipes, remove its temporary directory."""
        for conn in (self.tasks, self.results):
            with contextlib.suppress(OSError):
                conn.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _stderr_fd() -> int:
    """This process's file descriptor 2 when it is open (the compile process's stdout goes there)."""
    try:
        os.fstat(2)
    except OSError:
        return subprocess.DEVNULL
    return 2


class ProcessPool(cf.Executor):
    """Up to `workers` spawned compile processes, each running one task at a time.

    Unlike ``concurrent.futures.ProcessPoolExecutor``, a process that dies fails only the task it was
    running (WorkerDiedError); the other tasks go on, and the next task of that slot starts a fresh
    process. Processes start on demand (none for a build that is all cache hits). Leaving a ``with``
    block by an exception (Ctrl-C, SIGTERM in the CLI) stops the processes at once (:meth:`terminate`).
    """

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: set[_Worker] = set()
        self._stopping = False
        self._closed = False
        self._slots = [threading.Thread(target=self._slot, name=f"aotc-compile-slot-{i}", daemon=True)
                       for i in range(workers)]
        for t in self._slots:
            t.start()

    def submit(self, fn, /, *args, **kwargs) -> cf.Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a ProcessPool after shutdown")
            fut: cf.Future = cf.Future()
            self._tasks.put((fut, fn, args, kwargs))
        return fut

    def _start_worker(self) -> _Worker:
        with self._lock:
            if self._stopping:
                raise cf.CancelledError()
            w = _Worker()  # a fresh interpreter: the DSL's native state does not survive fork
            self._workers.add(w)
            return w

    def _slot(self) -> None:
        worker: _Worker | None = None
        try:
            while True:
                item = self._tasks.get()
                if item is None:
                    return
                fut, fn, args, kwargs = item
                if not fut.set_running_or_notify_cancel():
                    continue
                try:
                    if worker is None:
                        worker = self._start_worker()
                    ok, value = worker.run(fn, args, kwargs)
                except WorkerDiedError as e:
                    self._forget(worker)
                    worker = None
                    fut.set_exception(e)
                    continue
                except BaseException as e:  # stopping, or the task could not be sent (not picklable)
                    fut.set_exception(e)
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        finally:
            if worker is not None:
                worker.close()
                self._forget(worker)

    def _forget(self, worker: _Worker | None) -> None:
        with self._lock:
            self._workers.discard(worker)

    def _close_queue(self) -> None:
        with self._lock:
            self._closed = True
        for _ in self._slots:
            self._tasks.put(None)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Finish the queued tasks (or cancel them), then let every process exit."""
        if cancel_futures:
            self._cancel_queued()
        self._close_queue()
        if wait:
            for t in self._slots:
                t.join()

    def terminate(self, grace: float = STOP_GRACE_S) -> None:
        """Stop now: cancel queued tasks and SIGTERM every compile process (each removes its temporary
        files and releases its locks as it unwinds); SIGKILL any still running after `grace` seconds."""
        with self._lock:
            self._stopping = True
            workers = list(self._workers)
        self._cancel_queued()
        self._close_queue()
        for w in workers:
            with contextlib.suppress(OSError):
                w.process.terminate()
        deadline = time.monotonic() + grace
        for w in workers:
            try:
                w.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
        for t in self._slots:
            t.join()

    def _cancel_queued(self) -> None:
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[0].cancel()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.shutdown(wait=True)
        else:
            self.terminate()
        return False
