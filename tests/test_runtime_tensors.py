"""aotc.runtime.tensors: DLPack / __cuda_array_interface__ / explicit tensors and streams (CPU only)."""
from __future__ import annotations

import ast
import ctypes
import gc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aotc.common.errors import ArgumentError, ArgumentTypeError  # noqa: E402
from aotc.runtime import dlpack as T  # noqa: E402  (the DLPack calling-convention cache)
from aotc.runtime.tensors import DTYPES, TensorArg, as_stream, as_tensor, tensor  # noqa: E402

NP_DTYPES = {
    "fp16": np.float16,
    "fp32": np.float32,
    "fp64": np.float64,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "int8": np.int8,
}


def _expect(arr: np.ndarray) -> TensorArg:
    size = arr.itemsize
    assert all(s % size == 0 for s in arr.strides)
    return TensorArg(arr.ctypes.data, arr.shape, tuple(s // size for s in arr.strides), _name_of(arr.dtype), ("cpu", 0),
                     readonly=not arr.flags.writeable)  # numpy's DLPack 1.x export flags a read-only array


def _name_of(dt) -> str:
    return next(k for k, v in NP_DTYPES.items() if np.dtype(v) == dt)


# --------------------------------------------------------------------------- DTYPES / TensorArg


def test_dtypes_table():
    assert DTYPES == {"fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8, "int32": 4, "int64": 8, "uint8": 1, "int8": 1,
                      "fp8_e4m3": 1}


def test_tensorarg_is_frozen_slotted():
    t = tensor(0x1000, (2, 3), (3, 1), "fp32")
    assert t.itemsize == 4 and t.device == ("cuda", 0)
    with pytest.raises(AttributeError):
        t.ptr = 5  # type: ignore[misc]
    assert not hasattr(t, "__dict__")
    assert t == TensorArg(0x1000, (2, 3), (3, 1), "fp32", ("cuda", 0))
    assert hash(t) == hash(TensorArg(0x1000, (2, 3), (3, 1), "fp32", ("cuda", 0)))


@pytest.mark.parametrize(
    "shape,strides,dtype,span",
    [
        ((2, 3), (3, 1), "fp32", (0x1000, 0x1000 + 6 * 4)),
        ((), (), "fp64", (0x1000, 0x1008)),
        ((3, 0), (1, 1), "fp16", (0x1000, 0x1000)),  # empty
        ((4,), (0,), "fp16", (0x1000, 0x1002)),  # broadcast
        ((4,), (-1,), "int8", (0x1000 - 3, 0x1001)),  # negative stride
        ((2, 2), (-4, 1), "fp32", (0x1000 - 16, 0x1000 + 8)),
        ((2,), (2**32,), "uint8", (0x1000, 0x1000 + 2**32 + 1)),
    ],
)
def test_nbytes_span(shape, strides, dtype, span):
    assert TensorArg(0x1000, shape, strides, dtype, ("cuda", 0)).nbytes_span() == span


# --------------------------------------------------------------------------- tensor()


def test_tensor_explicit_records():
    t = tensor(0xDEAD0000, [4, 5], [5, 1], "bf16", device=1)
    assert t == TensorArg(0xDEAD0000, (4, 5), (5, 1), "bf16", ("cuda", 1))
    assert type(t.shape) is tuple and type(t.strides) is tuple
    big = tensor(2**40, (2, 3), (2**33, 2**31 + 7), "fp16")
    assert big.strides == (2**33, 2**31 + 7)
    assert tensor(0, (0,), (1,), "int8").nbytes_span() == (0, 0)
    assert tensor(16, (), (), "fp64").shape == ()
    assert tensor(np.int64(64), (np.int64(2),), (np.int32(1),), "fp32", np.int32(0)).ptr == 64  # __index__ ints
    assert tensor(64, (2, 2), (0, -1), "fp32").strides == (0, -1)


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        (dict(ptr=True), ArgumentTypeError, "ptr"),
        (dict(ptr=1.0), ArgumentTypeError, "ptr"),
        (dict(ptr=-1), ArgumentError, "ptr"),
        (dict(ptr=2**64), ArgumentError, "ptr"),
        (dict(shape=(2, -1)), ArgumentError, "shape[1]"),
        (dict(shape=(2, True), strides=(1, 1)), ArgumentTypeError, "shape[1]"),
        (dict(shape=5), ArgumentTypeError, "shape"),
        (dict(shape="ab"), ArgumentTypeError, "shape"),
        (dict(strides=(1,)), ArgumentError, "strides"),
        (dict(strides=(1, 2, 3)), ArgumentError, "strides"),
        (dict(strides=(1, 1.5)), ArgumentTypeError, "strides[1]"),
        (dict(strides=(2**63, 1)), ArgumentError, "strides[0]"),
        (dict(dtype="float16"), ArgumentError, "dtype"),
        (dict(dtype=np.float16), ArgumentTypeError, "dtype"),
        (dict(device=-1), ArgumentError, "device"),
        (dict(device=True), ArgumentTypeError, "device"),
        (dict(device="cuda:0"), ArgumentTypeError, "device"),
    ],
)
def test_tensor_rejects(kwargs, exc, name):
    args = dict(ptr=0x1000, shape=(2, 3), strides=(3, 1), dtype="fp32", device=0) | kwargs
    with pytest.raises(exc) as ei:
        tensor(**args)
    assert isinstance(ei.value, ValueError)
    assert ei.value.name == name and repr(name) in str(ei.value)
    if exc is ArgumentTypeError:
        assert isinstance(ei.value, TypeError)


