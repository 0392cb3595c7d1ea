"""The serving entry point: one attention call per layer per step over a batch that mixes decode rows and
chunked-prefill rows, queries ragged, keys and values in a paged KV cache.

    rt.attention(q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, lse=None, causal=True,
                 softmax_scale=None, kv_layout="NHD", stream=None)
    plan = rt.prepare_attention(...)   # validate once; plan(q, out, lse, ...) / plan.run(pointers) per step

q/out [total_q, H_q, D] (head dim contiguous), cu_seqlens_q int32 [B + 1] on the device (any query count
per sequence, 0 included; rows of q past cu_seqlens_q[B] are not written), seqlens_kv int32 [B] = each
sequence's full KV length (its new tokens included: write them first, e.g. with a KV-write kernel),
page_table int32 [B, max_pages] (any strides), K/V pools NHD [pages, page_size, H_kv, D] or HND
[pages, H_kv, page_size, D] (kv_layout; K and V may have their own strides). Causal is bottom-right per
sequence: query i of a sequence with s_q new tokens and s_kv keys sees keys j <= i + s_kv - s_q; a row
that sees no key gets O = 0, LSE = -inf. LSE fp32 natural log [H_q, total_q].

Two kernels share a call, each reading the device-side lengths at every launch and taking its own rows:
the decode kernel (sdpa_decode, layout ragged: GQA-packed, the batch's kv blocks cut into equal chunks
merged in the same launch, so a few long contexts still fill the GPU) takes the sequences of 1 ..
decode_query_len queries, the paged prefill kernel (sdpa_prefill_sm90, layout pagedP: wgmma tiles of
GQA-packed rows, a persistent grid drawing them from the stream's tile counter, aotc.runtime.counters) every
longer one; where no loaded Hopper kernel serves
the call on this device, the portable one (sdpa_prefill, layout pagedP: mma.sync, any GQA group, a grid
from the call's max_seqlen_q; aotc.runtime.attention_portable). So the plan holds no per-step
schedule, and a CUDA graph captured once replays with new lengths, page tables and query splits.
decode_query_len=0 (or no loaded ragged decode kernel) gives every row to the paged prefill kernel; a
max_seqlen_q <= decode_query_len (a call's bound on its query counts) skips its launch, and a min_seqlen_q >
decode_query_len (a lower bound: a step an engine knows holds no decode row, vLLM's num_decodes == 0) skips the
decode kernel's and gives the paged kernel every row, so a wrong lower bound costs speed, never rows (the
decode kernel's launch, with nothing to do, cost a 2048-token chunk alone about 3 us of its 78: see the chunk
rows of benchmarks/results/paged_varlen.json). The two run one after the other on the call's stream, or, with a
step's prefill_sms=N, side by side: the paged kernel's persistent grid on N SMs, the decode kernel on the
runtime's second stream (Runtime.side_stream) between a fork and a join of events (driver.Fork), taking the
other SMs and each one the paged kernel leaves (benchmarks/probes/mixed_overlap.py). max_seqlen_kv (a bound on the
KV lengths, as engines pass it) picks the paged kernel's widest kv tile whose launch fact picked_from_seqlen_kv it
reaches (D128: 176 keys, FA3's tile, against 128, from 4096 keys at every page size;
aotc.families.sdpa_prefill_sm90.PICKED_FROM_SEQLEN_KV); past the keys the page table holds
(page_table.shape[1] * page_size; dense KV: S_max) it is refused. A step of fewer tiles than SMs (short suffixes
over long contexts) has the paged kernel split each tile's kv blocks over several CTAs, merged in the same launch,
with a workspace from the runtime's split arena (Runtime.split_workspaces; aotc.families.sdpa_prefill_sm90's
KV splits). Both kernels' workspaces are the launch stream's buffers (aotc.runtime.workspace), as its tile
counter is, so steps on two streams (two overlapped micro-batches) may run at once through one Runtime.

Dense KV (page_table=None): k_cache/v_cache [B, S_max, H_kv, D] (kv_layout "NHD") or [B, H_kv, S_max, D]
("HND"), any strides with the head dim contiguous, are the same memory seen as a pool of pages
(dense_as_pool: the largest page size the loaded kernels serve that divides S_max and the batch stride),
with a page table the plan builds once (sequence b's j-th page is b * pages_a_sequence + j), so the same two
kernels run; seqlens_kv[b] <= S_max.

A plan is fixed by layouts, not by the token count: a step may bring q/out (and lse) of another total_q
(q's first extent) with the prepared strides, and the plan re-encodes Q's descriptor for it (a few
microseconds, kept for the last few counts) instead of preparing anew, so an engine's eager steps, each
with its own token count, reuse one plan per layer.
"""
from __future__ import annotations

import dataclasses
from bisect import bisect_right
from dataclasses import dataclass

from ..common.errors import ArgumentError
from ..families.schedulers import ragged_grid
from ..families.sdpa_decode import MAX_SEQLEN_Q as DECODE_MAX_Q
from ..families.sdpa_prefill_sm90 import MAX_KV_SPLITS, Q_BOX_ROWS
from . import validate as V
from .driver import multiprocessor_count
from .dlpack import torch_layouts
from .features import check_feature_scalars, check_features, feature_scalars, missing_kernel
from .decode import MAX_CHUNK_SLOTS, DecodePlan
from .kv_scales import check_kv_dtypes, check_kv_scales, kv_stride_multiple
from .plan import Plan, cached_plan, torch_key
from .prefill import PICKED_FROM, hopper_candidates, split_buffers
from .tensors import TensorArg, as_output, as_stream, as_tensor
from .tma import DescriptorSlot, TiledRecipe, element_bytes
from .attention_portable import PORTABLE, PortableLaunch, check_grid, portable_fields, prefill_family, served_pages

FAMILY = "sdpa_prefill_sm90"
DECODE = "sdpa_decode"

ENTRY = "attention"
PREPARED = object()  # run()'s max_seqlen_q default: the bound the plan was prepared with
DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class AttentionShape:
    """What check_attention() found: extents, page size and the pools' (page, token, head) strides."""

    batch: int
    total_q: int
    heads_q: int
    heads_kv: int
    head_dim: int
    page: int
    pages: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]


