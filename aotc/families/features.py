"""The score features every attention family carries: sliding window, soft-cap and sinks (plain data).

Each is a compile-time boolean field, so a kernel without it pays nothing, and its value is a runtime
parameter (in every attention kernel's ABI, unused by the variants without the feature):

  window  / window_left (i32): with causal, query row i of a sequence (absolute position
          p = i + S_kv - S_q) sees keys p - window_left <= j <= p; the kernels skip the kv blocks
          outside the window. vLLM passes sliding_window - 1.
  softcap / softcap (f32 > 0): the score s = scale * q.k becomes softcap * tanh(s / softcap) before the
          mask (tanh.approx.f32: relative error 2^-11, so a score is off by at most softcap * 2^-11).
  sinks   / sinks (fp32 [H_q]): one extra logit per query head in the softmax denominator, with no
          value: p_j = exp(s_j) / (exp(sink_h) + sum_k exp(s_k)); LSE = log(exp(sink_h) + sum_k exp(s_k)).
          A row that sees no key gets O = 0 and LSE = sink_h.

A spec that leaves a feature field out builds it off (Field.unlisted): features are opt-in, so the
existing entries of a spec do not multiply by eight.
"""
from __future__ import annotations

from ..common.abi import Param, ptr
from . import Field

FEATURES = ("window", "softcap", "sinks")

FEATURE_FIELDS = (
    Field("window", (False, True), "sliding window (causal only): a row sees keys p - window_left .. p",
          unlisted=(False,)),
    Field("softcap", (False, True), "logits soft-cap: s -> softcap * tanh(s / softcap)", unlisted=(False,)),
    Field("sinks", (False, True), "a learned per-head sink logit in the softmax denominator", unlisted=(False,)),
)

# appended to every attention kernel's parameters (the kernels' signatures end with them; sdpa_decode's then
# with its fp8 KV scales, aotc.families.kv_dtype)
FEATURE_PARAMS: tuple[Param, ...] = (ptr("sinks", 4), Param("window_left", "i32"), Param("softcap", "f32"))


def why_invalid_features(values: dict) -> str | None:
    """A window needs the causal mask (it bounds keys below the causal diagonal)."""
    if values.get("window") and values.get("causal") is False:
        return "window needs causal = true (the window is the keys p - window_left .. p below the diagonal)"
    return None


def chain(*rules):
    """One validity rule from several: the first reason any gives."""
    def why_invalid(values: dict) -> str | None:
        for rule in rules:
            reason = rule(values)
            if reason is not None:
                return reason
        return None
    return why_invalid
