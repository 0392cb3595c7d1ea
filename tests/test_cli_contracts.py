"""What CI relies on from the CLI: a JSON document on every exit, one exit code per kind of failure, bounded
output for hostile bundles, wheel names pip accepts and that shadow nothing, AOTC_BUNDLE_PATH typos caught."""
from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from aotc.cli import main
from aotc.common.errors import EXIT_CODES, BundleError
from aotc.storage.bundle import ENTRY_POINT_GROUP, MANIFEST, discover_bundles, write_bundle
from aotc.storage.cache import Cache
from conftest import PYTHON, REPO, aotc_env, run_aotc


@pytest.fixture
def three(tmp_path, real_artifacts):
    """A verified bundle of the three sm_90a real artifacts, and a spec naming exactly those variants."""
    bundle = tmp_path / "three.aotc"
    write_bundle(bundle, real_artifacts[:3])
    spec = tmp_path / "three.toml"
    spec.write_text("".join(
        f'[[family]]\nname = "{a.variant.family}"\narch = "{a.variant.arch}"\n' +
        "".join(f"{k} = {json.dumps(v)}\n" for k, v in a.variant.fields) for a in real_artifacts[:3]))
    return bundle, spec


@pytest.fixture
def tampered(three, tmp_path) -> Path:
    bundle, _ = three
    bad = tmp_path / "tampered.aotc"
    flipped = False
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(bad, "w") as dst:
        for zi in src.infolist():
            data = src.read(zi.filename)
            if zi.filename != MANIFEST and not flipped:  # one byte of the first cubin
                data, flipped = data[:100] + bytes([data[100] ^ 1]) + data[101:], True
            dst.writestr(zi, data)
    return bad


def doc_of(capsys) -> dict:
    out = capsys.readouterr().out
    doc = json.loads(out)
    assert doc["schema_version"] == 1
    return doc


# ---- item 9: --json on every exit -----------------------------------------------------------------
def test_build_json_on_the_error_path_as_the_readme_uses_it(cache_dir, tiny_spec):
    r = run_aotc("build", str(tiny_spec), "--json", AOTC_NO_COMPILE="1")
    assert r.returncode == 5
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["command"] == "build" and doc["spec"] == str(tiny_spec)
    err = doc["error"]
    assert (err["kind"], err["exit_code"]) == ("missing_artifacts", 5)
    assert "4 variant(s) missing" in err["message"] and err["hint"].startswith("build them")
    assert doc["counts"] == {"hit": 0, "compiled": 0, "bypassed": 0, "failed": 0}


@pytest.mark.parametrize("args, command, kind", [
    (["build", "--shard", "0/3", "--json"], "build", "spec"),  # aotc's own usage error
    (["build", "-j", "0", "--json"], "build", "usage"),        # click's
    (["bundle", "verify", "missing.aotc", "--json"], "bundle verify", "usage"),
    (["cache", "ls", "--json", "--no-such-option"], "cache ls", "usage"),
])
def test_usage_errors_print_a_json_document_too(cache_dir, args, command, kind, capsys):
    assert main(args) == 2
    doc = doc_of(capsys)
    assert doc["command"] == command
    assert doc["error"]["kind"] == kind and doc["error"]["exit_code"] == 2 and doc["error"]["message"]


@pytest.mark.parametrize("args, command", [
    (["list", "TINY", "--json"], "list"), (["cache", "info", "--json"], "cache info"),
    (["cache", "ls", "--json"], "cache ls"), (["cache", "verify", "--json"], "cache verify"),
])
def test_success_documents_have_a_schema_version_and_no_error(cache_dir, tiny_spec, args, command, capsys):
    assert main([str(tiny_spec) if a == "TINY" else a for a in args]) == 0
    doc = doc_of(capsys)
    assert doc["command"] == command and "error" not in doc


def test_cache_ls_and_verify_json(cache_dir, real_artifacts, capsys):
    c = Cache()
    arts = real_artifacts[:2]
    for a in arts:
        c.fill(a.key, a.variant, lambda a=a: a)
    assert main(["cache", "ls", "--json"]) == 0
    rows = doc_of(capsys)["entries"]
    assert sorted((r["key"], r["state"], r["variant"]) for r in rows) == sorted((a.key, "ok", a.variant.name) for a in arts)
    (c.entry_dir(arts[0].key) / "kernel.cubin").write_bytes(b"bad")
    assert main(["cache", "verify", "--no-repair", "--json"]) == 1
    doc = doc_of(capsys)
    assert doc["checked"] == 2 and [b["key"] for b in doc["bad"]] == [arts[0].key]
    assert doc["bad"][0]["quarantined"] is False and doc["error"]["kind"] == "check_failed"
    assert main(["cache", "verify", "--json"]) == 1
    assert doc_of(capsys)["bad"][0]["quarantined"] is True


