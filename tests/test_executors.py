"""Compiles on an executor: a Dask LocalCluster (real worker processes), and the executor path of build()."""
from __future__ import annotations

import concurrent.futures as cf
import json
import sys
from pathlib import Path

import pytest

from aotc.build.builder import build
from aotc.storage.bundle import read_bundle
from aotc.storage.cache import Cache
from aotc.cli import main
from aotc.build.compile import cache_key
from aotc.build.spec import load_spec
from aotc.common.variant import Variant

THREE_SPEC = """\
# 3 sdpa_combine variants for sm_90a
[[family]]
name = "sdpa_combine"
arch = ["sm_90a"]
dtype = ["bf16", "fp16", "fp32"]
head_dim = 64
strides = "general"
"""

# a variant the kernel module cannot compile (no int8 output): fails fast, before any DSL work
BROKEN = Variant.make("sdpa_combine", "sm_90a", dtype="int8", head_dim=64, strides="general")


@pytest.fixture
def three_spec(tmp_path) -> Path:
    p = tmp_path / "three.toml"
    p.write_text(THREE_SPEC)
    return p


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """LocalCluster(n_workers=2, threads_per_worker=1, processes=True) whose workers have their own cache."""
    pytest.importorskip("cutlass")
    distributed = pytest.importorskip("distributed")
    worker_cache = tmp_path_factory.mktemp("worker-cache")
    with pytest.MonkeyPatch.context() as mp:  # the workers' environment is fixed when they start
        mp.setenv("AOTC_CACHE_DIR", str(worker_cache))
        mp.setenv("CUTE_DSL_NO_CACHE", "1")
        for name in ("AOTC_LOCK_DIR", "AOTC_NO_COMPILE", "AOTC_LOCK_TIMEOUT"):
            mp.delenv(name, raising=False)
        c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = distributed.Client(c)
    try:
        yield c, client, worker_cache
    finally:
        client.close()
        c.close()


