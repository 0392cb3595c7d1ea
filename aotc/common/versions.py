"""Versions that go into cache keys and bundle manifests."""
from __future__ import annotations

import functools
import importlib.metadata as md
import sys

from .. import __version__


@functools.lru_cache(maxsize=None)
def dsl_versions() -> dict[str, str]:
    """Every installed nvidia-cutlass-dsl* distribution and its version (empty when the DSL is absent)."""
    found = {}
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-cutlass-dsl"):
            found[name] = dist.version
    return dict(sorted(found.items()))


def producer_versions() -> dict[str, str]:
    return {"aotc": __version__, "python": "%d.%d" % sys.version_info[:2], **dsl_versions()}
