"""One compiled kernel: variant, ABI, launch facts and cubin bytes, plus its JSON header.

The same header is a cache entry's meta.json and a bundle manifest's entry.
Standard library only: the runtime reads artifacts too.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .abi import KernelABI, LaunchFacts
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
        digest = sha256_hex(cubin)
        if int(header["size"]) != len(cubin):
            raise ValueError(f"size {len(cubin)} != recorded {header['size']}")
        if digest != header["sha256"]:
            raise ValueError(f"sha256 {digest[:16]}... != recorded {str(header['sha256'])[:16]}...")
        return cls(Variant.from_json(header["variant"]), str(header["key"]), KernelABI.from_json(header["abi"]),
                   LaunchFacts.from_json(header["launch"]), cubin, digest, dict(header.get("info", {})))
