"""Hostile concurrency on one cache: many builders, readers racing eviction and rebuilds, lock timeouts
seen from the CLI, and lock files on another filesystem than the cache.

Every builder here is a real ``python -m aotc`` process (or one process calling the CLI in a loop), so
the locks under test are flock locks between processes, not threads of one interpreter.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from aotc.storage.cache import Cache
from aotc.build.compile import cache_key
from aotc.build.spec import load_spec
from aotc.common.variant import Variant
from conftest import HAVE_DSL, PYTHON, REPO, aotc_env, lock_held_elsewhere, run_aotc

needs_dsl = pytest.mark.skipif(not HAVE_DSL, reason="needs nvidia-cutlass-dsl to compile")


def spawn(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "aotc", *args], cwd=REPO, env=aotc_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def reference(cache: Cache, spec: Path) -> dict[str, tuple]:
    """key -> (variant, sha256 of its cubin) for every variant of spec, all present and verified in cache."""
    out = {}
    for v in load_spec(spec).variants:
        key = cache_key(v)
        art = cache.load(key, v, count=False)
        assert art is not None, f"{v.name} missing after the build"
        assert hashlib.sha256(art.cubin).hexdigest() == art.sha256
        out[key] = (v, art.sha256)
    return out


# ---- (a) 16 builders, one cold cache --------------------------------------

@needs_dsl
@pytest.mark.slow
def test_sixteen_processes_build_one_cold_cache_compiling_each_variant_once(cache_dir, tiny_spec):
    n = 16
    procs = [spawn("build", str(tiny_spec), "-j", "1", "--json") for _ in range(n)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    variants = load_spec(tiny_spec).variants
    assert len(variants) == 4
    assert sum(r["counts"]["compiled"] for r in reports) == 4
    for r in reports:
        assert r["counts"]["failed"] == 0 and r["counts"]["compiled"] + r["counts"]["hit"] == 4
    # each variant was compiled by exactly one process, and every process got the same key for it
    for i, v in enumerate(variants):
        rows = [r["variants"][i] for r in reports]
        assert {row["name"] for row in rows} == {v.name}
        assert {row["key"] for row in rows} == {cache_key(v)}
        assert sum(row["status"] == "compiled" for row in rows) == 1
    c = Cache()
    stats = c.stats()
    assert stats["compiles"] == 4 and stats["invalid"] == 0 and stats["bypassed"] == 0
    assert stats["hits"] + stats["misses"] >= n * 4
    assert sorted(c.keys()) == sorted(cache_key(v) for v in variants)
    assert c.verify(repair=False) == []
    assert not (c.root / "quarantine").exists()
    reference(c, tiny_spec)
    # one lock file per key, nothing else, and none of them is still held
    import filelock

    locks = sorted(p.name for p in c.lock_dir.iterdir())
    assert locks == sorted(f"{cache_key(v)}.lock" for v in variants)
    for name in locks:
        lk = filelock.FileLock(str(c.lock_dir / name), timeout=0)
        lk.acquire()
        lk.release()
    # no temporary file was left behind in any entry
    assert not [p for p in c.entries_dir.rglob(".*tmp-*")]


# ---- (b) readers while another process evicts and rebuilds -----------------

CHURN = textwrap.dedent("""
    import sys, time
    from aotc.cli import main
    spec, rounds, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    for i in range(rounds):
        assert main(["cache", "gc", "--max-bytes", "0"]) == 0
        time.sleep(0.05)                       # an empty cache for a moment
        assert main(["build", spec, "-j", "1"]) == 0
        open(marker, "a").write(f"{i}\\n")
    """)


@needs_dsl
@pytest.mark.slow
def test_readers_never_see_a_bad_artifact_while_another_process_evicts_and_rebuilds(cache_dir, tiny_spec, tmp_path):
    import aotc.runtime
    from aotc.common.errors import RuntimeLoadError

    assert run_aotc("build", str(tiny_spec), "-j", "1").returncode == 0
    ref = reference(Cache(), tiny_spec)
    rounds = 4
    marker = tmp_path / "rounds"
    churner = subprocess.Popen([PYTHON, "-c", CHURN, str(tiny_spec), str(rounds), str(marker)], cwd=REPO,
                               env=aotc_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()
    tally = {"loads": 0, "hits": 0, "misses": 0, "runtime_loads": 0, "runtime_empty": 0}
    failures: list[str] = []
    guard = threading.Lock()

    def note(**d):
        with guard:
            for k, v in d.items():
                tally[k] += v

    def cache_reader():
        c = Cache()
        while not stop.is_set():
            for key, (v, sha) in ref.items():
                try:
                    art = c.load(key, v)
                except Exception as e:  # never: a reader gets an artifact or None
                    failures.append(f"Cache.load raised {type(e).__name__}: {e}")
                    return
                if art is None:
                    note(loads=1, misses=1)
                    continue
                if art.variant != v or art.sha256 != sha or hashlib.sha256(art.cubin).hexdigest() != sha:
                    failures.append(f"served a mismatched artifact for {v.name}")
                    return
                note(loads=1, hits=1)

    def runtime_reader():
        while not stop.is_set():
            try:
                rt = aotc.runtime.load(cache=True)
            except RuntimeLoadError as e:  # every entry evicted at this moment: the documented error
                if "no kernels to load" not in str(e):
                    failures.append(f"runtime.load: unexpected {e}")
                    return
                note(runtime_empty=1)
                time.sleep(0.01)
                continue
            except Exception as e:
                failures.append(f"runtime.load raised {type(e).__name__}: {e}")
                return
            for k in rt.kernels.get("sdpa_combine", []):
                a = k.artifact
                if ref.get(a.key) != (a.variant, a.sha256) or hashlib.sha256(a.cubin).hexdigest() != a.sha256:
                    failures.append(f"runtime.load served a mismatched artifact {a.variant.name}")
                    return
            note(runtime_loads=1)
            time.sleep(0.01)

    threads = [threading.Thread(target=cache_reader) for _ in range(3)] + [threading.Thread(target=runtime_reader)]
    for t in threads:
        t.start()
    try:
        _, err = churner.communicate(timeout=240)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        if churner.poll() is None:
            churner.kill()
            churner.wait()
    assert churner.returncode == 0, err
    assert marker.read_text().split() == [str(i) for i in range(rounds)]
    assert not failures, failures[:5]
    print(f"\nreaders vs gc+rebuild ({rounds} rounds): {tally}")
    # the race was really run: readers saw entries come and go
    assert tally["hits"] > 0 and tally["misses"] > 0 and tally["runtime_loads"] > 0
    c = Cache()
    assert c.stats()["invalid"] == 0  # a reader racing an eviction never mistakes it for corruption
    assert not (c.root / "quarantine").exists()
    assert c.verify(repair=False) == []
    assert reference(c, tiny_spec) == ref  # the last rebuild left every entry in place and identical


def test_reader_quarantine_does_not_wait_for_a_writer(cache_dir, fake_artifact):
    """A reader that finds a bad entry while another process holds its lock returns None at once."""
    c = Cache(lock_timeout=30)
    art = fake_artifact("busy")
    with c.locked(art.key):
        c.commit(art)
    (c.entry_dir(art.key) / "kernel.cubin").write_bytes(b"torn")
    with lock_held_elsewhere(c.lock_path(art.key)):
        t0 = time.monotonic()
        assert c.load(art.key, art.variant) is None
        assert time.monotonic() - t0 < 5
        assert c.entry_dir(art.key).exists()  # left for the lock holder (or the next use) to repair
    assert c.load(art.key, art.variant) is None  # lock free now: quarantined
    assert not c.entry_dir(art.key).exists() and c.stats()["invalid"] == 1


# ---- (c) lock timeouts through the CLI --------------------------------------

def _commit(c: Cache, art) -> None:
    with c.locked(art.key):
        c.commit(art)


def test_cli_gc_lock_timeout_exits_6_naming_the_lock(cache_dir, fake_artifact):
    c = Cache()
    art = fake_artifact("gc-locked")
    _commit(c, art)
    with lock_held_elsewhere(c.lock_path(art.key)):
        t0 = time.monotonic()
        r = run_aotc("cache", "gc", "--max-bytes", "0", AOTC_LOCK_TIMEOUT="1")
        waited = time.monotonic() - t0
    assert r.returncode == 6, r.stderr
    assert "timed out after 1 s" in r.stderr and str(c.lock_path(art.key)) in r.stderr
    assert "hint:" in r.stderr and "AOTC_LOCK_TIMEOUT" in r.stderr
    assert "Traceback" not in r.stderr
    assert waited < 30
    assert c.load(art.key) == art  # nothing was removed half-way
    assert run_aotc("cache", "gc", "--max-bytes", "0", AOTC_LOCK_TIMEOUT="1").returncode == 0
    assert c.keys() == []


def test_cli_verify_lock_timeout_exits_6_instead_of_claiming_a_quarantine(cache_dir, fake_artifact):
    c = Cache()
    art = fake_artifact("verify-locked")
    _commit(c, art)
    (c.entry_dir(art.key) / "kernel.cubin").write_bytes(b"truncated")
    with lock_held_elsewhere(c.lock_path(art.key)):
        r = run_aotc("cache", "verify", AOTC_LOCK_TIMEOUT="1")
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert str(c.lock_path(art.key)) in r.stderr and "(quarantined)" not in r.stderr
    assert c.entry_dir(art.key).exists()
    r = run_aotc("cache", "verify", AOTC_LOCK_TIMEOUT="1")
    assert r.returncode == 1 and "(quarantined)" in r.stderr
    assert not c.entry_dir(art.key).exists()


def test_verify_repair_skips_an_entry_another_process_finished_meanwhile(cache_dir, fake_artifact, monkeypatch):
    """A partial entry that is a commit in progress is not a problem once the commit is done."""
    c = Cache()
    art = fake_artifact("in-progress")
    _commit(c, art)
    (c.entry_dir(art.key) / "meta.json").unlink()
    real = Cache._quarantine_locked

    def writer_finished_first(self, key, reason, variant=None):
        self.commit(art)  # the other process's commit lands before we got the lock
        return real(self, key, reason, variant)

    monkeypatch.setattr(Cache, "_quarantine_locked", writer_finished_first)
    assert c.verify() == []
    assert c.load(art.key) == art


@needs_dsl
def test_cli_install_lock_timeout_exits_6(cache_dir, fake_artifact, tmp_path):
    from aotc.storage.bundle import write_bundle

    v = Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="packed")
    art = fake_artifact("install", variant=v, key=cache_key(v))
    bundle = tmp_path / "one.aotc"
    write_bundle(bundle, [art])
    c = Cache()
    with lock_held_elsewhere(c.lock_path(art.key)):
        r = run_aotc("bundle", "install", str(bundle), AOTC_LOCK_TIMEOUT="1")
    assert r.returncode == 6, r.stderr
    assert str(c.lock_path(art.key)) in r.stderr and v.name in r.stderr
    assert c.keys() == []
    r = run_aotc("bundle", "install", str(bundle), AOTC_LOCK_TIMEOUT="1")
    assert r.returncode == 0, r.stderr
    assert c.load(art.key, v) == art


@needs_dsl
def test_cli_build_lock_timeout_fails_that_variant_naming_the_lock(cache_dir, tiny_spec):
    variants = load_spec(tiny_spec).variants
    stuck = variants[1]
    c = Cache()
    with lock_held_elsewhere(c.lock_path(cache_key(stuck))):
        r = run_aotc("build", str(tiny_spec), "-j", "1", AOTC_LOCK_TIMEOUT="1")
    assert r.returncode == 1, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("FAILED")]
    assert line.startswith(f"FAILED {stuck.name}: timed out after 1 s")
    assert str(c.lock_path(cache_key(stuck))) in line
    assert sorted(c.keys()) == sorted(cache_key(v) for v in variants if v != stuck)
    # the holder is gone: the next build completes, compiling only the stuck variant
    r = run_aotc("build", str(tiny_spec), "-j", "1", "--json", AOTC_LOCK_TIMEOUT="1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == {"bypassed": 0, "compiled": 1, "failed": 0, "hit": 3}


# ---- (d) lock directory on another filesystem ------------------------------

def _other_fs_lock_dir(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the test's cache")
    return Path(tempfile.mkdtemp(prefix="aotc-test-locks-", dir=shm))


@needs_dsl
@pytest.mark.slow
def test_lock_dir_on_another_filesystem(cache_dir, tiny_spec, tmp_path):
    locks = _other_fs_lock_dir(tmp_path)
    try:
        env = {"AOTC_LOCK_DIR": str(locks)}
        procs = [spawn("build", str(tiny_spec), "-j", "1", "--json", **env) for _ in range(4)]
        compiled = 0
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            compiled += json.loads(out)["counts"]["compiled"]
        variants = load_spec(tiny_spec).variants
        assert compiled == 4
        c = Cache(lock_dir=locks)
        assert c.stats()["compiles"] == 4 and c.stats()["invalid"] == 0
        assert sorted(p.name for p in locks.iterdir()) == sorted(f"{cache_key(v)}.lock" for v in variants)
        assert not (c.root / "locks").exists()  # nothing in the default place
        assert c.verify(repair=False) == []
        reference(c, tiny_spec)
        info = json.loads(run_aotc("cache", "info", "--json", **env).stdout)
        assert info["lock_dir"] == str(locks) and info["entries"] == 4
        # the locks on tmpfs really exclude: a held one times out a builder of that key on the other disk
        assert run_aotc("cache", "gc", "--max-bytes", "0", **env).returncode == 0
        with lock_held_elsewhere(locks / f"{cache_key(variants[0])}.lock"):
            r = run_aotc("build", str(tiny_spec), "-j", "1", AOTC_LOCK_TIMEOUT="1", **env)
        assert r.returncode == 1 and str(locks) in r.stderr
        assert run_aotc("build", str(tiny_spec), "-j", "1", **env).returncode == 0
        assert Cache(lock_dir=locks).verify(repair=False) == []
    finally:
        shutil.rmtree(locks, ignore_errors=True)
