"""aotc.common.signals: a signal that lands where Python drops exceptions (a weakref callback) still unwinds
the main thread, once it has left that place; other dropped exceptions are reported as before; the
handlers are restored afterwards. Each case runs in its own interpreter (it installs signal handlers)."""
from __future__ import annotations

import subprocess
import textwrap

from conftest import PYTHON, REPO

# The weakref callback sends the process SIGTERM: os.kill runs the Python handler at once, inside the
# callback, which is where Python prints "Exception ignored in ..." and drops what the handler raised.
PROLOGUE = """
    import os, signal, sys, time, weakref
    from aotc.common.signals import raise_on_signal

    class Stop(BaseException):
        pass

    class Thing:
        pass

    def signal_inside_a_weakref_callback():
        thing = Thing()
        ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGTERM))
        del thing  # the callback runs here
        return ref
    """


def run(body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(PROLOGUE) + textwrap.dedent(body)
    return subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_signal_dropped_in_a_weakref_callback_still_unwinds():
    r = run("""
        with raise_on_signal(signal.SIGTERM, Stop):
            try:
                signal_inside_a_weakref_callback()
                time.sleep(5)
                print("not unwound")
            except Stop as e:
                print("unwound by", e.args[0])
        """)
    assert r.stdout == "unwound by 15\n", r.stderr
    assert r.stderr == ""


def test_without_it_the_signal_is_lost():
    """The control: the plain handler's exception is dropped and the code runs on."""
    r = run("""
        def handler(sig, frame):
            raise Stop(sig)
        signal.signal(signal.SIGTERM, handler)
        try:
            signal_inside_a_weakref_callback()
            print("not unwound")
        except Stop:
            print("unwound")
        """)
    assert r.stdout == "not unwound\n"
    assert "Exception ignored" in r.stderr and "Stop: 15" in r.stderr


def test_once_ignores_the_signals_after_the_first():
    r = run("""
        with raise_on_signal(signal.SIGTERM, Stop, once=True):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                print("not unwound")
            except Stop:
                os.kill(os.getpid(), signal.SIGTERM)  # during the cleanup: ignored
                print("cleaned up")
        """)
    assert r.stdout == "cleaned up\n", r.stderr


def test_other_dropped_exceptions_are_still_reported_and_the_handlers_restored():
    r = run("""
        class Noisy:
            def __del__(self):
                raise ValueError("from __del__")
        hook, alarm = sys.unraisablehook, signal.getsignal(signal.SIGALRM)
        with raise_on_signal(signal.SIGTERM, Stop):
            Noisy()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGALRM) is alarm and sys.unraisablehook is hook
        print("restored")
        """)
    assert r.stdout == "restored\n", r.stderr
    assert "ValueError: from __del__" in r.stderr