def test_bundle_commands_json(cache_dir, three, tampered, tmp_path, capsys):
    bundle, spec = three
    assert main(["bundle", "install", str(bundle), "--json"]) == 0
    doc = doc_of(capsys)
    assert doc["bundles"] == [{"path": str(bundle), "kernels": 3, "new": 3}] and doc["installed"] == 3
    out = tmp_path / "created.aotc"
    assert main(["bundle", "create", str(out), "--spec", str(spec), "--json"]) == 0
    assert doc_of(capsys) == {"schema_version": 1, "command": "bundle create", "out": str(out), "spec": str(spec),
                              "kernels": 3}
    merged = tmp_path / "merged.aotc"
    assert main(["bundle", "merge", str(merged), str(bundle), str(out), "--json"]) == 0
    doc = doc_of(capsys)
    assert doc["kernels"] == 3 and doc["inputs"] == [{"path": str(bundle), "kernels": 3, "new": 3},
                                                     {"path": str(out), "kernels": 3, "new": 0}]
    assert main(["bundle", "verify", str(merged), str(tampered), "--json"]) == 7
    doc = doc_of(capsys)
    ok, bad = doc["bundles"]
    assert ok == {"path": str(merged), "ok": True, "problems": [], "problems_total": 0}
    assert not bad["ok"] and bad["problems_total"] == 1 and "sha256" in bad["problems"][0]
    assert doc["error"]["kind"] == "bundle" and doc["error"]["exit_code"] == 7


# ---- item 11: one exit code per kind of failure -----------------------------------------------------
def test_a_tampered_bundle_exits_7_from_every_command(cache_dir, three, tampered, tmp_path, capsys):
    bundle, _ = three
    for args in (["bundle", "verify", str(tampered)], ["bundle", "inspect", str(tampered)],
                 ["bundle", "install", str(tampered)], ["bundle", "diff", str(bundle), str(tampered)],
                 ["bundle", "merge", str(tmp_path / "m.aotc"), str(tampered)],
                 ["bundle", "wheel", str(tampered), "--name", "acme-k", "--version", "1.0", "--out", str(tmp_path)]):
        assert main(args) == 7, args
        assert "sha256" in capsys.readouterr().err


def test_a_missing_input_file_exits_2_from_every_command(cache_dir, tmp_path, capsys):
    gone = str(tmp_path / "gone.aotc")
    for args in (["bundle", "verify", gone], ["bundle", "inspect", gone], ["bundle", "install", gone],
                 ["bundle", "diff", gone, gone], ["bundle", "merge", str(tmp_path / "m.aotc"), gone],
                 ["bundle", "wheel", gone, "--name", "acme-k", "--version", "1.0"]):
        assert main(args) == 2, args
        assert f"'{gone}' does not exist" in capsys.readouterr().err


def test_help_lists_every_exit_code(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for code, meaning in EXIT_CODES.items():
        assert f"{code:>3}  {meaning[:30]}" in out
    assert set(EXIT_CODES) >= {0, *range(1, 13), 130, 143}


def test_bundle_install_is_not_counted_as_compiles(cache_dir, three, capsys):
    bundle, _ = three
    assert main(["bundle", "install", str(bundle)]) == 0
    stats = Cache().stats()
    assert (stats["compiles"], stats["compile_seconds"]) == (0, 0.0)
    assert len(Cache().keys()) == 3


# ---- item 6 (CLI part): a manifest of many entries prints a bounded report ---------------------------------
def test_bundle_verify_output_is_bounded_for_a_manifest_of_many_entries(tmp_path):
    n = 200_000
    bomb = tmp_path / "bomb.aotc"
    manifest = {"format": "aotc-bundle", "format_version": 1, "producer": {}, "created": "x",
                "artifacts": [{"member": "kernels/x.cubin"}] * n}
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MANIFEST, json.dumps(manifest))
    assert bomb.stat().st_size < 64 << 10
    r = run_aotc("bundle", "verify", str(bomb), timeout=300)
    assert r.returncode == 7
    assert len(r.stdout) + len(r.stderr) < 20_000, (len(r.stdout), len(r.stderr))
    assert r.stderr.count(f"{bomb}: ") <= 52
    r = run_aotc("bundle", "verify", str(bomb), "--json", timeout=300)
    (row,) = json.loads(r.stdout)["bundles"]
    assert len(row["problems"]) <= 50 and row["problems_total"] >= len(row["problems"]) >= 1
    assert len(r.stdout) < 20_000


