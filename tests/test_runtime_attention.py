"""The attention entry point's host side without a GPU (aotc.runtime.attention): the TMA recipes over
NHD and HND pools and GQA groups, the refusals that depend on the kernel's Q packing (H_q / H_kv) and
on the loaded kernels (page sizes), and the family rule that prunes the page sizes a kv block cannot
use, as `aotc list --why-not` explains it. The kernel's tile scheduler (tile_scheduler.RaggedTiles)
runs on the device only, so it has no test here. Hostile arguments: test_hostile_arguments.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from aotc.cli import main
from aotc.common.errors import ArgumentError
from aotc.common.variant import Variant
from aotc.families import get_family
from aotc.families.sdpa_prefill_sm90 import ROW_GROUP_TILES, _why_invalid, draws_tiles, kv_box_rows, tma_recipe
from aotc.runtime import tensor
from aotc.runtime.attention import _groups_per_page, _recipes, check_attention
from aotc.runtime.validate import packed_strides

BASE = 1 << 32
APART = 1 << 36  # between the tensors of one call: none overlaps another


class Loaded:
    """What check_attention asks of a Runtime: the layouts of its loaded Hopper kernels (None: a kernel of
    a bundle that records no layout)."""

    def __init__(self, *pages: int):
        self.layouts = {"dense", "ragged", None} | {f"paged{p}" for p in pages}

    def field_values(self, family, field, device):
        assert (family, field, device) == ("sdpa_prefill_sm90", "layout", 0)
        return set(self.layouts)


EVERY_PAGE = Loaded(16, 32, 64, 128)


def fake_kernel(head_dim: int, page: int, block_n: int, kv_dtype: str = "bf16"):
    """A loaded kernel as _recipes reads it: the family's recorded TMA recipe for this variant."""
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout=f"paged{page}",
                     causal=True, block_n=block_n, kv_dtype=kv_dtype)
    assert get_family("sdpa_prefill_sm90").why_invalid(dict(v.fields)) is None
    launch = get_family("sdpa_prefill_sm90").launch(v)  # its recorded facts: the TMA recipe, block_m, draws_tiles
    assert launch.extra["tma"] == tma_recipe(v, block_n) and launch.extra["draws_tiles"] == draws_tiles(v)
    return SimpleNamespace(variant=v, artifact=SimpleNamespace(launch=launch))


def pool_shape(kv_layout: str, pages: int, page: int, heads_kv: int, head_dim: int) -> tuple[int, ...]:
    return (pages, page, heads_kv, head_dim) if kv_layout == "NHD" else (pages, heads_kv, page, head_dim)


def call(*, total_q=10, heads_q=8, heads_kv=2, head_dim=128, page=16, pages=6, batch=3, max_pages=4,
         kv_layout="NHD", q_strides=None, k_strides=None, v_strides=None, kv_dtype="bf16"):
    """check_attention's tensors for a valid call (bf16, packed) but for what a test changes."""
    qs, kv = (total_q, heads_q, head_dim), pool_shape(kv_layout, pages, page, heads_kv, head_dim)
    t = {"q": tensor(BASE, qs, q_strides or packed_strides(qs), "bf16"),
         "out": tensor(BASE + APART, qs, packed_strides(qs), "bf16"),
         "k_cache": tensor(BASE + 2 * APART, kv, k_strides or packed_strides(kv), kv_dtype),
         "v_cache": tensor(BASE + 3 * APART, kv, v_strides or packed_strides(kv), kv_dtype)}
    cuq = tensor(BASE + 4 * APART, (batch + 1,), (1,), "int32")
    sl = tensor(BASE + 5 * APART, (batch,), (1,), "int32")
    pt = tensor(BASE + 6 * APART, (batch, max_pages), (max_pages, 1), "int32")
    return t, cuq, sl, pt


def check(runtime=EVERY_PAGE, kv_layout="NHD", **kw):
    t, cuq, sl, pt = call(kv_layout=kv_layout, **kw)
    return t, check_attention(runtime, 0, t, cuq, sl, pt, None, kv_layout)


# ---------------------------------------------------------------------------- TMA recipes

