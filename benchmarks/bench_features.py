"""Attention features (sliding window, soft-cap, sinks): each feature kernel beside the same family's plain
kernel on the same inputs, a second plain plan (A/A), and FlashAttention-3 where its wheel serves the case,
all in one process.

    python benchmarks/bench_features.py --bundle artifacts/default.aotc --fa3 --out DIR [--quick] [--rounds N]

bf16 throughout, causal (bottom-right), random N(0, 1) inputs, default softmax scale 1/sqrt(D). The
contenders of a row, each a prepared plan launched with raw pointers (plan.run) or one FA3 call:

* aotc:       rt.prepare_prefill / rt.prepare_decode with the row's features (window_left=, softcap=, sinks=);
* aotc_plain: the same entry point without any feature, prepared for the family the feature plan runs
              (plan.variant.family), on the same tensors: the kernel the runtime picks for them, whose kv
              tile (plain_block_n) may differ from the feature variant's (block_n; same_block_n says);
* aa:         a second plain plan on the same tensors (its own output): x_aa = aa / aotc_plain is how far two
              identical contenders land apart in the same rounds, the noise a goal's margin is judged by;
* fa3:        the fa3-fwd wheel with the same features (flash_attn_func(..., causal=True,
              window_size=(window_left, 0), softcap=c); flash_attn_with_kvcache on dense KV for decode); a
              feature the wheel cannot take leaves fa3_ms null and says why in fa3_note or fa3_error
              (fa3-fwd 0.0.3 is built with FLASHATTENTION_DISABLE_LOCAL, so its window calls fail with
              "This flash attention build does not support local attention."; it has no sinks parameter);
* fa3_plain:  the same FA3 call without the feature (information: FA3's own cost of the feature).

Time (benchmarks/timing.py): prefill rows as benchmarks/bench_prefill.py (event_time: the clocks settled on
the contender for 100 ms, CUDA events around 10 back-to-back launches, median of 5 trials, each after an
L2 flush); decode rows as benchmarks/bench_decode_varlen.py does (graph_time: a CUDA graph of 10 steps,
median of 20 replays, each after an L2 flush). The contenders take turns for --rounds rounds in rotated order and each
reports the median over rounds (<name>_ms for prefill, <name>_us for decode; <name>_spread = (max - min) /
median over rounds).

Window convention: window_left w (the runtime's keyword, FA3's window_size[0]): the row at absolute position p
sees keys p - w .. p, i.e. w + 1 keys. Row 1 uses w = 4096 (FA3's window_size=(4096, 0)); the gpt-oss row uses
w = 127 (gpt-oss's sliding_window of 128 keys, as vLLM passes sliding_window - 1); decode uses w = 4096, so a
sequence needs min(s_kv, 4097) keys.

Rows (CASES; every one records its goals, each {goal, field, value, bound, met}, and goal_met: False if a
measured goal failed, None if one could not be measured, else True):

* prefill_d128_s16384_causal_wl4096 (B 1, H 16): goal ratio = aotc_ms / aotc_plain_ms <= 0.55; work_fraction
  = visible (query, key) pairs with the window / without (0.438), tile_fraction the same in the feature
  kernel's (block_m, block_n) tiles.
* prefill_d{256,128}_s8192_causal_softcap50 (B 2, H 16): goals ratio <= 1.10 and x_fa3 = fa3_ms / aotc_ms
  >= 1.0 (FA3 softcap=50).
* prefill_d64_s8192_gqa64x8_causal_sinks (B 2, H_q/H_kv 64/8): goal ratio <= 1.03 (fa3-fwd 0.0.3 takes no
  sinks: fa3_ms null); prefill_d64_s8192_gqa64x8_causal_wl127_sinks the same shape with gpt-oss's sliding
  window (information, no goal).
* decode_paged16_d128_b16x32768_gqa32x8_wl4096 (S_q 1, H_q/H_kv 32/8, NHD pages of 16, shuffled): aotc_us,
  aotc_plain_us; window_TBps = K/V bytes inside the window (min(s_kv, w + 1) keys a sequence) / aotc_us,
  plain_TBps = all K/V bytes / aotc_plain_us; goal bw_ratio = window_TBps / plain_TBps >= 0.9.
* aa_prefill_d64_s8192_gqa64x8_causal: the A/A control row, the plain kernel as two prepared plans (aotc_ms
  and aotc_plain_ms are both plain), interleaved; goal 0.98 <= ratio <= 1.02 (the band this program sets:
  the sinks goal's 3% needs a noise floor well under it).

Correctness, once per contender before timing, on inputs of its own (q * check_q_scale: 8 in the soft-cap
rows, so that scores reach the cap; sinks linspace(0, 12, H_q), so that they matter; the timed inputs keep
N(0, 1) sinks): <name>_max_abs_err against torch's fp32 math (reference()) on sampled query rows of the
first and last sequence, the feature's reference for aotc and fa3, the plain one for the others;
feature_effect = max |feature reference - plain reference| on those rows (an aotc that ignored its feature
would be off by about that much). A contender that fails (a feature variant missing from the bundle, a
keyword the runtime does not take) leaves <name>_error and the row goes on without it; a case that fails as
a whole (out of memory, say) leaves error.

Writes DIR/features.json: header (date, gpu, clocks, torch, git_commit from AOTC_GIT_COMMIT or git, command,
fa3 version, fa3_features, fa3_build_flags, rounds) and rows.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import event_time, graph_time, interleaved  # noqa: E402

PAGE = 16
DEVICE = "cuda"  # where the tensors live (the CPU suite runs the whole row on "cpu" with a fake runtime)
FLUSH_BYTES = 256 << 20  # the L2 flush: a memset of this many bytes before every trial
SOFTCAP_CHECK_Q_SCALE = 8.0  # the check's q scale in soft-cap rows: scores of tens, so tanh bends them
CHECK_SINKS = (0.0, 12.0)  # the check's sinks: linspace over the heads (a sink of 12 outweighs 8192 keys)
FA3_SINK_PARAMS = ("sinks", "learnable_sink", "s_aux", "sink")  # names an FA3 build might give sinks


class Goal(NamedTuple):
    field: str  # the row field the goal bounds
    op: str  # "<=" or ">="
    bound: float
    text: str  # the goal as stated


class Case(NamedTuple):
    name: str
    kind: str  # "prefill", "decode" or "aa" (the A/A control: plain twice)
    head_dim: int
    batch: int
    seqlen: int  # prefill: S_q = S_kv; decode: every sequence's s_kv (S_q 1)
    heads_q: int
    heads_kv: int
    window_left: int | None = None
    softcap: float | None = None
    sinks: bool = False
    goals: tuple = ()
    check_q_scale: float = 1.0


RATIO = "aotc_ms / aotc_plain_ms"
CASES = (
    Case("prefill_d128_s16384_causal_wl4096", "prefill", 128, 1, 16384, 16, 16, window_left=4096,
         goals=(Goal("ratio", "<=", 0.55, "aotc_ms <= 0.55 * aotc_plain_ms"),)),
    Case("prefill_d256_s8192_causal_softcap50", "prefill", 256, 2, 8192, 16, 16, softcap=50.0,
         check_q_scale=SOFTCAP_CHECK_Q_SCALE,
         goals=(Goal("ratio", "<=", 1.10, "aotc_ms <= 1.10 * aotc_plain_ms"),
                Goal("x_fa3", ">=", 1.0, "fa3_ms / aotc_ms >= 1.0 (FA3 softcap=50)"))),
    Case("prefill_d128_s8192_causal_softcap50", "prefill", 128, 2, 8192, 16, 16, softcap=50.0,
         check_q_scale=SOFTCAP_CHECK_Q_SCALE,
         goals=(Goal("ratio", "<=", 1.10, "aotc_ms <= 1.10 * aotc_plain_ms"),
                Goal("x_fa3", ">=", 1.0, "fa3_ms / aotc_ms >= 1.0 (FA3 softcap=50)"))),
    Case("prefill_d64_s8192_gqa64x8_causal_sinks", "prefill", 64, 2, 8192, 64, 8, sinks=True,
         goals=(Goal("ratio", "<=", 1.03, "aotc_ms <= 1.03 * aotc_plain_ms"),)),
    Case("prefill_d64_s8192_gqa64x8_causal_wl127_sinks", "prefill", 64, 2, 8192, 64, 8, window_left=127,
         sinks=True),  # gpt-oss's sliding layers: information
    Case("decode_paged16_d128_b16x32768_gqa32x8_wl4096", "decode", 128, 16, 32768, 32, 8, window_left=4096,
         goals=(Goal("bw_ratio", ">=", 0.9, "window_TBps >= 0.9 * plain_TBps"),)),
    Case("aa_prefill_d64_s8192_gqa64x8_causal", "aa", 64, 2, 8192, 64, 8,
         goals=(Goal("ratio", ">=", 0.98, "aotc_ms >= 0.98 * aotc_plain_ms (A/A: both plain)"),
                Goal("ratio", "<=", 1.02, "aotc_ms <= 1.02 * aotc_plain_ms (A/A: both plain)"))),
)
QUICK_SKIPS = ("prefill_d128_s8192_causal_softcap50", "prefill_d64_s8192_gqa64x8_causal_wl127_sinks")


# ---- pure Python: work, bytes, goals, rows ----------------------------------------------------------------
def keys_seen(p: int, s_kv: int, window_left: int | None = None) -> int:
    """Keys the causal query row at absolute position p sees among s_kv keys: j <= p, j < s_kv and, with a
    window, j >= p - window_left."""
    hi = min(p, s_kv - 1)
    lo = 0 if window_left is None else max(0, p - window_left)
    return max(0, hi - lo + 1)


def visible_pairs(s_q: int, s_kv: int, window_left: int | None = None) -> int:
    """(query, key) pairs a causal sequence computes, bottom-right aligned: row i at p = i + s_kv - s_q."""
    return sum(keys_seen(i + s_kv - s_q, s_kv, window_left) for i in range(s_q))


def prefill_flops(case: Case, window_left: int | None = None) -> int:
    """4 * D * H_q per visible (query, key) pair (QK^T and PV), every sequence of the batch."""
    return 4 * case.head_dim * case.heads_q * case.batch * visible_pairs(case.seqlen, case.seqlen, window_left)


def tile_pairs(s: int, bm: int, bn: int, window_left: int | None = None) -> int:
    """(query tile, kv block) pairs a tiled causal kernel visits on S_q = S_kv = s: tile rows q0 .. q1 visit
    the blocks from the one holding key q0 - window_left (0 without a window) to the one holding key q1."""
    total = 0
    for q0 in range(0, s, bm):
        q1 = min(q0 + bm, s) - 1
        n_max = q1 // bn + 1
        n_min = 0 if window_left is None else max(0, q0 - window_left) // bn
        total += n_max - n_min
    return total


def tile_fraction(s: int, bm: int, bn: int, window_left: int) -> float:
    return tile_pairs(s, bm, bn, window_left) / tile_pairs(s, bm, bn)


def kv_bytes(lengths, heads_kv: int, head_dim: int, window_left: int | None = None, elem_bytes: int = 2) -> int:
    """Bytes of K and V a decode step (S_q 1) needs: min(s_kv, window_left + 1) keys of each sequence, or all."""
    keys = sum(n if window_left is None else min(n, window_left + 1) for n in lengths)
    return 2 * keys * heads_kv * head_dim * elem_bytes


def unit(kind: str) -> str:
    """The time field suffix of a row of this kind: ms for prefill rows, us for decode."""
    return "us" if kind == "decode" else "ms"


def base_row(case: Case) -> dict:
    """A row's facts before any timing: shape, features, the work or bytes its rates are taken over, goals."""
    row = {"case": case.name, "kind": case.kind, "dtype": "bf16", "D": case.head_dim, "B": case.batch,
           "H_q": case.heads_q, "H_kv": case.heads_kv, "causal": True, "window_left": case.window_left,
           "window_keys": None if case.window_left is None else case.window_left + 1, "softcap": case.softcap,
           "sinks": case.sinks}
    if case.kind == "decode":
        lengths = [case.seqlen] * case.batch
        row.update(S_q=1, s_kv=case.seqlen, page=PAGE, kv_layout="NHD",
                   kv_bytes=kv_bytes(lengths, case.heads_kv, case.head_dim, case.window_left),
                   plain_kv_bytes=kv_bytes(lengths, case.heads_kv, case.head_dim))
    else:
        row.update(S=case.seqlen, tokens=case.batch * case.seqlen, flops=prefill_flops(case, case.window_left),
                   plain_flops=prefill_flops(case))
        row["work_fraction"] = row["flops"] / row["plain_flops"]
    row["goals"] = [{"goal": g.text, "field": g.field, "value": None, "bound": g.bound, "met": None}
                    for g in case.goals]
    row["goal_met"] = None
    return row


