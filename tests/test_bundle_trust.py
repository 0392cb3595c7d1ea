"""Bundle manifests that lie are refused by `bundle verify`, read_bundle and aotc.runtime.load(), and
merges refuse what would be ambiguous (issue 25 item 3; item 8 for manifests)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

import aotc.runtime
from aotc.cli import main
from aotc.common.errors import BundleError, RuntimeLoadError
from aotc.runtime import driver
from aotc.storage.bundle import MANIFEST, merge_bundles, read_bundle, verify_bundle, write_bundle
from aotc.storage.cache import Cache

pytest.importorskip("cutlass")  # real cubins


def contents(path: Path) -> tuple[dict, dict[str, bytes]]:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read(MANIFEST)), {n: zf.read(n) for n in zf.namelist() if n != MANIFEST}


def rewrite(src: Path, dst: Path, manifest: dict | str, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(MANIFEST, manifest if isinstance(manifest, str) else json.dumps(manifest))
        for n, data in members.items():
            zf.writestr(n, data)
    return dst


def entry_of(m: dict, art) -> dict:
    return next(e for e in m["artifacts"] if e["variant"] == art.variant.to_json())


@pytest.fixture(scope="module")
def prefill_sm90(tmp_path_factory):
    """An sm_90a sdpa_prefill_sm90 artifact (20 parameters), compiled once for this module."""
    from aotc.build.compile import compile_variant
    from aotc.common.variant import Variant

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUTE_DSL_NO_CACHE", "1")
        return compile_variant(Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=64,
                                            layout="dense", causal=False, block_n=128))


@pytest.fixture
def honest(tmp_path, real_artifacts) -> Path:
    p = tmp_path / "honest.aotc"
    write_bundle(p, real_artifacts[:3])
    return p


# each case: (honest bundle, real artifacts, prefill artifact, dst) -> bad bundle; then the text the refusal
# names and where the runtime refuses it: "load" (load() itself: the manifest's structure or a member's
# variant record), "select" (the member's header, when dispatch first selects its kernel) or "first load"
# (the bytes, when the kernel is first loaded); always before anything reaches the driver

def _relabelled_d256(src, arts, _pf, dst):
    """The D256 kernel labelled head_dim 128 (sha256 and size untouched: they are the D256 cubin's)."""
    m, mem = contents(src)
    e = entry_of(m, arts[2])
    e["variant"]["head_dim"] = 128
    return rewrite(src, dst, m, mem)


def _relabelled_d256_key_recomputed(src, arts, _pf, dst):
    """The same, with the key recomputed from the new label: the launch facts still say D256."""
    from aotc.common.keys import key_from_parts
    from aotc.common.variant import Variant

    m, mem = contents(src)
    e = entry_of(m, arts[2])
    e["variant"]["head_dim"] = 128
    e["key"] = key_from_parts(Variant.from_json(e["variant"]), e["info"]["key_parts"])
    return rewrite(src, dst, m, mem)


def _relabelled_d256_old_header(src, arts, _pf, dst):
    """The same in the header format from before key parts were recorded: the key is recomputed here."""
    m, mem = contents(src)
    for e in m["artifacts"]:
        e["info"].pop("key_parts", None)
    entry_of(m, arts[2])["variant"]["head_dim"] = 128
    return rewrite(src, dst, m, mem)


def _symbol_not_in_cubin(src, arts, _pf, dst):
    m, mem = contents(src)
    entry_of(m, arts[0])["abi"]["symbol"] = "kernel_that_is_not_there"
    return rewrite(src, dst, m, mem)


def _prefill_cubin_under_combine_entry(src, arts, pf, dst):
    """An sm_90a prefill cubin (20 parameters) under a combine entry (25), symbol, sha256 and size fixed up."""
    m, mem = contents(src)
    e = entry_of(m, arts[0])
    e.update(sha256=pf.sha256, size=pf.size)
    e["abi"]["symbol"] = pf.abi.symbol
    e["info"].pop("registers")
    mem[e["member"]] = pf.cubin
    return rewrite(src, dst, m, mem)


def _registers_of_another_cubin(src, arts, _pf, dst):
    m, mem = contents(src)
    entry_of(m, arts[0])["info"]["registers"] = 200
    return rewrite(src, dst, m, mem)


def _launch(**launch):
    def make(src, arts, _pf, dst):
        m, mem = contents(src)
        entry_of(m, arts[0])["launch"].update(launch)
        return rewrite(src, dst, m, mem)
    return make


def _zero_key(src, arts, _pf, dst):
    m, mem = contents(src)
    entry_of(m, arts[0])["key"] = "0" * 64
    return rewrite(src, dst, m, mem)


def _unknown_field(src, arts, _pf, dst):
    m, mem = contents(src)
    entry_of(m, arts[0])["variant"]["evil"] = "../../x"
    return rewrite(src, dst, m, mem)


def _list_field(src, arts, _pf, dst):
    m, mem = contents(src)
    entry_of(m, arts[0])["variant"]["head_dim"] = [128]
    return rewrite(src, dst, m, mem)


def _nested_manifest(src, arts, _pf, dst):
    _, mem = contents(src)
    return rewrite(src, dst, '{"format": "aotc-bundle", "format_version": 1, "artifacts": '
                   + "[" * 100000 + "]" * 100000 + "}", mem)


def _nested_info(src, arts, _pf, dst):
    m, mem = contents(src)
    entry_of(m, arts[0])["info"]["deep"] = json.loads("[" * 200 + "]" * 200)
    return rewrite(src, dst, m, mem)


LIES = {  # name: (tamper, needle, where the runtime refuses it)
    "relabelled-d256": (_relabelled_d256, "is not the key of", "select"),
    "relabelled-d256-key-recomputed": (_relabelled_d256_key_recomputed, "slices_per_cta", "select"),
    "relabelled-d256-old-header": (_relabelled_d256_old_header, "is not the key this aotc computes", "select"),
    "symbol-not-in-cubin": (_symbol_not_in_cubin, "is not in the cubin", "first load"),
    "prefill-cubin-under-combine-entry": (_prefill_cubin_under_combine_entry, "parameter table", "first load"),
    "registers-of-another-cubin": (_registers_of_another_cubin, "registers", "first load"),
    "block-4096x4096": (_launch(block=[4096, 4096, 1]), "beyond CUDA's limits", "select"),
    "dynamic-smem-1e9-float": (_launch(dynamic_smem=1e9), "expected an integer", "select"),
    "dynamic-smem-1e9": (_launch(dynamic_smem=10 ** 9), "shared memory per block", "select"),
    "key-000": (_zero_key, "is not the key of", "select"),
    "unknown-field": (_unknown_field, "unknown: ['evil']", "select"),
    "list-field": (_list_field, "expected a string, integer or boolean", "load"),
    "nested-manifest": (_nested_manifest, "nests too deeply", "load"),
    "nested-info": (_nested_info, "nests deeper than", "select"),
}


@pytest.mark.parametrize("case", sorted(LIES))
def test_a_lying_manifest_is_refused_everywhere(case, honest, tmp_path, real_artifacts, prefill_sm90, cache_dir,
                                               monkeypatch):
    tamper, needle, where = LIES[case]
    bad = tamper(honest, real_artifacts, prefill_sm90, tmp_path / f"{case}.aotc")
    problems = verify_bundle(bad)
    assert any(needle in p for p in problems), problems
    with pytest.raises(BundleError, match="bundle .*" + case) as e:
        read_bundle(bad)
    assert needle in str(e.value)
    assert main(["bundle", "install", str(bad)]) == 7 and Cache().keys() == []
    if where == "load":
        with pytest.raises(BundleError) as e:
            aotc.runtime.load(bad)
        assert needle in str(e.value)
        return
    rt = aotc.runtime.load(bad)  # the manifest's structure is fine
    if where == "select":
        # the member's header is refused when dispatch first picks its kernel, naming it; the others serve
        monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
        refused = []
        for k in list(rt.kernels["sdpa_combine"]):
            try:
                assert rt.select("sdpa_combine", 0, [dict(k.variant.fields)]) is k
            except RuntimeLoadError as e:
                refused.append((k, str(e)))
        ((bad_kernel, message),) = refused
        assert needle in message and bad_kernel.variant.name in message and "member 'kernels/" in message
        with pytest.raises(RuntimeLoadError, match="refusing"):  # and again, on every later use
            bad_kernel.ensure_loaded(0)
        assert not bad_kernel.loaded
        return
    # the header is consistent: the member is refused when first loaded, before the driver
    (bad_kernel,) = [k for k in rt.kernels["sdpa_combine"] if k.variant == real_artifacts[0].variant]
    with pytest.raises(RuntimeLoadError) as e:
        bad_kernel.ensure_loaded(0)
    assert needle in str(e.value) and bad_kernel.variant.name in str(e.value)


# ---- merges refuse what would be ambiguous --------------------------------------------------------

def test_write_bundle_refuses_two_variants_sharing_one_key(tmp_path, real_artifacts):
    a, b = real_artifacts[0], real_artifacts[1]
    with pytest.raises(BundleError, match="share the key"):
        write_bundle(tmp_path / "x.aotc", [a, dataclasses.replace(b, key=a.key)])
    assert not (tmp_path / "x.aotc").exists()


def test_merge_refuses_two_variants_sharing_one_key(tmp_path, real_artifacts, capsys):
    """Each input alone is readable (the second records its key as its own, not a cache key); together
    they would lose one kernel."""
    a, b = real_artifacts[0], real_artifacts[1]
    write_bundle(tmp_path / "x.aotc", [a])
    write_bundle(tmp_path / "y.aotc", [dataclasses.replace(b, key=a.key, info={**b.info, "key_parts": None})])
    assert len(read_bundle(tmp_path / "y.aotc").artifacts) == 1
    out, x, y = (str(tmp_path / n) for n in ("out.aotc", "x.aotc", "y.aotc"))
    assert main(["bundle", "merge", out, x, y]) == 7
    assert "share the key" in capsys.readouterr().err
    assert not (tmp_path / "out.aotc").exists()


def test_merge_refuses_one_cubin_with_conflicting_launch_facts(tmp_path, real_artifacts):
    """A cubin relabelled consistently (key, launch facts) passes alone; beside its true label it is
    one sha256 with two sets of launch facts."""
    from aotc.common.keys import key_from_parts
    from aotc.common.variant import Variant
    from aotc.families import get_family

    a = real_artifacts[0]
    v = Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=64, strides="packed")
    forged = dataclasses.replace(a, variant=v, key=key_from_parts(v, a.info["key_parts"]),
                                 launch=get_family("sdpa_combine").launch(v))
    write_bundle(tmp_path / "x.aotc", [a])
    write_bundle(tmp_path / "y.aotc", [forged])
    assert len(read_bundle(tmp_path / "y.aotc").artifacts) == 1
    with pytest.raises(BundleError, match="one cubin .* with different launch facts"):
        merge_bundles([tmp_path / "x.aotc", tmp_path / "y.aotc"], tmp_path / "out.aotc")
    assert not (tmp_path / "out.aotc").exists()


