"""Bundles: create, verify, inspect, merge, install, and refusing hostile or corrupt files."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import stat
import struct
import warnings
import zipfile
from pathlib import Path

import pytest

import aotc
from aotc.storage.bundle import (FORMAT_VERSION, MANIFEST, member_name, merge_bundles, read_bundle, verify_bundle,
                         write_bundle)
from aotc.storage.cache import Cache
from aotc.cli import main
from aotc.common.errors import BundleError, CacheError, VersionSkewError
from aotc.common.variant import Variant
from aotc.families.sdpa_combine import params as combine_params
from aotc.build.spec import load_spec
from conftest import run_aotc, tree


# ---- helpers ----------------------------------------------------------------

def zinfo(name: str, mode: int = stat.S_IFREG | 0o644) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.external_attr = mode << 16
    return zi


def write_zip(path: Path, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point of some tests
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for zi, data in members:
                zf.writestr(zinfo(zi) if isinstance(zi, str) else zi, data)
    return path


def contents(path: Path) -> tuple[dict, dict[str, bytes]]:
    """(manifest, {member: bytes}) of a bundle, read raw."""
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read(MANIFEST))
        return manifest, {n: zf.read(n) for n in zf.namelist() if n != MANIFEST}


def rewrite(src: Path, dst: Path, *, manifest=None, members=None, extra=()) -> Path:
    """Write dst as src with the manifest and/or members replaced, plus extra (ZipInfo|name, bytes) members."""
    m, mem = contents(src)
    m = m if manifest is None else manifest
    mem = mem if members is None else members
    return write_zip(dst, [(MANIFEST, json.dumps(m).encode()), *mem.items(), *extra])


def summary(path: Path) -> dict[str, str]:
    """member -> sha256, as the manifest records them."""
    m, _ = contents(path)
    return {a["member"]: a["sha256"] for a in m["artifacts"]}


@pytest.fixture
def good_bundle(tmp_path, real_artifacts) -> Path:
    """A valid bundle of the three sm_90a real artifacts."""
    p = tmp_path / "good.aotc"
    write_bundle(p, real_artifacts[:3])
    return p


def halves(tiny_spec: Path, tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "half-a.toml", tmp_path / "half-b.toml"
    text = tiny_spec.read_text()
    a.write_text(text.replace('dtype = ["bf16", "fp16"]', 'dtype = "bf16"'))
    b.write_text(text.replace('dtype = ["bf16", "fp16"]', 'dtype = "fp16"'))
    return a, b


def build_bundle(spec: Path, out: Path, capsys) -> dict:
    assert main(["build", str(spec), "--bundle", str(out), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ---- the happy path -------------------------------------------------------------

def test_build_bundle_verify_inspect(cache_dir, tiny_spec, tmp_path, capsys):
    out = tmp_path / "dist" / "tiny.aotc"
    report = build_bundle(tiny_spec, out, capsys)
    assert report["bundle"] == str(out)
    assert [p.name for p in out.parent.iterdir()] == ["tiny.aotc"]  # no temp file left next to it
    variants = load_spec(tiny_spec).variants

    assert main(["bundle", "verify", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: ok"
    assert verify_bundle(out) == []

    assert main(["bundle", "inspect", str(out), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["format"] == "aotc-bundle" and m["format_version"] == FORMAT_VERSION
    assert m["producer"]["aotc"] == aotc.__version__
    assert any(k.startswith("nvidia-cutlass-dsl") for k in m["producer"])
    assert sorted(a["member"] for a in m["artifacts"]) == sorted(f"kernels/{v.name}.cubin" for v in variants)
    keys = {r["name"]: r["key"] for r in report["variants"]}
    for a in m["artifacts"]:
        assert a["key"] == keys[a["member"][len("kernels/"):-len(".cubin")]]
        assert [q["name"] for q in a["abi"]["params"]] == [q.name for q in combine_params(Variant.from_json(a["variant"]))]
        assert a["launch"]["block"] == [128, 1, 1]

    assert main(["bundle", "inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "4 kernels" in text
    for v in variants:
        assert v.name in text

    b = read_bundle(out)
    cache = Cache()
    assert sorted(b.artifacts, key=lambda a: a.variant) == sorted(
        (cache.load(k, count=False) for k in cache.keys()), key=lambda a: a.variant)


def test_write_read_round_trip(good_bundle, real_artifacts):
    b = read_bundle(good_bundle)
    assert sorted(b.artifacts, key=lambda a: a.variant) == sorted(real_artifacts[:3], key=lambda a: a.variant)
    _, members = contents(good_bundle)
    assert sorted(members) == sorted(member_name(a) for a in real_artifacts[:3])


def test_bundle_create_from_cache(cache_dir, tiny_spec, tmp_path, capsys):
    out = tmp_path / "c.aotc"
    assert main(["bundle", "create", str(out), "--spec", str(tiny_spec)]) == 5  # nothing built yet
    assert "4 variant(s) missing" in capsys.readouterr().err
    assert not out.exists()
    build_bundle(tiny_spec, tmp_path / "b.aotc", capsys)
    assert main(["bundle", "create", str(out), "--spec", str(tiny_spec)]) == 0
    assert "(4 kernels)" in capsys.readouterr().out
    assert summary(out) == summary(tmp_path / "b.aotc")


# ---- corruption -------------------------------------------------------------

def test_flipped_member_byte_fails_verify(good_bundle, tmp_path, capsys):
    m, members = contents(good_bundle)
    victim = sorted(members)[1]
    data = bytearray(members[victim])
    data[len(data) // 3] ^= 0x01
    bad = rewrite(good_bundle, tmp_path / "bad.aotc", members={**members, victim: bytes(data)})
    assert main(["bundle", "verify", str(good_bundle), str(bad)]) == 7
    cap = capsys.readouterr()
    assert f"{good_bundle}: ok" in cap.out
    assert victim in cap.err and "sha256" in cap.err
    (problem,) = verify_bundle(bad)
    assert victim in problem
    with pytest.raises(BundleError, match=re.escape(victim)):
        read_bundle(bad)
    r = run_aotc("bundle", "verify", str(bad))
    assert r.returncode == 7 and victim in r.stderr


# ---- hostile bundles ----------------------------------------------------------

def _member_name_attack(name):
    def make(good, dst, arts):
        return rewrite(good, dst, extra=[(name, arts[0].cubin)])
    return make


def _symlink(good, dst, arts):
    return rewrite(good, dst, extra=[(zinfo("kernels/link.cubin", stat.S_IFLNK | 0o777), b"/etc/passwd")])


def _duplicate(good, dst, arts):
    m, members = contents(good)
    name = sorted(members)[0]
    return rewrite(good, dst, extra=[(name, arts[3].cubin)])


def _manifest_size_lies(good, dst, arts):
    m, _ = contents(good)
    m["artifacts"][0]["size"] += 8
    return rewrite(good, dst, manifest=m)


def _manifest_size_lies_small(good, dst, arts):
    m, _ = contents(good)
    m["artifacts"][0]["size"] -= 8
    return rewrite(good, dst, manifest=m)


def _manifest_sha_lies(good, dst, arts):
    m, _ = contents(good)
    m["artifacts"][1]["sha256"] = "0" * 64
    return rewrite(good, dst, manifest=m)


def _wrong_arch(good, dst, arts):
    """An sm_80 cubin under an sm_90a variant, with a manifest whose size and sha256 are the sm_80 cubin's."""
    sm90, sm80 = arts[0], arts[3]
    fake = dataclasses.replace(sm80, variant=sm90.variant, key=sm90.key)
    return write_zip(dst, [(MANIFEST, json.dumps({
        "format": "aotc-bundle", "format_version": FORMAT_VERSION, "producer": {"aotc": aotc.__version__},
        "artifacts": [{"member": member_name(fake), **fake.header()}]}).encode()),
        (member_name(fake), fake.cubin)])


