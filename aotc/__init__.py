"""aotc: ahead-of-time compiled CuTe DSL attention kernels and their artifact cache.

Importing ``aotc`` imports neither ``cutlass`` nor ``torch`` nor ``cuda``:
the compile side loads the DSL only when it compiles, and ``aotc.runtime``
needs only cuda-python, numpy and the standard library.
"""
from __future__ import annotations

__version__ = "0.1.0"


def load(*sources, **kwargs):
    """Load bundles (paths) or, with no argument, the default bundle search path; see aotc.runtime.load."""
    from .runtime import load as _load

    return _load(*sources, **kwargs)
