"""benchmarks/probes/cycles_ab.py needs no GPU to check how it reads ncu's report and what it runs."""
from __future__ import annotations

import argparse

import pytest

from benchmarks.probes.cycles_ab import ACTIVE, CYCLES, TENSOR, ncu_command, parse_metrics, parse_shape

# two launches as ncu 2025 printed them on the H200 (kernel names shortened)
REPORT = """==PROF== Connected to process 671 (/usr/bin/python3.12)
==PROF== Profiling "device_kernel": 0%....50%....100% - 1 pass
done
[671] python3.12@127.0.0.1
  void device_kernel<...>(Params) (132, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    ---------------------------------------------------------------------- ----------- ------------
    Metric Name                                                            Metric Unit Metric Value
    ---------------------------------------------------------------------- ----------- ------------
    sm__cycles_elapsed.avg                                                       cycle 2,464,916.85
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active           %        87.15
    smsp__inst_executed.sum                                                       inst  468,102,779
    ---------------------------------------------------------------------- ----------- ------------

  void device_kernel<...>(Params) (132, 1, 1)x(384, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    ---------------------------------------------------------------------- ----------- ------------
    Metric Name                                                            Metric Unit Metric Value
    ---------------------------------------------------------------------- ----------- ------------
    sm__cycles_elapsed.avg                                                       cycle 2,458,506.35
    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active           %        87.26
    smsp__inst_executed.sum                                                       inst  468,107,002
    ---------------------------------------------------------------------- ----------- ------------
"""


def test_parse_metrics_reads_every_launch_in_order():
    values = parse_metrics(REPORT)
    assert values[CYCLES] == [2464916.85, 2458506.35]
    assert values[TENSOR] == [87.15, 87.26]
    assert values["smsp__inst_executed.sum"] == [468102779.0, 468107002.0]
    assert parse_metrics("==PROF== No kernels were profiled.\n") == {}


def test_shapes_are_checked():
    assert parse_shape("128:16384:1") == (128, 16384, True, 16, 0)
    assert parse_shape("256:4096:0") == (256, 4096, False, 16, 0)
    assert parse_shape("128:2048:1:33") == (128, 2048, True, 33, 0)
    assert parse_shape("128:8192:1:16:50") == (128, 8192, True, 16, 50)
    for bad in ("128:16384", "128:16384:2", "96:4096:0", "128:3000:1", "a:b:c", "128:2048:1:0", "128:2048:1:x",
                "128:2048:1:33:x", "128:2048:1:33:50:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--shape"):
            parse_shape(bad)


def test_ncu_command_profiles_the_contenders_kernel_at_base_clocks():
    aotc = ncu_command((128, 8192, False, 16, 0), fa3=False, launches=2)
    fa3 = ncu_command((128, 8192, False, 33, 0), fa3=True, launches=3)
    capped = ncu_command((256, 8192, True, 16, 50), fa3=True, launches=2)
    assert aotc[:3] == ["ncu", "--clock-control", "base"]
    assert aotc[aotc.index("--kernel-name") + 1] == "regex:sdpa_prefill"
    assert fa3[fa3.index("--kernel-name") + 1] == "regex:device_kernel"
    assert fa3[fa3.index("--launch-count") + 1] == "3"
    assert aotc[-6:] == ["prefill", "128", "8192", "0", "0", "16"]  # no soft-cap, 16 heads
    assert fa3[-6:] == ["prefill-fa3", "128", "8192", "0", "0", "33"]
    assert capped[-6:] == ["prefill-fa3", "256", "8192", "1", "50", "16"]  # soft-cap 50


def test_ncu_command_profiles_aotc_at_the_layout_asked_for_and_fa3_dense():
    ragged = ncu_command((128, 8192, False, 16, 0), fa3=False, launches=2, layout="ragged")
    paged = ncu_command((128, 2048, True, 16, 50), fa3=False, launches=2, layout="paged16")
    fa3 = ncu_command((128, 2048, True, 16, 0), fa3=True, launches=2, layout="paged16")
    assert ragged[-6:] == ["prefill-ragged", "128", "8192", "0", "0", "16"]
    assert paged[-6:] == ["prefill-paged16", "128", "2048", "1", "50", "16"]
    assert paged[paged.index("--kernel-name") + 1] == "regex:sdpa_prefill"  # the paged prefill kernel, not decode
    assert fa3[-6:] == ["prefill-fa3", "128", "2048", "1", "0", "16"]
    with pytest.raises(KeyError):
        ncu_command((128, 2048, True, 16, 0), fa3=False, launches=2, layout="paged32")


def test_ncu_command_asks_for_the_sm_active_cycles_and_any_extra_metric():
    plain = ncu_command((256, 4096, True, 16, 0), fa3=False, launches=2)
    extra = ncu_command((256, 4096, True, 16, 0), fa3=False, launches=2, extra=("smsp__inst_executed.sum",))
    assert plain[plain.index("--metrics") + 1].split(",") == [CYCLES, TENSOR, ACTIVE]
    assert extra[extra.index("--metrics") + 1].split(",") == [CYCLES, TENSOR, ACTIVE, "smsp__inst_executed.sum"]


def test_profile_reports_the_sm_active_share_and_the_extra_metrics(monkeypatch):
    import subprocess

    from benchmarks.probes import cycles_ab

    def launch(elapsed, active, inst):  # one launch's metric lines, as ncu prints them (the columns need not align)
        return (f"    {CYCLES}    cycle {elapsed}\n    {TENSOR}    % 87.15\n    {ACTIVE}    cycle {active}\n"
                f"    smsp__inst_executed.sum    inst {inst}\n")

    report = launch("2,464,916.85", "2,218,425.17", "468,102,779") + launch("2,458,506.35", "2,458,506.35", "468,107,002")
    monkeypatch.setattr(cycles_ab.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=report, stderr=""))
    got = cycles_ab.profile((128, 8192, True, 16, 0), "x.aotc", 2, ("smsp__inst_executed.sum",))
    assert got["sm_cycles"] == [2464916.85, 2458506.35]
    assert got["sm_active_pct"] == [90.0, 100.0]
    assert got["metrics"] == {"smsp__inst_executed.sum": [468102779.0, 468107002.0]}
    assert "metrics" not in cycles_ab.profile((128, 8192, True, 16, 0), "x.aotc", 2)


def test_paged_layout_refuses_a_non_causal_shape_before_profiling(monkeypatch, capsys):
    import sys

    from benchmarks.probes import cycles_ab

    def no_profile(*args, **kwargs):
        raise AssertionError("profiled a shape the paged entry point has no kernel for")

    monkeypatch.setattr(cycles_ab, "profile", no_profile)
    monkeypatch.setattr(sys, "argv", ["cycles_ab.py", "--bundle", "a.aotc", "--layout", "paged16",
                                      "--shape", "128:8192:1", "--shape", "128:8192:0"])
    with pytest.raises(SystemExit) as e:
        cycles_ab.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--layout paged16" in err and "causal 1" in err and "128:8192:0" in err and "128:8192:1" not in err