def _check_operands(t: dict[str, TensorArg], kv_layout: str) -> tuple:
    """check_attention's first part, every kernel's: q/out and the pools' dtypes, ranks and shapes.
    Returns (total_q, H_q, D, page, H_kv, pages, the pools' token axis, their head axis)."""
    q, k, v, o = t["q"], t["k_cache"], t["v_cache"], t["out"]
    V.dtype(q, "q", DTYPES)
    V.dtype(o, "out", (q.dtype,))
    check_kv_dtypes(k, v, q.dtype)  # q's dtype, or fp8_e4m3 (its scales: check_kv_scales)
    V.ndim(q, "q", 3, "total_q, H_q, D")
    V.ndim(o, "out", 3, "total_q, H_q, D")
    total_q, heads_q, head_dim = q.shape
    for axis in range(3):
        V.dim(o, "out", axis, "dim", q.shape[axis], "the shape of q")
    V.kv_layout(kv_layout)
    for name in ("k_cache", "v_cache"):
        V.ndim(t[name], name, 4, "pages, page_size, H_kv, D (NHD) or pages, H_kv, page_size, D (HND)")
    tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)
    page, heads_kv, pages = k.shape[tok_ax], k.shape[head_ax], k.shape[0]
    for axis in range(4):
        V.dim(v, "v_cache", axis, "dim", k.shape[axis], "the shape of k_cache")
    V.dim(k, "k_cache", 3, "D", head_dim, "from q")
    if pages == 0:
        raise ArgumentError("k_cache.shape[0]", 0, "at least one page (the page table's entries index the pool)")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ArgumentError(f"k_cache.shape[{head_ax}]", heads_kv, f"H_kv dividing H_q = {heads_q}")
    return total_q, heads_q, head_dim, page, heads_kv, pages, tok_ax, head_ax


def check_attention(runtime, device: int, t: dict[str, TensorArg], cuq: TensorArg, sl: TensorArg, pt: TensorArg,
                    ls: TensorArg | None, kv_layout: str) -> AttentionShape:
    """Validate every argument before anything is prepared; raises ArgumentError naming the first bad one
    (for the Hopper kernel: check_portable_attention is the portable kernel's)."""
    total_q, heads_q, head_dim, page, heads_kv, pages, tok_ax, head_ax = _check_operands(t, kv_layout)
    group = heads_q // heads_kv
    if not 1 <= group <= Q_BOX_ROWS:  # group 0 (H_q = 0): no query head to pack, and Q's box needs one
        raise ArgumentError("H_q / H_kv", group, f"1 to {Q_BOX_ROWS}: the kernel packs each token's query heads of "
                                                  f"a KV head into one {Q_BOX_ROWS}-row slab")
    pages_served = sorted(int(x[len("paged"):]) for x in runtime.field_values(FAMILY, "layout", device)
                          if str(x).startswith("paged"))
    if page not in pages_served:
        raise ArgumentError(f"k_cache.shape[{tok_ax}]", page, f"a page size the loaded kernels serve: {pages_served}")
    return _check_metadata(device, t, cuq, sl, pt, ls, total_q, heads_q, heads_kv, head_dim, page, pages, tok_ax,
                           head_ax)


def _check_metadata(device: int, t: dict[str, TensorArg], cuq: TensorArg, sl: TensorArg, pt: TensorArg,
                    ls: TensorArg | None, total_q: int, heads_q: int, heads_kv: int, head_dim: int, page: int,
                    pages: int, tok_ax: int, head_ax: int) -> AttentionShape:
    """check_attention's last part, every kernel's: the lengths, the page table, LSE, devices, strides,
    alignment and overlaps."""
    q, k, v, o = t["q"], t["k_cache"], t["v_cache"], t["out"]
    group = heads_q // heads_kv
    V.int32_vector(cuq, "cu_seqlens_q", "B + 1")
    V.int32_vector(sl, "seqlens_kv", "B")
    if cuq.shape[0] < 1:
        raise ArgumentError("cu_seqlens_q.shape[0]", 0, "B + 1 >= 1")
    batch = cuq.shape[0] - 1
    V.dim(sl, "seqlens_kv", 0, "B", batch, "cu_seqlens_q.shape[0] - 1")
    V.dtype(pt, "page_table", ("int32",))
    V.ndim(pt, "page_table", 2, "B, max_pages")
    V.dim(pt, "page_table", 0, "B", batch, "cu_seqlens_q.shape[0] - 1")
    V.aligned(pt, "page_table", 4)
    for name, val in (("B", batch), ("total_q", total_q), ("H_q", heads_q), ("page_table.shape[1]", pt.shape[1]),
                      ("page_table.shape[1] * page_size", pt.shape[1] * page)):
        V.int32_extent(val, name)
    if total_q * group > V.INT32_MAX:
        raise ArgumentError("total_q", total_q, f"at most {V.INT32_MAX // group} (packed rows are 32-bit)")
    tensors = dict(t, cu_seqlens_q=cuq, seqlens_kv=sl, page_table=pt)
    if ls is not None:
        V.lse_output(ls, (("H_q", heads_q), ("total_q", total_q)), "from q")
        tensors["lse"] = ls
    V.cuda_device(tensors, device)
    for name in ("q", "k_cache", "v_cache", "out"):
        x = t[name]
        V.unit_stride(x, name, 3 if name in ("k_cache", "v_cache") else 2)
        V.aligned(x, name, 16)
        V.stride_multiple(x, name, range(len(x.shape) - 1), kv_stride_multiple(x.dtype))
    # a plan serves other token counts with these strides: the token stride must suit any count
    for name in ("q", "out"):
        x = t[name]
        if q_token_bytes(x) is None:
            raise ArgumentError(f"{name}.stride[0]", x.strides[0], "a positive multiple of 8 elements below 2^40 bytes "
                                                                   "(the token stride of every step's count)")
    V.no_self_overlap(o, "out")
    V.no_overlap({"out": o, **({"lse": ls} if ls is not None else {})},
                 {n: x for n, x in tensors.items() if n not in ("out", "lse")})
    return AttentionShape(batch, total_q, heads_q, heads_kv, head_dim, page, pages,
                          (k.strides[0], k.strides[tok_ax], k.strides[head_ax]),
                          (v.strides[0], v.strides[tok_ax], v.strides[head_ax]))


def check_portable_attention(runtime, device: int, t: dict[str, TensorArg], cuq: TensorArg, sl: TensorArg,
                             pt: TensorArg, ls: TensorArg | None, kv_layout: str) -> AttentionShape:
    """check_attention for the portable paged kernel (aotc.runtime.attention_portable): one query head a CTA,
    so any H_q / H_kv group; the page sizes its loaded kernels serve; H_q and B within its grid's y and z."""
    total_q, heads_q, head_dim, page, heads_kv, pages, tok_ax, head_ax = _check_operands(t, kv_layout)
    if heads_q == 0:
        raise ArgumentError("q.shape[1]", 0, "at least one query head")
    pages_served = served_pages(runtime, device, PORTABLE)
    if page not in pages_served:
        raise ArgumentError(f"k_cache.shape[{tok_ax}]", page, f"a page size the loaded kernels serve: {pages_served}")
    d = _check_metadata(device, t, cuq, sl, pt, ls, total_q, heads_q, heads_kv, head_dim, page, pages, tok_ax,
                        head_ax)
    V.int32_extent(pages, "k_cache.shape[0]")  # the kernel bounds page ids by a 32-bit page count
    check_grid(d.batch, d.heads_q)
    return d