# --------------------------------------------------------------------------- numpy via DLPack


@pytest.mark.parametrize("dtype", sorted(NP_DTYPES))
def test_numpy_every_dtype_contiguous(dtype):
    arr = np.arange(24).astype(NP_DTYPES[dtype]).reshape(2, 3, 4)
    t = as_tensor(arr, "x")
    assert t == _expect(arr)
    assert t.dtype == dtype and t.itemsize == arr.itemsize and t.device == ("cpu", 0)
    assert t.strides == (12, 4, 1)
    assert t.nbytes_span() == (arr.ctypes.data, arr.ctypes.data + arr.nbytes)


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.T,
        lambda a: a[:, ::2],
        lambda a: a[::-1],
        lambda a: a[1:, 3:],
        lambda a: a.transpose(1, 0)[2:, ::-3],
        lambda a: np.broadcast_to(a[0], (5, 8)),  # zero stride, read-only
        lambda a: a[2:3, 5],  # 1 element
    ],
)
def test_numpy_views(view):
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    arr = view(base)
    t = as_tensor(arr, "x")
    assert t == _expect(arr)
    lo, hi = np.lib.array_utils.byte_bounds(arr) if hasattr(np.lib, "array_utils") else np.byte_bounds(arr)
    assert t.nbytes_span() == (lo, hi)


def test_a_read_only_export_is_refused_where_a_kernel_writes():
    """A read-only numpy view (DLPack's READ_ONLY flag) and a __cuda_array_interface__ marked readonly are
    read as inputs, and refused as outputs (as_output), naming the argument."""
    from aotc.runtime.tensors import as_output

    view = np.broadcast_to(np.zeros(8, dtype=np.float32), (5, 8))
    assert as_tensor(view, "q").readonly
    with pytest.raises(ArgumentError, match="argument 'out': got 'a read-only export', expected a writable tensor"):
        as_output(view, "out")
    assert not as_output(np.zeros((5, 8), dtype=np.float32), "out").readonly

    class Cai:
        def __init__(self, readonly):
            self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (1 << 20, readonly),
                                             "version": 3}

    assert not as_output(Cai(False), "lse").readonly
    with pytest.raises(ArgumentError, match="argument 'lse'"):
        as_output(Cai(True), "lse")