@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_recipes_of_nhd_and_hnd_pools_and_gqa_groups(kv_layout, group):
    H_kv, P, D, pages, total_q = 2, 16, 128, 6, 10
    t, d = check(kv_layout=kv_layout, heads_q=H_kv * group, heads_kv=H_kv, head_dim=D, page=P, pages=pages,
                 total_q=total_q)
    assert (d.heads_q, d.heads_kv, d.head_dim, d.page, d.pages) == (H_kv * group, H_kv, D, P, pages)
    r, _ = _recipes(fake_kernel(D, P, 128), t, d, "bf16")
    # Q: (D, H_q, total_q) in bytes, one box a KV head's group of query heads by 64 / group tokens, 64 rows
    q = r["q"]
    assert q.dims == (D, H_kv * group, total_q)
    assert q.strides == (D * 2, H_kv * group * D * 2)
    assert q.box == (64, group, 64 // group) and q.box[1] * q.box[2] == 64
    # K and V: one logical (D, P, H_kv, pages) whatever the layout, byte strides for (token, head, page)
    token, head = (H_kv * D, D) if kv_layout == "NHD" else (D, P * D)
    for name in ("k", "v"):
        x = r[name]
        assert x.dims == (D, P, H_kv, pages)
        assert x.strides == (token * 2, head * 2, P * H_kv * D * 2)
        assert x.box == (64, P, 1, 1)  # a page's rows: a kv block of 128 is 8 such boxes
        assert (x.swizzle_bytes, x.l2_promotion_bytes) == (128, 256)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("page", [16, 64])
def test_row_group_tiles_walk_the_pools_8_row_groups(kv_layout, page):
    """D128-176 (ROW_GROUP_TILES): K and V rank 5 over the pool's groups of 8 rows whatever the layout, (64 columns,
    8 rows, chunks, row groups, H_kv) with byte strides (token, 128, 8 tokens, head), a box of 16 rows (gcd(page,
    176)) every column; a page's first group at page * kv_groups_per_page, its page stride over 8 token strides."""
    H_kv, D, pages = 2, 128, 6
    t, d = check(kv_layout=kv_layout, heads_q=8, heads_kv=H_kv, page=page, pages=pages)
    r, groups_per_page = _recipes(fake_kernel(D, page, 176), t, d, "bf16")
    token, head = (H_kv * D, D) if kv_layout == "NHD" else (D, page * D)
    assert groups_per_page == page * H_kv * D // (8 * token)  # NHD: page / 8; HND: every KV head's rows between
    for name in ("k", "v"):
        x = r[name]
        assert x.dims == (64, 8, 2, pages * groups_per_page, H_kv)
        assert x.strides == (token * 2, 128, 8 * token * 2, head * 2)
        assert x.box == (64, 8, 2, 2, 1) and (x.swizzle_bytes, x.l2_promotion_bytes) == (128, 256)


def test_row_group_tiles_walk_a_pool_of_odd_page_strides_page_by_page():
    """V's pages 64 elements further apart than K's: no whole number of 8-row strides, so both pools are walked page
    by page (kv_groups_per_page 0), a box one 8-row group of every column, each pool with its own strides."""
    padded = (16 * 2 * 128 + 64, 2 * 128, 128, 1)
    t, d = check(v_strides=padded)  # NHD [6, 16, 2, 128]
    r, groups_per_page = _recipes(fake_kernel(128, 16, 176), t, d, "bf16")
    assert groups_per_page == 0
    assert r["k"].dims == r["v"].dims == (64, 16, 2, 2, 6) and r["k"].box == r["v"].box == (64, 8, 2, 1, 1)
    assert r["k"].strides == (256 * 2, 128, 128 * 2, 4096 * 2)  # (token, 128, head, page) in bytes
    assert r["v"].strides == (256 * 2, 128, 128 * 2, (4096 + 64) * 2)


@pytest.mark.parametrize("page_stride,pages,want", [
    (16 * 256, 6, 2),            # packed NHD [6, 16, 2, 128]: P / 8
    (2 * 16 * 256, 6, 4),        # K and V pages interleaved in one cache ([pages, 2, P, H, D]): twice as far apart
    (16 * 256 + 8 * 256, 6, 3),  # pages padded by 8 tokens' rows: still whole 8-row strides
    (16 * 256 + 64, 6, 0),       # padded by 64 elements: none
    (16 * 256, (1 << 30) + 1, 0),  # row groups past 2^31 (the kernel's int32 coordinates): page by page
])
def test_row_groups_per_page_follow_the_page_stride(page_stride, pages, want):
    d = SimpleNamespace(page=16, pages=pages, k_strides=(page_stride, 256, 128), v_strides=(page_stride, 256, 128))
    assert _groups_per_page(d) == want
    other_v = SimpleNamespace(page=16, pages=6, k_strides=(16 * 256, 256, 128), v_strides=(2 * 16 * 256, 256, 128))
    assert _groups_per_page(other_v) == 0  # K's and V's differ: one kv_groups_per_page serves both, so none
    one_page = SimpleNamespace(page=16, pages=1, k_strides=(0, 256, 128), v_strides=(7, 256, 128))
    assert _groups_per_page(one_page) == 2  # one page: no page stride is ever stepped over


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_fp8_pools_are_whole_e4m3_rows_128_byte_swizzled(kv_layout):
    """An fp8 pool's K/V boxes are a page's rows of D bytes, 128-byte swizzled (the kernel's staging rings, read
    without bank conflicts by the conversion warps), byte strides of one byte an element; Q's recipe is the
    16-bit one."""
    H_kv, P, D, pages = 2, 16, 128, 6
    t, d = check(kv_layout=kv_layout, heads_q=8, heads_kv=H_kv, kv_dtype="fp8_e4m3")
    r, _ = _recipes(fake_kernel(D, P, 128, "fp8_e4m3"), t, d, "bf16")
    assert r["q"].dtype == "bf16" and r["q"].box == (64, 4, 16) and r["q"].swizzle_bytes == 128
    token, head = (H_kv * D, D) if kv_layout == "NHD" else (D, P * D)
    for name in ("k", "v"):
        x = r[name]
        assert x.dtype == "fp8_e4m3" and x.dims == (D, P, H_kv, pages)
        assert x.strides == (token, head, P * H_kv * D)
        assert x.box == (D, P, 1, 1) and x.swizzle_bytes == 128


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_d64_fp8_pools_are_64_byte_swizzled_on_two_consumer_warpgroups(kv_layout):
    """D64 over fp8: a page's rows of 64 e4m3 bytes, 64-byte swizzled (the conversion warps read the staging ring
    through that swizzle), on the fp8 tile of two consumer warpgroups (block_m 128: the conversion warps' registers)."""
    H_kv, P, D, pages = 2, 16, 64, 6
    t, d = check(kv_layout=kv_layout, heads_q=8, heads_kv=H_kv, head_dim=D, kv_dtype="fp8_e4m3")
    kernel = fake_kernel(D, P, 128, "fp8_e4m3")
    r, _ = _recipes(kernel, t, d, "bf16")
    for name in ("k", "v"):
        assert r[name].box == (D, P, 1, 1) and r[name].swizzle_bytes == 64 and r[name].dtype == "fp8_e4m3"
    assert r["q"].box == (64, 4, 16) and r["q"].swizzle_bytes == 128
    fam = get_family("sdpa_prefill_sm90")
    facts = fam.launch(kernel.variant)
    assert facts.block == (384, 1, 1) and facts.extra["block_m"] == 128 and facts.extra["block_n"] == 128
    bf16 = fam.launch(Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=D, layout=f"paged{P}",
                                   causal=True, block_n=128))
    assert bf16.extra["block_m"] == 192 and bf16.block == (512, 1, 1)  # the 16-bit D64 tile: three