@dataclass(frozen=True)
class DensePool:
    """Dense K/V as page pools (dense_as_pool): the pool views, the page size, and the page table's rows
    (sequence b's pages are b * stride_pages + j, j < per_seq)."""

    k_pool: TensorArg
    v_pool: TensorArg
    page: int
    stride_pages: int
    per_seq: int

    def page_table(self, batch: int) -> bytes:
        """The table's int32 entries, [B, per_seq] row-major."""
        import array

        return array.array("i", [b * self.stride_pages + j for b in range(batch) for j in range(self.per_seq)]).tobytes()


def dense_as_pool(k: TensorArg, v: TensorArg, kv_layout: str, batch: int, pages_served: list[int]) -> DensePool:
    """Dense caches [B, S_max, H_kv, D] ("NHD") or [B, H_kv, S_max, D] ("HND") as pools of pages of P tokens
    over the same memory: page (b, j) starts at token j * P of sequence b, so the pool's page stride is P
    token strides, and sequence b's first page is b * (batch stride / page stride): P is the largest page
    size served that divides S_max and both caches' batch strides in whole pages."""
    if kv_layout not in ("NHD", "HND"):
        raise ArgumentError("kv_layout", kv_layout, "'NHD' ([B, S_max, H_kv, D] dense) or 'HND' ([B, H_kv, S_max, D])")
    tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)
    for name, x in (("k_cache", k), ("v_cache", v)):
        V.ndim(x, name, 4, "B, S_max, H_kv, D (dense NHD) or B, H_kv, S_max, D (dense HND) without a page table")
        V.dim(x, name, 0, "B", batch, "cu_seqlens_q.shape[0] - 1")
    for axis in range(4):
        V.dim(v, "v_cache", axis, "dim", k.shape[axis], "the shape of k_cache")
    for name, x in (("k_cache", k), ("v_cache", v)):
        if batch > 1 and x.strides[0] < 0:  # sequence b's pages start at b * step: a page id below 0
            raise ArgumentError(f"{name}.stride[0]", x.strides[0], "a batch stride of 0 or more (dense KV is read as "
                                                                  "the pages of one pool; a flipped batch cannot be)")
    s_max = k.shape[tok_ax]

    def fits(p: int) -> bool:
        if s_max % p:
            return False
        steps = set()
        for x in (k, v):
            page_stride = p * x.strides[tok_ax]
            if batch > 1:
                if page_stride <= 0 or x.strides[0] % page_stride:
                    return False
                steps.add(x.strides[0] // page_stride)
        return len(steps) <= 1

    page = next((p for p in sorted(pages_served, reverse=True) if s_max and fits(p)), None)
    if page is None:
        raise ArgumentError(f"k_cache.shape[{tok_ax}]", s_max,
                            f"dense KV without a page table: S_max > 0 a multiple of a page size the loaded kernels "
                            f"serve ({pages_served}), with each cache's batch stride a multiple of page_size token "
                            f"strides (k_cache.stride = {k.strides}, v_cache.stride = {v.strides})")
    per_seq = s_max // page
    step = k.strides[0] // (page * k.strides[tok_ax]) if batch > 1 else per_seq
    pages = (batch - 1) * step + per_seq

    def pool(x: TensorArg) -> TensorArg:
        ss, sh = x.strides[tok_ax], x.strides[head_ax]
        if kv_layout == "NHD":
            return dataclasses.replace(x, shape=(pages, page, x.shape[2], x.shape[3]), strides=(page * ss, ss, sh, 1))
        return dataclasses.replace(x, shape=(pages, x.shape[1], page, x.shape[3]), strides=(page * ss, sh, ss, 1))

    return DensePool(pool(k), pool(v), page, step, per_seq)


def _recipes(kernel, t: dict, d: AttentionShape, dtype: str) -> tuple[dict, int]:
    """TMA recipes and the kernel's kv_groups_per_page: Q (D, H_q, total_q) with a box of (64 columns, group heads,
    64 // group tokens), one GQA-packed 64-row slab (its last 64 % group rows left as they are: padding). K and V:
    a row-group kernel's (kv_view row_groups) rank 5 over the pool's groups of 8 rows (_row_group_recipes); the
    others' rank 4 over the pool, (D, page, H_kv, pages), boxes of the recipe's box_rows inside one page (the
    family's kv_box_rows), 64 columns a box, or an fp8 pool's whole e4m3 rows swizzled over a row's bytes
    (kv_box_cols, kv_swizzle_bytes)."""
    tma = kernel.artifact.launch.extra["tma"]
    elem = element_bytes(dtype)
    kv_dtype = t["k_cache"].dtype
    kv_elem = element_bytes(kv_dtype)
    group = d.heads_q // d.heads_kv
    q = t["q"]
    # the token stride is q's own whatever the count (a plan serves later counts with it: checked by
    # check_attention), never the placeholder of an extent-1 axis
    recipes = {"q": TiledRecipe(dtype, (d.head_dim, d.heads_q, max(1, d.total_q)),
                                (*_byte_strides(elem, (q.strides[1], d.heads_q)), q.strides[0] * elem),
                                (int(tma["box_cols"]), group, Q_BOX_ROWS // group),
                                int(tma["swizzle_bytes"]), int(tma["l2_promotion_bytes"]))}
    groups_per_page = 0
    if tma.get("kv_view") == "row_groups":
        kv, groups_per_page = _row_group_recipes(tma, d, kv_dtype)
        recipes.update(kv)
    else:
        for name, strides in (("k", d.k_strides), ("v", d.v_strides)):
            page_s, tok_s, head_s = strides
            recipes[name] = TiledRecipe(
                kv_dtype, (d.head_dim, d.page, d.heads_kv, d.pages),
                _byte_strides(kv_elem, (tok_s, d.page), (head_s, d.heads_kv), (page_s, d.pages)),
                (int(tma.get("kv_box_cols", tma["box_cols"])), int(tma["box_rows"][name]), 1, 1),
                int(tma.get("kv_swizzle_bytes", tma["swizzle_bytes"])), int(tma["l2_promotion_bytes"]))
    for name, r in recipes.items():
        r.check({"q": "q", "k": "k_cache", "v": "v_cache"}[name])
    return recipes, groups_per_page


# row-group coordinates the kernel computes in int32 (a page's past 2^31 would wrap: it takes them as out of the pool)
_MAX_ROW_GROUPS = 1 << 31


def _groups_per_page(d: AttentionShape) -> int:
    """The page stride of both pools in strides of 8 rows (each page's first row group is page * that), or 0 where
    it is no whole number of them for either pool, they differ, or the pool's groups would pass 2^31. A pool of one
    page needs no page stride: its groups are P / 8."""
    if d.pages == 1:
        return d.page // 8
    per_page = []
    for page_s, tok_s, _ in (d.k_strides, d.v_strides):
        if tok_s <= 0 or page_s <= 0 or page_s % (8 * tok_s):
            return 0
        per_page.append(page_s // (8 * tok_s))
    k, v = per_page
    return k if k == v and k * d.pages <= _MAX_ROW_GROUPS else 0


def _row_group_recipes(tma: dict, d: AttentionShape, kv_dtype: str) -> tuple[dict, int]:
    """16-bit pools (kv_view row_groups): K and V rank 5 over the pool's groups of 8 rows, (64 columns, 8 rows,
    D / 64 chunks, row groups, H_kv) with byte strides (token, 128, 8 tokens, head), a box of box_rows whole rows;
    where _groups_per_page finds none, (64 columns, P rows, chunks, H_kv, pages) with byte strides (token, 128, head,
    page) and boxes of one 8-row group (the kernel then copies each group from its page)."""
    elem = element_bytes(kv_dtype)
    cols = int(tma["box_cols"])
    chunks = d.head_dim // cols
    per_page = _groups_per_page(d)
    recipes = {}
    for name, (page_s, tok_s, head_s) in (("k", d.k_strides), ("v", d.v_strides)):
        if per_page:
            dims = (cols, 8, chunks, d.pages * per_page, d.heads_kv)
            strides = _byte_strides(elem, (tok_s, 8), (cols, chunks), (8 * tok_s, d.pages * per_page),
                                    (head_s, d.heads_kv))
            box = (cols, 8, chunks, int(tma["box_rows"][name]) // 8, 1)
        else:
            dims = (cols, d.page, chunks, d.heads_kv, d.pages)
            strides = _byte_strides(elem, (tok_s, d.page), (cols, chunks), (head_s, d.heads_kv), (page_s, d.pages))
            box = (cols, 8, chunks, 1, 1)
        recipes[name] = TiledRecipe(kv_dtype, dims, strides, box, int(tma["swizzle_bytes"]),
                                    int(tma["l2_promotion_bytes"]))
    return recipes, per_page


def _byte_strides(elem: int, *dims: tuple[int, int]) -> tuple[int, ...]:
    """TMA byte strides of (stride in elements, extent) pairs: a dim of extent 1 is never stepped over, so
    16 bytes stand in for its stride, which may be 0 or anything (a broadcast, a slice of one)."""
    return tuple(s * elem if n > 1 else 16 for s, n in dims)


@dataclass(frozen=True)
class _Rows:
    """What a step's token count fixes: Q's descriptor (its extent), the byte ranges of q, out and lse for
    the overlap checks, and LSE's head stride ([H_q, total_q] strides follow the count)."""

    descriptor: DescriptorSlot
    spans: V.Spans
    lse_stride_h: int


class AttentionPlan(Plan):
    """Ragged queries over a paged KV cache, one call a step whatever its token count (see the module
    docstring)."""

    family = ENTRY
    MAX_ROW_COUNTS = 16  # token counts whose Q descriptor and spans a plan keeps

    def __init__(self, runtime, q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, lse=None, *,
                 causal: bool = True, softmax_scale: float | None = None, kv_layout: str = "NHD",
                 max_seqlen_q: int | None = None, decode_query_len: int = 1, max_seqlen_kv: int | None = None,
                 window_left: int | None = None, softcap: float | None = None, sinks=None, workspace=None,
                 k_descale=None, v_descale=None, min_seqlen_q: int | None = None):
        """workspace: the decode rows' split workspace (DecodePlan's: a caller's buffer; None: room in the
        device's arena, aotc.runtime.workspace). k_descale, v_descale: an fp8_e4m3 cache's scales
        (aotc.runtime.kv_scales)."""
        max_seqlen_q, decode_query_len, max_seqlen_kv, window_left, min_seqlen_q = V.as_ints(
            max_seqlen_q, decode_query_len, max_seqlen_kv, window_left, min_seqlen_q)
        t = {"q": as_tensor(q, "q"), "k_cache": as_tensor(k_cache, "k_cache"), "v_cache": as_tensor(v_cache, "v_cache"),
             "out": as_output(out, "out")}
        cuq = as_tensor(cu_seqlens_q, "cu_seqlens_q")
        sl = as_tensor(seqlens_kv, "seqlens_kv")
        ls = None if lse is None else as_output(lse, "lse")
        check_scalars(causal, max_seqlen_q, max_seqlen_kv, decode_query_len, min_seqlen_q, kv_layout=kv_layout,
                      softmax_scale=softmax_scale, window_left=window_left, softcap=softcap)
        device = runtime.device()
        self.dense = None
        if page_table is None:  # dense KV: the caches as page pools, with a page table of the plan's own
            V.int32_vector(cuq, "cu_seqlens_q", "B + 1")
            if cuq.shape[0] < 2:
                raise ArgumentError("cu_seqlens_q.shape[0]", cuq.shape[0],
                                    "B + 1 >= 2 with dense KV (page_table=None): an empty batch has no cache to read; "
                                    "skip the call, or pass a paged pool and page table, which take B = 0")
            batch = cuq.shape[0] - 1
            # the Hopper kernels' page sizes, else (none loaded for this device) the portable ones'
            served = served_pages(runtime, device, FAMILY) or served_pages(runtime, device, PORTABLE)
            self.dense = dense_as_pool(t["k_cache"], t["v_cache"], kv_layout, batch, served)
            t["k_cache"], t["v_cache"] = self.dense.k_pool, self.dense.v_pool
            from . import driver

            self._dense_table = driver.DeviceBuffer(max(4, 4 * batch * self.dense.per_seq))
            driver.copy_to_device(self._dense_table.ptr, self.dense.page_table(batch))
            pt = TensorArg(self._dense_table.ptr, (batch, self.dense.per_seq), (self.dense.per_seq, 1), "int32",
                           ("cuda", device))
        else:
            pt = as_tensor(page_table, "page_table")
        # the longer rows' kernel: the Hopper one where it serves the call, else the portable one
        self.prefill_family = prefill_family(runtime, device, t["q"], t["k_cache"], kv_layout, causal, window_left,
                                             softcap, sinks)
        hopper = self.prefill_family == FAMILY
        d = (check_attention if hopper else check_portable_attention)(runtime, device, t, cuq, sl, pt, ls, kv_layout)
        # the keys a sequence can have: the kernels cut a longer seqlens_kv at its page-table row's end
        self._kv_pages = (pt.shape[1], d.page, 1 if kv_layout == "NHD" else 2)  # (max_pages, page, token axis)
        self.check_max_seqlen_kv(max_seqlen_kv)
        softmax_scale = V.softmax_scale(softmax_scale, d.head_dim)
        feats = check_features(window_left, softcap, sinks, heads_q=d.heads_q, device=device, causal=causal,
                               softmax_scale=softmax_scale)
        scales = check_kv_scales(t["k_cache"], t["v_cache"], t["q"].dtype, k_descale, v_descale, heads_kv=d.heads_kv,
                                 device=device)
        V.no_overlap({"out": t["out"], **({"lse": ls} if ls is not None else {})}, {**feats.inputs(), **scales.inputs()})
        dtype = t["q"].dtype
        wanted = {"dtype": dtype, "head_dim": d.head_dim, "layout": f"paged{d.page}", "causal": causal,
                  **scales.fields, **feats.fields}
        if hopper:
            kernel = runtime.find(FAMILY, device, hopper_candidates(runtime, device, wanted, max_seqlen_kv or 0))
        else:
            kernel = runtime.find(PORTABLE, device, portable_fields(wanted))
        if kernel is None and feats.any:
            raise missing_kernel((FAMILY, PORTABLE), wanted)
        if kernel is None:
            raise ArgumentError("q/k_cache", wanted, f"a loaded {FAMILY} or {PORTABLE} kernel for these fields on this "
                                                     f"device (build one: aotc build with layout = \"paged{d.page}\")")
        # the decode rows' kernel, where one is loaded (always causal: bottom-right within the new tokens) and
        # its schedule's limits allow (a batch of 32767 sequences or more, over 65535 KV heads: the paged
        # kernel takes every row)
        decode_kv = {"dtype": dtype, "head_dim": d.head_dim, "kv": f"paged{d.page}", "layout": "ragged",
                     **scales.fields, **feats.fields}
        if (not causal or d.batch >= MAX_CHUNK_SLOTS or d.heads_kv > 65535
                or runtime.find(DECODE, device, [decode_kv]) is None):
            decode_query_len = 0
        self.decode = None
        if decode_query_len:
            self.decode = DecodePlan(runtime, t["q"], t["k_cache"], t["v_cache"], t["out"], sl, pt, ls,
                                     kv_layout=kv_layout, softmax_scale=softmax_scale, cu_seqlens_q=cuq,
                                     decode_query_len=decode_query_len, window_left=window_left, softcap=softcap,
                                     sinks=feats.sinks, workspace=workspace, k_descale=scales.k,
                                     v_descale=scales.v)
        self.decode_query_len = decode_query_len
        self.portable = None
        kv_groups_per_page = 0
        if hopper:
            recipes, kv_groups_per_page = _recipes(kernel, t, d, dtype)
            self.descriptors = tuple(DescriptorSlot(recipes[n], t[c].ptr)
                                     for n, c in (("q", "q"), ("k", "k_cache"), ("v", "v_cache")))
            self._q_recipe = recipes["q"]
            inputs = {"tma_" + n: x.data for n, x in zip("qkv", self.descriptors)}
        else:  # Q, K and V as pointers with their strides: nothing to encode per token count
            self.portable = PortableLaunch(kernel, t, d)
            self.descriptors, self._q_recipe = (), None
            inputs = self.portable.values
        o_, q_ = t["out"], t["q"]
        lse_strides = (0, 0) if ls is None else ls.strides
        values = {
            **inputs,
            "o": o_.ptr, "lse": 0 if ls is None else ls.ptr, "cu_seqlens_q": cuq.ptr, "cu_seqlens_kv": 0,
            "page_table": pt.ptr, "seqlens_kv": sl.ptr,
            "batch": d.batch, "seqlen_q": 0, "seqlen_kv": 0, "heads_q": d.heads_q, "heads_kv": d.heads_kv,
            "write_lse": int(ls is not None), "max_pages": pt.shape[1], "min_seqlen_q": decode_query_len + 1,
            "softmax_scale": float(softmax_scale),
            "o_stride_b": 0, "o_stride_s": o_.strides[0], "o_stride_h": o_.strides[1],
            "lse_stride_b": 0, "lse_stride_h": lse_strides[0], "lse_stride_s": lse_strides[1],
            "pt_stride_b": pt.strides[0], "pt_stride_p": pt.strides[1],
            "tile_counter": 0,  # the stream's, per launch (a Hopper kernel draws its tiles: RaggedTiles)
            "kv_groups_per_page": kv_groups_per_page,
            "split_partials": 0, "split_counters": 0, "kv_splits_max": 1,  # no KV splits (_split_workspace)
            **feats.values,
            **scales.values,
        }
        self.features = feats
        self.has_lse = ls is not None
        self.shape = d
        # no launch when nothing is left for it: an empty batch, or every sequence a decode row
        self._longer = max_seqlen_q is None or max_seqlen_q > decode_query_len  # the calls' default
        self._no_decode_rows = self.no_decode_rows(min_seqlen_q)  # likewise
        self._bound = max_seqlen_q  # the portable grid's default bound (run(max_seqlen_q=PREPARED))
        if not d.batch:
            grid = (0, 0, 0)
        else:
            grid = ragged_grid(multiprocessor_count(device)) if hopper else self.portable.grid(max_seqlen_q, d.total_q)
        self._split_ws = None
        if hopper and d.batch and kernel.artifact.launch.extra.get("kv_splits"):
            values = self._split_workspace(runtime, device, kernel, grid[0], d.head_dim, values)
        self.bind(kernel, grid, device, values)
        self._counters = runtime.tile_counters if hopper and kernel.artifact.launch.extra.get("draws_tiles") else None
        if self._counters is not None:
            self._counters.reserve(device)
            self._counter_slot = self.slots("tile_counter")[0]
        if self._split_ws is not None:
            self._split_slots = self.slots("split_partials", "split_counters")
        self._ptr_names = ("tma_q" if hopper else "q", "o", "lse", "cu_seqlens_q", "seqlens_kv", "page_table")
        self._q_slot, self._lse_h_slot = self.slots(self._ptr_names[0], "lse_stride_h")
        self._slots = self.slots("o", "lse", "cu_seqlens_q", "seqlens_kv", "page_table", "min_seqlen_q")
        self._masks = self.masks(*self._ptr_names)
        if self.portable is not None:
            self.portable.bind(self)
        self.layout = _layout(q_, o_, ls, cuq, sl, pt, rows_free=True)
        self._fixed = {"k_cache": t["k_cache"], "v_cache": t["v_cache"], **feats.inputs(), **scales.inputs()}
        # the decode rows' split workspace (a caller's): written by that kernel, so apart from every output and input
        self._written = {"workspace": None if self.decode is None else self.decode.workspace}
        self._meta = {"cu_seqlens_q": cuq, "seqlens_kv": sl, "page_table": pt}
        self._io = (q_, o_, ls)
        self._rows = {}
        self._total_q = d.total_q
        self._current = self._rows[d.total_q, lse_strides[0]] = _Rows(
            self.descriptors[0] if hopper else None, V.Spans(self._fixed, {"out": o_, "lse": ls}, {"q": q_, **self._meta}, self._written),
            lse_strides[0])
        self._prepared = (cuq.ptr, sl.ptr, pt.ptr)
        self._runtime = runtime  # its second stream, for steps with prefill_sms
        self._fork = None

    def _split_workspace(self, runtime, device: int, kernel, ctas: int, head_dim: int, values: dict) -> dict:
        """The paged kernel's KV-split workspace (aotc.families.sdpa_prefill_sm90.split_workspace_bytes for its grid):
        the launch stream's buffer of the runtime's split arena (aotc.runtime.workspace), the partials at its front
        and the counters at its back, set at each launch (run); the kernel's values with its bound."""
        self._split_ws, self.split_partials_bytes = split_buffers(runtime, device, ctas,
                                                                  int(kernel.artifact.launch.extra["block_m"]), head_dim)
        return {**values, "split_partials": 0, "split_counters": 0, "kv_splits_max": MAX_KV_SPLITS}

    def split_partials_at(self, stream: int) -> int:
        """The address of the KV splits' partials (split_partials_bytes) in `stream`'s split workspace, the one the
        plan's launches on that stream write (tests poison it)."""
        return self._split_ws.values(stream)[0]

    def _rows_for(self, total_q: int, lse_stride_h: int) -> _Rows:
        """The descriptor and spans of a step of total_q tokens (LSE rows lse_stride_h apart), checked as the
        plan's own were when it was prepared."""
        rows = self._rows.get((total_q, lse_stride_h))
        if rows is not None:
            return rows
        d = self.shape
        group = d.heads_q // d.heads_kv
        if not isinstance(total_q, int) or total_q < 0 or total_q * group > V.INT32_MAX:
            raise ArgumentError("total_q", total_q, f"an int in [0, {V.INT32_MAX // group}] (packed rows are 32-bit)")
        q0, o0, l0 = self._io
        q_ = dataclasses.replace(q0, shape=(total_q, *q0.shape[1:]))
        o_ = dataclasses.replace(o0, shape=(total_q, *o0.shape[1:]))
        V.stride_multiple(o_, "out", range(2), 8)
        V.no_self_overlap(o_, "out")
        ls = None
        if l0 is not None:
            ls = dataclasses.replace(l0, shape=(d.heads_q, total_q), strides=(lse_stride_h, l0.strides[1]))
            V.no_self_overlap(ls, "lse")
        descriptor = None  # the portable kernel's Q is a pointer
        if self._q_recipe is not None:
            recipe = dataclasses.replace(self._q_recipe, dims=(*self._q_recipe.dims[:2], max(1, total_q)))
            recipe.check("q")
            descriptor = DescriptorSlot(recipe, q_.ptr)
        rows = _Rows(descriptor,
                     V.Spans(self._fixed, {"out": o_, "lse": ls}, {"q": q_, **self._meta}, self._written), lse_stride_h)
        if len(self._rows) >= self.MAX_ROW_COUNTS:
            self._rows.pop(next(iter(self._rows)))
        self._rows[total_q, lse_stride_h] = rows
        return rows

    def check_max_seqlen_kv(self, max_seqlen_kv: int | None) -> None:
        """A step's bound on its KV lengths against the keys the page table (dense: S_max) holds: a longer
        sequence would be cut at its row's end, its output silently wrong."""
        max_pages, page, tok_ax = self._kv_pages
        if max_seqlen_kv is None or max_seqlen_kv <= max_pages * page:
            return
        if self.dense is not None:
            raise ArgumentError(f"k_cache.shape[{tok_ax}]", max_pages * page,
                                f"at least max_seqlen_kv = {max_seqlen_kv} (dense KV)")
        raise ArgumentError("page_table.shape[1]", max_pages,
                            f"at least ceil(max_seqlen_kv / page_size) = {-(-max_seqlen_kv // page)} pages")

    def no_decode_rows(self, min_seqlen_q: int | None) -> bool:
        """Whether a step with this lower bound on its query counts leaves the decode kernel nothing (it is not
        launched then, and the paged kernel takes every row)."""
        return self.decode is not None and min_seqlen_q is not None and min_seqlen_q > self.decode_query_len

    def run(self, q: int, out: int, lse: int = 0, cu_seqlens_q: int = 0, seqlens_kv: int = 0, page_table: int = 0,
            stream: int = 0, max_seqlen_q: int | None | object = PREPARED,
            min_seqlen_q: int | None | object = PREPARED, prefill_sms: int | None = None) -> None:
        """One step with new raw pointers for the token count the plan was last given (0: the prepared
        metadata tensor); max_seqlen_q, min_seqlen_q: this step's bounds on its query counts (None: no bound;
        by default the prepared ones), taken as given (checked_run checks them); prefill_sms: see
        Runtime.attention (None: the two kernels one after the other on `stream`)."""
        if self._total_q == 0:  # no query: nothing to launch (an empty tensor's pointer may be 0)
            return
        cu, sl, pt = self._prepared
        self._check_dense(page_table)
        cu_seqlens_q, seqlens_kv, page_table = cu_seqlens_q or cu, seqlens_kv or sl, page_table or pt
        ptrs = (q, out, lse, cu_seqlens_q, seqlens_kv, page_table)
        if any(p & m for p, m in zip(ptrs, self._masks)):
            raise self.misaligned(self._ptr_names, ptrs)
        self.check_lse(lse)
        longer = (self._longer if max_seqlen_q is PREPARED
                  else max_seqlen_q is None or max_seqlen_q > self.decode_query_len)
        alone = longer and (self._no_decode_rows if min_seqlen_q is PREPARED else self.no_decode_rows(min_seqlen_q))
        decode_runs = self.decode is not None and not self.decode.launcher.empty and not alone
        if self.launcher.empty or not longer:
            if decode_runs:
                self.decode.launch_checked(q, out, lse, seqlens_kv, page_table, cu_seqlens_q, stream)
            return
        if self.portable is not None:  # its grid follows the step's bound on its query counts
            self.portable.set(q, self._bound if max_seqlen_q is PREPARED else max_seqlen_q, self._total_q)
        else:
            data = self._current.descriptor.update(q)
            if data is not None:
                self._q_slot.raw = data
        s = self._slots
        s[0].value, s[1].value, s[2].value, s[3].value, s[4].value = out, lse, cu_seqlens_q, seqlens_kv, page_table
        s[5].value = 1 if alone else self.decode_query_len + 1  # the sequences it takes: 1 query or more
        if self._counters is not None:
            self._counter_slot.value = self._counters.get(self.device, stream)
        if self._split_ws is not None:
            self._split_ws.write(stream, self._split_slots)
        if decode_runs and prefill_sms is not None and self.portable is None and prefill_sms < self.launcher.grid[0]:
            # side by side: the paged kernel's persistent grid on prefill_sms SMs, the decode kernel on the
            # runtime's second stream taking the others (and each SM the paged kernel leaves)
            fork = self._fork_of()
            side = fork.begin(stream)
            self.launcher.with_grid_x(prefill_sms)(stream)
            self.decode.launch_checked(q, out, lse, seqlens_kv, page_table, cu_seqlens_q, side)
            fork.end(stream)
            return
        if decode_runs:
            self.decode.launch_checked(q, out, lse, seqlens_kv, page_table, cu_seqlens_q, stream)
        self._launch(stream)

    def _fork_of(self):
        """The plan's driver.Fork over its runtime's second stream (its events made at the first forked step)."""
        fork = self._fork
        if fork is None:
            from .driver import Fork

            fork = self._fork = Fork(self._runtime.side_stream(self.device))
        return fork

    def _check_dense(self, page_table: int) -> None:
        if page_table and self.dense is not None:
            raise ArgumentError("page_table", hex(page_table), "0 or None: the plan reads a dense KV cache through a "
                                                               "page table of its own")

    def checked_run(self, q: int, out: int, lse: int = 0, cu_seqlens_q: int = 0, seqlens_kv: int = 0,
                    page_table: int = 0, stream: int = 0, total_q: int | None = None,
                    lse_stride_h: int | None = None, max_seqlen_q: int | None | object = PREPARED,
                    min_seqlen_q: int | None | object = PREPARED, prefill_sms: int | None = None) -> None:
        """run() for pointers of tensors laid out as the prepared ones but for their token count (total_q,
        and lse's head stride; None: as the last call), after checking that out and lse overlap no input;
        nothing about the plan changes for a call refused."""
        max_seqlen_q, min_seqlen_q, prefill_sms = V.as_ints(max_seqlen_q, min_seqlen_q, prefill_sms)
        check_step_bounds(None if max_seqlen_q is PREPARED else max_seqlen_q,
                          None if min_seqlen_q is PREPARED else min_seqlen_q, prefill_sms)
        rows = self._current
        if total_q is not None:
            sh = rows.lse_stride_h if lse_stride_h is None else lse_stride_h
            if (total_q, sh) != (self._total_q, rows.lse_stride_h):
                rows = self._rows_for(total_q, sh)
        cu, sl, pt = self._prepared
        self._check_dense(page_table)
        rows.spans.check_pointers((out, lse), (q, cu_seqlens_q or cu, seqlens_kv or sl, page_table or pt))
        if rows is not self._current:
            self._current, self._total_q = rows, total_q
            if rows.descriptor is not None:
                self._q_slot.raw = rows.descriptor.data
            self._lse_h_slot.value = rows.lse_stride_h
            if self.decode is not None:
                self.decode.set_lse_head_stride(rows.lse_stride_h)
        self.run(q, out, lse, cu_seqlens_q, seqlens_kv, page_table, stream, max_seqlen_q, min_seqlen_q, prefill_sms)

    def __call__(self, q, out, lse=None, *, cu_seqlens_q=None, seqlens_kv=None, page_table=None, stream=None,
                 prefill_sms: int | None = None) -> None:
        """One step on tensors laid out as the prepared ones (metadata: None keeps the prepared tensors)."""
        recs = [as_tensor(q, "q"), as_output(out, "out"), None if lse is None else as_output(lse, "lse")]
        meta = [None if x is None else as_tensor(x, n) for x, n in
                ((cu_seqlens_q, "cu_seqlens_q"), (seqlens_kv, "seqlens_kv"), (page_table, "page_table"))]
        got = _layout(*recs, *meta, rows_free=True)
        for i, (name, g, want) in enumerate(zip(("q", "out", "lse", "cu_seqlens_q", "seqlens_kv", "page_table"),
                                                got, self.layout)):
            if (i < 3 or g is not None) and g != want:
                raise ArgumentError(name, g, f"the layout the plan was prepared for: {want}")
        total_q = _total_q(recs[0], recs[1], recs[2])
        self.checked_run(recs[0].ptr, recs[1].ptr, 0 if recs[2] is None else recs[2].ptr,
                         *(0 if m is None else m.ptr for m in meta), as_stream(stream), total_q,
                         None if recs[2] is None else recs[2].strides[0], prefill_sms=prefill_sms)


def check_scalars(causal, max_seqlen_q, max_seqlen_kv, decode_query_len, min_seqlen_q=None, *, kv_layout="NHD",
                  softmax_scale=None, window_left=None, softcap=None, prefill_sms=None) -> None:
    """The call's scalar arguments (the one-call path checks them before building its key, which hashes them:
    a list or an array would raise a bare TypeError there; the plan when made)."""
    if not isinstance(causal, bool):
        raise ArgumentError("causal", causal, "True or False")
    check_step_bounds(max_seqlen_q, min_seqlen_q, prefill_sms)
    V.optional_count(max_seqlen_kv, "max_seqlen_kv", "a bound on the step's KV lengths")
    V.kv_layout(kv_layout)
    if softmax_scale is not None:
        V.softmax_scale_value(softmax_scale)
    check_feature_scalars(window_left, softcap)
    V.int_in(decode_query_len, "decode_query_len", 0, DECODE_MAX_Q,
             ": sequences of at most this many queries go to the decode kernel")


# A mixed step's two kernels side by side (prefill_sms) pay where the decode rows' DRAM time outweighs the chunks'
# tensor time by SIDE_BY_SIDE_RATIO: the paged kernel's persistent grid on half the SMs takes about twice as long and
# cannot widen once the decode kernel is done, so a step of equal halves gains nothing and one of more chunk than
# decode loses (0.82x; benchmarks/results/paged_varlen_prefill_sms.json). The rates are Hopper's, as measured by
# bench_paged_varlen: the decode rows' KV at ~4 TB/s (H200 4.3, H100 3.1), the chunks at ~600 TFLOP/s.
DECODE_BYTES_PER_US = 4.0e6
PREFILL_FLOPS_PER_US = 6.0e8
SIDE_BY_SIDE_RATIO = 1.5


def step_prefill_sms(sm_count: int, query_lens, kv_lens, *, heads_q: int, heads_kv: int, head_dim: int,
                     kv_itemsize: int = 2, decode_query_len: int = 1, causal: bool = True,
                     window_left: int | None = None) -> int | None:
    """The prefill_sms for a step of these host-side lengths (an engine's query_start_loc and seq_lens on the CPU,
    once a step for every layer): half the SMs where its decode rows (at most decode_query_len queries) read enough
    more KV than its longer rows compute (SIDE_BY_SIDE_RATIO), else None (one kernel after the other)."""
    decode_bytes, prefill_flops = 0, 0
    for s_q, s_kv in zip(query_lens, kv_lens):
        s_q, s_kv = int(s_q), int(s_kv)
        if s_q <= 0:
            continue
        if s_q <= decode_query_len:
            keys = s_kv if window_left is None else min(s_kv, window_left + 1)
            decode_bytes += 2 * keys * heads_kv * head_dim * kv_itemsize
        else:  # the keys each query sees: bottom-right causal, or every key; at most a window's
            seen = s_q * (s_kv - s_q) + s_q * (s_q + 1) // 2 if causal else s_q * s_kv
            if window_left is not None:
                seen = min(seen, s_q * (window_left + 1))
            prefill_flops += 4 * heads_q * head_dim * seen
    if not decode_bytes or not prefill_flops:
        return None
    side = decode_bytes / DECODE_BYTES_PER_US >= SIDE_BY_SIDE_RATIO * prefill_flops / PREFILL_FLOPS_PER_US
    return sm_count // 2 if side else None


def check_step_bounds(max_seqlen_q, min_seqlen_q, prefill_sms=None) -> None:
    """A step's bounds on its query counts (None: no bound), and its prefill_sms (None: no fork)."""
    V.optional_count(max_seqlen_q, "max_seqlen_q", "a bound on the step's query counts")
    V.optional_count(min_seqlen_q, "min_seqlen_q", "a lower bound on the query counts of the step's sequences")
    if prefill_sms is not None:
        V.int_in(prefill_sms, "prefill_sms", 1, V.INT32_MAX,
                 " or None: the SMs the paged prefill kernel runs on while the decode kernel takes the others")


def q_token_bytes(q: TensorArg) -> int | None:
    """q's token stride in bytes when a TMA descriptor can step with it (whatever the token count), else None."""
    b = q.strides[0] * q.itemsize
    return b if q.strides[0] > 0 and q.strides[0] % 8 == 0 and b < 1 << 40 else None


def _layout(*recs, rows_free: bool = False) -> tuple:
    """(shape, strides, dtype, device) of each tensor; rows_free: q, out and lse (the first three) without
    their token count (lse [H_q, total_q]: its head stride follows the count too)."""
    out = []
    for i, r in enumerate(recs):
        if r is None:
            out.append(None)
        elif rows_free and i < 2:
            out.append((r.shape[1:], r.strides, r.dtype, r.device))
        elif rows_free and i == 2:
            out.append((r.shape[:1], r.strides[1:], r.dtype, r.device))
        else:
            out.append((r.shape, r.strides, r.dtype, r.device))
    return tuple(out)


def _total_q(q: TensorArg, out: TensorArg, lse: TensorArg | None) -> int:
    """The step's token count: q's, out's and lse's must agree."""
    if out.shape[0] != q.shape[0]:
        raise ArgumentError("out.shape[0]", out.shape[0], f"total_q = {q.shape[0]} (from q)")
    if lse is not None and lse.shape[1] != q.shape[0]:
        raise ArgumentError("lse.shape[1]", lse.shape[1], f"total_q = {q.shape[0]} (from q)")
    return q.shape[0]


def attention(runtime, q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, lse=None, *, causal=True,
              softmax_scale=None, kv_layout="NHD", max_seqlen_q=None, decode_query_len=1, max_seqlen_kv=None,
              window_left=None, softcap=None, sinks=None, stream=None, k_descale=None, v_descale=None,
              min_seqlen_q=None, prefill_sms=None) -> None:
    """One call (Runtime.attention): the plan for these pools and layouts is prepared once and cached, whatever
    the step's token count (and whatever the stream: a CUDA graph captured on its own stream after a warm-up
    call reuses it)."""
    max_seqlen_q, decode_query_len, max_seqlen_kv, window_left, min_seqlen_q, prefill_sms = V.as_ints(
        max_seqlen_q, decode_query_len, max_seqlen_kv, window_left, min_seqlen_q, prefill_sms)
    seen = torch_layouts(q, out, lse, k_cache, v_cache, cu_seqlens_q, seqlens_kv, page_table, sinks, k_descale,
                         v_descale)
    # the scalars the plan keys on are checked first: causal=1 or decode_query_len=True would hash as a valid key
    check_scalars(causal, max_seqlen_q, max_seqlen_kv, decode_query_len, min_seqlen_q, kv_layout=kv_layout,
                  softmax_scale=softmax_scale, window_left=window_left, softcap=softcap, prefill_sms=prefill_sms)
    # a step's bounds change every step: the plan keys on what they decide (the kv tile: which of the loaded kernels'
    # picked_from_seqlen_kv facts max_seqlen_kv reaches), the step passes them
    device = runtime.device()
    kv_tile = 0 if max_seqlen_kv is None else bisect_right(runtime.fact_bounds(FAMILY, PICKED_FROM, device),
                                                           max_seqlen_kv)
    s = as_stream(stream)
    scalars = (causal, softmax_scale, kv_layout, decode_query_len, kv_tile, feature_scalars(window_left, softcap))
    if seen is not None:  # torch tensors: a key from their layouts (less the token count) and the pools' pointers
        fast = torch_key(ENTRY, device, _rows_free(seen), (k_cache, v_cache, sinks, k_descale, v_descale),
                         scalars)
        plan = runtime.plans.get(fast)
        if plan is not None:
            total_q = q.shape[0]
            if out.shape[0] != total_q or (lse is not None and lse.shape[1] != total_q):
                _total_q(as_tensor(q, "q"), as_output(out, "out"), None if lse is None else as_output(lse, "lse"))
            plan.check_max_seqlen_kv(max_seqlen_kv)
            plan.checked_run(q.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(),
                             cu_seqlens_q.data_ptr(), seqlens_kv.data_ptr(),
                             0 if page_table is None else page_table.data_ptr(), s,
                             total_q, None if lse is None else lse.stride(0), max_seqlen_q, min_seqlen_q,
                             prefill_sms)
            return
    recs = [None if x is None else (as_output if n in ("out", "lse") else as_tensor)(x, n) for x, n in
            ((q, "q"), (out, "out"), (lse, "lse"), (k_cache, "k_cache"), (v_cache, "v_cache"),
             (cu_seqlens_q, "cu_seqlens_q"), (seqlens_kv, "seqlens_kv"), (page_table, "page_table"), (sinks, "sinks"),
             (k_descale, "k_descale"), (v_descale, "v_descale"))]
    qr, outr, lsr, kr, vr, cur, slr, ptr_, snk, kds, vds = recs
    key = (ENTRY, device, kr.ptr, vr.ptr, *(None if x is None else x.ptr for x in (snk, kds, vds)),
           _layout(*recs, rows_free=True), scalars)
    plan = cached_plan(runtime, key, lambda: AttentionPlan(
        runtime, qr, kr, vr, outr, cur, slr, ptr_, lsr, causal=causal, softmax_scale=softmax_scale,
        kv_layout=kv_layout, max_seqlen_q=max_seqlen_q, decode_query_len=decode_query_len,
        max_seqlen_kv=max_seqlen_kv if kv_tile else None, window_left=window_left, softcap=softcap, sinks=snk,
        k_descale=kds, v_descale=vds))
    total_q = _total_q(qr, outr, lsr)  # the ranks are the plan's, checked when it was made
    plan.check_max_seqlen_kv(max_seqlen_kv)  # the plan saw it only when it reaches a wider tile (it keys on kv_tile)
    if seen is not None:
        runtime.remember_plan(fast, plan)
    plan.checked_run(qr.ptr, outr.ptr, 0 if lsr is None else lsr.ptr, cur.ptr, slr.ptr, 0 if ptr_ is None else ptr_.ptr,
                     s, total_q, None if lsr is None else lsr.strides[0], max_seqlen_q, min_seqlen_q, prefill_sms)


def _rows_free(seen: tuple) -> tuple:
    """torch_layouts of (q, out, lse, ...) less the token count (see _layout)."""
    q, out, lse, *rest = seen  # (the rest: caches, metadata and sinks as they are)
    return ((q[0][1:], q[1], q[2], q[3]), (out[0][1:], out[1], out[2], out[3]),
            None if lse is None else (lse[0][:1], lse[1][1:], lse[2], lse[3]), *rest)
