"""TMA descriptors for kernels that take ``GridConstant[TensorMap]`` parameters.

A family records a recipe at compile time (rank, box, swizzle, L2 promotion, out-of-bounds
fill: plain data in the bundle's launch facts); the runtime encodes the 128-byte
CUtensorMap with cuTensorMapEncodeTiled from that recipe and the caller's pointer, extents
and strides. Encoding costs a few microseconds, so prepared plans keep the bytes and
re-encode only when a pointer changes.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..common.errors import ArgumentError
from .driver import driver_error, function, init

DESCRIPTOR_BYTES = 128
_MAX_DIM = 1 << 32      # globalDim[i] <= 2^32
_MAX_STRIDE = 1 << 40   # globalStrides[i] < 2^40 bytes, multiples of 16
_MAX_BOX = 256

# cuda.h enum values (tests/test_runtime_driver.py compares them with cuda-bindings' enums):
# CUtensorMapDataType FLOAT16 6, BFLOAT16 9, UINT8 0 for e4m3 bytes (with the element bytes); CUtensorMapSwizzle
# by span; CUtensorMapL2promotion by bytes; INTERLEAVE_NONE and FLOAT_OOB_FILL_NONE (fills zeros) are 0
_DTYPES = {"fp16": (6, 2), "bf16": (9, 2), "fp8_e4m3": (0, 1)}
_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
_L2 = {0: 0, 64: 1, 128: 2, 256: 3}
_INTERLEAVE_NONE = _OOB_FILL_NONE = 0


def element_bytes(dtype: str) -> int:
    """Bytes per element of a dtype a TMA descriptor can carry."""
    if dtype not in _DTYPES:
        raise ArgumentError("dtype", dtype, f"one of {sorted(_DTYPES)} for a TMA descriptor")
    return _DTYPES[dtype][1]


@dataclass(frozen=True)
class TiledRecipe:
    """Everything about a descriptor but the pointer: fixed when a plan is prepared."""

    dtype: str
    dims: tuple[int, ...]           # innermost first (TMA order), in elements
    strides: tuple[int, ...]        # bytes, for dims[1:]
    box: tuple[int, ...]            # innermost first, in elements
    swizzle_bytes: int = 128
    l2_promotion_bytes: int = 256

    def check(self, name: str) -> None:
        """Refuse what the encoder would refuse, naming the tensor (before anything launches)."""
        if self.dtype not in _DTYPES:
            raise ArgumentError(f"{name}.dtype", self.dtype, f"one of {sorted(_DTYPES)} for a TMA descriptor")
        if len(self.dims) != len(self.box) or len(self.strides) != len(self.dims) - 1 or not 1 <= len(self.dims) <= 5:
            raise ValueError(f"{name}: inconsistent TMA recipe {self}")
        for i, d in enumerate(self.dims):
            if not 1 <= d <= _MAX_DIM:
                raise ArgumentError(f"{name} extent {i} (TMA order)", d, "in [1, 2^32]")
        for i, s in enumerate(self.strides):
            if s % 16 or not 0 < s < _MAX_STRIDE:
                raise ArgumentError(f"{name} stride {i + 1} (TMA order, bytes)", s,
                                    "a positive multiple of 16 bytes below 2^40")
        for b in self.box:
            if not 1 <= b <= _MAX_BOX:
                raise ValueError(f"{name}: TMA box {self.box} out of range")
        if self.box[0] * _DTYPES[self.dtype][1] > self.swizzle_bytes > 0:
            raise ValueError(f"{name}: inner box {self.box[0]} elements exceeds the {self.swizzle_bytes}-byte swizzle span")


# an empty tensor may have a null pointer; the kernels never load from a tensor with an empty
# extent, so its descriptor only has to encode: this aligned stand-in address is never read
_STAND_IN_ADDRESS = 1 << 12


class Encoder:
    """cuTensorMapEncodeTiled for one recipe: every argument but the address built once, and a 64-byte
    aligned scratch descriptor (a CUtensorMap is alignas(64)) written by each call; encoding a new pointer
    then costs the driver call alone."""

    __slots__ = ("_encode", "_args", "_room", "_at")

    def __init__(self, recipe: TiledRecipe):
        self._encode = None  # the entry point, resolved by the first call (after its address checks)
        rank = len(recipe.dims)
        # (data type, rank) before the address, (dims, strides, box, element strides, interleave, swizzle,
        # L2 promotion, out-of-bounds fill) after it
        self._args = (_DTYPES[recipe.dtype][0], rank, (ctypes.c_uint64 * rank)(*recipe.dims),
                      (ctypes.c_uint64 * max(rank - 1, 1))(*recipe.strides), (ctypes.c_uint32 * rank)(*recipe.box),
                      (ctypes.c_uint32 * rank)(*[1] * rank), _INTERLEAVE_NONE, _SWIZZLE[recipe.swizzle_bytes],
                      _L2[recipe.l2_promotion_bytes], _OOB_FILL_NONE)
        self._room = ctypes.create_string_buffer(DESCRIPTOR_BYTES + 64)
        self._at = ctypes.addressof(self._room) + -ctypes.addressof(self._room) % 64

    def __call__(self, address: int) -> bytes:
        """The 128 descriptor bytes for `address` (the kernel parameter)."""
        if address == 0:
            address = _STAND_IN_ADDRESS
        if address % 16:
            raise ArgumentError("TMA global address", hex(address), "16-byte aligned")
        if self._encode is None:
            init()
            self._encode = function("cuTensorMapEncodeTiled")
        a = self._args
        code = self._encode(self._at, a[0], a[1], address, *a[2:])
        if code:
            raise driver_error("cuTensorMapEncodeTiled", code)
        return ctypes.string_at(self._at, DESCRIPTOR_BYTES)


class DescriptorSlot:
    """One descriptor of a prepared plan: re-encoded only when its pointer changes."""

    __slots__ = ("address", "data", "_encode")

    def __init__(self, recipe: TiledRecipe, address: int):
        self.address = address
        self._encode = Encoder(recipe)
        self.data = self._encode(address)

    def update(self, address: int) -> bytes | None:
        """New descriptor bytes, or None when the pointer is unchanged."""
        if address == self.address:
            return None
        self.data = self._encode(address)
        self.address = address
        return self.data
