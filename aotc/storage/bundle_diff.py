"""`aotc bundle diff A B`: what changed between two bundles, member by member, by variant name.

Each variant present in both is compared on what the runtime launches: the cubin (sha256, size), the
ABI (symbol, parameter names and kinds) and the launch facts (block, cluster, dynamic shared memory,
grid rule and every extra fact such as block_m or a TMA recipe). A variant in only one of them is a
difference too. Where two cubins differ, their machine code is compared as well (each kernel's
instructions, registers and shared memory, read off the ELF): a kernel that only got another symbol
name says "machine code identical". Cache keys are reported but are not a difference: they change whenever a kernel's
source files or the producer's versions change, also when the cubin does not (moving a file, editing
a comment), which is exactly what a refactoring wants to see through.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..common import cubin
from ..common.artifact import Artifact
from ..common.checks import with_defaults
from .bundle import read_bundle


@dataclass
class BundleDiff:
    a: str
    b: str
    identical: list[str] = field(default_factory=list)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    # variant name -> {what: (value in A, value in B)}
    changed: dict[str, dict[str, tuple]] = field(default_factory=dict)
    keys_differ: int = 0  # of the identical and changed variants
    producers: tuple[dict, dict] = ({}, {})

    @property
    def same(self) -> bool:
        return not (self.only_a or self.only_b or self.changed)

    def to_json(self) -> dict:
        return {
            "a": self.a, "b": self.b, "same": self.same,
            "counts": {"identical": len(self.identical), "changed": len(self.changed), "only_a": len(self.only_a),
                       "only_b": len(self.only_b), "keys_differ": self.keys_differ,
                       "same_machine_code": sum(d.get("machine_code", ("",))[0] == "identical"
                                                for d in self.changed.values())},
            "only_a": self.only_a, "only_b": self.only_b,
            "changed": {name: {what: list(ab) for what, ab in d.items()} for name, d in self.changed.items()},
            "producers": {"a": self.producers[0], "b": self.producers[1]},
        }

    def render(self) -> str:
        lines = [f"A: {self.a}", f"B: {self.b}"]
        pa, pb = self.producers
        for k in sorted(set(pa) | set(pb)):
            if pa.get(k) != pb.get(k):
                lines.append(f"producer {k}: {pa.get(k)} -> {pb.get(k)}")
        lines += [f"only in A: {n}" for n in self.only_a]
        lines += [f"only in B: {n}" for n in self.only_b]
        for name, d in self.changed.items():
            lines.append(f"changed {name}:")
            lines += [f"  {what}: {_short(a)} -> {_short(b)}" if what != "machine_code" else f"  machine code {a}"
                      for what, (a, b) in d.items()]
        renamed = sum(d.get("machine_code", ("",))[0] == "identical" for d in self.changed.values())
        if renamed:
            lines.append(f"{renamed} of the changed cubins hold the same machine code (registers, shared memory "
                         f"and instructions; the names differ)")
        lines.append(f"{len(self.identical)} identical, {len(self.changed)} changed, {len(self.only_a)} only in A, "
                     f"{len(self.only_b)} only in B" + (f" (cache keys differ for {self.keys_differ}: sources or "
                                                        f"versions changed)" if self.keys_differ else ""))
        return "\n".join(lines)


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."


def machine_code(art: Artifact) -> tuple:
    """The kernels' machine code digests, registers and shared memory: what runs, without the names."""
    try:
        info = cubin.parse(art.cubin)
    except cubin.CubinError:
        return ("unreadable", art.sha256)
    return tuple(sorted((k.code_sha256, k.registers, k.static_smem, k.frame_bytes) for k in info.kernels.values()))


def member_differences(a: Artifact, b: Artifact) -> dict[str, tuple]:
    """{what: (a's, b's)} for everything the runtime launches that differs between two artifacts."""
    out: dict[str, tuple] = {}
    if a.sha256 != b.sha256:
        out["sha256"] = (a.sha256, b.sha256)
        # a renamed kernel (another symbol, same instructions) is told apart from a code change
        same_code = machine_code(a) == machine_code(b)
        out["machine_code"] = ("identical", "identical") if same_code else ("differs", "differs")
    if a.size != b.size:
        out["size"] = (a.size, b.size)
    if a.abi.symbol != b.abi.symbol:
        out["abi.symbol"] = (a.abi.symbol, b.abi.symbol)
    pa = [p.to_json() for p in a.abi.params]
    pb = [p.to_json() for p in b.abi.params]
    if pa != pb:
        first = next((i for i, (x, y) in enumerate(zip(pa, pb)) if x != y), min(len(pa), len(pb)))
        out["abi.params"] = (f"{len(pa)} params, #{first} {pa[first] if first < len(pa) else '-'}",
                             f"{len(pb)} params, #{first} {pb[first] if first < len(pb) else '-'}")
    la, lb = a.launch.to_json(), b.launch.to_json()
    for k in sorted(set(la) | set(lb)):
        if k == "extra":
            ea, eb = la.get("extra", {}), lb.get("extra", {})
            for e in sorted(set(ea) | set(eb)):
                if ea.get(e) != eb.get(e):
                    out[f"launch.extra.{e}"] = (ea.get(e), eb.get(e))
        elif la.get(k) != lb.get(k):
            out[f"launch.{k}"] = (la.get(k), lb.get(k))
    return out


def diff_bundles(path_a: str | Path, path_b: str | Path) -> BundleDiff:
    """Compare two bundles (each read and verified first: a bad bundle raises BundleError)."""
    ba, bb = read_bundle(path_a, other_sources=True), read_bundle(path_b, other_sources=True)  # old vs new
    # by name, a variant recorded before its family gained a defaulted field named as it is now
    arts_a = {with_defaults(x.variant).name: x for x in ba.artifacts}
    arts_b = {with_defaults(x.variant).name: x for x in bb.artifacts}
    d = BundleDiff(str(path_a), str(path_b), producers=(dict(ba.manifest.get("producer") or {}),
                                                         dict(bb.manifest.get("producer") or {})))
    d.only_a = sorted(set(arts_a) - set(arts_b))
    d.only_b = sorted(set(arts_b) - set(arts_a))
    for name in sorted(set(arts_a) & set(arts_b)):
        x, y = arts_a[name], arts_b[name]
        d.keys_differ += x.key != y.key
        differences = member_differences(x, y)
        if differences:
            d.changed[name] = differences
        else:
            d.identical.append(name)
    return d
