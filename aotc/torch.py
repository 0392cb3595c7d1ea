"""PyTorch ops over the aotc runtime: ``torch.ops.aotc.{prefill, prefill_varlen, decode}`` (returning out and
LSE), their ``*_out`` forms and ``torch.ops.aotc.attention`` (the paged varlen entry point), which write into
caller-provided buffers as serving engines' attention backends do (``accept_output_buffer``), and ``torch.ops.aotc.kv_write``, which writes the step's new K/V
into paged KV-cache pools in place (vLLM's ``reshape_and_cache_flash``).

    import torch, aotc.torch
    out, lse = torch.ops.aotc.prefill(q, k, v, True, None)     # or aotc.torch.prefill(q, k, v, causal=True)
    torch.ops.aotc.kv_write(key, value, k_cache, v_cache, slot_mapping, "NHD")         # then, per layer:
    torch.ops.aotc.decode_out(q, k_cache, v_cache, seqlens_kv, page_table, out, lse)   # one call per layer

* Importing ``aotc.torch`` never imports torch: the ops are registered at once when torch is already
  imported, otherwise at the first call of one of this module's functions or of :func:`register`.
  ``aotc.runtime`` itself never imports torch.
* The ops are defined with ``torch.library`` (a schema, one Python kernel for CUDA and CPU, a fake
  implementation giving shapes and dtypes), so ``torch.compile(fullgraph=True)`` traces through them
  and ``FakeTensorMode`` / meta tensors propagate shapes; their eager call is a dispatcher call into
  one Python function (no ``custom_op`` wrapper). This module's functions (``aotc.torch.attention``, ...)
  call that function directly, skipping the dispatcher, on plain CUDA tensors outside torch.compile's
  tracing and any dispatch or function mode (_direct): the same work, without the dispatcher's boxing of
  the arguments (0.84x the op's host cost for a decode step).
* On CUDA tensors a call reads each tensor's pointer, shape, strides and dtype once, looks its prepared
  plan up by those (aotc.runtime plans: validated when first made) and launches on the current torch
  stream: no allocation but the returned out/LSE of the functional ops, no memset, no sync, so it works
  inside ``torch.cuda.graph`` capture once a first call outside capture has prepared the plan (the usual
  warm-up). Decode without a workspace uses the stream's buffer of the runtime's arena (aotc.runtime.workspace).
* Kernels come from a module-level Runtime: :func:`set_runtime` (a Runtime or bundle paths), else
  ``aotc.load()`` on first use.

Outputs: ``out`` has q's shape and dtype; ``lse`` is fp32, natural log: ``[B, H_q, S_q]`` for prefill and
decode, ``[H_q, total_q]`` for prefill_varlen. Semantics (bottom-right causal alignment, GQA, paged
layouts) are the runtime's: see ``Runtime.prefill``, ``Runtime.prefill_ragged`` and ``Runtime.decode``. Every
attention op ends with ``window_left``, ``softcap`` and ``sinks`` (None: off; aotc.runtime.features).

kv_write: key/value ``[tokens, H_kv, D]`` (fp16/bf16, any 16-byte aligned token and head strides, e.g.
slices of a fused qkv), pools ``[pages, page_size, H_kv, D]`` (``kv_layout="NHD"``) or
``[pages, H_kv, page_size, D]`` (``"HND"``) of the same dtype, slot_mapping int64 ``[num_tokens]``
(``num_tokens <= tokens``: the rows of a padded batch past it are not read). Token i goes to page
``slot // page_size``, in-page slot ``slot % page_size``; -1, and any slot outside the pools, is skipped on
the device; ``torch.float8_e4m3fn`` pools take ``k_scale``/``v_scale`` (fp32 ``[H_kv]`` or ``[1]``) and get
``e4m3(x / scale)``, which decode reads back with ``k_descale``/``v_descale`` (the same tensors). The op
mutates k_cache and v_cache (the schema says so) and returns nothing; its plan is
cached per pool set and layout, so every batch size of a serving loop reuses it (see ``Runtime.kv_write``).
"""
from __future__ import annotations

