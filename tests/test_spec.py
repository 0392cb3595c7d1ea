"""Spec files: loading, enumeration, pruning, errors and `aotc list --why-not`."""
from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from aotc import families
from aotc.cli import main
from aotc.common.errors import SpecError
from aotc.families.sdpa_combine import FAMILY as COMBINE
from aotc.build.spec import DEFAULT_SPEC, load_spec
from aotc.common.variant import Variant


def write(tmp_path, text: str, name: str = "s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_default_spec_loads():
    s = load_spec()
    assert s.path == str(DEFAULT_SPEC)
    assert len(s.variants) == 18 + 36 + 32 + 32 + 30 + 24 + 6 + 24 + 12 + 8 + 4 + 7
    assert len(set(s.variants)) == len(s.variants)
    # fp8 KV: bf16 queries over e4m3 pools, decode (dense and ragged Q) and the attention entry point's paged
    # kernel at D128 page 16, and the quantizing KV write; gpt-oss's (D64: the KV write, decode, the Hopper paged
    # kernel for the longer rows); every other variant keeps its queries' dtype
    fp8 = {(v.family, v["dtype"], v["head_dim"]) + ((v["kv"], v["layout"]) if v.family == "sdpa_decode" else ())
           + ((v["layout"], v["block_n"]) if v.family == "sdpa_prefill_sm90" else ())
           for v in s.variants if v.get("kv_dtype") == "fp8_e4m3"}
    assert fp8 == {("sdpa_decode", "bf16", 128, "paged16", "dense"), ("sdpa_decode", "bf16", 128, "paged16", "ragged"),
                   ("sdpa_prefill_sm90", "bf16", 128, "paged16", 128), ("kv_write", "bf16", 128),
                   ("sdpa_decode", "bf16", 64, "paged16", "dense"), ("sdpa_decode", "bf16", 64, "paged16", "ragged"),
                   ("sdpa_prefill_sm90", "bf16", 64, "paged16", 128), ("kv_write", "bf16", 64)}
    assert all(v.get("kv_dtype", v["dtype"]) in (v["dtype"], "fp8_e4m3") for v in s.variants)
    # the score features: off unless listed; on, the combinations today's models use (bf16, causal)
    featured = {(v.family, v["head_dim"], v["layout"], tuple(f for f in ("window", "softcap", "sinks") if v[f]))
                for v in s.variants if v.family != "sdpa_combine" and v.family != "kv_write"
                and (v["window"] or v["softcap"] or v["sinks"])}
    sm90 = {(d, layout, feats) for d, feats in ((64, ("sinks",)), (64, ("window", "sinks")), (256, ("softcap",)),
                                                (256, ("window", "softcap")), (128, ("window",)), (128, ("softcap",)))
            for layout in ("dense", "ragged", "paged16")}
    decode = {(d, layout, feats) for d, feats in ((64, ("sinks",)), (64, ("window", "sinks")), (256, ("softcap",)),
                                                  (256, ("window", "softcap")), (128, ("window",)), (128, ("softcap",)))
              for layout in ("dense", "ragged")}
    portable = {(128, layout, feats) for layout in ("dense", "ragged")
                for feats in (("window",), ("softcap",), ("sinks",), ("window", "softcap", "sinks"))}
    assert featured == ({("sdpa_prefill_sm90", *x) for x in sm90} | {("sdpa_decode", *x) for x in decode}
                        | {("sdpa_prefill", *x) for x in portable})
    # D128 at both kv tiles (as its plain kernels), the rest at their head dim's one
    assert {v["block_n"] for v in s.variants if v.family == "sdpa_prefill_sm90" and v["head_dim"] == 128
            and (v["window"] or v["softcap"])} == {128, 176}
    assert all(v["dtype"] == "bf16" and v.get("causal", True) for v in s.variants
               if v.family not in ("sdpa_combine", "kv_write") and (v["window"] or v["softcap"] or v["sinks"]))
    plain = [v for v in s.variants if v.family in ("sdpa_combine", "kv_write")
             or not (v["window"] or v["softcap"] or v["sinks"])]
    combine = [v for v in s.variants if v.family == "sdpa_combine"]
    prefill = [v for v in plain if v.family == "sdpa_prefill"]
    hopper = [v for v in plain if v.family == "sdpa_prefill_sm90" and not v["layout"].startswith("paged")]
    paged = [v for v in plain if v.family == "sdpa_prefill_sm90" and v["layout"].startswith("paged")]
    decode = [v for v in plain if v.family == "sdpa_decode" and v["kv_dtype"] != "fp8_e4m3"]
    kv_write = [v for v in s.variants if v.family == "kv_write" and v["kv_dtype"] != "fp8_e4m3"]
    assert {v.arch for v in hopper} == {"sm_90a"} and {(v["dtype"], v["head_dim"], v["layout"], v["causal"])
                                                         for v in hopper} == set(itertools.product(
        ("fp16", "bf16"), (64, 128, 256), ("dense", "ragged"), (False, True)))
    # every head dim at its tuned kv tile widths only: D128 twice (the runtime picks by kv length)
    assert sorted({(v["head_dim"], v["block_n"]) for v in hopper}) == [(64, 128), (128, 128), (128, 176), (256, 80)]
    # the serving entry point: causal, every page size at D64/D128 (kv blocks of 128), D256 (80) and D128 (176)
    assert {(v["dtype"], v["head_dim"], v["layout"], v["block_n"]) for v in paged} == {
        (dt, d, f"paged{p}", 80 if d == 256 else 128) for dt in ("fp16", "bf16") for d in (64, 128, 256)
        for p in (16, 32, 64, 128)} | {
        (dt, 128, f"paged{p}", 176) for dt in ("fp16", "bf16") for p in (16, 32, 64, 128)} and all(
        v["causal"] for v in paged)
    assert {v.arch for v in decode} == {"sm_90"} and len({v["kv"] for v in decode if v["layout"] == "dense"}) == 5
    # the serving entry point's decode rows: ragged queries over every page size
    assert {(v["kv"], v["head_dim"]) for v in decode if v["layout"] == "ragged"} == {
        (f"paged{p}", d) for p in (16, 32, 64, 128) for d in (64, 128, 256)}
    assert {v.arch for v in kv_write} == {"sm_90"} and {(v["dtype"], v["head_dim"]) for v in kv_write} == set(
        itertools.product(("fp16", "bf16"), (64, 128, 256)))
    assert {v.arch for v in combine} == {"sm_90a"} and {v.arch for v in prefill} == {"sm_90"}
    assert {(v["dtype"], v["head_dim"], v["strides"]) for v in combine} == set(
        itertools.product(("fp16", "bf16", "fp32"), (64, 128, 256), ("general", "packed")))
    assert {(v["layout"], v["strides"]) for v in prefill} == {("dense", "general"), ("dense", "packed"),
                                                             ("ragged", "general")}
    # ragged x packed is pruned, with the family's reason; so is every untuned (head dim, block_n)
    packed = [p for p in s.pruned if p.family == "sdpa_prefill"]
    tiles = [p for p in s.pruned if p.family == "sdpa_prefill_sm90" and "is not a tile of" in p.reason]
    assert len(packed) == 12 and all("packed specialization" in p.reason for p in packed)
    assert len(tiles) == 2 * 2 * 2 * (3 * 3 - 4) + 2 * 4 * (3 * 3 - 4)
    assert len(s.pruned) == len(packed) + len(tiles)
    assert all(f"is not a tile of head_dim {p.values['head_dim']}" in p.reason for p in tiles)


def test_enumeration_is_the_product(tmp_path):
    s = load_spec(write(tmp_path, """
[[family]]
name = "sdpa_combine"
arch = ["sm_90a", "sm_80"]
dtype = ["bf16", "fp32"]
head_dim = [64, 256]
strides = ["packed", "general"]
"""))
    want = {Variant.make("sdpa_combine", a, dtype=d, head_dim=h, strides=st)
            for a, d, h, st in itertools.product(("sm_90a", "sm_80"), ("bf16", "fp32"), (64, 256),
                                                 ("packed", "general"))}
    assert len(s.variants) == 16
    assert set(s.variants) == want
    assert s.name == "s"


def test_scalar_value_is_a_one_element_list(tmp_path):
    s = load_spec(write(tmp_path, """
[[family]]
name = "sdpa_combine"
arch = "sm_90a"
dtype = "bf16"
head_dim = 128
strides = "packed"
"""))
    assert s.variants == (Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="packed"),)


