"""What a reader checks of an artifact header first: its identity (variant, key, sha256, size).

Apart from aotc.common.artifact so that aotc.runtime.load() reads every bundle member's identity without
defining the Artifact, KernelABI, LaunchFacts and Param dataclasses (~2 ms of imports, measured without
a bytecode cache); Artifact.describe() starts here and checks the rest of the header.
Standard library only.
"""
from __future__ import annotations

import re

from .variant import Variant

_HEX64 = re.compile(r"[0-9a-f]{64}")


def identity(header: dict) -> tuple[Variant, str, str, int]:
    """(variant, key, sha256, size) of a header, checked for their types, without its ABI, launch facts and
    info: what aotc.runtime.load() reads of every bundle member (describe() checks the rest on first use).
    Raises ValueError naming the first malformed field."""
    if not isinstance(header, dict):
        raise ValueError(f"an artifact header must be a JSON object, got {type(header).__name__}")
    for name in ("variant", "key", "abi", "launch", "sha256", "size"):
        if name not in header:
            raise ValueError(f"no {name!r} in the header")
    key, sha, size = header["key"], header["sha256"], header["size"]
    if not isinstance(key, str):
        raise ValueError(f"key {key!r} is not a string")
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise ValueError(f"sha256 {str(sha)[:80]!r} is not a sha256 hex digest")
    if type(size) is not int or size < 0:
        raise ValueError(f"size {str(size)[:40]!r} is not a byte count")
    return Variant.from_json(header["variant"]), key, sha, size
