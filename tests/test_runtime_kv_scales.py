"""fp8 KV caches without a GPU: the kv_dtype field (a spec leaving it out gets the queries' dtype; fp8 pruned
where no e4m3 conversion or tile exists, with the reason), records from before the field, the scale checks
(every bad scale refused naming the argument), the decode and KV-write validation of fp8 pools, and the
values a KV-write plan launches with (tests/gpu/test_fp8_kv.py checks the kernels' numbers on the H200)."""
from __future__ import annotations

import pytest

from aotc.build.spec import enumerate_spec
from aotc.common.checks import check_variant, with_defaults
from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families import get_family
from aotc.families.kv_dtype import FP8, FP8_ARCHS, kv_scale_params
from aotc.runtime.decode import check_decode
from aotc.runtime.kv_scales import check_kv_scales
from aotc.runtime.kv_write import KvWritePlan, check_kv_write
from aotc.runtime.tensors import tensor
from aotc.runtime.validate import packed_strides
from test_runtime_driver import _recorded, stub, stub_library  # noqa: F401  (the stand-in libcuda fixtures)
from test_runtime_kv_write import StubRuntime

H_KV = 8


def rec(ptr, shape, dtype="fp32", strides=None, device=0):
    return tensor(ptr, shape, strides or packed_strides(shape), dtype, device)


def pools(dtype=FP8, page=16, pages=10, heads=H_KV, dim=128):
    shape = (pages, page, heads, dim)
    return rec(1 << 36, shape, dtype), rec((1 << 36) + (1 << 30), shape, dtype)


@pytest.mark.parametrize("family", ["sdpa_decode", "kv_write"])
def test_the_families_carry_kv_dtype_and_the_scale_parameters(family):
    fam = get_family(family)
    f = fam.field("kv_dtype")
    assert f.choices == ("fp16", "bf16", FP8) and f.unlisted_from == "dtype"
    prefix = "descale" if family == "sdpa_decode" else "scale"
    v = Variant.make(family, "sm_90", **({"dtype": "bf16", "head_dim": 128} if family == "kv_write" else
                                         {"dtype": "bf16", "head_dim": 128, "kv": "paged16", "layout": "dense"}))
    assert fam.params(v)[-3:] == kv_scale_params(prefix)


def test_a_spec_without_kv_dtype_keeps_the_queries_dtype():
    doc = {"family": [{"name": "sdpa_decode", "arch": ["sm_90"], "dtype": ["fp16", "bf16"], "head_dim": [128],
                       "kv": ["paged16"], "layout": ["dense"]}]}
    s = enumerate_spec(doc)
    assert sorted((v["dtype"], v["kv_dtype"]) for v in s.variants) == [("bf16", "bf16"), ("fp16", "fp16")]
    assert not s.pruned


def test_fp8_is_pruned_where_it_cannot_run_with_the_reason():
    doc = {"family": [{"name": "sdpa_decode", "arch": ["sm_80", "sm_89", "sm_90"], "dtype": ["bf16"],
                       "head_dim": [64, 128, 256], "kv": ["paged16"], "layout": ["dense"],
                       "kv_dtype": ["fp16", "bf16", FP8]}]}
    s = enumerate_spec(doc)
    got = {(v.arch, v["head_dim"], v["kv_dtype"]) for v in s.variants}
    assert ("sm_90", 128, FP8) in got and ("sm_90", 256, FP8) in got and ("sm_89", 128, FP8) in got
    reasons = {(p.values["arch"], p.values["head_dim"], p.values["kv_dtype"]): p.reason for p in s.pruned}
    assert "must be the dtype" in reasons[("sm_90", 128, "fp16")]
    assert "e4m3 conversions" in reasons[("sm_80", 128, FP8)]
    assert ("sm_90", 64, FP8) in got and ("sm_89", 64, FP8) in got  # D64: e4m3 rows in half a swizzle atom
    assert ("sm_89", 256, FP8) in got  # a D256 tile fits 99 KB
    assert set(FP8_ARCHS) >= {a for a, _, k in got if k == FP8}


