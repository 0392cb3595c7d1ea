"""Runtime.capabilities(): what each entry point serves on a device (or an arch), from the loaded
kernels' variant records, as plain JSON-ready data."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import aotc
import aotc.runtime
from aotc.common.abi import KernelABI, ptr, scalars
from aotc.common.errors import ArgumentError, BundleError
from aotc.common.variant import Variant
from aotc.families import get_family
from aotc.runtime import Runtime, driver
from aotc.runtime.capabilities import ENTRY_POINTS
from aotc.storage.bundle import write_bundle
from conftest import REPO

DEFAULT_BUNDLE = REPO / "artifacts" / "default.aotc"


def kernel(family: str, arch: str = "sm_90a", abi: KernelABI | None = None, **fields):
    """A loaded artifact's stand-in: a variant and the parameter list its family gives (or `abi`)."""
    v = Variant.make(family, arch, **fields)
    return SimpleNamespace(variant=v, sha256=v.name, abi=abi or get_family(family).abi(v, "kernel"))


def refused_member(family: str, arch: str = "sm_90a", **fields):
    """A bundle member's stand-in whose header the runtime refuses when dispatch first checks it."""
    v = Variant.make(family, arch, **fields)

    def checked_header():
        raise BundleError(f"bundle x.aotc: member {v.name!r}: its key is not the one this aotc computes")

    return SimpleNamespace(variant=v, sha256=v.name, checked_header=checked_header)


def json_ready(caps: dict) -> dict:
    assert json.loads(json.dumps(caps, allow_nan=False)) == caps  # plain data: no tuples, sets or objects
    return caps


@pytest.fixture(scope="module")
def default_runtime():
    if not DEFAULT_BUNDLE.exists():
        pytest.skip("artifacts/default.aotc is written by `make build`")
    return aotc.runtime.load(DEFAULT_BUNDLE)


def test_the_default_bundle_on_an_sm_90a_device(default_runtime):
    caps = json_ready(default_runtime.capabilities(arch="sm_90a"))
    assert caps["schema_version"] == 1 and caps["aotc_version"] == aotc.__version__
    assert caps["device"] is None and caps["arch"] == "sm_90a" and caps["runs"] == ["sm_90a", "sm_90"]
    assert caps["sources"] == [str(DEFAULT_BUNDLE)] and caps["other_archs"] == []
    assert caps["refused"] == [] and caps["other_abi"] == [] and caps["unmapped_families"] == []
    eps = caps["entry_points"]
    assert list(eps) == list(ENTRY_POINTS)
    assert caps["kernels"] == sum(s["kernels"] for e in eps.values() for s in e["served_by"])
    for name, layout in (("prefill", "dense"), ("prefill_ragged", "ragged")):
        e = eps[name]
        assert e["supported"] and e["dtypes"] == ["bf16", "fp16"] and e["head_dims"] == [64, 128, 256]
        assert e["causal"] == [False, True] and e["lse"] is True and e["gaps"] == []
        assert e["layouts"] == [layout] and e["page_sizes"] == [] and e["kv_layouts"] == []
        # the Hopper family first (what family="auto" tries), then the portable one compiled for sm_90
        assert [(s["family"], s["arch"]) for s in e["served_by"]] == [("sdpa_prefill_sm90", "sm_90a"),
                                                                        ("sdpa_prefill", "sm_90")]
        assert e["kernels"] == sum(s["kernels"] for s in e["served_by"])
        assert e["fields"]["block_n"] == [80, 128, 176]  # fields no summary key names are there too
    d = eps["decode"]
    assert d["supported"] and d["dtypes"] == ["bf16", "fp16"] and d["head_dims"] == [64, 128, 256]
    assert d["page_sizes"] == [16, 32, 64, 128]
    assert d["layouts"] == ["dense", "paged16", "paged32", "paged64", "paged128"]
    assert d["kv_layouts"] == ["NHD", "HND"] and d["causal"] == [True] and d["lse"] is True
    # 30 plain kernels, 5 with score features (gpt-oss, Gemma 2, Mistral) and 2 over an fp8 cache (D128, D64)
    assert [(s["family"], s["arch"], s["kernels"]) for s in d["served_by"]] == [("sdpa_decode", "sm_90", 37)]
    assert sorted(d["fields"]["kv_dtype"]) == ["bf16", "fp16", "fp8_e4m3"]
    c = eps["combine"]
    assert c["dtypes"] == ["bf16", "fp16", "fp32"] and c["head_dims"] == [64, 128, 256] and c["causal"] == []
    assert c["fields"]["strides"] == ["general", "packed"] and c["lse"] is True
    a = eps["attention"]  # the Hopper family's paged layouts: causal, every head dim at every page size
    assert a["supported"] and a["dtypes"] == ["bf16", "fp16"] and a["head_dims"] == [64, 128, 256]
    assert a["page_sizes"] == [16, 32, 64, 128] and a["kv_layouts"] == ["NHD", "HND"] and a["causal"] == [True]
    # its decode rows' kernel is listed, out of the summary (the paged kernel decides what is served)
    # (and, over an fp8 cache, one of each at D128 page 16, and gpt-oss's at D64: plain, sinks, window + sinks;
    # its decode rows' kernels with sinks)
    # (D256's and D128-176's kv blocks over pages of 32-128: 16-row TMA boxes inside a page)
    assert [(s["family"], s["arch"], s["kernels"]) for s in a["served_by"]] == [("sdpa_prefill_sm90", "sm_90a", 42),
                                                                                ("sdpa_decode", "sm_90", 32)]
    assert a["kernels"] == 42 and a["layouts"] == ["paged16", "paged32", "paged64", "paged128"]
    assert sorted(a["fields"]["kv_dtype"]) == ["bf16", "fp16", "fp8_e4m3"]
    # the score features are reported as the fields they are, on every attention entry point
    for e in (a, d, eps["prefill"], eps["prefill_ragged"]):
        assert all(e["fields"][f] == [False, True] for f in ("window", "softcap", "sinks")), e["fields"]
    w = eps["kv_write"]
    assert w["supported"] and w["dtypes"] == ["bf16", "fp16"] and w["head_dims"] == [64, 128, 256]
    assert a["gaps"] == []  # every dtype, head dim and page size of the Hopper family's is served
    assert default_runtime.capabilities(arch="sm_90") == caps | {"arch": "sm_90"}  # one compute capability


