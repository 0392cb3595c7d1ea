"""benchmarks/bench_features.py's pure-Python parts, without a GPU: the work a window leaves, K/V bytes of a
windowed decode, the cases and their goals, a row's rates, ratios and goal verdicts, the FA3 keywords and
what the wheel serves, the fp32 reference (on the CPU, against a per-element loop), and the table."""
from __future__ import annotations

import math
import subprocess

import pytest

from benchmarks.bench_features import (CASES, QUICK_SKIPS, Case, Goal, base_row, check_goals, derive, fa3_features,
                                       fa3_kwargs, fa3_sinks_param, feature_kwargs, keys_seen, kv_bytes, parse_args,
                                       prefill_flops, sample_rows, selected, table_lines, tile_fraction, tile_pairs,
                                       unit, visible_pairs)
from conftest import PYTHON, REPO

BY_NAME = {c.name: c for c in CASES}
# fa3-fwd 0.0.3's fa3_fwd_config.CONFIG["build_flags"] (the wheel in .whl/), the entries that matter here
FA3_003_FLAGS = {"FLASHATTENTION_DISABLE_BACKWARD": True, "FLASHATTENTION_DISABLE_PAGEDKV": True,
                 "FLASHATTENTION_DISABLE_LOCAL": True, "FLASHATTENTION_DISABLE_SOFTCAP": False}


def _seen(p, j, s_kv, w):
    return 0 <= j < s_kv and j <= p and (w is None or j >= p - w)


@pytest.mark.parametrize("w", [None, 0, 1, 3, 7, 20])
def test_visible_pairs_count_every_pair(w):
    for s_q in range(0, 10):
        for s_kv in range(0, 10):
            want = sum(1 for i in range(s_q) for j in range(s_kv) if _seen(i + s_kv - s_q, j, s_kv, w))
            assert visible_pairs(s_q, s_kv, w) == want, (s_q, s_kv, w)
    assert keys_seen(100, 1000, 4) == 5 and keys_seen(2, 1000, 4) == 3 and keys_seen(-1, 10) == 0


def test_window_4096_over_16384_is_0_44_of_causal():
    causal = 16384 * 16385 // 2
    windowed = 4097 * 4098 // 2 + (16384 - 4097) * 4097  # rows 0..4096 see p + 1 keys, the others 4097
    assert visible_pairs(16384, 16384) == causal and visible_pairs(16384, 16384, 4096) == windowed
    case = BY_NAME["prefill_d128_s16384_causal_wl4096"]
    row = base_row(case)
    assert row["plain_flops"] == 4 * 128 * 16 * causal and row["flops"] == 4 * 128 * 16 * windowed
    assert row["work_fraction"] == pytest.approx(0.4376, abs=1e-4)
    assert prefill_flops(case) == row["plain_flops"]


def test_tile_pairs_visit_every_block_with_a_visible_pair():
    for s in (1, 5, 16, 23):
        for bm, bn in ((4, 4), (4, 8), (8, 4), (3, 5)):
            for w in (None, 0, 2, 6, 30):
                want = sum(1 for q0 in range(0, s, bm) for n0 in range(0, s, bn)
                           if any(_seen(p, j, s, w) for p in range(q0, min(q0 + bm, s))
                                  for j in range(n0, min(n0 + bn, s))))
                assert tile_pairs(s, bm, bn, w) == want, (s, bm, bn, w)
    assert 0.44 < tile_fraction(16384, 128, 176, 4096) < 0.47


def test_decode_bytes_inside_the_window():
    assert kv_bytes([32768] * 16, 8, 128) == 2 * 16 * 32768 * 8 * 128 * 2
    assert kv_bytes([32768] * 16, 8, 128, 4096) == 2 * 16 * 4097 * 8 * 128 * 2
    assert kv_bytes([100, 5000], 1, 64, 4096, elem_bytes=1) == 2 * (100 + 4097) * 64
    row = base_row(BY_NAME["decode_paged16_d128_b16x32768_gqa32x8_wl4096"])
    assert row["kv_bytes"] == kv_bytes([32768] * 16, 8, 128, 4096)
    assert row["plain_kv_bytes"] == kv_bytes([32768] * 16, 8, 128)
    assert (row["S_q"], row["s_kv"], row["page"], row["window_keys"]) == (1, 32768, 16, 4097)


