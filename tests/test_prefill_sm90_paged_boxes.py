"""sdpa_prefill_sm90's paged K/V loads, run as plain Python: the kernel's own page_id and load_kv_paged (their
source, the DSL decorators dropped, the warp's lanes run one after another, TMA copies and page-table reads
recorded), for every kv block of sequences ending anywhere, against the pool layout:

    key t of the sequence = row t % P of page page_table[b, t // P]

Each TMA box must land key t in ring row t % block_n of its stage (every column chunk of it: the row-group tiles'
rings hold each 8-row group's chunks side by side, a box bringing every chunk of its rows; the other 16-bit tiles'
rings are chunk-major, a box one chunk), start inside a page and end inside the same one, read page-table entries
of the sequence's own pages only, and lie out of the pool (TMA's zero fill) past its end; the expected bytes must
be the boxes' bytes. Row-group tiles (ROW_GROUP_TILES) are checked along the pool's row groups (page strides of 2
and 3 pages' rows) and, where the page stride is no multiple of 8 rows', as 8-row groups from their pages
(kv_groups_per_page 0). Tiles: every (head dim, block_n) at every page size, whole pages a
box (page < block_n), a block inside a page (page >= block_n), and boxes of 16 rows where neither divides the
other (D256's 80 keys, D128's 176, over pages of 32-128); bf16 and fp8 pools. No GPU, no DSL compile."""
import ast
import contextlib
import random
import types

import pytest

pytest.importorskip("cutlass")

from aotc.common.variant import Variant  # noqa: E402
from aotc.families.sdpa_prefill_sm90 import FP8_TILES, ROW_GROUP_TILES, TILES, kv_box_rows, tma_recipe  # noqa: E402
from aotc.kernels import sdpa_prefill_sm90 as kernel  # noqa: E402

METHODS = ("page_id", "row_group", "load_kv_paged", "first_box_row", "box_row", "ring_offset")
PAGES = (16, 32, 64, 128)


class _Warp:
    """The shims' state: which lane runs, what the elected lane issued, which page-table entries were read."""

    def __init__(self, table):
        self.lane, self.table, self.copies, self.reads, self.tx = 0, table, [], [], []
        self.pages = None  # every lane's page_id() result, for shuffle_sync


def _shims(warp: _Warp):
    arch = types.SimpleNamespace(
        mbarrier_wait=lambda *a: None,
        mbarrier_arrive_and_expect_tx=lambda bar, tx: warp.tx.append(tx),
        shuffle_sync=lambda value, src: warp.pages[src],
        elect_one=contextlib.nullcontext)
    cute = types.SimpleNamespace(arch=arch)
    cutlass = types.SimpleNamespace(const_expr=lambda x: x, range_constexpr=lambda *a: range(*a), Constexpr=object)
    prims = types.SimpleNamespace(
        cp_async_bulk_tensor_shared_cta_global=lambda dst, tmap, coords, bar: warp.copies.append((dst, list(coords))))
    return {"cute": cute, "cutlass": cutlass, "prims": prims, "Int32": int, "Int64": int,
            "TMA_BOX_COLS": kernel.TMA_BOX_COLS, "OUT_OF_POOL": kernel.OUT_OF_POOL,
            "OUT_OF_INT32": kernel.OUT_OF_INT32}


class _PageTable:
    def __init__(self, warp):
        self.warp = warp

    def __getitem__(self, i):
        self.warp.reads.append(i)
        return self.warp.table[i]