def test_the_default_bundle_on_devices_it_does_not_run_on(default_runtime):
    for arch in ("sm_80", "sm_100a"):
        caps = json_ready(default_runtime.capabilities(arch=arch))
        assert caps["kernels"] == 0 and caps["other_archs"] == ["sm_90", "sm_90a"]
        assert not any(e["supported"] for e in caps["entry_points"].values())


def test_nothing_loaded_supports_nothing_and_raises_nothing():
    caps = json_ready(Runtime([]).capabilities(arch="sm_90a"))
    assert caps["kernels"] == 0 and caps["sources"] == [] and caps["other_archs"] == []
    for e in caps["entry_points"].values():
        assert e == {"supported": False, "kernels": 0, "dtypes": [], "head_dims": [], "causal": [], "lse": False,
                     "layouts": [], "page_sizes": [], "kv_layouts": [], "gaps": [], "fields": {}, "served_by": []}


def test_a_bundle_of_one_variant(tmp_path, real_artifacts):
    art = real_artifacts[0]  # sdpa_combine sm_90a bf16 D128 packed
    write_bundle(tmp_path / "one.aotc", [art])
    rt = aotc.runtime.load(tmp_path / "one.aotc")
    caps = json_ready(rt.capabilities(arch="sm_90a"))
    c = caps["entry_points"]["combine"]
    assert c["supported"] and c["kernels"] == 1 and c["dtypes"] == ["bf16"] and c["head_dims"] == [128]
    assert c["fields"] == {"dtype": ["bf16"], "head_dim": [128], "strides": ["packed"]} and c["lse"] is True
    assert c["served_by"] == [{"family": "sdpa_combine", "arch": "sm_90a", **{k: v for k, v in c.items()
                                                                              if k not in ("supported", "served_by")}}]
    assert [n for n, e in caps["entry_points"].items() if e["supported"]] == ["combine"]
    (k,) = rt.kernels["sdpa_combine"]
    assert k in rt._fitting and not k.loaded  # its header checked as dispatch would; nothing reached a driver
    assert rt.capabilities(arch="sm_80")["entry_points"]["combine"]["supported"] is False


