"""sdpa_decode's runtime API: a few new tokens attend over a paged (or dense) KV cache, balanced over the
GPU for any distribution of KV lengths, one launch a step.

    plan = rt.prepare_decode(q, k_cache, v_cache, out, seqlens_kv, page_table, lse=None, kv_layout="NHD")
    plan(q, out, lse=None, seqlens_kv=None, page_table=None, stream=s)   # per step: new Q/O (and lengths)
    plan.run(q_ptr, out_ptr, lse_ptr, seqlens_ptr, page_table_ptr, stream)  # raw pointers: the cheapest step

Q/O [B, S_q, H_q, D] (S_q 1..16), any strides with the head dim contiguous. Paged pools: NHD
[num_pages, page_size, H_kv, D] or HND [num_pages, H_kv, page_size, D] (kv_layout), K and V may be
separate pools with their own strides; page_table int32 [B, max_pages]; seqlens_kv int32 [B] on the
device (length 0 gives O = 0, LSE = -inf; a length past the page-table row is cut there). Dense KV:
K/V [B, S_kv_max, H_kv, D] (NHD) or [B, H_kv, S_kv_max, D] (HND) and page_table=None; there
seqlens_kv[b] <= S_kv_max is the caller's to keep (device data: no kernel parameter bounds it).

The work partition (aotc.kernels.tile_scheduler.KvChunks) is derived by the kernel from the device-side
lengths at every launch: the batch's kv blocks are cut into about `chunks` equal chunks per (KV head, row
tile), long sequences into many, short ones into one, so the GPU stays full however the tokens are
distributed, also when a CUDA graph captured with one distribution replays with another. `chunks`
defaults to one wave of CTAs (the SM count times the kernel's CTAs per SM, over the CTAs a chunk takes);
chunks=1 never splits. A sequence split in several chunks has its chunks write fp32 partials into a
workspace and the last of them to finish (counted with an int32 counter in the workspace's last bytes)
merges them into out and lse in the same launch.

The workspace (decode_workspace_bytes; none for chunks=1) is the launch stream's buffer of the runtime's
arena unless the caller passes one (aotc.runtime.workspace: a buffer per stream, so plans may run on several
streams at once, and none freed while the runtime lives, so a plan the plan cache evicts leaves no captured
CUDA graph writing into freed memory). A caller's workspace serves one stream at a time (plans sharing it must
not run at the same time on two streams); it has its counters zeroed when the plan is
prepared (a synchronous memset: prepare outside CUDA-graph capture), and every step leaves them zero, so
between steps nothing else may write it. Plans may share one buffer of workspace_bytes() with each
argument the largest among them: partials start at the front and counters end at the back, so the
buffer must hold the largest partials and the largest counters together (the largest plan's own size
is not enough: one plan's LSE partials then reached another's counters).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.errors import ArgumentError
from ..families.schedulers import MAX_DECODE_CHUNKS, decode_chunks, decode_columns, decode_grid
from ..families.sdpa_decode import KV_CHOICES, MAX_SEQLEN_Q
from . import driver
from . import validate as V
from .dlpack import torch_layouts
from .features import check_features, feature_scalars, missing_kernel
from .kv_scales import FP8, check_kv_dtypes, check_kv_scales, kv_stride_multiple
from .plan import Plan, cached_plan, torch_key
from .tensors import TensorArg, as_output, as_stream, as_tensor
from .workspace import StreamBuffers

FAMILY = "sdpa_decode"
DTYPES = ("fp16", "bf16")
MAX_CHUNK_SLOTS = MAX_DECODE_CHUNKS - 1  # target chunks + batch (the grid's chunk extent)


def _align16(n: int) -> int:
    return (n + 15) // 16 * 16


def workspace_bytes(batch: int, seqlen_q: int, heads_q: int, head_dim: int, chunks: int) -> int:
    """Bytes of workspace a decode with `chunks` target chunks needs (0 for one: no sequence is split):
    fp32 O and LSE partials for every chunk there can be (chunks + batch), then the counters (one int32 per
    (sequence, KV head, row tile), at most one per row)."""
    if chunks <= 1:
        return 0
    return _partials_bytes(chunks + batch, seqlen_q * heads_q, head_dim) + _align16(batch * seqlen_q * heads_q * 4)


def _partials_bytes(slots: int, rows: int, head_dim: int) -> int:
    return _align16(slots * rows * head_dim * 4) + _align16(slots * rows * 4)


def workspace_layout(batch: int, seqlen_q: int, heads_q: int, heads_kv: int, head_dim: int, chunks: int,
                     nbytes: int, rows_per_cta: int = 16) -> dict:
    """Byte offsets in a 16-byte aligned workspace of `nbytes` (at least workspace_bytes(...)): O partials at
    0 ([chunk slot, S_q, H_q, D] fp32, chunks + batch slots), LSE partials after them ([chunk slot, H_q, S_q]),
    and n_counters int32 counters (one per sequence and CTA column: KV head, row tile) ending at the
    buffer's last 16-byte boundary, clear of any other plan's partials in a buffer of workspace_bytes() of
    every argument's largest value among the plans sharing it."""
    rows = seqlen_q * heads_q
    slots = chunks + batch
    n_counters = batch * decode_columns(heads_q, heads_kv, seqlen_q, rows_per_cta)
    counters = nbytes // 16 * 16 - _align16(n_counters * 4)
    if nbytes < workspace_bytes(batch, seqlen_q, heads_q, head_dim, chunks) or n_counters > batch * rows:
        raise ValueError(f"workspace of {nbytes} bytes: too small for {chunks} chunks of {batch} x {rows} rows")
    return {"o_partial": 0, "lse_partial": _align16(slots * rows * head_dim * 4), "counters": counters,
            "n_counters": n_counters, "partials_end": _partials_bytes(slots, rows, head_dim)}


