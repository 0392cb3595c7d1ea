"""The Hopper prefill family's runtime side without a GPU: TMA recipes from tensors, their
validation, descriptor re-encoding only for new pointers, and family dispatch by compute capability."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import aotc.runtime as rt_mod
from aotc.common.abi import LaunchFacts
from aotc.common.errors import ArgumentError
from aotc.families import get_family
from aotc.runtime import driver, tma
from aotc.runtime.prefill import HOPPER, PICKED_FROM, hopper_candidates, hopper_recipes
from aotc.common.variant import Variant


def fake_kernel(layout: str, head_dim: int = 128):
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout=layout, causal=False,
                     block_n={64: 128, 128: 128, 256: 80}[head_dim])
    facts = get_family("sdpa_prefill_sm90").launch(v)
    return SimpleNamespace(variant=v, artifact=SimpleNamespace(launch=facts))


def bshd(B, S, H, D, ptr=1 << 20, strides=None):
    strides = strides or (S * H * D, H * D, D, 1)
    return rt_mod.tensor(ptr, (B, S, H, D), strides, "bf16")


def test_dense_recipe_is_tma_order_in_bytes():
    t = {n: bshd(2, 1000, 8, 128) for n in ("q", "k", "v")}
    recipes, why = hopper_recipes(fake_kernel("dense"), t, False, "bf16")
    assert why is None
    q = recipes["q"]
    assert q.dims == (128, 1000, 8, 2)  # (D, S, H, B), innermost first
    assert q.strides == (8 * 128 * 2, 128 * 2, 1000 * 8 * 128 * 2)  # bytes, for S, H, B
    assert q.box == (64, 64, 1, 1) and recipes["k"].box[:2] == (64, 128)
    assert q.swizzle_bytes == 128


def test_ragged_recipe_is_rank_3():
    t = {n: rt_mod.tensor(1 << 20, (300, 4, 64), (4 * 64, 64, 1), "bf16") for n in ("q", "k", "v")}
    recipes, why = hopper_recipes(fake_kernel("ragged", 64), t, True, "bf16")
    assert why is None and recipes["k"].dims == (64, 300, 4) and recipes["k"].strides == (512, 128)


def test_extent_one_and_empty_dims_still_encode():
    # B = 1 with a junk batch stride, S = 0: neither is ever stepped over
    t = {"q": bshd(1, 0, 8, 128, strides=(3, 8 * 128, 128, 1)), "k": bshd(1, 5, 8, 128), "v": bshd(1, 5, 8, 128)}
    recipes, why = hopper_recipes(fake_kernel("dense"), t, False, "bf16")
    assert why is None
    assert recipes["q"].dims == (128, 1, 8, 1) and recipes["q"].strides[2] % 16 == 0


def test_strides_tma_cannot_express_are_refused_with_the_reason():
    k = bshd(3, 64, 4, 128, strides=(0, 4 * 128, 128, 1))  # a K broadcast over the batch
    t = {"q": bshd(3, 64, 4, 128), "k": k, "v": k}
    recipes, why = hopper_recipes(fake_kernel("dense"), t, False, "bf16")
    assert recipes is None and "k.stride[0]" in why
    huge = bshd(2, 64, 4, 128, strides=(1 << 40, 4 * 128, 128, 1))  # 2^41 bytes
    recipes, why = hopper_recipes(fake_kernel("dense"), {"q": huge, "k": huge, "v": huge}, False, "bf16")
    assert recipes is None and "2^40" in why


def test_recipe_without_tma_facts_is_refused():
    k = fake_kernel("dense")
    k.artifact.launch = LaunchFacts(block=(384, 1, 1))
    recipes, why = hopper_recipes(k, {n: bshd(1, 8, 1, 128) for n in "qkv"}, False, "bf16")
    assert recipes is None and "no TMA recipe" in why


@pytest.mark.parametrize("field,value,match", [
    ("strides", (8,), "multiple of 16"),
    ("dims", (128, 0), r"in \[1, 2\^32\]"),
    ("dtype", "fp32", "TMA descriptor"),
])
def test_tiled_recipe_check(field, value, match):
    base = dict(dtype="bf16", dims=(128, 64), strides=(256,), box=(64, 64))
    base[field] = value
    with pytest.raises(ArgumentError, match=match):
        tma.TiledRecipe(**base).check("q")


def test_descriptor_reencoded_only_for_a_new_pointer(monkeypatch):
    calls = []
    monkeypatch.setattr(tma.Encoder, "__call__", lambda self, address: calls.append(address) or bytes(128))
    slot = tma.DescriptorSlot(tma.TiledRecipe("bf16", (128, 64), (256,), (64, 64)), 0x1000)
    assert calls == [0x1000]
    assert slot.update(0x1000) is None and calls == [0x1000]
    assert slot.update(0x2000) == bytes(128) and calls == [0x1000, 0x2000]


def test_misaligned_address_is_refused_before_the_driver():
    with pytest.raises(ArgumentError, match="16-byte aligned"):
        tma.Encoder(tma.TiledRecipe("bf16", (128, 64), (256,), (64, 64)))(0x1008)


def test_dispatch_prefers_hopper_only_where_it_runs(monkeypatch):
    def kern(family, arch, **fields):
        return SimpleNamespace(variant=Variant.make(family, arch, **fields))

    want = dict(dtype="bf16", head_dim=128, layout="dense", causal=False)
    runtime = rt_mod.Runtime([])
    monkeypatch.setattr(runtime, "_fits", lambda k: True)  # dispatch order only (headers: test_bundle_trust.py)
    runtime.kernels = {"sdpa_prefill_sm90": [kern("sdpa_prefill_sm90", "sm_90a", **want)],
                       "sdpa_prefill": [kern("sdpa_prefill", "sm_80", strides="general", **want)]}
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
    assert runtime.find("sdpa_prefill_sm90", 0, [want]).variant.arch == "sm_90a"
    for cc in ((8, 0), (8, 9), (10, 0), (12, 0)):  # an "a" cubin runs on its own capability only
        monkeypatch.setattr(driver, "compute_capability", lambda dev, cc=cc: cc)
        assert runtime.find("sdpa_prefill_sm90", 0, [want]) is None
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (8, 9))
    assert runtime.select("sdpa_prefill", 0, [{**want, "strides": "general"}]).variant.arch == "sm_80"


def test_the_kv_tile_is_picked_by_its_launch_fact(monkeypatch):
    """Dispatch reads each tile's launch fact picked_from_seqlen_kv: D128 dense runs 176 from 8192 keys, 128 below;
    a tile whose fact says otherwise is picked where its fact says, one without it (an older aotc) only alone."""
    from aotc.families.sdpa_prefill_sm90 import PICKED_FROM_SEQLEN_KV

    def kern(fact="family", **fields):
        v = Variant.make(HOPPER, "sm_90a", **fields)
        extra = {} if "block_n" not in fields else dict(get_family(HOPPER).launch(v).extra)
        if fact != "family":
            extra.pop(PICKED_FROM, None)
            if fact is not None:
                extra[PICKED_FROM] = fact
        return SimpleNamespace(variant=v, recorded_fact=extra.get)

    want = dict(dtype="bf16", head_dim=128, layout="dense", causal=False)
    runtime = rt_mod.Runtime([])
    monkeypatch.setattr(runtime, "_fits", lambda k: True)  # dispatch order only (headers: test_bundle_trust.py)
    runtime.kernels = {HOPPER: [kern(**want, block_n=128), kern(**want, block_n=176),
                                kern(**{**want, "head_dim": 256}, block_n=80)]}
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))

    def picked(seqlen_kv):
        return runtime.find(HOPPER, 0, hopper_candidates(runtime, 0, want, seqlen_kv)).variant.get("block_n")

    long_kv = PICKED_FROM_SEQLEN_KV[128, 176]["dense"]
    assert long_kv == 8192
    assert [picked(s) for s in (0, 1, 4096, long_kv - 1, long_kv, 1 << 20)] == [128, 128, 128, 128, 176, 176]
    # the fact, not a table of the runtime's, decides
    runtime.kernels[HOPPER][1] = kern(fact=1000, **want, block_n=176)
    assert [picked(s) for s in (999, 1000)] == [128, 176]
    # a wide tile without the fact (an older aotc's) is never preferred; alone it still runs
    runtime.kernels[HOPPER][1] = kern(fact=None, **want, block_n=176)
    assert picked(1 << 20) == 128
    runtime.kernels[HOPPER] = [kern(fact=None, **want, block_n=176), kern(**{**want, "head_dim": 256}, block_n=80)]
    assert picked(1) == 176 and picked(1 << 20) == 176
    # a head dim with one width runs it at every length (D256's 80 is not offered to D128 and back)
    runtime.kernels[HOPPER] = [kern(**want, block_n=176), kern(**{**want, "head_dim": 256}, block_n=80)]
    assert picked(1) == 176 and picked(long_kv) == 176
    # paged variants record their own bound
    paged = {**want, "layout": "paged16"}
    assert get_family(HOPPER).launch(Variant.make(HOPPER, "sm_90a", **paged, block_n=176)).extra[PICKED_FROM] == 4096
    assert get_family(HOPPER).launch(Variant.make(HOPPER, "sm_90a", **paged, block_n=128)).extra[PICKED_FROM] == 0
    # a bundle built before the field existed: its variants have no block_n and still match
    runtime.kernels[HOPPER] = [kern(**want)]
    assert hopper_candidates(runtime, 0, want, long_kv) == [want] and picked(long_kv) is None