def _plain(k, warp: _Warp, source: str):
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "SdpaPrefillSm90")
    funcs = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in METHODS]
    assert sorted(f.name for f in funcs) == sorted(METHODS)
    for f in funcs:
        f.decorator_list = []
    ns = _shims(warp)
    exec(compile(ast.Module(body=funcs, type_ignores=[]), kernel.__file__, "exec"), ns)
    obj = types.SimpleNamespace(**{a: getattr(k, a) for a in ("bn", "D", "page", "kv_rows", "kv_boxes", "log2_page",
                                                               "chunks", "fp8", "kv_tx", "kv_issuers",
                                                               "grouped_kv")})
    obj.ring = lambda g: (g % k.stages, (g // k.stages) & 1)
    for name in METHODS:
        setattr(obj, name, types.MethodType(ns[name], obj))
    return obj


def _kernel(head_dim: int, block_n: int, page: int, fp8: bool):
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout=f"paged{page}",
                     causal=True, block_n=block_n, kv_dtype="fp8_e4m3" if fp8 else "bf16")
    return kernel.SdpaPrefillSm90(v)


def _box_errors(head_dim: int, block_n: int, page: int, fp8: bool, source: str | None = None,
                groups_per_page: int | None = None) -> tuple[list, object]:
    """Every wrong row of every kv block; 16-bit pools along row groups of page strides of 2 and 3 pages' rows
    and as 8-row groups from their pages (groups_per_page 0), or only the given groups_per_page."""
    k = _kernel(head_dim, block_n, page, fp8)
    modes = [None]
    if k.grouped_kv:
        modes = [groups_per_page] if groups_per_page is not None else [2 * page // 8, 3 * page // 8, 0]
    errors = []
    for gpp in modes:
        errors += [f"groups_per_page {gpp}: {e}" for e in _mode_errors(k, page, fp8, source, gpp)]
    return errors, k


def _mode_errors(k, page: int, fp8: bool, source: str | None, gpp: int | None) -> list:
    P, BN, D, cols = page, k.bn, k.D, kernel.TMA_BOX_COLS
    elem = 1 if fp8 else 2
    table = random.Random(7).sample(range(1, 50000), 512)  # distinct page ids, more than any sequence here owns
    pt_row, pt_stride = 5, 3  # the sequence's page-table row starts at entry 5, its pages 3 entries apart
    warp = _Warp({pt_row + i * pt_stride: pg for i, pg in enumerate(table)})
    obj = _plain(k, warp, source or open(kernel.__file__).read())
    base, stages, kv_head = 1 << 20, k.stages, 3
    chunks = 1 if fp8 else D // cols  # column chunks of a ring row (fp8: one row of D bytes)
    if fp8:  # a copy: whole e4m3 rows, a box of kv_rows
        box_rows, box_chunks = k.kv_rows, 1
    elif k.grouped_kv:  # every chunk of kv_rows rows, or (no row groups) of 8
        box_rows, box_chunks = (k.kv_rows if gpp else 8), chunks
    else:  # one chunk of kv_rows rows
        box_rows, box_chunks = k.kv_rows, 1
    box_bytes = box_rows * box_chunks * (D if fp8 else cols) * elem

    def ring_row_of(off: int, chunk: int) -> int | None:
        """The ring row whose chunk starts at element offset `off` of the stage (None: no row's start): fp8's staging
        ring row-major; row groups: each 8-row group's chunks side by side; else chunk-major."""
        if fp8:
            row, rest = divmod(off, D)
        elif k.grouped_kv:
            group, rest = divmod(off, 8 * D)
            within, rest2 = divmod(rest - chunk * 8 * cols, cols)
            return group * 8 + within if rest2 == 0 and 0 <= within < 8 else None
        else:
            row, rest = divmod(off - chunk * BN * cols, cols)
        return row if rest == 0 else None

    errors = []
    for s_kv in sorted({1, 15, 16, 17, BN - 1, BN, BN + 1, P - 1, P, P + 1, 3 * P + 5, 5 * BN + 7, 1000}):
        ctx = types.SimpleNamespace(s_kv=s_kv, page_table=_PageTable(warp), pt_row=pt_row, pt_stride_p=pt_stride,
                                    kv_groups_per_page=gpp)
        for n in range(-(-s_kv // BN)):
            warp.copies, warp.reads, warp.tx = [], [], []
            g = n + 3  # a ring position: the stage follows from it
            tma = types.SimpleNamespace(get_ptr=lambda: None)
            where = f"s_kv {s_kv} block {n}"
            # each issuing warp's share of the boxes (16-bit: kv_issuers warps a ring, boxes alternating), its
            # bytes expected with its own arrive
            for first in range(k.kv_issuers):
                warp.pages = [obj.page_id(ctx, n, lane, first, k.kv_issuers) for lane in range(32)]
                before = len(warp.copies)
                obj.load_kv_paged(tma, base, lambda s: 2 * s, lambda s: 2 * s + 1, g, n, None, kv_head, 0, first,
                                  k.kv_issuers, gpp)
                share = (len(warp.copies) - before) * box_bytes
                if warp.tx[-1:] != [share]:
                    errors.append(f"{where}: share {first} expects {warp.tx[-1:]} bytes, its boxes bring {share}")
            for i in warp.reads:
                if (i - pt_row) % pt_stride or not 0 <= (i - pt_row) // pt_stride * P < s_kv:
                    errors.append(f"{where}: reads page-table entry {i}, not one of the sequence's pages")
            if len(warp.tx) != k.kv_issuers or sum(warp.tx) != k.kv_tx or len(warp.copies) * box_bytes != k.kv_tx:
                errors.append(f"{where}: expects {warp.tx} bytes, {len(warp.copies)} boxes of {box_bytes} bring "
                              f"{len(warp.copies) * box_bytes}")
            stage_base = base + (g % stages) * BN * D  # (pointer arithmetic: in elements of the ring)
            landed = {}  # (column chunk, ring row) -> (page, page row); page -1: out of the pool
            for dst, coords in warp.copies:
                off = dst - stage_base
                if (off * elem) % 1024:  # the 128-byte swizzle (64 at fp8 D64) repeats every 1024 bytes
                    errors.append(f"{where}: a box lands {off * elem} bytes into its stage, off the swizzle atom")
                if k.grouped_kv and gpp:
                    *zeros, at, head = coords
                    pg, row, chunk = (at // gpp, at % gpp * 8, 0) if at >= 0 else (-1, 0, 0)
                    if any(zeros) or (at >= 0 and at % gpp >= P // 8):
                        errors.append(f"{where}: a row-group box at {coords} (its page's groups: {P // 8})")
                elif k.grouped_kv:
                    col, row, chunk, head, pg = coords
                    if col or chunk or row % 8:
                        errors.append(f"{where}: an 8-row box at {coords}")
                else:
                    col, row, head, pg = coords
                    chunk = col // cols
                ring_row = ring_row_of(off, chunk)
                if ring_row is None:
                    errors.append(f"{where}: a box lands at element {off}, no ring row's start")
                    continue
                if head != kv_head or not 0 <= row or row + box_rows > P:
                    errors.append(f"{where}: box at page row {row} head {head} (rows {box_rows}, page {P})")
                for c in range(chunk, chunk + box_chunks):
                    for r in range(box_rows):
                        landed[c, ring_row + r] = (pg, row + r)
            for chunk in range(chunks):
                for r in range(BN):
                    t = n * BN + r
                    want = (table[t // P], t % P) if t < s_kv and (t - r % k.kv_rows) < s_kv else None
                    got = landed.get((chunk, r))
                    if t - r % k.kv_rows >= s_kv:  # a box starting past the end: out of the pool, zeros
                        ok = got is not None and got[0] == -1
                    elif t >= s_kv:  # past the end inside a box that starts before it: that page's rows (masked)
                        ok = got == (table[t // P], t % P)
                    else:
                        ok = got == want
                    if not ok:
                        errors.append(f"{where}: chunk {chunk} ring row {r} (key {t}) gets {got}, wants {want}")
    return errors


CASES = ([(d, bn, p, False) for d, bn in TILES for p in PAGES]
         + [(d, bn, p, True) for d, bn in FP8_TILES for p in PAGES])


@pytest.mark.parametrize("head_dim,block_n,page,fp8", CASES)
def test_every_key_lands_in_its_ring_row_from_its_page(head_dim, block_n, page, fp8):
    errors, k = _box_errors(head_dim, block_n, page, fp8)
    whole = block_n % page == 0 or page % block_n == 0  # whole pages a box, or the block inside one page
    assert k.kv_rows == kv_box_rows(page, block_n) == (min(page, block_n) if whole else 16)
    assert errors == [], f"{len(errors)} wrong rows, e.g. {errors[:3]}"


@pytest.mark.parametrize("head_dim,block_n,page,fp8", CASES)
def test_the_recorded_tma_recipe_boxes_the_kernels_rows(head_dim, block_n, page, fp8):
    """What the runtime encodes the pool's descriptors from (the bundle's recipe) is what the kernel loads."""
    k = _kernel(head_dim, block_n, page, fp8)
    recipe = tma_recipe(k.variant, block_n)
    assert recipe["box_rows"] == {"q": 64, "k": k.kv_rows, "v": k.kv_rows}
    box_cols = recipe.get("kv_box_cols", recipe["box_cols"])  # fp8: whole e4m3 rows
    assert k.kv_boxes * k.kv_rows == block_n and k.kv_tx == k.kv_boxes * k.kv_rows * head_dim * (1 if fp8 else 2)
    assert box_cols == (head_dim if fp8 else kernel.TMA_BOX_COLS)


def test_a_page_of_fewer_than_16_tokens_is_refused():
    """Boxes of 8 rows would put fp8 D64's boxes off the 1024-byte swizzle atom; the layouts have no such page."""
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout="paged8", causal=True,
                     block_n=128, kv_dtype="bf16")
    with pytest.raises(ValueError, match="page size 8: a power of two of at least 16 tokens"):
        kernel.SdpaPrefillSm90(v)


def test_the_emulation_sees_a_box_read_from_the_wrong_row():
    """The check can fail: at page 32 under D256's 80-key blocks, every box taken from its block's first row in
    the page (each box's own row dropped) reads half the keys from the wrong rows."""
    source = open(kernel.__file__).read()
    own_row = "return (row + j * self.kv_rows) & (self.page - 1)"
    assert source.count(own_row) == 1
    errors, _ = _box_errors(256, 80, 32, False, source.replace(own_row, "return row"))
    assert errors and all("gets" in e for e in errors)


@pytest.mark.parametrize("head_dim,block_n,page,fp8", [(128, 176, 16, False), (128, 128, 128, False),
                                                       (128, 128, 16, True)])
def test_the_producer_warps_issuing_each_ring(head_dim, block_n, page, fp8):
    """16-bit pools: two warps a ring where a kv block is several boxes (warps 0 and 1 K, 2 and 3 V), one where it
    is one box (warps 0 and 2); fp8: warp 0 alone (warps 1..3 convert). Every issuer past warp 0 takes the tiles."""
    k = _kernel(head_dim, block_n, page, fp8)
    want = 1 if fp8 or k.kv_boxes == 1 else 2
    assert k.kv_issuers == want
    helpers = k.CONVERT_WARPS if fp8 else 2 * want - 1
    assert k.tile_takers == k.consumer_warps + helpers


def test_the_emulation_sees_a_share_reading_another_shares_pages():
    """The check can fail: each lane's page taken for box first + lane (the share's step dropped) puts the second
    issuer's boxes over the wrong pages."""
    source = open(kernel.__file__).read()
    spaced = "box = first + lane * step"
    assert source.count(spaced) == 1
    errors, k = _box_errors(128, 176, 16, False, source.replace(spaced, "box = first + lane"))
    assert k.kv_issuers == 2 and errors and any("gets" in e for e in errors)


def test_the_emulation_sees_a_row_group_without_its_row_in_the_page():
    """The check can fail: along the pool's row groups, a box coordinate without the box's group inside its page
    (D128-176's 16-row boxes over pages of 64) reads every box of a page from the page's first rows."""
    source = open(kernel.__file__).read()
    in_page = " + Int64((tok & (self.page - 1)) >> 3)"
    assert source.count(in_page) == 1
    errors, _ = _box_errors(128, 176, 64, False, source.replace(in_page, ""), groups_per_page=64 // 8)
    assert errors and all("gets" in e for e in errors)


def test_pages_out_of_the_pool_and_past_int32_get_no_row_group():
    """A page id the caller put out of range must not wrap into another page's rows: negative ids and ids whose
    row group passes 2^31 are out of the pool."""
    k = _kernel(128, 176, 16, False)
    obj = _plain(k, _Warp({}), open(kernel.__file__).read())
    for pg, gpp in ((-1, 2), (-7, 6), ((1 << 30), 2), ((1 << 31) - 1, 2)):
        assert obj.row_group(pg, 0, gpp) == kernel.OUT_OF_POOL
    assert obj.row_group((1 << 30) - 1, 8, 2) == (1 << 31) - 1  # the last group below 2^31: its page row 8
    assert obj.row_group(12, 3, 0) == 12  # no row groups: the page id


def test_the_emulation_sees_an_8_row_group_read_from_the_wrong_row():
    """The check can fail on the row-group tiles' page-by-page copies too (kv_groups_per_page 0): D128-176's 16-row
    boxes over pages of 64, each taken from its block's first row in the page."""
    source = open(kernel.__file__).read()
    own_row = "return (row + j * self.kv_rows) & (self.page - 1)"
    errors, k = _box_errors(128, 176, 64, False, source.replace(own_row, "return row"), groups_per_page=0)
    assert k.grouped_kv and errors and all("gets" in e for e in errors)


@pytest.mark.parametrize("head_dim,block_n,page,fp8", CASES)
def test_row_group_tiles_and_their_recipe_agree(head_dim, block_n, page, fp8):
    """The kernel loads along row groups exactly where the family lists the tile (16-bit pools), and the recipe the
    runtime encodes its descriptors from says so (kv_view, rank 5)."""
    k = _kernel(head_dim, block_n, page, fp8)
    grouped = not fp8 and (head_dim, block_n) in ROW_GROUP_TILES
    recipe = tma_recipe(k.variant, block_n)
    assert k.grouped_kv is grouped
    assert (recipe.get("kv_view"), recipe["kv_rank"]) == (("row_groups", 5) if grouped else (None, 4))
