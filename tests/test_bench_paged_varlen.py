"""benchmarks/bench_paged_varlen.py's pure-Python parts, without a GPU: the FLOPs the causal mask leaves
visible, K/V bytes, the cases, the shuffled page assignment and page table, and the rates and ratios of a row."""
from __future__ import annotations

import subprocess

import pytest

from benchmarks import bench_paged_varlen
from benchmarks.bench_paged_varlen import (CASES, CHUNK, MODELS, QUICK_SKIPS, assign_pages, attention_flops,
                                           cu_seqlens, derive, kv_bytes, page_table, visible_keys)
from conftest import PYTHON, REPO


def _counted(s_q, s_kv, causal, window_left=None):
    """Every (row, key) pair looked at: row i (position p = i + s_kv - s_q) sees key j iff j < s_kv and (not
    causal or j <= p) and (no window or p - window_left <= j)."""
    return sum(1 for i in range(s_q) for j in range(s_kv)
               if (not causal or j <= i + s_kv - s_q) and (window_left is None or i + s_kv - s_q - window_left <= j))


def _keys_read(s_q, s_kv, window_left):
    """Keys some row of the sequence sees (each read once), counted key by key."""
    rows = range(s_kv - min(s_q, s_kv), s_kv)  # the positions p of the rows that see any key
    return sum(1 for j in range(s_kv) if any(p - window_left <= j <= p for p in rows))


@pytest.mark.parametrize("causal", [True, False])
def test_visible_keys_counts_every_row(causal):
    for s_q in range(0, 12):
        for s_kv in range(0, 12):
            assert visible_keys(s_q, s_kv, causal) == _counted(s_q, s_kv, causal), (s_q, s_kv)
    assert visible_keys(300, 70, causal) == _counted(300, 70, causal)  # rows that see no key


@pytest.mark.parametrize("window_left", [0, 1, 3, 7, 30])
def test_visible_keys_within_a_window_counts_every_row(window_left):
    for s_q in range(0, 12):
        for s_kv in range(s_q, 14):
            assert visible_keys(s_q, s_kv, True, window_left) == _counted(s_q, s_kv, True, window_left), (s_q, s_kv)
            read = kv_bytes([(s_q, s_kv)], heads_kv=1, head_dim=1, elem_bytes=1, window_left=window_left) // 2
            # (a sequence without rows counts all its keys, window or not: kv_bytes' convention, as below)
            assert read == (_keys_read(s_q, s_kv, window_left) if s_q else s_kv), (s_q, s_kv)
    # gpt-oss's window: a decode row reads its last 128 keys; a 2048-token chunk over 8192 more reads 2048 + 127
    assert kv_bytes([(1, 4096)], heads_kv=1, head_dim=1, elem_bytes=1, window_left=127) == 2 * 128
    assert kv_bytes([(2048, 10240)], heads_kv=1, head_dim=1, elem_bytes=1, window_left=127) == 2 * 2175
    assert visible_keys(1, 4096, True, 127) == 128


def test_models_are_the_shapes_the_docstring_names():
    assert {m: (x.head_dim, x.heads_q, x.heads_kv, x.window_left, x.sinks, x.softcap) for m, x in MODELS.items()} == {
        "llama": (128, 32, 8, None, False, None), "gpt-oss": (64, 64, 8, None, True, None),
        "gpt-oss-sliding": (64, 64, 8, 127, True, None), "gemma2-27b": (128, 32, 16, None, False, 50.0)}
    for name in MODELS:  # each model is named in the docstring, the way --model takes it
        assert name in bench_paged_varlen.__doc__


def test_chunk_flops_are_the_prefix_plus_the_triangle():
    for prefix in (0, 1, 8192, 30720):
        visible = CHUNK * prefix + CHUNK * (CHUNK + 1) // 2
        assert attention_flops([(CHUNK, prefix + CHUNK)]) == 4 * 128 * 32 * visible
    assert attention_flops([(1, 4096)] * 64) == 4 * 128 * 32 * 64 * 4096  # a decode row sees every key
    assert attention_flops([(0, 50), (4, 0)]) == 0
    assert attention_flops([(10, 20)], heads_q=2, head_dim=64, causal=False) == 4 * 64 * 2 * 200


def test_kv_bytes_read_each_key_and_value_once():
    assert kv_bytes([(1, 4096)] * 64) == 2 * 64 * 4096 * 8 * 128 * 2
    assert kv_bytes([(2048, 2048), (0, 10)], heads_kv=1, head_dim=64, elem_bytes=1) == 2 * 2058 * 64


def test_cases_are_the_ones_the_results_describe():
    by_name = {c.name: c for c in CASES}
    assert len(by_name) == len(CASES)
    for prefix in (0, 8192, 30720):
        c = by_name[f"chunk2048_prefix{prefix}"]
        assert (c.kind, c.seqs) == ("chunk", ((2048, prefix + 2048),))
    mixed = by_name["mixed_chunk2048_decode63x4096"]
    assert mixed.kind == "mixed" and mixed.seqs[0] == (2048, 2048) and mixed.seqs[1:] == ((1, 4096),) * 63
    decode = by_name["decode_b64_4096"]
    assert decode.kind == "decode" and decode.seqs == ((1, 4096),) * 64
    assert all(s_kv >= s_q for c in CASES for s_q, s_kv in c.seqs)  # the KV length includes the new tokens
    assert set(QUICK_SKIPS) <= set(by_name)