def test_cases_are_the_ones_asked_for():
    assert len(BY_NAME) == len(CASES) and set(QUICK_SKIPS) <= set(BY_NAME)
    w = BY_NAME["prefill_d128_s16384_causal_wl4096"]
    assert (w.kind, w.head_dim, w.batch, w.seqlen, w.heads_q, w.window_left) == ("prefill", 128, 1, 16384, 16, 4096)
    assert w.goals == (Goal("ratio", "<=", 0.55, w.goals[0].text),)
    for d in (256, 128):
        c = BY_NAME[f"prefill_d{d}_s8192_causal_softcap50"]
        assert (c.batch, c.seqlen, c.heads_q, c.softcap, c.window_left, c.sinks) == (2, 8192, 16, 50.0, None, False)
        assert [(g.field, g.op, g.bound) for g in c.goals] == [("ratio", "<=", 1.10), ("x_fa3", ">=", 1.0)]
    s = BY_NAME["prefill_d64_s8192_gqa64x8_causal_sinks"]
    assert (s.head_dim, s.heads_q, s.heads_kv, s.seqlen, s.sinks, s.window_left) == (64, 64, 8, 8192, True, None)
    assert [(g.field, g.op, g.bound) for g in s.goals] == [("ratio", "<=", 1.03)]
    gpt_oss = BY_NAME["prefill_d64_s8192_gqa64x8_causal_wl127_sinks"]
    assert gpt_oss.sinks and gpt_oss.window_left == 127 and gpt_oss.goals == ()  # 128 keys: information
    d = BY_NAME["decode_paged16_d128_b16x32768_gqa32x8_wl4096"]
    assert (d.kind, d.head_dim, d.batch, d.seqlen, d.heads_q, d.heads_kv, d.window_left) == (
        "decode", 128, 16, 32768, 32, 8, 4096)
    assert [(g.field, g.op, g.bound) for g in d.goals] == [("bw_ratio", ">=", 0.9)]
    aa = [c for c in CASES if c.kind == "aa"]
    assert len(aa) == 1 and feature_kwargs(aa[0], sinks=object()) == {}
    assert all(c.kind != "prefill" or c.seqlen % 128 == 0 for c in CASES)


def test_the_decode_case_fits_bench_decode_varlens_pool():
    from benchmarks import bench_decode_varlen as dv

    d = BY_NAME["decode_paged16_d128_b16x32768_gqa32x8_wl4096"]
    assert (d.head_dim, d.heads_q, d.heads_kv) == (dv.D, dv.H_Q, dv.H_KV) and dv.PAGE == 16


def test_feature_keywords():
    sinks = object()
    assert feature_kwargs(BY_NAME["prefill_d128_s16384_causal_wl4096"]) == {"window_left": 4096}
    assert feature_kwargs(BY_NAME["prefill_d256_s8192_causal_softcap50"]) == {"softcap": 50.0}
    assert feature_kwargs(BY_NAME["prefill_d64_s8192_gqa64x8_causal_wl127_sinks"], sinks) == {
        "window_left": 127, "sinks": sinks}