def test_a_bundle_whose_two_members_are_one_cubin_with_two_launch_facts_is_refused(tmp_path, honest, real_artifacts):
    m, mem = contents(honest)
    e0, e1 = entry_of(m, real_artifacts[0]), entry_of(m, real_artifacts[1])
    for k in ("sha256", "size", "abi", "info"):
        e1[k] = e0[k]
    mem[e1["member"]] = mem[e0["member"]]
    bad = rewrite(honest, tmp_path / "twice.aotc", m, mem)
    problems = verify_bundle(bad)
    # the copied ABI's pointee alignments are e0's, not what the family gives e1: the parameter-list check
    # can refuse it before the one-cubin-two-launch-facts check does; either names the member
    assert any("is also another member's, with other launch facts" in p or
               f"member {e1['member']!r}: its parameter list is not" in p for p in problems), problems


def test_merge_of_the_same_artifact_twice_is_one_artifact(tmp_path, real_artifacts):
    write_bundle(tmp_path / "x.aotc", real_artifacts[:2])
    write_bundle(tmp_path / "y.aotc", real_artifacts[1:3])
    report = merge_bundles([tmp_path / "x.aotc", tmp_path / "y.aotc"], tmp_path / "out.aotc")
    assert report.inputs_json() == [{"path": str(tmp_path / "x.aotc"), "kernels": 2, "new": 2},
                                    {"path": str(tmp_path / "y.aotc"), "kernels": 2, "new": 1}]
    assert sorted(e["sha256"] for e in report.manifest["artifacts"]) == sorted(a.sha256 for a in real_artifacts[:3])
    assert verify_bundle(tmp_path / "out.aotc") == []


def test_a_tuning_bundle_with_keys_of_its_own_still_loads(tmp_path, real_artifacts):
    """key_parts None (compile_variant with a key of the caller's own): not a cache key, not a lie."""
    own = [dataclasses.replace(a, key=hashlib.sha256(f"tune-{a.variant.name}".encode()).hexdigest(),
                               info={**a.info, "key_parts": None}) for a in real_artifacts[:3]]
    write_bundle(tmp_path / "tuned.aotc", own)
    assert verify_bundle(tmp_path / "tuned.aotc") == []
    assert len(aotc.runtime.load(tmp_path / "tuned.aotc").kernels["sdpa_combine"]) == 3
