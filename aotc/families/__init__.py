"""Kernel families as plain data: fields, validity rules, ABI and launch rules.

Nothing here imports ``cutlass`` or ``cuda``: the spec enumerator, the cache
key and the runtime all read these descriptions. Each family's CuTe DSL code
lives in ``aotc.kernels.<family>`` and is imported only to compile.
"""
from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..common.abi import KernelABI, LaunchFacts, Param
from ..common.variant import Variant

KNOWN_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")


@dataclass(frozen=True)
class Field:
    name: str
    choices: tuple[Any, ...]
    doc: str
    # the choices a spec that leaves the field out takes (None: all of them)
    unlisted: tuple[Any, ...] | None = None
    # a spec (or a record from before the field) that leaves the field out takes this other field's value
    # (kv_dtype: the queries' dtype); overrides unlisted
    unlisted_from: str | None = None


@dataclass(frozen=True)
class Family:
    name: str
    doc: str
    archs: tuple[str, ...]
    fields: tuple[Field, ...]
    # why_invalid(values) -> reason string, or None when the combination is valid (values: the fields and "arch")
    why_invalid: Callable[[dict], str | None]
    params: Callable[[Variant], tuple[Param, ...]]
    launch: Callable[[Variant], LaunchFacts]
    kernel_module: str

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def abi(self, variant: Variant, symbol: str) -> KernelABI:
        return KernelABI(symbol, self.params(variant))

    def source_digest(self) -> str:
        """sha256 over the family's description and kernel source, so editing either misses the cache."""
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        common = here.parent / "common"
        kernels = here.parent / "kernels"
        # the family's own description and kernel, the ABI rules, the cubin reader (the compile checks the
        # kernel with it and picks the ptxas level from its stack-frame figure) and every shared kernel
        # module (compile helper, masks, softmax, MMA blocks, schedulers); not the other families' files,
        # so adding or editing a family rebuilds nothing else
        others = {f"{name}.py" for name in (*_MODULES, *_FAMILIES) if name != self.name}
        # (features.py, the score features' fields and parameters, is shared like a kernel module)
        files = [here / f"{self.name}.py", here / "features.py", common / "abi.py", common / "cubin.py",
                 *sorted(p for p in kernels.glob("*.py") if p.name not in others)]
        for path in files:
            h.update(path.name.encode() + b"\0")
            h.update(path.read_bytes() if path.exists() else b"<missing>")
        return h.hexdigest()

    def compile_module(self):
        return importlib.import_module(self.kernel_module)


_FAMILIES: dict[str, Family] = {}
# the modules of this package that describe a family (each registers itself, under its module's name)
_MODULES = ("kv_write", "sdpa_combine", "sdpa_decode", "sdpa_prefill", "sdpa_prefill_sm90")


def register(family: Family) -> Family:
    _FAMILIES[family.name] = family
    return family


def get_family(name: str) -> Family:
    """The family `name`, importing only its own module (the runtime's first kernel call checks one
    member's header: importing all four descriptions costs ~4 ms without a bytecode cache)."""
    if name not in _FAMILIES and name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")
    try:
        return _FAMILIES[name]
    except KeyError:
        _load_all()
        raise KeyError(f"unknown kernel family {name!r}; known: {sorted(_FAMILIES)}") from None


def all_families() -> dict[str, Family]:
    _load_all()
    return dict(_FAMILIES)


def _load_all() -> None:
    for name in _MODULES:
        importlib.import_module(f"{__name__}.{name}")