import importlib
import sys
import threading

__all__ = ["register", "set_runtime", "get_runtime", "prefill", "prefill_varlen", "decode", "attention", "kv_write",
           "SCHEMAS"]

NAMESPACE = "aotc"
# operator schemas (torch's schema language); the Python signatures below match them
SCHEMAS = {
    "prefill": "(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None"
    ", int? window_left=None, float? softcap=None, Tensor? sinks=None) -> (Tensor out, Tensor lse)",
    "prefill_out": "(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!)? lse=None, bool causal=False, "
                   "float? scale=None"
                   ", int? window_left=None, float? softcap=None, Tensor? sinks=None) -> ()",
    "prefill_varlen": "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, SymInt max_seqlen_q, "
                      "SymInt max_seqlen_kv, bool causal=False, float? scale=None"
                      ", int? window_left=None, float? softcap=None, Tensor? sinks=None) -> (Tensor out, Tensor lse)",
    "prefill_varlen_out": "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_kv, SymInt max_seqlen_q, "
                          "SymInt max_seqlen_kv, Tensor(a!) out, Tensor(b!)? lse=None, bool causal=False, "
                          "float? scale=None"
                          ", int? window_left=None, float? softcap=None, Tensor? sinks=None) -> ()",
    "decode": "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens_kv, Tensor? page_table=None, "
              "Tensor(a!)? workspace=None, str kv_layout=\"NHD\", int? chunks=None, float? scale=None"
              ", int? window_left=None, float? softcap=None, Tensor? sinks=None"
              ", Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor out, Tensor lse)",
    "decode_out": "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seqlens_kv, Tensor? page_table, Tensor(a!) out, "
                  "Tensor(b!)? lse=None, Tensor(c!)? workspace=None, str kv_layout=\"NHD\", int? chunks=None, "
                  "float? scale=None"
                  ", int? window_left=None, float? softcap=None, Tensor? sinks=None"
                  ", Tensor? k_descale=None, Tensor? v_descale=None) -> ()",
    # the serving entry point: ragged queries (decode rows and prefill chunks together) over a paged KV cache,
    # into the caller's out (and lse): one call per layer per step
    "attention": "(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, Tensor seqlens_kv, Tensor? page_table, "
                 "Tensor(a!) out, Tensor(b!)? lse=None, SymInt? max_seqlen_q=None, bool causal=True, "
                 "float? scale=None, str kv_layout=\"NHD\", int decode_query_len=1, SymInt? max_seqlen_kv=None"
                 ", int? window_left=None, float? softcap=None, Tensor? sinks=None"
                 ", Tensor? k_descale=None, Tensor? v_descale=None, SymInt? min_seqlen_q=None"
                 ", int? prefill_sms=None) -> ()",
    "kv_write": "(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, "
                "str kv_layout=\"NHD\", Tensor? k_scale=None, Tensor? v_scale=None) -> ()",
}

_lock = threading.RLock()
_ops = None  # torch.ops.aotc once registered (a global, so torch.compile traces the wrappers below)
_lib = None  # the torch.library.Library holding the definitions (kept alive)
_torch_module = None  # torch, once register() imported it (a global: torch.compile traces _run)
_runtime = None


def _torch():
    return importlib.import_module("torch")


# ---- the runtime ------------------------------------------------------------------------------
def set_runtime(runtime=None, *paths) -> None:
    """Use this Runtime for the ops (or load bundle paths: set_runtime("a.aotc", "b.aotc")); None resets.

    Any object with the Runtime's ``prefill``, ``prefill_ragged``, ``decode`` and ``kv_write`` methods will do
    for CPU tensors (tests use a torch reference); CUDA tensors need a real Runtime (its prepared plans).
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


# ---- CUDA launches through cached plans --------------------------------------------------------------
def _stream(torch, device: int) -> int:
    """The raw handle of torch's current stream on `device` (what torch itself launches on)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _on_device(torch, device: int, fn):
    """fn() with torch's (and so the driver's) current device set to `device`."""
    if torch.cuda.current_device() == device:
        return fn()
    with torch.cuda.device(device):
        return fn()


