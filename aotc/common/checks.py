"""What an artifact really is: its header against its own key, this aotc's families, the arch's limits
and the cubin itself.

check_artifact() is the one place that decides whether an artifact may be served; the cache calls it
on every read and verify, the bundle reader on every member (all at once for ``bundle verify``; the
header at ``load()`` and the cubin when the runtime first loads the member into the driver). Standard
library only.

What catches a relabelled kernel (a D256 cubin labelled head_dim 128): the key, recomputed from the
label (aotc.common.keys), unless the key was recomputed too; the launch facts, which the family's rule
derives from the label (slices_per_cta, block_m, block_n, the TMA boxes), unless they were rewritten
too; and, where the two variants' cubins differ in them, the cubin's symbol (dtype), declared block,
register count and static shared memory against the header's. No fact in an sdpa_combine cubin names
its head dim (D128 and D256 have one symbol, parameter table, size and register count), so a header
rewritten consistently in all of these can only be caught by compiling the variant again.
"""
from __future__ import annotations

import functools

from ..families import get_family
from . import keys
from .abi import Param
from .artifact import Artifact

# per-block limits of each target (CUDA programming guide, "Compute capabilities"): the largest dynamic
# plus static shared memory a block may opt into
MAX_SMEM_PER_BLOCK = {
    "sm_80": 163 * 1024,
    "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_120a": 99 * 1024,
    "sm_90": 227 * 1024, "sm_90a": 227 * 1024, "sm_100a": 227 * 1024,
}
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIMS = (1024, 1024, 64)
MAX_CLUSTER_BLOCKS = 16  # the non-portable maximum (8 is the portable one); clusters need sm_90+


class Refused(ValueError):
    """An artifact that is not what its header says; the message says what."""


def check_artifact(art: Artifact, *, conform: bool, with_cubin: bool = True, check_arch: bool = True,
                   key_status: keys.KeyStatus | None = None, header: str = "header") -> keys.KeyStatus:
    """Raise Refused unless the artifact is what it claims; returns what its key says.

    conform: hold the variant to this aotc's family (fields exactly the family's with values among its
    choices, a valid combination for a supported arch) and, when it was made from this aotc's sources,
    its ABI and launch facts to the family's rules.
    with_cubin: art.cubin holds the bytes (sha256 already checked); check them too.
    check_arch=False skips only the comparison of the cubin's arch with the variant's.
    header: what messages call the header ("the manifest", "meta.json")."""
    if conform:
        check_variant(art.variant)
    status = key_status or keys.check_recorded(art.variant, art.key, art.info)
    if status.state == "lie":
        raise Refused(status.reason)
    _check_launch_limits(art, required=conform)
    if with_cubin:
        _check_cubin(art, check_arch, header)
    if conform and status.same_sources:
        _check_family_rules(art)
    return status


def check_variant(variant) -> None:
    """The family exists, the arch is one it supports, the fields are exactly its own with values among
    their choices, and the family's validity rule accepts the combination."""
    try:
        fam = get_family(variant.family)
    except KeyError as e:
        raise Refused(str(e.args[0])) from None
    if variant.arch not in fam.archs:
        raise Refused(f"family {fam.name} has no arch {variant.arch!r} (supports {list(fam.archs)})")
    names = [f.name for f in fam.fields]
    got = [k for k, _ in variant.fields]
    # a field the family gained since the record was written, whose one unlisted value (aotc.families.Field) is
    # what every kernel did before it (the score features: off), may be missing: such a kernel is what it
    # says (bundle diff pairs it with with_defaults()), and its older parameter list keeps it from serving
    added = {f.name for f in fam.fields if f.unlisted_from or (f.unlisted is not None and len(f.unlisted) == 1)}
    if sorted(got) != sorted(names) and not (set(got) <= set(names) and set(names) - set(got) <= added):
        unknown, missing = sorted(set(got) - set(names)), sorted(set(names) - set(got))
        raise Refused(f"variant fields of {fam.name} are {names}; "
                      + "; ".join(x for x in (f"unknown: {unknown}" if unknown else "",
                                             f"missing: {missing}" if missing else "") if x))
    values = dict(with_defaults(variant).fields)
    allowed = _choices(fam.name)
    for name, v in variant.fields:
        if (type(v), v) not in allowed[name]:
            raise Refused(f"{fam.name} field {name} = {v!r} is not one of {list(fam.field(name).choices)}")
    reason = fam.why_invalid({**values, "arch": variant.arch})  # (rules may read the arch: kv_dtype's does)
    if reason is not None:
        raise Refused(f"{variant.name} is not a valid {fam.name} variant: {reason}")


def with_defaults(variant):
    """The variant with every field its family gained since it was recorded (see check_variant) at that
    field's one unlisted value (or the value of the field it follows, Field.unlisted_from): the record this
    aotc would write for the same kernel."""
    from .variant import Variant

    try:
        fam = get_family(variant.family)
    except KeyError:
        return variant
    have = dict(variant.fields)
    missing = {f.name: f.unlisted[0] for f in fam.fields if f.name not in have and not f.unlisted_from
               and f.unlisted is not None and len(f.unlisted) == 1}
    missing.update({f.name: have[f.unlisted_from] for f in fam.fields
                    if f.name not in have and f.unlisted_from in have})
    return Variant.make(variant.family, variant.arch, **have, **missing) if missing else variant