def test_records_from_before_kv_dtype_read_as_the_queries_dtype():
    old = Variant.make("kv_write", "sm_90", dtype="fp16", head_dim=64)
    new = with_defaults(old)
    assert new["kv_dtype"] == "fp16"
    check_variant(old)  # accepted: such a kernel is what it says (its shorter parameter list keeps it from serving)
    with pytest.raises(Exception, match="not a valid kv_write variant"):
        check_variant(Variant.make("kv_write", "sm_80", dtype="bf16", head_dim=64, kv_dtype=FP8))


# ---- the scales ----------------------------------------------------------------------------------------
def scales(n=H_KV, dtype="fp32", ptr=1 << 40, **kw):
    return rec(ptr, (n,), dtype, **kw), rec(ptr + 4096, (n,), dtype, **kw)


def test_good_scales_and_their_values():
    k, v = pools()
    s = check_kv_scales(k, v, "bf16", *scales(), heads_kv=H_KV, device=0)
    assert s.fields == {"kv_dtype": FP8}
    assert s.values == {"k_descale": 1 << 40, "v_descale": (1 << 40) + 4096, "descale_stride_h": 1}
    one = check_kv_scales(k, v, "bf16", *scales(1), heads_kv=H_KV, device=0, prefix="scale")
    assert one.values["scale_stride_h"] == 0  # one scale for every head
    plain = check_kv_scales(*pools("bf16"), "bf16", None, None, heads_kv=H_KV, device=0)
    assert plain.fields == {"kv_dtype": "bf16"} and plain.values["k_descale"] == 0 and not plain.inputs()


@pytest.mark.parametrize("make,arg,why", [
    (lambda: (None, scales()[1]), "k_descale", "fp32 device tensor"),
    (lambda: (scales()[0], None), "v_descale", "fp32 device tensor"),
    (lambda: scales(dtype="fp16"), "k_descale.dtype", "fp32"),
    (lambda: (rec(1 << 40, (2, 4)), scales()[1]), "k_descale.shape", "1 dimensions"),
    (lambda: scales(3), "k_descale.shape[0]", "H_kv = 8"),
    (lambda: (rec(1 << 40, (H_KV,), strides=(2,)), scales()[1]), "k_descale.stride[0]", "contiguous"),
    (lambda: (rec((1 << 40) + 2, (H_KV,)), scales()[1]), "k_descale.data_ptr", "multiple of 4 bytes"),
    (lambda: (scales()[0], rec(1 << 41, (1,))), "v_descale.shape", "the shape of k_descale"),
    (lambda: (rec(1 << 40, (H_KV,), device=1), scales()[1]), "k_descale", "device"),
])
def test_bad_scales_name_the_argument(make, arg, why):
    k, v = pools()
    ks, vs = make()
    with pytest.raises(ArgumentError) as e:
        check_kv_scales(k, v, "bf16", ks, vs, heads_kv=H_KV, device=0)
    assert e.value.name.startswith(arg) and why in str(e.value), str(e.value)


def test_scales_with_a_16_bit_cache_and_mixed_pools_are_refused():
    with pytest.raises(ArgumentError, match="k_descale") as e:
        check_kv_scales(*pools("bf16"), "bf16", *scales(), heads_kv=H_KV, device=0)
    assert "belong to an fp8 cache" in str(e.value)
    k, _ = pools()
    _, v16 = pools("bf16")
    with pytest.raises(ArgumentError, match="v_cache.dtype"):
        check_kv_scales(k, v16, "bf16", *scales(), heads_kv=H_KV, device=0)
    with pytest.raises(ArgumentError, match="k_cache.dtype"):  # fp16 pools under bf16 queries
        check_kv_scales(*pools("fp16"), "bf16", None, None, heads_kv=H_KV, device=0)


# ---- decode and the KV write over fp8 pools ------------------------------------------------------------
class DecodeRuntime:
    def field_values(self, family, field, device):
        return {64, 128, 256}


def decode_args(k, v, B=2):
    q = rec(1 << 32, (B, 1, 32, 128), "bf16")
    return {"q": q, "k_cache": k, "v_cache": v, "out": rec((1 << 32) + (1 << 24), (B, 1, 32, 128), "bf16")}