def test_numpy_byte_offset_mid_buffer():
    buf = np.arange(100, dtype=np.int64)
    sl = buf[37:]
    t = as_tensor(sl, "x")
    assert t.ptr == sl.ctypes.data == buf.ctypes.data + 37 * 8
    raw = np.frombuffer(bytearray(64), dtype=np.uint8)[3:]  # odd address
    assert as_tensor(raw, "x").ptr == raw.ctypes.data


def test_numpy_zero_dim_and_empty():
    z = np.array(2.5, dtype=np.float64)
    t = as_tensor(z, "x")
    assert t.shape == () and t.strides == () and t.ptr == z.ctypes.data
    assert t.nbytes_span() == (z.ctypes.data, z.ctypes.data + 8)
    e = np.zeros((3, 0, 2), dtype=np.float16)
    te = as_tensor(e, "x")
    assert te.shape == (3, 0, 2) and len(te.strides) == 3 and te.dtype == "fp16"
    assert te.nbytes_span() == (te.ptr, te.ptr)


def test_numpy_repeated_calls_use_cache_and_do_not_leak():
    arr = np.ones((4, 4), dtype=np.float32)
    first = as_tensor(arr, "x")
    before = sys.getrefcount(arr)
    for _ in range(1000):
        assert as_tensor(arr, "x") == first
    gc.collect()
    assert sys.getrefcount(arr) == before  # every capsule's deleter ran (numpy's export holds a ref)
    assert T._conv[(np.ndarray, False)][0] == 0  # the max_version call is remembered


def test_tensorarg_passes_through():
    t = tensor(64, (1,), (1,), "fp32")
    assert as_tensor(t, "x") is t


@pytest.mark.parametrize("dtype,shown", [(np.complex64, "complex64"), (np.bool_, "bool8"), (np.uint16, "uint16")])
def test_numpy_unsupported_dtype(dtype, shown):
    with pytest.raises(ArgumentTypeError) as ei:
        as_tensor(np.zeros(3, dtype=dtype), "q_scale")
    assert "'q_scale'" in str(ei.value) and shown in str(ei.value)


@pytest.mark.parametrize("bad", [[1, 2, 3], "tensor", None, 3, b"xx", object()])
def test_non_tensors_rejected(bad):
    with pytest.raises(ArgumentTypeError) as ei:
        as_tensor(bad, "query")
    assert ei.value.name == "query" and "'query'" in str(ei.value)


def test_dlpack_raising_is_argument_error():
    class Broken:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, *a, **k):
            raise RuntimeError("nope")

    with pytest.raises(ArgumentError) as ei:
        as_tensor(Broken(), "key")
    assert "'key'" in str(ei.value) and "nope" in str(ei.value)
    assert isinstance(ei.value.__cause__, RuntimeError)

    class BrokenDevice:
        def __dlpack_device__(self):
            raise RuntimeError("no device")

        def __dlpack__(self, *a, **k):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(ArgumentError, match="'value'"):
        as_tensor(BrokenDevice(), "value")

    class NotCapsule:
        def __dlpack__(self, *a, **k):
            return 42

    with pytest.raises(ArgumentError, match="PyCapsule"):
        as_tensor(NotCapsule(), "out")


def test_error_message_does_not_repr_the_tensor():
    class Loud:
        def __repr__(self):  # a GPU tensor's repr would copy to the host
            raise AssertionError("repr called")

        def __dlpack__(self, *a, **k):
            raise RuntimeError("x")

    with pytest.raises(ArgumentError) as ei:
        as_tensor(Loud(), "x")
    assert "Loud" in str(ei.value)


# --------------------------------------------------------------------------- fake DLPack producers (ctypes)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


assert ctypes.sizeof(DLTensor) == 48 and ctypes.sizeof(DLManagedTensorVersioned) == 80

