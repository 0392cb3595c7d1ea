"""Hostile builds: a compile process that dies, a builder stopped by SIGTERM or Ctrl-C, read-only caches and
outputs, a full standard output, a bad scheduler, a spec that prunes to nothing.

Compiles run in compile processes (aotc.build.pool); a test reaches into them with AOTC_TEST_WORKER_SETUP
(conftest.patch_compile_processes). Read-only directories are real: a read-only bind mount in a private
mount namespace when this runs as root (root ignores permission bits), chmod otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from aotc.build.builder import build
from aotc.build.compile import cache_key
from aotc.build.spec import load_spec
from aotc.cli import main
from aotc.storage.bundle import write_bundle
from aotc.storage.cache import Cache
from conftest import HAVE_DSL, PYTHON, REPO, aotc_env, patch_compile_processes, run_aotc

needs_dsl = pytest.mark.skipif(not HAVE_DSL, reason="needs nvidia-cutlass-dsl to compile")

# compile processes record their PID and dump directory, then sleep in the "compile" until stopped
SLOW_COMPILE = """
    import os, time
    from aotc.families import Family
    real = Family.compile_module
    def compile_module(self):
        class Module:
            @staticmethod
            def compile(variant, dump_dir, **kw):
                with open(os.path.join({marks!r}, str(os.getpid())), "w") as f:
                    f.write(dump_dir)
                time.sleep(300)
        return Module
    Family.compile_module = compile_module
    """


def sigkill_when_compiling(name: str) -> str:
    return f"""
        import os, signal
        from aotc.families import get_family
        module = get_family("sdpa_combine").compile_module()
        real = module.compile
        def compile(variant, **kw):
            if variant.name == {name!r}:
                os.kill(os.getpid(), signal.SIGKILL)  # a stand-in for a segfault inside the DSL
            return real(variant, **kw)
        module.compile = compile
        """


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# ---- item 5: a dead compile process fails its variant only ----------------------------------------
@needs_dsl
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_sigkilled_compile_fails_only_its_variant(cache_dir, tiny_spec, tmp_path, monkeypatch, jobs):
    variants = load_spec(tiny_spec).variants
    victim = variants[1]
    patch_compile_processes(monkeypatch, tmp_path, sigkill_when_compiling(victim.name))
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    r = run_aotc("build", str(tiny_spec), "-j", jobs, "--json", TMPDIR=str(tmpdir))
    assert r.returncode == 1, r.stderr
    assert os.listdir(tmpdir) == []  # the killed process's dump directory went with its own temporary one
    report = json.loads(r.stdout)
    status = {v["name"]: v for v in report["variants"]}
    assert report["counts"] == {"hit": 0, "compiled": 3, "bypassed": 0, "failed": 1}
    assert status[victim.name]["status"] == "failed"
    assert status[victim.name]["error"].startswith("worker died: signal 9 (SIGKILL)")
    assert report["error"]["kind"] == "variants_failed" and victim.name in report["error"]["message"]
    assert sorted(Cache().keys()) == sorted(cache_key(v) for v in variants if v != victim)
    assert "Traceback" not in r.stderr
    # the text report names it too
    r = run_aotc("build", str(tiny_spec), "-j", jobs)
    assert r.returncode == 1
    assert f"FAILED {victim.name}: worker died: signal 9 (SIGKILL)" in r.stderr


@needs_dsl
def test_the_build_api_survives_a_dead_compile_process(cache_dir, tiny_spec, tmp_path, monkeypatch):
    variants = load_spec(tiny_spec).variants
    patch_compile_processes(monkeypatch, tmp_path, sigkill_when_compiling(variants[0].name))
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))  # where the pool makes its processes' directories
    report = build(variants, cache=Cache(), jobs=1)  # in this process: it must not die with the compile
    assert [r.status for r in report.results] == ["failed", "compiled", "compiled", "compiled"]
    assert "worker died: signal 9" in report.results[0].error
    assert os.listdir(tmpdir) == []


# ---- item 7: SIGTERM, Ctrl-C ----------------------------------------------------------------------
def _start_slow_build(tiny_spec, tmp_path, monkeypatch):
    marks, tmpdir = tmp_path / "marks", tmp_path / "tmpdir"
    marks.mkdir()
    tmpdir.mkdir()
    patch_compile_processes(monkeypatch, tmp_path, SLOW_COMPILE.format(marks=str(marks)))
    # SIGINT as a terminal's foreground job has it: a suite started in the background (`cmd &` from a script)
    # runs with SIGINT ignored, which its children inherit, and the Ctrl-C test then waited in vain
    p = subprocess.Popen([PYTHON, "-m", "aotc", "build", str(tiny_spec), "-j", "2", "--json"], cwd=REPO,
                         env=aotc_env(TMPDIR=str(tmpdir)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while len(os.listdir(marks)) < 2:  # both compile processes are inside a compile
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the compile processes never started compiling"
        time.sleep(0.05)
    pids = [int(n) for n in os.listdir(marks)]
    dump_dirs = [Path((marks / n).read_text()) for n in os.listdir(marks)]
    # each compile process's dump directory lies in a temporary directory the pool made for that process
    assert all(d.is_dir() and d.parent.parent == tmpdir and d.parent.name.startswith("aotc-worker-")
               for d in dump_dirs)
    return p, pids, tmpdir


@pytest.mark.parametrize("to_group", [False, True], ids=["pid-only", "process-group"])
def test_sigterm_stops_the_compile_processes_and_leaves_nothing(cache_dir, tiny_spec, tmp_path, monkeypatch, to_group):
    p, pids, tmpdir = _start_slow_build(tiny_spec, tmp_path, monkeypatch)
    if to_group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)  # as a supervisor stops a service: its PID only
    out, err = p.communicate(timeout=60)
    try:
        assert p.returncode == 143, err
        assert [pid for pid in pids if not gone(pid)] == []
        assert os.listdir(tmpdir) == []
        assert "Traceback" not in err and "error: terminated (SIGTERM)" in err
        doc = json.loads(out)
        assert doc["error"] == {"kind": "terminated", "message": "terminated (SIGTERM)", "hint": None,
                                "exit_code": 143}
        assert doc["schema_version"] == 1 and doc["command"] == "build"
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_ctrl_c_exits_130_without_compile_process_tracebacks(cache_dir, tiny_spec, tmp_path, monkeypatch):
    p, pids, tmpdir = _start_slow_build(tiny_spec, tmp_path, monkeypatch)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal sends the foreground process group
    out, err = p.communicate(timeout=60)
    try:
        assert p.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        assert [pid for pid in pids if not gone(pid)] == []
        assert os.listdir(tmpdir) == []
        assert json.loads(out)["error"]["kind"] == "interrupted"
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


# ---- item 8: read-only caches and outputs ----------------------------------------------------------
def _unshare_works(probe: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe.mkdir(exist_ok=True)
    script = f'mount --bind {probe} {probe} && mount -o remount,ro,bind {probe} {probe} && ! touch {probe}/x'
    try:
        r = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and not (probe / "x").exists()


@pytest.fixture
def read_only(tmp_path):
    """run(dirs, *aotc_args, **env): the CLI in a fresh process that cannot write into `dirs`."""
    as_root = os.geteuid() == 0
    if as_root and not _unshare_works(tmp_path / "probe"):
        pytest.skip("running as root without `unshare --mount`: no way to make a directory read-only")
    changed: list[tuple[Path, int]] = []

    def run(dirs, *args, stdin_text: str = "", **env) -> subprocess.CompletedProcess:
        dirs = [Path(d) for d in dirs]
        if as_root:  # root ignores permission bits: a read-only bind mount in a private mount namespace
            script = 'IFS=:; for d in $RO_DIRS; do mount --bind "$d" "$d" && mount -o remount,ro,bind "$d" "$d" ' \
                     '|| exit 99; done; unset IFS; exec "$@"'
            cmd = ["unshare", "--mount", "sh", "-c", script, "sh", PYTHON, "-m", "aotc", *args]
            env = {**env, "RO_DIRS": ":".join(map(str, dirs))}
        else:
            for d in dirs:
                for path in [d, *d.rglob("*")]:
                    if path.is_dir():
                        changed.append((path, path.stat().st_mode))
                        path.chmod(0o555)
            cmd = [PYTHON, "-m", "aotc", *args]
        try:
            r = subprocess.run(cmd, cwd=REPO, env=aotc_env(**env), capture_output=True, text=True, timeout=300,
                               input=stdin_text)
        finally:
            for path, mode in reversed(changed):
                path.chmod(mode)
            changed.clear()
        assert r.returncode != 99, r.stderr
        return r

    return run


@pytest.fixture
def full_cache(cache_dir, fake_artifact):
    """A cache holding three entries (no compile): (cache, artifacts)."""
    c = Cache()
    arts = [fake_artifact(f"ro{i}") for i in range(3)]
    for a in arts:
        c.fill(a.key, a.variant, lambda a=a: a)
    return c, arts


def test_build_into_a_read_only_cache_fails_before_compiling(cache_dir, tiny_spec, tmp_path, monkeypatch, read_only):
    marks = tmp_path / "marks"
    marks.mkdir()
    patch_compile_processes(monkeypatch, tmp_path, SLOW_COMPILE.format(marks=str(marks)))
    (cache_dir / "v1").mkdir(parents=True)
    r = read_only([cache_dir], "build", str(tiny_spec), "--json")
    assert r.returncode == 4, r.stderr
    assert f"the cache ({cache_dir / 'v1'}) is not writable" in r.stderr and "AOTC_CACHE_DIR" in r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"]["kind"] == "cache"
    assert os.listdir(marks) == []  # nothing was compiled


def test_build_into_a_read_only_lock_dir_fails_before_compiling(cache_dir, tiny_spec, tmp_path, read_only):
    locks = tmp_path / "locks"
    locks.mkdir()
    r = read_only([locks], "build", str(tiny_spec), AOTC_LOCK_DIR=str(locks))
    assert r.returncode == 4, r.stderr
    assert f"lock directory ({locks}) is not writable" in r.stderr and "AOTC_LOCK_DIR" in r.stderr
    assert Cache().keys() == []


def test_build_bundle_into_a_read_only_directory_is_refused_before_compiling(cache_dir, tiny_spec, tmp_path,
                                                                              monkeypatch, read_only):
    marks = tmp_path / "marks"
    marks.mkdir()
    patch_compile_processes(monkeypatch, tmp_path, SLOW_COMPILE.format(marks=str(marks)))
    out_dir = tmp_path / "ro-out"
    out_dir.mkdir()
    r = read_only([out_dir], "build", str(tiny_spec), "--bundle", str(out_dir / "x.aotc"))
    assert r.returncode == 2, r.stderr
    assert f"--bundle '{out_dir / 'x.aotc'}': cannot write there" in r.stderr and "Traceback" not in r.stderr
    assert os.listdir(marks) == [] and Cache().keys() == []


def test_cache_gc_and_clear_on_a_read_only_cache_exit_4(full_cache, read_only):
    c, _ = full_cache
    for args in (["cache", "gc", "--max-bytes", "0"], ["cache", "clear", "--yes"]):
        r = read_only([c.root], *args)
        assert r.returncode == 4, (args, r.stderr)
        assert f"the cache at {c.root}" in r.stderr and "Traceback" not in r.stderr
        assert len(c.keys()) == 3


def test_cache_verify_without_write_permission_never_claims_a_quarantine(full_cache, read_only):
    c, arts = full_cache
    (c.entry_dir(arts[1].key) / "kernel.cubin").write_bytes(b"truncated")
    r = read_only([c.root], "cache", "verify")
    assert r.returncode == 4, r.stderr
    assert "(quarantined)" not in r.stderr and "left in place" in r.stderr
    assert "1 bad entries could not be quarantined" in r.stderr
    assert c.entry_dir(arts[1].key).exists()
    r = read_only([c.root], "cache", "verify", "--json")
    (bad,) = json.loads(r.stdout)["bad"]
    assert bad["key"] == arts[1].key and bad["quarantined"] is False


@needs_dsl
def test_bundle_install_into_a_read_only_cache(cache_dir, tmp_path, real_artifacts, read_only):
    bundle = tmp_path / "one.aotc"
    write_bundle(bundle, real_artifacts[:2])
    assert main(["bundle", "install", str(bundle)]) == 0
    c = Cache()
    r = read_only([c.root], "bundle", "install", str(bundle))  # everything is there: nothing to lock or write
    assert r.returncode == 0, r.stderr
    assert "installed 0 new kernels" in r.stdout
    c.remove(real_artifacts[0].key)
    r = read_only([c.root], "bundle", "install", str(bundle))
    assert r.returncode == 4, r.stderr
    assert f"cannot install {real_artifacts[0].variant.name} into the cache at {c.root}" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_full_standard_output_is_exit_12_not_a_traceback(cache_dir, tiny_spec):
    with open("/dev/full", "w") as full:
        for args in (["list", str(tiny_spec)], ["list", str(tiny_spec), "--json"], ["cache", "info"]):
            r = subprocess.run([PYTHON, "-m", "aotc", *args], cwd=REPO, env=aotc_env(), stdout=full,
                               stderr=subprocess.PIPE, text=True, timeout=120)
            assert r.returncode == 12, (args, r.stderr)
            assert "error: cannot write to standard output: No space left on device" in r.stderr
            assert "Traceback" not in r.stderr


def test_a_reader_that_left_the_pipe_is_exit_12_without_noise(cache_dir, tiny_spec):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `aotc list | head -1` once head has exited
    try:
        r = subprocess.run([PYTHON, "-m", "aotc", "list", str(tiny_spec)], cwd=REPO, env=aotc_env(), stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 12 and r.stderr == "", r.stderr  # no traceback, no "Exception ignored"


def test_a_scheduler_that_is_not_an_address_is_a_usage_error(tiny_spec, capsys):
    pytest.importorskip("distributed")
    assert main(["build", str(tiny_spec), "--executor", "dask", "--scheduler", "garbage"]) == 2
    err = capsys.readouterr().err
    assert "--scheduler 'garbage': cannot reach a Dask scheduler there" in err and "hint:" in err


# ---- item 10: a spec that prunes to nothing -----------------------------------------------------
def test_a_spec_that_prunes_to_nothing_is_an_error_naming_why(cache_dir, tmp_path, capsys):
    spec = tmp_path / "nothing.toml"
    spec.write_text('[[family]]\nname = "sdpa_prefill_sm90"\narch = ["sm_80", "sm_90a"]\ndtype = "bf16"\n'
                    'head_dim = 64\nlayout = "dense"\ncausal = false\nblock_n = [80, 176]\n'
                    'exclude = [{arch = "sm_90a", block_n = 176}]\n')
    s = load_spec(spec)
    assert s.variants == () and len(s.pruned) == 4
    out = tmp_path / "nothing.aotc"
    for args in (["build", str(spec), "--bundle", str(out)], ["bundle", "create", str(out), "--spec", str(spec)]):
        assert main([*args, "--json"]) == 2
        cap = capsys.readouterr()
        doc = json.loads(cap.out)
        assert doc["error"]["kind"] == "spec"
        msg = doc["error"]["message"]
        assert f"spec {spec}: no variants: every one of its 4 combinations was pruned" in msg
        for p in s.pruned:  # every reason is named, with how many combinations it pruned
            assert p.reason in msg
        assert "does not support sm_80 (supports ['sm_90a']) (2: arch=sm_80" in msg
        assert "excluded by the spec (1: arch=sm_90a" in msg
        assert "--why-not" in cap.err
    assert not out.exists()
    assert main(["list", str(spec), "--why-not"]) == 0  # listing it is how you find out why
    assert "0 variants (0 cached), 4 pruned" in capsys.readouterr().out
