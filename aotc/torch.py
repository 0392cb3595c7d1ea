"""PyTorch custom ops over the aotc runtime: ``torch.ops.aotc.prefill``, ``prefill_varlen`` and ``decode``.

    import torch, aotc.torch
    out, lse = torch.ops.aotc.prefill(q, k, v, True, None)     # or aotc.torch.prefill(q, k, v, causal=True)
    out, lse = aotc.torch.decode(q, k_cache, v_cache, seqlens_kv, page_table, max_seqlen_kv=4096)

* Importing ``aotc.torch`` never imports torch: the ops are registered at once
  when torch is already imported, otherwise at the first call of one of this
  module's functions or of :func:`register`. ``aotc.runtime`` itself never
  imports torch.
* Each op is a ``torch.library.custom_op`` with a fake (meta) implementation
  (shapes and dtypes only), so ``torch.compile`` (``fullgraph=True``) traces
  through it and ``FakeTensorMode`` / meta tensors propagate shapes.
* The real implementation launches on ``torch.cuda.current_stream()`` of the
  inputs' device, with outputs from ``torch.empty`` (the caching allocator; a
  CUDA graph's private pool while capturing). It neither syncs nor allocates
  through the driver, so it works inside ``torch.cuda.graph`` capture once a
  first call outside capture has loaded the kernel and prepared its plan (the
  usual warm-up before capture).
* Kernels come from a module-level Runtime: :func:`set_runtime` (a Runtime or
  bundle paths), else ``aotc.load()`` on first use (AOTC_BUNDLE_PATH, installed
  bundle wheels, the cache).

Outputs: ``out`` has q's shape and dtype (contiguous); ``lse`` is fp32, natural
log: ``[B, H_q, S_q]`` for prefill and decode, ``[H_q, total_q]`` for
prefill_varlen. Semantics (bottom-right causal alignment, GQA, paged layouts)
are the runtime's: see ``Runtime.prefill``, ``Runtime.prefill_ragged`` and
``Runtime.decode``. Needs torch >= 2.4 (``torch.library.custom_op``).
"""
from __future__ import annotations

import contextlib
import importlib
import math
import sys
import threading

__all__ = ["register", "set_runtime", "get_runtime", "prefill", "prefill_varlen", "decode", "SCHEMAS"]

NAMESPACE = "aotc"
# operator schemas (torch's schema language); the Python signatures below match them
SCHEMAS = {
    "prefill": "(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None) -> (Tensor out, Tensor lse)",
    "prefill_varlen": "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, SymInt max_seqlen_q, "
                      "SymInt max_seqlen_kv, bool causal=False, float? scale=None) -> (Tensor out, Tensor lse)",
    "decode": "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens_kv, Tensor? page_table=None, "
              "Tensor(a!)? workspace=None, SymInt max_seqlen_kv=0, str kv_layout=\"NHD\", int? num_splits=None, "
              "float? scale=None) -> (Tensor out, Tensor lse)",
}

_lock = threading.RLock()
_registered = False
_ops = None  # torch.ops.aotc once registered (a global, so torch.compile traces the wrappers below)
_runtime = None


def _torch():
    return importlib.import_module("torch")


# ---- the runtime ------------------------------------------------------------------------------
def set_runtime(runtime=None, *paths) -> None:
    """Use this Runtime for the ops (or load bundle paths: set_runtime("a.aotc", "b.aotc")); None resets.

    Any object with the Runtime's ``prefill``, ``prefill_ragged``, ``decode`` and
    ``decode_workspace_bytes`` methods will do (tests use a torch reference).
    """
    global _runtime
    if isinstance(runtime, (str, bytes)) or hasattr(runtime, "__fspath__"):
        from . import load

        runtime = load(runtime, *paths)
    elif paths:
        raise TypeError("set_runtime(runtime) or set_runtime(path, *paths)")
    with _lock:
        _runtime = runtime


def get_runtime():
    """The Runtime the ops launch through: set_runtime()'s, else aotc.load() (loaded once)."""
    global _runtime
    rt = _runtime
    if rt is None:
        with _lock:
            if _runtime is None:
                from . import load

                _runtime = load()
            rt = _runtime
    return rt


# ---- helpers for the real implementations ------------------------------------------------------
def _device_ctx(t):
    torch = _torch()
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _stream(t):
    """The handle of the current torch stream on t's device (what torch itself launches on); None for CPU."""
    if not t.is_cuda:
        return None
    return _torch().cuda.current_stream(t.device).cuda_stream