def _check_family_rules(art: Artifact) -> None:
    """An artifact made from this aotc's sources has the family's parameter list and launch facts."""
    fam = get_family(art.variant.family)
    if not same_params(art.abi.params, fam.params(art.variant)):
        raise Refused(f"its parameter list is not {fam.name}'s ({len(art.abi.params)} recorded, "
                      f"{len(fam.params(art.variant))} in the family)")
    rule, got = _launch_rule(art.variant), art.launch
    for name, want, have in (("block", rule.block, got.block), ("cluster", rule.cluster, got.cluster),
                             ("grid_rule", rule.grid_rule, got.grid_rule), ("extra", rule.extra, got.extra)):
        if want != have and _as_json(want) != _as_json(have):  # a header read back holds lists for tuples
            raise Refused(f"launch {name} {_clip(have)} is not what {fam.name} gives {art.variant.name}: {_clip(want)}")
    if rule.dynamic_smem >= 0 and rule.dynamic_smem != got.dynamic_smem:  # < 0: the compile measures it
        raise Refused(f"launch dynamic_smem {got.dynamic_smem} is not what {fam.name} gives "
                      f"{art.variant.name}: {rule.dynamic_smem}")


def same_params(a: tuple[Param, ...], b: tuple[Param, ...]) -> bool:
    """Whether two parameter lists are one (compared as plain tuples: a bundle has hundreds of kernels)."""
    return a is b or [(p.name, p.kind, p.pointee_align) for p in a] == [(p.name, p.kind, p.pointee_align) for p in b]


@functools.lru_cache(maxsize=4096)
def _launch_rule(variant):
    return get_family(variant.family).launch(variant)


@functools.lru_cache(maxsize=None)
def _choices(family: str) -> dict[str, frozenset]:
    """Each field's choices as (type, value) pairs (so 1 is not True and 128 is not "128")."""
    return {f.name: frozenset((type(c), c) for c in f.choices) for f in get_family(family).fields}


def _check_launch_limits(art: Artifact, *, required: bool, static_smem: int = 0) -> None:
    """Block, cluster and shared memory within what the target can launch.

    required: an arch without known limits is refused (else, e.g. a stale cache entry of an arch a newer
    aotc added, its limits go unchecked)."""
    arch, launch = art.variant.arch, art.launch
    max_smem = MAX_SMEM_PER_BLOCK.get(arch)
    if max_smem is None:
        if required:
            raise Refused(f"no launch limits known for arch {arch!r}")
        return
    bx, by, bz = launch.block
    if min(launch.block) < 1 or any(b > m for b, m in zip(launch.block, MAX_BLOCK_DIMS)) \
            or bx * by * bz > MAX_THREADS_PER_BLOCK:
        raise Refused(f"launch block {list(launch.block)} is beyond CUDA's limits ({MAX_THREADS_PER_BLOCK} threads, "
                      f"dimensions up to {list(MAX_BLOCK_DIMS)})")
    cx, cy, cz = launch.cluster
    if min(launch.cluster) < 1 or cx * cy * cz > MAX_CLUSTER_BLOCKS:
        raise Refused(f"launch cluster {list(launch.cluster)} is beyond CUDA's limit of {MAX_CLUSTER_BLOCKS} blocks")
    if cx * cy * cz > 1 and not _has_clusters(arch):
        raise Refused(f"launch cluster {list(launch.cluster)}: {arch} has no thread block clusters")
    if launch.dynamic_smem < 0 or launch.dynamic_smem + static_smem > max_smem:
        static = f" (+ {static_smem} static)" if static_smem else ""
        raise Refused(f"launch dynamic_smem {launch.dynamic_smem}{static} is beyond {arch}'s {max_smem} bytes of "
                      f"shared memory per block")


def _check_cubin(art: Artifact, check_arch: bool, header: str) -> None:
    """The bytes are a cubin of the variant's arch holding the recorded symbol, whose parameter table,
    declared block and resource counts are the header's."""
    from . import cubin as cubin_reader

    try:
        info = cubin_reader.parse(art.cubin)
    except cubin_reader.CubinError as e:
        raise Refused(f"not a valid cubin: {e}") from None
    if check_arch and info.arch != art.variant.arch:
        raise Refused(f"is a cubin for {info.arch}, but {header} says {art.variant.arch}")
    k = info.kernels.get(art.abi.symbol)
    if k is None:
        raise Refused(f"kernel {art.abi.symbol[:80]!r} is not in the cubin (it has {sorted(info.kernels)[:4]})")
    mismatch = art.abi.check_layout(k.params)
    if mismatch:
        raise Refused(f"the ABI {header} records disagrees with the cubin's parameter table: {mismatch}")
    if k.max_threads is not None and tuple(k.max_threads) != tuple(art.launch.block):
        raise Refused(f"the cubin's kernel is built for block {list(k.max_threads)}, {header} launches "
                      f"{list(art.launch.block)}")
    for name, have in (("registers", k.registers), ("static_smem", k.static_smem)):
        recorded = art.info.get(name)
        if have is not None and type(recorded) is int and recorded != have:
            raise Refused(f"the cubin's kernel has {name} {have}, {header} records {recorded} "
                          f"(a cubin of another variant?)")
    _check_launch_limits(art, required=False, static_smem=k.static_smem)


def _has_clusters(arch: str) -> bool:
    return int(arch[len("sm_"):].rstrip("af")) >= 90


def _as_json(v):
    """A JSON value with tuples as lists (what a header read back holds)."""
    if isinstance(v, dict):
        return {k: _as_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_as_json(x) for x in v]
    return v


def _clip(v, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."
