"""Variants: frozen, hashable records of everything that changes a kernel's code."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


# what a variant field's value may be (bool before int: isinstance(True, int) holds, so types are compared exactly)
SCALAR_TYPES = (str, int, bool)


@dataclass(frozen=True, order=True)
class Variant:
    family: str
    arch: str
    # (name, value) pairs sorted by name; values are str, int or bool
    fields: tuple[tuple[str, Any], ...]

    @classmethod
    def make(cls, family: str, arch: str, **fields: Any) -> "Variant":
        return cls(family, arch, tuple(sorted(fields.items())))

    def __getitem__(self, name: str) -> Any:
        for k, v in self.fields:
            if k == name:
                return v
        raise KeyError(f"variant of {self.family} has no field {name!r}")

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.fields).get(name, default)

    def to_json(self) -> dict:
        return {"family": self.family, "arch": self.arch, **dict(self.fields)}

    @classmethod
    def from_json(cls, d: dict) -> "Variant":
        """Rebuild from to_json()'s record; raises ValueError unless family and arch are strings and every
        other value is a scalar (a list or an object would make the variant unhashable)."""
        if not isinstance(d, dict):
            raise ValueError(f"a variant must be a JSON object, got {type(d).__name__}")
        family, arch = d.get("family"), d.get("arch")
        if not isinstance(family, str) or not isinstance(arch, str):
            raise ValueError(f"a variant needs string 'family' and 'arch', got {family!r} and {arch!r}")
        fields = {k: v for k, v in d.items() if k not in ("family", "arch")}
        for k, v in fields.items():
            if type(v) not in SCALAR_TYPES:
                raise ValueError(f"variant field {k!r} = {_clip(v)}: expected a string, integer or boolean")
        return cls.make(family, arch, **fields)

    def canonical(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @property
    def name(self) -> str:
        """A readable, unique, file-name-safe name, e.g. sdpa_combine.sm_90a.dtype=bf16.head_dim=128."""
        parts = [self.family, self.arch] + [f"{k}={_short(v)}" for k, v in self.fields]
        return ".".join(parts)


def _short(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _clip(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."
