"""Pre-packed parameter buffers and prepared launches.

A prepared launch lays the kernel's parameters out once (C struct layout from
the ABI) in a ctypes buffer, with the void** array cuLaunchKernel wants
pointing into it. Per call only the changed pointers/extents are written into
their slots; nothing is allocated, encoded or synchronized, so it is safe
under CUDA Graph capture (the driver copies parameters at launch).
"""
from __future__ import annotations

import ctypes

from ..common.abi import KernelABI, layout_offsets
from . import driver
from .loader import LoadedKernel

_SLOT_TYPES = {"ptr": ctypes.c_uint64, "i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float}


class ParamBuffer:
    def __init__(self, abi: KernelABI):
        offsets, total = layout_offsets(abi.params)
        self.buffer = ctypes.create_string_buffer(max(total, 1))
        base = ctypes.addressof(self.buffer)
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self.address = ctypes.addressof(self.pointers)
        self.slots = {}
        self._descriptors = set()  # 128-byte TMA descriptors are written whole (.raw), scalars by .value
        for p, off in zip(abi.params, offsets):
            if p.kind == "tensormap":
                self.slots[p.name] = (ctypes.c_char * 128).from_buffer(self.buffer, off)
                self._descriptors.add(p.name)
            else:
                self.slots[p.name] = _SLOT_TYPES[p.kind].from_buffer(self.buffer, off)

    def update(self, values: dict) -> None:
        slots = self.slots
        for name, value in values.items():
            if name in self._descriptors:
                slots[name].raw = bytes(value)
            else:
                slots[name].value = value


class PreparedLaunch:
    """One kernel, grid and parameter buffer, ready to launch on any stream of the prepared device:
    launch(stream) is the driver.Launcher itself (a no-op for an empty grid), one Python call deep."""

    __slots__ = ("kernel", "handle", "grid", "block", "smem", "params", "device", "empty", "launch", "_cuts")

    def __init__(self, kernel: LoadedKernel, grid: tuple[int, int, int], device: int, values: dict):
        self.kernel = kernel
        self.device = device
        self.handle = kernel.ensure_loaded(device)
        self.grid = grid
        self.empty = not (grid[0] and grid[1] and grid[2])  # nothing to compute: launches are skipped
        self.block = kernel.artifact.launch.block
        self.smem = kernel.artifact.launch.dynamic_smem
        self.params = ParamBuffer(kernel.artifact.abi)
        missing = set(self.params.slots) - set(values)
        if missing:
            raise ValueError(f"prepared launch of {kernel.variant.name}: no value for parameters {sorted(missing)}")
        # a plan gives every parameter its family's kernels take; one an older kernel lacks is not written
        self.params.update({name: values[name] for name in self.params.slots})
        self.launch = (lambda stream=0: None) if self.empty else \
            driver.Launcher(self.handle, grid, self.block, self.smem, self.params.address)
        self._cuts: dict = {}

    def with_grid_x(self, x: int):
        """A launcher (stream) -> None of the same kernel and parameter buffer on grid (x, y, z): a persistent
        kernel on x of the SMs (aotc.runtime.attention's prefill_sms). Made once per x."""
        cut = self._cuts.get(x)
        if cut is None:
            if len(self._cuts) >= 8:  # a few values per plan are the use; more are made anew
                self._cuts.clear()
            cut = self._cuts[x] = driver.Launcher(self.handle, (x, *self.grid[1:]), self.block, self.smem,
                                                  self.params.address)
        return cut