_NAMES = {True: b"dltensor_versioned", False: b"dltensor"}  # outlive every capsule (PyCapsule keeps char*)
_CapsuleNew = ctypes.pythonapi.PyCapsule_New
_CapsuleNew.restype = ctypes.py_object
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CapsuleNew.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CAPSULE_DESTRUCTOR]
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_GetNameObj = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))


@CAPSULE_DESTRUCTOR
def _capsule_destructor(cap):
    # What torch/numpy/CuPy do: an unconsumed capsule calls the managed tensor's deleter.
    for name in _NAMES.values():
        if _IsValidRaw(cap, name):
            p = _GetPointerRaw(cap, name)
            managed = (DLManagedTensorVersioned if name == _NAMES[True] else DLManagedTensor).from_address(p)
            managed.deleter(p)
            return


# Managed tensors live here until their deleter runs, whatever happens to their producer (a
# capsule can outlive it, e.g. held by a traceback frame): like malloc'ed DLManagedTensors.
_LIVE: dict[int, tuple] = {}


@DELETER
def _deleter(addr):
    _m, _shape, _strides, deleted = _LIVE.pop(addr)
    deleted.append(addr)


class FakeProducer:
    """A CUDA (by default) DLPack producer built with ctypes; counts deleter calls."""

    def __init__(
        self,
        shape=(2, 3),
        strides=(3, 1),
        dtype=(2, 32, 1),
        device=(2, 0),
        data=0x7F00_0000_1000,
        byte_offset=0,
        versioned=True,
        flags=0,
        version=(1, 0),
        keep_capsule=False,
    ):
        self.shape, self.strides, self.dtype, self.device = shape, strides, dtype, device
        self.data, self.byte_offset, self.versioned, self.flags, self.version = data, byte_offset, versioned, flags, version
        self.keep_capsule = keep_capsule
        self.calls: list[dict] = []
        self.deleted: list[int] = []
        self.capsules: list = []

    @property
    def live(self) -> list[int]:
        return [a for a, v in _LIVE.items() if v[3] is self.deleted]

    def __dlpack_device__(self):
        return self.device

    def _capsule(self, versioned):
        n = len(self.shape)
        shape = (ctypes.c_int64 * max(n, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(n, 1))(*(self.strides or ()))
        m = (DLManagedTensorVersioned if versioned else DLManagedTensor)()
        t = m.dl_tensor
        t.data = self.data
        t.device = DLDevice(*self.device)
        t.ndim = n
        t.dtype = DLDataType(*self.dtype)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if self.strides is not None else None
        t.byte_offset = self.byte_offset
        m.deleter = _deleter
        if versioned:
            m.version = DLPackVersion(*self.version)
            m.flags = self.flags
        addr = ctypes.addressof(m)
        _LIVE[addr] = (m, shape, strides, self.deleted)
        cap = _CapsuleNew(addr, _NAMES[versioned], _capsule_destructor)
        if self.keep_capsule:
            self.capsules.append(cap)
        return cap

    def __dlpack__(self, stream=None, max_version=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return self._capsule(self.versioned and max_version is not None and max_version >= (1, 0))


class FakeVersioned(FakeProducer):
    pass


class FakeLegacy(FakeProducer):
    def __init__(self, **kw):
        super().__init__(versioned=False, **kw)


def test_fake_versioned_cuda_producer():
    p = FakeVersioned(device=(2, 3), data=0x7F00_0000_1000, byte_offset=0x40)
    t = as_tensor(p, "x")
    assert t == TensorArg(0x7F00_0000_1040, (2, 3), (3, 1), "fp32", ("cuda", 3))
    assert p.calls == [{"stream": -1, "max_version": (1, 0)}]
    gc.collect()
    assert len(p.deleted) == 1 and not p.live
    assert as_tensor(p, "x") == t  # fast path (remembered convention)
    gc.collect()
    assert len(p.deleted) == 2 and len(p.calls) == 2


def test_fake_legacy_capsule_despite_max_version():
    p = FakeLegacy(shape=(4,), strides=(2,), dtype=(4, 16, 1), device=(2, 1))
    t = as_tensor(p, "x")
    assert t == TensorArg(p.data, (4,), (2,), "bf16", ("cuda", 1))
    assert as_tensor(p, "x") == t
    gc.collect()
    assert len(p.deleted) == 2 and not p.live


def test_capsule_left_unconsumed_and_deleter_runs_once_after_gc():
    for cls in (FakeVersioned, FakeLegacy):
        p = cls(keep_capsule=True)
        as_tensor(p, "x")
        gc.collect()
        assert p.deleted == []  # the producer still holds the capsule
        (cap,) = p.capsules
        assert _GetNameObj(cap) == _NAMES[cls is FakeVersioned]  # not renamed to used_dltensor*
        p.capsules.clear()
        del cap
        gc.collect()
        assert len(p.deleted) == 1
        gc.collect()
        assert len(p.deleted) == 1


def test_fake_null_strides_means_contiguous():
    p = FakeVersioned(shape=(2, 3, 4), strides=None)
    assert as_tensor(p, "x").strides == (12, 4, 1)
    p1 = FakeLegacy(shape=(5,), strides=None)
    assert as_tensor(p1, "x").strides == (1,)


def test_fake_zero_dim_and_large_strides():
    assert as_tensor(FakeVersioned(shape=(), strides=()), "x").shape == ()
    t = as_tensor(FakeVersioned(shape=(2, 2), strides=(2**33, -(2**31) - 1)), "x")
    assert t.strides == (2**33, -(2**31) - 1)


@pytest.mark.parametrize(
    "dtype,name",
    [((2, 16, 1), "fp16"), ((4, 16, 1), "bf16"), ((2, 32, 1), "fp32"), ((2, 64, 1), "fp64"), ((0, 32, 1), "int32"),
     ((0, 64, 1), "int64"), ((0, 8, 1), "int8"), ((1, 8, 1), "uint8")],
)
def test_fake_every_dtype(dtype, name):
    assert as_tensor(FakeVersioned(dtype=dtype), "x").dtype == name


@pytest.mark.parametrize("dtype,shown", [((2, 32, 4), "float32x4"), ((5, 64, 1), "complex64"), ((2, 8, 1), "float8")])
def test_fake_unsupported_dtypes(dtype, shown):
    with pytest.raises(ArgumentTypeError) as ei:
        as_tensor(FakeVersioned(dtype=dtype), "scale")
    assert "'scale'" in str(ei.value) and shown in str(ei.value)


def test_fake_devices():
    assert as_tensor(FakeVersioned(device=(13, 2)), "x").device == ("cuda", 2)  # managed memory
    assert as_tensor(FakeVersioned(device=(1, 0)), "x").device == ("cpu", 0)
    assert as_tensor(FakeVersioned(device=(3, 0)), "x").device == ("other", 3)  # pinned host


def test_fake_copied_and_future_major_rejected():
    with pytest.raises(ArgumentError, match="zero-copy"):
        as_tensor(FakeVersioned(flags=2), "x")
    assert as_tensor(FakeVersioned(flags=1), "x").dtype == "fp32"  # read-only is accepted
    with pytest.raises(ArgumentError, match="version 2.0"):
        as_tensor(FakeVersioned(version=(2, 0)), "x")


def test_host_producers_get_no_stream():
    p = FakeVersioned(device=(1, 0))
    as_tensor(p, "x")
    assert p.calls == [{"stream": None, "max_version": (1, 0)}]


def test_producer_without_max_version_keyword():
    class OldTorchLike(FakeLegacy):
        def __dlpack__(self, stream=None):  # no max_version keyword
            return super().__dlpack__(stream=stream)

    p = OldTorchLike()
    assert as_tensor(p, "x").device == ("cuda", 0)
    assert p.calls == [{"stream": -1, "max_version": None}]
    assert as_tensor(p, "x").dtype == "fp32"
    assert len(p.calls) == 2  # second call goes straight to the convention that worked
    assert T._conv[(OldTorchLike, True)] == (1, b"dltensor")


def test_producer_rejecting_stream_minus_one():
    class NoMinusOne(FakeProducer):
        def __dlpack__(self, stream=None, max_version=None):
            if stream == -1:
                raise ValueError("stream -1 unsupported")
            return super().__dlpack__(stream=stream, max_version=max_version)

    p = NoMinusOne()
    assert as_tensor(p, "x").shape == (2, 3)
    assert p.calls == [{"stream": None, "max_version": (1, 0)}]

    class Bare(FakeProducer):
        def __dlpack__(self):
            return super().__dlpack__()

    b = Bare()
    assert as_tensor(b, "x").shape == (2, 3)
    assert b.calls == [{"stream": None, "max_version": None}]
    gc.collect()
    assert len(b.deleted) == 1


def test_dlpack_preferred_over_cai():
    class Both(FakeVersioned):
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (1, False), "version": 3}

    assert as_tensor(Both(data=0x5000), "x").ptr == 0x5000


def test_cai_used_when_dlpack_fails():
    class Both:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0x6000, False), "version": 3}

        def __dlpack__(self, *a, **k):
            raise BufferError("cannot export")

    assert as_tensor(Both(), "x") == TensorArg(0x6000, (3,), (1,), "fp32", ("cuda", -1))