# ---- the kernels behind the ops (CUDA: plans; CPU: the runtime object's one-call methods) ------------------
# CUDA tensors go through the Runtime's one-call APIs, whose plan cache is keyed by torch layouts (and
# the caches' pointers): a repeated layout costs a lookup and the per-call pointer checks, no validation.
def _call(torch, q, fn):
    """fn(stream) on q's device and current torch stream (CUDA), or fn(None) (CPU: the runtime refuses)."""
    if q.is_cuda:
        dev = q.get_device()
        _on_device(torch, dev, lambda: fn(_stream(torch, dev)))
    else:
        fn(None)


def _prefill_into(q, k, v, out, lse, causal, scale, window_left, softcap, sinks):
    torch, rt = _torch(), get_runtime()
    _call(torch, q, lambda stream: rt.prefill(q, k, v, out, lse, causal=causal, softmax_scale=scale, stream=stream,
                                              window_left=window_left, softcap=softcap, sinks=sinks))


def _prefill_varlen_into(q, k, v, cu_q, cu_k, max_q, max_k, out, lse, causal, scale, window_left, softcap, sinks):
    torch, rt = _torch(), get_runtime()
    _call(torch, q, lambda stream: rt.prefill_ragged(q, k, v, out, cu_q, cu_k, int(max_q), int(max_k), lse,
                                                     causal=causal, softmax_scale=scale, stream=stream,
                                                     window_left=window_left, softcap=softcap, sinks=sinks))


def _decode_into(q, k_cache, v_cache, seqlens_kv, page_table, out, lse, workspace, kv_layout, chunks, scale,
                 window_left, softcap, sinks, k_descale, v_descale):
    torch, rt = _torch(), get_runtime()
    _call(torch, q, lambda stream: rt.decode(q, k_cache, v_cache, out, seqlens_kv, page_table, lse,
                                             kv_layout=kv_layout, chunks=chunks, workspace=workspace,
                                             softmax_scale=scale, stream=stream, window_left=window_left,
                                             softcap=softcap, sinks=sinks, k_descale=k_descale, v_descale=v_descale))


def _attention_op(q, k_cache, v_cache, cu_seqlens_q, seqlens_kv, page_table, out, lse=None, max_seqlen_q=None,
                  causal=True, scale=None, kv_layout="NHD", decode_query_len=1, max_seqlen_kv=None,
                  window_left=None, softcap=None, sinks=None, k_descale=None, v_descale=None, min_seqlen_q=None,
                  prefill_sms=None):
    torch, rt = _torch(), get_runtime()
    max_q = None if max_seqlen_q is None else int(max_seqlen_q)
    min_q = None if min_seqlen_q is None else int(min_seqlen_q)
    max_kv = None if max_seqlen_kv is None else int(max_seqlen_kv)
    _call(torch, q, lambda stream: rt.attention(q, k_cache, v_cache, out, cu_seqlens_q, seqlens_kv, page_table,
                                                lse=lse, causal=causal, softmax_scale=scale, kv_layout=kv_layout,
                                                max_seqlen_q=max_q, decode_query_len=decode_query_len,
                                                max_seqlen_kv=max_kv, stream=stream, window_left=window_left,
                                                softcap=softcap, sinks=sinks, k_descale=k_descale,
                                                v_descale=v_descale, min_seqlen_q=min_q, prefill_sms=prefill_sms))


def _outputs(q, lse_shape):
    torch = _torch()
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(lse_shape, dtype=torch.float32, device=q.device))


def _prefill_op(q, k, v, causal=False, scale=None, window_left=None, softcap=None, sinks=None):
    out, lse = _outputs(q, (q.shape[0], q.shape[2], q.shape[1]))
    _prefill_into(q, k, v, out, lse, causal, scale, window_left, softcap, sinks)
    return out, lse


