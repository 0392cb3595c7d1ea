"""Compile one variant with CuTe DSL: cubin bytes, ABI and launch facts, checked against the cubin.

This is the only module that (indirectly) imports ``cutlass``, and only inside
``compile_variant``. Compiles run without a GPU: ``--gpu-arch <arch>``
targets any arch from any machine.
"""
from __future__ import annotations

import tempfile
import time

from .. import __version__
from ..common import config, cubin
from ..common.artifact import Artifact, sha256_hex
from ..common.keys import COMPILE_OPTIONS, key_from_parts
from ..common.errors import CompileError
from ..families import get_family
from ..common.variant import Variant
from ..common.versions import dsl_versions, producer_versions

# The key's definition lives in aotc.common.keys (the runtime recomputes keys too); the build computes it
# here from this module's names (COMPILE_OPTIONS, __version__, dsl_versions), reading the sources afresh.


def key_parts(variant: Variant) -> dict | None:
    """This aotc's key parts for `variant` (aotc.common.keys), the family's sources read afresh; None
    when the DSL's versions are unknown (do not persist)."""
    dsl = dsl_versions()
    if not dsl:
        return None
    return {"family_source": get_family(variant.family).source_digest(), "aotc": __version__,
            "dsl": dict(dsl), "options": COMPILE_OPTIONS}


def cache_key(variant: Variant) -> str | None:
    """sha256 over everything that changes the cubin; None when something is unknown (do not persist)."""
    parts = key_parts(variant)
    return None if parts is None else key_from_parts(variant, parts)


def compile_variant(variant: Variant, key: str | None = None, *, tile=None, check_sources: bool = True) -> Artifact:
    """Compile one variant in this process. Raises CompileError with the variant's name on failure.

    key: the artifact's key (default: the cache key of the variant and its family's sources). tile: a
    tile record to build instead of the family table's (tuners; such cubins get keys of their own and
    never enter the cache). Unless check_sources is False (a tuning build), a key that no longer
    matches the sources after the compile is refused."""
    config.disable_dsl_cache()
    fam = get_family(variant.family)
    parts = key_parts(variant)
    own_key = None if parts is None else key_from_parts(variant, parts)
    key = key or own_key or ""
    try:
        module = fam.compile_module()
    except ImportError as e:
        raise CompileError(f"cannot compile {variant.name}: {e}",
                           hint="install the compile extra: pip install 'aotc[compile]'") from None
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="aotc-compile-") as dump_dir:
            built = module.compile(variant, dump_dir=dump_dir, **({} if tile is None else {"tile": tile}))
    except Exception as e:  # the DSL raises many types; report them all against the variant
        raise CompileError(f"compiling {variant.name} failed: {type(e).__name__}: {e}") from e
    seconds = time.perf_counter() - t0
    data, abi, launch = built.cubin, built.abi, built.launch
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise CompileError(f"compiling {variant.name} produced no cubin")
    data = bytes(data)
    if tuple(abi.params) != tuple(fam.params(variant)):
        raise CompileError(f"{variant.name}: the kernel's parameters are not the family's ABI")
    if launch.dynamic_smem < 0:
        raise CompileError(f"{variant.name}: the compile did not report its dynamic shared memory size")
    try:
        info = cubin.parse(data)
    except cubin.CubinError as e:
        raise CompileError(f"{variant.name}: the DSL's output is not a readable cubin: {e}") from None
    if info.arch != variant.arch:
        raise CompileError(f"{variant.name}: cubin targets {info.arch}, expected {variant.arch}")
    if abi.symbol not in info.kernels:
        raise CompileError(f"{variant.name}: kernel {abi.symbol!r} not in cubin (has {sorted(info.kernels)})")
    kinfo = info.kernels[abi.symbol]
    mismatch = abi.check_layout(kinfo.params)
    if mismatch:
        raise CompileError(f"{variant.name}: recorded ABI disagrees with the cubin: {mismatch}")
    # The key names the sources as they were when it was computed; CuTe DSL re-reads a kernel's source
    # file while compiling. A source edited in between (a developer saving mid-build) would put a cubin
    # of one source under the key of another, to be served once the edit is undone: refuse it instead.
    if check_sources and key and key != (cache_key(variant) or key):
        raise CompileError(f"{variant.name}: the {variant.family} sources changed while it compiled; "
                           "nothing was stored", hint="run the build again")
    return Artifact(
        variant=variant, key=key, abi=abi, launch=launch, cubin=data, sha256=sha256_hex(data),
        info={
            "compile_seconds": round(seconds, 3),
            "registers": kinfo.registers,
            "static_smem": kinfo.static_smem,
            "ptxas": built.ptxas_level,
            "versions": producer_versions(),
            # what the key is made of, so readers can recompute it from the variant; None: a key of the
            # caller's own (a tuning build), which is not a cache key
            "key_parts": parts if key == own_key else None,
        },
    )
