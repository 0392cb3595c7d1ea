"""The pointer ABI description: C struct layout, layout checks, JSON round trips."""
from __future__ import annotations

import pytest

from aotc.common.abi import KernelABI, LaunchFacts, Param, layout_offsets
from aotc.common.variant import Variant
from aotc.families.sdpa_combine import params as combine_params

PARAMS = combine_params(Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="general"))


def P(*kinds: str) -> tuple[Param, ...]:
    return tuple(Param(f"p{i}", k) for i, k in enumerate(kinds))


@pytest.mark.parametrize("kinds,offsets,total", [
    ((), [], 0),
    (("ptr", "i32", "i64"), [0, 8, 16], 24),
    (("i32", "i32", "ptr"), [0, 4, 8], 16),
    (("i32", "ptr"), [0, 8], 16),            # 4 bytes of padding before an 8-byte member
    (("i32", "f32", "i32", "i64"), [0, 4, 8, 16], 24),
    (("i32", "tensormap", "i32"), [0, 64, 192], 196),  # descriptors are 64-byte aligned
    (("tensormap", "ptr"), [0, 128], 136),
])
def test_layout_offsets(kinds, offsets, total):
    assert layout_offsets(P(*kinds)) == (offsets, total)


def test_sdpa_combine_layout():
    offsets, total = layout_offsets(PARAMS)
    # 4 pointers, 6 int32 (the last, split_groups, ending at 56: no padding), then 15 int64
    assert offsets[:4] == [0, 8, 16, 24]
    assert offsets[4:10] == [32, 36, 40, 44, 48, 52]
    assert offsets[10:] == list(range(56, 176, 8))
    assert total == 176


ABI = KernelABI("k", P("ptr", "i32", "i32", "i64", "f32"))
GOOD = [(0, 8), (8, 4), (12, 4), (16, 8), (24, 4)]


def test_check_layout_accepts_exact_and_shifted_base():
    assert ABI.offsets() == [o for o, _ in GOOD]
    assert ABI.check_layout(GOOD) is None
    # the driver reports offsets from a base (e.g. 48 after a kernel-param header)
    assert ABI.check_layout([(o + 48, s) for o, s in GOOD]) is None
    assert KernelABI("empty", ()).check_layout([]) is None


def test_check_layout_detects_size_change():
    bad = list(GOOD)
    bad[1] = (8, 8)
    msg = ABI.check_layout(bad)
    assert msg and "'p1'" in msg and "size 8" in msg and "size 4" in msg


def test_check_layout_detects_offset_shift():
    bad = list(GOOD)
    bad[3] = (20, 8)
    msg = ABI.check_layout(bad)
    assert msg and "'p3'" in msg and "offset 20" in msg and "offset 16" in msg
    # an offset shift that starts mid-list, relative to a non-zero base
    shifted = [(o + 32, s) for o, s in GOOD]
    shifted[4] = (shifted[4][0] + 4, 4)
    assert "'p4'" in ABI.check_layout(shifted)


def test_check_layout_detects_count_change():
    msg = ABI.check_layout(GOOD[:-1])
    assert msg == "the kernel has 4 parameters, the ABI records 5"
    assert "6 parameters" in ABI.check_layout(GOOD + [(32, 8)])
    assert ABI.check_layout([]) is not None


def test_param_kinds():
    assert [(p.size, p.align) for p in P("ptr", "i32", "i64", "f32", "tensormap")] == [
        (8, 8), (4, 4), (8, 8), (4, 4), (128, 64)]
    with pytest.raises(ValueError, match="unknown kind 'f64'"):
        Param("x", "f64")


def test_param_json_round_trip():
    for p in P("ptr", "i32", "i64", "f32", "tensormap") + (Param("q", "ptr", 16), Param("t", "tensormap", 16)):
        assert Param.from_json(p.to_json()) == p
    # size and align may be left out of the record; an ABI recorded before pointee_align existed reads as 0
    assert Param.from_json({"name": "n", "kind": "i64"}) == Param("n", "i64")
    assert Param.from_json({"name": "q", "kind": "ptr"}) == Param("q", "ptr", 0) != Param("q", "ptr", 16)


@pytest.mark.parametrize("kind,align", [("ptr", 3), ("ptr", -4), ("i32", 4), ("f32", 16), ("tensormap", 24)])
def test_pointee_align_is_a_power_of_two_on_pointers_only(kind, align):
    with pytest.raises(ValueError, match="pointee_align"):
        Param("x", kind, align)


def test_every_family_pointer_records_its_pointee_alignment():
    from aotc.build.spec import load_spec
    from aotc.families import get_family

    for v in load_spec().variants:
        for p in get_family(v.family).params(v):
            assert (p.pointee_align > 0) == (p.kind in ("ptr", "tensormap")), (v.name, p)


@pytest.mark.parametrize("record", [
    {"name": "x", "kind": "i32", "size": 8},
    {"name": "x", "kind": "ptr", "size": 4, "align": 8},
    {"name": "x", "kind": "i64", "size": 8, "align": 4},
    {"name": "x", "kind": "tensormap", "size": 64},
])
def test_param_from_json_rejects_lying_sizes(record):
    with pytest.raises(ValueError, match="'x'"):
        Param.from_json(record)


def test_param_from_json_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown kind"):
        Param.from_json({"name": "x", "kind": "u128"})


def test_kernel_abi_and_launch_facts_round_trip():
    abi = KernelABI("sym", PARAMS)
    assert KernelABI.from_json(abi.to_json()) == abi
    lf = LaunchFacts(block=(128, 1, 1), cluster=(2, 1, 1), dynamic_smem=65536, grid_rule="g", extra={"a": 1})
    back = LaunchFacts.from_json(lf.to_json())
    assert back == lf and back.extra == {"a": 1} and back.cluster == (2, 1, 1) and back.dynamic_smem == 65536
    # cluster and smem default when a record leaves them out
    assert LaunchFacts.from_json({"block": [64, 2, 1]}) == LaunchFacts(block=(64, 2, 1))
