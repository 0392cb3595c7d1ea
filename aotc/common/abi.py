"""The pointer ABI: plain data shared by the compile side and the runtime.

A kernel's entry takes only raw device pointers, 32/64-bit integers, 32-bit
floats and (later) 128-byte TMA descriptors.  This module describes such a
parameter list and the launch facts of a compiled kernel.  It imports neither
``cutlass`` nor ``cuda`` so both halves can use it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# kind -> (size in bytes, alignment in bytes)
PARAM_KINDS: dict[str, tuple[int, int]] = {
    "ptr": (8, 8),
    "i32": (4, 4),
    "i64": (8, 8),
    "f32": (4, 4),
    "tensormap": (128, 64),
}


@dataclass(frozen=True)
class Param:
    """One kernel parameter. pointee_align (pointers and TMA descriptors): the alignment in bytes the
    kernel assumes for the address it points at (compiled in as the parameter's .align), which the
    runtime checks before every launch; 0 for scalars, and in ABIs recorded before the field existed."""

    name: str
    kind: str
    pointee_align: int = 0

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"parameter {self.name!r}: unknown kind {self.kind!r}, expected one of {sorted(PARAM_KINDS)}")
        addressed = self.kind in ("ptr", "tensormap")
        a = self.pointee_align
        if a < 0 or a & (a - 1) or (a and not addressed):
            raise ValueError(f"parameter {self.name!r} ({self.kind}): pointee_align {a} must be a power of two for "
                             "pointers and descriptors, and 0 for scalars")

    @property
    def size(self) -> int:
        return PARAM_KINDS[self.kind][0]

    @property
    def align(self) -> int:
        return PARAM_KINDS[self.kind][1]

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.kind, "size": self.size, "align": self.align}
        if self.pointee_align:
            out["pointee_align"] = self.pointee_align
        return out

    @classmethod
    def from_json(cls, d: dict) -> "Param":
        p = cls(str(d["name"]), str(d["kind"]), int(d.get("pointee_align", 0)))
        if int(d.get("size", p.size)) != p.size or int(d.get("align", p.align)) != p.align:
            raise ValueError(f"parameter {p.name!r}: recorded size/align {d.get('size')}/{d.get('align')} "
                             f"disagree with kind {p.kind!r} ({p.size}/{p.align})")
        return p


def ptr(name: str, pointee_align: int) -> Param:
    if pointee_align <= 0:
        raise ValueError(f"pointer parameter {name!r} needs its pointee alignment")
    return Param(name, "ptr", pointee_align)


def scalars(kind: str, *names: str) -> tuple[Param, ...]:
    return tuple(Param(n, kind) for n in names)


def layout_offsets(params: tuple[Param, ...]) -> tuple[list[int], int]:
    """C struct layout of the parameter list: (offset of each parameter, total size)."""
    offsets, pos = [], 0
    for p in params:
        pos = (pos + p.align - 1) // p.align * p.align
        offsets.append(pos)
        pos += p.size
    return offsets, pos


@dataclass(frozen=True)
class KernelABI:
    """The ordered parameter list of one kernel entry and its symbol name."""

    symbol: str
    params: tuple[Param, ...]

    def offsets(self) -> list[int]:
        return layout_offsets(self.params)[0]

    def to_json(self) -> dict:
        return {"symbol": self.symbol, "params": [p.to_json() for p in self.params]}

    @classmethod
    def from_json(cls, d: dict) -> "KernelABI":
        return cls(str(d["symbol"]), tuple(Param.from_json(p) for p in d["params"]))

    def check_layout(self, layout: list[tuple[int, int]]) -> str | None:
        """Compare with (offset, size) pairs read off the cubin or the driver.

        Offsets are compared relative to the first parameter, since the driver
        reports them from a base. Returns a description of the first
        difference, or None when they agree.
        """
        if len(layout) != len(self.params):
            return f"the kernel has {len(layout)} parameters, the ABI records {len(self.params)}"
        if not layout:
            return None
        base = layout[0][0]
        for p, off, (got_off, got_size) in zip(self.params, self.offsets(), layout):
            if got_size != p.size or got_off - base != off:
                return (f"parameter {p.name!r} ({p.kind}): kernel has offset {got_off - base} size {got_size}, "
                        f"ABI expects offset {off} size {p.size}")
        return None


def has_grid_dependency_control(arch: str) -> bool:
    """Whether `arch` ("sm_90a", "sm_80", ...) has griddepcontrol (programmatic dependent launch): sm_90+."""
    return int(arch[len("sm_"):].rstrip("af")) >= 90


@dataclass(frozen=True)
class LaunchFacts:
    """What a launch needs beyond the arguments; the grid comes from the family's grid rule."""

    block: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    dynamic_smem: int = 0
    grid_rule: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict:
        return {"block": list(self.block), "cluster": list(self.cluster), "dynamic_smem": self.dynamic_smem,
                "grid_rule": self.grid_rule, "extra": dict(self.extra)}

    @classmethod
    def from_json(cls, d: dict) -> "LaunchFacts":
        return cls(tuple(int(x) for x in d["block"]), tuple(int(x) for x in d.get("cluster", (1, 1, 1))),
                   int(d.get("dynamic_smem", 0)), str(d.get("grid_rule", "")), dict(d.get("extra", {})))