def _not_a_cubin(good, dst, arts):
    m, members = contents(good)
    name = m["artifacts"][0]["member"]
    data = b"definitely not ELF" * 10
    m["artifacts"][0].update(size=len(data), sha256=__import__("hashlib").sha256(data).hexdigest())
    return rewrite(good, dst, manifest=m, members={**members, name: data})


def _no_manifest(good, dst, arts):
    _, members = contents(good)
    return write_zip(dst, list(members.items()))


def _manifest_not_json(good, dst, arts):
    _, members = contents(good)
    return write_zip(dst, [(MANIFEST, b"{nope"), *members.items()])


def _manifest_not_ours(good, dst, arts):
    m, _ = contents(good)
    m["format"] = "something-else"
    return rewrite(good, dst, manifest=m)


def _missing_member(good, dst, arts):
    m, members = contents(good)
    del members[m["artifacts"][2]["member"]]
    return rewrite(good, dst, members=members)


def _unlisted_member(good, dst, arts):
    return rewrite(good, dst, extra=[("kernels/stowaway.cubin", arts[0].cubin)])


def _listed_twice(good, dst, arts):
    m, _ = contents(good)
    m["artifacts"].append(dict(m["artifacts"][0]))
    return rewrite(good, dst, manifest=m)


def _not_a_zip(good, dst, arts):
    dst.write_bytes(b"PK\x03\x04 but not really a zip" * 4)
    return dst


