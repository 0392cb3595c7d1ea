"""Shared pieces of test_features.py: the attention features (sliding window, soft-cap, sinks) in an fp64
torch reference written from their definitions, the variants of the loaded bundle that carry them, and the
feature values and shapes each test walks through.

Definitions (query row i of s_q over s_kv keys sits at position p = i + s_kv - s_q; s_ij = scale * q_i . k_j):
* window_left w (causal only): row i sees keys p - w <= j <= p (and 0 <= j < s_kv);
* softcap c: the score becomes c * tanh(s_ij / c), before masking;
* sinks [H_q] fp32: one extra logit per query head in the denominator, with no value:
  P_ij = exp(s_ij) / (exp(sink_h) + sum_k exp(s_ik)), LSE_i = log(exp(sink_h) + sum_k exp(s_ik)); a row that
  sees no key has O = 0 and LSE = sink_h (without sinks: O = 0, LSE = -inf).
GQA: query head h reads KV head h // (H_q / H_kv).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from prefill_cases import DT, LSE_TOL

FEATURES = ("window", "softcap", "sinks")  # the boolean variant fields, in a fixed order
PREFILL_FAMILIES = ("sdpa_prefill", "sdpa_prefill_sm90")
PREFILL_KEY = ("dtype", "head_dim", "layout", "causal")
DECODE_KEY = ("dtype", "head_dim", "kv", "layout")

# The values each feature walks through, one per setting index (a feature's list is cycled): windows of one key,
# 127 and 128 (either side of a 128-key tile), 4096, and one larger than any sequence here; caps 30 and 50 over
# scores several times larger; sinks dominating (+20), negligible (-30), and mixed per head (comparable values too)
WINDOWS = (1, 127, 128, 4096, 100_000)
SOFTCAPS = (30.0, 50.0)
SINK_KINDS = ("big", "tiny", "mixed")
MIXED_SINKS = (20.0, -30.0, 0.5, 4.0, -2.0, 8.0, 1.5, -30.0)
N_SETTINGS = len(WINDOWS)


def combo_of(variant) -> tuple[str, ...]:
    """The features a variant carries, e.g. ("window", "sinks"); () for a plain kernel."""
    return tuple(f for f in FEATURES if variant.get(f, False))


def feature_variants(rt, family: str, key_fields: tuple[str, ...]) -> list[tuple]:
    """The distinct (key fields..., combo) of the loaded kernels of `family` over 16-bit caches that carry at least
    one feature (other fields, e.g. block_n or strides, are the runtime's choice; fp8 caches: test_fp8_kv.py)."""
    found = set()
    for k in rt.kernels.get(family, []):
        combo = combo_of(k.variant)
        if combo and k.variant.get("kv_dtype", k.variant["dtype"]) == k.variant["dtype"]:
            found.add(tuple(k.variant.get(f) for f in key_fields) + (combo,))
    return sorted(found, key=repr)


def lse_tol(softcap):
    """LSE tolerance: the suite's, plus softcap * 2^-10 of atol with soft-cap on (tanh.approx.f32: relative error
    2^-11, so a capped score, and so the LSE, may be off by up to softcap * 2^-11)."""
    return LSE_TOL if softcap is None else (LSE_TOL[0] + softcap * 2.0 ** -10, LSE_TOL[1])


def make_sinks(kind, heads_q: int, device="cuda"):
    if kind is None:
        return None
    if kind == "big":
        vals = [20.0] * heads_q
    elif kind == "tiny":
        vals = [-30.0] * heads_q
    elif kind == "mixed":
        vals = [MIXED_SINKS[h % len(MIXED_SINKS)] for h in range(heads_q)]
    else:
        raise ValueError(kind)
    return torch.tensor(vals, dtype=torch.float32, device=device)


@dataclass(frozen=True)
class Features:
    """The feature values of one call (None: off); sinks as a kind (make_sinks)."""

    window_left: int | None = None
    softcap: float | None = None
    sinks: str | None = None

    def kwargs(self, heads_q: int) -> dict:
        return {"window_left": self.window_left, "softcap": self.softcap, "sinks": make_sinks(self.sinks, heads_q)}

    def __str__(self) -> str:
        return f"window_left={self.window_left} softcap={self.softcap} sinks={self.sinks}"


def settings(combo: tuple[str, ...]) -> list[Features]:
    """N_SETTINGS feature settings for a combo: setting i takes WINDOWS[i], SOFTCAPS[i % 2], SINK_KINDS[i % 3]
    for the features the combo has, so every value of every feature appears and combined features vary
    together."""
    return [Features(WINDOWS[i] if "window" in combo else None,
                     SOFTCAPS[i % len(SOFTCAPS)] if "softcap" in combo else None,
                     SINK_KINDS[i % len(SINK_KINDS)] if "sinks" in combo else None) for i in range(N_SETTINGS)]


def softcap_amplitude(softcap, scale: float, head_dim: int) -> float:
    """The factor for q and k (N(0, 1) entries) that makes scale * q . k about N(0, (2 * softcap)^2): scores reach
    several times the cap (and 1 without soft-cap)."""
    if softcap is None:
        return 1.0
    return math.sqrt(2.0 * softcap / (scale * math.sqrt(head_dim)))


def reference(q, k, v, *, causal: bool, scale: float, window_left=None, softcap=None, sinks=None, budget=1 << 25):
    """fp64 attention with the features, from their definitions: q [S_q, H_q, D], k/v [S_kv, H_kv, D], sinks [H_q]
    or None -> (O [S_q, H_q, D], LSE [H_q, S_q]), both fp64. Over blocks of query rows (about `budget` scores each),
    each on the keys some row of the block can see."""
    assert window_left is None or causal, "a window needs causal"
    S_q, H_q, D = q.shape
    S_kv, H_kv, _ = k.shape
    dev = q.device
    o = torch.zeros(S_q, H_q, D, dtype=torch.float64, device=dev)
    sink = None if sinks is None else sinks.to(device=dev, dtype=torch.float64)
    lse = (torch.full((H_q, S_q), -math.inf, dtype=torch.float64, device=dev) if sink is None
           else sink[:, None].expand(H_q, S_q).clone())  # what a row that sees no key gets
    if S_q == 0 or S_kv == 0:
        return o, lse
    rep = H_q // H_kv
    qd = q.double().permute(1, 0, 2).reshape(H_kv, rep, S_q, D)  # query head h = kv * rep + r
    kd = k.double().permute(1, 0, 2)[:, None]  # [H_kv, 1, S_kv, D]
    vd = v.double().permute(1, 0, 2)[:, None]
    offset = S_kv - S_q
    step = max(1, budget // max(1, H_q * S_kv))
    for r0 in range(0, S_q, step):
        r1 = min(S_q, r0 + step)
        lo, hi = 0, S_kv
        if causal:
            hi = min(S_kv, max(0, r1 + offset))  # the last row's position + 1
            if window_left is not None:
                lo = min(hi, max(0, r0 + offset - window_left))  # the first row's window start
        if hi <= lo:
            continue  # no row of the block sees a key
        s = torch.matmul(qd[:, :, r0:r1], kd[:, :, lo:hi].transpose(-1, -2)).reshape(H_q, r1 - r0, hi - lo) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if causal:
            pos = torch.arange(r0, r1, device=dev)[:, None] + offset
            j = torch.arange(lo, hi, device=dev)[None, :]
            hidden = j > pos
            if window_left is not None:
                hidden |= j < pos - window_left
            s = s.masked_fill(hidden, -math.inf)
        m = torch.logsumexp(s, dim=-1)  # [H_q, rows]; -inf where a row sees no key
        if sink is not None:
            m = torch.logaddexp(m, sink[:, None].expand_as(m))
        p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m)[..., None])
        ob = torch.matmul(p.reshape(H_kv, rep, r1 - r0, hi - lo), vd[:, :, lo:hi]).reshape(H_q, r1 - r0, D)
        o[r0:r1] = ob.transpose(0, 1)
        lse[:, r0:r1] = m
    return o, lse


class DenseKV:
    """A dense [B, S_max, H_kv, D] K/V cache shaped like paged_cases.PagedCache for the decode tests."""

    def __init__(self, lengths, H_kv, D, dtype, gen):
        self.lengths, self.layout, self.page_table = list(lengths), "NHD", None
        S = max(1, max(lengths))
        self.k = torch.randn(len(lengths), S, H_kv, D, dtype=DT[dtype], device="cuda", generator=gen)
        self.v = torch.randn(len(lengths), S, H_kv, D, dtype=DT[dtype], device="cuda", generator=gen)
        self.seqlens = torch.tensor(self.lengths, dtype=torch.int32, device="cuda")

    def dense(self, b, length=None):
        L = self.lengths[b] if length is None else length
        return self.k[b, :L], self.v[b, :L]

    def poison(self, value, **_):
        for x in (self.k, self.v):
            for b, L in enumerate(self.lengths):
                x[b, L:] = value
