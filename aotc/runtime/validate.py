"""Argument checks shared by every family's API. Each raises ArgumentError naming the argument,
the value and what was expected, before anything launches."""
from __future__ import annotations

import math
import operator

from ..common.errors import ArgumentError
from .tensors import TensorArg

INT32_MAX = (1 << 31) - 1
FLT_MIN, FLT_MAX = 1.1754943508222875e-38, 3.4028234663852886e38  # float32's normal range (kernel f32 scalars)


def f32_normal(value: float) -> bool:
    """Whether a positive float keeps its value as a float32 kernel parameter (neither 0 nor inf there)."""
    return FLT_MIN <= value <= FLT_MAX


def softmax_scale(value, head_dim: int) -> float:
    """The softmax scale a kernel gets: 1 / sqrt(head_dim) for None, else a positive float within float32's
    normal range (1e39 would reach the kernel as inf)."""
    if value is None:
        return 1.0 / math.sqrt(head_dim)
    return softmax_scale_value(value)


def softmax_scale_value(value) -> float:
    """A caller's softmax scale (not None), checked: softmax_scale() without the default."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0
            or not f32_normal(value)):
        raise ArgumentError("softmax_scale", value, f"a finite positive float within float32's normal range "
                                                    f"[{FLT_MIN:.3g}, {FLT_MAX:.3g}]")
    return float(value)


def key_scalars(**scalars) -> None:
    """Scalar arguments a one-call path hashes into its plan key, each hashable (a list or an array would raise
    a bare TypeError in the plan cache; their values are checked when the plan is made)."""
    try:
        hash(tuple(scalars.values()))
        return
    except TypeError:
        pass
    for name, value in scalars.items():
        try:
            hash(value)
        except TypeError:
            raise ArgumentError(name, value, f"a scalar (None, a bool, an int, a float or a str), not a "
                                             f"{type(value).__name__}") from None


def as_ints(*values) -> tuple:
    """Integers of other types (numpy's int64 from an engine's metadata: anything with __index__) as Python ints, the
    rest as they are, for the checks to judge (bool stays bool, refused where an int is asked for; numpy's bool has no
    __index__). The kernels' 32-bit parameters and the plan keys then see plain ints."""
    if all(v is None or type(v) is int for v in values):  # the common case: 0.37 us for five (2-core build machine)
        return values
    return tuple(v if v is None or isinstance(v, (int, float, str)) else _index_or_self(v) for v in values)


def _index_or_self(value):
    try:
        return operator.index(value)
    except TypeError:
        return value


def typed(*values) -> tuple:
    """Scalars as a plan-cache key with their types: True (refused where an int or a float is asked for) never finds
    the plan of 1, nor 1 that of 1.0 (equal values hash alike)."""
    return tuple((type(v).__name__, v) for v in values)


def kv_layout(value) -> None:
    """A paged pool's layout name."""
    if not isinstance(value, str) or value not in ("NHD", "HND"):
        raise ArgumentError("kv_layout", value, "'NHD' ([pages, page_size, H_kv, D]) or 'HND' ([pages, H_kv, "
                                                "page_size, D])")


def dtype(t: TensorArg, name: str, allowed: tuple[str, ...]) -> None:
    if t.dtype not in allowed:
        raise ArgumentError(f"{name}.dtype", t.dtype, " or ".join(allowed))


def ndim(t: TensorArg, name: str, n: int, dims: str) -> None:
    if len(t.shape) != n:
        raise ArgumentError(f"{name}.shape", t.shape, f"{n} dimensions [{dims}]")
    if any(e < 0 for e in t.shape):  # a TensorArg built by hand is not validated
        raise ArgumentError(f"{name}.shape", t.shape, "non-negative extents")


def dim(t: TensorArg, name: str, axis: int, axis_name: str, expected: int, why: str) -> None:
    if t.shape[axis] != expected:
        raise ArgumentError(f"{name}.shape[{axis}]", t.shape[axis], f"{axis_name} = {expected} ({why})")


def int32_extent(value: int, name: str) -> None:
    if value > INT32_MAX:
        raise ArgumentError(name, value, f"at most {INT32_MAX} (kernels take 32-bit extents)")


def int32_vector(t: TensorArg, name: str, dims: str) -> None:
    """A contiguous 1-D int32 device vector (lengths, cu_seqlens), 4-byte aligned."""
    dtype(t, name, ("int32",))
    ndim(t, name, 1, dims)
    if t.shape[0] > 1 and t.strides[0] != 1:
        raise ArgumentError(f"{name}.stride[0]", t.strides[0], "1 (contiguous)")
    aligned(t, name, 4)


def optional_count(value, name: str, what: str) -> None:
    """None, or an int >= 0 (not a bool): a host-side bound such as max_seqlen_q."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ArgumentError(name, value, f"None or an int >= 0: {what}")


def int_in(value, name: str, lo: int, hi: int, what: str) -> None:
    """An int in [lo, hi] (not a bool)."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ArgumentError(name, value, f"an int in [{lo}, {hi}]{what}")


