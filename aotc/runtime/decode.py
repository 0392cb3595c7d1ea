"""sdpa_decode's runtime API: a few new tokens attend over a paged (or dense) KV cache, split-KV merged in-kernel.

    nbytes = rt.decode_workspace_bytes(batch, seqlen_q, heads_q, head_dim, num_splits)
    plan = rt.prepare_decode(q, k_cache, v_cache, out, seqlens_kv, page_table, lse=None,
                             max_seqlen_kv=32768, kv_layout="NHD", num_splits=None, workspace=ws)
    plan(q, out, lse=None, seqlens_kv=None, page_table=None, stream=s)   # per step: new Q/O (and lengths)
    plan.run(q_ptr, out_ptr, lse_ptr, seqlens_ptr, page_table_ptr, stream)  # raw pointers: the cheapest step

Q/O [B, S_q, H_q, D] (S_q 1..16), any strides with the head dim contiguous. Paged pools: NHD
[num_pages, page_size, H_kv, D] or HND [num_pages, H_kv, page_size, D] (kv_layout), K and V may be
separate pools with their own strides; page_table int32 [B, max_pages]; seqlens_kv int32 [B] on the
device. Dense KV: K/V [B, S_kv_max, H_kv, D] and page_table=None.

Splits: the number of KV splits is fixed when the plan is prepared (from B, H_kv, the SM count and
max_seqlen_kv, the longest KV length any step will use) unless the caller sets it. A step is one
kernel launch either way. With more than one split the splits write fp32 partial results into the
caller's workspace (decode_workspace_bytes) and the last split of each (sequence, KV head) to finish
merges them into out and lse; which one is last is counted with int32 counters in the workspace's
last bytes. Nothing is allocated at execute time.

The counters must be zero when a step starts. Preparing a plan zeroes them (a synchronous memset:
prepare while nothing else uses the workspace, and outside CUDA-graph capture), and every step leaves
them zero, so between steps the workspace must not be written by anything else. A buffer shared by
several plans works when it is sized for the largest of them (decode_workspace_bytes of the most rows
and splits): partials start at the front and counters end at the back, so one plan's partials never
reach another's counters. A fresh workspace per step (e.g. from a caching allocator) must be zeroed
first (torch.zeros), since its bytes are whatever was there before.
"""
from __future__ import annotations

import math

from ..common.errors import ArgumentError
from ..families.sdpa_decode import KV_CHOICES, MAX_SEQLEN_Q, ROWS_PER_CTA
from . import validate as V
from .launch import PreparedLaunch
from .tensors import TensorArg, as_stream, as_tensor

FAMILY = "sdpa_decode"
DTYPES = ("fp16", "bf16")
BLOCK_N = 64  # tokens per kv block, for the split heuristic
MAX_SPLITS = 64
CTAS_PER_SM = 2  # decode CTAs resident per SM (the kernels' shared memory allows two)


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def workspace_bytes(batch: int, seqlen_q: int, heads_q: int, head_dim: int, num_splits: int) -> int:
    """Bytes of workspace a decode with `num_splits` splits needs (0 for one split): fp32 O and LSE
    partials, then room for the split counters (one int32 per (sequence, KV head, row tile), at most
    one per row)."""
    if num_splits <= 1:
        return 0
    rows = batch * seqlen_q * heads_q
    return _partials_bytes(num_splits, rows, head_dim) + _align16(rows * 4)


def _partials_bytes(num_splits: int, rows: int, head_dim: int) -> int:
    return _align16(num_splits * rows * head_dim * 4) + _align16(num_splits * rows * 4)