def _prefill_out_op(q, k, v, out, lse=None, causal=False, scale=None, window_left=None, softcap=None, sinks=None):
    _prefill_into(q, k, v, out, lse, causal, scale, window_left, softcap, sinks)


def _prefill_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, causal=False, scale=None,
                       window_left=None, softcap=None, sinks=None):
    out, lse = _outputs(q, (q.shape[1], q.shape[0]))
    _prefill_varlen_into(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out, lse, causal, scale,
                         window_left, softcap, sinks)
    return out, lse


def _prefill_varlen_out_op(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out, lse=None,
                           causal=False, scale=None, window_left=None, softcap=None, sinks=None):
    _prefill_varlen_into(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out, lse, causal, scale,
                         window_left, softcap, sinks)


def _decode_op(q, k_cache, v_cache, seqlens_kv, page_table=None, workspace=None, kv_layout="NHD", chunks=None,
               scale=None, window_left=None, softcap=None, sinks=None, k_descale=None, v_descale=None):
    out, lse = _outputs(q, (q.shape[0], q.shape[2], q.shape[1]))
    _decode_into(q, k_cache, v_cache, seqlens_kv, page_table, out, lse, workspace, kv_layout, chunks, scale,
                 window_left, softcap, sinks, k_descale, v_descale)
    return out, lse


def _decode_out_op(q, k_cache, v_cache, seqlens_kv, page_table, out, lse=None, workspace=None, kv_layout="NHD",
                   chunks=None, scale=None, window_left=None, softcap=None, sinks=None, k_descale=None,
                   v_descale=None):
    _decode_into(q, k_cache, v_cache, seqlens_kv, page_table, out, lse, workspace, kv_layout, chunks, scale,
                 window_left, softcap, sinks, k_descale, v_descale)


def _kv_write_op(key, value, k_cache, v_cache, slot_mapping, kv_layout="NHD", k_scale=None, v_scale=None):
    torch, rt = _torch(), get_runtime()
    if key.is_cuda:
        dev = key.get_device()
        _on_device(torch, dev, lambda: rt.kv_write(key, value, k_cache, v_cache, slot_mapping, kv_layout=kv_layout,
                                                   stream=_stream(torch, dev), k_scale=k_scale, v_scale=v_scale))
    else:
        rt.kv_write(key, value, k_cache, v_cache, slot_mapping, kv_layout=kv_layout, stream=None, k_scale=k_scale,
                    v_scale=v_scale)


_KERNELS = {"prefill": _prefill_op, "prefill_out": _prefill_out_op, "prefill_varlen": _prefill_varlen_op,
            "prefill_varlen_out": _prefill_varlen_out_op, "decode": _decode_op, "decode_out": _decode_out_op,
            "attention": _attention_op, "kv_write": _kv_write_op}


# ---- fake (meta) implementations ---------------------------------------------------------------------
def _check_rank(q, ndim: int, what: str) -> None:
    if q.dim() != ndim:
        raise ValueError(f"aotc: q must be {what}, got {q.dim()} dimensions")


def _fake_dense(q, *args, **kwargs):
    _check_rank(q, 4, "q [B, S_q, H_q, D]")
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_torch().float32)


def _fake_varlen(q, *args, **kwargs):
    _check_rank(q, 3, "q [total_q, H_q, D]")
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=_torch().float32)


def _fake_out(q, *args, **kwargs):
    return None


_FAKES = {"prefill": _fake_dense, "prefill_out": _fake_out, "prefill_varlen": _fake_varlen,
          "prefill_varlen_out": _fake_out, "decode": _fake_dense, "decode_out": _fake_out, "attention": _fake_out,
          "kv_write": _fake_out}


