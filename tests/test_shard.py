"""`aotc build --shard I/N`: a stable partition, and N shards merged equal the unsharded bundle."""
from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import pytest

from aotc.storage.bundle import MANIFEST, read_bundle, verify_bundle
from aotc.cli import main
from aotc.build.shard import STRATEGIES, ShardError, assign, parse_shard, select
from aotc.build.spec import load_spec
from conftest import run_aotc

SIX_SPEC = """\
# 6 sdpa_combine variants for sm_90a
[[family]]
name = "sdpa_combine"
arch = ["sm_90a"]
dtype = ["bf16", "fp16", "fp32"]
head_dim = [64, 128]
strides = "packed"
"""


@pytest.fixture
def six_spec(tmp_path) -> Path:
    p = tmp_path / "six.toml"
    p.write_text(SIX_SPEC)
    return p


def manifest_of(path: Path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read(MANIFEST))


def members_of(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n != MANIFEST}


def comparable(entry: dict) -> dict:
    """A manifest artifact entry without what differs between two builds of the same kernel (timings)."""
    info = {k: v for k, v in entry.get("info", {}).items() if "seconds" not in k}
    return {**entry, "info": info}


# ---- parsing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [("1/1", (1, 1)), ("2/3", (2, 3)), (" 3 / 3 ", (3, 3)), ("10/12", (10, 12))])
def test_parse_shard(text, want):
    assert parse_shard(text) == want


@pytest.mark.parametrize("text, why", [
    ("0/3", "must be in 1..3"), ("4/3", "must be in 1..3"), ("x", "expected I/N"), ("1/0", "at least 1"),
    ("3", "expected I/N"), ("-1/3", "expected I/N"), ("1/3/4", "expected I/N"), ("", "expected I/N"),
])
def test_bad_shards_are_spec_errors(text, why):
    with pytest.raises(ShardError, match=why) as e:
        parse_shard(text)
    assert e.value.exit_code == 2


