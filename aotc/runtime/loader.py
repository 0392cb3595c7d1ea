"""Load verified artifacts lazily into the driver and check their ABI against the machine code."""
from __future__ import annotations

import threading
from typing import Callable

from ..common.artifact import Artifact
from ..common.errors import AotcError, RuntimeLoadError

_MAX_DEFAULT_DYNAMIC_SMEM = 48 * 1024


class LoadedKernel:
    """One artifact: its cubin is loaded with cuLibraryLoadData on first use, then reused.

    A CUlibrary is context-independent, so one load serves every device and
    context of the process; the kernel handle is launched directly
    (cuLaunchKernel accepts a CUkernel).

    `read` (a bundle member's, aotc.storage.bundle_reader.BundleMember.read): the artifact holds the
    manifest's facts only, and its bytes are read, sha256-checked and checked as a cubin on first use,
    before anything reaches the driver. A member that fails is a RuntimeLoadError naming it, raised
    again on every later use; no other kernel is tried in its place.
    """

    def __init__(self, artifact: Artifact, read: Callable[[], Artifact] | None = None):
        self.artifact = artifact
        self._read = read
        self._read_error: RuntimeLoadError | None = None
        self._lock = threading.Lock()
        self._library = None
        self._kernel = None
        self.handle = 0  # int(CUkernel) once loaded
        self._smem_ready: set[int] = set()

    @property
    def variant(self):
        return self.artifact.variant

    @property
    def loaded(self) -> bool:
        return self.handle != 0

    def ensure_loaded(self, device: int) -> int:
        """Load (once), verify, and prepare for launches on `device`; returns the kernel handle."""
        if self.handle == 0:
            with self._lock:
                if self.handle == 0:
                    self._load()
        if device not in self._smem_ready:
            from . import driver

            smem = self.artifact.launch.dynamic_smem
            if smem > _MAX_DEFAULT_DYNAMIC_SMEM:
                code = driver.function("cuKernelSetAttribute")(driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem,
                                                               self._kernel, device)
                if code:
                    raise driver.driver_error(f"cuKernelSetAttribute(max dynamic smem {smem}) for {self.variant.name}",
                                              code)
            self._smem_ready.add(device)
        return self.handle

    def verified_artifact(self) -> Artifact:
        """The artifact with its cubin bytes, read and checked now if they were not yet (see the class)."""
        if self._read is not None:
            if self._read_error is not None:
                raise self._read_error
            try:
                self.artifact = self._read()
            except AotcError as e:
                self._read_error = RuntimeLoadError(f"refusing {self.variant.name}: {e}",
                                                    hint="rebuild or re-download the bundle")
                raise self._read_error from None
            self._read = None
        return self.artifact

    def _load(self) -> None:
        art = self.verified_artifact()
        from ctypes import byref, c_size_t, c_void_p

        from . import driver  # libcuda loads with the first kernel, not with the bundle

        driver.init()
        library, kernel = c_void_p(), c_void_p()
        code = driver.function("cuLibraryLoadData")(byref(library), art.cubin, None, None, 0, None, None, 0)
        if code:  # the driver copies the image: the bytes need not outlive the call
            raise RuntimeLoadError(f"the driver refused {art.variant.name}: "
                                   f"{driver.driver_error('cuLibraryLoadData', code)}")
        try:
            driver.call("cuLibraryGetKernel", byref(kernel), library, art.abi.symbol.encode())
            # the parameter count comes from the cubin's own table (asking the driver for one index
            # past the end would be an API error, which compute-sanitizer reports); each parameter's
            # offset and size come from the driver
            from ..common import cubin

            try:
                count = len(cubin.parse(art.cubin).kernels[art.abi.symbol].params)
            except (cubin.CubinError, KeyError) as e:
                raise RuntimeLoadError(f"refusing {art.variant.name}: cannot read its parameter table: {e}") from None
            layout = []
            offset, size = c_size_t(), c_size_t()
            for index in range(count):
                driver.call("cuKernelGetParamInfo", kernel, index, byref(offset), byref(size))
                layout.append((offset.value, size.value))
            mismatch = art.abi.check_layout(layout)
            if mismatch:
                raise RuntimeLoadError(f"refusing {art.variant.name}: its recorded ABI disagrees with the cubin: {mismatch}")
        except BaseException:
            driver.function("cuLibraryUnload")(library)
            raise
        self._library, self._kernel = library, kernel
        self.handle = kernel.value

    def unload(self) -> None:
        with self._lock:
            if self._library is not None:
                from . import driver

                driver.function("cuLibraryUnload")(self._library)
            self._library = self._kernel = None
            self.handle = 0
            self._smem_ready.clear()
