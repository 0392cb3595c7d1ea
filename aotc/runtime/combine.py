"""sdpa_combine's runtime API: validate, dispatch to the most specialized variant, launch.

    plan = rt.prepare_combine(o_partial, lse_partial, out, lse)   # validates once
    plan(o_partial, lse_partial, out, lse, stream=s)              # same layouts, new tensors
    plan.run(op_ptr, lp_ptr, out_ptr, lse_ptr, stream)            # raw pointers: the cheapest call
    rt.combine(o_partial, lse_partial, out, lse, stream=s)        # one-off: prepare + launch

Shapes: o_partial fp32 [splits, B, S_q, H, D] (head dim contiguous, 16-byte
aligned, other strides multiples of 4 elements), lse_partial fp32
[splits, B, H, S_q], out fp16/bf16/fp32 [B, S_q, H, D] with any strides, lse
fp32 [B, H, S_q] or None.
"""
from __future__ import annotations

from ..common.errors import ArgumentError
from ..families.sdpa_combine import choose_split_groups
from . import driver
from . import validate as V
from .plan import Plan, cached_plan
from .tensors import TensorArg, as_output, as_stream, as_tensor

FAMILY = "sdpa_combine"
OUT_DTYPES = ("fp16", "bf16", "fp32")


class CombinePlan(Plan):
    family = FAMILY

    def __init__(self, runtime, o_partial, lse_partial, out, lse=None):
        op, lp, o = as_tensor(o_partial, "o_partial"), as_tensor(lse_partial, "lse_partial"), as_output(out, "out")
        ls = None if lse is None else as_output(lse, "lse")
        device = runtime.device()
        self._check(runtime, op, lp, o, ls, device)
        splits, batch, seqlen_q, heads, head_dim = op.shape
        packed = V.is_packed(o) and (ls is None or V.is_packed(ls)) and o.ptr % (4 * o.itemsize) == 0
        wanted = {"dtype": o.dtype, "head_dim": head_dim}
        kernel = runtime.select(FAMILY, device, ([{**wanted, "strides": "packed"}] if packed else [])
                                + [{**wanted, "strides": "general"}])
        self.layout = layout_key(op, lp, o, ls)
        self.layout_of = V.layouts_of({"o_partial": op, "lse_partial": lp, "out": o, "lse": ls})
        rows = batch * seqlen_q * heads
        slices = int(kernel.artifact.launch.extra["slices_per_cta"])  # the cubin's own mapping
        self.split_groups = choose_split_groups(slices, rows, driver.multiprocessor_count(device))
        grid = ((rows * self.split_groups + slices - 1) // slices, 1, 1)
        lse_strides = ls.strides if ls is not None else (0, 0, 0)
        values = {
            "o_partial": op.ptr, "lse_partial": lp.ptr, "o": o.ptr, "lse": 0 if ls is None else ls.ptr,
            "splits": splits, "batch": batch, "seqlen_q": seqlen_q, "heads": heads,
            "write_lse": 0 if ls is None else 1, "split_groups": self.split_groups,
            "op_stride_split": op.strides[0], "op_stride_b": op.strides[1], "op_stride_s": op.strides[2],
            "op_stride_h": op.strides[3],
            "lp_stride_split": lp.strides[0], "lp_stride_b": lp.strides[1], "lp_stride_h": lp.strides[2],
            "lp_stride_s": lp.strides[3],
            "o_stride_b": o.strides[0], "o_stride_s": o.strides[1], "o_stride_h": o.strides[2],
            "o_stride_d": o.strides[3],
            "lse_stride_b": lse_strides[0], "lse_stride_h": lse_strides[1], "lse_stride_s": lse_strides[2],
        }
        self.has_lse = ls is not None
        self.bind(kernel, grid, device, values)
        self._slots = self.slots("o_partial", "lse_partial", "o", "lse")
        self._masks = self.masks("o_partial", "lse_partial", "o", "lse")
        self._spans = V.Spans({}, {"out": o, "lse": ls}, {"o_partial": op, "lse_partial": lp})

    @staticmethod
    def _check(runtime, op: TensorArg, lp: TensorArg, o: TensorArg, ls: TensorArg | None, device: int) -> None:
        V.dtype(op, "o_partial", ("fp32",))
        V.dtype(lp, "lse_partial", ("fp32",))
        V.dtype(o, "out", OUT_DTYPES)
        V.ndim(op, "o_partial", 5, "splits, B, S_q, H, D")
        V.ndim(lp, "lse_partial", 4, "splits, B, H, S_q")
        V.ndim(o, "out", 4, "B, S_q, H, D")
        splits, batch, seqlen_q, heads, head_dim = op.shape
        heads_dims = runtime.field_values(FAMILY, "head_dim", device)
        if head_dim not in heads_dims:
            raise ArgumentError("o_partial.shape[4]", head_dim, f"a head dim the loaded kernels cover: {sorted(heads_dims)}")
        for axis, (axis_name, n) in enumerate(zip(("splits", "B", "H", "S_q"), (splits, batch, heads, seqlen_q))):
            V.dim(lp, "lse_partial", axis, axis_name, n, "from o_partial")
        for axis, (axis_name, n) in enumerate(zip(("B", "S_q", "H", "D"), (batch, seqlen_q, heads, head_dim))):
            V.dim(o, "out", axis, axis_name, n, "from o_partial")
        tensors = {"o_partial": op, "lse_partial": lp, "out": o}
        if ls is not None:
            V.lse_output(ls, (("B", batch), ("H", heads), ("S_q", seqlen_q)), "from o_partial")
            tensors["lse"] = ls
        V.cuda_device(tensors, device)
        V.int32_extent(splits, "o_partial.shape[0] (splits)")
        V.int32_extent(batch * seqlen_q * heads, "B * S_q * H")
        V.unit_stride(op, "o_partial", 4)
        V.aligned(op, "o_partial", 16)
        V.stride_multiple(op, "o_partial", range(4), 4)
        V.aligned(lp, "lse_partial", 4)
        V.aligned(o, "out", o.itemsize)
        V.no_self_overlap(o, "out")
        V.no_overlap({"out": o, **({"lse": ls} if ls is not None else {})}, {"o_partial": op, "lse_partial": lp})

    def run(self, o_partial: int, lse_partial: int, out: int, lse: int = 0, stream: int = 0) -> None:
        """Launch with new raw device pointers for the prepared layouts (only alignment is rechecked)."""
        if self.launcher.empty:
            return  # nothing to compute; empty tensors may carry null pointers
        m = self._masks
        if o_partial & m[0] or lse_partial & m[1] or out & m[2] or lse & m[3]:
            raise self.misaligned(("o_partial", "lse_partial", "o", "lse"), (o_partial, lse_partial, out, lse))
        self.check_lse(lse)
        s = self._slots
        s[0].value = o_partial
        s[1].value = lse_partial
        s[2].value = out
        s[3].value = lse
        self._launch(stream)

    def __call__(self, o_partial, lse_partial, out, lse=None, *, stream=None) -> None:
        """Launch on tensors with the prepared shapes, strides and dtypes."""
        op, lp, o = as_tensor(o_partial, "o_partial"), as_tensor(lse_partial, "lse_partial"), as_output(out, "out")
        ls = None if lse is None else as_output(lse, "lse")
        if layout_key(op, lp, o, ls) != self.layout:
            V.same_layouts({"o_partial": op, "lse_partial": lp, "out": o, "lse": ls}, self.layout_of)
            aligned = self.layout[12]  # all else as prepared: out's alignment picked another variant
            raise ArgumentError("out", hex(o.ptr), f"{'' if aligned else 'not '}aligned to {4 * o.itemsize} bytes, "
                                                   "as the plan's out was (its kernel assumes it)")
        self.launch_records(op, lp, o, ls, as_stream(stream))

    def launch_records(self, op: TensorArg, lp: TensorArg, o: TensorArg, ls: TensorArg | None, stream: int) -> None:
        """Launch on records whose layout_key equals the plan's: rechecks what depends on the pointers."""
        lse = 0 if ls is None else ls.ptr
        self._spans.check_pointers((o.ptr, lse), (op.ptr, lp.ptr))
        self.run(op.ptr, lp.ptr, o.ptr, lse, stream)


def layout_key(op: TensorArg, lp: TensorArg, o: TensorArg, ls: TensorArg | None) -> tuple:
    """Everything a plan's validation and dispatch depend on, except the pointers themselves."""
    return (op.shape, op.strides, op.dtype, op.device, lp.shape, lp.strides, lp.dtype, lp.device,
            o.shape, o.strides, o.dtype, o.device, o.ptr % (4 * o.itemsize) == 0,
            None if ls is None else (ls.shape, ls.strides, ls.dtype, ls.device))


def combine(runtime, o_partial, lse_partial, out, lse=None, *, stream=None) -> None:
    """One call: plans are cached by layout, so a repeated shape costs a lookup, not a validation."""
    op, lp, o = as_tensor(o_partial, "o_partial"), as_tensor(lse_partial, "lse_partial"), as_output(out, "out")
    ls = None if lse is None else as_output(lse, "lse")
    key = (FAMILY, runtime.device(), layout_key(op, lp, o, ls))
    plan = cached_plan(runtime, key, lambda: CombinePlan(runtime, op, lp, o, ls))
    plan.launch_records(op, lp, o, ls, as_stream(stream))