def test_left_out_field_takes_all_choices(tmp_path):
    s = load_spec(write(tmp_path, """
[[family]]
name = "sdpa_combine"
arch = ["sm_90a"]
dtype = ["bf16"]
"""))
    assert {(v["head_dim"], v["strides"]) for v in s.variants} == set(
        itertools.product(COMBINE.field("head_dim").choices, COMBINE.field("strides").choices))
    assert len(s.variants) == 6


def test_duplicate_tables_are_deduplicated(tmp_path):
    table = '[[family]]\nname = "sdpa_combine"\narch = ["sm_90a"]\ndtype = "bf16"\nhead_dim = 64\n'
    s = load_spec(write(tmp_path, table + "\n" + table))
    assert len(s.variants) == 2  # general + packed, once each


def test_exclude_prunes_with_reason(tmp_path):
    s = load_spec(write(tmp_path, """
[[family]]
name = "sdpa_combine"
arch = ["sm_90a", "sm_80"]
dtype = ["fp16", "bf16"]
head_dim = [128, 256]
strides = "packed"
exclude = [{dtype = "fp16", head_dim = 256}, {arch = "sm_80", dtype = "bf16"}]
"""))
    got = {(v.arch, v["dtype"], v["head_dim"]) for v in s.variants}
    assert got == {("sm_90a", "fp16", 128), ("sm_90a", "bf16", 128), ("sm_90a", "bf16", 256), ("sm_80", "fp16", 128)}
    pruned = {(p.values["arch"], p.values["dtype"], p.values["head_dim"]): p.reason for p in s.pruned}
    assert pruned == {
        ("sm_90a", "fp16", 256): "excluded by the spec",
        ("sm_80", "fp16", 256): "excluded by the spec",
        ("sm_80", "bf16", 128): "excluded by the spec",
        ("sm_80", "bf16", 256): "excluded by the spec",
    }
    assert all(p.family == "sdpa_combine" and p.values["strides"] == "packed" for p in s.pruned)


