"""Reading files and JSON that anyone could have written (cache entries, stats, manifests, specs).

A path may name a FIFO or a device (a read would block forever, or never end), a file may be huge,
and JSON may nest deeply enough to exhaust the interpreter's stack. These helpers turn each of those
into an UntrustedInput (a ValueError) naming what was read, before anything hangs or crashes.
Standard library only.
"""
from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

# deeper than anything aotc writes (a manifest's launch facts nest 6 levels); far below the interpreter's
# recursion limit, so code that walks or re-serializes a checked value never overflows the stack
MAX_JSON_DEPTH = 16


class UntrustedInput(ValueError):
    pass


def read_regular_file(path: str | Path, limit: int, what: str = "") -> bytes:
    """The bytes of a regular file of at most `limit` bytes.

    Opened without blocking, so a FIFO or device is refused instead of hanging; FileNotFoundError
    (and other OSErrors of the open itself) propagate for the caller to tell "missing" from "bad"."""
    what = what or str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedInput(f"{what} is not a regular file ({_kind(st.st_mode)})")
        if st.st_size > limit:
            raise UntrustedInput(f"{what} is {st.st_size} bytes, over the limit of {limit}")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UntrustedInput(f"{what} grew past the limit of {limit} bytes while it was read")
    return data


def open_regular_file(path: str | Path, what: str = ""):
    """A binary file object for a regular file (for zipfile); a FIFO or device is refused without blocking."""
    what = what or str(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UntrustedInput(f"{what} is not a regular file ({_kind(mode)})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def parse_json(data: bytes | str, what: str) -> Any:
    """json.loads, with every way it can fail (bad UTF-8, bad syntax, nesting past the stack) an UntrustedInput."""
    try:
        return json.loads(data)
    except RecursionError:
        raise UntrustedInput(f"{what} nests too deeply to read") from None
    except (ValueError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UntrustedInput(f"{what} is not valid JSON: {e}") from None


def check_plain_json(value: Any, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a free-form JSON value (a header's info, launch extras) nested deeper than max_depth or
    holding non-finite numbers; checked without recursion."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > max_depth:
            raise UntrustedInput(f"{what} nests deeper than {max_depth} levels")
        for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else (v,)):
            t = type(x)
            if t is str or t is int or t is bool or x is None:
                continue
            if t is dict or t is list:
                stack.append((x, depth + 1))
            elif t is float:
                if not math.isfinite(x):
                    raise UntrustedInput(f"{what} holds a non-finite number ({x})")
            else:
                raise UntrustedInput(f"{what} holds a {t.__name__}, not JSON")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return f"mode {oct(stat.S_IFMT(mode))}"
