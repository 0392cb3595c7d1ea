"""kv_write's runtime API: write the new tokens' K and V into paged KV-cache pools through a slot mapping,
once per layer per step before attention (vLLM's reshape_and_cache_flash).

    plan = rt.prepare_kv_write(key, value, k_cache, v_cache, slot_mapping, kv_layout="NHD")
    plan(key, value, slot_mapping, stream=s)              # per step: new tokens, any count
    plan.run(key_ptr, value_ptr, slot_ptr, num_tokens, stream)   # raw pointers: the cheapest step
    rt.kv_write(key, value, k_cache, v_cache, slot_mapping, kv_layout="NHD", stream=s)   # one call

key, value [rows, H_kv, D] fp16/bf16 (one shape; any token and head strides that are multiples of 8
elements, head dim contiguous, 16-byte aligned: a slice of a fused qkv projection will do), pools NHD
[num_pages, page_size, H_kv, D] or HND [num_pages, H_kv, page_size, D] (kv_layout) of the same dtype, K and
V with their own strides (interleaved in one buffer too), page_size 16, 32, 64 or 128; slot_mapping int64
[num_tokens] contiguous on the device, num_tokens <= rows (rows past num_tokens are not read, as a padded
batch has them). Token i is written to page slot // page_size at in-page slot slot % page_size; a slot of
-1, and any other slot outside [0, num_pages * page_size), is skipped on the device (the host never reads
device data, so it cannot refuse one; a skipped token writes nothing). Two tokens with one slot write it
in an unspecified order. num_tokens = 0 launches nothing.

fp8_e4m3 pools (kv_dtype, aotc.runtime.kv_scales) take k_scale and v_scale, fp32 [H_kv] or [1] on the device:
the pools get e4m3(clamp(x / scale, -448, 448)), rounded to nearest even (what torch's float8_e4m3fn
conversion of the clamped quotient gives); pool strides are then multiples of 16 elements.

A plan is fixed by layouts, not by the token count: the pools (pointers and layouts), key/value strides,
H_kv, D and dtypes. Each call gives the token count (the grid follows it) and new key/value/slot pointers;
Runtime.kv_write keeps one plan per pool set and layout, so an engine's step with another batch size reuses
it. Nothing is allocated per call: CUDA-graph capture records the launch (its token count and pointers;
the slot mapping's contents are read at every replay).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.errors import ArgumentError
from ..families.kv_write import MAX_HEADS_KV, PAGE_SIZES
from . import validate as V
from .dlpack import torch_layouts
from .features import missing_kernel
from .kv_scales import FP8, check_kv_dtypes, check_kv_scales, kv_stride_multiple
from .plan import Plan, cached_plan, torch_key
from .tensors import TensorArg, as_output, as_stream, as_tensor

FAMILY = "kv_write"
DTYPES = ("fp16", "bf16")
MAX_TOKENS = 1 << 30  # a 32-bit token index in the kernel, with room for a CTA's tokens past the last


@dataclass(frozen=True)
class KvWriteShape:
    """What check_kv_write() found: extents, and the pools' strides as (page, token, head) in elements."""

    heads_kv: int
    head_dim: int
    page_size: int
    num_pages: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]


