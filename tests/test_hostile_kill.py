"""Killed builders: SIGKILL `aotc build` (and its compile process) at seeded random points (interpreter
start and DSL import, compile, commit), and its compile process inside commit() through the test-only hook
AOTC_TEST_KILL_POINT (aotc/storage/atomic.py).

After every kill: `Cache.verify(repair=False)` may report partial entries, but nothing the cache or
`aotc.runtime.load(cache=True)` serves differs from the reference build, every lock is free at once,
and the next build completes (exit 0) well inside AOTC_LOCK_TIMEOUT=30 with every entry verified.

Cost control (2 cores): a 2-variant spec; the killed builders are fresh processes (their start and DSL
import are among the kill targets), but the rebuilds run in one warm worker process that calls the
CLI's `main(["build", ...])` with the trial's environment, except every 4th, which runs
`python -m aotc build` as a user would.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from aotc.common.config import TEST_KILL_POINT_ENV
from aotc.storage.cache import Cache
from aotc.build.compile import cache_key
from aotc.build.spec import load_spec
from conftest import HAVE_DSL, PYTHON, REPO, aotc_env


SEED = 20261130
N_RANDOM = 50  # kills after a seeded random delay in [0, 1.2 x a full build]
N_HOOK = 20  # kills inside commit() at a seeded AOTC_TEST_KILL_POINT
KILL_POINTS = ("before_cubin", "after_cubin_tmp", "after_cubin", "after_meta_tmp", "after_meta")
REBUILD_LIMIT_S = 15.0  # the rebuild runs with AOTC_LOCK_TIMEOUT=30; a stale lock would cost >= 30 s

SPEC2 = """\
[[family]]
name = "sdpa_combine"
arch = ["sm_90a"]
dtype = ["bf16"]
head_dim = [64, 128]
strides = "packed"
"""

# Phase marks appended to a trace file (one write per mark, so a SIGKILL leaves the last phase entered):
# import (interpreter start, aotc and DSL import), compile, commit, between (after a commit: counters,
# lock release, the next lookup, the report). The builder runs MARKS, then `python -m aotc ARGS`; its
# compile processes (where compiles and commits happen) run MARKS too, through AOTC_TEST_WORKER_SETUP.
MARKS = textwrap.dedent("""
    import os
    fd = os.open(os.environ["AOTC_TEST_TRACE"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    def mark(phase):
        os.write(fd, phase.encode() + b"\\n")
    mark("import")
    import aotc.storage.cache, aotc.families
    real_module, real_commit = aotc.families.Family.compile_module, aotc.storage.cache.Cache.commit
    def compile_module(self):
        mark("import")
        m = real_module(self)
        mark("compile")
        return m
    def commit(self, art):
        mark("commit")
        real_commit(self, art)
        mark("between")
    aotc.families.Family.compile_module, aotc.storage.cache.Cache.commit = compile_module, commit
    """)
BUILDER = textwrap.dedent("""
    import os, runpy, sys
    runpy.run_path(os.environ["AOTC_TEST_WORKER_SETUP"])
    sys.argv = ["aotc", *sys.argv[1:]]
    runpy.run_module("aotc", run_name="__main__", alter_sys=True)
    """)

# A warm process that runs the CLI's build for each request (its environment), so a rebuild costs the
# compiles only, not another DSL import.
WORKER = textwrap.dedent("""
    import contextlib, io, json, os, sys, time
    from aotc.cli import main
    from aotc.families import get_family
    get_family("sdpa_combine").compile_module()  # the DSL import, once
    reply = sys.stdout
    print("ready", file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        os.environ.update(req["env"])
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = main(req["argv"])
        print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t0, "output": buf.getvalue()}),
              file=reply, flush=True)
    """)


class Worker:
    def __init__(self):
        self.p = subprocess.Popen([PYTHON, "-c", WORKER], cwd=REPO, env=aotc_env(), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "ready"

    def build(self, spec: Path, env: dict) -> dict:
        self.p.stdin.write(json.dumps({"argv": ["build", str(spec), "-j", "1", "--json"], "env": env}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line, "the rebuild worker died"
        return json.loads(line)

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.p.stdout.close()


def copy_entries(src_root: Path, dst_root: Path, keys) -> None:
    for key in keys:
        shutil.copytree(src_root / "v1" / "entries" / key[:2] / key, dst_root / "v1" / "entries" / key[:2] / key)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def temp_files(root: Path) -> list[Path]:
    """Temporary files of atomic_write left anywhere in the cache but the quarantine."""
    return [p for p in root.rglob("*.tmp-*") if "quarantine" not in p.parts]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_DSL, reason="needs nvidia-cutlass-dsl to compile")
def test_sigkill_builders_at_random_points(tmp_path, capsys, monkeypatch):
    import filelock

    import aotc.runtime
    from aotc.common.errors import RuntimeLoadError

    spec = tmp_path / "two.toml"
    spec.write_text(SPEC2)
    variants = load_spec(spec).variants
    assert len(variants) == 2
    keys = {cache_key(v): v for v in variants}

    # a SIGKILLed compile leaves its (empty) DSL dump directory behind: keep those out of the real /tmp
    builder_tmp = tmp_path / "builder-tmp"
    builder_tmp.mkdir()

    marks_py = tmp_path / "marks.py"
    marks_py.write_text(MARKS)

    def run_builder(root: Path, trace: Path, extra_env: dict | None = None) -> subprocess.Popen:
        env = aotc_env(AOTC_CACHE_DIR=str(root), TMPDIR=str(builder_tmp), AOTC_TEST_TRACE=str(trace),
                       AOTC_TEST_WORKER_SETUP=str(marks_py))
        env.pop(TEST_KILL_POINT_ENV, None)
        env.update(extra_env or {})
        return subprocess.Popen([PYTHON, "-c", BUILDER, "build", str(spec), "-j", "1"], cwd=REPO,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    # the reference build, in a fresh process on an empty cache: its duration spans the kill delays
    ref_root = tmp_path / "ref-cache"
    t0 = time.monotonic()
    p = run_builder(ref_root, tmp_path / "ref.trace")
    _, err = p.communicate(timeout=300)
    duration = time.monotonic() - t0
    assert p.returncode == 0, err
    ref_cache = Cache(ref_root)
    ref = {}
    for key, v in keys.items():
        art = ref_cache.load(key, v, count=False)
        assert art is not None
        ref[key] = art.sha256
    assert (tmp_path / "ref.trace").read_text().split().count("commit") == 2

    rng = random.Random(SEED)
    worker = Worker()
    table = Counter()
    rows = []
    carried: Path | None = None  # the state the previous kill left, before its rebuild
    t_start = time.monotonic()
    try:
        for i in range(N_RANDOM + N_HOOK):
            hook = i >= N_RANDOM
            trial = tmp_path / f"t{i}"
            root = trial / "cache"
            # ---- starting state: empty, half built, one entry corrupt, or what the last kill left
            states = ["empty", "half", "corrupt"] + ([] if hook or carried is None else ["carried"])
            state = rng.choice(states)
            corrupt_key = None
            if state == "half":
                copy_entries(ref_root, root, [rng.choice(sorted(keys))])
            elif state == "corrupt":
                copy_entries(ref_root, root, sorted(keys))
                corrupt_key = rng.choice(sorted(keys))
                flip_byte(root / "v1" / "entries" / corrupt_key[:2] / corrupt_key / "kernel.cubin")
            elif state == "carried":
                shutil.copytree(carried, root)
            root.mkdir(parents=True, exist_ok=True)
            # ---- start a builder and kill it
            trace = trial / "trace"
            if hook:
                missing = 2 if state == "empty" else 1
                point = rng.choice(KILL_POINTS)
                nth = rng.randint(1, missing)
                spec_env = {TEST_KILL_POINT_ENV: f"{point}:{nth}"}
                how = f"hook {point}:{nth}"
                proc = run_builder(root, trace, spec_env)
                try:
                    _, err = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    raise
                # the hook fires in the compile process: that variant fails, the builder reports it and exits 1
                assert proc.returncode == 1 and "worker died: signal 9 (SIGKILL)" in err, \
                    f"trial {i}: the kill point was not reached: {err}"
            else:
                delay = rng.uniform(0, 1.2 * duration)
                how = f"after {delay:.2f} s"
                proc = run_builder(root, trace)
                time.sleep(delay)
                if proc.poll() is None:  # the builder and its compile process at once, as an OOM kill of the job
                    os.killpg(proc.pid, signal.SIGKILL)
                _, err = proc.communicate(timeout=120)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # anything it started (its compile process)
            except (ProcessLookupError, PermissionError):
                pass
            marks = trace.read_text().split() if trace.exists() else []
            if proc.returncode == 0:
                phase = "completed"
            elif hook:
                phase = marks[-1]
            else:
                assert proc.returncode == -signal.SIGKILL, f"trial {i}: builder failed by itself: {err}"
                phase = marks[-1] if marks else "import"  # killed before its first mark: interpreter start
            table[f"kill:{phase}"] += 1

            # ---- what the kill left: reported, never served
            monkeypatch.setenv("AOTC_CACHE_DIR", str(root))  # for aotc.runtime.load(cache=True)
            cache = Cache(root, lock_timeout=30)
            problems = cache.verify(repair=False)
            states_found = Counter(pr.state for pr in problems)
            table["entries partial"] += states_found["partial"]
            table["entries invalid"] += states_found["invalid"]
            # only the corruption this trial planted (or carried) may be invalid: a kill leaves partial entries
            for pr in problems:
                assert pr.state == "partial" or (pr.state == "invalid" and state in ("corrupt", "carried")), \
                    (i, how, pr)
            for lock in sorted(cache.lock_dir.glob("*.lock")) if cache.lock_dir.exists() else []:
                lk = filelock.FileLock(str(lock), timeout=0)  # no stale lock: free at once
                lk.acquire()
                lk.release()
            if not hook:
                carried = tmp_path / "carried"
                shutil.rmtree(carried, ignore_errors=True)
                shutil.copytree(root, carried)
            served_ok = 0
            for key, v in keys.items():
                art = cache.load(key, v)
                if art is None:
                    continue
                if art.sha256 != ref[key] or hashlib.sha256(art.cubin).hexdigest() != ref[key]:
                    table["entries served corrupt"] += 1
                else:
                    served_ok += 1
            try:
                rt = aotc.runtime.load(cache=True)
            except RuntimeLoadError as e:
                assert "no kernels to load" in str(e)
            else:
                for k in rt.kernels["sdpa_combine"]:
                    if ref.get(k.artifact.key) != k.artifact.sha256:
                        table["entries served corrupt"] += 1
            if i % 10 == 0:  # the CLI says the same as the API
                r = subprocess.run([PYTHON, "-m", "aotc", "cache", "verify", "--no-repair"], cwd=REPO,
                                   env=aotc_env(AOTC_CACHE_DIR=str(root)), capture_output=True, text=True,
                                   timeout=60)
                assert r.returncode == (1 if cache.verify(repair=False) else 0), r.stderr

            # ---- the next build completes, fast, and leaves everything verified
            env = {"AOTC_CACHE_DIR": str(root), "AOTC_LOCK_TIMEOUT": "30"}
            t1 = time.monotonic()
            if i % 4 == 3:
                r = subprocess.run([PYTHON, "-m", "aotc", "build", str(spec), "-j", "1", "--json"], cwd=REPO,
                                   env=aotc_env(**env), capture_output=True, text=True, timeout=120)
                rc, output = r.returncode, r.stdout + r.stderr
                report = json.loads(r.stdout) if rc == 0 else None
            else:
                got = worker.build(spec, env)
                rc, output = got["rc"], got["output"]
                report = json.loads(output) if rc == 0 else None
            rebuild_s = time.monotonic() - t1
            assert rc == 0, (i, how, state, output)
            assert rebuild_s < REBUILD_LIMIT_S, (i, how, rebuild_s)
            assert report["counts"]["failed"] == 0
            table["rebuild compiles"] += report["counts"]["compiled"]
            after = Cache(root)
            assert after.verify(repair=False) == [], (i, how)
            for key, v in keys.items():
                art = after.load(key, v, count=False)
                assert art is not None and art.sha256 == ref[key], (i, how)
            assert temp_files(after.root) == [], (i, how, temp_files(after.root))
            rows.append(f"{i:3d} {state:<8} {how:<26} {phase:<10} problems={dict(states_found)} "
                        f"served_ok={served_ok} rebuild={rebuild_s:.2f}s")
            shutil.rmtree(trial)
    finally:
        worker.close()
    elapsed = time.monotonic() - t_start
    kills = {k[5:]: n for k, n in table.items() if k.startswith("kill:")}
    summary = (f"\nkill trials: {N_RANDOM + N_HOOK} ({N_RANDOM} random delays in [0, {1.2 * duration:.2f}] s, "
               f"{N_HOOK} commit hooks), seed {SEED}, {elapsed:.0f} s\n"
               f"  landed in: " + ", ".join(f"{k} {kills.get(k, 0)}" for k in
                                            ("import", "compile", "commit", "between", "completed")) + "\n"
               f"  entries found partial {table['entries partial']}, invalid {table['entries invalid']} "
               f"(planted corruption only), served corrupt {table['entries served corrupt']}, "
               f"rebuild compiles {table['rebuild compiles']}\n")
    with capsys.disabled():
        print(summary)
        if os.environ.get("AOTC_KILL_TABLE"):
            print("\n".join(rows))
    assert table["entries served corrupt"] == 0
    assert sum(kills.values()) == N_RANDOM + N_HOOK
    assert kills.get("commit", 0) >= N_HOOK  # every hook lands in commit
    assert kills.get("import", 0) > 0 and kills.get("compile", 0) > 0  # random delays span the build


# ---- the pieces the trials rely on ----------------------------------------

def test_kill_point_hook_fires_only_at_its_point_and_count():
    code = ("from aotc.storage import atomic\n"
            "atomic.test_kill_point('after_cubin'); print('first', flush=True)\n"
            "atomic.test_kill_point('after_meta'); print('other point', flush=True)\n"
            "atomic.test_kill_point('after_cubin'); print('second', flush=True)\n")
    r = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=aotc_env(**{TEST_KILL_POINT_ENV: "after_cubin:2"}),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL and r.stdout.split() == ["first", "other", "point"]
    env = aotc_env()
    env.pop(TEST_KILL_POINT_ENV, None)
    r = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["first", "other", "point", "second"]


def test_commit_and_count_sweep_temp_files_of_killed_writers(cache_dir, fake_artifact):
    c = Cache()
    art = fake_artifact("sweep")
    d = c.entry_dir(art.key)
    d.mkdir(parents=True)
    (d / ".kernel.cubin.tmp-999-deadbeef").write_bytes(b"half a cubin")
    (d / ".meta.json.tmp-999-deadbeef").write_bytes(b"{")
    (d / "kernel.cubin").write_bytes(b"an older cubin, never committed")
    assert c.check(art.key)[0].state == "partial"
    c.root.mkdir(parents=True, exist_ok=True)
    (c.root / ".stats.json.tmp-999-deadbeef").write_bytes(b"{}")
    got, created = c.get_or_create(art.key, art.variant, lambda: art)
    assert created and got == art
    assert sorted(p.name for p in d.iterdir()) == ["kernel.cubin", "meta.json"]
    assert temp_files(c.root) == []
    assert c.stats()["compiles"] == 1