def test_fa3_keywords_and_what_the_wheel_serves():
    assert fa3_kwargs(BY_NAME["prefill_d128_s16384_causal_wl4096"]) == ({"window_size": (4096, 0)}, None)
    assert fa3_kwargs(BY_NAME["prefill_d128_s8192_causal_softcap50"]) == ({"softcap": 50.0}, None)
    kw, why = fa3_kwargs(BY_NAME["prefill_d64_s8192_gqa64x8_causal_sinks"], sinks="S")
    assert kw is None and "sinks" in why
    assert fa3_kwargs(BY_NAME["prefill_d64_s8192_gqa64x8_causal_sinks"], "S", "learnable_sink") == (
        {"learnable_sink": "S"}, None)
    assert fa3_kwargs(BY_NAME["aa_prefill_d64_s8192_gqa64x8_causal"])[0] is None

    def fa3_003(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
        pass

    def with_sinks(q, k, v, causal=False, s_aux=None):
        pass

    assert fa3_sinks_param(fa3_003) is None and fa3_sinks_param(with_sinks) == "s_aux"
    assert fa3_sinks_param(object()) is None  # no signature: no sinks, no exception
    assert fa3_features(FA3_003_FLAGS, None) == {"window": False, "softcap": True, "sinks": False,
                                                  "paged_kv": False}
    assert fa3_features({}, "sinks") == {"window": True, "softcap": True, "sinks": True, "paged_kv": True}


def test_derive_prefill_rates_and_ratios():
    row = {"kind": "prefill", "flops": 4e12, "plain_flops": 8e12, "aotc_ms": 5.0, "aotc_plain_ms": 10.0,
           "aa_ms": 10.1, "fa3_ms": 6.0, "fa3_plain_ms": 9.0, "aotc_spread": 0.01}
    derive(row)
    assert row["ratio"] == pytest.approx(0.5) and row["x_aa"] == pytest.approx(1.01)
    assert row["x_fa3"] == pytest.approx(1.2) and row["fa3_ratio"] == pytest.approx(6 / 9)
    assert row["x_fa3_plain"] == pytest.approx(0.9)
    assert row["aotc_tflops"] == pytest.approx(800.0) and row["aotc_plain_tflops"] == pytest.approx(800.0)
    assert row["fa3_plain_tflops"] == pytest.approx(8e12 / 9e9) and row["fa3_tflops"] == pytest.approx(4e12 / 6e9)
    row = {"kind": "prefill", "flops": 1, "plain_flops": 1, "aotc_plain_ms": 2.0, "aotc_error": "KeyError: x"}
    derive(row)  # no feature time: no ratio
    assert "ratio" not in row and "x_fa3" not in row and row["aotc_plain_tflops"] == pytest.approx(5e-10)


def test_derive_decode_bandwidth_on_the_bytes_needed():
    row = {"kind": "decode", "kv_bytes": 1e9, "plain_kv_bytes": 8e9, "aotc_us": 300.0, "aotc_plain_us": 2000.0,
           "aa_us": 1990.0, "fa3_plain_us": 2100.0}
    derive(row)
    assert row["window_TBps"] == pytest.approx(1e9 / 300e-6 / 1e12)
    assert row["plain_TBps"] == pytest.approx(4.0) and row["fa3_plain_TBps"] == pytest.approx(8 / 2.1)
    assert row["bw_ratio"] == pytest.approx(row["window_TBps"] / 4.0)
    assert row["speedup"] == pytest.approx(2000 / 300) and row["ratio"] == pytest.approx(0.15)
    assert row["x_aa"] == pytest.approx(0.995) and "fa3_TBps" not in row and "aotc_tflops" not in row


def test_derive_aa_row():
    row = base_row(BY_NAME["aa_prefill_d64_s8192_gqa64x8_causal"])
    row.update(aotc_ms=1.0, aotc_plain_ms=1.01)
    derive(row)
    check_goals(row, BY_NAME["aa_prefill_d64_s8192_gqa64x8_causal"].goals)
    assert row["ratio"] == pytest.approx(1 / 1.01) and row["goal_met"] is True
    assert row["aotc_tflops"] == pytest.approx(row["plain_flops"] / 1e9)
    row["aotc_ms"] = 1.1
    derive(row)
    check_goals(row, BY_NAME["aa_prefill_d64_s8192_gqa64x8_causal"].goals)
    assert row["goal_met"] is False and [g["met"] for g in row["goals"]] == [True, False]


def test_goal_verdicts():
    goals = (Goal("ratio", "<=", 1.10, "a"), Goal("x_fa3", ">=", 1.0, "b"))
    row = {"ratio": 1.05, "x_fa3": 1.2}
    check_goals(row, goals)
    assert row["goal_met"] is True
    assert row["goals"] == [{"goal": "a", "field": "ratio", "value": 1.05, "bound": 1.10, "met": True},
                            {"goal": "b", "field": "x_fa3", "value": 1.2, "bound": 1.0, "met": True}]
    row = {"ratio": 1.05}  # no FA3 column: unmeasured, not failed
    check_goals(row, goals)
    assert row["goal_met"] is None and row["goals"][1]["met"] is None and row["goals"][1]["value"] is None
    row = {"ratio": 1.2}  # a failed goal outweighs an unmeasured one
    check_goals(row, goals)
    assert row["goal_met"] is False
    row = {"ratio": float("nan"), "x_fa3": 1.0}
    check_goals(row, goals)
    assert row["goal_met"] is None and row["goals"][1]["met"] is True  # the bound itself is met
    row = {}
    check_goals(row, ())
    assert row == {"goals": [], "goal_met": None}


def test_base_row_records_the_case_and_unmeasured_goals():
    for case in CASES:
        row = base_row(case)
        assert row["case"] == case.name and row["kind"] == case.kind and row["dtype"] == "bf16"
        assert row["goal_met"] is None and [g["goal"] for g in row["goals"]] == [g.text for g in case.goals]
        assert all(g["met"] is None for g in row["goals"])
        assert unit(case.kind) == ("us" if case.kind == "decode" else "ms")
    assert base_row(BY_NAME["prefill_d64_s8192_gqa64x8_causal_sinks"])["work_fraction"] == 1.0


def test_sample_rows():
    rows = sample_rows(16384, 4096)
    assert rows == sorted(set(rows)) and rows[0] == 0 and rows[-1] == 16383
    assert {0, 63, 8160, 8223, 16256, 4064, 4127} <= set(rows) and 4128 not in rows
    assert len(sample_rows(8192)) == 256
    assert sample_rows(10) == list(range(10))
    assert sample_rows(1, 4096) == [0]


def test_selection_and_arguments():
    assert selected(CASES, False, None) == list(CASES)
    assert all(c.name not in QUICK_SKIPS for c in selected(CASES, True, None))
    assert [c.name for c in selected(CASES, True, ["softcap50"])] == [
        "prefill_d256_s8192_causal_softcap50", "prefill_d128_s8192_causal_softcap50"]
    a = parse_args([])
    assert (a.rounds, a.fa3, a.quick, a.only) == (5, False, False, None) and a.bundle.endswith("default.aotc")
    a = parse_args(["--quick", "--fa3", "--bundle", "B", "--out", "D", "--only", "decode", "--only", "aa"])
    assert (a.rounds, a.fa3, a.bundle, a.out, a.only) == (2, True, "B", "D", ["decode", "aa"])
    assert parse_args(["--quick", "--rounds", "7"]).rounds == 7
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])