# ---- the distributed executor on a local cluster ---------------------------------------------------
def test_cli_builds_a_spec_on_a_running_cluster(cluster, three_spec, tmp_path, cache_dir, capsys):
    """--scheduler ADDRESS: workers fill their own cache and send the kernels back to this one."""
    c, client, worker_cache = cluster
    out = tmp_path / "three.aotc"
    assert main(["build", str(three_spec), "--executor", "dask", "--scheduler", c.scheduler_address,
                 "--bundle", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["executor"] == "dask"
    assert report["counts"] == {"hit": 0, "compiled": 3, "bypassed": 0, "failed": 0}
    variants = load_spec(three_spec).variants
    keys = sorted(cache_key(v) for v in variants)
    assert sorted(Cache().keys()) == keys  # the client's cache got every kernel
    assert set(keys) <= set(Cache(worker_cache).keys())  # compiled (and kept) on the workers
    assert Cache().verify(repair=False) == []
    b = read_bundle(out)
    assert sorted(a.variant for a in b.artifacts) == sorted(variants)
    worker = Cache(worker_cache)
    for a in b.artifacts:
        assert a.sha256 == worker.load(a.key, count=False).sha256
    # a second build is all hits in the client's cache: nothing is sent to the cluster
    assert main(["build", str(three_spec), "--executor", "dask", "--scheduler", c.scheduler_address, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"hit": 3, "compiled": 0, "bypassed": 0, "failed": 0}


def test_one_failing_variant_on_the_cluster_does_not_stop_the_others(cluster, three_spec, cache_dir):
    """shared_cache: the workers fill this process's cache root and lock directory directly."""
    _, client, worker_cache = cluster
    variants = list(load_spec(three_spec).variants)[:2]
    seen = []
    report = build([variants[0], BROKEN, variants[1]], cache=Cache(), executor=client.get_executor(pure=False),
                   shared_cache=True, progress=seen.append)
    assert [r.status for r in report.results] == ["compiled", "failed", "compiled"]
    assert BROKEN.name in report.results[1].error
    assert len(seen) == 3
    assert [a.variant for a in report.artifacts] == variants
    assert sorted(Cache().keys()) == sorted(cache_key(v) for v in variants)
    assert Cache().stats()["compiles"] == 2  # counted by the workers, in this cache


def test_cli_scheduler_local_starts_and_stops_its_own_cluster(three_spec, cache_dir, capsys):
    pytest.importorskip("cutlass")
    pytest.importorskip("distributed")
    assert main(["build", str(three_spec), "--executor", "dask", "--scheduler", "local", "-j", "2"]) == 0
    cap = capsys.readouterr()
    assert "executor: dask LocalCluster (2 workers)" in cap.err
    assert "3 variants in" in cap.out and "3 compiled" in cap.out
    assert len(Cache().keys()) == 3


# ---- usage errors ---------------------------------------------------------------------------------
def test_scheduler_without_dask_executor_is_a_usage_error(three_spec, capsys):
    assert main(["build", str(three_spec), "--scheduler", "local"]) == 2
    assert "--scheduler applies only to --executor dask" in capsys.readouterr().err
    assert main(["build", str(three_spec), "--executor", "ray"]) == 2


def test_dask_missing_is_a_clear_error(three_spec, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    assert main(["build", str(three_spec), "--executor", "dask"]) == 2
    cap = capsys.readouterr()
    assert "--executor dask needs Dask distributed" in cap.err and "aotc[dask]" in cap.err


# ---- build()'s executor path without a cluster (any concurrent.futures executor) --------------------
def _elsewhere(root: Path, tamper: bool = False, raise_for: Variant | None = None):
    """A compile_task that runs on "another machine": its own cache root, optionally lying about the bytes."""
    from aotc.build import executors

    real = executors.compile_task

    def task(variant_json, key, _root, _lock_dir, _timeout):
        if raise_for is not None and Variant.from_json(variant_json) == raise_for:
            raise OSError("worker lost")
        out = real(variant_json, key, str(root / "v1"), None, None)
        if tamper and out["cubin"]:
            out["cubin"] = out["cubin"][:-1] + bytes([out["cubin"][-1] ^ 1])
        return out

    return task


def test_remote_artifacts_are_committed_to_the_local_cache(three_spec, tmp_path, cache_dir, monkeypatch):
    pytest.importorskip("cutlass")
    from aotc.build import executors

    variants = list(load_spec(three_spec).variants)
    monkeypatch.setattr(executors, "compile_task", _elsewhere(tmp_path / "remote", raise_for=variants[2]))
    with cf.ThreadPoolExecutor(2) as pool:
        report = build(variants, cache=Cache(), executor=pool, shared_cache=False)
    assert [r.status for r in report.results] == ["compiled", "compiled", "failed"]
    assert "executor task failed: OSError: worker lost" in report.results[2].error
    assert sorted(Cache().keys()) == sorted(cache_key(v) for v in variants[:2])
    assert sorted(Cache(tmp_path / "remote").keys()) == sorted(Cache().keys())
    assert Cache().verify(repair=False) == []


def test_remote_artifacts_with_wrong_bytes_are_refused(three_spec, tmp_path, cache_dir, monkeypatch):
    pytest.importorskip("cutlass")
    from aotc.build import executors

    v = load_spec(three_spec).variants[0]
    monkeypatch.setattr(executors, "compile_task", _elsewhere(tmp_path / "remote", tamper=True))
    with cf.ThreadPoolExecutor(1) as pool:
        (r,) = build([v], cache=Cache(), executor=pool, shared_cache=False).results
    assert r.status == "failed" and "sha256" in r.error
    assert Cache().keys() == []


def test_a_worker_with_other_versions_refuses_the_task(cache_dir):
    from aotc.build.executors import compile_task

    v = Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=64, strides="general")
    out = compile_task(v.to_json(), "0" * 64, None, None, None)
    assert out["status"] == "failed" and out["cubin"] is None
    assert "computes cache key" in out["error"] and "differ from the client's" in out["error"]
    assert not (cache_dir / "v1" / "entries").exists()
