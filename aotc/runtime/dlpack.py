"""Foreign tensors of the aotc runtime: :func:`as_tensor` and the protocols it reads.

:func:`as_tensor` turns a :class:`~aotc.runtime.tensors.TensorArg` (as is), a torch tensor
(through its own attributes), any DLPack producer (``__dlpack__``: torch, CuPy, JAX, numpy,
...) or any ``__cuda_array_interface__`` producer (numba, older CuPy, ...) into a record.
The DLPack capsule is parsed with ctypes; this module imports only the standard library
and aotc (never torch, numpy, cuda or cutlass).

Lifetime: the returned :class:`TensorArg` does not own memory. The DLPack capsule is
left unconsumed, so dropping it runs the producer's deleter (which releases the
export, not the tensor); the caller must keep the original tensor alive while the
record is in use. Exports the producer marks as copies (DLPack >= 1.0
``DLPACK_FLAG_BITMASK_IS_COPIED``) are refused for that reason. Read-only exports (DLPack's
``DLPACK_FLAG_BITMASK_READ_ONLY``, ``__cuda_array_interface__``'s ``data[1]``) are recorded as such,
and refused where a kernel writes the tensor (:func:`as_output`).

Streams: CUDA producers are asked with ``stream=-1`` ("do not synchronize"), as in the
DLPack spec; ordering against the producer's stream is the caller's job (pass the
producer's stream to the launch). The ``stream`` entry of ``__cuda_array_interface__``
v3 is likewise not synchronised on.

Device of ``__cuda_array_interface__`` objects: the interface has no device field, so
they get ``("cuda", -1)``, meaning "a CUDA device, ordinal unknown (the one the pointer
belongs to)".
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any

from aotc.common.errors import ArgumentError, ArgumentTypeError

from .tensors import _DTYPE_LIST, _U64, DTYPES, TensorArg, _int, _int_tuple, _Opaque, _show

__all__ = ["as_tensor", "torch_layouts"]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    n = len(shape)
    if n == 0:
        return ()
    if n == 1:
        return (1,)
    out = [1] * n
    acc = 1
    for i in range(n - 1, 0, -1):
        acc *= shape[i]
        out[i - 1] = acc
    return tuple(out)


# --------------------------------------------------------------------------- DLPack

_kDLCPU, _kDLCUDA, _kDLCUDAManaged = 1, 2, 13
_CUDA_LIKE = frozenset((_kDLCUDA, _kDLCUDAManaged))  # IntEnum members hash and compare as ints
_FLAG_READ_ONLY = 1 << 0
_FLAG_IS_COPIED = 1 << 1
_V1 = (1, 0)
_NAME_V = b"dltensor_versioned"
_NAME_L = b"dltensor"

# (type code, bits) -> aotc dtype, for lanes == 1.
_DL_DTYPES: dict[tuple[int, int], str] = {
    (2, 16): "fp16",
    (4, 16): "bf16",
    (2, 32): "fp32",
    (2, 64): "fp64",
    (0, 32): "int32",
    (0, 64): "int64",
    (0, 8): "int8",
    (1, 8): "uint8",
    (10, 8): "fp8_e4m3",  # kDLFloat8_e4m3fn (DLPack 1.1)
}
_DL_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque_handle", 4: "bfloat", 5: "complex", 6: "bool",
                  10: "float8_e4m3fn"}


def _dl_dtype_name(code: int, bits: int, lanes: int) -> str:
    base = f"{_DL_CODE_NAMES.get(code, f'dlpack_code{code}_')}{bits}"
    return base if lanes == 1 else f"{base}x{lanes}"


# DLTensor, native layout (64-bit): data void*, device {i32 type, i32 id}, ndim i32,
# dtype {u8 code, u8 bits, u16 lanes}, shape i64*, strides i64*, byte_offset u64  (48 bytes).
# DLManagedTensor starts with a DLTensor. DLManagedTensorVersioned starts with
# version {u32 major, u32 minor}, manager_ctx void*, deleter fn*, flags u64, then a DLTensor.
_LEGACY = struct.Struct("@PiiiBBHPPQ")
_VERSIONED = struct.Struct("@IIPPQPiiiBBHPPQ")
if _LEGACY.size != 48 or _VERSIONED.size != 80 or ctypes.sizeof(ctypes.c_void_p) != 8:  # pragma: no cover
    raise ImportError("aotc.runtime.dlpack needs a 64-bit host")
_unpack_legacy = _LEGACY.unpack
_unpack_versioned = _VERSIONED.unpack
_at_legacy = (ctypes.c_char * 48).from_address
_at_versioned = (ctypes.c_char * 80).from_address
_MAX_NDIM = 64
# ndim -> (unpack, from_address) reading ndim int64 at an address, without a ctypes call.
_I64_READERS = [(struct.Struct(f"@{n}q").unpack, (ctypes.c_char * (8 * n)).from_address) for n in range(_MAX_NDIM + 1)]

_GetName = ctypes.pythonapi.PyCapsule_GetName
_GetName.restype = ctypes.c_char_p
_GetName.argtypes = [ctypes.py_object]
_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer  # checks the name; NULL + ValueError if it differs
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _capsule_type() -> type:
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi)
    )
    probe = ctypes.c_char(0)
    return type(new(ctypes.addressof(probe), None, None))


_CapsuleType = _capsule_type()

# Ways to call __dlpack__, best first ("-1": producer must not synchronize).
_CUDA_CALLS = (
    lambda fn: fn(stream=-1, max_version=_V1),
    lambda fn: fn(stream=-1),
    lambda fn: fn(max_version=_V1),
    lambda fn: fn(),
)
_HOST_CALLS = (lambda fn: fn(max_version=_V1), lambda fn: fn())
# (producer type, is CUDA) -> (index of the call that worked, capsule name it gave).
_conv: dict[tuple[type, bool], tuple[int, bytes]] = {}

_slot_set = [TensorArg.__dict__[f].__set__ for f in ("ptr", "shape", "strides", "dtype", "device", "readonly")]
_set_ptr, _set_shape, _set_strides, _set_dtype, _set_device, _set_readonly = _slot_set
_new = object.__new__


def _make(ptr: int, shape: tuple, strides: tuple, dtype: str, device: tuple, readonly: bool = False) -> TensorArg:
    """TensorArg without the frozen-dataclass __init__ (which costs ~2x): same result."""
    t = _new(TensorArg)
    _set_ptr(t, ptr)
    _set_shape(t, shape)
    _set_strides(t, strides)
    _set_dtype(t, dtype)
    _set_device(t, device)
    _set_readonly(t, readonly)
    return t


def _parse(cap: Any, base: int, versioned: bool, obj: Any, name: str) -> TensorArg:
    """Read the DLTensor at `base` (kept valid by `cap`, alive in the caller's frame)."""
    if versioned:
        (major, minor, _ctx, _deleter, flags, data, dev_type, dev_id, ndim, code, bits, lanes, shape_p, strides_p,
         byte_offset) = _unpack_versioned(_at_versioned(base))
        if major != 1:
            raise ArgumentError(name, _Opaque(obj), f"a DLPack 1.x export (got version {major}.{minor})")
        if flags & _FLAG_IS_COPIED:
            raise ArgumentError(name, _Opaque(obj), "a zero-copy DLPack export (the producer made a copy)")
        readonly = bool(flags & _FLAG_READ_ONLY)
    else:
        readonly = False
        data, dev_type, dev_id, ndim, code, bits, lanes, shape_p, strides_p, byte_offset = _unpack_legacy(
            _at_legacy(base)
        )
    dtype = _DL_DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        raise ArgumentTypeError(name, _dl_dtype_name(code, bits, lanes), f"a tensor of a supported dtype ({_DTYPE_LIST})")
    if ndim:
        if not 0 < ndim <= _MAX_NDIM or not shape_p:
            raise ArgumentError(name, _Opaque(obj), f"a DLTensor with 0..{_MAX_NDIM} dims and a shape (ndim={ndim})")
        unpack, at = _I64_READERS[ndim]
        shape = unpack(at(shape_p))
        if min(shape) < 0:
            raise ArgumentError(name, shape if ndim <= 16 else _Opaque(obj), "a DLTensor with a non-negative shape")
        strides = unpack(at(strides_p)) if strides_p else _contiguous_strides(shape)
    else:
        shape = strides = ()
    if dev_type == _kDLCUDA or dev_type == _kDLCUDAManaged:
        device = ("cuda", dev_id)
    elif dev_type == _kDLCPU:
        device = ("cpu", 0)
    else:
        device = ("other", dev_type)
    return _make(((data or 0) + byte_offset) & 0xFFFFFFFFFFFFFFFF, shape, strides, dtype, device, readonly)


def _dlpack_slow(obj: Any, fn: Any, name: str) -> TensorArg:
    """First call for a producer type, or anything unusual: full checks and good errors."""
    try:
        dev_fn = obj.__dlpack_device__
    except AttributeError:
        cuda = False
    except Exception as e:  # a property that raises
        raise ArgumentError(name, _Opaque(obj), f"a DLPack producer (reading __dlpack_device__ raised {e!r})") from e
    else:
        try:
            cuda = int(dev_fn()[0]) in _CUDA_LIKE
        except Exception as e:
            raise ArgumentError(name, _Opaque(obj), f"a DLPack producer (__dlpack_device__() raised {e!r})") from e
    first_err: BaseException | None = None
    for idx, call in enumerate(_CUDA_CALLS if cuda else _HOST_CALLS):
        try:
            cap = call(fn)
            break
        except Exception as e:  # producers reject keywords with TypeError, ValueError, RuntimeError, BufferError
            first_err = first_err or e
    else:
        try:  # e.g. a tensor DLPack refuses but __cuda_array_interface__ describes
            cai = _get_cai(obj, name)
            if cai is not None:
                return _from_cai(obj, cai, name)
        except ArgumentError:
            pass
        raise ArgumentError(name, _Opaque(obj), f"a tensor whose __dlpack__ works (it raised {first_err!r})") from first_err
    if type(cap) is not _CapsuleType:
        raise ArgumentError(name, _Opaque(obj), f"__dlpack__() to return a PyCapsule, not {type(cap).__name__}")
    cname = _GetName(cap)
    if cname == _NAME_V:
        cname = _NAME_V
    elif cname == _NAME_L:
        cname = _NAME_L
    else:
        raise ArgumentError(name, _Opaque(obj), f"an unconsumed 'dltensor' or 'dltensor_versioned' capsule, got {cname!r}")
    base = _GetPointer(cap, cname)
    if not base:
        raise ArgumentError(name, _Opaque(obj), "a DLPack capsule with a non-NULL pointer")
    _conv[(type(obj), cuda)] = (idx, cname)
    return _parse(cap, base, cname is _NAME_V, obj, name)


# --------------------------------------------------------------------------- __cuda_array_interface__

_CAI_DTYPES: dict[str, str] = {"f2": "fp16", "f4": "fp32", "f8": "fp64", "i4": "int32", "i8": "int64", "i1": "int8", "u1": "uint8"}


def _get_cai(obj: Any, name: str) -> Any:
    """obj.__cuda_array_interface__, or None when there is none (AttributeError)."""
    try:
        return obj.__cuda_array_interface__
    except AttributeError:
        return None
    except Exception as e:  # e.g. torch: bfloat16 or requires_grad
        raise ArgumentError(name, _Opaque(obj), f"a readable __cuda_array_interface__ (it raised {e!r})") from e


def _from_cai(obj: Any, cai: Any, name: str) -> TensorArg:
    if not isinstance(cai, dict):
        raise ArgumentTypeError(name, _Opaque(obj), "a __cuda_array_interface__ that is a dict")
    try:
        typestr, shape_in, data = cai["typestr"], cai["shape"], cai["data"]
    except KeyError as e:
        raise ArgumentError(name, _Opaque(obj), f"a __cuda_array_interface__ with key {e.args[0]!r}") from None
    if cai.get("mask") is not None:
        raise ArgumentError(name, _Opaque(obj), "a __cuda_array_interface__ without a mask")
    dtype = _CAI_DTYPES.get(typestr[1:]) if type(typestr) is str and len(typestr) == 3 else None
    if dtype is not None and typestr[0] not in "<|=" and not (typestr[0] == ">" and typestr[2] == "1"):
        dtype = None  # big-endian multi-byte data
    if dtype is None:
        raise ArgumentTypeError(name, _show(typestr), f"a tensor of a supported dtype ({_DTYPE_LIST})")
    shape = _int_tuple(shape_in, f"{name}.__cuda_array_interface__['shape']")
    if any(s < 0 for s in shape):
        raise ArgumentError(name, shape, "a non-negative shape")
    if not isinstance(data, tuple) or len(data) != 2:
        raise ArgumentError(name, _show(data), "__cuda_array_interface__['data'] == (ptr, readonly)")
    ptr = 0 if data[0] is None else _int(data[0], f"{name}.__cuda_array_interface__['data'][0]")
    if not 0 <= ptr < _U64:
        raise ArgumentError(name, ptr, "a device address in [0, 2**64)")
    bstrides = cai.get("strides")
    if bstrides is None:
        strides = _contiguous_strides(shape)
    else:
        bstrides = _int_tuple(bstrides, f"{name}.__cuda_array_interface__['strides']")
        if len(bstrides) != len(shape):
            raise ArgumentError(name, bstrides, f"{len(shape)} byte strides (one per dimension of {shape})")
        size = DTYPES[dtype]
        if any(b % size for b in bstrides):
            raise ArgumentError(name, bstrides, f"byte strides that are multiples of the itemsize {size} of {dtype}")
        strides = tuple(b // size for b in bstrides)
    return TensorArg(ptr, shape, strides, dtype, ("cuda", -1), bool(data[1]))


# --------------------------------------------------------------------------- as_tensor


# torch tensors, read through their own attributes (no import of torch): several
# times cheaper than torch's __dlpack__, which matters on the per-call path.
_torch_types: dict[type, bool] = {}
_TORCH_DTYPE_NAMES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32",
                      "torch.float64": "fp64", "torch.int32": "int32", "torch.int64": "int64",
                      "torch.int8": "int8", "torch.uint8": "uint8", "torch.float8_e4m3fn": "fp8_e4m3"}
_torch_dtypes: dict[Any, str | None] = {}


def _is_torch_tensor_type(t: type) -> bool:
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in t.__mro__)


