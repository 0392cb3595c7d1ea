"""Typed errors at aotc's edges. The CLI turns them into messages and exit codes in one place."""
from __future__ import annotations

from typing import Any


class AotcError(Exception):
    """Base of every error aotc raises on purpose."""

    exit_code = 1
    hint: str | None = None

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class SpecError(AotcError):
    exit_code = 2


class ConfigError(AotcError):
    """An environment variable with a value aotc cannot use; the message names the variable and the value."""

    exit_code = 2


class CompileError(AotcError):
    exit_code = 3


class CacheError(AotcError):
    exit_code = 4


class MissingArtifactsError(CacheError):
    """A variant is not in the cache and compiling is forbidden (offline / AOTC_NO_COMPILE=1)."""

    exit_code = 5

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


class BundleError(AotcError):
    exit_code = 7


class VersionSkewError(BundleError):
    exit_code = 8


class ArgumentError(AotcError, ValueError):
    """A bad runtime argument: names the argument, the value and what was expected."""

    exit_code = 9

    def __init__(self, name: str, value: Any, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"argument {name!r}: got {value!r}, expected {expected}")


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (a TypeError as well as a ValueError)."""


class RuntimeLoadError(AotcError):
    """An artifact the runtime refuses to load (hash, ABI or arch mismatch)."""

    exit_code = 10


class DriverError(AotcError):
    exit_code = 11