# --------------------------------------------------------------------------- __cuda_array_interface__


class CAI:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = {"version": 3, "stream": None, **cai}


@pytest.mark.parametrize("typestr,dtype", [("<f2", "fp16"), ("<f4", "fp32"), ("<i4", "int32"), ("<f8", "fp64"),
                                           ("<i8", "int64"), ("|u1", "uint8"), ("|i1", "int8")])
def test_cai_contiguous(typestr, dtype):
    t = as_tensor(CAI(shape=(2, 3, 4), typestr=typestr, data=(0x7000, False), strides=None), "x")
    assert t == TensorArg(0x7000, (2, 3, 4), (12, 4, 1), dtype, ("cuda", -1))


def test_cai_explicit_byte_strides_and_no_strides_key():
    t = as_tensor(CAI(shape=(3, 4), typestr="<f2", data=(0x8000, True), strides=(2, 6)), "x")
    assert t.strides == (1, 3) and t.dtype == "fp16"
    t = as_tensor(CAI(shape=(3, 4), typestr="<i4", data=(0x8000, False), strides=(0, -16)), "x")
    assert t.strides == (0, -4)
    legacy = CAI(shape=(5,), typestr="<f4", data=(0x8000, False), version=1)
    assert as_tensor(legacy, "x").strides == (1,)
    assert as_tensor(CAI(shape=(), typestr="<f4", data=(0x8000, False)), "x").shape == ()
    assert as_tensor(CAI(shape=(0, 2), typestr="<f4", data=(0, False)), "x").nbytes_span() == (0, 0)


