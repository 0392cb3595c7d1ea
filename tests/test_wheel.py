"""`aotc bundle wheel`: a correct, reproducible wheel that pip installs and aotc.load() then finds."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

import aotc
from aotc.storage.bundle import ENTRY_POINT_GROUP, discover_bundles, installed_bundles, read_bundle, write_bundle
from aotc.cli import main
from aotc.common.errors import BundleError, RuntimeLoadError
from aotc.build.wheel import build_wheel
from conftest import PYTHON, REPO, aotc_env


@pytest.fixture
def tiny_bundle(tmp_path, fake_artifact) -> Path:
    """A verified bundle of three kernels (real cubins when the DSL is here; no compile of its own)."""
    pytest.importorskip("cutlass")  # real cubins (read_bundle checks each one's arch)
    p = tmp_path / "tiny.aotc"
    write_bundle(p, [fake_artifact("a"), fake_artifact("b", base=1), fake_artifact("c", base=2)])
    return p


@pytest.fixture
def wheel(tiny_bundle, tmp_path) -> dict:
    return build_wheel(tiny_bundle, name="acme-attn.kernels", version="1.2.0", out_dir=tmp_path / "dist")


def pip_install_target(wheel_path: str, target: Path) -> None:
    r = subprocess.run([PYTHON, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--quiet",
                        "--target", str(target), wheel_path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def run_py(code: str, *paths: Path, **env: str) -> subprocess.CompletedProcess:
    e = aotc_env(**env)
    e["PYTHONPATH"] = os.pathsep.join([str(REPO), *map(str, paths)])
    return subprocess.run([PYTHON, "-c", code], env=e, capture_output=True, text=True, timeout=300)


# ---- the wheel file ----------------------------------------------------------------------------------
def test_wheel_layout_metadata_and_record(wheel, tiny_bundle):
    path = Path(wheel["wheel"])
    assert path.name == "acme_attn_kernels-1.2.0-py3-none-any.whl"
    assert wheel["package"] == "acme_attn_kernels" and wheel["kernels"] == 3
    info = "acme_attn_kernels-1.2.0.dist-info"
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        files = {n: zf.read(n) for n in names}
    assert names == ["acme_attn_kernels/__init__.py", "acme_attn_kernels/tiny.aotc", f"{info}/METADATA",
                     f"{info}/WHEEL", f"{info}/entry_points.txt", f"{info}/top_level.txt", f"{info}/RECORD"]
    assert files["acme_attn_kernels/tiny.aotc"] == tiny_bundle.read_bytes()
    meta = files[f"{info}/METADATA"].decode()
    assert "Metadata-Version: 2.1\nName: acme-attn.kernels\nVersion: 1.2.0\n" in meta
    assert "Requires-Dist" not in meta
    assert files[f"{info}/WHEEL"].decode() == (f"Wheel-Version: 1.0\nGenerator: aotc {aotc.__version__}\n"
                                               "Root-Is-Purelib: true\nTag: py3-none-any\n")
    assert files[f"{info}/entry_points.txt"].decode() == \
        f"[{ENTRY_POINT_GROUP}]\nacme-attn.kernels = acme_attn_kernels:bundle_path\n"
    # RECORD: every other file once, with its urlsafe-base64 sha256 and size; RECORD itself unhashed
    rows = list(csv.reader(io.StringIO(files[f"{info}/RECORD"].decode())))
    assert [r[0] for r in rows] == names
    for name, digest, size in rows[:-1]:
        want = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}" and int(size) == len(files[name])
    assert rows[-1] == [f"{info}/RECORD", "", ""]
    assert wheel["bundle_sha256"] == hashlib.sha256(tiny_bundle.read_bytes()).hexdigest()
    assert wheel["bundle_sha256"] in files["acme_attn_kernels/__init__.py"].decode()


def test_wheel_is_reproducible(tiny_bundle, tmp_path, wheel):
    again = build_wheel(tiny_bundle, name="acme-attn.kernels", version="1.2.0", out_dir=tmp_path / "again")
    assert Path(again["wheel"]).read_bytes() == Path(wheel["wheel"]).read_bytes()


def test_requires_option(tiny_bundle, tmp_path):
    w = build_wheel(tiny_bundle, name="k", version="0.1", out_dir=tmp_path, requires=["aotc>=0.1", "numpy"])
    with zipfile.ZipFile(w["wheel"]) as zf:
        meta = zf.read("k-0.1.dist-info/METADATA").decode()
    assert "Requires-Dist: aotc>=0.1\nRequires-Dist: numpy\n" in meta


@pytest.mark.parametrize("args, msg", [
    (["--name", "-bad", "--version", "1.0"], "not a valid distribution name"),
    (["--name", "ok", "--version", "1.0-final"], "not a canonical PEP 440 version"),
    (["--name", "ok", "--version", "v1"], "not a canonical PEP 440 version"),
    (["--name", "ok", "--version", "1.0", "--package", "not-an-identifier"], "not a usable import name"),
])
def test_bad_names_and_versions_exit_2(tiny_bundle, tmp_path, args, msg, capsys):
    assert main(["bundle", "wheel", str(tiny_bundle), *args, "--out", str(tmp_path / "d")]) == 2
    assert msg in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_bad_bundle_is_never_packed(tiny_bundle, tmp_path, capsys):
    bad = tmp_path / "bad.aotc"
    data = bytearray(tiny_bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    assert main(["bundle", "wheel", str(bad), "--name", "x", "--version", "1", "--out", str(tmp_path / "d")]) == 7
    assert not (tmp_path / "d").exists()
    capsys.readouterr()


def test_cli_output(tiny_bundle, tmp_path, capsys):
    assert main(["bundle", "wheel", str(tiny_bundle), "--name", "k2", "--version", "2.0rc1",
                 "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'd' / 'k2-2.0rc1-py3-none-any.whl'} (3 kernels; package k2, " \
           f"entry point aotc.bundles:k2 = k2:bundle_path)" in out
    assert main(["bundle", "wheel", str(tiny_bundle), "--name", "k2", "--version", "2.0", "--json",
                 "--out", str(tmp_path / "d")]) == 0
    assert json.loads(capsys.readouterr().out)["wheel"].endswith("k2-2.0-py3-none-any.whl")


# ---- installed, then found -----------------------------------------------------------------------------
def test_pip_installed_wheel_is_found_by_load_with_no_argument(wheel, tiny_bundle, tmp_path):
    site = tmp_path / "site"
    pip_install_target(wheel["wheel"], site)
    assert (site / "acme_attn_kernels" / "tiny.aotc").read_bytes() == tiny_bundle.read_bytes()
    want = sorted(a.variant.name for a in read_bundle(tiny_bundle).artifacts)
    code = (
        "import json, sys, aotc, aotc.runtime\n"
        "rt = aotc.runtime.load()\n"
        "rt2 = aotc.load()\n"
        "names = sorted(k.variant.name for ks in rt.kernels.values() for k in ks)\n"
        "assert names == sorted(k.variant.name for ks in rt2.kernels.values() for k in ks)\n"
        "assert 'cutlass' not in sys.modules and 'torch' not in sys.modules\n"
        "print(json.dumps({'names': names, 'sources': rt.sources}))\n"
    )
    r = run_py(code, site)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["names"] == want
    assert out["sources"] == [str(site / "acme_attn_kernels" / "tiny.aotc")]
    # installed=False leaves it out; with nothing else there, that is an error naming what was searched
    r = run_py("import aotc.runtime\naotc.runtime.load(installed=False, cache=False)", site)
    assert r.returncode != 0 and "no kernels to load" in r.stderr
    # doctor lists it, with its origin
    r = subprocess.run([PYTHON, "-m", "aotc", "doctor", "--json"], env={**aotc_env(), "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])},
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    (b,) = json.loads(r.stdout)["bundles"]
    assert b["path"] == str(site / "acme_attn_kernels" / "tiny.aotc") and b["kernels"] == 3
    assert b["origin"] == "entry point acme-attn.kernels = acme_attn_kernels:bundle_path (acme-attn.kernels 1.2.0)"


# ---- discovery in this process (a dist-info directory on sys.path) ----------------------------------------
def fake_dist(root: Path, name: str, value: str, module_code: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{name} = {value}\n")
    if module_code is not None:
        (root / f"{name}_mod.py").write_text(module_code)
    return root


def test_entry_points_give_a_path_a_callable_or_a_list(tmp_path, tiny_bundle, monkeypatch):
    other = tmp_path / "other.aotc"
    other.write_bytes(tiny_bundle.read_bytes())
    fake_dist(tmp_path / "s1", "one", "one_mod:PATH", f"PATH = {str(tiny_bundle)!r}\n")
    fake_dist(tmp_path / "s2", "two", "two_mod:paths",
              f"def paths():\n    return [{str(other)!r}, {str(tiny_bundle)!r}]\n")
    monkeypatch.syspath_prepend(str(tmp_path / "s1"))
    monkeypatch.syspath_prepend(str(tmp_path / "s2"))
    found = installed_bundles()
    assert [(f.path, f.error) for f in found] == [(tiny_bundle, ""), (other, ""), (tiny_bundle, "")]
    assert found[0].origin == "entry point one = one_mod:PATH (one 1.0)"
    # discover_bundles: AOTC_BUNDLE_PATH first, one entry per file
    monkeypatch.setenv("AOTC_BUNDLE_PATH", str(other))
    assert [(f.path, f.origin.split(" =")[0]) for f in discover_bundles()] == [
        (other, "AOTC_BUNDLE_PATH"), (tiny_bundle, "entry point one")]
    from aotc.runtime import load

    rt = load(cache=False)
    assert rt.sources == [str(other), str(tiny_bundle)]


def test_a_broken_installed_bundle_is_an_error_naming_it(tmp_path, monkeypatch):
    fake_dist(tmp_path / "s", "broken", "no_such_module_here:bundle_path")
    monkeypatch.syspath_prepend(str(tmp_path / "s"))
    (f,) = installed_bundles()
    assert f.path is None and "ModuleNotFoundError" in f.error
    from aotc.runtime import load

    with pytest.raises(BundleError, match=r"entry point broken = no_such_module_here:bundle_path .*ModuleNotFound"):
        load()
    with pytest.raises(RuntimeLoadError, match="no kernels to load"):
        load(installed=False)
    r = subprocess.run([PYTHON, "-m", "aotc", "doctor"], env={**aotc_env(), "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path / "s")])},
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1 and "BAD None  [entry point broken" in r.stdout


def test_a_missing_file_from_an_entry_point(tmp_path, monkeypatch):
    fake_dist(tmp_path / "s", "gone", "gone_mod:P", f"P = {str(tmp_path / 'nope.aotc')!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "s"))
    (f,) = installed_bundles()
    assert f.error == f"{tmp_path / 'nope.aotc'}: no such file"


def test_no_argument_load_also_takes_the_cache(tmp_path, cache_dir, fake_artifact, tiny_bundle, monkeypatch):
    from aotc.storage.cache import Cache
    from aotc.runtime import load

    c = Cache()
    extra = fake_artifact("only-in-cache")
    c.fill(extra.key, extra.variant, lambda: extra)
    rt = load()
    assert [k.variant for ks in rt.kernels.values() for k in ks] == [extra.variant]
    assert rt.sources == [str(c.root)]
    with pytest.raises(RuntimeLoadError):
        load(cache=False)
    monkeypatch.setenv("AOTC_BUNDLE_PATH", str(tiny_bundle))
    rt = load()
    assert rt.sources == [str(tiny_bundle), str(c.root)]
    assert len([k for ks in rt.kernels.values() for k in ks]) == 4
    # explicit paths: only those, unless asked
    assert load(tiny_bundle).sources == [str(tiny_bundle)]
    assert load(tiny_bundle, cache=True).sources == [str(tiny_bundle), str(c.root)]
