"""sdpa_prefill's runtime API: flash-attention forward over dense or ragged (THD) tensors.

    rt.prefill(q, k, v, out, lse=None, causal=False, softmax_scale=None, stream=None)
        q/out [B, S_q, H_q, D], k/v [B, S_kv, H_kv, D] (any strides with head dim contiguous)
    rt.prefill_ragged(q, k, v, out, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, lse=None, ...)
        q/out [total_q, H_q, D], k/v [total_kv, H_kv, D], cu_seqlens int32 [B + 1] on the device
    plan = rt.prepare_prefill(...)   # validate once; plan(...) / plan.run(pointers) per call

Causal masks are aligned bottom-right: query i of a sequence sees keys j <= i + S_kv - S_q.
LSE (natural log, fp32) is [B, H_q, S_q] dense or [H_q, total_q] ragged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..common.errors import ArgumentError
from ..families.schedulers import persistent_grid
from ..families.sdpa_prefill_sm90 import split_workspace_bytes
from . import validate as V
from .driver import multiprocessor_count
from .dlpack import torch_layouts
from .features import check_features, feature_scalars, missing_kernel
from .plan import Plan, cached_plan, torch_key
from .tensors import TensorArg, as_output, as_stream, as_tensor
from .tma import DescriptorSlot, TiledRecipe, element_bytes
from .workspace import StreamBuffers

FAMILY = "sdpa_prefill"
HOPPER = "sdpa_prefill_sm90"
DTYPES = ("fp16", "bf16")
MAX_GRID_YZ = 65535
PICKED_FROM = "picked_from_seqlen_kv"  # the launch fact by which dispatch picks a head dim's kv tile
_PAGED_ONLY = ("page_table", "seqlens_kv", "max_pages", "min_seqlen_q", "pt_stride_b", "pt_stride_p",
               "k_descale", "v_descale", "descale_stride_h",  # (these three: fp8 KV, paged only)
               "kv_groups_per_page", "split_partials", "split_counters", "kv_splits_max")


@dataclass(frozen=True)
class PrefillShape:
    """What check_prefill() found (ragged: seqlen_q/seqlen_kv are max_seqlen_q/max_seqlen_kv)."""

    batch: int
    seqlen_q: int
    seqlen_kv: int
    heads_q: int
    heads_kv: int
    head_dim: int


def _axes(ragged: bool):
    """(batch, sequence, head) stride of a [B, S, H, D] (dense) or [T, H, D] (ragged: no batch) tensor."""
    if ragged:
        return lambda x: (0, x.strides[0], x.strides[1])
    return lambda x: (x.strides[0], x.strides[1], x.strides[2])


class _PointerInputs:
    """The portable family's launch: Q, K, V as pointers with Int64 strides; grid (m_blocks, H_q, B)."""

    def __init__(self, t: dict, ragged: bool):
        strides = _axes(ragged)
        self.values = {n: t[n].ptr for n in ("q", "k", "v")}
        for n in ("q", "k", "v"):
            self.values[f"{n}_stride_b"], self.values[f"{n}_stride_s"], self.values[f"{n}_stride_h"] = strides(t[n])

    @staticmethod
    def grid(m_blocks: int, d: PrefillShape, device: int) -> tuple[int, int, int]:
        return (m_blocks, d.heads_q, d.batch)

    def bind(self, plan: "PrefillPlan") -> None:
        self._slots = plan.slots("q", "k", "v")

    def set(self, q: int, k: int, v: int) -> None:
        s = self._slots
        s[0].value, s[1].value, s[2].value = q, k, v