def workspace_layout(batch: int, seqlen_q: int, heads_q: int, heads_kv: int, head_dim: int, num_splits: int,
                     nbytes: int) -> dict:
    """Byte offsets in a 16-byte aligned workspace of `nbytes` (at least workspace_bytes(...)): O partials
    at 0, LSE partials after them, and n_counters int32 split counters (one per decode CTA column:
    sequence, KV head, row tile) ending at the buffer's last 16-byte boundary. Counters at the back keep
    them clear of any other plan's partials in a shared buffer sized for the largest plan."""
    rows = batch * seqlen_q * heads_q
    row_tiles = math.ceil(heads_q // heads_kv * seqlen_q / ROWS_PER_CTA)
    n_counters = batch * heads_kv * row_tiles
    counters = nbytes // 16 * 16 - _align16(n_counters * 4)
    if nbytes < workspace_bytes(batch, seqlen_q, heads_q, head_dim, num_splits) or n_counters > rows:
        raise ValueError(f"workspace of {nbytes} bytes: too small for {num_splits} splits of {rows} rows")
    return {"o_partial": 0, "lse_partial": _align16(num_splits * rows * head_dim * 4), "counters": counters,
            "n_counters": n_counters, "partials_end": _partials_bytes(num_splits, rows, head_dim)}


def choose_splits(batch: int, heads_kv: int, row_tiles: int, max_seqlen_kv: int, sm_count: int) -> int:
    """As many splits as fit in one wave of CTAs (CTAS_PER_SM resident per SM), each split keeping at
    least 4 kv blocks of work; a partial second wave would cost as much as a whole one."""
    ctas = max(1, batch * heads_kv * row_tiles)
    blocks = max(1, math.ceil(max_seqlen_kv / BLOCK_N))
    splits = max(1, min(sm_count * CTAS_PER_SM // ctas, blocks // 4, MAX_SPLITS))
    # the kernel gives each split ceil(blocks / splits) whole blocks: drop the splits that would get none
    # (33 splits of 512 blocks are 32 splits of 16 blocks and an empty one the merge would still read)
    return math.ceil(blocks / math.ceil(blocks / splits))


class DecodePlan:
    def __init__(self, runtime, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *,
                 max_seqlen_kv: int, kv_layout: str = "NHD", num_splits: int | None = None, workspace=None,
                 softmax_scale: float | None = None):
        from . import driver

        t = {"q": as_tensor(q, "q"), "k_cache": as_tensor(k_cache, "k_cache"), "v_cache": as_tensor(v_cache, "v_cache"),
             "out": as_tensor(out, "out")}
        sl = as_tensor(seqlens_kv, "seqlens_kv")
        pt = None if page_table is None else as_tensor(page_table, "page_table")
        ls = None if lse is None else as_tensor(lse, "lse")
        device = runtime.device()
        q_, k_, v_, o_ = t["q"], t["k_cache"], t["v_cache"], t["out"]
        batch, seqlen_q, heads_q, head_dim, heads_kv, page, kstr, vstr = check_decode(
            runtime, device, t, sl, pt, ls, max_seqlen_kv, kv_layout)
        group = heads_q // heads_kv
        row_tiles = math.ceil(group * seqlen_q / ROWS_PER_CTA)
        if num_splits is None:
            num_splits = choose_splits(batch, heads_kv, row_tiles, max_seqlen_kv, driver.multiprocessor_count(device))
        if not isinstance(num_splits, int) or isinstance(num_splits, bool) or not 1 <= num_splits <= 1024:
            raise ArgumentError("num_splits", num_splits, "an int in [1, 1024] or None (chosen by the heuristic)")
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(head_dim)
        if not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale) or softmax_scale <= 0:
            raise ArgumentError("softmax_scale", softmax_scale, "a finite positive float")
        self.num_splits = num_splits
        self.workspace_bytes = workspace_bytes(batch, seqlen_q, heads_q, head_dim, num_splits)
        kv = "dense" if pt is None else f"paged{page}"
        kernel = runtime.select(FAMILY, device, [{"dtype": q_.dtype, "head_dim": head_dim, "kv": kv}])
        self.variant = kernel.variant
        op_strides = (batch * seqlen_q * heads_q * head_dim, seqlen_q * heads_q * head_dim, heads_q * head_dim, head_dim)
        lp_strides = (batch * heads_q * seqlen_q, heads_q * seqlen_q, seqlen_q, 1)
        ws_ptr = lp_ptr = counters_ptr = 0
        if num_splits > 1:
            if workspace is None:
                raise ArgumentError("workspace", None, f"a device buffer of at least {self.workspace_bytes} bytes "
                                                       f"({num_splits} splits; see decode_workspace_bytes)")
            ws = as_tensor(workspace, "workspace")
            lo, hi = ws.nbytes_span()
            V.cuda_device({"workspace": ws}, device)
            if hi - lo < self.workspace_bytes or not V.is_packed(ws):
                raise ArgumentError("workspace", f"{hi - lo} bytes", f"a contiguous device buffer of at least "
                                                                    f"{self.workspace_bytes} bytes")
            V.aligned(ws, "workspace", 16)
            V.no_overlap({"workspace": ws}, {**t, "seqlens_kv": sl, **({"page_table": pt} if pt else {}),
                                             **({"lse": ls} if ls else {})})
            ws_ptr = ws.ptr
            at = workspace_layout(batch, seqlen_q, heads_q, heads_kv, head_dim, num_splits, hi - lo)
            lp_ptr = ws_ptr + at["lse_partial"]
            counters_ptr = ws_ptr + at["counters"]
            driver.memset_d32(counters_ptr, 0, at["n_counters"])  # every step leaves them zero again
        lse_strides = ls.strides if ls is not None else (0, 0, 0)
        pt_strides = pt.strides if pt is not None else (0, 0)
        values = {
            "q": q_.ptr, "k": k_.ptr, "v": v_.ptr, "o": o_.ptr, "lse": 0 if ls is None else ls.ptr,
            "o_partial": ws_ptr, "lse_partial": lp_ptr, "counters": counters_ptr, "page_table": 0 if pt is None else pt.ptr,
            "seqlens_kv": sl.ptr, "batch": batch, "seqlen_q": seqlen_q, "heads_q": heads_q, "heads_kv": heads_kv,
            "num_splits": num_splits, "max_pages": 0 if pt is None else pt.shape[1],
            "write_lse": int(ls is not None), "write_partial": int(num_splits > 1),
            "softmax_scale": float(softmax_scale),
            "q_stride_b": q_.strides[0], "q_stride_s": q_.strides[1], "q_stride_h": q_.strides[2],
            "k_stride_page": kstr[0], "k_stride_token": kstr[1], "k_stride_head": kstr[2],
            "v_stride_page": vstr[0], "v_stride_token": vstr[1], "v_stride_head": vstr[2],
            "o_stride_b": o_.strides[0], "o_stride_s": o_.strides[1], "o_stride_h": o_.strides[2],
            "lse_stride_b": lse_strides[0], "lse_stride_h": lse_strides[1], "lse_stride_s": lse_strides[2],
            "pt_stride_b": pt_strides[0], "pt_stride_p": pt_strides[1],
            "op_stride_split": op_strides[0], "op_stride_b": op_strides[1], "op_stride_s": op_strides[2],
            "op_stride_h": op_strides[3],
            "lp_stride_split": lp_strides[0], "lp_stride_b": lp_strides[1], "lp_stride_h": lp_strides[2],
            "lp_stride_s": lp_strides[3],
        }
        grid = (num_splits, heads_kv * row_tiles, batch)
        self.launcher = PreparedLaunch(kernel, grid, device, values)
        self.has_lse = ls is not None
        self.paged = pt is not None
        self.layout = _layout(q_, o_, ls)
        self._out_align = 16
        slots = self.launcher.params.slots
        self._slots = tuple(slots[n] for n in ("q", "o", "lse", "seqlens_kv", "page_table"))
        # what a step's outputs must never overlap (rechecked per step against the new out/lse)
        self._inputs = {"k_cache": k_, "v_cache": v_, "seqlens_kv": sl, **({"page_table": pt} if pt else {})}
        if num_splits > 1:
            self._inputs["workspace"] = ws

    def run(self, q: int, out: int, lse: int = 0, seqlens_kv: int = 0, page_table: int = 0, stream: int = 0) -> None:
        """One decode step with new raw pointers (0 for seqlens_kv/page_table keeps the prepared ones)."""
        if self.launcher.empty:
            return
        if (q | out) & 15 or lse & 3 or seqlens_kv & 3 or page_table & 3:
            raise ArgumentError("pointers", (hex(q), hex(out), hex(lse), hex(seqlens_kv), hex(page_table)),
                                "q and out 16-byte aligned, lse, seqlens_kv and page_table 4-byte aligned")
        if self.has_lse == (lse == 0):
            raise ArgumentError("lse", hex(lse), "a pointer" if self.has_lse else "0 (the plan writes no LSE)")
        s = self._slots
        s[0].value = q
        s[1].value = out
        s[2].value = lse
        if seqlens_kv:
            s[3].value = seqlens_kv
        if page_table:
            if not self.paged:
                raise ArgumentError("page_table", hex(page_table), "0 (the plan reads a dense KV cache)")
            s[4].value = page_table
        self.launcher.launch(stream)

    def __call__(self, q, out, lse=None, *, seqlens_kv=None, page_table=None, stream=None) -> None:
        """One decode step on tensors shaped like the prepared ones."""
        q_, o_ = as_tensor(q, "q"), as_tensor(out, "out")
        ls = None if lse is None else as_tensor(lse, "lse")
        if _layout(q_, o_, ls) != self.layout:
            raise ArgumentError("q/out/lse", _layout(q_, o_, ls), f"the layout the plan was prepared for: {self.layout}")
        V.no_overlap({"out": o_, **({"lse": ls} if ls is not None else {})}, {"q": q_, **self._inputs})
        sl_ptr = pt_ptr = 0
        if seqlens_kv is not None:
            sl = as_tensor(seqlens_kv, "seqlens_kv")
            V.dtype(sl, "seqlens_kv", ("int32",))
            sl_ptr = sl.ptr
        if page_table is not None:
            pt = as_tensor(page_table, "page_table")
            V.dtype(pt, "page_table", ("int32",))
            pt_ptr = pt.ptr
        self.run(q_.ptr, o_.ptr, 0 if ls is None else ls.ptr, sl_ptr, pt_ptr, as_stream(stream))


def _layout(q: TensorArg, o: TensorArg, ls: TensorArg | None) -> tuple:
    return (q.shape, q.strides, q.dtype, q.device, o.shape, o.strides, o.dtype, o.device,
            None if ls is None else (ls.shape, ls.strides, ls.device))


def check_decode(runtime, device: int, t: dict[str, TensorArg], sl: TensorArg, pt: TensorArg | None,
                 ls: TensorArg | None, max_seqlen_kv, kv_layout: str):
    """Validate; returns (B, S_q, H_q, D, H_kv, page_size, k strides, v strides) with strides as (page, token, head)."""
    q, k, v, o = t["q"], t["k_cache"], t["v_cache"], t["out"]
    V.dtype(q, "q", DTYPES)
    for name in ("k_cache", "v_cache", "out"):
        V.dtype(t[name], name, (q.dtype,))
    V.ndim(q, "q", 4, "B, S_q, H_q, D")
    V.ndim(o, "out", 4, "B, S_q, H_q, D")
    batch, seqlen_q, heads_q, head_dim = q.shape
    for axis in range(4):
        V.dim(o, "out", axis, "dim", q.shape[axis], "the shape of q")
    if not 1 <= seqlen_q <= MAX_SEQLEN_Q:
        raise ArgumentError("q.shape[1]", seqlen_q, f"S_q in [1, {MAX_SEQLEN_Q}] new tokens (use prefill for more)")
    if kv_layout not in ("NHD", "HND"):
        raise ArgumentError("kv_layout", kv_layout, "'NHD' ([pages, page_size, H_kv, D]) or 'HND' ([pages, H_kv, page_size, D])")
    for name in ("k_cache", "v_cache"):
        V.ndim(t[name], name, 4, "pages, page_size, H_kv, D (NHD), pages, H_kv, page_size, D (HND) or B, S, H_kv, D")
    if pt is None:  # dense [B, S, H_kv, D]
        V.dim(k, "k_cache", 0, "B", batch, "from q")
        tok_ax, head_ax = 1, 2
        page = 0
    else:
        tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)
        page = k.shape[tok_ax]
    heads_kv = k.shape[head_ax]
    for axis in range(4):
        V.dim(v, "v_cache", axis, "dim", k.shape[axis], "the shape of k_cache")
    V.dim(k, "k_cache", 3, "D", head_dim, "from q")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ArgumentError(f"k_cache.shape[{head_ax}]", heads_kv, f"H_kv dividing H_q = {heads_q}")
    heads = runtime.field_values(FAMILY, "head_dim", device)
    if head_dim not in heads:
        raise ArgumentError("q.shape[3]", head_dim, f"a head dim the loaded kernels cover: {sorted(heads)}")
    if not isinstance(max_seqlen_kv, int) or isinstance(max_seqlen_kv, bool) or max_seqlen_kv < 0:
        raise ArgumentError("max_seqlen_kv", max_seqlen_kv, "an int >= 0: the longest KV length a step will use")
    V.dtype(sl, "seqlens_kv", ("int32",))
    V.ndim(sl, "seqlens_kv", 1, "B")
    V.dim(sl, "seqlens_kv", 0, "B", batch, "from q")
    if batch > 1 and sl.strides[0] != 1:
        raise ArgumentError("seqlens_kv.stride[0]", sl.strides[0], "1 (contiguous)")
    tensors = dict(t, seqlens_kv=sl)
    if pt is not None:
        if f"paged{page}" not in KV_CHOICES:
            raise ArgumentError(f"k_cache.shape[{tok_ax}]", page, "a page size of 16, 32, 64 or 128")
        V.dtype(pt, "page_table", ("int32",))
        V.ndim(pt, "page_table", 2, "B, max_pages")
        V.dim(pt, "page_table", 0, "B", batch, "from q")
        if pt.shape[1] * page < max_seqlen_kv:
            raise ArgumentError("page_table.shape[1]", pt.shape[1],
                                f"at least ceil(max_seqlen_kv / page_size) = {math.ceil(max_seqlen_kv / page)} pages")
        V.aligned(pt, "page_table", 4)
        tensors["page_table"] = pt
    elif k.shape[1] < max_seqlen_kv:
        raise ArgumentError("k_cache.shape[1]", k.shape[1], f"at least max_seqlen_kv = {max_seqlen_kv} (dense KV)")
    if ls is not None:
        V.dtype(ls, "lse", ("fp32",))
        V.ndim(ls, "lse", 3, "B, H_q, S_q")
        for axis, (n, val) in enumerate(zip(("B", "H_q", "S_q"), (batch, heads_q, seqlen_q))):
            V.dim(ls, "lse", axis, n, val, "from q")
        V.aligned(ls, "lse", 4)
        tensors["lse"] = ls
    V.cuda_device(tensors, device)
    for name in ("q", "k_cache", "v_cache", "out"):
        x = t[name]
        V.unit_stride(x, name, 3)
        V.aligned(x, name, 16)
        V.stride_multiple(x, name, range(3), 8)
    V.int32_extent(batch, "B")
    V.int32_extent(max_seqlen_kv, "max_seqlen_kv")
    if batch > 65535 or heads_kv > 65535:
        raise ArgumentError("B" if batch > 65535 else "H_kv", max(batch, heads_kv), "at most 65535 (grid limit)")
    V.no_overlap({"out": o, **({"lse": ls} if ls is not None else {})},
                 {"q": q, "k_cache": k, "v_cache": v, "seqlens_kv": sl, **({"page_table": pt} if pt else {})})
    kstr = (k.strides[0], k.strides[tok_ax], k.strides[head_ax])
    vstr = (v.strides[0], v.strides[tok_ax], v.strides[head_ax])
    return batch, seqlen_q, heads_q, head_dim, heads_kv, page, kstr, vstr