def derive(row: dict) -> None:
    """Rates and ratios from a row's <name>_ms (prefill, A/A) or <name>_us (decode); a missing time leaves its
    fields out. ratio = aotc / aotc_plain, x_aa = aa / aotc_plain, x_fa3 = fa3 / aotc (above 1: aotc faster),
    fa3_ratio = fa3 / fa3_plain, x_fa3_plain = fa3_plain / aotc_plain; prefill <name>_tflops over the row's
    flops (plain_flops for the plain contenders); decode window_TBps, plain_TBps, bw_ratio and speedup =
    aotc_plain_us / aotc_us, fa3_TBps / fa3_plain_TBps."""
    u = unit(row["kind"])
    t = {k[:-len(u) - 1]: v for k, v in row.items() if k.endswith("_" + u) and isinstance(v, (int, float))}

    def ratio(key, a, b):
        if a in t and b in t and t[b] > 0:
            row[key] = t[a] / t[b]

    ratio("ratio", "aotc", "aotc_plain")
    ratio("x_aa", "aa", "aotc_plain")
    ratio("x_fa3", "fa3", "aotc")
    ratio("fa3_ratio", "fa3", "fa3_plain")
    ratio("x_fa3_plain", "fa3_plain", "aotc_plain")
    if row["kind"] == "decode":
        ratio("speedup", "aotc_plain", "aotc")
        for name, field, key in (("aotc", "window_TBps", "kv_bytes"), ("aotc_plain", "plain_TBps", "plain_kv_bytes"),
                                 ("fa3", "fa3_TBps", "kv_bytes"), ("fa3_plain", "fa3_plain_TBps", "plain_kv_bytes"),
                                 ("plain_short", "plain_short_TBps", "kv_bytes")):
            if name in t and key in row:
                row[field] = row[key] / t[name] / 1e6
        if "window_TBps" in row and "plain_TBps" in row:
            row["bw_ratio"] = row["window_TBps"] / row["plain_TBps"]
        if "window_TBps" in row and "plain_short_TBps" in row:
            row["x_plain_short"] = row["window_TBps"] / row["plain_short_TBps"]
    elif "flops" in row:
        for name, ms in t.items():
            plain = name in ("aotc_plain", "aa", "fa3_plain") or row["kind"] == "aa"
            row[f"{name}_tflops"] = row["plain_flops" if plain else "flops"] / ms / 1e9