def test_new_families_and_fields_appear_without_code_changes():
    from aotc.families.kv_write import PARAMS as KV_WRITE_PARAMS

    kv_write_abi = KernelABI("kernel", KV_WRITE_PARAMS)
    rt = Runtime([
        kernel("sdpa_prefill_sm90", dtype="bf16", head_dim=128, layout="paged64", causal=True, block_n=128,
               softcap=True),
        kernel("sdpa_prefill_sm90", dtype="bf16", head_dim=128, layout="paged16", causal=True, block_n=128,
               softcap=False),
        kernel("sdpa_prefill_sm90", dtype="bf16", head_dim=128, layout="dense", causal=False, block_n=128),
        kernel("kv_write", "sm_90", kv_write_abi, dtype="bf16", head_dim=128),
        kernel("sdpa_future", "sm_90", kv_write_abi, dtype="bf16"),
    ])
    caps = json_ready(rt.capabilities(arch="sm_90a"))
    eps = caps["entry_points"]
    a = eps["attention"]
    assert a["supported"] and a["kernels"] == 2 and a["page_sizes"] == [16, 64] and a["kv_layouts"] == ["NHD", "HND"]
    assert a["fields"]["softcap"] == [False, True] and a["causal"] == [True] and a["lse"] is True
    assert eps["prefill"]["kernels"] == 1 and "softcap" not in eps["prefill"]["fields"]  # paged: not prefill's
    w = eps["kv_write"]
    assert w["supported"] and w["lse"] is False and w["fields"] == {"dtype": ["bf16"], "head_dim": [128]}
    assert w["served_by"][0]["family"] == "kv_write" and w["served_by"][0]["arch"] == "sm_90"
    assert caps["unmapped_families"] == ["sdpa_future"] and caps["kernels"] == 5


def test_gaps_name_the_combinations_no_kernel_serves():
    rt = Runtime([kernel("sdpa_combine", dtype=d, head_dim=h, strides="packed")
                  for d, h in (("bf16", 64), ("bf16", 128), ("fp16", 64))])
    c = rt.capabilities(arch="sm_90a")["entry_points"]["combine"]
    assert c["dtypes"] == ["bf16", "fp16"] and c["head_dims"] == [64, 128]
    assert c["gaps"] == [{"dtype": "fp16", "head_dim": 128}]


def test_kernels_dispatch_would_refuse_are_named_not_served():
    good = kernel("sdpa_combine", dtype="bf16", head_dim=128, strides="packed")
    bad = refused_member("sdpa_combine", dtype="fp16", head_dim=128, strides="packed")
    params = get_family("sdpa_combine").params(good.variant)
    old = kernel("sdpa_combine", abi=KernelABI("kernel", params[:-1]), dtype="fp32", head_dim=128, strides="packed")
    rt = Runtime([good, bad, old])
    caps = json_ready(rt.capabilities(arch="sm_90a"))
    (r,) = caps["refused"]
    assert r["kernel"] == bad.variant.name and "its key is not the one" in r["error"]
    assert caps["other_abi"] == [old.variant.name]  # set aside, as at its first selection
    c = caps["entry_points"]["combine"]
    assert c["kernels"] == 1 and c["dtypes"] == ["bf16"]


def test_the_current_device(monkeypatch):
    monkeypatch.setattr(driver, "current_device", lambda: 0)
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
    monkeypatch.setattr(driver, "device_name", lambda dev: "NVIDIA H200")
    monkeypatch.setattr(driver, "multiprocessor_count", lambda dev: 132)
    rt = Runtime([kernel("sdpa_decode", "sm_90", dtype="bf16", head_dim=128, kv="paged16")])
    caps = json_ready(rt.capabilities())
    assert caps["device"] == {"ordinal": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "sms": 132}
    assert caps["arch"] == "sm_90a" and caps["entry_points"]["decode"]["page_sizes"] == [16]
    assert rt.capabilities(0) == caps


@pytest.mark.parametrize("kwargs", [{"device": 0, "arch": "sm_90a"}, {"arch": "hopper"}, {"arch": 90},
                                    {"arch": "sm_9"}])
def test_bad_arguments(kwargs):
    with pytest.raises(ArgumentError, match="'arch'"):
        Runtime([]).capabilities(**kwargs)