def test_table_shows_errors_and_goals():
    ok = base_row(BY_NAME["prefill_d128_s16384_causal_wl4096"])
    ok.update(aotc_ms=1.0, aotc_plain_ms=2.0, fa3_error="RuntimeError: This flash attention build does not "
                                                        "support local attention.")
    derive(ok)
    check_goals(ok, BY_NAME["prefill_d128_s16384_causal_wl4096"].goals)
    dec = base_row(BY_NAME["decode_paged16_d128_b16x32768_gqa32x8_wl4096"])
    dec.update(aotc_error="ArgumentError: no loaded sdpa_decode kernel fits", aotc_plain_us=500.0)
    derive(dec)
    failed = base_row(BY_NAME["prefill_d64_s8192_gqa64x8_causal_sinks"])
    failed["error"] = "OutOfMemoryError: CUDA out of memory"
    text = "\n".join(table_lines([ok, dec, failed]))
    assert "prefill_d128_s16384_causal_wl4096" in text and "met" in text
    assert "does not support local attention" in text and "no loaded sdpa_decode kernel" in text
    assert "OutOfMemoryError" in text and "unmeasured" in text


def _naive(q, k, v, positions, scale, w=None, cap=None, sinks=None):
    """Per-element fp64 attention: the definition, one (row, head) at a time."""
    r, hq, d = q.shape
    hkv = k.shape[1]
    out = [[[0.0] * d for _ in range(hq)] for _ in range(r)]
    for i, p in enumerate(positions):
        for h in range(hq):
            g = h // (hq // hkv)
            logits = {}
            for j in range(k.shape[0]):
                if j <= p and (w is None or j >= p - w):
                    s = scale * sum(float(q[i, h, x]) * float(k[j, g, x]) for x in range(d))
                    logits[j] = cap * math.tanh(s / cap) if cap else s
            m = max(list(logits.values()) + ([float(sinks[h])] if sinks is not None else []), default=0.0)
            den = sum(math.exp(s - m) for s in logits.values()) + (
                math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
            for x in range(d):
                out[i][h][x] = sum(math.exp(s - m) * float(v[j, g, x]) for j, s in logits.items()) / den if den else 0.0
    return out


@pytest.mark.parametrize("w, cap, with_sinks", [(None, None, False), (3, None, False), (None, 2.0, False),
                                                (None, None, True), (2, 1.5, True)])
def test_reference_is_the_definition(w, cap, with_sinks):
    torch = pytest.importorskip("torch")
    from benchmarks.bench_features import reference

    gen = torch.Generator().manual_seed(0)
    s_kv, hq, hkv, d = 9, 4, 2, 8
    q = torch.randn(5, hq, d, generator=gen) * 2
    k, v = torch.randn(s_kv, hkv, d, generator=gen), torch.randn(s_kv, hkv, d, generator=gen)
    sinks = torch.tensor([0.0, 3.0, -2.0, 8.0]) if with_sinks else None
    positions = [0, 1, 4, 7, 8]
    got = reference(q, k, v, positions, scale=0.5, window_left=w, softcap=cap, sinks=sinks)
    want = torch.tensor(_naive(q, k, v, positions, 0.5, w, cap, sinks), dtype=torch.float32)
    assert got.shape == (5, hq, d)
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())