@pytest.mark.parametrize(
    "cai,exc,fragment",
    [
        (dict(shape=(3, 4), typestr="<f4", data=(0x8000, False), strides=(4, 6)), ArgumentError, "multiples"),
        (dict(shape=(3, 4), typestr="<f2", data=(0x8000, False), strides=(3, 1)), ArgumentError, "multiples"),
        (dict(shape=(3, 4), typestr="<f4", data=(0x8000, False), strides=(4,)), ArgumentError, "strides"),
        (dict(shape=(3,), typestr="<c8", data=(0x8000, False)), ArgumentTypeError, "<c8"),
        (dict(shape=(3,), typestr=">f4", data=(0x8000, False)), ArgumentTypeError, ">f4"),
        (dict(shape=(3,), typestr="<f4", data=(0x8000, False), mask=object()), ArgumentError, "mask"),
        (dict(shape=(-3,), typestr="<f4", data=(0x8000, False)), ArgumentError, "non-negative"),
        (dict(typestr="<f4", data=(0x8000, False)), ArgumentError, "shape"),
        (dict(shape=(3,), typestr="<f4", data=0x8000), ArgumentError, "data"),
    ],
)
def test_cai_rejects(cai, exc, fragment):
    with pytest.raises(exc) as ei:
        as_tensor(CAI(**cai), "lse")
    assert "'lse'" in str(ei.value) and fragment in str(ei.value)