def _from_torch(obj: Any) -> TensorArg | None:
    """A torch tensor's record from data_ptr/shape/stride/dtype/device; None defers to DLPack (odd dtypes, errors)."""
    try:
        tdtype = obj.dtype
        dtype = _torch_dtypes.get(tdtype, False)
        if dtype is False:
            dtype = _torch_dtypes[tdtype] = _TORCH_DTYPE_NAMES.get(str(tdtype))
        if dtype is None or obj.is_sparse:
            return None
        dev = obj.device
        if dev.type == "cuda":
            device = ("cuda", -1 if dev.index is None else dev.index)
        elif dev.type == "cpu":
            device = ("cpu", 0)
        else:
            return None
        return _make(obj.data_ptr(), tuple(obj.shape), obj.stride(), dtype, device)
    except Exception:
        return None


def torch_layouts(*objs: Any) -> tuple | None:
    """(shape, stride, dtype, device) of each argument (None kept as None) when every other one is a
    torch tensor of a type as_tensor has seen; None otherwise. A plan that validated tensors with these
    layouts compares the next call's against them (about 0.4 us a tensor, as_tensor 1.4 us) and, when
    equal, needs only their pointers: every check it made depends on the layout alone."""
    out = []
    try:
        for o in objs:
            if o is None:
                out.append(None)
            elif _torch_types.get(type(o)):
                out.append((o.shape, o.stride(), o.dtype, o.device))  # stride() raises for sparse layouts
            else:
                return None
    except Exception:  # a tensor subclass whose attributes raise: the full path reports it
        return None
    return tuple(out)


