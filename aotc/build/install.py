"""`aotc bundle install`: put a bundle's verified kernels into the local cache, under this aotc's keys."""
from __future__ import annotations

from pathlib import Path

from ..common.errors import VersionSkewError
from ..common.versions import producer_versions
from ..storage.bundle import read_bundle
from .compile import cache_key


def install_bundle(path: str | Path, cache) -> int:
    """Put a bundle's verified kernels into `cache`; returns how many were new.

    Entries go under the key this aotc computes for each variant, so a bundle
    from other aotc/DSL versions (whose kernels local builds would never look
    up) is refused with a message naming both sides' versions.
    """
    b = read_bundle(path)
    n = 0
    for a in b.artifacts:
        key = cache_key(a.variant) or a.key  # no DSL here: keep the producer's key
        if key != a.key:
            made = b.manifest.get("producer", {})
            raise VersionSkewError(
                f"bundle {path}: {a.variant.name} was built by {_versions(made)}; this machine has "
                f"{_versions(producer_versions())}, so its cache would never look the kernel up",
                hint=f"rebuild here (aotc build SPEC) or install aotc/DSL versions matching the bundle; "
                     f"the runtime can still load the bundle itself: aotc.runtime.load({str(path)!r})")
        _, created = cache.fill(key, a.variant, lambda a=a: a)
        n += created
    return n


def _versions(v: dict) -> str:
    return ", ".join(f"{k} {v[k]}" for k in sorted(v)) if isinstance(v, dict) else "unknown versions"