def _lse_like(q, shape):
    torch = _torch()
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def _decode_splits(q, k_cache, page_table, kv_layout: str, max_seqlen_kv: int) -> int:
    """The runtime's split heuristic (aotc.runtime.decode.choose_splits) with torch's SM count."""
    from .families.sdpa_decode import ROWS_PER_CTA
    from .runtime.decode import choose_splits

    batch, seqlen_q, heads_q, _ = q.shape
    head_ax = 1 if (page_table is not None and kv_layout == "HND") else 2
    heads_kv = max(1, int(k_cache.shape[head_ax]))
    row_tiles = math.ceil(heads_q // heads_kv * seqlen_q / ROWS_PER_CTA) if heads_q % heads_kv == 0 else 1
    sms = _torch().cuda.get_device_properties(q.device).multi_processor_count
    return choose_splits(batch, heads_kv, max(1, row_tiles), max_seqlen_kv, sms)


# ---- registration -------------------------------------------------------------------------------
def register():
    """Register torch.ops.aotc.{prefill, prefill_varlen, decode} (idempotent; imports torch); returns torch.ops.aotc."""
    global _registered, _ops
    if _ops is not None:
        return _ops
    with _lock:
        if _ops is not None:
            return _ops
        torch = _torch()
        if not hasattr(torch.library, "custom_op"):
            raise ImportError(f"aotc.torch needs torch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")
        if not _already_defined(torch):  # defined already when this module was reloaded: ops outlive modules
            _define(torch)
        _registered = True
        _ops = torch.ops.aotc
    return _ops


def _already_defined(torch) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::prefill", "")
        return True
    except RuntimeError:
        return False


def _define(torch) -> None:
    lib = torch.library

    @lib.custom_op(f"{NAMESPACE}::prefill", mutates_args=(), schema=SCHEMAS["prefill"])
    def _prefill(q, k, v, causal=False, scale=None):
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = _lse_like(q, (q.shape[0], q.shape[2], q.shape[1]))
        with _device_ctx(q):
            get_runtime().prefill(q, k, v, out, lse, causal=causal, softmax_scale=scale, stream=_stream(q))
        return out, lse

    @_prefill.register_fake
    def _(q, k, v, causal=False, scale=None):
        _check_rank(q, 4, "q [B, S_q, H_q, D]")
        return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)

    @lib.custom_op(f"{NAMESPACE}::prefill_varlen", mutates_args=(), schema=SCHEMAS["prefill_varlen"])
    def _prefill_varlen(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, causal=False, scale=None):
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = _lse_like(q, (q.shape[1], q.shape[0]))
        with _device_ctx(q):
            get_runtime().prefill_ragged(q, k, v, out, cu_seqlens_q, cu_seqlens_kv, int(max_seqlen_q),
                                         int(max_seqlen_kv), lse, causal=causal, softmax_scale=scale,
                                         stream=_stream(q))
        return out, lse

    @_prefill_varlen.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, causal=False, scale=None):
        _check_rank(q, 3, "q [total_q, H_q, D]")
        return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)

    @lib.custom_op(f"{NAMESPACE}::decode", mutates_args=("workspace",), schema=SCHEMAS["decode"])
    def _decode(q, k_cache, v_cache, seqlens_kv, page_table=None, workspace=None, max_seqlen_kv=0, kv_layout="NHD",
                num_splits=None, scale=None):
        rt = get_runtime()
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = _lse_like(q, (q.shape[0], q.shape[2], q.shape[1]))
        max_seqlen_kv = int(max_seqlen_kv)
        with _device_ctx(q):
            if q.is_cuda and num_splits is None and q.dim() == 4:
                num_splits = _decode_splits(q, k_cache, page_table, kv_layout, max_seqlen_kv)
            if workspace is None and num_splits is not None and num_splits > 1 and q.dim() == 4:
                b, s, h, d = q.shape
                # zeros: the split counters in its last bytes must start at 0 (see aotc.runtime.decode)
                workspace = torch.zeros(rt.decode_workspace_bytes(b, s, h, d, num_splits), dtype=torch.uint8,
                                        device=q.device)
            rt.decode(q, k_cache, v_cache, out, seqlens_kv, page_table, lse, max_seqlen_kv=max_seqlen_kv,
                      kv_layout=kv_layout, num_splits=num_splits, workspace=workspace, softmax_scale=scale,
                      stream=_stream(q))
        return out, lse

    @_decode.register_fake
    def _(q, k_cache, v_cache, seqlens_kv, page_table=None, workspace=None, max_seqlen_kv=0, kv_layout="NHD",
          num_splits=None, scale=None):
        _check_rank(q, 4, "q [B, S_q, H_q, D]")
        return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _check_rank(q, ndim: int, what: str) -> None:
    if q.dim() != ndim:
        raise ValueError(f"aotc: q must be {what}, got {q.dim()} dimensions")


# ---- Python entry points ------------------------------------------------------------------------
def prefill(q, k, v, *, causal: bool = False, scale: float | None = None):
    """(out, lse) = attention over dense q [B, S_q, H_q, D], k/v [B, S_kv, H_kv, D]: torch.ops.aotc.prefill."""
    return (_ops or register()).prefill(q, k, v, causal, scale)


def prefill_varlen(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int, max_seqlen_kv: int, *,
                   causal: bool = False, scale: float | None = None):
    """(out, lse [H_q, total_q]) over packed tokens q [total_q, H_q, D] with int32 cu_seqlens [B + 1]."""
    return (_ops or register()).prefill_varlen(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                                            causal, scale)


def decode(q, k_cache, v_cache, seqlens_kv, page_table=None, *, max_seqlen_kv: int, workspace=None,
           kv_layout: str = "NHD", num_splits: int | None = None, scale: float | None = None):
    """(out, lse) for q [B, S_q<=16, H_q, D] over a paged (NHD/HND) or dense KV cache: torch.ops.aotc.decode.

    max_seqlen_kv bounds every seqlens_kv entry (it fixes the split count when
    num_splits is None). workspace (uint8, decode_workspace_bytes) is allocated
    (zeroed) per call when None and more than one split is used; one passed in
    must be zeroed before its first use and written by nothing else between
    decode calls (its last bytes hold the split counters, which every call
    leaves at zero).
    """
    return (_ops or register()).decode(q, k_cache, v_cache, seqlens_kv, page_table, workspace, max_seqlen_kv,
                                    kv_layout, num_splits, scale)


if "torch" in sys.modules:  # torch is already here: make torch.ops.aotc.* available at once
    try:
        register()
    except Exception:  # a torch too old or half-imported: the functions above raise the reason on use
        pass