class KvWritePlan(Plan):
    family = FAMILY
    _torch_seen = None  # the torch layouts of the last tensors __call__ checked in full

    def __init__(self, runtime, key, value, k_cache, v_cache, slot_mapping, *, kv_layout: str = "NHD",
                 k_scale=None, v_scale=None):
        t = {"key": as_tensor(key, "key"), "value": as_tensor(value, "value"),
             "k_cache": as_output(k_cache, "k_cache"), "v_cache": as_output(v_cache, "v_cache"),
             "slot_mapping": as_tensor(slot_mapping, "slot_mapping")}
        device = runtime.device()
        d = check_kv_write(runtime, device, t, kv_layout)
        scales = check_kv_scales(t["k_cache"], t["v_cache"], t["key"].dtype, k_scale, v_scale, heads_kv=d.heads_kv,
                                 device=device, prefix="scale")
        for pool in ("k_cache", "v_cache"):
            V.no_overlap({pool: t[pool]}, scales.inputs())
        wanted = {"dtype": t["key"].dtype, "head_dim": d.head_dim, **scales.fields}
        if scales.kv_dtype == FP8 and runtime.find(FAMILY, device, [wanted]) is None:
            raise missing_kernel((FAMILY,), wanted)
        kernel = runtime.select(FAMILY, device, [wanted])
        self.tokens_per_cta = int(kernel.artifact.launch.extra["tokens_per_cta"])  # the cubin's own mapping
        k_, v_, s_ = t["key"], t["value"], t["slot_mapping"]
        num_tokens = s_.shape[0]
        values = {
            "key": k_.ptr, "value": v_.ptr, "k_cache": t["k_cache"].ptr, "v_cache": t["v_cache"].ptr,
            "slot_mapping": s_.ptr,
            "num_tokens": num_tokens, "heads_kv": d.heads_kv, "page_shift": d.page_size.bit_length() - 1,
            "num_slots": d.num_pages * d.page_size,
            "key_stride_token": k_.strides[0], "key_stride_head": k_.strides[1],
            "value_stride_token": v_.strides[0], "value_stride_head": v_.strides[1],
            "k_stride_page": d.k_strides[0], "k_stride_token": d.k_strides[1], "k_stride_head": d.k_strides[2],
            "v_stride_page": d.v_strides[0], "v_stride_token": d.v_strides[1], "v_stride_head": d.v_strides[2],
            **scales.values,
        }
        self.shape = d
        self.kv_layout = kv_layout
        # the grid's x extent follows each call's token count (run() rewrites it); bound non-empty
        self.bind(kernel, (max(1, -(-num_tokens // self.tokens_per_cta)), d.heads_kv, 1), device, values)
        self._set_grid_x = self.launcher.launch.set_grid_x
        self.layout = io_layout(k_, v_, s_)
        self._slots = self.slots("key", "value", "slot_mapping", "num_tokens")
        self._mk, self._mv, self._ms = self.masks("key", "value", "slot_mapping")
        # checked_run's overlap check: the pools' hulls (one when they meet: K and V interleaved), and each
        # input's (lo, hi, token step) in bytes from its pointer: n tokens span [ptr + lo, ptr + hi + (n - 1) * step)
        pools = sorted(x.nbytes_span() for x in (t["k_cache"], t["v_cache"]))
        self._hulls = (((pools[0][0], max(pools[0][1], pools[1][1])),) if pools[1][0] < pools[0][1]
                       else tuple(pools))
        self._row_spans = tuple((name, *_row_span(x)) for name, x in (("key", k_), ("value", v_)))

    def run(self, key: int, value: int, slot_mapping: int, num_tokens: int, stream: int = 0) -> None:
        """Write num_tokens tokens from raw pointers laid out as the prepared tensors (0 tokens: nothing)."""
        if not 0 <= num_tokens <= MAX_TOKENS:
            raise ArgumentError("num_tokens", num_tokens, f"an int in [0, {MAX_TOKENS}]")
        if num_tokens == 0:
            return  # empty tensors may carry null pointers
        if key & self._mk or value & self._mv or slot_mapping & self._ms:
            raise self.misaligned(("key", "value", "slot_mapping"), (key, value, slot_mapping))
        s = self._slots
        s[0].value = key
        s[1].value = value
        s[2].value = slot_mapping
        s[3].value = num_tokens
        self._set_grid_x(-(-num_tokens // self.tokens_per_cta))
        self._launch(stream)

    def __call__(self, key, value, slot_mapping, *, stream=None) -> None:
        """Write the tokens of slot_mapping from tensors laid out as the prepared ones (any token count)."""
        seen = torch_layouts(key, value, slot_mapping)
        if seen is not None:
            seen = _torch_io_layout(seen)
            if seen == self._torch_seen:  # torch tensors laid out as ones checked before: pointers only
                self.checked_run(key.data_ptr(), value.data_ptr(), slot_mapping.data_ptr(), key.shape[0],
                                 value.shape[0], slot_mapping.shape[0], as_stream(stream))
                return
        k_, v_, s_ = as_tensor(key, "key"), as_tensor(value, "value"), as_tensor(slot_mapping, "slot_mapping")
        got = io_layout(k_, v_, s_)
        if got != self.layout:
            name, g, w = next((n, g, w) for n, g, w in zip(_IO_LAYOUT_FIELDS, got, self.layout) if g != w)
            raise ArgumentError(name, g, f"{w}, as the plan was prepared")
        self._torch_seen = seen
        self.checked_run(k_.ptr, v_.ptr, s_.ptr, k_.shape[0], v_.shape[0], s_.shape[0], as_stream(stream))

    def checked_run(self, key: int, value: int, slot_mapping: int, key_rows: int, value_rows: int,
                    num_tokens: int, stream: int = 0) -> None:
        """run() for pointers of tensors laid out as the prepared ones, after checking the token count against
        the rows of key and value and that no input overlaps a pool (the one-call API and the torch op)."""
        if key_rows != value_rows or num_tokens > key_rows:
            raise ArgumentError("slot_mapping.shape[0]" if key_rows == value_rows else "value.shape[0]",
                                num_tokens if key_rows == value_rows else value_rows,
                                f"at most key.shape[0] = {key_rows} tokens" if key_rows == value_rows
                                else f"key.shape[0] = {key_rows} (key and value have one shape)")
        if num_tokens:
            spans = [(name, p + lo, p + hi + (num_tokens - 1) * step)
                     for (name, lo, hi, step), p in zip(self._row_spans, (key, value))]
            spans.append(("slot_mapping", slot_mapping, slot_mapping + 8 * num_tokens))
            for name, lo, hi in spans:
                for plo, phi in self._hulls:
                    if lo < phi and plo < hi:
                        raise ArgumentError(name, f"bytes [{lo:#x}, {hi:#x})",
                                            f"memory not overlapping k_cache or v_cache (bytes [{plo:#x}, {phi:#x}))")
        self.run(key, value, slot_mapping, num_tokens, stream)


def _row_span(t: TensorArg) -> tuple[int, int, int]:
    """(lo, hi, step) of a [rows, H_kv, D] tensor: the bytes of n rows are [ptr + lo, ptr + hi + (n - 1) * step)
    (token strides are positive: check_kv_write)."""
    _, heads, dim = t.shape
    one = TensorArg(t.ptr, (1, heads, dim), t.strides, t.dtype, t.device).nbytes_span()
    return one[0] - t.ptr, one[1] - t.ptr, t.strides[0] * t.itemsize


_IO_LAYOUT_FIELDS = ("key.shape[1:]", "key.strides", "key.dtype", "key.device", "value.shape[1:]", "value.strides",
                     "value.dtype", "value.device", "slot_mapping.strides", "slot_mapping.dtype", "slot_mapping.device")


def io_layout(key: TensorArg, value: TensorArg, slot_mapping: TensorArg) -> tuple:
    """What a plan fixes of its per-call tensors: all but the token count and the pointers."""
    return (key.shape[1:], key.strides, key.dtype, key.device, value.shape[1:], value.strides, value.dtype,
            value.device, slot_mapping.strides, slot_mapping.dtype, slot_mapping.device)


def _torch_io_layout(seen: tuple) -> tuple:
    """torch_layouts of (key, value, slot_mapping) without the token counts."""
    (ks, kst, kd, kdev), (vs, vst, vd, vdev), (_, sst, sd, sdev) = seen
    return ks[1:], kst, kd, kdev, vs[1:], vst, vd, vdev, sst, sd, sdev


def check_kv_write(runtime, device: int, t: dict[str, TensorArg], kv_layout: str) -> KvWriteShape:
    """Validate every argument before anything is prepared; raises ArgumentError naming the first bad one.

    What a plan fixes is checked for every token count, so a later call with another count needs no
    check but its rows and pointers: the token strides of key and value are multiples of 8 elements and
    slot_mapping's stride is 1 even for a single token."""
    key, value, k, v, sm = t["key"], t["value"], t["k_cache"], t["v_cache"], t["slot_mapping"]
    V.dtype(key, "key", DTYPES)
    V.dtype(value, "value", (key.dtype,))
    check_kv_dtypes(k, v, key.dtype)  # (fp8: its scales are checked by the plan, kv_scales)
    V.ndim(key, "key", 3, "tokens, H_kv, D")
    V.ndim(value, "value", 3, "tokens, H_kv, D")
    rows, heads_kv, head_dim = key.shape
    for axis, axis_name in enumerate(("tokens", "H_kv", "D")):
        V.dim(value, "value", axis, axis_name, key.shape[axis], "the shape of key")
    V.kv_layout(kv_layout)
    tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)
    for name in ("k_cache", "v_cache"):
        V.ndim(t[name], name, 4, "pages, page_size, H_kv, D (NHD) or pages, H_kv, page_size, D (HND)")
    for axis in range(4):
        V.dim(v, "v_cache", axis, "dim", k.shape[axis], "the shape of k_cache")
    page_size, num_pages = k.shape[tok_ax], k.shape[0]
    if num_pages == 0:
        raise ArgumentError("k_cache.shape[0]", 0, "at least one page")
    if page_size not in PAGE_SIZES:
        raise ArgumentError(f"k_cache.shape[{tok_ax}]", page_size,
                            f"a page size of {', '.join(map(str, PAGE_SIZES))} (a power of two: the kernel shifts)")
    V.dim(k, "k_cache", head_ax, "H_kv", heads_kv, "from key")
    V.dim(k, "k_cache", 3, "D", head_dim, "from key")
    if not 1 <= heads_kv <= MAX_HEADS_KV:
        raise ArgumentError("key.shape[1]", heads_kv, f"H_kv in [1, {MAX_HEADS_KV}] (the grid's y extent)")
    heads = runtime.field_values(FAMILY, "head_dim", device)
    if head_dim not in heads:
        raise ArgumentError("key.shape[2]", head_dim, f"a head dim the loaded kernels cover: {sorted(heads)}")
    V.dtype(sm, "slot_mapping", ("int64",))
    V.ndim(sm, "slot_mapping", 1, "tokens")
    if sm.shape[0] > rows:
        raise ArgumentError("slot_mapping.shape[0]", sm.shape[0], f"at most key.shape[0] = {rows} tokens")
    if sm.shape[0] > MAX_TOKENS:
        raise ArgumentError("slot_mapping.shape[0]", sm.shape[0], f"at most {MAX_TOKENS} tokens")
    if sm.strides[0] != 1:
        raise ArgumentError("slot_mapping.stride[0]", sm.strides[0], "1 (contiguous)")
    V.aligned(sm, "slot_mapping", 8)
    V.cuda_device(t, device)
    for name in ("key", "value", "k_cache", "v_cache"):
        x = t[name]
        V.unit_stride(x, name, x.ndim - 1)
        V.aligned(x, name, 16)
        V.stride_multiple(x, name, range(x.ndim - 1), kv_stride_multiple(x.dtype))  # 16 bytes
    for name in ("key", "value"):  # fixed for every token count, as the plan is
        if t[name].strides[0] <= 0 or t[name].strides[0] % 8:
            raise ArgumentError(f"{name}.stride[0]", t[name].strides[0],
                                "a positive multiple of 8 elements (16-byte aligned token rows)")
    V.no_self_overlap(k, "k_cache")
    V.no_self_overlap(v, "v_cache")
    V.outputs_apart(k, "k_cache", v, "v_cache")
    inputs = {"key": key, "value": value, "slot_mapping": sm}
    V.no_overlap({"k_cache": k}, inputs)
    V.no_overlap({"v_cache": v}, inputs)
    return KvWriteShape(heads_kv, head_dim, page_size, num_pages,
                        (k.strides[0], k.strides[tok_ax], k.strides[head_ax]),
                        (v.strides[0], v.strides[tok_ax], v.strides[head_ax]))


def kv_write(runtime, key, value, k_cache, v_cache, slot_mapping, *, kv_layout="NHD", stream=None,
             k_scale=None, v_scale=None) -> None:
    """One call (Runtime.kv_write): the plan for these pools and layouts is prepared once and cached, whatever
    the token count."""
    V.kv_layout(kv_layout)  # before it is hashed into a plan key
    seen = torch_layouts(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if seen is not None:  # torch tensors: a key from their layouts (less the token counts) and the pools' pointers
        fast = torch_key(FAMILY, runtime.device(), (*_torch_io_layout((seen[0], seen[1], seen[4])), *seen[2:4],
                                                    *seen[5:]),
                         (k_cache, v_cache, k_scale, v_scale), (kv_layout,))
        plan = runtime.plans.get(fast)
        if plan is not None:
            plan.checked_run(key.data_ptr(), value.data_ptr(), slot_mapping.data_ptr(), key.shape[0], value.shape[0],
                             slot_mapping.shape[0], as_stream(stream))
            return
    kr, vr, kc, vc, sr = ((as_output if n in ("k_cache", "v_cache") else as_tensor)(x, n) for x, n in
                          ((key, "key"), (value, "value"), (k_cache, "k_cache"), (v_cache, "v_cache"),
                           (slot_mapping, "slot_mapping")))
    scales = tuple(None if x is None else as_tensor(x, n) for x, n in ((k_scale, "k_scale"), (v_scale, "v_scale")))
    key_ = (FAMILY, runtime.device(), kc.ptr, vc.ptr, (kc.shape, kc.strides, kc.dtype, kc.device),
            (vc.shape, vc.strides, vc.dtype, vc.device), io_layout(kr, vr, sr), kv_layout,
            tuple(None if x is None else (x.ptr, x.shape, x.strides, x.dtype, x.device) for x in scales))
    plan = cached_plan(runtime, key_, lambda: KvWritePlan(runtime, kr, vr, kc, vc, sr, kv_layout=kv_layout,
                                                          k_scale=scales[0], v_scale=scales[1]))
    if seen is not None:
        runtime.remember_plan(fast, plan)
    plan.checked_run(kr.ptr, vr.ptr, sr.ptr, kr.shape[0], vr.shape[0], sr.shape[0], as_stream(stream))