def test_cu_seqlens():
    assert cu_seqlens([]) == [0]
    assert cu_seqlens([3, 0, 5]) == [0, 3, 3, 8]
    assert cu_seqlens(n for n in (1, 1)) == [0, 1, 2]


def test_assign_pages_gives_each_sequence_its_own_shuffled_pages():
    lengths = [1, 16, 17, 0, 4096, 30000]
    n_pages, rows = assign_pages(lengths, 16, seed=3, extra=5)
    assert [len(r) for r in rows] == [1, 1, 2, 0, 256, 1875]
    assert n_pages == sum(len(r) for r in rows) + 5
    flat = [p for r in rows for p in r]
    assert len(set(flat)) == len(flat) and all(0 <= p < n_pages for p in flat)
    assert flat != sorted(flat)  # a permutation of the pool, not its order
    assert assign_pages(lengths, 16, seed=3, extra=5) == (n_pages, rows)  # reproducible
    assert assign_pages(lengths, 16, seed=4, extra=5)[1] != rows
    assert assign_pages([0, 0], 16, seed=0) == (1, [[], []])  # a pool of at least one page


def test_page_table_pads_every_row_to_one_width():
    assert page_table([[3, 1], [], [7]]) == [[3, 1], [0, 0], [7, 0]]
    assert page_table([[], []]) == [[0], [0]]
    assert page_table([[2]], width=3, pad=-1) == [[2, -1, -1]]


def test_derive_rates_and_ratios():
    row = {"flops": 4e12, "kv_bytes": 8e9, "aotc_us": 1000.0, "aa_us": 1010.0, "fa3_us": 1500.0, "dense_us": 800.0}
    derive(row, "chunk")
    assert row["aotc_tflops"] == pytest.approx(4000.0) and row["fa3_tflops"] == pytest.approx(4000 / 1.5)
    assert row["x_fa3"] == pytest.approx(1.5) and row["x_dense"] == pytest.approx(0.8)
    assert row["x_aa"] == pytest.approx(1.01) and "x_aotc" not in row
    row = {"flops": 1, "kv_bytes": 2e9, "aotc_us": 500.0, "decode_us": 600.0}
    derive(row, "decode")
    assert row["aotc_TBps"] == pytest.approx(4.0) and row["x_decode"] == pytest.approx(1.2)
    assert "aotc_tflops" not in row
    row = {"flops": 1, "kv_bytes": 1, "fa3_us": 3.0}
    derive(row, "mixed")  # aotc missing (its error is in the row): no ratios, no rates
    assert row == {"flops": 1, "kv_bytes": 1, "fa3_us": 3.0}


def test_the_benchmark_imports_without_torch_and_explains_itself():
    code = ("import sys; sys.path.insert(0, %r); import benchmarks.bench_paged_varlen as b; "
            "assert 'torch' not in sys.modules, 'torch imported'; b.main(['--help'])" % str(REPO))
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    for option in ("--bundle", "--fa3", "--out", "--quick", "--model", "gpt-oss-sliding"):
        assert option in r.stdout


def test_time_plans_gives_each_contender_its_runtime_caches_and_bounds(monkeypatch):
    """The probes' A/B helper without a GPU: torch, the timing and the reference stand in; each contender's plan
    gets its own runtime, the pool's caches unless it names others, max_seqlen_q from the pool and its own
    keywords, writes its own out, and its median comes back under its name."""
    import sys
    import types

    import benchmarks.bench_paged_varlen as bench

    calls = []
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=lambda: "stream", synchronize=lambda: None),
                                  full_like=lambda x, v: {"like": x, "fill": v})
    monkeypatch.setitem(sys.modules, "torch", torch)

    class Plan:
        def __init__(self, rt, out, kw):
            self.rt, self.out, self.prefill_family = rt, out, rt + "_family"
            self.variant = types.SimpleNamespace(name=rt + "_variant")
            calls.append(("prepare", rt, kw))

        def __call__(self, q, out, stream):
            calls.append(("run", self.rt, out is self.out, stream))

    class Rt:
        def __init__(self, name):
            self.name = name

        def prepare_attention(self, q, k, v, out, cu, sl, pt, **kw):
            return Plan(self.name, out, {"k": k, "v": v, **kw})

    pool = types.SimpleNamespace(k="K", v="V", q="Q", out="O", cu="CU", sl="SL", pt="PT", max_q=7)
    a, b = Rt("a"), Rt("b")
    us = {"a": 2.0, "b": 3.0}
    monkeypatch.setattr(bench, "max_abs_err", lambda pool, out: 0.5)
    monkeypatch.setattr(bench, "graph_time", lambda fn, flush: (fn(), us[calls[-1][1]])[1])  # the plan that ran
    fields, med = bench.time_plans(pool, {"one": (a, {"max_seqlen_kv": 9}), "two": (b, {"k": "K8", "v": "V8"})},
                                   flush=None, rounds=3)
    assert ("prepare", "a", {"k": "K", "v": "V", "max_seqlen_q": 7, "max_seqlen_kv": 9}) in calls
    assert ("prepare", "b", {"k": "K8", "v": "V8", "max_seqlen_q": 7}) in calls
    assert ("run", "a", True, "stream") in calls and ("run", "b", True, "stream") in calls
    assert med == {"one": 2.0, "two": 3.0}
    assert fields["one_variant"] == "a_variant" and fields["two_family"] == "b_family"
    assert fields["one_max_abs_err"] == 0.5 and fields["two_us"] == 3.0 and fields["one_spread"] == 0.0
