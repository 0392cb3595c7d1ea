"""`aotc bundle diff`: member-by-member comparison of two bundles by variant name."""
from __future__ import annotations

import dataclasses
import json

import pytest

from aotc.cli import main
from aotc.common.abi import Param
from aotc.common.artifact import sha256_hex
from aotc.common.keys import key_from_parts
from aotc.storage.bundle import write_bundle
from aotc.storage.bundle_diff import diff_bundles


def _with_cubin(art, data: bytes):
    return dataclasses.replace(art, cubin=data, sha256=sha256_hex(data))


def _from_other_sources(art, **changes):
    """art as another version of its family's sources would have built it: its recorded key parts name
    other sources and its key follows, so readers do not hold it to this aotc's family rules."""
    parts = {**art.info["key_parts"], "family_source": "1" * 64}
    art = dataclasses.replace(art, **changes, info={**art.info, "key_parts": parts})
    return dataclasses.replace(art, key=key_from_parts(art.variant, parts))


@pytest.fixture
def base(tmp_path, real_artifacts):
    path = tmp_path / "a.aotc"
    write_bundle(path, real_artifacts)
    return path


def test_identical_bundles_exit_0(base, tmp_path, real_artifacts, capsys):
    other = tmp_path / "b.aotc"
    write_bundle(other, real_artifacts)
    assert main(["bundle", "diff", str(base), str(other)]) == 0
    out = capsys.readouterr().out
    assert f"{len(real_artifacts)} identical, 0 changed, 0 only in A, 0 only in B" in out


def test_new_keys_alone_are_not_a_difference(base, tmp_path, real_artifacts, capsys):
    """Moving a source file changes every cache key but no cubin: diff says so and exits 0."""
    other = tmp_path / "b.aotc"
    write_bundle(other, [_from_other_sources(a) for a in real_artifacts])
    d = diff_bundles(base, other)
    assert d.same and d.keys_differ == len(real_artifacts)
    assert main(["bundle", "diff", str(base), str(other)]) == 0
    assert f"cache keys differ for {len(real_artifacts)}" in capsys.readouterr().out