@dataclass(frozen=True)
class DecodeShape:
    """What check_decode() found: extents, and the K/V strides as (page, token, head) in elements."""

    batch: int
    seqlen_q: int
    heads_q: int
    head_dim: int
    heads_kv: int
    page: int  # 0: dense KV
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]


class DecodePlan(Plan):
    family = FAMILY
    _torch_seen = None  # torch_layouts of the last tensors __call__ checked in full

    def __init__(self, runtime, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *,
                 max_seqlen_kv: int | None = None, kv_layout: str = "NHD", chunks: int | None = None,
                 workspace=None, softmax_scale: float | None = None, cu_seqlens_q=None, decode_query_len: int = 0,
                 window_left: int | None = None, softcap: float | None = None, sinks=None,
                 k_descale=None, v_descale=None):
        """cu_seqlens_q (with decode_query_len, 1..16): ragged Q/O [total_q, H_q, D] and LSE [H_q, total_q];
        the sequences of 1 .. decode_query_len queries are served, the others left alone (Runtime.attention
        gives them to its paged prefill kernel). window_left, softcap, sinks: aotc.runtime.features.
        k_descale, v_descale: an fp8_e4m3 cache's scales (aotc.runtime.kv_scales)."""
        max_seqlen_kv, chunks, decode_query_len, window_left = V.as_ints(max_seqlen_kv, chunks, decode_query_len,
                                                                         window_left)
        t = {"q": as_tensor(q, "q"), "k_cache": as_tensor(k_cache, "k_cache"), "v_cache": as_tensor(v_cache, "v_cache"),
             "out": as_output(out, "out")}
        sl = as_tensor(seqlens_kv, "seqlens_kv")
        pt = None if page_table is None else as_tensor(page_table, "page_table")
        ls = None if lse is None else as_output(lse, "lse")
        cuq = None if cu_seqlens_q is None else as_tensor(cu_seqlens_q, "cu_seqlens_q")
        device = runtime.device()
        d = check_decode(runtime, device, t, sl, pt, ls, max_seqlen_kv, kv_layout, cuq, decode_query_len)
        softmax_scale = V.softmax_scale(softmax_scale, d.head_dim)
        feats = check_features(window_left, softcap, sinks, heads_q=d.heads_q, device=device,
                               softmax_scale=softmax_scale)
        scales = check_kv_scales(t["k_cache"], t["v_cache"], t["q"].dtype, k_descale, v_descale, heads_kv=d.heads_kv,
                                 device=device)
        V.no_overlap({"out": t["out"], **({"lse": ls} if ls is not None else {})}, {**feats.inputs(), **scales.inputs()})
        kv = "dense" if pt is None else f"paged{d.page}"
        wanted = {"dtype": t["q"].dtype, "head_dim": d.head_dim, "kv": kv, "layout": "dense" if cuq is None else "ragged",
                  **scales.fields, **feats.fields}
        if (feats.any or scales.kv_dtype == FP8) and runtime.find(FAMILY, device, [wanted]) is None:
            raise missing_kernel((FAMILY,), wanted)
        kernel = runtime.select(FAMILY, device, [wanted])
        facts = kernel.artifact.launch.extra  # the tile the cubin was built with
        columns = decode_columns(d.heads_q, d.heads_kv, d.seqlen_q, int(facts["rows_per_cta"]))
        if chunks is None:
            chunks = decode_chunks(columns, driver.multiprocessor_count(device), int(facts["ctas_per_sm"]))
            chunks = min(chunks, MAX_CHUNK_SLOTS - d.batch)
        if not isinstance(chunks, int) or isinstance(chunks, bool) or not 1 <= chunks <= MAX_CHUNK_SLOTS - d.batch:
            raise ArgumentError("chunks", chunks, f"an int in [1, {MAX_CHUNK_SLOTS - d.batch}] "
                                                  f"({MAX_CHUNK_SLOTS} - B) or None")
        self.chunks = chunks
        self.workspace_bytes = workspace_bytes(d.batch, d.seqlen_q, d.heads_q, d.head_dim, chunks)
        ws = self._stream_ws = None
        ws_ptr = lp_ptr = counters_ptr = 0  # an arena's: set at each launch, for its stream
        rows = d.seqlen_q * d.heads_q
        if self.workspace_bytes:
            partials = _partials_bytes(chunks + d.batch, rows, d.head_dim)
            rows_per_cta = int(facts["rows_per_cta"])

            def pointers(ptr: int, nbytes: int) -> tuple[int, int, int, int]:
                """o_partial, lse_partial, counters and the counters' count in a workspace of nbytes at ptr."""
                at = workspace_layout(d.batch, d.seqlen_q, d.heads_q, d.heads_kv, d.head_dim, chunks, nbytes,
                                      rows_per_cta)
                return ptr, ptr + at["lse_partial"], ptr + at["counters"], at["n_counters"]

            if workspace is None:  # the stream's buffer of the runtime's arena (aotc.runtime.workspace)
                self._stream_ws = StreamBuffers(runtime.workspaces, device, partials, self.workspace_bytes - partials,
                                                lambda buf: pointers(buf.ptr, buf.nbytes)[:3])
            else:
                ws = self._workspace(workspace, device, t, sl, pt, ls, {**feats.inputs(), **scales.inputs()})
                ws_ptr, lp_ptr, counters_ptr, n_counters = pointers(ws.ptr, ws.nbytes_span()[1] - ws.ptr)
                driver.memset_d32(counters_ptr, 0, n_counters)  # every step leaves them zero again
        q_, k_, v_, o_ = t["q"], t["k_cache"], t["v_cache"], t["out"]
        lse_strides = (0, 0, 0) if ls is None else ((0, *ls.strides) if cuq is not None else ls.strides)
        # (batch, token, head) strides: ragged Q/O have no batch axis, LSE [H_q, total_q]
        q_strides, o_strides = ((0, *x.strides[:2]) if cuq is not None else x.strides[:3] for x in (q_, o_))
        pt_strides = pt.strides if pt is not None else (0, 0)
        values = {
            "q": q_.ptr, "k": k_.ptr, "v": v_.ptr, "o": o_.ptr, "lse": 0 if ls is None else ls.ptr,
            "o_partial": ws_ptr, "lse_partial": lp_ptr, "counters": counters_ptr,
            "page_table": 0 if pt is None else pt.ptr, "seqlens_kv": sl.ptr, "cu_seqlens_q": 0 if cuq is None else cuq.ptr,
            "batch": d.batch, "seqlen_q": d.seqlen_q, "heads_q": d.heads_q, "heads_kv": d.heads_kv,
            "target_chunks": chunks, "max_pages": 0 if pt is None else pt.shape[1], "write_lse": int(ls is not None),
            "softmax_scale": float(softmax_scale),
            "q_stride_b": q_strides[0], "q_stride_s": q_strides[1], "q_stride_h": q_strides[2],
            "k_stride_page": d.k_strides[0], "k_stride_token": d.k_strides[1], "k_stride_head": d.k_strides[2],
            "v_stride_page": d.v_strides[0], "v_stride_token": d.v_strides[1], "v_stride_head": d.v_strides[2],
            "o_stride_b": o_strides[0], "o_stride_s": o_strides[1], "o_stride_h": o_strides[2],
            "lse_stride_b": lse_strides[0], "lse_stride_h": lse_strides[1], "lse_stride_s": lse_strides[2],
            "pt_stride_b": pt_strides[0], "pt_stride_p": pt_strides[1],
            # partials [chunk slot, S_q, H_q, D] and [chunk slot, H_q, S_q], fp32
            "op_stride_chunk": rows * d.head_dim, "op_stride_s": d.heads_q * d.head_dim, "op_stride_h": d.head_dim,
            "lp_stride_chunk": rows, "lp_stride_h": d.seqlen_q, "lp_stride_s": 1,
            **feats.values,
            **scales.values,
        }
        self.features = feats
        self.has_lse = ls is not None
        self.paged = pt is not None
        self.ragged = cuq is not None
        self.bind(kernel, decode_grid(columns, chunks, d.batch) if d.batch else (0, 0, 0), device, values)
        self.layout = _layout(q_, o_, ls)
        self.layout_of = V.layouts_of({"q": q_, "out": o_, "lse": ls, "seqlens_kv": sl, "page_table": pt})
        self._slots = self.slots("q", "o", "lse", "seqlens_kv", "page_table", "cu_seqlens_q")
        self._ws_slots = self.slots("o_partial", "lse_partial", "counters")
        self._mq, self._mo, self._ml, self._msl, self._mpt, self._mcq = self.masks(
            "q", "o", "lse", "seqlens_kv", "page_table", "cu_seqlens_q")
        # what a step's outputs must never overlap: the caches and the workspace (fixed), q and the lengths
        # and page table (new pointers a step may give; the prepared ones otherwise)
        self.workspace = ws  # what the kernel writes besides out and lse (None: no split)
        self._spans = V.Spans({"k_cache": k_, "v_cache": v_, **feats.inputs(), **scales.inputs()},
                              {"out": o_, "lse": ls},
                              {"q": q_, "seqlens_kv": sl, "page_table": pt, "cu_seqlens_q": cuq},
                              written={"workspace": ws})
        self._sl_ptr, self._pt_ptr = sl.ptr, 0 if pt is None else pt.ptr
        self._cq_ptr = 0 if cuq is None else cuq.ptr

    def set_lse_head_stride(self, stride: int) -> None:
        """A ragged plan's LSE [H_q, total_q] head stride for the next steps (Runtime.attention's steps of
        another token count; the caller checked the new layout)."""
        self.launcher.params.slots["lse_stride_h"].value = stride

    def _workspace(self, workspace, device: int, t: dict, sl, pt, ls, inputs: dict) -> TensorArg:
        """The caller's workspace, checked: large enough, and overlapping no tensor the kernel reads (sinks
        included)."""
        ws = as_output(workspace, "workspace")
        lo, hi = ws.nbytes_span()
        V.cuda_device({"workspace": ws}, device)
        if hi - lo < self.workspace_bytes or not V.is_packed(ws):
            raise ArgumentError("workspace", f"{hi - lo} bytes", f"a contiguous device buffer of at least "
                                                                f"{self.workspace_bytes} bytes ({self.chunks} chunks)")
        V.aligned(ws, "workspace", 16)
        V.no_overlap({"workspace": ws}, {**t, **inputs, "seqlens_kv": sl, **({"page_table": pt} if pt else {}),
                                         **({"lse": ls} if ls else {})})
        return ws

    def run(self, q: int, out: int, lse: int = 0, seqlens_kv: int = 0, page_table: int = 0, stream: int = 0,
            cu_seqlens_q: int = 0) -> None:
        """One decode step with new raw pointers (0 for seqlens_kv/page_table/cu_seqlens_q keeps the prepared
        ones)."""
        if self.launcher.empty:
            return
        if (q & self._mq or out & self._mo or lse & self._ml or seqlens_kv & self._msl or page_table & self._mpt
                or cu_seqlens_q & self._mcq):
            raise self.misaligned(("q", "o", "lse", "seqlens_kv", "page_table", "cu_seqlens_q"),
                                  (q, out, lse, seqlens_kv, page_table, cu_seqlens_q))
        self.check_lse(lse)
        if page_table and not self.paged:
            raise ArgumentError("page_table", hex(page_table), "0 (the plan reads a dense KV cache)")
        if cu_seqlens_q and not self.ragged:
            raise ArgumentError("cu_seqlens_q", hex(cu_seqlens_q), "0 (the plan's queries are [B, S_q, H_q, D])")
        self.launch_checked(q, out, lse, seqlens_kv, page_table, cu_seqlens_q, stream)

    def launch_checked(self, q: int, out: int, lse: int, seqlens_kv: int, page_table: int, cu_seqlens_q: int,
                       stream: int) -> None:
        """run()'s launch, for pointers a caller has checked as run() does (AttentionPlan, whose pointer
        checks are these)."""
        s = self._slots
        s[0].value = q
        s[1].value = out
        s[2].value = lse
        # 0: the prepared tensor (not the last call's, which the overlap checks no longer see)
        s[3].value = seqlens_kv or self._sl_ptr
        s[4].value = page_table or self._pt_ptr
        s[5].value = cu_seqlens_q or self._cq_ptr
        if self._stream_ws is not None:
            self._stream_ws.write(stream, self._ws_slots)
        self._launch(stream)

    def __call__(self, q, out, lse=None, *, seqlens_kv=None, page_table=None, stream=None) -> None:
        """One decode step on tensors shaped like the prepared ones."""
        seen = torch_layouts(q, out, lse) if seqlens_kv is None and page_table is None else None
        if seen is not None and seen == self._torch_seen:  # torch tensors laid out as ones checked before
            q, out, lse = q.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr()
            self._spans.check_pointers((out, lse), (q, self._sl_ptr, self._pt_ptr, self._cq_ptr))
            self.run(q, out, lse, 0, 0, as_stream(stream))
            return
        q_, o_ = as_tensor(q, "q"), as_output(out, "out")
        ls = None if lse is None else as_output(lse, "lse")
        if _layout(q_, o_, ls) != self.layout:
            V.same_layouts({"q": q_, "out": o_, "lse": ls}, self.layout_of)
        sl_ptr = pt_ptr = 0
        if seqlens_kv is not None:
            sl = as_tensor(seqlens_kv, "seqlens_kv")
            V.same_layouts({"seqlens_kv": sl}, self.layout_of)
            sl_ptr = sl.ptr
        if page_table is not None:
            pt = as_tensor(page_table, "page_table")
            V.same_layouts({"page_table": pt}, self.layout_of)
            pt_ptr = pt.ptr
        self._torch_seen = seen
        self.checked_run(q_.ptr, o_.ptr, 0 if ls is None else ls.ptr, sl_ptr, pt_ptr, as_stream(stream))

    def checked_run(self, q: int, out: int, lse: int = 0, seqlens_kv: int = 0, page_table: int = 0,
                    stream: int = 0) -> None:
        """run() for pointers of tensors laid out as the prepared ones, after checking that out and lse
        overlap no input (the one-call APIs and the torch ops come here)."""
        self._spans.check_pointers((out, lse), (q, seqlens_kv or self._sl_ptr, page_table or self._pt_ptr,
                                                self._cq_ptr))
        self.run(q, out, lse, seqlens_kv, page_table, stream)