# ---- item 12: wheels pip accepts, shadowing nothing ------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["--name", "acme-k", "--version", "1.0\n"], "not a canonical PEP 440 version: write '1.0'"),
    (["--name", "acme-k\n", "--version", "1.0"], "not a valid distribution name"),
    (["--name", "acme-k", "--version", "1.0", "--package", "json"], "--package 'json' is not a usable import name"),
    (["--name", "acme-k", "--version", "1.0", "--package", "numpy"], "--package 'numpy' is not a usable import"),
    (["--name", "acme-k", "--version", "1.0", "--package", "__init__"], "--package '__init__' is not a usable"),
    (["--name", "acme-k", "--version", "1.0", "--package", "click"], "--package 'click' is not a usable"),
    (["--name", "numpy", "--version", "99.0"], "--name 'numpy' is the name of a distribution that is not"),
    (["--name", "pytest", "--version", "99.0", "--package", "acme_k"], "--name 'pytest' is the name of a"),
    (["--name", "acme-k", "--version", "1.0", "--requires", "not a valid req !!"],
     "--requires 'not a valid req !!' is not a valid requirement (PEP 508)"),
    (["--name", "acme-k", "--version", "1.0", "--requires", "aotc>=0.1\nX-Evil: 1"], "not a valid requirement"),
])
def test_wheel_refuses_what_pip_rejects_or_what_would_shadow(three, tmp_path, args, needle, capsys):
    pytest.importorskip("packaging")
    bundle, _ = three
    out = tmp_path / "dist"
    assert main(["bundle", "wheel", str(bundle), *args, "--out", str(out), "--json"]) == 2
    doc = doc_of(capsys)
    assert needle in doc["error"]["message"] and doc["error"]["kind"] == "usage"
    assert not out.exists()


def _fake_bundle_dist(root: Path, name: str, module: str) -> None:
    """An installed bundle wheel `name` whose top-level module is `module` (as `aotc bundle wheel` makes)."""
    root.mkdir(parents=True)
    (root / f"{module}.py").write_text("def bundle_path():\n    return ''\n")
    info = root / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(f"{module}\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {module}:bundle_path\n")


def test_a_new_version_of_an_installed_bundle_wheel_is_allowed(three, tmp_path, monkeypatch):
    pytest.importorskip("packaging")
    from aotc.build.wheel import WheelError, build_wheel

    bundle, _ = three
    _fake_bundle_dist(tmp_path / "site", "acme-own", "acme_own")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    info = build_wheel(bundle, name="acme-own", version="2.0", out_dir=tmp_path / "d")
    assert info["package"] == "acme_own" and Path(info["wheel"]).name == "acme_own-2.0-py3-none-any.whl"
    with pytest.raises(WheelError, match="--package 'acme_own' is not a usable import name"):
        build_wheel(bundle, name="acme-other", version="1.0", package="acme_own", out_dir=tmp_path / "d2")


# ---- item 10 (part): AOTC_BUNDLE_PATH naming nothing ------------------------------------------------------
def test_a_missing_file_on_aotc_bundle_path_is_an_error(cache_dir, three, tmp_path, monkeypatch):
    bundle, _ = three
    typo = tmp_path / "kernles.aotc"
    monkeypatch.setenv("AOTC_BUNDLE_PATH", f"{bundle}:{typo}")
    found = [f for f in discover_bundles(installed=False)]
    assert [(f.path, bool(f.error)) for f in found] == [(bundle, False), (typo, True)]
    assert str(typo) in found[1].error
    from aotc.runtime import load

    with pytest.raises(BundleError, match=f"AOTC_BUNDLE_PATH: {typo}: no such file"):
        load()
    r = run_aotc("doctor", AOTC_BUNDLE_PATH=str(typo))
    assert r.returncode == 1, r.stderr
    assert f"BAD {typo}  [AOTC_BUNDLE_PATH]" in r.stdout and "AOTC_BUNDLE_PATH is empty" not in r.stdout
    monkeypatch.setenv("AOTC_BUNDLE_PATH", str(tmp_path / "no-such-dir"))
    with pytest.raises(BundleError, match="no-such-dir"):
        load()


# ---- issue 18 item 6: one compile task, one loop, no import cycle -------------------------------------
def test_the_executors_do_not_import_the_build_loop():
    code = ("import sys, aotc.build.executors, aotc.build.pool\n"
            "print(sorted(m for m in sys.modules if m == 'aotc.build.builder'))\n")
    r = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=aotc_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
    assert "from .builder" not in (REPO / "aotc" / "build" / "executors.py").read_text()