def test_reference_of_a_row_that_sees_nothing_is_zero():
    torch = pytest.importorskip("torch")
    from benchmarks.bench_features import reference

    q, k, v = torch.ones(1, 2, 4), torch.ones(3, 1, 4), torch.ones(3, 1, 4)
    assert torch.equal(reference(q, k, v, [-1], scale=1.0), torch.zeros(1, 2, 4))
    assert torch.equal(reference(q, k, v, [-1], scale=1.0, sinks=torch.tensor([1.0, 2.0])), torch.zeros(1, 2, 4))


def test_the_benchmark_imports_without_torch_and_explains_itself():
    code = ("import sys; sys.path.insert(0, %r); import benchmarks.bench_features as b; "
            "assert 'torch' not in sys.modules, 'torch imported'; b.main(['--help'])" % str(REPO))
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    for option in ("--bundle", "--fa3", "--out", "--quick", "--rounds", "--only"):
        assert option in r.stdout


def test_a_case_is_a_plain_record():
    c = Case("x", "prefill", 64, 1, 128, 2, 1)
    assert (c.window_left, c.softcap, c.sinks, c.goals, c.check_q_scale) == (None, None, False, (), 1.0)


# ---- the whole program on the CPU: a fake runtime and a fake FA3 that compute with reference() ------------
def _at(ptr: int, like):
    """The tensor shaped like `like` at address ptr (CPU memory): what a fake kernel reads and writes."""
    import ctypes

    import torch

    buf = (ctypes.c_char * (like.numel() * like.element_size())).from_address(ptr)
    return torch.frombuffer(buf, dtype=like.dtype).view(like.shape)


class _Clock:
    """The fake timer's reading: the cost of the contender that ran last."""
    last = 0.0


class _Variant:
    def __init__(self, family, **fields):
        self.family, self.fields = family, fields
        self.name = ".".join([family] + [f"{k}={v}" for k, v in sorted(fields.items())])

    def get(self, name, default=None):
        return self.fields.get(name, default)


class _PrefillPlan:
    def __init__(self, q, k, v, out, features, cost):
        from types import SimpleNamespace

        self.q, self.k, self.v, self.out, self.features, self.cost = q, k, v, out, features, cost
        self.variant = _Variant("sdpa_prefill_sm90", block_n=16, **{f: True for f in features})
        self.kernel = SimpleNamespace(artifact=SimpleNamespace(launch=SimpleNamespace(extra={"block_m": 16})))

    def run(self, q, k, v, out, lse=0, cu_q=0, cu_k=0, stream=0):
        from benchmarks.bench_features import reference

        qt, kt, vt, ot = (_at(p, x) for p, x in ((q, self.q), (k, self.k), (v, self.v), (out, self.out)))
        for b in range(qt.shape[0]):
            ot[b] = reference(qt[b], kt[b], vt[b], range(qt.shape[1]), scale=qt.shape[-1] ** -0.5,
                              **self.features).to(ot.dtype)
        _Clock.last = self.cost


