"""What the CLI writes: standard output that fails with a clear error, and JSON documents.

Every ``--json`` document is one JSON object on stdout with ``"schema_version"``
(:data:`SCHEMA_VERSION`) and ``"command"`` (e.g. ``"bundle verify"``). A command
that fails still prints its document, with whatever it had found (a build's
finished variants, a verify's problems) and an ``"error"`` object:
``{"kind", "message", "hint", "exit_code"}``. A command declares its document
with :func:`json_document` as it starts; :func:`aotc.cli.main` prints the
error version whatever ends the command.
"""
from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

import click

from ..common.errors import OutputError

SCHEMA_VERSION = 1
# Most problems one command lists (a hostile bundle's manifest can describe millions); the rest are counted.
MAX_LISTED = 50


@dataclass
class _Invocation:
    """What the running command has said about its output."""

    json: bool = False
    command: str = ""
    partial: Callable[[], dict] = field(default=dict)  # the document so far, for the error path


_current = _Invocation()


def reset() -> None:
    global _current
    _current = _Invocation()


def json_document(as_json: bool, partial: Callable[[], dict] | None = None) -> None:
    """Declare the running command's JSON output (when as_json); partial() gives its fields so far."""
    ctx = click.get_current_context(silent=True)
    _current.json = as_json
    _current.command = _command_name(ctx)
    if partial is not None:
        _current.partial = partial


def wants_json() -> bool:
    return _current.json


def _command_name(ctx) -> str:
    path = ctx.command_path if ctx is not None else ""
    return path.split(" ", 1)[1] if " " in path else ""


def echo(text: str = "") -> None:
    """One line on standard output; a failed write (a full disk, /dev/full, a closed pipe) is an OutputError."""
    try:
        click.echo(text)
    except OSError as e:
        raise stdout_error(e) from None


def stdout_error(e: OSError) -> OutputError:
    err = OutputError(f"cannot write to standard output: {e.strerror or e}",
                      hint="check where standard output goes (disk space, permissions)")
    if e.errno == errno.EPIPE:  # the reader left (`aotc list | head`): exit 12 without a word, as pipes expect
        err.quiet = True
        try:  # and let nothing else (the interpreter's flush at exit) try to write there again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
    return err


def emit(doc: dict) -> None:
    """Print the command's JSON document (success)."""
    echo(_dumps({"schema_version": SCHEMA_VERSION, "command": _current.command, **doc}))


def emit_error(kind: str, message: str, hint: str | None, exit_code: int, command: str = "") -> None:
    """Print the running command's document with its error, when JSON was asked for. Never raises."""
    try:
        doc = dict(_current.partial() or {})
    except Exception as e:  # the document so far is best effort; the error is what matters
        doc = {"partial_error": f"{type(e).__name__}: {e}"}
    doc.pop("schema_version", None)
    doc = {"schema_version": SCHEMA_VERSION, "command": _current.command or command, **doc,
           "error": {"kind": kind, "message": message, "hint": hint, "exit_code": exit_code}}
    try:
        click.echo(_dumps(doc))
    except OSError:
        pass


def note_usage_error(ctx, argv: list[str]) -> None:
    """A usage error stops click before the command runs: JSON was asked for when --json is in argv."""
    if not _current.json and "--json" in argv:
        _current.json = True
        _current.command = _command_name(ctx)


def listed(items: list, limit: int = MAX_LISTED) -> tuple[list, int]:
    """The first `limit` items, and how many more there are."""
    return items[:limit], max(0, len(items) - limit)


def _dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)


def flush_stdout() -> None:
    """Flush standard output now, so a write that fails there is an OutputError and not a traceback at exit."""
    try:
        sys.stdout.flush()
    except OSError as e:
        raise stdout_error(e) from None
    except ValueError:  # closed
        pass