def test_cai_property_raising():
    class Raises:
        @property
        def __cuda_array_interface__(self):
            raise TypeError("bfloat16 not supported")

    with pytest.raises(ArgumentError, match="bfloat16"):
        as_tensor(Raises(), "x")


# --------------------------------------------------------------------------- as_stream


def test_as_stream_accepted():
    class CudaStreamProto:
        def __cuda_stream__(self):
            return (0, 0xABC)

    class TorchLike:
        cuda_stream = 0xDEF

    class CupyLike:
        ptr = 0x123

    class CupyNull:
        ptr = 0

    assert as_stream(None) == 0
    assert as_stream(0) == 0
    assert as_stream(2) == 2  # CU_STREAM_PER_THREAD
    assert as_stream(2**63 + 5) == 2**63 + 5
    assert as_stream(np.uint64(77)) == 77
    assert as_stream(CudaStreamProto()) == 0xABC
    assert as_stream(TorchLike()) == 0xDEF
    assert as_stream(CupyLike()) == 0x123
    assert as_stream(CupyNull()) == 0


def test_as_stream_cuda_bindings_handle():
    driver = pytest.importorskip("cuda.bindings.driver")
    s = driver.CUstream(0x4242)
    assert as_stream(s) == 0x4242  # int(), not getPtr() (the address of the handle's storage)

    class CoreLike:
        def __cuda_stream__(self):
            return (0, s)

    assert as_stream(CoreLike()) == 0x4242


@pytest.mark.parametrize("bad", [True, 1.5, "0", object(), [0], -1, 2**64])
def test_as_stream_rejects(bad):
    with pytest.raises(ArgumentError) as ei:
        as_stream(bad)
    assert ei.value.name == "stream" and "'stream'" in str(ei.value)


def test_as_stream_bad_protocols():
    class WrongVersion:
        def __cuda_stream__(self):
            return (1, 5)

    class NotTuple:
        def __cuda_stream__(self):
            return 5

    class FloatHandle:
        cuda_stream = 1.0

    for bad in (WrongVersion(), NotTuple(), FloatHandle()):
        with pytest.raises(ArgumentError, match="'stream'"):
            as_stream(bad)


# --------------------------------------------------------------------------- import hygiene


@pytest.mark.parametrize("module,sibling", [("tensors", "dlpack"), ("dlpack", "tensors")])
def test_module_imports_only_stdlib(module, sibling):
    """The tensor adapter (tensors.py and dlpack.py) imports the standard library, aotc.common.errors and
    its other half, nothing else."""
    tree = ast.parse((ROOT / "aotc" / "runtime" / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    imported.discard("__future__")
    assert "aotc" in imported  # aotc.common.errors
    imported.discard("aotc")
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names
    aotc_imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0
                    and n.module.startswith("aotc")}
    assert aotc_imports == {"aotc.common.errors"}
    relative = {(n.level, n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
    assert relative == {(1, sibling)}, relative


def test_import_leaves_heavy_modules_out():
    for init in (ROOT / "aotc" / "__init__.py", ROOT / "aotc" / "runtime" / "__init__.py"):
        if not init.exists():
            pytest.skip(f"{init.relative_to(ROOT)} does not exist yet: aotc.runtime.tensors is not importable as a package")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import aotc.runtime.tensors; "
        "print(sorted(m for m in ('numpy', 'torch', 'cutlass') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