class _DecodePlan:
    def __init__(self, q, k, v, out, sl, pt, chunks, features):
        self.q, self.k, self.v, self.out, self.sl, self.pt = q, k, v, out, sl, pt
        self.chunks, self.features = chunks or 7, features
        self.variant = _Variant("sdpa_decode", kv="paged16", **{f: True for f in features})

    def run(self, q, out, lse=0, seqlens_kv=0, page_table=0, stream=0):
        from benchmarks.bench_features import reference

        qt, ot = _at(q, self.q), _at(out, self.out)
        hkv, d = self.k.shape[2], self.k.shape[3]
        for b in range(qt.shape[0]):
            n = int(self.sl[b])
            pages = self.pt[b, :-(-n // 16)].long()
            kb, vb = (x[pages].reshape(-1, hkv, d)[:n] for x in (self.k, self.v))
            ot[b] = reference(qt[b], kb, vb, [n - 1], scale=d ** -0.5, **self.features).to(ot.dtype)
        _Clock.last = 100.0 if "window_left" in self.features else 400.0


class _Runtime:
    """prepare_prefill / prepare_decode as the runtime's, with no soft-cap kernel in its 'bundle'."""

    def prepare_prefill(self, q, k, v, out, lse=None, *, causal=False, softmax_scale=None, family="auto",
                        window_left=None, softcap=None, sinks=None):
        assert causal and family in ("auto", "sdpa_prefill_sm90")
        if softcap is not None:
            raise RuntimeError("no loaded sdpa_prefill_sm90 kernel fits {'softcap': True}")
        features = {k_: x for k_, x in (("window_left", window_left), ("sinks", sinks)) if x is not None}
        return _PrefillPlan(q, k, v, out, features, 0.5 if window_left is not None else 1.0)

    def prepare_decode(self, q, k_cache, v_cache, out, seqlens_kv, page_table=None, lse=None, *, chunks=None,
                       window_left=None, softcap=None, sinks=None):
        features = {} if window_left is None else {"window_left": window_left}
        return _DecodePlan(q, k_cache, v_cache, out, seqlens_kv, page_table, chunks, features)


class _FA3:
    """fa3-fwd 0.0.3's two entry points as far as the benchmark uses them: no local attention, no sinks."""

    @staticmethod
    def _attend(q, k, v, lengths, causal, window_size, softcap):
        import torch

        from benchmarks.bench_features import reference

        assert causal
        if tuple(window_size) != (-1, -1):
            raise RuntimeError("This flash attention build does not support local attention.")
        out = torch.empty_like(q)
        for b in range(q.shape[0]):
            n, s_q = lengths[b], q.shape[1]
            out[b] = reference(q[b], k[b, :n], v[b, :n], range(n - s_q, n), scale=q.shape[-1] ** -0.5,
                               softcap=softcap or None).to(q.dtype)
        _Clock.last = 1.25
        return out

    def flash_attn_func(self, q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
        return self._attend(q, k, v, [k.shape[1]] * q.shape[0], causal, window_size, softcap)

    def flash_attn_with_kvcache(self, q, k_cache, v_cache, cache_seqlens=None, causal=False, window_size=(-1, -1),
                                softcap=0.0):
        return self._attend(q, k_cache, v_cache, [int(n) for n in cache_seqlens], causal, window_size, softcap)


TINY = (
    Case("t_window", "prefill", 16, 2, 64, 4, 2, window_left=8, goals=(Goal("ratio", "<=", 0.55, "w"),)),
    Case("t_softcap", "prefill", 16, 1, 48, 4, 4, softcap=5.0, check_q_scale=8.0,
         goals=(Goal("ratio", "<=", 1.10, "c"), Goal("x_fa3", ">=", 1.0, "f"))),
    Case("t_sinks", "prefill", 16, 2, 48, 8, 2, sinks=True, goals=(Goal("ratio", "<=", 1.03, "s"),)),
    Case("t_decode", "decode", 16, 3, 40, 4, 2, window_left=9, goals=(Goal("bw_ratio", ">=", 0.9, "d"),)),
    Case("t_aa", "aa", 16, 1, 32, 4, 2, goals=(Goal("ratio", ">=", 0.98, "a"), Goal("ratio", "<=", 1.02, "b"))),
)


def test_the_whole_program_on_a_fake_runtime(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    import json
    import sys
    from types import SimpleNamespace

    import aotc.runtime
    import benchmarks.bench_features as bf
    import benchmarks.bench_runtime as br

    monkeypatch.setattr(bf, "DEVICE", "cpu")
    monkeypatch.setattr(bf, "CASES", TINY)
    monkeypatch.setattr(bf, "FLUSH_BYTES", 1 << 10)
    monkeypatch.setattr(bf, "event_time", lambda fn, flush: (fn(), (_Clock.last, 0.0))[1])
    monkeypatch.setattr(bf, "graph_time", lambda fn, flush: (fn(), _Clock.last)[1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(aotc.runtime, "load", lambda path: _Runtime())
    monkeypatch.setattr(br, "import_fa3", lambda: _FA3())
    monkeypatch.setitem(sys.modules, "flash_attn_config", SimpleNamespace(CONFIG={"build_flags": FA3_003_FLAGS}))
    monkeypatch.setattr(br, "result_header", lambda script, args: {
        "date": "D", "gpu": "G", "git_commit": "C", "command": " ".join(["python", script, *args])})
    bf.main(["--bundle", "B.aotc", "--fa3", "--out", str(tmp_path), "--rounds", "2"])

    result = json.loads((tmp_path / "features.json").read_text())
    assert result["command"] == f"python benchmarks/bench_features.py --bundle B.aotc --fa3 --out {tmp_path} --rounds 2"
    assert result["fa3_features"] == {"window": False, "softcap": True, "sinks": False, "paged_kv": False}
    assert result["rounds"] == 2 and result["git_commit"] == "C"
    rows = {r["case"]: r for r in result["rows"]}
    assert list(rows) == [c.name for c in TINY]

    w = rows["t_window"]
    assert w["aotc_max_abs_err"] < 0.02 < w["feature_effect"] and w["aotc_plain_max_abs_err"] < 0.02
    assert w["aa_max_abs_err"] < 0.02 and w["fa3_plain_max_abs_err"] < 0.02
    assert "local attention" in w["fa3_error"] and "fa3_ms" not in w and w["fa3_plain_ms"] == 1.25
    assert (w["aotc_ms"], w["aotc_plain_ms"], w["ratio"], w["x_aa"]) == (0.5, 1.0, 0.5, 1.0)
    assert w["goal_met"] is True and w["goals"][0]["value"] == 0.5
    assert w["block_m"] == 16 and w["block_n"] == 16 and 0 < w["tile_fraction"] <= 1
    assert w["plain_block_n"] == 16 and w["same_block_n"] is True
    assert w["aotc_variant"].startswith("sdpa_prefill_sm90") and w["family"] == "sdpa_prefill_sm90"

    c = rows["t_softcap"]  # the bundle lacks the kernel: an error string, the others still timed
    assert "no loaded sdpa_prefill_sm90 kernel" in c["aotc_error"] and "aotc_ms" not in c and c["family"] is None
    assert c["aotc_plain_ms"] == 1.0 and c["fa3_ms"] == 1.25 and c["fa3_max_abs_err"] < 0.05
    assert c["feature_effect"] > 0.05  # the check's scaled q reaches the cap
    assert c["goal_met"] is None and [g["met"] for g in c["goals"]] == [None, None]

    s = rows["t_sinks"]  # the check's sinks were in the tensor the plan holds when it ran, the timed ones after
    assert s["aotc_max_abs_err"] < 0.02 < s["feature_effect"]
    assert "sinks" in s["fa3_note"] and "fa3_ms" not in s and "fa3_plain_ms" in s
    assert s["ratio"] == 1.0 and s["goal_met"] is True

    d = rows["t_decode"]
    assert d["aotc_max_abs_err"] < 0.02 < d["feature_effect"] and "local attention" in d["fa3_error"]
    assert (d["aotc_us"], d["aotc_plain_us"], d["aa_chunks"]) == (100.0, 400.0, d["aotc_plain_chunks"])
    assert d["window_TBps"] == pytest.approx(kv_bytes([40] * 3, 2, 16, 9) / 100e-6 / 1e12)
    assert d["bw_ratio"] == pytest.approx((10 / 40) * 4) and d["goal_met"] is True
    # the control: the plain kernel over the window's keys (the same bytes), checked against its own reference
    assert d["plain_short_max_abs_err"] < 0.02 and d["plain_short_TBps"] == pytest.approx(d["kv_bytes"] / 400e-6 / 1e12)
    assert d["x_plain_short"] == pytest.approx(d["window_TBps"] / d["plain_short_TBps"])

    a = rows["t_aa"]
    assert a["feature_effect"] == 0 and a["ratio"] == 1.0 and a["goal_met"] is True
    assert not any(k.startswith(("fa3", "aa_")) for k in a)

    out = capsys.readouterr().out
    assert all(name in out for name in rows) and "MISS" not in out and "does not support local attention" in out