def _layout(q: TensorArg, o: TensorArg, ls: TensorArg | None) -> tuple:
    return (q.shape, q.strides, q.dtype, q.device, o.shape, o.strides, o.dtype, o.device,
            None if ls is None else (ls.shape, ls.strides, ls.dtype, ls.device))


def check_decode(runtime, device: int, t: dict[str, TensorArg], sl: TensorArg, pt: TensorArg | None,
                 ls: TensorArg | None, max_seqlen_kv, kv_layout: str, cuq: TensorArg | None = None,
                 decode_query_len: int = 0) -> DecodeShape:
    """Validate every argument before anything is prepared; raises ArgumentError naming the first bad one.
    cuq: ragged queries (q/out [total_q, H_q, D], LSE [H_q, total_q]) of at most decode_query_len a sequence."""
    q, k, v, o = t["q"], t["k_cache"], t["v_cache"], t["out"]
    V.dtype(q, "q", DTYPES)
    V.dtype(o, "out", (q.dtype,))
    check_kv_dtypes(k, v, q.dtype)  # (fp8: its scales are checked by the plan, kv_scales)
    if cuq is None:
        V.ndim(q, "q", 4, "B, S_q, H_q, D")
        V.ndim(o, "out", 4, "B, S_q, H_q, D")
        batch, seqlen_q, heads_q, head_dim = q.shape
        if not 1 <= seqlen_q <= MAX_SEQLEN_Q:
            raise ArgumentError("q.shape[1]", seqlen_q, f"S_q in [1, {MAX_SEQLEN_Q}] new tokens (use prefill for more)")
    else:
        V.ndim(q, "q", 3, "total_q, H_q, D")
        V.ndim(o, "out", 3, "total_q, H_q, D")
        V.int32_vector(cuq, "cu_seqlens_q", "B + 1")
        if cuq.shape[0] < 1:
            raise ArgumentError("cu_seqlens_q.shape[0]", 0, "B + 1 >= 1")
        V.int_in(decode_query_len, "decode_query_len", 1, MAX_SEQLEN_Q, "")
        batch, seqlen_q = cuq.shape[0] - 1, decode_query_len
        _, heads_q, head_dim = q.shape
    for axis in range(len(q.shape)):
        V.dim(o, "out", axis, "dim", q.shape[axis], "the shape of q")
    V.kv_layout(kv_layout)
    for name in ("k_cache", "v_cache"):
        V.ndim(t[name], name, 4, "pages, page_size, H_kv, D (NHD) or pages, H_kv, page_size, D (HND); dense: "
                                 "B, S, H_kv, D (NHD) or B, H_kv, S, D (HND)")
    tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)
    if pt is None:  # dense [B, S, H_kv, D] (NHD) or [B, H_kv, S, D] (HND)
        V.dim(k, "k_cache", 0, "B", batch, "from q")
        page = 0
    else:
        page = k.shape[tok_ax]
        if k.shape[0] == 0:
            raise ArgumentError("k_cache.shape[0]", 0, "at least one page (the page table's entries index the pool)")
    heads_kv = k.shape[head_ax]
    for axis in range(4):
        V.dim(v, "v_cache", axis, "dim", k.shape[axis], "the shape of k_cache")
    V.dim(k, "k_cache", 3, "D", head_dim, "from q")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ArgumentError(f"k_cache.shape[{head_ax}]", heads_kv, f"H_kv dividing H_q = {heads_q}")
    heads = runtime.field_values(FAMILY, "head_dim", device)
    if head_dim not in heads:
        raise ArgumentError("q.shape[3]", head_dim, f"a head dim the loaded kernels cover: {sorted(heads)}")
    V.optional_count(max_seqlen_kv, "max_seqlen_kv", "the longest KV length a step uses")
    V.int32_vector(sl, "seqlens_kv", "B")
    V.dim(sl, "seqlens_kv", 0, "B", batch, "from q")
    tensors = dict(t, seqlens_kv=sl)
    if pt is not None:
        if f"paged{page}" not in KV_CHOICES:
            raise ArgumentError(f"k_cache.shape[{tok_ax}]", page, "a page size of 16, 32, 64 or 128")
        V.dtype(pt, "page_table", ("int32",))
        V.ndim(pt, "page_table", 2, "B, max_pages")
        V.dim(pt, "page_table", 0, "B", batch, "from q")
        V.int32_extent(pt.shape[1], "page_table.shape[1]")  # max_pages, an i32 parameter
        if max_seqlen_kv is not None and pt.shape[1] * page < max_seqlen_kv:
            raise ArgumentError("page_table.shape[1]", pt.shape[1],
                                f"at least ceil(max_seqlen_kv / page_size) = {-(-max_seqlen_kv // page)} pages")
        V.aligned(pt, "page_table", 4)
        tensors["page_table"] = pt
    elif max_seqlen_kv is not None and k.shape[tok_ax] < max_seqlen_kv:
        raise ArgumentError(f"k_cache.shape[{tok_ax}]", k.shape[tok_ax],
                            f"at least max_seqlen_kv = {max_seqlen_kv} (dense KV)")
    if ls is not None:
        V.lse_output(ls, (("B", batch), ("H_q", heads_q), ("S_q", seqlen_q)) if cuq is None else
                     (("H_q", heads_q), ("total_q", q.shape[0])), "from q")
        tensors["lse"] = ls
    if cuq is not None:
        tensors["cu_seqlens_q"] = cuq
    V.cuda_device(tensors, device)
    for name in ("q", "k_cache", "v_cache", "out"):
        x = t[name]
        V.unit_stride(x, name, len(x.shape) - 1)
        V.aligned(x, name, 16)
        V.stride_multiple(x, name, range(len(x.shape) - 1), kv_stride_multiple(x.dtype))  # 16 bytes
    V.no_self_overlap(o, "out")
    V.int32_extent(batch, "B")
    if batch >= MAX_CHUNK_SLOTS or heads_kv > 65535:
        raise ArgumentError("B" if batch >= MAX_CHUNK_SLOTS else "H_kv", max(batch, heads_kv),
                            f"B below {MAX_CHUNK_SLOTS} (the chunk schedule's limit), H_kv at most 65535")
    if seqlen_q * heads_q > V.INT32_MAX:  # a sequence's rows, 32-bit in the kernel (heads_q an i32 parameter)
        raise ArgumentError("H_q", heads_q, f"at most {V.INT32_MAX // seqlen_q} (S_q * H_q rows of a sequence "
                                            "are 32-bit in the kernel)")
    V.no_overlap({"out": o, **({"lse": ls} if ls is not None else {})},
                 {"q": q, "k_cache": k, "v_cache": v, "seqlens_kv": sl, **({"page_table": pt} if pt else {}),
                  **({"cu_seqlens_q": cuq} if cuq else {})})
    return DecodeShape(batch, seqlen_q, heads_q, head_dim, heads_kv, page,
                       (k.strides[0], k.strides[tok_ax], k.strides[head_ax]),
                       (v.strides[0], v.strides[tok_ax], v.strides[head_ax]))