def cuda_device(tensors: dict[str, TensorArg], device: int) -> None:
    """Every tensor on `device` (CAI producers report ordinal -1, unknown: accepted)."""
    for name, t in tensors.items():
        kind, ordinal = t.device
        if kind != "cuda" or (ordinal not in (device, -1)):
            raise ArgumentError(f"{name}.device", t.device, f"('cuda', {device}), the current device")


def aligned(t: TensorArg, name: str, alignment: int) -> None:
    if t.ptr % alignment:
        raise ArgumentError(f"{name}.data_ptr", hex(t.ptr), f"a multiple of {alignment} bytes")


def stride_multiple(t: TensorArg, name: str, axes: range | tuple[int, ...], multiple: int) -> None:
    for a in axes:
        if t.shape[a] > 1 and t.strides[a] % multiple:
            raise ArgumentError(f"{name}.stride[{a}]", t.strides[a], f"a multiple of {multiple} elements")


def unit_stride(t: TensorArg, name: str, axis: int) -> None:
    if t.shape[axis] > 1 and t.strides[axis] != 1:
        raise ArgumentError(f"{name}.stride[{axis}]", t.strides[axis], "1 (the head dimension must be contiguous)")


def no_self_overlap(t: TensorArg, name: str) -> None:
    """An output must give every element its own address. Accepted: layouts that nest, i.e. taken in order
    of |stride|, each dimension (extent > 1) steps past the farthest offset the dimensions before it reach,
    as every view of one dense buffer does (stepped slices, flips, permutations). Refused, naming the first
    dimension that does not: a zero stride, two dims with one |stride|, rows that overlap (head stride 8
    with D = 128). A few interleavings whose elements happen not to collide are refused too: the check
    stays O(ndim log ndim) whatever the extents."""
    if any(n == 0 for n in t.shape):
        return
    reach = 0
    for step, n, axis in sorted((abs(s), n, axis) for axis, (n, s) in enumerate(zip(t.shape, t.strides)) if n > 1):
        if step <= reach:
            raise ArgumentError(f"{name}.stride[{axis}]", t.strides[axis],
                                f"a distinct address per element: |stride| above {reach}, the farthest offset the "
                                "dims with smaller strides reach (an output cannot be a broadcast or overlap itself)")
        reach += step * (n - 1)


def packed_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def is_packed(t: TensorArg) -> bool:
    """Row-major contiguous, ignoring the strides of extent-1 dimensions (as torch's is_contiguous does).

    An empty tensor is packed: no element is addressed, whatever its strides say."""
    if 0 in t.shape:
        return True
    return all(n <= 1 or s == p for n, s, p in zip(t.shape, t.strides, packed_strides(t.shape)))


def no_overlap(outputs: dict[str, TensorArg], others: dict[str, TensorArg]) -> None:
    """No output may share bytes with any other argument (outputs with each other too)."""
    items = list(outputs.items())
    every = items + list(others.items())
    for i, (oname, o) in enumerate(items):
        lo, hi = o.nbytes_span()
        if lo == hi:
            continue
        for name, t in every:
            if name == oname:
                continue
            tlo, thi = t.nbytes_span()
            if tlo < thi and tlo < hi and lo < thi:  # an empty tensor overlaps nothing
                raise ArgumentError(oname, f"bytes [{lo:#x}, {hi:#x})",
                                    f"memory not overlapping {name} (bytes [{tlo:#x}, {thi:#x}))")


def outputs_apart(a: TensorArg, a_name: str, b: TensorArg, b_name: str) -> None:
    """Two outputs share no byte. Two of one shape, strides and dtype whose hulls meet (K and V pools
    interleaved in one buffer: kv[:, 0] and kv[:, 1] of [pages, 2, page_size, H, D]) are compared element by
    element: b's offset from a must not be a difference of two of a's element offsets, decided dimension by
    dimension for layouts that nest (each must have passed no_self_overlap). Any other pair whose hulls meet
    is refused."""
    lo, hi = a.nbytes_span()
    blo, bhi = b.nbytes_span()
    if lo == hi or blo == bhi or hi <= blo or bhi <= lo:
        return
    if (a.shape, a.strides, a.dtype) == (b.shape, b.strides, b.dtype):
        dims = sorted((abs(st), n) for n, st in zip(a.shape, a.strides) if n > 1)
        step, size = divmod(a.ptr - b.ptr, a.itemsize)  # b.ptr + i * itemsize overlaps a.ptr + j * itemsize
        if not any(_reachable(e, dims) for e in ((step, step + 1) if size else (step,))):
            return
    raise ArgumentError(b_name, f"bytes [{blo:#x}, {bhi:#x})",
                        f"memory not overlapping {a_name} (bytes [{lo:#x}, {hi:#x}))")


