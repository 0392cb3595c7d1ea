"""Typed errors at aotc's edges. The CLI turns them into messages and exit codes in one place.

Every error class has one exit code and one ``kind`` (the name a JSON report gives it); a failure of
one kind exits with the same code from every command. ``EXIT_CODES`` lists them all for ``--help``.
"""
from __future__ import annotations

from typing import Any


class AotcError(Exception):
    """Base of every error aotc raises on purpose."""

    exit_code = 1
    kind = "failed"
    hint: str | None = None

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class CheckFailedError(AotcError):
    """A check found problems (variants that failed to build, bad cache entries, a bundle that differs)."""

    kind = "check_failed"


class UsageError(AotcError):
    """A bad argument or option value, found before anything ran."""

    exit_code = 2
    kind = "usage"


class SpecError(UsageError):
    kind = "spec"


class ConfigError(AotcError):
    """An environment variable with a value aotc cannot use; the message names the variable and the value."""

    exit_code = 2


class CompileError(AotcError):
    exit_code = 3
    kind = "compile"


class CacheError(AotcError):
    exit_code = 4
    kind = "cache"


class MissingArtifactsError(CacheError):
    """A variant is not in the cache and compiling is forbidden (offline / AOTC_NO_COMPILE=1)."""

    exit_code = 5
    kind = "missing_artifacts"

    def __init__(self, names: list[str], build_command: str):
        self.names = list(names)
        self.build_command = build_command
        shown = "\n  ".join(self.names)
        super().__init__(
            f"{len(self.names)} variant(s) missing from the cache and compiling is forbidden:\n  {shown}",
            hint=f"build them on a machine with the compile extra: {build_command}",
        )


class LockTimeoutError(CacheError):
    exit_code = 6
    kind = "lock_timeout"


class BundleError(AotcError):
    exit_code = 7
    kind = "bundle"


class VersionSkewError(BundleError):
    exit_code = 8
    kind = "version_skew"


class ArgumentError(AotcError, ValueError):
    """A bad runtime argument: names the argument, the value and what was expected."""

    exit_code = 9
    kind = "argument"

    def __init__(self, name: str, value: Any, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"argument {name!r}: got {value!r}, expected {expected}")


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (a TypeError as well as a ValueError)."""


class RuntimeLoadError(AotcError):
    """An artifact the runtime refuses to load (hash, ABI or arch mismatch)."""

    exit_code = 10
    kind = "runtime_load"


class DriverError(AotcError):
    exit_code = 11
    kind = "driver"


class OutputError(AotcError):
    """An I/O error: an output (a file, standard output) could not be written (permissions, a read-only file
    system, a full disk), or a file could not be read for a reason other than being absent."""

    exit_code = 12
    kind = "io"


# exit code -> what it means; the CLI's --help and README list exactly these
EXIT_CODES = {
    0: "ok",
    1: "a check failed: some variants failed to build, bad cache entries, bundles differ, doctor found a bad bundle",
    2: "bad usage: an unknown option or value, a missing input file, a bad spec, an unusable output path",
    3: "compile error",
    4: "cache error (including an unwritable cache or lock directory)",
    5: "variants missing while compiling is forbidden",
    6: "lock timeout",
    7: "bad bundle",
    8: "bundle of another format version or of other aotc/DSL versions",
    9: "bad runtime argument",
    10: "an artifact the runtime refuses to load",
    11: "CUDA driver error",
    12: "I/O error: standard output or a file could not be written (or read): permissions, read-only, disk full",
    130: "interrupted (Ctrl-C)",
    143: "terminated (SIGTERM)",
}