def test_every_kind_of_difference_is_named(base, tmp_path, real_artifacts, capsys):
    first, second, *rest = real_artifacts
    changed_cubin = _with_cubin(first, first.cubin + b"\0extra")
    changed_launch = _from_other_sources(second, launch=dataclasses.replace(
        second.launch, dynamic_smem=second.launch.dynamic_smem + 1024,
        extra={**second.launch.extra, "block_m": 999}))
    other = tmp_path / "b.aotc"
    write_bundle(other, [changed_cubin, changed_launch])  # the rest: only in A
    assert main(["bundle", "diff", str(base), str(other), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["same"]
    assert set(report["changed"]) == {first.variant.name, second.variant.name}
    cub = report["changed"][first.variant.name]
    assert cub["sha256"] == [first.sha256, changed_cubin.sha256]
    assert cub["size"] == [first.size, first.size + 6]
    assert cub["machine_code"] == ["identical", "identical"]  # bytes appended past the ELF: same code
    lau = report["changed"][second.variant.name]
    assert lau["launch.dynamic_smem"] == [second.launch.dynamic_smem, second.launch.dynamic_smem + 1024]
    assert lau["launch.extra.block_m"] == [second.launch.extra.get("block_m"), 999]
    assert "sha256" not in lau
    assert report["only_a"] == sorted(a.variant.name for a in rest)
    assert report["only_b"] == []
    # and the text form names the same things
    assert main(["bundle", "diff", str(other), str(base)]) == 1
    text = capsys.readouterr().out
    assert f"changed {second.variant.name}:" in text and "launch.dynamic_smem" in text
    assert all(f"only in B: {a.variant.name}" in text for a in rest)


def test_abi_differences(base, tmp_path, real_artifacts):
    first = real_artifacts[0]
    n = len(first.abi.params)
    # the cubin's parameter table fixes offsets and sizes; another source may still name and type them apart
    abi = dataclasses.replace(first.abi, params=first.abi.params[:-1] + (Param("lse_stride_q", "ptr"),))
    other = tmp_path / "b.aotc"
    write_bundle(other, [_from_other_sources(first, abi=abi), *real_artifacts[1:]])
    d = diff_bundles(base, other).changed[first.variant.name]
    assert set(d) == {"abi.params"}
    assert d["abi.params"][0].startswith(f"{n} params, #{n - 1} ") and "lse_stride_s" in d["abi.params"][0]
    assert d["abi.params"][1].startswith(f"{n} params, #{n - 1} ") and "lse_stride_q" in d["abi.params"][1]


def test_a_bad_bundle_is_a_bundle_error(base, tmp_path, capsys):
    bad = tmp_path / "bad.aotc"
    bad.write_bytes(b"not a zip")
    assert main(["bundle", "diff", str(base), str(bad)]) == 7
    assert "not a readable zip file" in capsys.readouterr().err


def test_machine_code_digest_tells_renames_from_code_changes(real_artifacts):
    """Two different real kernels have different machine code; one cubin with a renamed symbol has the same."""
    from aotc.common import cubin
    from aotc.storage.bundle_diff import machine_code

    a, b = real_artifacts[0], real_artifacts[1]
    assert machine_code(a) != machine_code(b)
    sym = a.abi.symbol.encode()
    renamed_bytes = a.cubin.replace(sym, sym[:-1] + (b"X" if sym[-1:] != b"X" else b"Y"))
    assert renamed_bytes != a.cubin
    renamed = _with_cubin(a, renamed_bytes)
    assert list(cubin.parse(renamed.cubin).kernels) != list(cubin.parse(a.cubin).kernels)
    assert machine_code(renamed) == machine_code(a)


def test_a_bundle_made_before_keys_recorded_their_parts_is_diffed_but_not_served(tmp_path, real_artifacts, capsys,
                                                                                 monkeypatch):
    """Bundles from an earlier aotc record no key parts and carry keys of other sources: the key check
    refuses to serve them here (the DSL is installed, so the key could have been recomputed), while
    `aotc bundle diff` reads them to say what a change did to the default bundle."""
    from aotc.common.errors import BundleError, RuntimeLoadError
    from aotc.runtime import driver, load
    from aotc.storage.bundle import read_bundle

    old = [dataclasses.replace(a, key=sha256_hex(b"earlier sources " + a.variant.name.encode()),
                               info={k: v for k, v in a.info.items() if k != "key_parts"}) for a in real_artifacts]
    path_old, path_new = tmp_path / "old.aotc", tmp_path / "new.aotc"
    write_bundle(path_old, old)
    write_bundle(path_new, real_artifacts)
    with pytest.raises(BundleError, match="is not the key this aotc computes"):
        read_bundle(path_old)
    # load() checks the structure only; a kernel's key is refused when dispatch first picks it
    rt = load(path_old)
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
    for k in rt.kernels["sdpa_combine"]:
        with pytest.raises(RuntimeLoadError, match="is not the key this aotc computes"):
            rt.select("sdpa_combine", 0, [dict(k.variant.fields)])
    assert [a.variant for a in read_bundle(path_old, other_sources=True).artifacts] == \
        sorted((a.variant for a in real_artifacts), key=lambda v: v.name)
    assert main(["bundle", "diff", str(path_old), str(path_new)]) == 0  # same kernels; only the keys differ
    assert f"{len(real_artifacts)} identical" in capsys.readouterr().out


def test_a_field_the_family_gained_since_pairs_the_old_kernels_with_the_new(tmp_path, real_artifacts, monkeypatch,
                                                                           capsys):
    """A bundle written before its family gained a defaulted field (the score features: off) still reads,
    and diff pairs each old kernel with the one now named with the field at its default."""
    from aotc import families
    from aotc.common import checks
    from aotc.common.variant import Variant

    fam = families.get_family("sdpa_combine")
    gained = dataclasses.replace(fam, fields=fam.fields + (families.Field("extra", (False, True), "a new field",
                                                                          unlisted=(False,)),))
    monkeypatch.setitem(families._FAMILIES, "sdpa_combine", gained)
    checks._choices.cache_clear()
    monkeypatch.setattr(checks, "_choices", checks._choices.__wrapped__)  # no stale choices after the test
    old = tmp_path / "old.aotc"
    write_bundle(old, real_artifacts)
    renamed = [_from_other_sources(a, variant=Variant.make(a.variant.family, a.variant.arch,
                                                           **dict(a.variant.fields), extra=False))
               for a in real_artifacts]
    new = tmp_path / "new.aotc"
    write_bundle(new, renamed)
    d = diff_bundles(old, new)
    assert d.same and not d.only_a and not d.only_b and len(d.identical) == len(real_artifacts)
    assert all(".extra=0" in n for n in d.identical)
    # a field without a single default may not be missing
    with pytest.raises(checks.Refused, match="missing"):
        checks.check_variant(Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, extra=False))
    assert main(["bundle", "diff", str(old), str(new)]) == 0
    capsys.readouterr()
