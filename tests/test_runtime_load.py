"""aotc.runtime.load(): a bundle's directory and manifest are checked at load, each member's bytes when
its kernel is first loaded; a directory loads its bundles (issue 20, load part; issue 25 item 10)."""
from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

import aotc.runtime
from aotc.common.errors import BundleError, RuntimeLoadError
from aotc.runtime import driver
from aotc.storage.bundle import MANIFEST, write_bundle
from conftest import PYTHON, REPO, aotc_env

pytest.importorskip("cutlass")  # real cubins


@pytest.fixture
def bundle(tmp_path, real_artifacts) -> Path:
    p = tmp_path / "b.aotc"
    write_bundle(p, real_artifacts[:3])
    return p


def member_of(path: Path, art) -> str:
    with zipfile.ZipFile(path) as zf:
        m = json.loads(zf.read(MANIFEST))
    return next(e["member"] for e in m["artifacts"] if e["variant"] == art.variant.to_json())


def replace_member(src: Path, dst: Path, name: str, data: bytes) -> Path:
    """dst: src with one member's bytes replaced (the zip itself is valid; the manifest is untouched)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for zi in zin.infolist():
            zout.writestr(zi, data if zi.filename == name else zin.read(zi.filename))
    return dst


def test_load_reads_the_manifest_and_no_member(bundle, real_artifacts, monkeypatch):
    second = member_of(bundle, real_artifacts[1])
    opened = []
    real_open = zipfile.ZipFile.open

    def counting_open(self, name, *a, **kw):
        opened.append(name.filename if isinstance(name, zipfile.ZipInfo) else name)
        return real_open(self, name, *a, **kw)

    monkeypatch.setattr(zipfile.ZipFile, "open", counting_open)
    rt = aotc.runtime.load(bundle)
    assert opened == [MANIFEST]
    kernels = rt.kernels["sdpa_combine"]
    assert len(kernels) == 3 and all(k.artifact.cubin == b"" for k in kernels)
    k = next(k for k in kernels if k.variant == real_artifacts[1].variant)
    art = k.verified_artifact()  # what ensure_loaded does before anything reaches the driver
    assert opened == [MANIFEST, second]
    assert art.cubin == real_artifacts[1].cubin and k.artifact is art


def flip_compressed_byte(src: Path, dst: Path, name: str) -> Path:
    """dst: src with one byte of a member's deflated data flipped (its CRC no longer matches)."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        zi = zf.getinfo(name)
    name_len, extra_len = int.from_bytes(data[zi.header_offset + 26:zi.header_offset + 28], "little"), \
        int.from_bytes(data[zi.header_offset + 28:zi.header_offset + 30], "little")
    data[zi.header_offset + 30 + name_len + extra_len + zi.compress_size // 2] ^= 0x55
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("damage", ["another-cubin-of-the-same-size", "not-a-cubin", "flipped-deflate-byte"])
def test_a_bad_member_is_refused_at_first_use_naming_it_and_nothing_replaces_it(bundle, tmp_path, real_artifacts,
                                                                                monkeypatch, damage):
    target, same_size = real_artifacts[0], real_artifacts[2]  # D128 and D256 combine cubins: one size
    name = member_of(bundle, target)
    assert target.size == same_size.size
    if damage == "flipped-deflate-byte":
        bad = flip_compressed_byte(bundle, tmp_path / "bad.aotc", name)
    else:
        data = same_size.cubin if damage == "another-cubin-of-the-same-size" else b"\x7fELF" + b"x" * (target.size - 4)
        bad = replace_member(bundle, tmp_path / "bad.aotc", name, data)
    rt = aotc.runtime.load(bad)  # the manifest and the zip's directory are fine
    # dispatch still picks the damaged kernel for its fields: it is refused, never silently swapped
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
    k = rt.select("sdpa_combine", 0, [dict(target.variant.fields)])
    assert k.variant == target.variant
    for _ in range(2):  # and again on the next use, without reading it a second time
        with pytest.raises(RuntimeLoadError) as e:
            k.ensure_loaded(0)
        assert name in str(e.value) and str(bad) in str(e.value) and e.value.hint
    assert not k.loaded
    for ok in rt.kernels["sdpa_combine"]:
        if ok is not k:
            assert ok.verified_artifact().cubin in (real_artifacts[1].cubin, real_artifacts[2].cubin)


def test_a_bundle_replaced_on_disk_after_load_is_checked_against_what_was_loaded(bundle, tmp_path, real_artifacts):
    rt = aotc.runtime.load(bundle)
    write_bundle(bundle, [real_artifacts[0], real_artifacts[3]])  # another bundle under the same name
    k = next(k for k in rt.kernels["sdpa_combine"] if k.variant == real_artifacts[1].variant)
    with pytest.raises(RuntimeLoadError, match="no longer in the bundle file|not hold|manifest"):
        k.ensure_loaded(0)


def test_load_does_not_import_the_driver_bindings(bundle):
    code = ("import sys, aotc.runtime\n"
            f"rt = aotc.runtime.load({str(bundle)!r})\n"
            "print(len(rt.kernels['sdpa_combine']), 'cuda.bindings.driver' in sys.modules)")
    r = subprocess.run([PYTHON, "-c", code], cwd=REPO, env=aotc_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "False"]


def test_load_of_a_directory_loads_its_bundles_in_name_order(tmp_path, real_artifacts):
    d = tmp_path / "bundles"
    d.mkdir()
    write_bundle(d / "b.aotc", real_artifacts[1:3])
    write_bundle(d / "a.aotc", real_artifacts[:1])
    (d / "notes.txt").write_text("not a bundle")
    rt = aotc.runtime.load(d)
    assert rt.sources == [str(d / "a.aotc"), str(d / "b.aotc")]
    names = sorted(k.variant.name for k in rt.kernels["sdpa_combine"])
    assert names == sorted(a.variant.name for a in real_artifacts[:3])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BundleError, match=f"bundle directory {empty}: holds no"):
        aotc.runtime.load(empty)


def test_loading_and_reading_members_leaves_no_file_open(bundle):
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    for _ in range(20):
        for k in aotc.runtime.load(bundle).kernels["sdpa_combine"]:
            k.verified_artifact()
    assert open_fds() == before
