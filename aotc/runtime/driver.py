"""Thin, checked access to the CUDA driver through cuda.bindings.

Every failure here is a :class:`DriverError` with a hint: cuda-bindings missing, no
libcuda on this machine, bindings of a CUDA major the driver does not run, or a failed
driver call. :func:`init` checks the first three before any other driver call runs.
"""
from __future__ import annotations

import functools
import re
import threading
import weakref

from ..common.errors import DriverError

try:
    from cuda.bindings import driver as cu
except ImportError as e:  # an install without its dependencies: named by init(), not at import
    cu = None
    _bindings_import_error = f"{type(e).__name__}: {e}"

_init_lock = threading.Lock()
_initialized = False

# The lowest driver release each CUDA major of cuda-bindings runs on (NVIDIA's CUDA Compatibility
# guide, "Minor Version Compatibility": CUDA 12.x needs >= 525, CUDA 13.x >= 580). A newer driver
# runs an older major, so 12.x bindings run everywhere 13.x do.
MIN_DRIVER_RELEASE = {12: 525, 13: 580}

NO_DRIVER_HINT = ("launching needs an NVIDIA driver and GPU (nvidia-smi lists them); building (aotc build) "
                  "and reading bundles need neither. `aotc doctor` shows what this machine has")
DEFAULT_HINT = "`aotc doctor` reports the driver, the CUDA bindings and the GPUs this process sees"
# hints for the driver errors a user can act on; any other code gets DEFAULT_HINT
_HINTS = {
    "CUDA_ERROR_NO_DEVICE": "the driver sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES",
    "CUDA_ERROR_INVALID_DEVICE": "no GPU of that ordinal is visible: check CUDA_VISIBLE_DEVICES",
    "CUDA_ERROR_INSUFFICIENT_DRIVER": "the driver is older than the CUDA bindings need: " + DEFAULT_HINT,
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "the CUDA forward-compatibility driver does not run this GPU",
    "CUDA_ERROR_OUT_OF_MEMORY": "the GPU is out of memory",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the cubin is for another GPU architecture: `aotc doctor` lists each GPU's",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel faulted on this context, which stays unusable until the process "
                                  "exits; compute-sanitizer finds the faulting launch",
    "CUDA_ERROR_LAUNCH_FAILED": "a kernel faulted on this context, which stays unusable until the process "
                                "exits; compute-sanitizer finds the faulting launch",
}


def driver_error(what: str, code: int) -> DriverError:
    name = error_name(code)
    return DriverError(f"{what} failed: {name}", hint=_HINTS.get(name, DEFAULT_HINT))


def check(result, what: str):
    """Unpack a cuda.bindings (CUresult, *values) tuple, raising DriverError on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise driver_error(what, int(err))
    return values[0] if len(values) == 1 else tuple(values)


def error_name(code: int) -> str:
    try:
        err, name = cu.cuGetErrorName(cu.CUresult(code))
        return name.decode() if int(err) == 0 else f"CUresult {code}"
    except Exception:  # an unknown code is still a code
        return f"CUresult {code}"


# ---- what this machine has: bindings, driver, and whether they fit ------------------
def _require_bindings() -> None:
    if cu is None:
        raise DriverError(f"cuda-bindings cannot be imported ({_bindings_import_error})",
                          hint="pip install 'aotc[cu13]' (drivers >= 580) or 'aotc[cu12]' (drivers >= 525)")


def bindings_version() -> str:
    """The version of the cuda-bindings this process imported ("" when none can be)."""
    if cu is None:
        return ""
    import cuda.bindings

    return str(getattr(cuda.bindings, "__version__", ""))


def driver_version() -> int:
    """The CUDA version the driver runs, as cuDriverGetVersion gives it (12020 is CUDA 12.2); no cuInit."""
    _require_bindings()
    try:
        result = cu.cuDriverGetVersion()
    except Exception as e:  # cuda.pathfinder's DynamicLibNotFoundError and kin: no libcuda to load
        raise DriverError(f"the CUDA driver library (libcuda) cannot be loaded: {type(e).__name__}: {e}",
                          hint=NO_DRIVER_HINT) from e
    return int(check(result, "cuDriverGetVersion"))


def driver_release(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The kernel driver's release ("580.159.03") where Linux shows it, else None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        return None
    m = re.search(r"Kernel Module.*?\s(\d{3,}\.\d+(?:\.\d+)?)\s", text)
    return m.group(1) if m else None


def bindings_mismatch(cuda_version: int, bindings: str, release: str | None = None) -> DriverError | None:
    """The error to raise when cuda-bindings `bindings` cannot run on a driver for `cuda_version`, else None."""
    m = re.match(r"(\d+)\.", bindings)
    driver_major = cuda_version // 1000
    if m is None or driver_major >= int(m.group(1)):
        return None
    major = int(m.group(1))
    need = f">= {MIN_DRIVER_RELEASE[major]}" if major in MIN_DRIVER_RELEASE else f"for CUDA {major}.0 or newer"
    cuda = f"CUDA {driver_major}.{cuda_version % 1000 // 10}"
    this = f"{release} ({cuda})" if release else f"one for {cuda}"
    if driver_major in MIN_DRIVER_RELEASE:
        fix = f"pip install 'aotc[cu{driver_major}]' (cuda-bindings {driver_major}.x), or update the driver"
    else:
        fix = (f"update the driver: >= {MIN_DRIVER_RELEASE[12]} runs aotc[cu12], "
               f">= {MIN_DRIVER_RELEASE[13]} aotc[cu13]")
    return DriverError(f"cuda-bindings {bindings} needs a driver {need}; this driver is {this}", hint=fix)


def init() -> None:
    """cuInit, once per process, after checking that the bindings and the driver can run together."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            version = driver_version()
            mismatch = bindings_mismatch(version, bindings_version(), driver_release())
            if mismatch is not None:
                raise mismatch
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


class DeviceBuffer:
    """Device memory owned by the runtime (a plan's own workspace), zeroed when allocated, freed with the
    object. Allocated while a plan is prepared, never while a step runs."""

    def __init__(self, nbytes: int):
        init()
        self.nbytes = nbytes
        self.ptr = int(check(cu.cuMemAlloc(max(nbytes, 16)), f"cuMemAlloc({nbytes})"))
        check(cu.cuMemsetD8(cu.CUdeviceptr(self.ptr), 0, max(nbytes, 16)), "cuMemsetD8")
        self._free = weakref.finalize(self, _free, self.ptr)


def _free(ptr: int) -> None:
    try:
        cu.cuMemFree(cu.CUdeviceptr(ptr))
    except Exception:  # at interpreter exit the driver may be gone: the process frees it anyway
        pass


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
            raise driver_error("cuLaunchKernel", int(err))