@pytest.mark.parametrize("text", ["0/3", "4/3", "x", "1/0"])
def test_cli_bad_shard_exits_2_with_a_message(six_spec, text, capsys):
    assert main(["build", str(six_spec), "--shard", text]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --shard {text!r}: ")
    assert main(["list", str(six_spec), "--shard", text]) == 2


def test_cli_bad_shard_as_a_program(six_spec):
    r = run_aotc("build", str(six_spec), "--shard", "4/3")
    assert r.returncode == 2
    assert "error: --shard '4/3': the shard index I must be in 1..3" in r.stderr


# ---- the partition -----------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 500])
def test_partition_is_a_partition_and_order_independent(strategy, count):
    variants = list(load_spec().variants)  # the embedded default spec
    shards = [select(variants, i, count, strategy) for i in range(1, count + 1)]
    flat = [v for s in shards for v in s]
    assert sorted(flat) == sorted(variants) and len(flat) == len(set(flat))
    if strategy == "balanced":
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1
    shuffled = variants[:]
    random.Random(7).shuffle(shuffled)
    assert assign(shuffled, count, strategy) == assign(variants, count, strategy)
    for s in shards:  # each shard keeps the spec's order
        assert s == [v for v in variants if v in set(s)]


def test_hash_strategy_never_moves_a_variant_when_the_spec_grows():
    variants = list(load_spec().variants)
    before = assign(variants[: len(variants) // 2], 4, "hash")
    after = assign(variants, 4, "hash")
    assert all(after[v] == shard for v, shard in before.items())


def test_partition_is_the_same_in_another_interpreter(six_spec):
    """Nothing host- or process-dependent (hash seed) goes into the partition."""
    seen = []
    for seed in ("0", "12345"):
        names = []
        for i in (1, 2, 3):
            r = run_aotc("list", str(six_spec), "--shard", f"{i}/3", "--json", PYTHONHASHSEED=seed)
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout)
            assert out["shard"] == {"index": i, "count": 3, "strategy": "balanced", "spec_variants": 6}
            names.append([v["name"] for v in out["variants"]])
        seen.append(names)
    assert seen[0] == seen[1]
    assert [len(n) for n in seen[0]] == [2, 2, 2]


# ---- shards merged == the unsharded bundle -------------------------------------------------------------
def test_three_shards_merged_equal_the_unsharded_bundle(six_spec, tmp_path, monkeypatch, capsys):
    """Each shard builds on its own "machine" (its own cache), as CI matrix jobs do; so does the whole."""
    pytest.importorskip("cutlass")
    shards = []
    for i in (1, 2, 3):
        monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / f"cache-shard{i}"))
        out = tmp_path / f"shard{i}.aotc"
        assert main(["build", str(six_spec), "--shard", f"{i}/3", "--bundle", str(out), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["shard"] == {"index": i, "count": 3, "strategy": "balanced", "variants": 2, "spec_variants": 6}
        assert report["counts"] == {"hit": 0, "compiled": 2, "bypassed": 0, "failed": 0}
        shards.append(out)
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "cache-whole"))
    whole = tmp_path / "whole.aotc"
    assert main(["build", str(six_spec), "--bundle", str(whole), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["compiled"] == 6

    names = [set(members_of(p)) for p in shards]
    assert all(len(n) == 2 for n in names) and not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])

    merged = tmp_path / "merged.aotc"
    assert main(["bundle", "merge", str(merged), *map(str, shards), "--spec", str(six_spec)]) == 0
    assert "(6 kernels from 3 bundles)" in capsys.readouterr().out
    assert verify_bundle(merged) == []

    # the same members with the same bytes ...
    assert members_of(merged) == members_of(whole)
    m, w = manifest_of(merged), manifest_of(whole)
    # ... and the same manifest artifact entries (member, variant, key, ABI, launch, sha256, size)
    assert [comparable(a) for a in m["artifacts"]] == [comparable(a) for a in w["artifacts"]]
    assert {a["member"]: a["sha256"] for a in m["artifacts"]} == {a["member"]: a["sha256"] for a in w["artifacts"]}
    assert {k: v for k, v in m.items() if k not in ("created", "producer", "artifacts")} == \
        {k: v for k, v in w.items() if k not in ("created", "producer", "artifacts")}
    assert m["producer"] == w["producer"]
    assert sorted(a.variant for a in read_bundle(merged).artifacts) == sorted(load_spec(six_spec).variants)

    # an incomplete merge is refused when the spec is given, and nothing is written
    partial = tmp_path / "partial.aotc"
    assert main(["bundle", "merge", str(partial), str(shards[0]), str(shards[2]), "--spec", str(six_spec)]) == 1
    err = capsys.readouterr().err
    assert "lack 2 variant(s) of the spec" in err and "--shard I/N" in err
    for name in names[1]:
        assert name[len("kernels/"):-len(".cubin")] in err
    assert not partial.exists()


def test_a_shard_with_no_variants_still_writes_its_bundle(tiny_spec, tmp_path, capsys):
    out = tmp_path / "empty.aotc"
    assert main(["build", str(tiny_spec), "--shard", "6/8", "--bundle", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shard"]["variants"] == 0 and report["variants"] == []
    assert read_bundle(out).artifacts == []
    assert main(["bundle", "merge", str(tmp_path / "m.aotc"), str(out)]) == 0
    assert "(0 kernels from 1 bundles)" in capsys.readouterr().out


def test_shard_text_output(tiny_spec, capsys):
    pytest.importorskip("cutlass")
    assert main(["build", str(tiny_spec), "--shard", "2/2", "--shard-by", "hash"]) == 0
    cap = capsys.readouterr()
    n = len(select(load_spec(tiny_spec).variants, 2, 2, "hash"))
    assert f"shard 2/2 (hash): {n} of 4 variants" in cap.err
    assert f"{n} variants in" in cap.out
    assert main(["list", str(tiny_spec), "--shard", "2/2", "--shard-by", "hash"]) == 0
    assert f"{n} variants in shard 2/2 (of 4) ({n} cached)" in capsys.readouterr().out
