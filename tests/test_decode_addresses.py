"""sdpa_decode's K/V gather, run as plain Python: the kernel's own load_pages, kv_thread_bases, load_tile and
row_offset (their source, the DSL decorators dropped and its types replaced by ints and recorders), for every
thread and row pass of a block, against the address the layout defines:

    paged  page_table[b, t // P] * stride_page + (t % P) * stride_token + kv_head * stride_head
    dense  b * stride_page + t * stride_token + kv_head * stride_head

at every page size and dense KV, the 64-column tiles (16 rows a pass; fp8 D64's rows in half an atom, copied by
a row's first 4 threads) and fp8 D64's packed ones (narrow atoms, 32 rows a pass, at page 16 a page per row), chunks starting at 0 or past a block or page, ends anywhere: rows at or past the
chunk's end must be zero-filled and read neither memory nor the page table. No GPU, no DSL compile."""
import ast
import random
import types

import pytest

pytest.importorskip("cutlass")

from aotc.common.variant import Variant  # noqa: E402
from aotc.families.sdpa_decode import Tile  # noqa: E402
from aotc.kernels import sdpa_decode as kernel  # noqa: E402

METHODS = ("load_pages", "kv_thread_bases", "load_tile", "row_offset")


class _Cutlass:
    Constexpr = object
    Uint8 = "u8"

    @staticmethod
    def const_expr(x):
        return x

    @staticmethod
    def range_constexpr(*a):
        return range(*a)

    @staticmethod
    def Uint32(x):
        return x & 0xFFFFFFFF


class _Cute:
    @staticmethod
    def assume(x, divby=None):
        assert x % divby == 0, f"{x} is not a multiple of {divby}"
        return x

    @staticmethod
    def recast_ptr(p, dtype=None):
        return p

    @staticmethod
    def make_tensor(*a, **k):
        return None


def _plain_methods(source: str) -> dict:
    """The four methods of SdpaDecode (in the kernel module's source) as plain Python functions over the shims."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "SdpaDecode")
    funcs = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name in METHODS]
    assert sorted(f.name for f in funcs) == sorted(METHODS)
    for f in funcs:
        f.decorator_list = []
    ns = {"cutlass": _Cutlass, "cute": _Cute, "Int32": int, "Int64": int, "VEC": kernel.VEC}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), kernel.__file__, "exec"), ns)
    return {n: ns[n] for n in METHODS}


class _Recorder:
    """Stands for the ring tile's partition (row j of a thread: dst[None, j, None]), the copy, the page table."""

    def __init__(self, table):
        self.table, self.events = table, []

    def get_slice(self, tid):
        return self

    def partition_D(self, tile):
        return self

    def __getitem__(self, idx):
        rec, j = self, idx[1]
        return types.SimpleNamespace(j=j, rec=rec, fill=lambda v: rec.events.append(("row", j, "zero")))


class _PageTable:
    def __init__(self, rec, base=0):
        self.rec, self.base = rec, base

    def __add__(self, off):
        return _PageTable(self.rec, self.base + off)

    def __getitem__(self, i):
        self.rec.events.append(("pt", self.base + i))
        return self.rec.table[self.base + i]