def _truncated_zip(good, dst, arts):
    data = good.read_bytes()
    dst.write_bytes(data[: len(data) - 30])
    return dst


def _lying_central_directory(good, dst, arts):
    """A member whose central directory declares fewer bytes than the deflated stream holds (a sneaky bomb)."""
    m, members = contents(good)
    entry = m["artifacts"][0]
    name = entry["member"]
    bomb = members[name] + bytes(4 << 20)  # 4 MiB of zeros after the real cubin
    raw = io.BytesIO()
    write_zip(raw, [(MANIFEST, json.dumps(m).encode()), *{**members, name: bomb}.items()])
    data = bytearray(raw.getvalue())
    # patch this member's uncompressed size in the central directory to what the manifest says
    pos = data.index(b"PK\x01\x02")
    while True:
        n = struct.unpack_from("<H", data, pos + 28)[0]
        if data[pos + 46: pos + 46 + n].decode() == name:
            struct.pack_into("<I", data, pos + 24, entry["size"])
            break
        pos = data.index(b"PK\x01\x02", pos + 46)
    dst.write_bytes(bytes(data))
    return dst


HOSTILE = {
    "dotdot": (_member_name_attack("../evil.cubin"), BundleError, ["'../evil.cubin'", "'..'"]),
    "nested-dotdot": (_member_name_attack("kernels/../../evil.cubin"), BundleError, ["'..'"]),
    "absolute": (_member_name_attack("/abs.cubin"), BundleError, ["'/abs.cubin'", "absolute path"]),
    "drive": (_member_name_attack("C:/x.cubin"), BundleError, ["absolute path"]),
    "backslash": (_member_name_attack("kernels\\..\\x.cubin"), BundleError, ["backslash"]),
    "symlink": (_symlink, BundleError, ["'kernels/link.cubin'", "symbolic link"]),
    "duplicate": (_duplicate, BundleError, ["appears more than once"]),
    "size-lies": (_manifest_size_lies, BundleError, ["the manifest says", "bytes"]),
    "size-lies-small": (_manifest_size_lies_small, BundleError, ["the manifest says", "bytes"]),
    "sha-lies": (_manifest_sha_lies, BundleError, ["does not match the manifest", "sha256"]),
    "wrong-arch": (_wrong_arch, BundleError, ["is a cubin for sm_80, but the manifest says sm_90a"]),
    "not-a-cubin": (_not_a_cubin, BundleError, ["not a valid cubin"]),
    "no-manifest": (_no_manifest, BundleError, ["no manifest.json"]),
    "manifest-not-json": (_manifest_not_json, BundleError, ["manifest.json unreadable"]),
    "manifest-not-ours": (_manifest_not_ours, BundleError, ["not an aotc bundle manifest"]),
    "missing-member": (_missing_member, BundleError, ["which the zip does not hold"]),
    "unlisted-member": (_unlisted_member, BundleError, ["not described by the manifest", "stowaway"]),
    "listed-twice": (_listed_twice, BundleError, ["listed twice"]),
    "not-a-zip": (_not_a_zip, BundleError, ["not a readable zip"]),
    "truncated-zip": (_truncated_zip, BundleError, ["not a readable zip"]),
    "lying-central-directory": (_lying_central_directory, BundleError, ["is corrupt", "CRC"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_bundle_is_refused_and_nothing_is_written(case, good_bundle, tmp_path, real_artifacts, cache_dir,
                                                          monkeypatch):
    make, error, needles = HOSTILE[case]
    bad = make(good_bundle, tmp_path / f"{case}.aotc", real_artifacts)
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(error) as ei:
        read_bundle(bad)
    msg = str(ei.value)
    assert str(bad) in msg
    for needle in needles:
        assert needle in msg, msg
    if case in ("not-a-zip", "truncated-zip"):
        with pytest.raises(BundleError):
            verify_bundle(bad)
    else:
        assert any(all(n in f"bundle {bad}: {p}" for n in needles) for p in verify_bundle(bad))
    assert tree(tmp_path) == before
    assert not (tmp_path.parent / "evil.cubin").exists() and not Path("/abs.cubin").exists()
    # the CLI refuses it too, with the bundle exit code, and installs nothing
    assert main(["bundle", "install", str(bad)]) == 7
    assert Cache().keys() == []


def test_oversized_member_is_refused_before_inflating(good_bundle, tmp_path, monkeypatch):
    bomb = rewrite(good_bundle, tmp_path / "bomb.aotc", extra=[("kernels/zeros.cubin", bytes(8 << 20))])
    assert bomb.stat().st_size < 200_000
    monkeypatch.setenv("AOTC_BUNDLE_MAX_MEMBER_BYTES", str(1 << 20))
    with pytest.raises(BundleError) as ei:
        read_bundle(bomb)
    assert "'kernels/zeros.cubin' declares 8388608 bytes, over the limit of 1048576" in str(ei.value)
    assert "AOTC_BUNDLE_MAX_MEMBER_BYTES" in str(ei.value)
    # the real cubins are small enough: a limit just above them accepts the good bundle
    biggest = max(len(b) for b in contents(good_bundle)[1].values())
    monkeypatch.setenv("AOTC_BUNDLE_MAX_MEMBER_BYTES", str(biggest))
    assert len(read_bundle(good_bundle).artifacts) == 3
    monkeypatch.setenv("AOTC_BUNDLE_MAX_MEMBER_BYTES", str(biggest - 1))
    with pytest.raises(BundleError, match="over the limit"):
        read_bundle(good_bundle)


def test_total_size_limit(good_bundle, monkeypatch):
    total = sum(len(b) for b in contents(good_bundle)[1].values())
    monkeypatch.setenv("AOTC_BUNDLE_MAX_BYTES", str(total))
    with pytest.raises(BundleError, match=r"in all, over the limit of .*AOTC_BUNDLE_MAX_BYTES"):
        read_bundle(good_bundle)  # the manifest counts too
    monkeypatch.setenv("AOTC_BUNDLE_MAX_BYTES", str(10 * total))
    assert len(read_bundle(good_bundle).artifacts) == 3


def test_unknown_format_version(good_bundle, tmp_path, capsys):
    m, _ = contents(good_bundle)
    m["format_version"] = FORMAT_VERSION + 1
    m["producer"]["aotc"] = "9.9.9"
    future = rewrite(good_bundle, tmp_path / "future.aotc", manifest=m)
    before = tree(tmp_path)
    with pytest.raises(VersionSkewError) as ei:
        read_bundle(future)
    msg = str(ei.value)
    assert f"format version {FORMAT_VERSION + 1}" in msg
    assert "aotc 9.9.9" in msg
    assert f"aotc ({aotc.__version__}) reads format version {FORMAT_VERSION}" in msg
    assert "aotc 9.9.9" in ei.value.hint
    assert tree(tmp_path) == before
    assert main(["bundle", "verify", str(future)]) == 8
    assert "9.9.9" in capsys.readouterr().err


def test_missing_bundle_file(tmp_path):
    with pytest.raises(BundleError, match="no such file"):
        read_bundle(tmp_path / "nope.aotc")


def test_arch_check_can_be_skipped(tmp_path, good_bundle, real_artifacts):
    bad = _wrong_arch(good_bundle, tmp_path / "arch.aotc", real_artifacts)
    (art,) = read_bundle(bad, check_arch=False).artifacts
    assert art.variant.arch == "sm_90a" and art.cubin == real_artifacts[3].cubin


def test_bad_key_in_bundle_cannot_escape_the_cache(tmp_path, cache_dir, real_artifacts, capsys):
    art = dataclasses.replace(real_artifacts[0], key="../../../../escape")
    p = tmp_path / "escape.aotc"
    write_bundle(p, [art])
    assert main(["bundle", "install", str(p)]) == 7  # refused as a bad bundle before the cache sees the key
    assert "not a cache key" in capsys.readouterr().err
    assert not any(x.name in ("escape", "kernel.cubin", "meta.json") for x in tmp_path.rglob("*"))


# ---- merge ------------------------------------------------------------------

def test_merge_of_halves_equals_the_whole(cache_dir, tiny_spec, tmp_path, capsys):
    a, b = halves(tiny_spec, tmp_path)
    build_bundle(a, tmp_path / "a.aotc", capsys)
    build_bundle(b, tmp_path / "b.aotc", capsys)
    build_bundle(tiny_spec, tmp_path / "whole.aotc", capsys)
    assert len(summary(tmp_path / "a.aotc")) == len(summary(tmp_path / "b.aotc")) == 2
    assert main(["bundle", "merge", str(tmp_path / "merged.aotc"), str(tmp_path / "a.aotc"),
                 str(tmp_path / "b.aotc")]) == 0
    assert "(4 kernels from 2 bundles)" in capsys.readouterr().out
    assert summary(tmp_path / "merged.aotc") == summary(tmp_path / "whole.aotc")
    assert verify_bundle(tmp_path / "merged.aotc") == []
    # merging overlapping bundles is idempotent
    merge_bundles([tmp_path / "whole.aotc", tmp_path / "a.aotc", tmp_path / "merged.aotc"], tmp_path / "m2.aotc")
    assert summary(tmp_path / "m2.aotc") == summary(tmp_path / "whole.aotc")


def test_merge_of_conflicting_artifacts_errors(tmp_path, real_artifacts, capsys):
    a = real_artifacts[0]
    # the same variant with other machine code (its cubin with a byte more: still a valid cubin)
    other = dataclasses.replace(a, cubin=a.cubin + b"\0", sha256=hashlib.sha256(a.cubin + b"\0").hexdigest())
    write_bundle(tmp_path / "x.aotc", [a])
    write_bundle(tmp_path / "y.aotc", [other])
    with pytest.raises(BundleError, match=rf"{a.variant.name} differs between bundles .* in {tmp_path / 'y.aotc'}"):
        merge_bundles([tmp_path / "x.aotc", tmp_path / "y.aotc"], tmp_path / "out.aotc")
    assert main(["bundle", "merge", str(tmp_path / "out.aotc"), str(tmp_path / "x.aotc"),
                 str(tmp_path / "y.aotc")]) == 7
    assert "differs between bundles" in capsys.readouterr().err
    assert not (tmp_path / "out.aotc").exists()


def test_write_bundle_refuses_one_variant_under_two_keys(tmp_path, real_artifacts):
    a = real_artifacts[0]
    b = dataclasses.replace(a, key="f" * 64)
    with pytest.raises(BundleError, match="same variant with different keys"):
        write_bundle(tmp_path / "x.aotc", [a, b])
    assert not (tmp_path / "x.aotc").exists()


# ---- install ----------------------------------------------------------------

def test_install_then_offline_build_is_all_hits(tiny_spec, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "builder-cache"))
    out = tmp_path / "tiny.aotc"
    build_bundle(tiny_spec, out, capsys)

    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "fresh-cache"))
    assert Cache().keys() == []
    assert main(["bundle", "install", str(out)]) == 0
    assert "installed 4 new kernels" in capsys.readouterr().out
    assert main(["bundle", "install", str(out)]) == 0
    assert "installed 0 new kernels" in capsys.readouterr().out
    assert len(Cache().keys()) == 4 and Cache().verify() == []

    r = run_aotc("build", str(tiny_spec), "--json", AOTC_NO_COMPILE="1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == {"hit": 4, "compiled": 0, "bypassed": 0, "failed": 0}


def test_install_repairs_a_corrupt_entry(tiny_spec, tmp_path, monkeypatch, capsys, cache_dir):
    out = tmp_path / "tiny.aotc"
    build_bundle(tiny_spec, out, capsys)
    c = Cache(lock_timeout=5)
    key = c.keys()[0]
    cubin = c.entry_dir(key) / "kernel.cubin"
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0xFF
    cubin.write_bytes(bytes(data))
    assert main(["bundle", "install", str(out)]) == 0
    assert "installed 1 new kernels" in capsys.readouterr().out
    assert c.verify() == []
    assert c.stats()["invalid"] == 1


# ---- install: version skew and mislabelled entries ---------------------------

def test_install_refuses_a_bundle_from_other_versions(tmp_path, cache_dir, real_artifacts, monkeypatch, capsys):
    p = tmp_path / "b.aotc"
    write_bundle(p, real_artifacts[:1])
    import aotc.build.compile
    import aotc.common.versions

    monkeypatch.setattr(aotc.build.compile, "dsl_versions", lambda: {"nvidia-cutlass-dsl": "9.9.9"})
    monkeypatch.setattr(aotc.common.versions, "dsl_versions", lambda: {"nvidia-cutlass-dsl": "9.9.9"})
    assert main(["bundle", "install", str(p)]) == 8
    err = capsys.readouterr().err
    assert "nvidia-cutlass-dsl 4.8.1" in err and "nvidia-cutlass-dsl 9.9.9" in err and "rebuild" in err
    from aotc.storage.cache import Cache

    assert Cache().keys() == []


def test_entry_holding_another_variant_is_invalid(cache, real_artifacts):
    a, b = real_artifacts[0], real_artifacts[1]
    forged = dataclasses.replace(b, key=a.key)  # b's cubin and header filed under a's key
    with cache.locked(a.key), pytest.raises(CacheError, match="is not the key of"):
        cache.commit(forged)  # never written by aotc; planted by hand below
    d = cache.entry_dir(a.key)
    d.mkdir(parents=True)
    (d / "kernel.cubin").write_bytes(forged.cubin)
    (d / "meta.json").write_text(json.dumps(forged.header()))
    assert cache.load(a.key, a.variant) is None
    assert cache.stats()["invalid"] == 1
    art, created = cache.get_or_create(a.key, a.variant, lambda: a)
    assert created and art.variant == a.variant