def test_fp8_recipe_is_the_kernels_own():
    """The swizzle of an fp8 pool's boxes is the one the kernel's bundle recorded (kv_swizzle_bytes), not this
    runtime's default: a kernel built before 0017eed (unswizzled staging rings, 0) keeps getting unswizzled
    boxes."""
    t, d = check(heads_q=8, heads_kv=2, kv_dtype="fp8_e4m3")
    kernel = fake_kernel(128, 16, 128, "fp8_e4m3")
    kernel.artifact.launch.extra["tma"]["kv_swizzle_bytes"] = 0
    r, _ = _recipes(kernel, t, d, "bf16")
    assert r["k"].swizzle_bytes == r["v"].swizzle_bytes == 0 and r["q"].swizzle_bytes == 128


def test_fp8_pools_need_16_element_strides():
    """e4m3 rows are copied 16 bytes at a time: a token stride of 8 elements (8 bytes) is refused."""
    kv = (6, 16, 2, 136)  # NHD, head dim 128 padded to 136 elements
    with pytest.raises(ArgumentError, match="k_cache"):
        check(kv_dtype="fp8_e4m3", k_strides=(16 * 2 * 136, 2 * 136, 136, 1), v_strides=packed_strides(kv))


def test_fp8_variants_are_paged_d64_and_d128_kv_blocks_of_128():
    fields = {"dtype": "bf16", "causal": True, "kv_dtype": "fp8_e4m3", "arch": "sm_90a"}
    assert _why_invalid({**fields, "head_dim": 128, "block_n": 128, "layout": "paged16"}) is None
    assert _why_invalid({**fields, "head_dim": 64, "block_n": 128, "layout": "paged16"}) is None
    assert "for the paged layouts" in _why_invalid({**fields, "head_dim": 128, "block_n": 128, "layout": "ragged"})
    why = _why_invalid({**fields, "head_dim": 256, "block_n": 80, "layout": "paged16"})
    assert "staging rings" in why and "sdpa_prefill, takes the others" in why
    assert "staging rings" in _why_invalid({**fields, "head_dim": 128, "block_n": 176, "layout": "paged16"})