def decode(runtime, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *, max_seqlen_kv=None,
           kv_layout="NHD", chunks=None, workspace=None, softmax_scale=None, window_left=None, softcap=None,
           sinks=None, k_descale=None, v_descale=None, stream=None) -> None:
    """One call (Runtime.decode): the plan for these caches, layouts and workspace is prepared once and cached
    (without a workspace of the caller's it takes room in the runtime's arena, aotc.runtime.workspace; the
    plan is not per stream, so a CUDA graph captured on its own stream after a warm-up call reuses it)."""
    max_seqlen_kv, chunks, window_left = V.as_ints(max_seqlen_kv, chunks, window_left)
    V.key_scalars(max_seqlen_kv=max_seqlen_kv, kv_layout=kv_layout, chunks=chunks, softmax_scale=softmax_scale,
                  window_left=window_left, softcap=softcap)
    seen = torch_layouts(q, k_cache, v_cache, out, seqlens_kv, page_table, lse, workspace, sinks, k_descale,
                         v_descale)
    s = as_stream(stream)
    # typed: softmax_scale=True or chunks=4.0 (refused when a plan is made) never find the plan of 1 or 4
    scalars = V.typed(max_seqlen_kv, kv_layout, chunks, softmax_scale) + feature_scalars(window_left, softcap)
    if seen is not None:  # torch tensors: a key from their layouts and the caches' pointers (see torch_key)
        fast = torch_key(FAMILY, runtime.device(), seen, (k_cache, v_cache, workspace, sinks, k_descale, v_descale),
                         scalars)
        plan = runtime.plans.get(fast)
        if plan is not None:
            plan.checked_run(q.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(),
                             seqlens_kv.data_ptr(), 0 if page_table is None else page_table.data_ptr(), s)
            return
    recs = [None if x is None else (as_output if n in ("out", "lse", "workspace") else as_tensor)(x, n) for x, n in
            ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (out, "out"), (seqlens_kv, "seqlens_kv"),
             (page_table, "page_table"), (lse, "lse"), (workspace, "workspace"))]
    qr, kr, vr, outr, slr, ptr, lsr, wsr = recs
    extra = [None if x is None else as_tensor(x, n) for x, n in
             ((sinks, "sinks"), (k_descale, "k_descale"), (v_descale, "v_descale"))]
    snk, kds, vds = extra
    key = (FAMILY, runtime.device(), kr.ptr, vr.ptr,
           None if wsr is None else (wsr.ptr, wsr.shape, wsr.strides, wsr.dtype, wsr.device),
           tuple(None if r is None else (r.shape, r.strides, r.dtype, r.device) for r in recs[:7]),
           scalars,
           tuple(None if x is None else (x.ptr, x.shape, x.strides, x.dtype, x.device) for x in extra))
    plan = cached_plan(runtime, key, lambda: DecodePlan(
        runtime, qr, kr, vr, outr, slr, ptr, lsr, max_seqlen_kv=max_seqlen_kv, kv_layout=kv_layout, chunks=chunks,
        workspace=wsr, softmax_scale=softmax_scale, window_left=window_left, softcap=softcap, sinks=snk,
        k_descale=kds, v_descale=vds))
    if seen is not None:
        runtime.remember_plan(fast, plan)
    plan.checked_run(qr.ptr, outr.ptr, 0 if lsr is None else lsr.ptr, slr.ptr, 0 if ptr is None else ptr.ptr, s)
