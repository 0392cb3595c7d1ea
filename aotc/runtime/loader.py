"""Load verified artifacts lazily into the driver and check their ABI against the machine code."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ..common.errors import AotcError, DriverError, RuntimeLoadError

if TYPE_CHECKING:
    from ..common.artifact import Artifact

_MAX_DEFAULT_DYNAMIC_SMEM = 48 * 1024


class LoadedKernel:
    """One artifact: its cubin is loaded with cuLibraryLoadData on first use, then reused.

    A CUlibrary is context-independent, so one load serves every device and
    context of the process; the kernel handle is launched directly
    (cuLaunchKernelEx accepts a CUkernel).

    `source`: an Artifact (checked, with its bytes), or a bundle member
    (aotc.storage.bundle_reader.BundleMember) of which only the variant and identity are checked: its
    header is checked when `artifact` is first read (the runtime's dispatch does it when it first selects
    the kernel), and its bytes are read, sha256-checked and checked as a cubin on first load, before
    anything reaches the driver. A member that fails either is a RuntimeLoadError naming it, raised again
    on every later use; no other kernel is tried in its place.
    """

    def __init__(self, source):
        if hasattr(source, "checked_header"):  # a bundle member
            self._member, self._artifact = source, None
        else:
            self._member, self._artifact = None, source
        self.variant = source.variant  # what dispatch compares: parsed and checked for its types at load
        self._error: RuntimeLoadError | None = None
        self._lock = threading.Lock()
        self._library = None
        self._kernel = None
        self.handle = 0  # int(CUkernel) once loaded
        self._smem_ready: set[int] = set()

    @property
    def artifact(self) -> Artifact:
        """The artifact's facts, its header checked now if it was not yet; its cubin is empty until
        verified_artifact(). RuntimeLoadError names a member whose header is refused."""
        if self._artifact is None:
            self._artifact = self._from_member(self._member.checked_header)
        return self._artifact

    def recorded_fact(self, name: str):
        """launch.extra[name] as recorded (None where absent): the checked header's once it was read, else the
        manifest entry's, not checked yet, so that dispatch can order the kernels it may select by a fact without
        checking every header first (the one it selects is checked then)."""
        if self._artifact is not None:
            return self._artifact.launch.extra.get(name)
        launch = self._member.entry.get("launch")
        extra = launch.get("extra") if isinstance(launch, dict) else None
        return extra.get(name) if isinstance(extra, dict) else None

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
                driver.call("cuKernelSetAttribute", driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem,
                            self._kernel, device,
                            what=f"cuKernelSetAttribute(max dynamic smem {smem}) for {self.variant.name}")
            self._smem_ready.add(device)
        return self.handle

    def verified_artifact(self) -> Artifact:
        """The artifact with its cubin bytes, read and checked now if they were not yet (see the class)."""
        if self._member is not None:
            self._artifact = self._from_member(self._member.read)  # checks the header first
            self._member = None
        return self._artifact

    def _from_member(self, step):
        if self._error is not None:
            raise self._error
        try:
            return step()
        except AotcError as e:
            self._error = RuntimeLoadError(f"refusing {self.variant.name}: {e}", hint="rebuild or re-download the bundle")
            raise self._error from None

    def _load(self) -> None:
        art = self.verified_artifact()
        from ctypes import byref, c_size_t, c_void_p

        from . import driver  # libcuda loads with the first kernel, not with the bundle

        driver.init()
        library, kernel = c_void_p(), c_void_p()
        try:  # the driver copies the image: the bytes need not outlive the call
            driver.call("cuLibraryLoadData", byref(library), art.cubin, None, None, 0, None, None, 0)
        except DriverError as e:
            raise RuntimeLoadError(f"the driver refused {art.variant.name}: {e}") from None
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
