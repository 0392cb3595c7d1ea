"""aotc: ahead-of-time compiled CuTe DSL attention kernels and their artifact cache.

Importing ``aotc`` imports neither ``cutlass`` nor ``torch`` nor ``cuda``:
the compile side loads the DSL only when it compiles, and ``aotc.runtime``
needs only the standard library and the CUDA driver (libcuda, through ctypes).
"""
from __future__ import annotations

__version__ = "0.1.0"

# the errors aotc raises on purpose, importable from the top (aotc.ArgumentError, ...)
from .common.errors import (AotcError, ArgumentError, ArgumentTypeError, BundleError, CacheError,  # noqa: E402
                            CompileError, DriverError, LockTimeoutError, MissingArtifactsError, RuntimeLoadError,
                            SpecError, VersionSkewError)

__all__ = ["__version__", "load", "AotcError", "ArgumentError", "ArgumentTypeError", "BundleError", "CacheError",
           "CompileError", "DriverError", "LockTimeoutError", "MissingArtifactsError", "RuntimeLoadError",
           "SpecError", "VersionSkewError"]


def load(*sources, **kwargs):
    """Load bundles into an aotc.runtime.Runtime: the given paths, or with no argument everything found here.

    No argument: the bundles on AOTC_BUNDLE_PATH, then installed bundle wheels
    (``aotc.bundles`` entry points, see ``aotc bundle wheel``), then the local
    cache. Keyword arguments (cache, installed, check_arch) as in aotc.runtime.load.
    """
    from .runtime import load as _load

    return _load(*sources, **kwargs)