@pytest.fixture
def hopper_only_combine(monkeypatch):
    """sdpa_combine restricted to sm_90a (the real family supports every known arch)."""
    families._load_all()
    monkeypatch.setitem(families._FAMILIES, "sdpa_combine", dataclasses.replace(COMBINE, archs=("sm_90a",)))


def test_unsupported_arch_is_pruned_with_reason(tmp_path, hopper_only_combine):
    s = load_spec(write(tmp_path, """
[[family]]
name = "sdpa_combine"
arch = ["sm_80", "sm_90a"]
dtype = "bf16"
head_dim = 128
"""))
    assert {v.arch for v in s.variants} == {"sm_90a"}
    assert len(s.variants) == 2
    assert len(s.pruned) == 2
    for p in s.pruned:
        assert p.values["arch"] == "sm_80"
        assert "does not support sm_80" in p.reason


def test_family_validity_rule_prunes_with_its_reason(tmp_path, monkeypatch):
    families._load_all()
    rule = lambda values: "fp32 needs head_dim >= 128" if values["dtype"] == "fp32" and values["head_dim"] < 128 else None
    monkeypatch.setitem(families._FAMILIES, "sdpa_combine", dataclasses.replace(COMBINE, why_invalid=rule))
    s = load_spec(write(tmp_path, '[[family]]\nname = "sdpa_combine"\narch = "sm_90a"\nstrides = "packed"\n'
                                  'exclude = [{dtype = "fp16", head_dim = 64}]\n'))
    assert len(s.variants) == 9 - 2
    reasons = {(p.values["dtype"], p.values["head_dim"]): p.reason for p in s.pruned}
    # the spec's exclude is checked before the family's rule
    assert reasons == {("fp32", 64): "fp32 needs head_dim >= 128", ("fp16", 64): "excluded by the spec"}


def test_family_validity_rule():
    assert COMBINE.why_invalid({"head_dim": 128}) is None
    reason = COMBINE.why_invalid({"head_dim": 96})
    assert reason and "96" in reason