def _reachable(target: int, dims: list[tuple[int, int]]) -> bool:
    """Whether target = sum of c * stride over dims (stride, extent) with |c| < extent; dims sorted by stride,
    each stride above the reach of the ones before it (so at most two c per dimension can work)."""
    if not dims:
        return target == 0
    *rest, (stride, n) = dims
    reach = sum(st * (m - 1) for st, m in rest)
    first, last = max(1 - n, -((reach - target) // stride)), min(n - 1, (target + reach) // stride)
    return any(_reachable(target - c * stride, rest) for c in range(first, last + 1))


def lse_output(ls: TensorArg, dims: tuple[tuple[str, int], ...], why: str, name: str = "lse") -> None:
    """The optional LSE output of every family: fp32, the given (axis name, extent) dims, 4-byte aligned,
    one address per element."""
    dtype(ls, name, ("fp32",))
    ndim(ls, name, len(dims), ", ".join(n for n, _ in dims))
    for axis, (axis_name, n) in enumerate(dims):
        dim(ls, name, axis, axis_name, n, why)
    aligned(ls, name, 4)
    no_self_overlap(ls, name)


LAYOUT_FIELDS = ("shape", "strides", "dtype", "device")


def layouts_of(tensors: dict[str, TensorArg | None]) -> dict[str, tuple | None]:
    """Each tensor's (shape, strides, dtype, device), as a plan keeps them to check its steps' tensors."""
    return {name: None if t is None else tuple(getattr(t, f) for f in LAYOUT_FIELDS) for name, t in tensors.items()}


def same_layouts(tensors: dict[str, TensorArg | None], prepared: dict[str, tuple | None]) -> None:
    """A plan's step: each tensor laid out, typed and placed as the prepared one (layouts_of), else an
    ArgumentError naming the first field that differs and the prepared value."""
    for name, got in layouts_of(tensors).items():
        want = prepared[name]
        if (got is None) != (want is None):
            raise ArgumentError(name, "None" if got is None else "a tensor",
                                f"{'None' if want is None else 'a tensor'}, as the plan was prepared")
        for field, g, w in zip(LAYOUT_FIELDS, got or (), want or ()):
            if g != w:
                raise ArgumentError(f"{name}.{field}", g, f"{w}, as the plan was prepared")


def _spans_of(tensors: dict[str, TensorArg | None]) -> tuple:
    """(lo, hi, name) of each present, non-empty tensor's bytes."""
    return tuple((*t.nbytes_span(), name) for name, t in tensors.items()
                 if t is not None and t.nbytes_span()[0] != t.nbytes_span()[1])


def span_offsets(t: TensorArg | None) -> tuple[int, int] | None:
    """[lo, hi) of a tensor's bytes relative to its pointer (fixed by shape, strides and dtype); None when
    absent or empty."""
    if t is None:
        return None
    lo, hi = t.nbytes_span()
    return None if lo == hi else (lo - t.ptr, hi - t.ptr)


class Spans:
    """Overlap checks of a plan's per-call outputs: its fixed inputs' byte ranges are known when it is
    prepared, and every per-call tensor's range is its new pointer plus offsets its fixed layout gives, so
    a call costs a few integer comparisons (check_pointers, with pointers in the order given here).
    written: fixed memory the kernel writes besides the outputs (a split workspace), which the per-call
    inputs must not overlap either (the outputs are kept from it as from every fixed input)."""

    def __init__(self, fixed: dict[str, TensorArg | None], outputs: dict[str, TensorArg | None],
                 inputs: dict[str, TensorArg | None], written: dict[str, TensorArg | None] | None = None):
        self.fixed = _spans_of({**fixed, **(written or {})})
        self.written = _spans_of(written or {})
        # the fixed inputs' hull: an output wholly outside it (the usual case: caches are allocations of
        # their own) is compared with the per-call tensors only
        self.hull = (min(f[0] for f in self.fixed), max(f[1] for f in self.fixed)) if self.fixed else (0, 0)
        self.outputs = tuple((name, span_offsets(t)) for name, t in outputs.items())
        self.inputs = tuple((name, span_offsets(t)) for name, t in inputs.items())

    def check_pointers(self, outputs: tuple[int, ...], inputs: tuple[int, ...]) -> None:
        """No output overlaps a fixed input, an input, or another output, and no input overlaps the written
        memory; `outputs` and `inputs` are pointers in the order of the constructor's dicts (0: absent this
        call)."""
        spans = []
        for (name, off), p in zip(self.inputs, inputs):
            if p and off is not None:
                lo, hi = p + off[0], p + off[1]
                for tlo, thi, other in self.written:
                    if tlo < hi and lo < thi:
                        raise ArgumentError(name, f"bytes [{lo:#x}, {hi:#x})",
                                            f"memory not overlapping {other} (bytes [{tlo:#x}, {thi:#x}), "
                                            "which the kernel writes)")
                spans.append((lo, hi, name))
        hull_lo, hull_hi = self.hull
        for (name, off), p in zip(self.outputs, outputs):
            if p and off is not None:
                lo, hi = p + off[0], p + off[1]
                for tlo, thi, other in (spans if hi <= hull_lo or lo >= hull_hi else self.fixed + tuple(spans)):
                    if tlo < hi and lo < thi:
                        raise ArgumentError(name, f"bytes [{lo:#x}, {hi:#x})",
                                            f"memory not overlapping {other} (bytes [{tlo:#x}, {thi:#x}))")
                spans.append((lo, hi, name))
