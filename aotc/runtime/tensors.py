"""Tensor and stream adapter of the aotc runtime: the records every API takes.

Turns whatever the caller hands a kernel into plain records:

* :func:`as_tensor` accepts a :class:`TensorArg`, any DLPack producer (torch, CuPy, JAX,
  numpy, ... through ``__dlpack__``) or any ``__cuda_array_interface__`` producer
  (numba, older CuPy, ...), and returns a :class:`TensorArg` (pointer, shape,
  strides in elements, aotc dtype name, device). It lives in :mod:`aotc.runtime.dlpack`
  with the protocol readers (lifetime, streams and devices are described there) and is
  importable from here.
* :func:`tensor` builds a :class:`TensorArg` from explicit values, validated.
* :func:`as_stream` turns a stream-like object into the ``CUstream`` handle as an ``int``.

This module and aotc.runtime.dlpack import only the standard library: they never import
torch, numpy, cuda or cutlass; foreign objects are read by protocol only.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from aotc.common.errors import ArgumentError, ArgumentTypeError

__all__ = ["DTYPES", "TensorArg", "tensor", "as_tensor", "as_output", "as_stream"]

DTYPES: dict[str, int] = {
    "fp16": 2,
    "bf16": 2,
    "fp32": 4,
    "fp64": 8,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "int8": 1,
    "fp8_e4m3": 1,  # e4m3fn (fp8 KV caches: aotc.families.kv_dtype)
}

_DTYPE_LIST = ", ".join(DTYPES)
_U64 = 1 << 64
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class TensorArg:
    """A tensor as the runtime sees it. Holds no reference to the memory's owner.

    ptr: device address of element [0, ..., 0] (byte offsets already applied).
    shape: extents. strides: in ELEMENTS (may be 0, negative, or above 2**31).
    dtype: a key of DTYPES. device: ("cuda", ordinal), ("cpu", 0) or ("other", code);
    ("cuda", -1) means "a CUDA device, ordinal unknown" (__cuda_array_interface__).
    readonly: its producer exported it read-only; an output may not be (as_output).

    Build it with :func:`tensor` (validated) or :func:`as_tensor`; the constructor
    itself does not validate.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: tuple[str, int]
    readonly: bool = False  # exported read-only (DLPack's READ_ONLY flag, __cuda_array_interface__'s readonly)

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def nbytes_span(self) -> tuple[int, int]:
        """[lo, hi) byte addresses any element can occupy; (ptr, ptr) when empty."""
        lo = hi = 0
        for n, st in zip(self.shape, self.strides):
            if n == 0:
                return (self.ptr, self.ptr)
            if st > 0:
                hi += st * (n - 1)
            else:
                lo += st * (n - 1)
        size = DTYPES[self.dtype]
        return (self.ptr + lo * size, self.ptr + (hi + 1) * size)


# --------------------------------------------------------------------------- helpers


