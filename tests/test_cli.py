"""The command line: help, cache info/ls/verify/gc/clear, list status, exit codes."""
from __future__ import annotations

import json

import pytest

import aotc
from aotc.storage.cache import Cache
from aotc.cli import main
from aotc.build.spec import load_spec
from conftest import run_aotc


@pytest.fixture
def built(cache_dir, tiny_spec, capsys):
    """The tiny spec built into the test's cache; returns the spec path."""
    pytest.importorskip("cutlass")
    assert main(["build", str(tiny_spec), "--json"]) == 0
    capsys.readouterr()
    return tiny_spec


def test_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("build", "bundle", "cache", "list"):
        assert cmd in out
    assert main(["cache", "--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("info", "ls", "verify", "gc", "clear"):
        assert cmd in out
    assert main(["bundle", "--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("create", "verify", "inspect", "merge", "install"):
        assert cmd in out


def test_help_and_version_as_a_program():
    r = run_aotc("--help")
    assert r.returncode == 0 and "Usage: aotc" in r.stdout
    r = run_aotc("--version")
    assert r.returncode == 0 and aotc.__version__ in r.stdout


def test_usage_errors_exit_2(capsys):
    assert main(["no-such-command"]) == 2
    assert "No such command" in capsys.readouterr().err
    assert main(["build", "-j", "0"]) == 2
    assert main(["cache", "gc"]) == 2  # --max-bytes is required
    assert "--max-bytes" in capsys.readouterr().err


def test_cache_info_json_empty(cache_dir, capsys):
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {
        "schema_version": 1,
        "command": "cache info",
        "root": str(cache_dir / "v1"),
        "lock_dir": str(cache_dir / "v1" / "locks"),
        "entries": 0,
        "bytes": 0,
        "counters": {"hits": 0, "misses": 0, "compiles": 0, "bypassed": 0, "invalid": 0, "compile_seconds": 0.0},
    }


def test_cache_info_after_build(built, cache_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AOTC_LOCK_DIR", str(tmp_path / "locks-here"))
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 4
    assert info["lock_dir"] == str(tmp_path / "locks-here")
    assert info["bytes"] >= sum(len(a.cubin) for a in map(Cache().load, Cache().keys()))
    c = info["counters"]
    assert (c["compiles"], c["misses"], c["invalid"]) == (4, 4, 0)
    assert c["compile_seconds"] > 0
    assert main(["cache", "info"]) == 0
    text = capsys.readouterr().out
    assert f"root:     {cache_dir / 'v1'}" in text and "entries:  4" in text and "compiles 4" in text


def test_cache_ls(built, capsys):
    assert main(["cache", "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    names = {v.name for v in load_spec(built).variants}
    assert {line.split()[2] for line in lines} == names
    assert all(line.split()[1] == "ok" for line in lines)
    keys = Cache().keys()
    assert sorted(line.split()[0] for line in lines) == sorted(k[:16] for k in keys)


def test_cache_verify_exit_codes(built, capsys):
    assert main(["cache", "verify"]) == 0
    assert "4 entries checked, 0 bad" in capsys.readouterr().out
    c = Cache()
    key = c.keys()[2]
    p = c.entry_dir(key) / "kernel.cubin"
    data = bytearray(p.read_bytes())
    data[100] ^= 0x40
    p.write_bytes(bytes(data))
    assert main(["cache", "verify", "--no-repair"]) == 1
    cap = capsys.readouterr()
    assert key[:16] in cap.err and "invalid" in cap.err and "quarantined" not in cap.err
    assert "4 entries checked, 1 bad" in cap.out
    assert key in c.keys()
    assert main(["cache", "verify"]) == 1
    cap = capsys.readouterr()
    assert key[:16] in cap.err and "(quarantined)" in cap.err
    assert "4 entries checked, 1 bad" in cap.out
    assert main(["cache", "verify"]) == 0
    assert "3 entries checked, 0 bad" in capsys.readouterr().out
    assert key not in c.keys()
    # the next build puts it back
    assert main(["build", str(built), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"hit": 3, "compiled": 1, "bypassed": 0, "failed": 0}
    assert main(["cache", "verify"]) == 0


def test_cache_gc(built, capsys):
    assert main(["cache", "gc", "--max-bytes", str(10 << 20)]) == 0
    assert capsys.readouterr().out.strip() == "evicted 0 entries"
    assert len(Cache().keys()) == 4
    assert main(["cache", "gc", "--max-bytes", "0"]) == 0
    assert capsys.readouterr().out.strip() == "evicted 4 entries"
    assert Cache().keys() == []
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0


def test_cache_clear(built, capsys):
    for answer in ("", "n\n"):  # asks first; no answer or "n" means no
        r = run_aotc("cache", "clear", stdin_text=answer)
        assert r.returncode == 1 and "Remove every cache entry?" in r.stdout and "aborted" in r.stderr
        assert len(Cache().keys()) == 4
    assert main(["cache", "clear", "--yes"]) == 0
    assert capsys.readouterr().out.strip() == "removed 4 entries"
    assert Cache().keys() == []
    assert Cache().stats()["compiles"] == 0
    assert main(["build", str(built), "--json"]) == 0
    capsys.readouterr()
    r = run_aotc("cache", "clear", stdin_text="y\n")
    assert r.returncode == 0 and "removed 4 entries" in r.stdout
    assert Cache().keys() == []


def test_list_status_changes_after_build(cache_dir, tiny_spec, capsys):
    pytest.importorskip("cutlass")
    assert main(["list", str(tiny_spec), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert len(before["variants"]) == 4
    assert {r["cache"] for r in before["variants"]} == {"missing"}
    assert set(before["variants"][0]) == {"name", "variant", "key", "cache"}
    assert main(["build", str(tiny_spec), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert main(["list", str(tiny_spec), "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert {r["cache"] for r in after["variants"]} == {"cached"}
    assert [r["key"] for r in after["variants"]] == [r["key"] for r in before["variants"]] == [
        v["key"] for v in built["variants"]]
    # a partial entry shows as such
    c = Cache()
    (c.entry_dir(after["variants"][0]["key"]) / "meta.json").unlink()
    assert main(["list", str(tiny_spec), "--json"]) == 0
    states = [r["cache"] for r in json.loads(capsys.readouterr().out)["variants"]]
    assert states == ["partial", "cached", "cached", "cached"]
    assert main(["list", str(tiny_spec)]) == 0
    assert "4 variants (3 cached), 0 pruned" in capsys.readouterr().out


def test_list_default_spec(cache_dir, capsys):
    assert main(["list", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    n = len(load_spec().variants)
    assert len(out["variants"]) == n
    assert len({r["key"] for r in out["variants"]}) == n


def test_errors_become_exit_codes_and_messages(cache_dir, tmp_path, capsys):
    assert main(["list", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read spec")
    assert main(["bundle", "verify", str(tmp_path / "missing.aotc")]) == 2  # click's convention for a missing file
    assert "missing.aotc" in (err := capsys.readouterr().err) and "does not exist" in err


def test_cache_ls_marks_entries_from_other_versions(cache_dir, real_artifacts, capsys):
    import dataclasses

    from aotc.common.keys import key_from_parts
    from aotc.storage.cache import Cache

    art = real_artifacts[0]
    parts = {**art.info["key_parts"], "dsl": {**art.info["key_parts"]["dsl"], "nvidia-cutlass-dsl": "4.0.0"}}
    old = dataclasses.replace(art, key=key_from_parts(art.variant, parts),
                              info={**art.info, "key_parts": parts,
                                    "versions": {**art.info["versions"], "nvidia-cutlass-dsl": "4.0.0"}})
    c = Cache()
    with c.locked(old.key):
        c.commit(old)
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "stale" in out and "nvidia-cutlass-dsl 4.0.0" in out and "aotc build" in out
