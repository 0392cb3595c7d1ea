"""Thin, checked access to the CUDA driver through cuda.bindings."""
from __future__ import annotations

import functools
import threading

from ..common.errors import DriverError

try:
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - cuda-python < 12.6 layout
    from cuda import cuda as cu  # type: ignore[no-redef]

_init_lock = threading.Lock()
_initialized = False


def check(result, what: str):
    """Unpack a cuda.bindings (CUresult, *values) tuple, raising DriverError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise DriverError(f"{what} failed: {error_name(int(err))}")
    return values[0] if len(values) == 1 else tuple(values)


def error_name(code: int) -> str:
    try:
        err, name = cu.cuGetErrorName(cu.CUresult(code))
        return name.decode() if int(err) == 0 else f"CUresult {code}"
    except Exception:  # an unknown code is still a code
        return f"CUresult {code}"


def init() -> None:
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            check(cu.cuInit(0), "cuInit")
            _initialized = True


def current_device() -> int:
    """The device of the calling thread's current context, making device 0's primary context current if none is."""
    init()
    ctx = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        set_device(0)
    return int(check(cu.cuCtxGetDevice(), "cuCtxGetDevice"))


def set_device(ordinal: int) -> None:
    """Make the primary context of `ordinal` current on this thread (what torch and CuPy use too)."""
    init()
    dev = check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")
    ctx = _primary_context(int(dev))
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


@functools.lru_cache(maxsize=None)
def _primary_context(dev: int):
    return check(cu.cuDevicePrimaryCtxRetain(cu.CUdevice(dev)), "cuDevicePrimaryCtxRetain")


@functools.lru_cache(maxsize=None)
def compute_capability(dev: int) -> tuple[int, int]:
    init()
    a = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = check(cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def multiprocessor_count(dev: int) -> int:
    init()
    a = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(check(cu.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))


def device_count() -> int:
    init()
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def runnable_archs(cc: tuple[int, int]) -> list[str]:
    """Cubin targets a device of compute capability `cc` runs, best first.

    A cubin runs on its own major version at an equal or higher minor; the
    arch-specific "a" targets run only on exactly their own capability.
    """
    major, minor = cc
    archs = [f"sm_{major}{minor}a"]
    archs += [f"sm_{major}{m}" for m in range(minor, -1, -1)]
    return archs


def memset_d32(ptr: int, value: int, count: int) -> None:
    """Set `count` int32 words at device address `ptr` and wait until it is done (on the legacy
    default stream, then synchronized, so work later enqueued on any stream sees the words)."""
    if count:
        init()
        check(cu.cuMemsetD32Async(cu.CUdeviceptr(ptr), value, count, cu.CUstream(0)), "cuMemsetD32Async")
        check(cu.cuStreamSynchronize(cu.CUstream(0)), "cuStreamSynchronize")


# ---- the launch hot path -------------------------------------------------------
class Launcher:
    """cuLaunchKernel for one kernel handle with a pre-packed void** parameter array.

    Holds the CUkernel object and the last stream's CUstream object so a call
    converts nothing (measured on the H200: cuda.bindings with prebuilt handles
    beat a ctypes call into libcuda, 6.0 against 7.0 us).
    """

    __slots__ = ("kernel", "_stream", "_stream_obj", "_launch", "_ok")

    def __init__(self, kernel_handle: int):
        self.kernel = cu.CUkernel(kernel_handle)
        self._stream = 0
        self._stream_obj = cu.CUstream(0)
        self._launch = cu.cuLaunchKernel
        self._ok = cu.CUresult.CUDA_SUCCESS

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int,
                 params_addr: int) -> None:
        if stream != self._stream:
            self._stream_obj = cu.CUstream(stream)
            self._stream = stream
        err = self._launch(self.kernel, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem,
                           self._stream_obj, params_addr, 0)[0]
        if err != self._ok:
            raise DriverError(f"cuLaunchKernel failed: {error_name(int(err))}")