class _TmaInputs:
    """The Hopper family's launch: Q, K, V as TMA descriptors (re-encoded only for a changed pointer); a
    persistent grid of at most one CTA per SM (aotc.families.schedulers.persistent_grid)."""

    def __init__(self, t: dict, recipes: dict):
        self.descriptors = tuple(DescriptorSlot(recipes[n], t[n].ptr) for n in ("q", "k", "v"))
        self.values = {"tma_" + n: d.data for n, d in zip(("q", "k", "v"), self.descriptors)}

    @staticmethod
    def grid(m_blocks: int, d: PrefillShape, device: int) -> tuple[int, int, int]:
        try:
            return persistent_grid(m_blocks, d.heads_q, d.batch, multiprocessor_count(device))
        except ValueError as e:
            raise ArgumentError("ceil(S_q / block_m) * H_q * B", m_blocks * d.heads_q * d.batch, f"below 2^31 ({e})")

    def bind(self, plan: "PrefillPlan") -> None:
        self._slots = plan.slots("tma_q", "tma_k", "tma_v")

    def set(self, q: int, k: int, v: int) -> None:
        for slot, desc, ptr in zip(self._slots, self.descriptors, (q, k, v)):
            data = desc.update(ptr)
            if data is not None:
                slot.raw = data


class PrefillPlan(Plan):
    """Both prefill families behind one API: the Hopper family where the device, the loaded kernels and
    the tensors allow it (family="auto"), the portable one otherwise; naming a family forces it."""

    family = FAMILY

    def __init__(self, runtime, q, k, v, out, lse=None, *, causal: bool = False, softmax_scale: float | None = None,
                 cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q: int | None = None,
                 max_seqlen_kv: int | None = None, specialize: bool = True, family: str = "auto",
                 window_left: int | None = None, softcap: float | None = None, sinks=None):
        max_seqlen_q, max_seqlen_kv, window_left = V.as_ints(max_seqlen_q, max_seqlen_kv, window_left)
        ragged = cu_seqlens_q is not None or cu_seqlens_kv is not None
        t = {"q": as_tensor(q, "q"), "k": as_tensor(k, "k"), "v": as_tensor(v, "v"), "out": as_output(out, "out")}
        ls = None if lse is None else as_output(lse, "lse")
        cuq = None if cu_seqlens_q is None else as_tensor(cu_seqlens_q, "cu_seqlens_q")
        cuk = None if cu_seqlens_kv is None else as_tensor(cu_seqlens_kv, "cu_seqlens_kv")
        if not isinstance(causal, bool):
            raise ArgumentError("causal", causal, "True or False")
        if family not in ("auto", FAMILY, HOPPER):
            raise ArgumentError("family", family, f"'auto', {FAMILY!r} or {HOPPER!r}")
        device = runtime.device()
        d = check_prefill(runtime, device, t, ls, ragged, cuq, cuk, max_seqlen_q, max_seqlen_kv)
        softmax_scale = V.softmax_scale(softmax_scale, d.head_dim)
        feats = check_features(window_left, softcap, sinks, heads_q=d.heads_q, device=device, causal=causal,
                               softmax_scale=softmax_scale)
        V.no_overlap({"out": t["out"], **({"lse": ls} if ls is not None else {})}, feats.inputs())
        dtype = t["q"].dtype
        wanted = {"dtype": dtype, "head_dim": d.head_dim, "layout": "ragged" if ragged else "dense", "causal": causal,
                  **feats.fields}
        self.ragged = ragged
        self.has_lse = ls is not None
        o_ = t["out"]
        strides = _axes(ragged)
        lse_strides = (0, 0, 0) if ls is None else ((0, *ls.strides) if ragged else ls.strides)  # ragged: [H_q, T]
        values = {
            "o": o_.ptr, "lse": 0 if ls is None else ls.ptr,
            "cu_seqlens_q": 0 if cuq is None else cuq.ptr, "cu_seqlens_kv": 0 if cuk is None else cuk.ptr,
            "batch": d.batch, "seqlen_q": d.seqlen_q, "seqlen_kv": d.seqlen_kv, "heads_q": d.heads_q,
            "heads_kv": d.heads_kv, "write_lse": int(ls is not None), "softmax_scale": float(softmax_scale),
            "lse_stride_b": lse_strides[0], "lse_stride_h": lse_strides[1], "lse_stride_s": lse_strides[2],
            **feats.values,
        }
        self.features = feats
        values["o_stride_b"], values["o_stride_s"], values["o_stride_h"] = strides(o_)
        kernel, self.inputs = self._choose(runtime, device, family, wanted, d, t, ls, ragged, dtype, specialize,
                                           feats.any)
        values.update(self.inputs.values)
        # the Hopper kernel's paged-layout parameters, unused by dense and ragged variants (but for the split
        # workspace of a dense non-causal one, set below)
        values.update({p.name: 0 for p in kernel.artifact.abi.params if p.name in _PAGED_ONLY})
        # a kernel that draws its tiles at run time gets its stream's counter per launch (aotc.runtime.counters)
        values["tile_counter"] = 0
        self._counters = runtime.tile_counters if kernel.artifact.launch.extra.get("draws_tiles") else None
        if self._counters is not None:
            self._counters.reserve(device)
        bm = int(kernel.artifact.launch.extra["block_m"])  # the tile of the cubin that runs, as it was built
        grid = self.inputs.grid((d.seqlen_q + bm - 1) // bm, d, device)
        # a dense non-causal Hopper kernel splits its launch's tail over a workspace of the stream's
        # (aotc.families.sdpa_prefill_sm90.TAIL_SPLIT_MIN_BLOCKS); kv_splits_max 2 lets it
        self._split_ws = None
        if kernel.artifact.launch.extra.get("tail_splits") and grid[0]:
            self._split_ws, _ = split_buffers(runtime, device, grid[0], bm, d.head_dim)
            values["kv_splits_max"] = 2
        self.layout = layout_key(t, ls, cuq, cuk, causal, softmax_scale, max_seqlen_q, max_seqlen_kv, feats.key)
        self.layout_of = V.layouts_of({**t, "lse": ls, "cu_seqlens_q": cuq, "cu_seqlens_kv": cuk})
        self.bind(kernel, grid, device, values)
        self.inputs.bind(self)
        self._slots = self.slots("o", "lse", "cu_seqlens_q", "cu_seqlens_kv")
        self._counter_slot = self.slots("tile_counter")[0] if self._counters is not None else None
        if self._split_ws is not None:
            self._split_slots = self.slots("split_partials", "split_counters")
        qkv = ("tma_q", "tma_k", "tma_v") if isinstance(self.inputs, _TmaInputs) else ("q", "k", "v")
        self._mq, self._mk, self._mv, self._mo, self._ml, self._mcq, self._mck = self.masks(
            *qkv, "o", "lse", "cu_seqlens_q", "cu_seqlens_kv")
        self._spans = V.Spans(feats.inputs(), {"out": o_, "lse": ls},
                              {"q": t["q"], "k": t["k"], "v": t["v"], "cu_seqlens_q": cuq, "cu_seqlens_kv": cuk})

    @staticmethod
    def _choose(runtime, device, family, wanted, d, t, ls, ragged, dtype, specialize, features: bool):
        """(kernel, launch strategy): the Hopper family's TMA launch when it fits, else the portable one
        (features: the call asks for some, and a missing kernel is the features' error)."""
        if family != FAMILY:
            kernel = runtime.find(HOPPER, device, hopper_candidates(runtime, device, wanted, d.seqlen_kv))
            refusal = None if kernel is not None else f"no loaded {HOPPER} kernel fits {wanted} on this device"
            if kernel is not None:
                recipes, refusal = hopper_recipes(kernel, t, ragged, dtype)
            if refusal is None:
                return kernel, _TmaInputs(t, recipes)
            if family == HOPPER:
                raise ArgumentError("family", family, f"a usable {HOPPER} kernel: {refusal}")
        # the packed kernels' offsets inside a batch are 32-bit (aotc.kernels.sdpa_prefill)
        packed = (specialize and not ragged and all(V.is_packed(x) for x in t.values())
                  and (ls is None or V.is_packed(ls))
                  and all(math.prod(x.shape[1:]) <= V.INT32_MAX for x in (*t.values(), *([ls] if ls else []))))
        candidates = ([{**wanted, "strides": "packed"}] if packed else []) + [{**wanted, "strides": "general"}]
        if features and runtime.find(FAMILY, device, candidates) is None:
            raise missing_kernel((HOPPER, FAMILY) if family == "auto" else (family,), wanted)
        kernel = runtime.select(FAMILY, device, candidates)
        return kernel, _PointerInputs(t, ragged)

    def run(self, q: int, k: int, v: int, out: int, lse: int = 0, cu_seqlens_q: int = 0, cu_seqlens_kv: int = 0,
            stream: int = 0) -> None:
        """Launch with new raw pointers for the prepared layouts (only alignment is rechecked)."""
        if self.launcher.empty:
            return
        if (q & self._mq or k & self._mk or v & self._mv or out & self._mo or lse & self._ml
                or cu_seqlens_q & self._mcq or cu_seqlens_kv & self._mck):
            raise self.misaligned(("q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_kv"),
                                  (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv))
        self.check_lse(lse)
        if self.ragged and not (cu_seqlens_q and cu_seqlens_kv):
            raise ArgumentError("cu_seqlens", (hex(cu_seqlens_q), hex(cu_seqlens_kv)), "device pointers (ragged plan)")
        self.inputs.set(q, k, v)
        s = self._slots
        s[0].value, s[1].value, s[2].value, s[3].value = out, lse, cu_seqlens_q, cu_seqlens_kv
        if self._counters is not None:
            self._counter_slot.value = self._counters.get(self.device, stream)
        if self._split_ws is not None:
            self._split_ws.write(stream, self._split_slots)
        self._launch(stream)

    def checked_run(self, q: int, k: int, v: int, out: int, lse: int = 0, cu_seqlens_q: int = 0,
                    cu_seqlens_kv: int = 0, stream: int = 0) -> None:
        """run() for pointers of tensors laid out as the prepared ones, after checking that out and lse
        overlap no input."""
        self._spans.check_pointers((out, lse), (q, k, v, cu_seqlens_q, cu_seqlens_kv))
        self.run(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, stream)

    def __call__(self, q, k, v, out, lse=None, *, cu_seqlens_q=None, cu_seqlens_kv=None, stream=None) -> None:
        """Launch on tensors with the prepared shapes, strides and dtypes."""
        t = {"q": as_tensor(q, "q"), "k": as_tensor(k, "k"), "v": as_tensor(v, "v"), "out": as_output(out, "out")}
        ls = None if lse is None else as_output(lse, "lse")
        cuq = None if cu_seqlens_q is None else as_tensor(cu_seqlens_q, "cu_seqlens_q")
        cuk = None if cu_seqlens_kv is None else as_tensor(cu_seqlens_kv, "cu_seqlens_kv")
        got = layout_key(t, ls, cuq, cuk, *self.layout[-5:])
        if got != self.layout:  # the tensors' layouts are all the key's call-time part
            V.same_layouts({**t, "lse": ls, "cu_seqlens_q": cuq, "cu_seqlens_kv": cuk}, self.layout_of)
        self.launch_records(t, ls, cuq, cuk, as_stream(stream))

    def launch_records(self, t: dict, ls, cuq, cuk, stream: int) -> None:
        self.checked_run(t["q"].ptr, t["k"].ptr, t["v"].ptr, t["out"].ptr, 0 if ls is None else ls.ptr,
                         0 if cuq is None else cuq.ptr, 0 if cuk is None else cuk.ptr, stream)


def split_buffers(runtime, device: int, ctas: int, block_m: int, head_dim: int) -> tuple[StreamBuffers, int]:
    """A Hopper kernel's split workspace for a grid of `ctas` CTAs (aotc.families.sdpa_prefill_sm90.
    split_workspace_bytes: the paged kernel's KV splits, the dense split tail): the launch stream's buffer of the
    runtime's split arena (aotc.runtime.workspace), the partials at its front and the counters at its back, set
    into the kernel's split_partials and split_counters at each launch; and the partials' bytes."""
    partials, counters = split_workspace_bytes(ctas, block_m, head_dim)
    buffers = StreamBuffers(runtime.split_workspaces, device, partials, counters,
                            lambda buf: (buf.ptr, buf.ptr + buf.nbytes - counters))
    return buffers, partials


def hopper_candidates(runtime, device: int, wanted: dict, seqlen_kv: int) -> list[dict]:
    """The field sets to look for, best first: the kv tiles (block_n) of the loaded kernels with the fields `wanted`,
    first those whose launch fact picked_from_seqlen_kv (aotc.families.sdpa_prefill_sm90.PICKED_FROM_SEQLEN_KV) is
    at most seqlen_kv, widest first, then the others, narrowest first (a kernel that records no such fact, of an
    older aotc, among them); then any block_n (a bundle of an older aotc, without the field)."""
    reached: dict = {}  # block_n -> whether a matching kernel of that tile records a fact seqlen_kv reaches
    for k in runtime.matching(HOPPER, device, wanted):
        n, fact = k.variant.get("block_n"), k.recorded_fact(PICKED_FROM)
        if n is not None:
            reached[n] = reached.get(n, False) or (isinstance(fact, int) and fact <= seqlen_kv)
    order = sorted((n for n in reached if reached[n]), reverse=True) + sorted(n for n in reached if not reached[n])
    return [{**wanted, "block_n": n} for n in order] + [wanted]


def hopper_recipes(kernel, t: dict, ragged: bool, dtype: str) -> tuple[dict | None, str | None]:
    """TMA recipes for q, k, v from the kernel's recorded recipe, or (None, why the tensors don't fit)."""
    tma = kernel.artifact.launch.extra.get("tma")
    if not tma:
        return None, f"{kernel.variant.name} records no TMA recipe"
    rank = 3 if ragged else 4
    if int(tma["rank"]) != rank:
        return None, f"{kernel.variant.name} records rank {tma['rank']}, the layout needs {rank}"
    elem = element_bytes(dtype)
    recipes = {}
    for name in ("q", "k", "v"):
        x = t[name]
        # TMA order: (D, S, H[, B]) innermost first; tensor axes (B, S, H, D) dense, (T, H, D) ragged
        axes = (2, 0, 1) if ragged else (3, 1, 2, 0)
        dims = tuple(max(1, x.shape[a]) for a in axes)  # an empty extent is never loaded, but must encode
        strides = []
        for a in axes[1:]:
            if x.shape[a] <= 1:
                strides.append(16)  # never stepped over: any legal stride
                continue
            b = x.strides[a] * elem
            if b <= 0 or b % 16 or b >= 1 << 40:
                return None, f"{name}.stride[{a}] = {x.strides[a]} elements is not a TMA stride (positive, 16-byte multiple, < 2^40 bytes)"
            strides.append(b)
        box = (int(tma["box_cols"]), int(tma["box_rows"][name])) + (1,) * (rank - 2)
        r = TiledRecipe(dtype, dims, tuple(strides), box, int(tma["swizzle_bytes"]), int(tma["l2_promotion_bytes"]))
        try:
            r.check(name)
        except (ArgumentError, ValueError) as e:
            return None, str(e)
        recipes[name] = r
    return recipes, None


def _inputs(t: dict, cuq, cuk) -> dict:
    """Everything the kernel reads: an output overlapping any of it (cu_seqlens too) is refused."""
    inputs = {"q": t["q"], "k": t["k"], "v": t["v"]}
    if cuq is not None:
        inputs["cu_seqlens_q"] = cuq
    if cuk is not None:
        inputs["cu_seqlens_kv"] = cuk
    return inputs


def layout_key(t: dict, ls, cuq, cuk, causal, scale, max_q, max_kv, features) -> tuple:
    def d(x):
        return None if x is None else (x.shape, x.strides, x.dtype, x.device)

    return (tuple(d(t[n]) for n in ("q", "k", "v", "out")), d(ls), d(cuq), d(cuk), causal, scale, max_q, max_kv,
            features)


def check_prefill(runtime, device: int, t: dict[str, TensorArg], ls: TensorArg | None, ragged: bool,
                  cuq: TensorArg | None, cuk: TensorArg | None, max_q, max_kv) -> PrefillShape:
    """Validate every argument before anything is prepared; raises ArgumentError naming the first bad one."""
    q, k, v, o = t["q"], t["k"], t["v"], t["out"]
    V.dtype(q, "q", DTYPES)
    for name in ("k", "v", "out"):
        V.dtype(t[name], name, (q.dtype,))
    if ragged:
        if cuq is None or cuk is None:
            raise ArgumentError("cu_seqlens_kv" if cuq is not None else "cu_seqlens_q", None,
                                "both cu_seqlens_q and cu_seqlens_kv for a ragged call")
        for name in ("q", "out"):
            V.ndim(t[name], name, 3, "total_q, H_q, D")
        for name in ("k", "v"):
            V.ndim(t[name], name, 3, "total_kv, H_kv, D")
        total_q, heads_q, head_dim = q.shape
        total_kv, heads_kv, _ = k.shape
        for name, c in (("cu_seqlens_q", cuq), ("cu_seqlens_kv", cuk)):
            V.int32_vector(c, name, "B + 1")
        if cuq.shape[0] != cuk.shape[0] or cuq.shape[0] < 1:
            raise ArgumentError("cu_seqlens_kv.shape[0]", cuk.shape[0], f"B + 1 = {cuq.shape[0]} (from cu_seqlens_q), >= 1")
        batch = cuq.shape[0] - 1
        for name, m, total in (("max_seqlen_q", max_q, total_q), ("max_seqlen_kv", max_kv, total_kv)):
            if not isinstance(m, int) or isinstance(m, bool) or m < 0 or m > total:
                raise ArgumentError(name, m, f"an int in [0, {total}] (the longest sequence; at most the token count)")
        seqlen_q, seqlen_kv = max_q, max_kv
        ax_s, ax_h = 0, 1
    else:
        for name in ("q", "out"):
            V.ndim(t[name], name, 4, "B, S_q, H_q, D")
        for name in ("k", "v"):
            V.ndim(t[name], name, 4, "B, S_kv, H_kv, D")
        batch, seqlen_q, heads_q, head_dim = q.shape
        _, seqlen_kv, heads_kv, _ = k.shape
        V.dim(k, "k", 0, "B", batch, "from q")
        V.dim(v, "v", 0, "B", batch, "from q")
        ax_s, ax_h = 1, 2
    off = 1 if not ragged else 0
    for axis, (n, val) in enumerate(zip(("S_kv", "H_kv", "D"), (k.shape[ax_s], heads_kv, head_dim))):
        V.dim(v, "v", axis + off, n, val, "from k")
    V.dim(k, "k", ax_h + 1, "D", head_dim, "from q")
    for axis in range(len(q.shape)):
        V.dim(o, "out", axis, "dim", q.shape[axis], "the shape of q")
    heads = runtime.field_values(FAMILY, "head_dim", device) | runtime.field_values(HOPPER, "head_dim", device)
    if head_dim not in heads:
        raise ArgumentError("q.shape[-1]", head_dim, f"a head dim the loaded kernels cover: {sorted(heads)}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ArgumentError("k.shape[-2]", heads_kv, f"a divisor of H_q = {heads_q} (GQA/MQA)")
    # the problem's extents before the layouts that span them
    for name, val in (("B", batch), ("S_q", seqlen_q), ("S_kv", seqlen_kv), ("H_q", heads_q)):
        V.int32_extent(val, name)
    if heads_q > MAX_GRID_YZ or batch > MAX_GRID_YZ:
        raise ArgumentError("H_q" if heads_q > MAX_GRID_YZ else "B", max(heads_q, batch),
                            f"at most {MAX_GRID_YZ} (grid y/z limit)")
    tensors = dict(t)
    if ls is not None:
        V.lse_output(ls, (("H_q", heads_q), ("total_q", q.shape[0])) if ragged else
                     (("B", batch), ("H_q", heads_q), ("S_q", seqlen_q)), "from q")
        tensors["lse"] = ls
    if ragged:
        tensors["cu_seqlens_q"], tensors["cu_seqlens_kv"] = cuq, cuk
    V.cuda_device(tensors, device)
    for name in ("q", "k", "v", "out"):
        x = t[name]
        V.unit_stride(x, name, len(x.shape) - 1)
        V.aligned(x, name, 16)
        V.stride_multiple(x, name, range(len(x.shape) - 1), 8)
    V.no_self_overlap(o, "out")
    V.no_overlap({"out": o, **({"lse": ls} if ls is not None else {})}, _inputs(t, cuq, cuk))
    return PrefillShape(batch, seqlen_q, seqlen_kv, heads_q, heads_kv, head_dim)


def prefill(runtime, q, k, v, out, lse=None, *, causal=False, softmax_scale=None, stream=None,
            cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, family="auto",
            window_left=None, softcap=None, sinks=None) -> None:
    """One call; plans are cached by layout so a repeated shape skips validation but for the pointers."""
    max_seqlen_q, max_seqlen_kv, window_left = V.as_ints(max_seqlen_q, max_seqlen_kv, window_left)
    V.key_scalars(causal=causal, softmax_scale=softmax_scale, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
                  family=family, window_left=window_left, softcap=softcap)
    seen = torch_layouts(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, sinks)
    # typed: causal=1 or softmax_scale=True (refused when a plan is made) never find the plan of True or 1
    scalars = V.typed(family, causal, softmax_scale, max_seqlen_q, max_seqlen_kv) + feature_scalars(window_left, softcap)
    if seen is not None:  # torch tensors: their layouts, and the alignment bit that picks a specialization
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
        fast = torch_key(FAMILY, runtime.device(), seen, (sinks,),
                         (not (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) & 15, scalars))
        plan = runtime.plans.get(fast)
        if plan is not None:
            plan.checked_run(*ptrs, 0 if lse is None else lse.data_ptr(),
                             0 if cu_seqlens_q is None else cu_seqlens_q.data_ptr(),
                             0 if cu_seqlens_kv is None else cu_seqlens_kv.data_ptr(), as_stream(stream))
            return
    t = {"q": as_tensor(q, "q"), "k": as_tensor(k, "k"), "v": as_tensor(v, "v"), "out": as_output(out, "out")}
    ls = None if lse is None else as_output(lse, "lse")
    cuq = None if cu_seqlens_q is None else as_tensor(cu_seqlens_q, "cu_seqlens_q")
    cuk = None if cu_seqlens_kv is None else as_tensor(cu_seqlens_kv, "cu_seqlens_kv")
    snk = None if sinks is None else as_tensor(sinks, "sinks")
    key = (FAMILY, runtime.device(),
           layout_key(t, ls, cuq, cuk, causal, softmax_scale, max_seqlen_q, max_seqlen_kv,
                      (scalars, None if snk is None else (snk.ptr, snk.shape, snk.strides, snk.dtype, snk.device))),
           all(x.ptr % 16 == 0 for x in t.values()))
    plan = cached_plan(runtime, key, lambda: PrefillPlan(
        runtime, t["q"], t["k"], t["v"], t["out"], ls, causal=causal, softmax_scale=softmax_scale, cu_seqlens_q=cuq,
        cu_seqlens_kv=cuk, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, family=family,
        window_left=window_left, softcap=softcap, sinks=snk))
    if seen is not None:
        runtime.remember_plan(fast, plan)
    plan.launch_records(t, ls, cuq, cuk, as_stream(stream))