def as_output(obj: Any, name: str) -> TensorArg:
    """as_tensor for a tensor a kernel writes: a read-only export is refused, naming `name`."""
    t = as_tensor(obj, name)
    if t.readonly:
        raise ArgumentError(name, "a read-only export", "a writable tensor (the kernel writes it)")
    return t


def as_tensor(obj: Any, name: str) -> TensorArg:
    """`obj` as a TensorArg: a TensorArg as is, else DLPack (preferred), else __cuda_array_interface__.

    Errors name the argument `name`: ArgumentTypeError for a non-tensor or an unsupported
    dtype, ArgumentError for a tensor that cannot be exported or described.
    """
    if type(obj) is TensorArg:
        return obj
    kind = _torch_types.get(type(obj))
    if kind is None:
        kind = _torch_types[type(obj)] = _is_torch_tensor_type(type(obj))
    if kind:
        got = _from_torch(obj)
        if got is not None:
            return got
    try:
        fn = getattr(obj, "__dlpack__", None)
    except Exception as e:  # a property that raises something other than AttributeError
        raise ArgumentError(name, _Opaque(obj), f"a tensor whose __dlpack__ can be read (it raised {e!r})") from e
    if fn is not None:
        # Fast path: the calling convention and capsule name this producer type used last time.
        try:
            cuda = obj.__dlpack_device__()[0] in _CUDA_LIKE
            idx, cname = _conv[(type(obj), cuda)]
            cap = (_CUDA_CALLS if cuda else _HOST_CALLS)[idx](fn)
            base = _GetPointer(cap, cname)
        except Exception:
            return _dlpack_slow(obj, fn, name)
        if base:
            return _parse(cap, base, cname is _NAME_V, obj, name)
        return _dlpack_slow(obj, fn, name)
    cai = _get_cai(obj, name)
    if cai is not None:
        return _from_cai(obj, cai, name)
    raise ArgumentTypeError(
        name, _show(obj), "a tensor: an object with __dlpack__ or __cuda_array_interface__, or an aotc TensorArg"
    )