@pytest.mark.parametrize("head_dim,block_n,page,rows", [
    (64, 128, 16, 16), (128, 128, 64, 64), (128, 128, 128, 128), (128, 176, 16, 16), (256, 80, 16, 16)])
def test_a_kv_box_is_a_page_or_a_kv_block_inside_one(head_dim, block_n, page, rows):
    t, d = check(head_dim=head_dim, page=page)
    r, groups_per_page = _recipes(fake_kernel(head_dim, page, block_n), t, d, "bf16")
    if (head_dim, block_n) in ROW_GROUP_TILES:  # every column of a box's rows, its 8-row groups
        assert r["k"].box == r["v"].box == (64, 8, head_dim // 64, rows // 8, 1)
        assert r["k"].dims[:3] == (64, 8, head_dim // 64) and groups_per_page == page // 8
    else:
        assert r["k"].box == r["v"].box == (64, rows, 1, 1)
        assert r["k"].dims[:2] == (head_dim, page) and groups_per_page == 0


def test_k_and_v_pools_keep_their_own_strides():
    padded = (16 * 2 * 128 + 64, 2 * 128, 128, 1)  # V's pages 64 elements further apart than K's
    t, d = check(v_strides=padded)  # NHD [6, 16, 2, 128]
    r, _ = _recipes(fake_kernel(128, 16, 128), t, d, "bf16")
    assert r["k"].strides == (256 * 2, 128 * 2, 4096 * 2)  # (token, head, page) in bytes
    assert r["v"].strides == (256 * 2, 128 * 2, (4096 + 64) * 2)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_extent_one_dims_encode_whatever_their_strides(kv_layout):
    """One token, one query head, one KV head, one page: a stride never stepped over (0 here, a broadcast)
    is not the descriptor's business; it encodes 16 bytes instead. The token stride is the exception: a
    plan serves later steps of other token counts with it, so one token's q carries its real stride."""
    kv = pool_shape(kv_layout, 1, 16, 1, 64)
    kv_strides = tuple(0 if n == 1 else s for n, s in zip(kv, packed_strides(kv)))
    t, d = check(kv_layout=kv_layout, total_q=1, heads_q=1, heads_kv=1, head_dim=64, pages=1,
                 q_strides=(64, 0, 1), k_strides=kv_strides, v_strides=kv_strides)
    r, _ = _recipes(fake_kernel(64, 16, 128), t, d, "bf16")
    assert r["q"].dims == (64, 1, 1) and r["q"].strides == (16, 64 * 2)
    assert r["k"].dims == (64, 16, 1, 1) and r["k"].strides == (64 * 2, 16, 16)


@pytest.mark.parametrize("token_stride", [0, 4, -64])
def test_a_token_stride_later_counts_cannot_use_is_refused(token_stride):
    """q [1, H, D] whose token stride is 0 (a broadcast), not a multiple of 8 or negative: correct for one
    token, wrong for the next step's count, which the same plan serves; refused naming q.stride[0]."""
    with pytest.raises(ArgumentError, match=r"q\.stride\[0\]"):
        check(total_q=1, heads_q=1, heads_kv=1, head_dim=64, q_strides=(token_stride, 64, 1))


def test_an_empty_step_still_encodes():
    """total_q = 0 (no query this step): Q's descriptor has one row, never loaded."""
    t, d = check(total_q=0, batch=0, max_pages=0)
    r, _ = _recipes(fake_kernel(128, 16, 128), t, d, "bf16")
    assert r["q"].dims == (128, 8, 1)


# ---------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("heads_q,heads_kv", [(65, 1), (128, 1), (130, 2), (0, 2)])
def test_a_group_over_64_is_refused(heads_q, heads_kv):
    """The kernel packs each token's query heads of a KV head into one 64-row slab; H_q = 0 is group 0,
    refused as such (not a ZeroDivisionError)."""
    with pytest.raises(ArgumentError, match="1 to 64") as e:
        check(heads_q=heads_q, heads_kv=heads_kv)
    assert e.value.name == "H_q / H_kv" and e.value.value == heads_q // heads_kv


@pytest.mark.parametrize("group", [1, 2, 3, 5, 6, 7, 12, 16, 32, 48, 64])
def test_every_group_up_to_64_is_served(group):
    """Groups that do not divide 64 too (Qwen2.5's 28/4 and 40/8): a slab holds 64 // group tokens."""
    _, d = check(heads_q=2 * group, heads_kv=2)
    assert d.heads_q // d.heads_kv == group


@pytest.mark.parametrize("group", [3, 5, 7, 48])
def test_q_box_of_a_group_not_dividing_64(group):
    """Q's box is group heads by 64 // group tokens: group * (64 // group) rows of the 64-row slab."""
    t, d = check(heads_q=2 * group, heads_kv=2)
    r, _ = _recipes(fake_kernel(128, 16, 128), t, d, "bf16")
    assert r["q"].box == (64, group, 64 // group)


@pytest.mark.parametrize("kv_layout,axis", [("NHD", 1), ("HND", 2)])
def test_a_page_size_no_loaded_kernel_serves_is_refused(kv_layout, axis):
    runtime = Loaded(16, 64)
    check(runtime, kv_layout, page=64)
    with pytest.raises(ArgumentError, match=r"a page size the loaded kernels serve: \[16, 64\]") as e:
        check(runtime, kv_layout, page=32)
    assert e.value.name == f"k_cache.shape[{axis}]" and e.value.value == 32
    with pytest.raises(ArgumentError, match=r"serve: \[\]"):  # dense and ragged kernels only
        check(Loaded(), kv_layout, page=16)


# ---------------------------------------------------------------------------- the family's page rule

@pytest.mark.parametrize("page,block_n,rows", [
    (16, 80, 16), (32, 80, 16), (64, 80, 16), (128, 80, 16),  # D256's tile: 16-row boxes inside a page
    (16, 128, 16), (32, 128, 32), (64, 128, 64), (128, 128, 128),  # whole pages, or the block inside one
    (16, 176, 16), (32, 176, 16), (64, 176, 16), (128, 176, 16)])
def test_a_kv_block_is_boxes_inside_pages(page, block_n, rows):
    assert kv_box_rows(page, block_n) == rows


def test_every_page_size_serves_every_kv_tile():
    for head_dim, block_n in ((256, 80), (128, 176), (128, 128), (64, 128)):
        fields = {"dtype": "bf16", "head_dim": head_dim, "causal": True, "block_n": block_n}
        for page in (16, 32, 64, 128):
            assert _why_invalid({**fields, "layout": f"paged{page}"}) is None
            assert get_family("sdpa_prefill_sm90").why_invalid({**fields, "layout": f"paged{page}"}) is None
    untuned = {"dtype": "bf16", "head_dim": 128, "causal": True, "block_n": 80, "layout": "paged16"}
    assert "block_n 80 is not a tile of head_dim 128" in _why_invalid(untuned)


def test_list_builds_every_page_size_of_a_tile_and_explains_an_untuned_one(tmp_path, capsys):
    spec = tmp_path / "paged.toml"
    spec.write_text('[[family]]\nname = "sdpa_prefill_sm90"\narch = ["sm_90a"]\ndtype = "bf16"\nhead_dim = [128, 256]\n'
                    'layout = ["paged16", "paged32", "paged64", "paged128"]\ncausal = true\nblock_n = 80\n')
    assert main(["list", str(spec), "--why-not", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["variant"]["layout"] for r in doc["variants"]) == ["paged128", "paged16", "paged32", "paged64"]
    assert all(r["variant"]["head_dim"] == 256 for r in doc["variants"])
    assert sorted(p["values"]["layout"] for p in doc["pruned"]) == ["paged128", "paged16", "paged32", "paged64"]
    assert all("block_n 80 is not a tile of head_dim 128" in p["reason"] for p in doc["pruned"])
