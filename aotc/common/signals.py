"""A signal that unwinds the main thread by raising an exception, even where Python would drop that exception.

Python runs a signal handler between two bytecodes of the main thread, wherever they are. An exception the
handler raises inside a weakref callback, a ``__del__`` or a GC callback is printed as "Exception ignored
in ..." and dropped, and the process goes on as if it had never been signalled (a compile process's
SIGTERM was lost that way, in WeakValueDictionary's removal callback). So while :func:`raise_on_signal`
holds, a dropped exception of its type is raised again from a SIGALRM a moment later, and again each time
it is dropped, until it lands where it unwinds.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

# How long after being dropped the exception is raised again: long enough for the swallowing callback to
# have returned, short against any grace a supervisor gives.
REDELIVER_AFTER_S = 0.01


@contextlib.contextmanager
def raise_on_signal(signum: int, exc_type: type[BaseException], *, once: bool = False):
    """While held (main thread only): signal `signum` raises exc_type(signum) in the main thread.

    once: the first signal also sets `signum` to SIG_IGN, so further ones cannot interrupt the cleanup it
    starts. Outside the main thread (where Python cannot install handlers) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(sig, frame):
        if once:
            signal.signal(signum, signal.SIG_IGN)
        raise exc_type(sig)

    def redeliver(sig, frame):
        raise exc_type(signum)

    previous_hook = sys.unraisablehook

    def hook(unraisable):
        if isinstance(unraisable.exc_value, exc_type):
            signal.setitimer(signal.ITIMER_REAL, REDELIVER_AFTER_S)  # SIGALRM: `redeliver`
        else:
            previous_hook(unraisable)

    previous_handler = signal.signal(signum, handler)
    previous_alarm = signal.signal(signal.SIGALRM, redeliver)
    sys.unraisablehook = hook
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signum, previous_handler)
