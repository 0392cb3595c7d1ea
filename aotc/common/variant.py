"""Variants: frozen, hashable records of everything that changes a kernel's code."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


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
        d = dict(d)
        return cls.make(str(d.pop("family")), str(d.pop("arch")), **d)

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
