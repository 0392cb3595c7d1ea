"""`aotc bundle install`: put a bundle's verified kernels into the local cache, under this aotc's keys."""
from __future__ import annotations

from pathlib import Path

from ..common.errors import CacheError, VersionSkewError
from ..common.versions import producer_versions
from ..storage.bundle import read_bundle
from .compile import cache_key


def install_bundle(path: str | Path, cache) -> dict:
    """Put a bundle's verified kernels into `cache`; returns {"kernels": held, "new": installed}.

    Entries go under the key this aotc computes for each variant, so a bundle
    from other aotc/DSL versions (whose kernels local builds would never look
    up) is refused with a message naming both sides' versions. A kernel the
    cache already holds is left alone without taking its lock (a read-only
    cache that has everything installs nothing and succeeds); the others are
    committed under their locks (check -> lock -> recheck -> commit). Installing
    is not compiling: the compile counters do not move.
    """
    b = read_bundle(path)
    keyed = []
    for a in b.artifacts:
        key = cache_key(a.variant) or a.key  # no DSL here: keep the producer's key
        if key != a.key:
            made = b.manifest.get("producer", {})
            raise VersionSkewError(
                f"bundle {path}: {a.variant.name} was built by {_versions(made)}; this machine has "
                f"{_versions(producer_versions())}, so its cache would never look the kernel up",
                hint=f"rebuild here (aotc build SPEC) or install aotc/DSL versions matching the bundle; "
                     f"the runtime can still load the bundle itself: aotc.runtime.load({str(path)!r})")
        keyed.append((key, a))
    n = 0
    for key, a in keyed:
        if cache.load(key, a.variant, count=False) is not None:  # a bad entry is quarantined (counted invalid)
            continue
        try:
            with cache.locked(key, a.variant.name):
                if cache.check(key, a.variant)[1] is None:  # recheck: another process may have filled it
                    cache.commit(a)
                    n += 1
        except OSError as e:
            raise CacheError(f"cannot install {a.variant.name} into the cache at {cache.root}: "
                             f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else ""),
                             hint="fix the permissions of AOTC_CACHE_DIR and AOTC_LOCK_DIR, or point them at "
                                  "writable directories") from None
    return {"kernels": len(b.artifacts), "new": n}


def _versions(v: dict) -> str:
    return ", ".join(f"{k} {v[k]}" for k in sorted(v)) if isinstance(v, dict) else "unknown versions"