# ---- registration -------------------------------------------------------------------------------
def register():
    """Register torch.ops.aotc.* (idempotent; imports torch); returns torch.ops.aotc."""
    global _ops, _lib, _torch_module
    if _ops is not None:
        return _ops
    with _lock:
        if _ops is not None:
            return _ops
        torch = _torch_module = _torch()
        if not hasattr(torch.library, "register_fake"):
            raise ImportError(f"aotc.torch needs torch >= 2.4 (torch.library.register_fake); this is torch "
                              f"{torch.__version__}")
        if not _already_defined(torch):  # defined already when this module was reloaded: ops outlive modules
            lib = torch.library.Library(NAMESPACE, "FRAGMENT")
            for name, schema in SCHEMAS.items():
                lib.define(name + schema)
                for key in ("CUDA", "CPU"):
                    lib.impl(name, _KERNELS[name], key)
                torch.library.register_fake(f"{NAMESPACE}::{name}", _FAKES[name], lib=lib)
            _lib = lib
        _ops = torch.ops.aotc
    return _ops


def _already_defined(torch) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::prefill", "")
        return True
    except RuntimeError:
        return False


# ---- Python entry points ------------------------------------------------------------------------
# An eager call on plain CUDA tensors runs the op's kernel function itself: the dispatcher's boxing of the schema's
# arguments cost 12.4 us of torch.ops.aotc.attention's 78.0 us (aotc.torch.attention 65.6 us; a B 8 decode step, H100;
# benchmarks/results/paged_varlen_h100_083bcf9.json). What must see the op still does: torch.compile's tracing, any
# Python dispatch or function mode (FakeTensorMode, functionalization), tensor subclasses, autograd.
def _direct(torch, x) -> bool:
    """Whether a call whose first tensor is x may skip the dispatcher (see above); torch: the module, passed in
    (dynamo does not trace importlib)."""
    if torch.compiler.is_compiling():  # first: dynamo never looks past it
        return False
    c = torch._C
    dispatch_modes = getattr(c, "_len_torch_dispatch_stack", None)
    function_mode = getattr(c, "_is_torch_function_mode_enabled", None)
    if dispatch_modes is None or function_mode is None:  # a torch without them: always the dispatcher
        return False
    return (type(x) is torch.Tensor and x.is_cuda and not (x.requires_grad and torch.is_grad_enabled())
            and dispatch_modes() == 0 and not function_mode())


def _run(name: str, *args):
    """torch.ops.aotc.<name>(*args), or, where _direct(args[0]), the op's kernel function called directly."""
    ops = _ops or register()
    if _direct(_torch_module, args[0]):
        return _KERNELS[name](*args)
    return getattr(ops, name)(*args)


def prefill(q, k, v, *, causal: bool = False, scale: float | None = None, out=None, lse=None,
            window_left: int | None = None, softcap: float | None = None, sinks=None):
    """(out, lse) = attention over dense q [B, S_q, H_q, D], k/v [B, S_kv, H_kv, D]: torch.ops.aotc.prefill,
    or prefill_out into the given out (and lse) buffers. window_left, softcap, sinks: Runtime.prefill's."""
    if out is None:
        return _run("prefill", q, k, v, causal, scale, window_left, softcap, sinks)
    _run("prefill_out", q, k, v, out, lse, causal, scale, window_left, softcap, sinks)
    return out, lse


def prefill_varlen(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int, max_seqlen_kv: int, *,
                   causal: bool = False, scale: float | None = None, out=None, lse=None,
                   window_left: int | None = None, softcap: float | None = None, sinks=None):
    """(out, lse [H_q, total_q]) over packed tokens q [total_q, H_q, D] with int32 cu_seqlens [B + 1]."""
    if out is None:
        return _run("prefill_varlen", q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, causal, scale,
                    window_left, softcap, sinks)
    _run("prefill_varlen_out", q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, out, lse, causal,
         scale, window_left, softcap, sinks)
    return out, lse