def _gather_errors(kv: str, head_dim: int, kv_dtype: str | None, keys_per_warp: int, packed: bool = False,
                   source: str | None = None) -> tuple[list, object]:
    v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=head_dim, kv=kv, layout="dense", kv_dtype=kv_dtype)
    k = kernel.SdpaDecode(v, Tile(keys_per_warp, 4, 1, 227 * 1024, fp8=kv_dtype is not None, packed_rows=packed))
    obj = types.SimpleNamespace(**k.__dict__)
    for name, fn in _plain_methods(source or open(kernel.__file__).read()).items():
        setattr(obj, name, types.MethodType(fn, obj))
    obj.copy_kv_row = lambda g2s, thr, base, off, dst: dst.rec.events.append(("row", dst.j, base + off))
    P, BN, elem = k.page, k.BN, 1 if kv_dtype else 2
    s_tok, s_head, s_page = 10007 * 64 // elem, 64 // elem, 7919 * 1024 * 64 // elem  # element strides
    kvh, b = 3, 2
    table = random.Random(1).sample(range(1, 100000), 256)  # distinct page ids
    step = max(BN, P)
    errors = []
    for lo in (0, step, 3 * step):
        for hi in sorted({lo + d for d in (1, 15, 16, 17, 33, 63, 64, 65, 129, 255, 257, 511, 700)}):
            n_blocks = -(-(hi - lo) // BN)
            for m in range(n_blocks + 1):  # + the prefetch past the last block: nothing copied or read
                for tid in range(kernel.THREADS):
                    rec = _Recorder(table)
                    ctx = types.SimpleNamespace(kvh=kvh, bidx=b, lo=lo, hi=hi, n_blocks=n_blocks, pt_stride_p=1,
                                                pt_row_ptr=_PageTable(rec), g2s_kv=rec, ring_ptr=0, tile_layout=None)
                    strides = (s_page, s_tok, s_head)
                    ctx.k_base, ctx.v_base, ctx.k_strides, ctx.v_strides = obj.kv_thread_bases(ctx, tid, 0, 0, strides,
                                                                                                strides)
                    if k.PAGED:
                        ctx.pg = [None] * k.N_PG
                        obj.load_pages(ctx, tid, m)
                    obj.load_tile(ctx, tid, 0, m, False)
                    got = {e[1]: e[2] for e in rec.events if e[0] == "row"}
                    for e in rec.events:
                        if e[0] == "pt" and not lo <= e[1] * P < hi:
                            errors.append(f"lo {lo} hi {hi} block {m} thread {tid}: reads page-table entry {e[1]}")
                    want = {}
                    # unpacked fp8 D64: a row's threads past its 32 columns copy nothing (their half-atom is zeros)
                    idle = k.KV_PAD and (tid % k.TPR) * kernel.VEC >= k.KV_COLS
                    if m < n_blocks:
                        for j in range(k.ROW_ITERS):
                            t = lo + m * BN + tid // k.TPR + k.RPP * j
                            page_term = table[t // P] * s_page if P else b * s_page
                            address = (page_term + (t % P if P else t) * s_tok + kvh * s_head) * elem
                            want[j] = "zero" if t >= hi or idle else address
                    if got != want:
                        errors.append(f"lo {lo} hi {hi} block {m} thread {tid}: rows {got} != {want}")
    return errors, k


@pytest.mark.parametrize("kv", ["dense", "paged16", "paged32", "paged64", "paged128"])
@pytest.mark.parametrize("head_dim,kv_dtype,keys_per_warp,packed", [
    (64, "fp8_e4m3", 16, True), (64, "fp8_e4m3", 32, True), (64, "fp8_e4m3", 64, True), (64, "fp8_e4m3", 32, False),
    (128, "fp8_e4m3", 16, False), (128, None, 16, False), (64, None, 32, False)])
def test_every_row_gathered_from_its_address(kv, head_dim, kv_dtype, keys_per_warp, packed):
    errors, k = _gather_errors(kv, head_dim, kv_dtype, keys_per_warp, packed)
    assert k.RPP == (32 if packed else 16)
    assert errors == [], f"{len(errors)} wrong rows, e.g. {errors[:3]}"


def test_the_emulation_sees_a_wrong_page():
    """The check can fail: fp8 D64 at page 16 with every row's page taken as its pass's first (the per-row page
    dropped) gathers the second half of each pass from the wrong page."""
    source = open(kernel.__file__).read()
    per_row = "first = (tid >> self.LOG2_TPR) >> self.LOG2_P"
    assert source.count(per_row) == 1
    errors, k = _gather_errors("paged16", 64, "fp8_e4m3", 32, True, source.replace(per_row, "first = Int32(0)"))
    assert k.PG_PER_ROW and errors and all("rows" in e for e in errors)
