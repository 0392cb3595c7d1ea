"""The score features (sliding window, soft-cap, sinks) without a GPU: the families' fields and validity
rule, the spec default (off unless listed), the runtime's argument checks, dispatch on exactly the features
asked for, the values a plan launches with, and the plan-cache keys (tests/gpu/test_features.py checks
the kernels' numbers on the H200)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import aotc.runtime.attention as A
from aotc.build.spec import enumerate_spec
from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families import get_family
from aotc.families.features import FEATURE_PARAMS, FEATURES
from aotc.families.sdpa_prefill_sm90 import PARAMS
from aotc.runtime import tensor
from aotc.runtime.features import check_features, feature_scalars
from recorded_launch import OneTile, split_arena, stream_counters
from test_runtime_attention import fake_kernel
from test_runtime_attention_plan import GAP, H, D, launches, step  # noqa: F401 (launches: a fixture)

ATTENTION_FAMILIES = ("sdpa_prefill", "sdpa_prefill_sm90", "sdpa_decode")


@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_every_attention_family_has_the_three_fields_and_parameters(family):
    fam = get_family(family)
    for name in FEATURES:
        f = fam.field(name)
        assert f.choices == (False, True) and f.unlisted == (False,)
    # the attention families' parameter lists depend on the variant only for the portable family's paged
    # layouts (their own list); sdpa_decode's, sdpa_prefill_sm90's and the portable paged list have the fp8 KV
    # scales after them (aotc.families.kv_dtype), and sdpa_prefill_sm90's then its tile counter
    # (aotc.runtime.counters), the row groups' page stride and the KV splits' workspace
    variants = ([SimpleNamespace()] if family != "sdpa_prefill" else
                [Variant.make("sdpa_prefill", "sm_90", dtype="bf16", head_dim=128, layout=layout, causal=True,
                              strides="general") for layout in ("dense", "ragged", "paged16", "paged128")])
    for v in variants:
        paged = family == "sdpa_prefill" and v["layout"].startswith("paged")
        after = {"sdpa_decode": 3, "sdpa_prefill_sm90": 8}.get(family, 3 if paged else 0)
        params = fam.params(v)
        assert params[len(params) - after - 3:len(params) - after] == FEATURE_PARAMS
    if family == "sdpa_prefill_sm90":
        assert [p.name for p in fam.params(SimpleNamespace())[-5:]] == [
            "tile_counter", "kv_groups_per_page", "split_partials", "split_counters", "kv_splits_max"]
    assert [p.name for p in FEATURE_PARAMS] == ["sinks", "window_left", "softcap"]


def test_a_spec_leaves_features_off_unless_it_lists_them():
    doc = {"family": [{"name": "sdpa_prefill", "arch": ["sm_90"], "dtype": ["bf16"], "head_dim": [128],
                       "layout": ["dense"], "causal": [True], "strides": ["general"]}]}
    (v,) = enumerate_spec(doc).variants
    assert not any(v[f] for f in FEATURES)
    doc["family"][0].update(window=[False, True], sinks=[True])
    got = {(v["window"], v["softcap"], v["sinks"]) for v in enumerate_spec(doc).variants}
    assert got == {(False, False, True), (True, False, True)}


@pytest.mark.parametrize("family,extra", [("sdpa_prefill", {"strides": ["general"]}),
                                          ("sdpa_prefill_sm90", {"block_n": [128]})])
def test_a_window_without_causal_is_pruned_with_its_reason(family, extra):
    doc = {"family": [{"name": family, "arch": ["sm_90a" if family.endswith("sm90") else "sm_90"],
                       "dtype": ["bf16"], "head_dim": [128], "layout": ["dense"], "causal": [False, True],
                       "window": [True], **extra}]}
    s = enumerate_spec(doc)
    assert [v["causal"] for v in s.variants] == [True]
    (p,) = s.pruned
    assert p.values["causal"] is False and "window needs causal = true" in p.reason


def test_decode_serves_every_feature_combination():
    fam = get_family("sdpa_decode")
    assert fam.why_invalid({"dtype": "bf16", "head_dim": 128, "kv": "paged16", "layout": "ragged",
                            "window": True, "softcap": True, "sinks": True}) is None


SINKS = tensor(1 << 44, (H,), (1,), "fp32")


@pytest.mark.parametrize("kwargs,name,expected", [
    ({"window_left": -1}, "window_left", "None (no window) or an int in [0"),
    ({"window_left": True}, "window_left", "None (no window)"),
    ({"window_left": 2.0}, "window_left", "None (no window)"),
    ({"window_left": 1 << 31}, "window_left", "2147483647"),
    ({"window_left": 128, "causal": False}, "window_left", "pass causal=True"),
    ({"softcap": 0.0}, "softcap", "finite float > 0"),
    ({"softcap": -30.0}, "softcap", "finite float > 0"),
    ({"softcap": math.nan}, "softcap", "finite float > 0"),
    ({"softcap": math.inf}, "softcap", "finite float > 0"),
    ({"softcap": True}, "softcap", "finite float > 0"),
    ({"sinks": tensor(1 << 44, (H,), (1,), "bf16")}, "sinks.dtype", "fp32"),
    ({"sinks": tensor(1 << 44, (H + 1,), (1,), "fp32")}, "sinks.shape[0]", f"H_q = {H}"),
    ({"sinks": tensor(1 << 44, (1, H), (H, 1), "fp32")}, "sinks.shape", "1 dimensions"),
    ({"sinks": tensor(1 << 44, (H,), (2,), "fp32")}, "sinks.stride[0]", "contiguous"),
    ({"sinks": tensor((1 << 44) + 2, (H,), (1,), "fp32")}, "sinks.data_ptr", "multiple of 4"),
    ({"sinks": tensor(1 << 44, (H,), (1,), "fp32", device=1)}, "sinks.device", "the current device"),
])
def test_bad_feature_arguments_are_named(kwargs, name, expected):
    args = {"window_left": None, "softcap": None, "sinks": None, "causal": True, **kwargs}
    causal = args.pop("causal")
    with pytest.raises(ArgumentError) as e:
        check_features(**args, heads_q=H, device=0, causal=causal)
    assert e.value.name == name and expected in e.value.expected


def test_features_give_fields_values_and_a_key():
    f = check_features(4095, 50, SINKS, heads_q=H, device=0)
    assert f.fields == {"window": True, "softcap": True, "sinks": True} and f.any
    assert f.values == {"window_left": 4095, "softcap": 50.0, "sinks": SINKS.ptr}
    off = check_features(None, None, None, heads_q=H, device=0)
    assert off.fields == {"window": False, "softcap": False, "sinks": False} and not off.any
    assert off.values == {"window_left": 0, "softcap": 0.0, "sinks": 0}
    # window_left 0 (a row sees only its own key) is a window, not "off"
    assert check_features(0, None, None, heads_q=H, device=0).fields["window"]
    # keys tell the types apart: True (refused) must never find window_left=1's plan
    assert feature_scalars(True, None) != feature_scalars(1, None)
    assert feature_scalars(None, 50) != feature_scalars(None, 50.0)


class FeatureRuntime(OneTile):
    """The paged kernel with the features in `have` (and no decode kernel: every row goes to it)."""

    def __init__(self, have: dict):
        self.plans = {}
        self.tile_counters = stream_counters()
        self.split_workspaces = split_arena()
        self.have = have
        self.asked = []

    def device(self):
        return 0

    def field_values(self, family, field, device):
        return {"paged16"}

    def find(self, family, device, candidates):
        self.asked.append((family, candidates))
        if family == "sdpa_decode":
            return None
        for want in candidates:
            if all(want.get(f, False) == self.have.get(f, False) for f in FEATURES):
                k = fake_kernel(D, 16, 128)
                k.artifact.abi = SimpleNamespace(params=PARAMS)
                return k
        return None

    def remember_plan(self, key, plan):
        self.plans[key] = plan


def test_the_plan_launches_with_the_feature_values(launches):  # noqa: F811 (the fixture)
    rt = FeatureRuntime({"window": True, "sinks": True})
    q, k, v, o, cu, sl, pt, _ = step(10)
    sinks = tensor(q.ptr + 9 * GAP, (H,), (1,), "fp32")
    A.attention(rt, q, k, v, o, cu, sl, pt, window_left=127, sinks=sinks)
    assert launches[-1]["window_left"] == 127 and launches[-1]["sinks"] == sinks.ptr
    assert launches[-1]["softcap"] == 0.0
    # dispatch asked for exactly these features (the decode kernel too)
    assert all(c.get("window") is True and c.get("sinks") is True and c.get("softcap") is False
               for _, cands in rt.asked for c in cands)


def test_a_plain_call_launches_with_every_feature_off(launches):  # noqa: F811
    rt = FeatureRuntime({})
    q, k, v, o, cu, sl, pt, _ = step(10)
    A.attention(rt, q, k, v, o, cu, sl, pt)
    assert (launches[-1]["window_left"], launches[-1]["softcap"], launches[-1]["sinks"]) == (0, 0.0, 0)


def test_a_feature_no_loaded_kernel_has_names_what_to_build(launches):  # noqa: F811
    rt = FeatureRuntime({"window": True})
    q, k, v, o, cu, sl, pt, _ = step(10)
    with pytest.raises(ArgumentError) as e:
        A.attention(rt, q, k, v, o, cu, sl, pt, window_left=127, softcap=30.0)
    msg = str(e.value)
    assert "window/softcap" in msg and "softcap = [true]" in msg and "window = [true]" in msg
    assert "aotc build" in msg and "sdpa_prefill_sm90" in msg
    assert not launches


def test_other_feature_values_are_other_plans(launches):  # noqa: F811
    rt = FeatureRuntime({"window": True})
    q, k, v, o, cu, sl, pt, _ = step(10)
    A.attention(rt, q, k, v, o, cu, sl, pt, window_left=127)
    A.attention(rt, q, k, v, o, cu, sl, pt, window_left=127)
    A.attention(rt, q, k, v, o, cu, sl, pt, window_left=4095)
    assert len({id(p) for p in rt.plans.values()}) == 2
    assert [x["window_left"] for x in launches] == [127, 127, 4095]


def test_an_output_overlapping_the_sinks_is_refused(launches):  # noqa: F811
    rt = FeatureRuntime({"sinks": True})
    q, k, v, o, cu, sl, pt, _ = step(10)
    with pytest.raises(ArgumentError, match="sinks"):
        A.attention(rt, q, k, v, o, cu, sl, pt, sinks=tensor(o.ptr, (H,), (1,), "fp32"))
    assert not launches


def test_a_record_from_before_the_features_is_the_kernel_without_them():
    """A variant recorded before the fields existed passes the checks (bundles of an older aotc read; their
    older parameter lists keep them from serving) and is named as the plain kernel it is."""
    from aotc.common.checks import check_variant, with_defaults
    from aotc.common.variant import Variant

    old = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=128, kv="paged16", layout="dense")
    check_variant(old)
    assert with_defaults(old) == Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=128, kv="paged16",
                                              layout="dense", kv_dtype="bf16", window=False, softcap=False,
                                              sinks=False)
    assert old.get("window") is None  # dispatch asks for window=False: an old record never matches


@pytest.mark.parametrize("softcap,scale", [(1e39, 1.0), (1e-46, 1.0), (1e-30, 1e20), (1e30, 1e-20)])
def test_a_softcap_float32_cannot_hold_is_refused(softcap, scale):
    """The kernels take softcap and softmax_scale / softcap as float32: 1e39 would arrive as inf (every
    output NaN), 1e-46 as 0."""
    with pytest.raises(ArgumentError) as e:
        check_features(None, softcap, None, heads_q=H, device=0, softmax_scale=scale)
    assert e.value.name == "softcap" and "float32" in e.value.expected


@pytest.mark.parametrize("scale", [1e39, 1e-40, 0.0, -1.0, math.inf, math.nan, True, "0.1"])
def test_a_softmax_scale_float32_cannot_hold_is_refused(scale):
    from aotc.runtime import validate as V

    with pytest.raises(ArgumentError) as e:
        V.softmax_scale(scale, 128)
    assert e.value.name == "softmax_scale"
    assert V.softmax_scale(None, 64) == 0.125 and V.softmax_scale(0.5, 64) == 0.5


def test_dispatch_matches_an_old_record_so_its_parameter_list_sets_it_aside():
    """A kernel recorded before the feature fields matches a call without features (it is that kernel), so
    _fits sees its older parameter list and names it in other_abi with the rebuild hint, where it once stayed
    unmatched and the error listed it as loaded."""
    from aotc.common.variant import Variant
    from aotc.runtime import Runtime

    old = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=128, kv="paged16", layout="dense")
    rt = Runtime([])
    kernel = SimpleNamespace(variant=old)
    rt.kernels["sdpa_decode"] = [kernel]
    want = {"dtype": "bf16", "head_dim": 128, "kv": "paged16", "layout": "dense", "window": False, "softcap": False,
            "sinks": False}
    assert rt._first_match("sdpa_decode", ["sm_90"], [want]) is kernel
    assert rt._first_match("sdpa_decode", ["sm_90"], [{**want, "window": True}]) is None


# ---- a property: every feature argument either passes or is refused by name ------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aotc.runtime import validate as V  # noqa: E402

_WINDOWS = st.one_of(st.none(), st.integers(-5, 10), st.integers(2 ** 31 - 3, 2 ** 31 + 2), st.booleans(),
                     st.floats(allow_nan=True), st.text(max_size=2))
_CAPS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 50, 1e39, 1e-46]),
                  st.booleans(), st.text(max_size=2))
_SINKS = st.one_of(st.none(), st.builds(
    lambda dtype, n, stride, offset, dev, ndim: tensor((1 << 44) + offset, (n,) if ndim == 1 else (1, n),
                                                       (stride,) if ndim == 1 else (n * stride, stride), dtype, dev),
    st.sampled_from(["fp32", "bf16", "fp16", "int32"]), st.sampled_from([0, 1, H - 1, H, H + 1]),
    st.sampled_from([1, 2]), st.sampled_from([0, 2, 4]), st.sampled_from([0, 1]), st.sampled_from([1, 2])))


def feature_breaches(window_left, softcap, sinks, causal, scale) -> set[str]:
    """The argument names a call with these values breaks the rules of (an oracle written from the docs)."""
    bad = set()
    if window_left is not None and (type(window_left) is not int or not 0 <= window_left <= 2 ** 31 - 1 or not causal):
        bad.add("window_left")
    if softcap is not None:
        ok = type(softcap) in (int, float) and math.isfinite(softcap) and softcap > 0
        if not ok or not (V.FLT_MIN <= softcap <= V.FLT_MAX and V.FLT_MIN <= scale / softcap <= V.FLT_MAX):
            bad.add("softcap")
    if sinks is not None:
        n_ok = len(sinks.shape) == 1 and sinks.shape[0] == H
        if (sinks.dtype != "fp32" or not n_ok or (sinks.shape[0] > 1 and sinks.strides[-1] != 1)
                or sinks.ptr % 4 or sinks.device != ("cuda", 0)):
            bad.add("sinks")
    return bad


@settings(max_examples=2000, deadline=None)
@given(_WINDOWS, _CAPS, _SINKS, st.booleans(), st.sampled_from([1.0, 0.088, 1e-30, 1e30]))
def test_feature_arguments_pass_or_are_refused_by_name(window_left, softcap, sinks, causal, scale):
    bad = feature_breaches(window_left, softcap, sinks, causal, scale)
    try:
        f = check_features(window_left, softcap, sinks, heads_q=H, device=0, causal=causal, softmax_scale=scale)
    except ArgumentError as e:
        assert bad, f"refused {e} though every argument keeps the rules"
        assert e.name.split(".")[0] in bad, f"refused naming {e.name!r}, the broken ones are {sorted(bad)}"
        return
    assert not bad, f"accepted, though {sorted(bad)} break the rules"
    assert f.fields == {"window": window_left is not None, "softcap": softcap is not None, "sinks": sinks is not None}
    assert f.values["window_left"] == (window_left or 0) and isinstance(f.values["softcap"], float)