def decode(q, k_cache, v_cache, seqlens_kv, page_table=None, *, workspace=None, kv_layout: str = "NHD",
           chunks: int | None = None, scale: float | None = None, out=None, lse=None,
           window_left: int | None = None, softcap: float | None = None, sinks=None, k_descale=None,
           v_descale=None):
    """(out, lse) for q [B, S_q<=16, H_q, D] over a paged (NHD/HND) or dense KV cache: torch.ops.aotc.decode,
    or decode_out into the given out (and lse) buffers. k_descale, v_descale: the fp32 scales [H_kv] or [1]
    of a torch.float8_e4m3fn cache (attention over k_fp8 * k_descale, v_fp8 * v_descale).

    The work partition follows the device-side seqlens_kv at every call (chunks: its target chunk count,
    one wave of CTAs by default). workspace: None for the stream's buffer of the runtime's arena; one passed
    in (uint8, rt.decode_workspace_bytes) must be written by nothing else between decode calls (its last bytes
    hold counters every call leaves at zero).
    """
    if out is None:
        return _run("decode", q, k_cache, v_cache, seqlens_kv, page_table, workspace, kv_layout, chunks, scale,
                    window_left, softcap, sinks, k_descale, v_descale)
    _run("decode_out", q, k_cache, v_cache, seqlens_kv, page_table, out, lse, workspace, kv_layout, chunks, scale,
         window_left, softcap, sinks, k_descale, v_descale)
    return out, lse


def attention(q, k_cache, v_cache, cu_seqlens_q, seqlens_kv, page_table, *, out=None, lse=None,
              max_seqlen_q: int | None = None, causal: bool = True, scale: float | None = None,
              kv_layout: str = "NHD", decode_query_len: int = 1, max_seqlen_kv: int | None = None,
              window_left: int | None = None, softcap: float | None = None, sinks=None, k_descale=None,
              v_descale=None, min_seqlen_q: int | None = None, prefill_sms: int | None = None):
    """(out, lse) for ragged q [total_q, H_q, D] (cu_seqlens_q int32 [B + 1]: decode rows and prefill chunks
    alike) over a paged KV cache (seqlens_kv: full lengths, new tokens included; page_table int32
    [B, max_pages]), bottom-right causal per sequence: torch.ops.aotc.attention into out (allocated when None;
    lse [H_q, total_q] fp32 when given). A torch.float8_e4m3fn cache takes k_descale, v_descale (fp32 [H_kv]
    or [1]: attention over k_fp8 * k_descale, v_fp8 * v_descale). max_seqlen_q, min_seqlen_q: optional bounds on
    the sequences' query counts (Runtime.attention: each can skip one of the two kernels' launches); prefill_sms:
    the paged kernel on that many SMs, the decode kernel beside it (Runtime.attention; get_runtime().step_prefill_sms
    picks it from a step's host-side lengths)."""
    if out is None:
        out = _torch().empty_like(q)
    _run("attention", q, k_cache, v_cache, cu_seqlens_q, seqlens_kv, page_table, out, lse, max_seqlen_q, causal, scale,
         kv_layout, decode_query_len, max_seqlen_kv, window_left, softcap, sinks, k_descale, v_descale, min_seqlen_q,
         prefill_sms)
    return out, lse


def kv_write(key, value, k_cache, v_cache, slot_mapping, *, kv_layout: str = "NHD", k_scale=None,
             v_scale=None) -> None:
    """Write key/value [tokens, H_kv, D] into the paged pools k_cache/v_cache (NHD or HND, in place) at the int64
    slots of slot_mapping [num_tokens <= tokens]: torch.ops.aotc.kv_write. A slot of -1 (padding), or any
    other slot outside the pools, is skipped. torch.float8_e4m3fn pools take k_scale, v_scale (fp32 [H_kv] or
    [1]) and get e4m3(x / scale), saturated to +-448, rounded to nearest even."""
    _run("kv_write", key, value, k_cache, v_cache, slot_mapping, kv_layout, k_scale, v_scale)


if "torch" in sys.modules:  # torch is already here: make torch.ops.aotc.* available at once
    try:
        register()
    except Exception:  # a torch too old or half-imported: the functions above raise the reason on use
        pass