def check_goals(row: dict, goals) -> None:
    """Fill row["goals"] with each goal's value and verdict, and row["goal_met"]: False if a measured goal
    failed, None if a goal could not be measured (its field is missing), True if every goal was met; None
    for a row without goals."""
    verdicts = []
    out = []
    for g in goals:
        value = row.get(g.field)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            value, met = None, None
        else:
            met = value <= g.bound if g.op == "<=" else value >= g.bound
        out.append({"goal": g.text, "field": g.field, "value": value, "bound": g.bound, "met": met})
        verdicts.append(met)
    row["goals"] = out
    if not verdicts:
        row["goal_met"] = None
    elif False in verdicts:
        row["goal_met"] = False
    elif None in verdicts:
        row["goal_met"] = None
    else:
        row["goal_met"] = True


def sample_rows(s: int, window_left: int | None = None, edge: int = 64) -> list[int]:
    """Query rows the check compares (sorted, distinct, in [0, s)): the first `edge`, `edge` around the
    middle, the last 2 * edge and, with a window, `edge` around window_left (where the window starts to cut)."""
    rows = set(range(min(edge, s)))
    rows |= set(range(max(0, s // 2 - edge // 2), min(s, s // 2 + edge // 2)))
    rows |= set(range(max(0, s - 2 * edge), s))
    if window_left is not None:
        rows |= set(range(max(0, window_left - edge // 2), min(s, window_left + edge // 2)))
    return sorted(rows)


def feature_kwargs(case: Case, sinks=None) -> dict:
    """The runtime keywords of the case's features (none for a plain or A/A case)."""
    kw = {}
    if case.kind == "aa":
        return kw
    if case.window_left is not None:
        kw["window_left"] = case.window_left
    if case.softcap is not None:
        kw["softcap"] = case.softcap
    if case.sinks:
        kw["sinks"] = sinks
    return kw


def fa3_sinks_param(fn) -> str | None:
    """The name under which an FA3 entry point takes per-head sinks, or None (fa3-fwd 0.0.3: none)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in FA3_SINK_PARAMS if n in params), None)


def fa3_kwargs(case: Case, sinks=None, sinks_param: str | None = None) -> tuple[dict | None, str | None]:
    """(FA3 keywords for the case's features, None) or (None, why FA3 cannot serve the case)."""
    kw = {}
    if case.kind == "aa":
        return None, "A/A control row: aotc only"
    if case.window_left is not None:
        kw["window_size"] = (case.window_left, 0)
    if case.softcap is not None:
        kw["softcap"] = case.softcap
    if case.sinks:
        if sinks_param is None:
            return None, "the fa3 wheel takes no sinks (no sinks parameter in its interface)"
        kw[sinks_param] = sinks
    return kw, None


def fa3_features(build_flags: dict, sinks_param: str | None) -> dict:
    """What the FA3 build serves, from its fa3_fwd_config CONFIG['build_flags'] and its sinks parameter."""
    return {"window": not build_flags.get("FLASHATTENTION_DISABLE_LOCAL", False),
            "softcap": not build_flags.get("FLASHATTENTION_DISABLE_SOFTCAP", False),
            "sinks": sinks_param is not None,
            "paged_kv": not build_flags.get("FLASHATTENTION_DISABLE_PAGEDKV", False)}


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"


def rounded(row: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


# ---- torch (any device): the reference --------------------------------------------------------------------
def reference(q, k, v, positions, *, scale: float, window_left: int | None = None, softcap: float | None = None,
              sinks=None):
    """fp32 attention of query rows q [r, H_q, D] at absolute positions `positions` (r ints) over one
    sequence's k, v [S_kv, H_kv, D] (query head h reads KV head h // (H_q / H_kv)): key j is seen iff j <= p
    and, with a window, j >= p - window_left; score s = scale * q.k, soft-capped to c * tanh(s / c) when
    softcap = c; sinks [H_q]: p_j = exp(s_j) / (exp(sink_h) + sum_k exp(s_k)). A row that sees no key gets 0.
    Returns [r, H_q, D] fp32."""
    import torch

    hq, hkv = q.shape[1], k.shape[1]
    qf = q.float().transpose(0, 1)  # [H_q, r, D]
    kf, vf = (x.float().repeat_interleave(hq // hkv, dim=1).transpose(0, 1) for x in (k, v))  # [H_q, S, D]
    s = scale * (qf @ kf.transpose(1, 2))  # [H_q, r, S]
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    p = torch.as_tensor(list(positions), device=q.device)[:, None]
    j = torch.arange(k.shape[0], device=q.device)[None, :]
    seen = j <= p
    if window_left is not None:
        seen &= j >= p - window_left
    s = s.masked_fill(~seen, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    sk = None
    if sinks is not None:
        sk = sinks.float().to(q.device)[:, None, None].expand_as(m)
        m = torch.maximum(m, sk)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    if sk is not None:
        denom = denom + torch.exp(sk - m)
    o = (e @ vf) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return o.transpose(0, 1)


# ---- on the GPU -------------------------------------------------------------------------------------------
def _first(result):
    """FA3's output whether or not it came with its LSE."""
    return result[0] if isinstance(result, tuple) else result


def _block_sizes(plan) -> tuple[int | None, int | None]:
    """(block_m, block_n) of a prefill plan's cubin, where its artifact records them."""
    try:
        bm = int(plan.kernel.artifact.launch.extra["block_m"])
    except (AttributeError, KeyError, TypeError, ValueError):
        bm = None
    bn = plan.variant.get("block_n") if hasattr(plan, "variant") else None
    return bm, bn


def prepare(row: dict, plans: dict, name: str, make) -> object | None:
    """plans[name] = make() (a plan), its variant in the row; or <name>_error in the row."""
    try:
        plan = make()
    except Exception as e:  # a variant missing from the bundle, a keyword the runtime does not know yet
        row[f"{name}_error"] = error_text(e)
        return None
    plans[name] = plan
    row[f"{name}_variant"] = getattr(getattr(plan, "variant", None), "name", None)
    return plan


def check_and_time(row: dict, fns_of, check_of, timer, rounds: int, u: str) -> None:
    """Run every contender once on the check inputs (fns_of(check=True): {name: fn() -> output}), compare
    (check_of(name, output) -> max abs error), drop the failures, then time the rest (fns_of(check=False))
    in interleaved rounds with timer(fn) -> one measurement."""
    import torch

    failed = set()
    for name, fn in fns_of(True).items():
        try:
            result = fn()
            torch.cuda.synchronize()
            row[f"{name}_max_abs_err"] = check_of(name, result)
        except Exception as e:  # one contender's failure (a feature FA3's build lacks) must not hide the others
            row[f"{name}_error"] = error_text(e)
            failed.add(name)
    fns = {n: fn for n, fn in fns_of(False).items() if n not in failed}
    samples = interleaved({n: (lambda fn=fn: timer(fn)) for n, fn in fns.items()}, rounds)
    for name, ts in samples.items():
        t = statistics.median(ts)
        row[f"{name}_{u}"], row[f"{name}_spread"] = t, (max(ts) - min(ts)) / t


def run_prefill(rt, fa3, sinks_param, case: Case, seed: int, rounds: int, flush) -> dict:
    """A prefill (or A/A) row: dense q/out [B, S, H_q, D], k/v [B, S, H_kv, D], causal."""
    import torch

    row = base_row(case)
    B, S, D, Hq, Hkv = case.batch, case.seqlen, case.head_dim, case.heads_q, case.heads_kv
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    bf16 = torch.bfloat16
    q = torch.randn(B, S, Hq, D, dtype=bf16, device=DEVICE, generator=gen)
    k, v = (torch.randn(B, S, Hkv, D, dtype=bf16, device=DEVICE, generator=gen) for _ in range(2))
    q_check = q if case.check_q_scale == 1.0 else (q.float() * case.check_q_scale).to(bf16)
    row["check_q_scale"] = case.check_q_scale
    sinks = torch.randn(Hq, dtype=torch.float32, device=DEVICE, generator=gen) if case.sinks else None
    timed_sinks = None if sinks is None else sinks.clone()
    check_sinks = None if sinks is None else torch.linspace(*CHECK_SINKS, Hq, device=DEVICE)
    outs = {name: torch.empty_like(q) for name in ("aotc", "aotc_plain", "aa")}
    plans: dict = {}
    feat = feature_kwargs(case, sinks)
    plan = prepare(row, plans, "aotc", lambda: rt.prepare_prefill(q, k, v, outs["aotc"], causal=True, **feat))
    family = plan.variant.family if plan is not None else "auto"
    row["family"] = family if plan is not None else None
    prepare(row, plans, "aotc_plain", lambda: rt.prepare_prefill(q, k, v, outs["aotc_plain"], causal=True,
                                                                  family=family))
    if case.kind != "aa":
        prepare(row, plans, "aa", lambda: rt.prepare_prefill(q, k, v, outs["aa"], causal=True, family=family))
    if plan is not None:
        bm, bn = _block_sizes(plan)
        row["block_m"], row["block_n"] = bm, bn
        if bm and bn and case.window_left is not None:
            row["tile_fraction"] = tile_fraction(S, bm, bn, case.window_left)
        if "aotc_plain" in plans:
            # the runtime picks the plain kernel's kv tile by length (the widest from its launch fact picked_from_seqlen_kv on), a feature
            # variant may be built at one width only: a ratio across two widths says so here
            row["plain_block_n"] = _block_sizes(plans["aotc_plain"])[1]
            row["same_block_n"] = row["plain_block_n"] == bn
    fa3_kw = None
    if fa3 is not None and case.kind != "aa":
        fa3_kw, note = fa3_kwargs(case, sinks, sinks_param)
        if note:
            row["fa3_note"] = note
    cur = torch.cuda.current_stream

    def fns_of(check: bool) -> dict:
        qx = q_check if check else q
        if sinks is not None:
            sinks.copy_(check_sinks if check else timed_sinks)  # the plans and FA3 hold this tensor
        fns = {}
        for name, p in plans.items():
            o = outs[name]
            # stream by keyword: the features may add run() parameters; lse and cu_seqlens stay 0 (dense, no LSE)
            fns[name] = (lambda p=p, o=o: (p.run(qx.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                                 stream=cur().cuda_stream), o)[1])
        if fa3 is not None and case.kind != "aa":
            if fa3_kw is not None:
                fns["fa3"] = lambda: _first(fa3.flash_attn_func(qx, k, v, causal=True, **fa3_kw))
            fns["fa3_plain"] = lambda: _first(fa3.flash_attn_func(qx, k, v, causal=True))
        return fns

    refs = {}
    checked = sorted({0, B - 1})
    positions = sample_rows(S, case.window_left)
    scale = 1.0 / math.sqrt(D)
    idx = torch.tensor(positions, device=DEVICE)
    for b in checked:
        qs = q_check[b, idx]
        plain_ref = reference(qs, k[b], v[b], positions, scale=scale)
        if case.kind == "aa":
            feat_ref = plain_ref
        else:
            feat_ref = reference(qs, k[b], v[b], positions, scale=scale, window_left=case.window_left,
                                 softcap=case.softcap, sinks=check_sinks)
        refs[b] = (feat_ref, plain_ref)
    row["feature_effect"] = max(float((f - p).abs().max()) for f, p, *_ in refs.values())
    row["checked_rows"] = len(positions) * len(checked)

    def check_of(name, out) -> float:
        with_feature = name in ("aotc", "fa3") and case.kind != "aa"
        return max(float((out[b, idx].float() - refs[b][0 if with_feature else 1]).abs().max()) for b in checked)

    check_and_time(row, fns_of, check_of, lambda fn: event_time(fn, flush)[0], rounds, "ms")
    derive(row)
    check_goals(row, case.goals)
    return row


class Pool:
    """bf16 NHD pools holding each sequence's keys in pages of PAGE tokens taken from a shuffled pool
    (benchmarks/bench_paged_varlen.py's assign_pages), the page table and seqlens_kv (int32), q/out
    [B, 1, H_q, D]."""

    def __init__(self, lengths, heads_q: int, heads_kv: int, head_dim: int, seed: int):
        import torch

        from benchmarks.bench_paged_varlen import assign_pages, page_table

        self.lengths, self.heads_kv, self.head_dim = list(lengths), heads_kv, head_dim
        n_pages, self.rows = assign_pages(self.lengths, PAGE, seed)
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        self.k, self.v = (torch.randn(n_pages, PAGE, heads_kv, head_dim, dtype=torch.bfloat16, device=DEVICE,
                                      generator=gen) for _ in range(2))
        self.pt = torch.tensor(page_table(self.rows), dtype=torch.int32, device=DEVICE)
        self.sl = torch.tensor(self.lengths, dtype=torch.int32, device=DEVICE)
        self.q = torch.randn(len(self.lengths), 1, heads_q, head_dim, dtype=torch.bfloat16, device=DEVICE,
                             generator=gen)
        self.out = torch.empty_like(self.q)

    def keys(self, b: int):
        """Sequence b's K and V [s_kv, H_kv, D], gathered through its pages."""
        import torch

        pages = torch.tensor(self.rows[b], dtype=torch.long, device=DEVICE)
        n = self.lengths[b]
        return tuple(x[pages].reshape(-1, self.heads_kv, self.head_dim)[:n] for x in (self.k, self.v))

    def dense(self):
        """K and V [B, longest, H_kv, D], zero past each length (FA3's kvcache layout)."""
        import torch

        kd = torch.zeros(len(self.lengths), max(self.lengths), self.heads_kv, self.head_dim, dtype=torch.bfloat16,
                         device=DEVICE)
        vd = torch.zeros_like(kd)
        for b, n in enumerate(self.lengths):
            kd[b, :n], vd[b, :n] = self.keys(b)
        return kd, vd


def run_decode(rt, fa3, case: Case, seed: int, rounds: int, flush) -> dict:
    """The decode row: q/out [B, 1, H_q, D] over shuffled NHD pages of 16, every sequence case.seqlen keys."""
    import torch

    row = base_row(case)
    lengths = [case.seqlen] * case.batch
    pool = Pool(lengths, case.heads_q, case.heads_kv, case.head_dim, seed)
    outs = {name: torch.empty_like(pool.out) for name in ("aotc", "aotc_plain", "aa", "plain_short")}
    # the control: the plain kernel over as many keys as the window holds (its own lengths, the same pages),
    # so the same bytes (plain_short_TBps; x_plain_short = window_TBps / plain_short_TBps)
    short = [min(n, case.window_left + 1) for n in lengths] if case.window_left is not None else None
    sl_short = None if short is None else torch.tensor(short, dtype=torch.int32, device=DEVICE)
    plans: dict = {}
    feat = feature_kwargs(case)
    args = (pool.k, pool.v)
    prepare(row, plans, "aotc", lambda: rt.prepare_decode(pool.q, *args, outs["aotc"], pool.sl, pool.pt, **feat))
    plain = prepare(row, plans, "aotc_plain", lambda: rt.prepare_decode(pool.q, *args, outs["aotc_plain"], pool.sl,
                                                                        pool.pt))
    prepare(row, plans, "aa", lambda: rt.prepare_decode(pool.q, *args, outs["aa"], pool.sl, pool.pt,
                                                        chunks=None if plain is None else plain.chunks))
    if sl_short is not None:
        prepare(row, plans, "plain_short", lambda: rt.prepare_decode(pool.q, *args, outs["plain_short"], sl_short,
                                                                     pool.pt))
    for name, p in plans.items():
        row[f"{name}_chunks"] = getattr(p, "chunks", None)
    kd = vd = None
    fa3_kw = None
    if fa3 is not None:
        fa3_kw, note = fa3_kwargs(case)
        if note:
            row["fa3_note"] = note
        kd, vd = pool.dense()
    cur = torch.cuda.current_stream  # graph_time captures on a stream of its own: launch on the current one

    def fns_of(check: bool) -> dict:
        fns = {}
        for name, p in plans.items():
            o = outs[name]
            fns[name] = (lambda p=p, o=o: (p.run(pool.q.data_ptr(), o.data_ptr(), stream=cur().cuda_stream), o)[1])
        if fa3 is not None:
            if fa3_kw is not None:
                fns["fa3"] = lambda: _first(fa3.flash_attn_with_kvcache(pool.q, kd, vd, cache_seqlens=pool.sl,
                                                                        causal=True, **fa3_kw))
            fns["fa3_plain"] = lambda: _first(fa3.flash_attn_with_kvcache(pool.q, kd, vd, cache_seqlens=pool.sl,
                                                                          causal=True))
        return fns

    checked = sorted({0, case.batch - 1})
    scale = 1.0 / math.sqrt(case.head_dim)
    refs = {}
    for b in checked:
        n = lengths[b]
        kb, vb = pool.keys(b)
        qs = pool.q[b]  # [1, H_q, D]
        m = n if short is None else short[b]
        refs[b] = (reference(qs, kb, vb, [n - 1], scale=scale, window_left=case.window_left),
                   reference(qs, kb, vb, [n - 1], scale=scale),
                   reference(qs, kb[:m], vb[:m], [m - 1], scale=scale))
    row["feature_effect"] = max(float((f - p).abs().max()) for f, p, *_ in refs.values())

    def check_of(name, out) -> float:
        which = 0 if name in ("aotc", "fa3") else 2 if name == "plain_short" else 1
        return max(float((out[b].float() - refs[b][which]).abs().max()) for b in checked)

    check_and_time(row, fns_of, check_of, lambda fn: graph_time(fn, flush), rounds, "us")
    derive(row)
    check_goals(row, case.goals)
    return row


def run_case(rt, fa3, sinks_param, case: Case, seed: int, rounds: int, flush) -> dict:
    if case.kind == "decode":
        return run_decode(rt, fa3, case, seed, rounds, flush)
    return run_prefill(rt, fa3, sinks_param, case, seed, rounds, flush)


def selected(cases, quick: bool, only) -> list[Case]:
    """The cases to run: --only substrings (any), else all but QUICK_SKIPS with --quick, else all."""
    if only:
        return [c for c in cases if any(s in c.name for s in only)]
    return [c for c in cases if not (quick and c.name in QUICK_SKIPS)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="writes DIR/features.json")
    ap.add_argument("--fa3", action="store_true", help="time FlashAttention-3 (the fa3-fwd wheel) too")
    ap.add_argument("--quick", action="store_true", help=f"2 rounds, without {', '.join(QUICK_SKIPS)}")
    ap.add_argument("--rounds", type=int, help="interleaved rounds per case (default 5; 2 with --quick)")
    ap.add_argument("--only", action="append", metavar="SUBSTRING",
                    help="only the cases whose name contains it (repeatable; overrides --quick's skips)")
    args = ap.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be at least 1")
    args.rounds = args.rounds or (2 if args.quick else 5)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    import aotc.runtime
    from benchmarks.bench_runtime import dist_version, import_fa3, result_header

    fa3 = sinks_param = None
    fa3_header: dict = {"fa3": None}
    if args.fa3:
        try:
            fa3 = import_fa3()
            flags = dict(getattr(sys.modules.get("flash_attn_config"), "CONFIG", {}).get("build_flags", {}))
            sinks_param = fa3_sinks_param(fa3.flash_attn_func)
            fa3_header = {"fa3": dist_version("fa3-fwd"), "fa3_features": fa3_features(flags, sinks_param),
                          "fa3_sinks_param": sinks_param, "fa3_build_flags": flags}
        except Exception as e:  # the aotc columns still stand
            fa3_header = {"fa3": None, "fa3_error": error_text(e)}
            fa3 = None
    rt = aotc.runtime.load(args.bundle)
    flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)
    rows = []
    for seed, case in enumerate(CASES):
        if case not in selected(CASES, args.quick, args.only):
            continue
        try:
            row = run_case(rt, fa3, sinks_param, case, seed + 1, args.rounds, flush_buf.zero_)
        except Exception as e:  # e.g. out of memory: the other cases still run
            row = base_row(case)
            row["error"] = error_text(e)
        rows.append(row)
        print(json.dumps(rounded({k: v for k, v in row.items() if k != "goals"})), flush=True)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    result = {**result_header("benchmarks/bench_features.py", sys.argv[1:] if argv is None else argv),
              **fa3_header, "bundle": args.bundle, "rounds": args.rounds, "rows": rows}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "features.json").write_text(json.dumps(result, indent=1))
    print_table(rows)


def table_lines(rows: list[dict]) -> list[str]:
    """The readable table: one line a row (times in the row's unit), then each row's errors and goals."""
    nan = float("nan")
    lines = [f"{'case':<46} {'unit':>4} {'aotc':>9} {'plain':>9} {'ratio':>6} {'x aa':>6} {'fa3':>9} "
             f"{'x fa3':>6} {'err':>8} {'effect':>8} {'goal':>5}"]
    for r in rows:
        u = unit(r["kind"])
        g = lambda k, r=r: r.get(k) if isinstance(r.get(k), (int, float)) else nan  # noqa: E731
        met = {True: "met", False: "MISS", None: "-"}[r.get("goal_met")]
        lines.append(f"{r['case']:<46} {u:>4} {g('aotc_' + u):>9.3f} {g('aotc_plain_' + u):>9.3f} "
                     f"{g('ratio'):>6.3f} {g('x_aa'):>6.3f} {g('fa3_' + u):>9.3f} {g('x_fa3'):>6.3f} "
                     f"{g('aotc_max_abs_err'):>8.1e} {g('feature_effect'):>8.1e} {met:>5}")
        if r["kind"] == "decode":
            lines.append(f"{'':<46} TB/s window {g('window_TBps'):.2f}  plain {g('plain_TBps'):.2f}  "
                         f"bw_ratio {g('bw_ratio'):.3f}")
    for r in rows:
        for k, v in r.items():
            if k == "error" or k.endswith("_error") or k == "fa3_note":
                lines.append(f"{r['case']}: {k}: {v}")
        for goal in r.get("goals", ()):
            value = "unmeasured" if goal["value"] is None else f"{goal['value']:.3f}"
            verdict = {True: "met", False: "MISSED", None: "-"}[goal["met"]]
            lines.append(f"{r['case']}: goal {goal['goal']}: {goal['field']} = {value} (bound {goal['bound']}) "
                         f"{verdict}")
    return lines


def print_table(rows: list[dict]) -> None:
    print("\n".join(table_lines(rows)))


if __name__ == "__main__":
    main()