class _Opaque:
    """Stands in for a foreign object in error messages (repr of a GPU tensor may sync)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __repr__(self) -> str:
        t = type(self.obj)
        mod = t.__module__
        return f"<{t.__qualname__} object>" if mod == "builtins" else f"<{mod}.{t.__qualname__} object>"


def _show(v: Any) -> Any:
    if v is None or type(v) in (bool, int, float):
        return v
    if type(v) is str:
        return v if len(v) <= 80 else v[:77] + "..."
    if type(v) is tuple and len(v) <= 16 and all(type(x) in (int, bool, str, float) for x in v):
        return v
    return _Opaque(v)


def _is_bool(v: Any) -> bool:
    # bool and numpy.bool_ (the latter without importing numpy)
    return isinstance(v, bool) or type(v).__name__ in ("bool_", "bool")


def _int(v: Any, name: str, expected: str = "an int") -> int:
    if type(v) is int:
        return v
    if _is_bool(v):
        raise ArgumentTypeError(name, v, f"{expected} (not a bool)")
    try:
        return operator.index(v)
    except TypeError:
        raise ArgumentTypeError(name, _show(v), expected) from None
    except Exception as e:  # a broken __index__
        raise ArgumentTypeError(name, _show(v), f"{expected} (its __index__ raised {e!r})") from e


def _int_tuple(v: Any, name: str) -> tuple[int, ...]:
    if type(v) is tuple or type(v) is list:
        for x in v:
            if type(x) is not int:
                break
        else:
            return tuple(v)
    if isinstance(v, (str, bytes, bytearray, dict)) or not hasattr(v, "__iter__"):
        raise ArgumentTypeError(name, _show(v), "a sequence of ints")
    try:
        items = tuple(v)
    except Exception as e:  # a broken iterable
        raise ArgumentTypeError(name, _show(v), f"a sequence of ints (iterating it raised {e!r})") from e
    return tuple(_int(x, f"{name}[{i}]") for i, x in enumerate(items))


# --------------------------------------------------------------------------- tensor()


def tensor(ptr: int, shape, strides, dtype: str, device: int = 0) -> TensorArg:
    """Explicit (pointer, shape, strides-in-elements, dtype) record on CUDA device `device`."""
    p = _int(ptr, "ptr", "a device address (int)")
    if not 0 <= p < _U64:
        raise ArgumentError("ptr", p, "an address in [0, 2**64)")
    shp = _int_tuple(shape, "shape")
    for i, s in enumerate(shp):
        if not 0 <= s <= _I64_MAX:
            raise ArgumentError(f"shape[{i}]", s, "a non-negative extent below 2**63")
    std = _int_tuple(strides, "strides")
    if len(std) != len(shp):
        raise ArgumentError("strides", std, f"{len(shp)} strides (one per dimension of shape {shp})")
    for i, s in enumerate(std):
        if not _I64_MIN <= s <= _I64_MAX:
            raise ArgumentError(f"strides[{i}]", s, "a stride in elements that fits in int64")
    if type(dtype) is not str:
        raise ArgumentTypeError("dtype", _show(dtype), f"a dtype name, one of {_DTYPE_LIST}")
    if dtype not in DTYPES:
        raise ArgumentError("dtype", _show(dtype), f"one of {_DTYPE_LIST}")
    dev = _int(device, "device", "a CUDA device ordinal (int)")
    if not 0 <= dev < (1 << 31):
        raise ArgumentError("device", dev, "a CUDA device ordinal >= 0")
    return TensorArg(p, shp, std, dtype, ("cuda", dev))


# --------------------------------------------------------------------------- as_stream


def _handle(v: Any, where: str) -> int:
    if type(v) is not int:
        if v is None or _is_bool(v):
            raise ArgumentTypeError("stream", _show(v), f"a CUstream handle ({where} gave no int)")
        try:
            v = operator.index(v)  # int subclasses, numpy ints, cuda.bindings CUstream
        except TypeError:
            raise ArgumentTypeError("stream", _show(v), f"a CUstream handle ({where} gave no int)") from None
        except Exception as e:  # a broken __index__
            raise ArgumentTypeError("stream", _show(v),
                                    f"a CUstream handle ({where}: __index__ raised {e!r})") from e
    if not 0 <= v < _U64:
        raise ArgumentError("stream", v, "a CUstream handle in [0, 2**64)")
    return v


def as_stream(obj: Any) -> int:
    """The CUstream handle of `obj` as an int (0, the legacy default stream, for None).

    Accepts None, an int, objects with ``__cuda_stream__()`` (returns (version, handle)),
    ``.cuda_stream`` (torch.cuda.Stream), ``.ptr`` (CuPy), or ``__index__``/``__int__``
    (cuda.bindings CUstream; note its ``getPtr()`` is the address of the handle's storage,
    not the handle, and is not used).
    """
    if obj is None:
        return 0
    if type(obj) is int:
        if 0 <= obj < _U64:
            return obj
        raise ArgumentError("stream", obj, "a CUstream handle in [0, 2**64)")
    if _is_bool(obj):
        raise ArgumentTypeError("stream", obj, "a stream (None, an int handle or a stream object), not a bool")
    try:
        proto = getattr(obj, "__cuda_stream__", None)
    except Exception as e:  # a property that raises something other than AttributeError
        raise ArgumentError("stream", _Opaque(obj),
                            f"a stream whose __cuda_stream__ can be read (it raised {e!r})") from e
    if proto is not None:
        try:
            info = proto() if callable(proto) else proto  # a property in early cuda.core
        except Exception as e:
            raise ArgumentError("stream", _Opaque(obj), f"a stream whose __cuda_stream__() works (it raised {e!r})") from e
        if not isinstance(info, tuple) or len(info) != 2:
            raise ArgumentError("stream", _show(info), "__cuda_stream__() to return (version, handle)")
        if info[0] != 0:
            raise ArgumentError("stream", _show(info), "__cuda_stream__ protocol version 0")
        return _handle(info[1], "__cuda_stream__()")
    for attr in ("cuda_stream", "ptr"):
        try:
            v = getattr(obj, attr, None)
        except Exception as e:
            raise ArgumentError("stream", _Opaque(obj), f"a stream whose .{attr} can be read (it raised {e!r})") from e
        if v is not None:
            return _handle(v, f".{attr}")
    if hasattr(type(obj), "__index__"):
        return _handle(obj, "__index__")
    if hasattr(type(obj), "__int__") and hasattr(type(obj), "getPtr"):
        try:
            handle = int(obj)
        except Exception as e:
            raise ArgumentTypeError("stream", _Opaque(obj), f"a CUstream handle (int() raised {e!r})") from e
        return _handle(handle, "__int__")
    raise ArgumentTypeError(
        "stream",
        _show(obj),
        "None, an int CUstream handle, or a stream object (__cuda_stream__, .cuda_stream, .ptr, CUstream)",
    )


def __getattr__(name: str) -> Any:
    """as_tensor and as_output, from aotc.runtime.dlpack: imported on first use (PEP 562) because dlpack builds on the
    record and helpers above, so this module cannot import it at the top without an import cycle."""
    if name in ("as_tensor", "as_output"):
        from .dlpack import as_output, as_tensor

        globals().update(as_tensor=as_tensor, as_output=as_output)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
