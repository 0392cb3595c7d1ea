"""`aotc build`: cold and warm builds, offline mode, failure isolation, many processes on one cache."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from aotc.build.builder import build
from aotc.storage.cache import Cache
from aotc.cli import main
from aotc.build.spec import load_spec
from aotc.common import config
from aotc.build.compile import cache_key
from aotc.common.errors import MissingArtifactsError
from conftest import PYTHON, REPO, aotc_env, lock_held_elsewhere, patch_compile_processes, run_aotc

pytest.importorskip("cutlass")


def test_cold_then_warm_default_spec(cache_dir):
    names = [v.name for v in load_spec().variants]
    n = len(names)
    cold = run_aotc("build", "-j", "2", "--json", timeout=1800)
    assert cold.returncode == 0, cold.stderr
    report = json.loads(cold.stdout)
    assert report["counts"] == {"compiled": n, "hit": 0, "bypassed": 0, "failed": 0}
    assert [v["name"] for v in report["variants"]] == names
    assert all(len(v["key"]) == 64 and v["compile_seconds"] > 0 for v in report["variants"])

    t0 = time.perf_counter()
    warm = run_aotc("build", "--json")
    wall = time.perf_counter() - t0
    assert warm.returncode == 0, warm.stderr
    report2 = json.loads(warm.stdout)
    assert report2["counts"] == {"compiled": 0, "hit": n, "bypassed": 0, "failed": 0}
    assert [v["key"] for v in report2["variants"]] == [v["key"] for v in report["variants"]]
    assert wall < 3.0, f"a fully cached build of the default spec took {wall:.2f} s"

    stats = Cache().stats()
    assert (stats["compiles"], stats["hits"], stats["misses"], stats["invalid"]) == (n, n, n, 0)
    assert len(Cache().keys()) == n
    assert Cache().verify() == []


def test_offline_on_empty_cache_names_every_missing_variant(cache_dir, capsys):
    names = [v.name for v in load_spec().variants]
    assert main(["build", "--offline", "--json"]) == 5
    err = capsys.readouterr().err
    assert f"{len(names)} variant(s) missing" in err
    for n in names:
        assert n in err
    assert "hint:" in err and "aotc build" in err
    assert Cache().stats()["compiles"] == 0
    assert Cache().keys() == []


def test_no_compile_env_on_empty_cache(cache_dir, tiny_spec, monkeypatch):
    monkeypatch.setenv("AOTC_NO_COMPILE", "1")
    r = run_aotc("build", str(tiny_spec), "-j", "2")
    assert r.returncode == 5
    for v in load_spec(tiny_spec).variants:
        assert v.name in r.stderr
    assert f"hint: build them on a machine with the compile extra: aotc build {tiny_spec} -j 2" in r.stderr
    assert not (cache_dir / "v1" / "entries").exists()


def test_offline_names_only_the_missing(cache_dir, tiny_spec, tmp_path, capsys):
    half = tmp_path / "half.toml"
    half.write_text(tiny_spec.read_text().replace('dtype = ["bf16", "fp16"]', 'dtype = "bf16"'))
    assert main(["build", str(half), "--json"]) == 0
    capsys.readouterr()
    assert main(["build", str(tiny_spec), "--offline"]) == 5
    err = capsys.readouterr().err
    error = err[err.index("error:"):]
    assert "2 variant(s) missing" in error
    assert "dtype=fp16.head_dim=64" in error and "dtype=fp16.head_dim=128" in error
    assert "dtype=bf16" not in error
    # once the rest is built, offline succeeds
    assert main(["build", str(tiny_spec), "--json"]) == 0
    capsys.readouterr()
    assert main(["build", str(tiny_spec), "--offline", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["hit"] == 4


@pytest.fixture
def one_variant_breaks(monkeypatch, tiny_spec, tmp_path):
    """Make the kernel module raise for one variant of the tiny spec (in the compile processes, where the
    compiles run); returns (spec, broken variant)."""
    variants = load_spec(tiny_spec).variants
    broken = variants[1]
    patch_compile_processes(monkeypatch, tmp_path, f"""
        from aotc.families import get_family
        module = get_family("sdpa_combine").compile_module()
        real = module.compile
        def compile(variant, **kw):
            if variant.name == {broken.name!r}:
                raise RuntimeError("synthetic DSL failure")
            return real(variant, **kw)
        module.compile = compile
        """)
    return tiny_spec, broken


def test_one_failing_variant_does_not_stop_the_others(cache_dir, one_variant_breaks):
    spec, broken = one_variant_breaks
    variants = load_spec(spec).variants
    seen = []
    report = build(variants, cache=Cache(), jobs=1, progress=seen.append)
    assert [r.variant for r in report.results] == list(variants)
    assert {r.variant: r.status for r in report.results} == {
        v: ("failed" if v == broken else "compiled") for v in variants}
    (failed,) = report.failed
    assert broken.name in failed.error and "RuntimeError: synthetic DSL failure" in failed.error
    assert len(seen) == 4
    assert [a.variant for a in report.artifacts] == [v for v in variants if v != broken]
    assert report.to_json()["counts"] == {"hit": 0, "compiled": 3, "bypassed": 0, "failed": 1}
    stats = Cache().stats()
    assert stats["compiles"] == 3 and stats["invalid"] == 0
    assert len(Cache().keys()) == 3


def test_one_failing_variant_cli_exit_code(cache_dir, one_variant_breaks, capsys):
    spec, broken = one_variant_breaks
    assert main(["build", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"FAILED {broken.name}: compiling {broken.name} failed" in err
    assert err.count("compiled") == 3
    # the next build compiles only what is still missing
    assert main(["build", str(spec), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"hit": 3, "compiled": 0, "bypassed": 0, "failed": 1}


def test_a_crash_outside_aotc_errors_is_one_variants_failure(cache_dir, tiny_spec, monkeypatch, tmp_path):
    variants = load_spec(tiny_spec).variants
    patch_compile_processes(monkeypatch, tmp_path, f"""
        import aotc.build.executors as ex
        def compile_variant(v, key=None):
            raise MemoryError("boom") if v.name == {variants[0].name!r} else KeyError("oops")
        ex.compile_variant = compile_variant
        """)
    report = build(variants, cache=Cache(), jobs=1)
    assert [r.status for r in report.results] == ["failed"] * 4
    assert "MemoryError: boom" in report.results[0].error
    assert "KeyError" in report.results[1].error


def test_concurrent_builds_compile_each_variant_once(cache_dir, tiny_spec):
    n = 8
    procs = [subprocess.Popen([PYTHON, "-m", "aotc", "build", str(tiny_spec), "-j", "1", "--json"], cwd=REPO,
                              env=aotc_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    compiled = sum(o["counts"]["compiled"] for o in outs)
    assert compiled == 4
    for o in outs:
        assert o["counts"]["failed"] == 0
        assert o["counts"]["compiled"] + o["counts"]["hit"] == 4
    c = Cache()
    stats = c.stats()
    assert stats["compiles"] == 4
    assert stats["invalid"] == 0
    assert stats["hits"] + stats["misses"] >= n * 4
    assert len(c.keys()) == 4
    assert c.verify(repair=False) == []
    assert not (c.root / "quarantine").exists()
    for key in c.keys():
        assert c.load(key, count=False) is not None


def test_offline_api_flag(cache_dir, tiny_spec):
    variants = load_spec(tiny_spec).variants
    with pytest.raises(MissingArtifactsError) as ei:
        build(variants, cache=Cache(), offline=True, build_command="make build")
    assert ei.value.names == [v.name for v in variants]
    assert ei.value.exit_code == 5 and ei.value.hint.endswith("make build")
    assert Cache().stats()["compiles"] == 0


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("YES", True), (" on ", True),
                                      ("0", False), ("", False), ("no", False), ("false", False)])
def test_no_compile_flag_values(monkeypatch, value, on):
    monkeypatch.setenv("AOTC_NO_COMPILE", value)
    assert config.no_compile() is on


def test_lock_timeout_fails_only_that_variant(cache_dir, tiny_spec, monkeypatch, capsys):
    variants = load_spec(tiny_spec).variants
    stuck = variants[2]
    monkeypatch.setenv("AOTC_LOCK_TIMEOUT", "0.5")
    c = Cache()
    with lock_held_elsewhere(c.lock_path(cache_key(stuck))):
        assert main(["build", str(tiny_spec)]) == 1
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1
    assert failed[0].startswith(f"FAILED {stuck.name}: timed out after 0.5 s")
    assert str(c.lock_path(cache_key(stuck))) in failed[0]
    assert len(c.keys()) == 3 and cache_key(stuck) not in c.keys()
