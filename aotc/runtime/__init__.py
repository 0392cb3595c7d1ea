"""aotc.runtime: load bundles (or the cache) and launch their kernels through the CUDA driver.

Needs only the standard library and the CUDA driver (libcuda, through ctypes): it never
imports ``cutlass``, ``torch``, numpy or any CUDA Python package and never compiles. Every
driver failure (no libcuda, a driver older than CUDA 12.4, a failed call) is an
``aotc.DriverError`` with a hint. Tensors come
in as anything with ``__dlpack__`` or ``__cuda_array_interface__``, or as explicit
records (``aotc.runtime.tensor(ptr, shape, strides, dtype)``).

    import aotc.runtime as rt
    k = rt.load("artifacts/default.aotc")
    k.capabilities()["entry_points"]["decode"]["page_sizes"]   # what this device can call: [16, 32, 64, 128]
    k.combine(o_partial, lse_partial, out, lse, stream=torch.cuda.current_stream())
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterable

from ..common.errors import RuntimeLoadError
from .counters import TileCounters
from .workspace import WorkspaceArena

__all__ = ["Runtime", "load", "TensorArg", "tensor", "as_tensor", "as_stream"]


def __getattr__(name: str):
    """The tensor records (TensorArg, tensor, as_stream from aotc.runtime.tensors; as_tensor from
    aotc.runtime.dlpack), imported on first use (PEP 562): the two modules take ~3.5 ms to compile without
    a bytecode cache (measured here) and only a call needs them, not import or load()."""
    if name in ("TensorArg", "tensor", "as_stream"):
        from . import tensors

        value = getattr(tensors, name)
    elif name == "as_tensor":
        from .dlpack import as_tensor as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


class Runtime:
    """A set of verified artifacts, loaded into the driver lazily and dispatched by family and fields.

    What each entry point (prefill, prefill_ragged, attention, decode, kv_write, combine) serves on a
    device: capabilities()."""

    def __init__(self, artifacts: Iterable, sources: list[str] | None = None):
        """artifacts: Artifacts, or bundle members (aotc.storage.bundle_reader.BundleMember) whose header
        is checked when dispatch first selects the kernel and whose bytes are read and checked when it is
        first loaded into the driver (aotc.runtime.loader.LoadedKernel)."""
        from .loader import LoadedKernel

        self.sources = list(sources or [])
        self.kernels: dict[str, list[LoadedKernel]] = {}
        # kernels whose parameter list is not the one this runtime fills (built by an aotc whose family
        # had another ABI, e.g. an old cache entry or bundle): set aside when dispatch first picks them
        # (_fits), never launched, named when nothing else fits
        self.other_abi: list[str] = []
        self._fitting: set = set()  # kernels whose header and parameter list _fits has accepted
        self._fact_bounds: dict = {}  # fact_bounds' answers
        seen: set[tuple] = set()
        for item in artifacts:
            ident = (item.variant, item.sha256)
            if ident in seen:
                continue
            seen.add(ident)
            self.kernels.setdefault(item.variant.family, []).append(LoadedKernel(item))
        self.plans: dict = {}  # layout key -> prepared plan, for the one-call APIs
        # split decode's partials and counters: a buffer per (device, stream) that every plan without a workspace
        # of its own launching there shares (aotc.runtime.workspace)
        self.workspaces = WorkspaceArena()
        # the paged prefill kernel's KV splits, per stream as well (an arena of their own: sized for the paged
        # kernel's grid, not for the decode rows)
        self.split_workspaces = WorkspaceArena()
        # the per-stream counters of kernels that draw their tiles at run time (aotc.runtime.counters)
        self.tile_counters = TileCounters()
        self._side_streams: dict[int, int] = {}  # device -> the stream a forked step's second kernel runs on
        self._lock = threading.Lock()
        self.load_seconds = 0.0

    def __repr__(self) -> str:
        n = sum(len(v) for v in self.kernels.values())
        return f"<aotc.runtime.Runtime {n} kernels from {self.sources or 'memory'}>"

    # ---- dispatch ------------------------------------------------------------
    def device(self) -> int:
        from . import driver

        return driver.current_device()

    def side_stream(self, device: int) -> int:
        """The runtime's second stream on `device` (made at first use, kept while the runtime lives): a mixed
        step's decode kernel runs on it beside the paged prefill kernel (Runtime.attention's prefill_sms)."""
        with self._lock:
            s = self._side_streams.get(device)
            if s is None:
                from . import driver

                s = self._side_streams[device] = driver.stream_create()
            return s

    def find(self, family: str, device: int, candidates: list[dict]):
        """The first kernel matching a candidate field set (most specialized first), best arch first; or None.

        The kernel found is checked before it is returned (_fits): a bundle member whose header is refused
        is a RuntimeLoadError naming it (nothing else is tried in its place), one built with another
        parameter list is set aside and the search goes on."""
        from . import driver

        archs = driver.runnable_archs(driver.compute_capability(device))
        while True:
            k = self._first_match(family, archs, candidates)
            if k is None or self._fits(k):
                return k

    def _first_match(self, family: str, archs, candidates: list[dict]):
        pool = self.kernels.get(family, [])
        for want in candidates:
            for arch in archs:
                for k in pool:
                    if _matches(k, arch, want):
                        return k
        return None

    def matching(self, family: str, device: int, want: dict) -> list:
        """The loaded kernels of `family` for `device` whose fields include `want` (their headers are checked only
        when one is selected)."""
        from . import driver

        archs = driver.runnable_archs(driver.compute_capability(device))
        return [k for arch in archs for k in self.kernels.get(family, []) if _matches(k, arch, want)]

    def fact_bounds(self, family: str, name: str, device: int) -> tuple:
        """The distinct values of the launch fact `name` (a kv length from which a kernel is picked) among the
        loaded kernels of `family` for `device`, ascending: a call keys its plan on which of them its bound reaches,
        so that calls dispatch would serve with different kernels get different plans. As recorded
        (LoadedKernel.recorded_fact); cached (a call's hot path reads it)."""
        key = (family, name, device)
        bounds = self._fact_bounds.get(key)
        if bounds is None:
            from . import driver

            archs = set(driver.runnable_archs(driver.compute_capability(device)))
            values = {k.recorded_fact(name) for k in self.kernels.get(family, []) if k.variant.arch in archs}
            bounds = self._fact_bounds[key] = tuple(sorted(v for v in values if isinstance(v, int) and v > 0))
        return bounds

    def _fits(self, k) -> bool:
        """Check a kernel when dispatch first picks it: its header (k.artifact; a RuntimeLoadError for a
        refused one), then its parameter list against its family's; one with another list leaves the pool
        for other_abi (False)."""
        if k in self._fitting:
            return True
        from ..common.checks import same_params
        from ..families import get_family

        art = k.artifact
        try:
            fam = get_family(art.variant.family)
        except KeyError:
            fam = None
        with self._lock:
            if fam is not None and not same_params(art.abi.params, fam.params(art.variant)):
                pool = self.kernels.get(art.variant.family, [])
                if k in pool:
                    pool.remove(k)
                    self.other_abi.append(art.variant.name)
                if not pool:
                    self.kernels.pop(art.variant.family, None)
                return False
            self._fitting.add(k)
        return True

    def select(self, family: str, device: int, candidates: list[dict]):
        """Like find(), but a missing kernel is a RuntimeLoadError naming what is loaded."""
        from . import driver

        k = self.find(family, device, candidates)
        if k is not None:
            return k
        archs = driver.runnable_archs(driver.compute_capability(device))
        pool = self.kernels.get(family, [])
        have = sorted({k.variant.name for k in pool})
        other = sorted({n for n in self.other_abi if n.startswith(family + ".")})
        raise RuntimeLoadError(
            f"no loaded {family} kernel fits {candidates[-1]} on a device of compute capability "
            f"{driver.compute_capability(device)} (runs {archs}); loaded: {have[:8]}{' ...' if len(have) > 8 else ''}"
            + (f"; ignored, built with another parameter list than this aotc's: {other[:8]}" if other else ""),
            hint="rebuild the bundle with this aotc (aotc build)" if other else None)

    def capabilities(self, device: int | None = None, *, arch: str | None = None) -> dict:
        """What each entry point serves here, as plain JSON-ready data (aotc.runtime.capabilities), so a
        serving engine checks at start-up what it can call instead of failing on its first request.

        device: a CUDA device (default: the current one; its name, compute capability and SM count are
        reported). arch: ask for a device of this arch instead ("sm_90a"), needing no GPU or driver; not
        with `device`. Read from the loaded kernels' variant records, kept to the archs the device runs
        and the kernels dispatch accepts (each one's header is checked now, as at its first selection;
        its bytes at its first load). Schema (schema_version 1)::

            {"schema_version": 1, "aotc_version": "0.1.0",
             "device": {"ordinal", "name", "compute_capability", "sms"} or None (with arch=),
             "arch": "sm_90a", "runs": ["sm_90a", "sm_90"],  # the device's (or arch=) arch; cubin archs it runs
             "sources": [bundle paths], "kernels": 116,       # loaded kernels it runs, any family
             "other_archs": ["sm_80"],                        # loaded kernels' archs it does not run
             "entry_points": {"prefill" | "prefill_ragged" | "attention" | "decode" | "kv_write" | "combine": {
                 "supported": bool, "kernels": int, "dtypes": [...], "head_dims": [...],
                 "causal": [False, True],                     # decode: [True]; [] where there is no mask
                 "lse": bool,                                 # an lse output can be written
                 "layouts": ["dense", "paged16", ...],        # dense, ragged, paged<page size>
                 "page_sizes": [16, ...], "kv_layouts": ["NHD", "HND"],
                 "gaps": [{"dtype": "fp16", "head_dim": 256, ...}],  # of the lists' product, not served
                 "fields": {field: [values]},                 # every variant field, new ones included
                 "served_by": [{"family", "arch", <the same keys>}, ...]}},  # dispatch's order
             "unmapped_families": [...], "refused": [{"kernel", "error"}], "other_abi": [kernel names]}

        A call whose fields match a "refused" kernel fails (dispatch never substitutes another); nothing
        loaded gives every entry point "supported": False."""
        from .capabilities import capabilities

        return capabilities(self, device, arch)

    def field_values(self, family: str, field: str, device: int) -> set:
        """The values of `field` among the loaded kernels of `family` for `device` (their headers are checked
        only when one is selected)."""
        from . import driver

        archs = set(driver.runnable_archs(driver.compute_capability(device)))
        return {k.variant.get(field) for k in self.kernels.get(family, []) if k.variant.arch in archs}

    # ---- families ------------------------------------------------------------
    def prepare_combine(self, o_partial, lse_partial, out, lse=None):
        """Validate once and return a CombinePlan whose calls only write new pointers."""
        from .combine import CombinePlan

        return CombinePlan(self, o_partial, lse_partial, out, lse)

    def combine(self, o_partial, lse_partial, out, lse=None, *, stream=None) -> None:
        """Merge split-KV partials into out (and lse): validate, dispatch, launch on `stream`.

        The plan for a layout is cached, so repeating a shape skips validation of
        everything but the pointers (alignment, overlap)."""
        from .combine import combine

        combine(self, o_partial, lse_partial, out, lse, stream=stream)

    def prepare_prefill(self, q, k, v, out, lse=None, *, causal=False, softmax_scale=None, cu_seqlens_q=None,
                        cu_seqlens_kv=None, max_seqlen_q=None, max_seqlen_kv=None, specialize: bool = True,
                        family: str = "auto", window_left: int | None = None, softcap: float | None = None, sinks=None):
        """Validate once and return a PrefillPlan (dense, or ragged when cu_seqlens are given).

        family: "auto" runs the Hopper family (sdpa_prefill_sm90) where the device, the bundle and
        the tensors allow it and the portable one (sdpa_prefill) otherwise; naming one forces it.
        specialize=False uses the portable family's general-stride variant even when the tensors
        keep a specialization's promises (for comparisons and debugging).
        window_left, softcap, sinks: the score features (aotc.runtime.features; None: off), served by the
        variants built with them."""
        from .prefill import PrefillPlan

        return PrefillPlan(self, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                           max_seqlen_kv=max_seqlen_kv, specialize=specialize, family=family,
                           window_left=window_left, softcap=softcap, sinks=sinks)

    def prefill(self, q, k, v, out, lse=None, *, causal=False, softmax_scale=None, stream=None,
                family: str = "auto", window_left: int | None = None, softcap: float | None = None, sinks=None) -> None:
        """Attention forward over dense [B, S, H, D] tensors (any strides, head dim contiguous) into out (and lse).

        family: "auto" (the Hopper family where it can run, else the portable one) or a family name."""
        from .prefill import prefill

        prefill(self, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, stream=stream, family=family,
                window_left=window_left, softcap=softcap, sinks=sinks)

    def prefill_ragged(self, q, k, v, out, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, lse=None, *,
                       causal=False, softmax_scale=None, stream=None, family: str = "auto",
                       window_left: int | None = None, softcap: float | None = None, sinks=None) -> None:
        """Attention forward over packed tokens [total, H, D] with int32 cu_seqlens [B + 1] on the device."""
        from .prefill import prefill

        prefill(self, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale, stream=stream,
                cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                max_seqlen_kv=max_seqlen_kv, family=family, window_left=window_left, softcap=softcap, sinks=sinks)

    def decode_workspace_bytes(self, batch: int, seqlen_q: int, heads_q: int, head_dim: int, chunks: int) -> int:
        """Workspace a decode with `chunks` target chunks needs (0 for chunks=1); a prepared plan's is
        plan.workspace_bytes (its chunks: plan.chunks). Plans sharing one buffer need it for each
        argument's largest value among them."""
        from .decode import workspace_bytes

        return workspace_bytes(batch, seqlen_q, heads_q, head_dim, chunks)

    def prepare_decode(self, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *,
                       max_seqlen_kv: int | None = None, kv_layout: str = "NHD", chunks: int | None = None,
                       workspace=None, softmax_scale: float | None = None,
                       window_left: int | None = None, softcap: float | None = None, sinks=None,
                       k_descale=None, v_descale=None):
        """Validate once for a layout; returns a DecodePlan (see aotc.runtime.decode). The work partition
        follows the device-side lengths at every step; max_seqlen_kv (optional) is checked against the page
        table's capacity; chunks: the target number of kv chunks per (KV head, row tile), one wave of CTAs
        by default, 1 never splits; workspace: None for the launch stream's buffer of the runtime's arena
        (aotc.runtime.workspace), or the caller's (plans sharing it must not run on two streams at once).
        k_descale, v_descale: the fp32 scales [H_kv] or [1] of an fp8_e4m3 cache (aotc.runtime.kv_scales)."""
        from .decode import DecodePlan

        return DecodePlan(self, q, k_cache, v_cache, out, seqlens_kv, page_table, lse, max_seqlen_kv=max_seqlen_kv,
                          kv_layout=kv_layout, chunks=chunks, workspace=workspace, softmax_scale=softmax_scale,
                          window_left=window_left, softcap=softcap, sinks=sinks, k_descale=k_descale,
                          v_descale=v_descale)

    def decode(self, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *,
               max_seqlen_kv: int | None = None, kv_layout: str = "NHD", chunks: int | None = None, workspace=None,
               softmax_scale=None, stream=None,
               window_left: int | None = None, softcap: float | None = None, sinks=None,
               k_descale=None, v_descale=None) -> None:
        """One decode step; the plan for these caches, layouts (and this workspace) is prepared once and
        cached: a repeated call reads the tensors, looks the plan up and launches. k_descale, v_descale: an
        fp8_e4m3 cache's scales."""
        from .decode import decode

        decode(self, q, k_cache, v_cache, out, seqlens_kv, page_table, lse, max_seqlen_kv=max_seqlen_kv,
               kv_layout=kv_layout, chunks=chunks, workspace=workspace, softmax_scale=softmax_scale, stream=stream,
               window_left=window_left, softcap=softcap, sinks=sinks, k_descale=k_descale, v_descale=v_descale)

    def prepare_attention(self, q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, *, lse=None,
                          causal: bool = True, softmax_scale: float | None = None, kv_layout: str = "NHD",
                          max_seqlen_q: int | None = None, decode_query_len: int = 1,
                          max_seqlen_kv: int | None = None,
                          window_left: int | None = None, softcap: float | None = None, sinks=None,
                          workspace=None, k_descale=None, v_descale=None, min_seqlen_q: int | None = None):
        """Validate once for a layout; returns an AttentionPlan (see aotc.runtime.attention): ragged queries
        [total_q, H_q, D] over a paged KV cache, decode rows and prefill chunks in one call. workspace: the decode
        rows' split workspace (rt.decode_workspace_bytes), None for the launch stream's buffer of the runtime's arena
        (aotc.runtime.workspace: steps on two streams may run at once; a caller's workspace serves one stream at a
        time). k_descale, v_descale: an fp8_e4m3 cache's fp32
        scales [H_kv] or [1] (attention over k_fp8 * k_descale, v_fp8 * v_descale; aotc.runtime.kv_scales).
        max_seqlen_q, min_seqlen_q: the bounds on the query counts the plan's calls use (see attention())."""
        from .attention import AttentionPlan

        return AttentionPlan(self, q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, lse, causal=causal,
                             softmax_scale=softmax_scale, kv_layout=kv_layout, max_seqlen_q=max_seqlen_q,
                             decode_query_len=decode_query_len, max_seqlen_kv=max_seqlen_kv, window_left=window_left,
                             softcap=softcap, sinks=sinks, workspace=workspace, k_descale=k_descale,
                             v_descale=v_descale, min_seqlen_q=min_seqlen_q)

    def attention(self, q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, *, lse=None,
                  causal: bool = True, softmax_scale: float | None = None, kv_layout: str = "NHD",
                  max_seqlen_q: int | None = None, decode_query_len: int = 1, max_seqlen_kv: int | None = None,
                  stream=None, window_left: int | None = None, softcap: float | None = None, sinks=None,
                  k_descale=None, v_descale=None, min_seqlen_q: int | None = None,
                  prefill_sms: int | None = None) -> None:
        """The serving entry point: one call per layer per step for a batch of any mix of decode rows and
        prefill chunks (cu_seqlens_q), each over its paged KV (seqlens_kv: full lengths, new tokens
        included; page_table; None for dense caches [B, S_max, H_kv, D], read as pages of the same memory),
        bottom-right causal per sequence, into out (and lse). Sequences of at most
        decode_query_len queries (1, or 1 + speculative tokens) run on the decode kernel, longer ones on
        the paged prefill kernel; max_seqlen_q (optional, an upper bound) <= decode_query_len skips the
        latter's launch; min_seqlen_q (optional, a lower bound on the query counts of the sequences: vLLM's
        num_decodes == 0 knows one) > decode_query_len skips the decode kernel's and gives the paged kernel
        every row (a wrong one costs speed, never rows); max_seqlen_kv (optional) >= 4096 picks its widest kv
        tile. Both kernels read the lengths on the device, and no bound is part of the cached plan's key (only
        the kv tile max_seqlen_kv picks). window_left, softcap,
        sinks: the score features (aotc.runtime.features), in both kernels. k_descale, v_descale: an fp8_e4m3
        cache's scales (see prepare_attention). prefill_sms (optional, Hopper paged kernel): when the step runs
        both kernels, the paged one runs on this many SMs and the decode kernel beside it on the runtime's
        second stream (joined back into `stream`, CUDA-graph capturable once a step with it ran outside a
        capture), so a DRAM-bound decode batch and a tensor-bound chunk overlap instead of running one after
        the other; None (or the SM count or more): one after the other on `stream`. step_prefill_sms() picks
        it from the step's host-side lengths."""
        from .attention import attention

        attention(self, q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table, lse, causal=causal,
                  softmax_scale=softmax_scale, kv_layout=kv_layout, max_seqlen_q=max_seqlen_q,
                  decode_query_len=decode_query_len, max_seqlen_kv=max_seqlen_kv, stream=stream,
                  window_left=window_left, softcap=softcap, sinks=sinks, k_descale=k_descale, v_descale=v_descale,
                  min_seqlen_q=min_seqlen_q, prefill_sms=prefill_sms)

    def step_prefill_sms(self, query_lens, kv_lens, *, heads_q: int, heads_kv: int, head_dim: int,
                         kv_dtype: str = "bf16", decode_query_len: int = 1, causal: bool = True,
                         window_left: int | None = None) -> int | None:
        """attention()'s prefill_sms for a step of these host-side lengths (each sequence's query count and full KV
        length, as an engine has them on the CPU), the same for every layer of the step: half the current device's
        SMs where the decode rows' KV reads outweigh the chunks' work, else None
        (aotc.runtime.attention.step_prefill_sms)."""
        from .attention import step_prefill_sms
        from .driver import multiprocessor_count

        return step_prefill_sms(multiprocessor_count(self.device()), query_lens, kv_lens, heads_q=heads_q,
                                heads_kv=heads_kv, head_dim=head_dim,
                                kv_itemsize=1 if kv_dtype.startswith("fp8") else 2, decode_query_len=decode_query_len,
                                causal=causal, window_left=window_left)

    def prepare_kv_write(self, key, value, k_cache, v_cache, slot_mapping, *, kv_layout: str = "NHD",
                         k_scale=None, v_scale=None):
        """Validate once for these pools and key/value/slot layouts; returns a KvWritePlan (see
        aotc.runtime.kv_write) whose calls take any token count. k_scale, v_scale: the fp32 scales [H_kv] or [1]
        of fp8_e4m3 pools (quantized on write: e4m3(x / scale), aotc.runtime.kv_scales)."""
        from .kv_write import KvWritePlan

        return KvWritePlan(self, key, value, k_cache, v_cache, slot_mapping, kv_layout=kv_layout, k_scale=k_scale,
                           v_scale=v_scale)

    def kv_write(self, key, value, k_cache, v_cache, slot_mapping, *, kv_layout: str = "NHD", stream=None,
                 k_scale=None, v_scale=None) -> None:
        """Write key/value [tokens, H_kv, D] into the paged pools at slot_mapping's int64 slots (-1 and any
        slot past the pools skip); the plan for these pools and layouts is prepared once and cached, so a
        step with another token count reuses it. fp8_e4m3 pools take k_scale, v_scale."""
        from .kv_write import kv_write

        kv_write(self, key, value, k_cache, v_cache, slot_mapping, kv_layout=kv_layout, stream=stream,
                 k_scale=k_scale, v_scale=v_scale)

    MAX_PLANS = 1024

    def remember_plan(self, key, plan) -> None:
        with self._lock:
            if len(self.plans) >= self.MAX_PLANS:
                self.plans.pop(next(iter(self.plans)))  # oldest first
            self.plans[key] = plan


def _matches(k, arch: str, want: dict) -> bool:
    """Whether loaded kernel k is built for `arch` with the fields `want`. A kernel recorded before its family gained
    a defaulted field is the kernel with it at its default: it matches, and Runtime._fits then sets it aside by its
    older parameter list (with the rebuild hint) instead of leaving it unmatched."""
    from ..common.checks import with_defaults

    v = with_defaults(k.variant)
    return v.arch == arch and all(v.get(f) == val for f, val in want.items())


def load(*sources: str | Path, cache: bool | None = None, installed: bool | None = None,
         check_arch: bool = True) -> Runtime:
    """Load bundles into a Runtime.

    With paths (bundle files, or directories whose *.aotc bundles load in name order): those bundles
    (plus the cache when cache=True, installed bundles when installed=True). With no path, everything
    this machine has, in this order of preference (a variant found twice with different bytes is served
    from the first place):

    1. the bundles on AOTC_BUNDLE_PATH (files, or directories of *.aotc);
    2. installed bundles: every ``aotc.bundles`` entry point of an installed
       distribution (``aotc bundle wheel`` makes such wheels);
    3. every verified entry of the local cache (AOTC_CACHE_DIR) whose key this aotc computes for its
       variant (entries of other aotc, DSL or kernel-source versions are stale and never served).

    cache=False / installed=False leave those out. A bundle's directory and manifest's structure are
    checked here (format, sizes, variant records, duplicates; aotc.storage.bundle_reader.open_bundle);
    each member's header (family rules, key, launch limits) when dispatch first selects its kernel, and
    its bytes (sha256, the cubin) when it is first loaded into the driver: one that fails is a
    RuntimeLoadError naming it, before anything reaches the driver. Loading needs no GPU. Raises BundleError
    for an unreadable bundle (a broken installed one names its entry point) and RuntimeLoadError when
    nothing is found.
    """
    from ..common.errors import BundleError
    from ..storage.bundle_reader import open_bundle

    t0 = time.perf_counter()
    if sources:
        found = [(p, str(p)) for s in sources for p in _bundle_files(Path(s))]
        use_cache, use_installed = bool(cache), bool(installed)
        if use_installed:
            from ..storage.bundle import discover_bundles

            found += _installed(discover_bundles(env=False, installed=True))
    else:
        from ..storage.bundle import discover_bundles

        use_cache = cache is not False
        found = _installed(discover_bundles(env=True, installed=installed is not False))
    members: list = []
    names = []
    for p, origin in found:
        try:
            members.extend(open_bundle(p, check_arch=check_arch).members)
        except BundleError as e:
            if origin != str(p) and origin not in str(e):
                e.args = (f"{e.args[0]} (found through {origin})",) + e.args[1:]
            raise
        names.append(str(p))
    if use_cache:
        from ..storage.cache import Cache

        c = Cache()
        current = c.current_artifacts()
        if current:
            members.extend(current)
            names.append(str(c.root))
    if not members:
        where = ("the given bundles hold none" if sources else
                 "nothing on AOTC_BUNDLE_PATH, no installed aotc.bundles entry point")
        raise RuntimeLoadError(f"no kernels to load: {where}" + ("" if use_cache else ", and cache=False")
                               + (", and an empty cache" if use_cache else ""),
                               hint="aotc.runtime.load('artifacts/default.aotc') after `make build`, set "
                                    "AOTC_BUNDLE_PATH, or pip install a wheel made by `aotc bundle wheel`")
    rt = Runtime(members, names)
    rt.load_seconds = time.perf_counter() - t0
    return rt


def _bundle_files(path: Path) -> list[Path]:
    """A bundle path as given, or a directory's *.aotc files in name order (BundleError when it has none)."""
    if not path.is_dir():
        return [path]
    from ..common.errors import BundleError

    files = sorted(p for p in path.glob("*.aotc") if not p.is_dir())
    if not files:
        raise BundleError(f"bundle directory {path}: holds no *.aotc bundles")
    return files


def _installed(found) -> list[tuple[Path, str]]:
    """(path, origin) pairs; a discovery problem is raised as a BundleError naming its origin."""
    from ..common.errors import BundleError

    out = []
    for f in found:
        if f.error or f.path is None:
            raise BundleError(f"bundle from {f.origin}: {f.error}",
                              hint="reinstall or uninstall that distribution, or load bundles by path "
                                   "(aotc.runtime.load(PATH), or installed=False)")
        out.append((f.path, f.origin))
    return out