def test_decode_takes_fp8_pools_with_16_byte_strides():
    k, v = pools()
    sl, pt = rec(1 << 44, (2,), "int32"), rec((1 << 44) + 4096, (2, 5), "int32")
    d = check_decode(DecodeRuntime(), 0, decode_args(k, v), sl, pt, None, None, "NHD")
    assert d.k_strides == (16 * H_KV * 128, H_KV * 128, 128)
    # rows 136 bytes apart: 8-element (16-bit) strides would pass, fp8 ones must be 16 bytes
    narrow = rec(1 << 36, (10, 16, H_KV, 128), FP8, strides=(16 * H_KV * 136, H_KV * 136, 136, 1))
    a = decode_args(narrow, narrow)
    with pytest.raises(ArgumentError, match=r"k_cache.stride\[\d\]") as e:
        check_decode(DecodeRuntime(), 0, a, sl, pt, None, None, "NHD")
    assert "multiple of 16 elements" in str(e.value)
    with pytest.raises(ArgumentError, match="v_cache.dtype"):
        check_decode(DecodeRuntime(), 0, decode_args(k, pools("bf16")[1]), sl, pt, None, None, "NHD")


class Fp8WriteRuntime(StubRuntime):
    """StubRuntime with fp8 kv_write kernels loaded (find() answers what select() gives)."""

    def find(self, family_name, device, candidates):
        return self.select(family_name, device, candidates)


def write_args(k, v, tokens=7):
    return {"key": rec(1 << 32, (tokens, H_KV, 128), "bf16"), "value": rec((1 << 32) + (1 << 24), (tokens, H_KV, 128), "bf16"),
            "k_cache": k, "v_cache": v, "slot_mapping": rec((1 << 32) + (2 << 24), (tokens,), "int64")}


def test_kv_write_plan_over_fp8_pools_launches_with_the_scales(stub):
    k, v = pools()
    ks, vs = scales()
    a = write_args(k, v)
    rt = Fp8WriteRuntime()
    plan = KvWritePlan(rt, a["key"], a["value"], k, v, a["slot_mapping"], k_scale=ks, v_scale=vs)
    assert rt.selected[-1] == [{"dtype": "bf16", "head_dim": 128, "kv_dtype": FP8}]
    slots = plan.launcher.params.slots
    assert (slots["k_scale"].value, slots["v_scale"].value, slots["scale_stride_h"].value) == (ks.ptr, vs.ptr, 1)
    with pytest.raises(ArgumentError, match="k_scale"):
        KvWritePlan(rt, a["key"], a["value"], k, v, a["slot_mapping"])
    with pytest.raises(ArgumentError, match="k_scale"):  # a scale inside a pool
        KvWritePlan(rt, a["key"], a["value"], k, v, a["slot_mapping"], k_scale=rec(k.ptr, (H_KV,)), v_scale=vs)
    plain = KvWritePlan(rt, *(write_args(*pools("bf16"))[n] for n in ("key", "value", "k_cache", "v_cache",
                                                                       "slot_mapping")))
    assert rt.selected[-1] == [{"dtype": "bf16", "head_dim": 128, "kv_dtype": "bf16"}]
    assert plain.launcher.params.slots["k_scale"].value == 0


def test_kv_write_checks_fp8_pool_strides():
    narrow = rec(1 << 36, (10, 16, H_KV, 128), FP8, strides=(16 * H_KV * 136, H_KV * 136, 136, 1))
    check_kv_write(StubRuntime(), 0, write_args(*pools()), "NHD")
    bad = {**write_args(narrow, narrow)}
    bad["v_cache"] = rec((1 << 36) + (1 << 30), narrow.shape, FP8, strides=narrow.strides)
    with pytest.raises(ArgumentError, match=r"k_cache.stride\[\d\]") as e:  # 136 bytes: not 16-byte rows
        check_kv_write(StubRuntime(), 0, bad, "NHD")
    assert "multiple of 16 elements" in str(e.value)


def test_fp8_pools_without_a_loaded_kernel_name_the_spec_field_to_build():
    class NoFp8(StubRuntime):
        def find(self, family_name, device, candidates):
            return None

    k, v = pools()
    a = write_args(k, v)
    with pytest.raises(ArgumentError) as e:
        KvWritePlan(NoFp8(), a["key"], a["value"], k, v, a["slot_mapping"], k_scale=scales()[0], v_scale=scales()[1])
    assert e.value.name == "kv_dtype" and e.value.value["kv_dtype"] == FP8
    assert 'name = "kv_write"' in e.value.expected and 'kv_dtype = ["fp8_e4m3"]' in e.value.expected
