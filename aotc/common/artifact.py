"""One compiled kernel: variant, ABI, launch facts and cubin bytes, plus its JSON header.

The same header is a cache entry's meta.json and a bundle manifest's entry.
Standard library only: the runtime reads artifacts too.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

from .abi import KernelABI, LaunchFacts, Param
from .header import identity
from .untrusted import check_plain_json
from .variant import Variant

def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

@dataclass(frozen=True)
class Artifact:
    variant: Variant
    key: str
    abi: KernelABI
    launch: LaunchFacts
    cubin: bytes = field(repr=False)
    sha256: str = ""
    # producer versions, compile seconds, registers, static shared memory, ...
    info: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def size(self) -> int:
        return len(self.cubin)

    def header(self) -> dict:
        if not self.cubin:
            raise ValueError(f"{self.variant.name}: no cubin bytes read yet, so no header to write")
        return {
            "variant": self.variant.to_json(),
            "key": self.key,
            "abi": self.abi.to_json(),
            "launch": self.launch.to_json(),
            "sha256": self.sha256,
            "size": len(self.cubin),
            "info": dict(self.info),
        }

    @classmethod
    def from_header(cls, header: dict, cubin: bytes) -> "Artifact":
        """Rebuild from a header and cubin bytes; raises ValueError when the bytes do not match the header."""
        art, size = cls.describe(header)
        if size != len(cubin):
            raise ValueError(f"size {len(cubin)} != recorded {size}")
        digest = sha256_hex(cubin)
        if digest != art.sha256:
            raise ValueError(f"sha256 {digest[:16]}... != recorded {art.sha256[:16]}...")
        return dataclasses.replace(art, cubin=cubin)

    @classmethod
    def describe(cls, header: dict) -> tuple["Artifact", int]:
        """The header's facts without the bytes: (an artifact whose cubin is empty, the recorded size).

        For readers that check the bytes later (the runtime reads a bundle member on first use); the
        artifact must not be written anywhere until from_header() has checked its cubin. Raises
        ValueError naming the first malformed field."""
        variant, key, sha, size = identity(header)
        info = header.get("info", {})
        if not isinstance(info, dict):
            raise ValueError(f"info must be an object, got {type(info).__name__}")
        launch = _launch_from_json(header["launch"])
        check_plain_json(info, "info")
        check_plain_json(launch.extra, "launch extra")
        art = cls(variant, key, _abi_from_json(header["abi"]), launch, b"", sha, dict(info))
        return art, size

# Headers are parsed here rather than by KernelABI/LaunchFacts.from_json: aotc.common.abi is part of every
# family's source digest (and so of every cache key), and these checks change no kernel.

def _abi_from_json(d) -> KernelABI:
    if not isinstance(d, dict) or not isinstance(d.get("symbol"), str) or not d["symbol"]:
        raise ValueError(f"abi must be an object with a non-empty string 'symbol', got {_clip(d)}")
    params = d.get("params")
    if not isinstance(params, list):
        raise ValueError(f"abi of {d['symbol'][:80]!r}: 'params' must be a list, got {_clip(params)}")
    return KernelABI(d["symbol"], _params_from_json(params))

# parameter lists already parsed, with the JSON they came from: a bundle's kernels share a few lists,
# and comparing with those (a C-level comparison) is much cheaper than parsing every entry's afresh
_PARAMS_SEEN: list[tuple[list, tuple[Param, ...]]] = []

def _params_from_json(params: list) -> tuple[Param, ...]:
    for seen_json, parsed in _PARAMS_SEEN:
        if params == seen_json:
            return parsed
    out = []
    for p in params:
        if not isinstance(p, dict):
            raise ValueError(f"a parameter must be an object, got {_clip(p)}")
        name, kind = p.get("name"), p.get("kind")
        if not isinstance(name, str) or not isinstance(kind, str):
            raise ValueError(f"a parameter needs string 'name' and 'kind', got {_clip(p)}")
        align_to = p.get("pointee_align", 0)
        if type(align_to) is not int:
            raise ValueError(f"parameter {name!r}: pointee_align must be an integer, got {_clip(align_to)}")
        param = Param(name, kind, align_to)  # ValueError for an unknown kind or a bad alignment
        if p.get("size", param.size) != param.size or p.get("align", param.align) != param.align \
                or type(p.get("size", 0)) is not int or type(p.get("align", 0)) is not int:
            raise ValueError(f"parameter {name!r}: recorded size/align {_clip(p.get('size'))}/{_clip(p.get('align'))} "
                             f"disagree with kind {kind!r} ({param.size}/{param.align})")
        out.append(param)
    parsed = tuple(out)
    if len(_PARAMS_SEEN) < 64:
        _PARAMS_SEEN.append(([dict(p) for p in params], parsed))
    return parsed

def _launch_from_json(d) -> LaunchFacts:
    """Integers where integers go (1e9, "128" and true are refused, not coerced); checks.py bounds them."""
    if not isinstance(d, dict):
        raise ValueError(f"launch facts must be an object, got {_clip(d)}")
    smem, rule, extra = d.get("dynamic_smem", 0), d.get("grid_rule", ""), d.get("extra", {})
    if type(smem) is not int:
        raise ValueError(f"launch dynamic_smem = {_clip(smem)}: expected an integer")
    if not isinstance(rule, str) or not isinstance(extra, dict):
        raise ValueError(f"launch grid_rule must be a string and extra an object, got {_clip(rule)}, {_clip(extra)}")
    return LaunchFacts(_dim3(d.get("block"), "block"), _dim3(d.get("cluster", [1, 1, 1]), "cluster"), smem, rule,
                       dict(extra))

def _dim3(v, what: str) -> tuple[int, int, int]:
    if not isinstance(v, list) or len(v) != 3 or not all(type(x) is int for x in v):
        raise ValueError(f"launch {what} = {_clip(v)}: expected three integers")
    return tuple(v)

def _clip(v, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."