@pytest.mark.parametrize("body,needle", [
    ('name = "sdpa_combine"\narch = ["sm_42"]', "'sm_42'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nhead_dims = [128]', "'head_dims'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nhead_dim = [96]', "head_dim = 96"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nhead_dim = ["128"]', "head_dim = '128'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\ndtype = ["bf8"]', "dtype = 'bf8'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\ndtype = []', "dtype: empty list"),
    ('name = "sdpa_combine"\narch = []', "arch: empty list"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\ndtype = {a = 1}', "dtype: expected a value or a list"),
    ('name = "sdpa_combine"', "'arch' is required"),
    ('arch = ["sm_90a"]', "missing 'name'"),
    ('name = "sdpa_nope"\narch = ["sm_90a"]', "'sdpa_nope'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nexclude = [{head_dimz = 64}]', "'head_dimz'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nexclude = {dtype = "bf16"}', "'exclude' must be a list"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nexclude = [{head_dim = "64"}]', "exclude head_dim = '64'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nexclude = [{dtype = "bf61"}]', "exclude dtype = 'bf61'"),
    ('name = "sdpa_combine"\narch = ["sm_90a"]\nexclude = [{arch = "sm_09a"}]', "exclude arch = 'sm_09a'"),
])
def test_bad_spec_names_the_problem(tmp_path, body, needle):
    p = write(tmp_path, "[[family]]\n" + body + "\n")
    with pytest.raises(SpecError) as ei:
        load_spec(p)
    assert needle in str(ei.value)
    assert str(p) in str(ei.value)
    assert ei.value.exit_code == 2


def test_bad_toml(tmp_path):
    p = write(tmp_path, '[[family]]\nname = "sdpa_combine\n')
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(p)


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match=r"cannot read spec .*nope\.toml"):
        load_spec(tmp_path / "nope.toml")


def test_no_family_tables(tmp_path):
    with pytest.raises(SpecError, match=r"\[\[family\]\]"):
        load_spec(write(tmp_path, 'title = "x"\n'))


def test_bad_spec_via_cli_exit_code(tmp_path, capsys):
    p = write(tmp_path, '[[family]]\nname = "sdpa_combine"\narch = ["sm_90a"]\nhead_dim = [96]\n')
    assert main(["list", str(p)]) == 2
    err = capsys.readouterr().err
    assert "head_dim = 96" in err


def test_list_why_not_json(tmp_path, capsys, cache_dir):
    p = write(tmp_path, """
[[family]]
name = "sdpa_combine"
arch = ["sm_90a"]
dtype = ["fp16", "bf16"]
head_dim = 128
strides = "packed"
exclude = [{dtype = "fp16"}]
""")
    assert main(["list", str(p), "--json", "--why-not"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spec"] == str(p)
    assert [r["name"] for r in out["variants"]] == ["sdpa_combine.sm_90a.dtype=bf16.head_dim=128.strides=packed"]
    row = out["variants"][0]
    assert row["cache"] == "missing"
    assert len(row["key"]) == 64
    assert row["variant"] == {"family": "sdpa_combine", "arch": "sm_90a", "dtype": "bf16", "head_dim": 128,
                              "strides": "packed"}
    assert out["pruned"] == [{"family": "sdpa_combine", "reason": "excluded by the spec",
                              "values": {"arch": "sm_90a", "dtype": "fp16", "head_dim": 128, "strides": "packed"}}]
    # without --why-not there is no pruned list
    assert main(["list", str(p), "--json"]) == 0
    assert "pruned" not in json.loads(capsys.readouterr().out)


def test_list_why_not_text(tmp_path, capsys, cache_dir):
    p = write(tmp_path, '[[family]]\nname = "sdpa_combine"\narch = ["sm_90a"]\nhead_dim = 64\n'
                        'exclude = [{dtype = "fp32"}]\n')
    assert main(["list", str(p), "--why-not"]) == 0
    out = capsys.readouterr().out
    assert "4 variants (0 cached), 2 pruned" in out
    assert "pruned sdpa_combine arch=sm_90a dtype=fp32 head_dim=64 strides=general: excluded by the spec" in out
