"""Compile-only checks of the sdpa_decode CuTe DSL kernel (no GPU needed)."""
import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

from aotc.common import cubin as cubin_mod  # noqa: E402
from aotc.common.abi import KernelABI  # noqa: E402
from aotc.families.sdpa_decode import PARAMS, ROWS_PER_CTA, Tile, tile  # noqa: E402
from aotc.kernels import sdpa_decode as kernel  # noqa: E402
from aotc.kernels.sdpa_decode_checks import verify_mappings  # noqa: E402
from aotc.common.variant import Variant  # noqa: E402
from ptx_flow import loads_behind_loaded_branches  # noqa: E402

# fp8 D64 with its rows packed two to a 128-byte line: 32 keys a warp, 6 slots, 4 CTAs an SM (tune_decode's kw32_s6_c4_p)
PACKED_D64 = Tile(32, 6, 4, 56 * 1024, fp8=True, packed_rows=True)

CASES = [
    # arch, dtype, head_dim, kv
    ("sm_90", "bf16", 128, "paged16"),
    ("sm_80", "fp16", 64, "dense"),
    ("sm_90", "bf16", 256, "paged128"),
]
LAYOUTS = {("sm_90", "bf16", 128, "paged16"): "ragged"}  # Runtime.attention's decode rows; the rest dense


def _entry_params(ptx: str, symbol: str) -> list[str]:
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    assert m, f"no .entry {symbol} in the PTX"
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


@pytest.mark.parametrize("arch,dtype,head_dim,kv", CASES)
def test_compile(tmp_path, arch, dtype, head_dim, kv):
    v = Variant.make("sdpa_decode", arch, dtype=dtype, head_dim=head_dim, kv=kv,
                     layout=LAYOUTS.get((arch, dtype, head_dim, kv), "dense"))
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    cubin, symbol, ptx = built.cubin, built.abi.symbol, built.ptx
    assert cubin[:4] == b"\x7fELF"
    assert symbol and symbol.encode() in cubin
    assert f".target {arch}" in ptx

    # the parameter table is exactly PARAMS' C layout
    info = cubin_mod.parse(cubin)
    assert info.arch == arch
    assert symbol in info.kernels
    params = info.kernels[symbol].params
    assert len(params) == len(PARAMS)
    assert KernelABI(symbol, PARAMS).check_layout(params) is None
    want = {"ptr": "u64", "i64": "u64", "i32": "u32", "f32": "f32"}
    assert _entry_params(ptx, symbol) == [want[p.kind] for p in PARAMS]
    assert ".reqntid 128, 1, 1" in ptx

    # dynamic smem: the Q tile + the K/V ring (or the merge buffer), the only shared memory declared;
    # the launch facts carry the tile the runtime's split choice reads
    t = tile(head_dim, arch)
    assert built.launch.dynamic_smem == t.smem_bytes(head_dim) > 0
    assert t.smem_bytes(head_dim) >= (ROWS_PER_CTA + t.slots * t.block_n) * head_dim * 2
    assert t.slots >= 2 and t.block_n == 4 * t.keys_per_warp
    assert built.launch.extra["block_n"] == t.block_n and built.launch.extra["rows_per_cta"] == ROWS_PER_CTA
    assert built.launch.extra["ctas_per_sm"] == (1 if arch in ("sm_86", "sm_89", "sm_120a") else 2)
    assert re.findall(r"\.shared\s[^;]*;", ptx) == [".shared .align 1024 .b8 __dynamic_shmem__0[];"]

    # 16-byte cp.async only, ldmatrix (plain and transposed), m16n8k16 MMAs, 128-bit O stores
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^\]]+\], \[[^\]]+\], 16", ptx)
    assert not re.search(r"cp\.async\.c[ag]\.shared\.global \[[^\]]+\], \[[^\]]+\], (4|8)\b", ptx)
    assert f"cp.async.wait_group \t{t.slots - 2};" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    ab = {"fp16": "f16", "bf16": "bf16"}[dtype]
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32" in ptx
    assert re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx)
    assert ".local" not in ptx
    assert built.frame_bytes == 0, f"register spills at ptxas {built.ptxas_level}"
    # split-KV merge in the same launch: one gpu-scope acq_rel ticket on the split counter (its release
    # covers this CTA's partials, its acquire the other splits'), no separate fence
    assert re.findall(r"\batom\.[\w.]+", ptx) == ["atom.global.acq_rel.add.u32"]
    assert "fence." not in ptx and "membar" not in ptx
    # sm_90+: every CTA lets a programmatic dependent be dispatched; sm_80 has no griddepcontrol
    from aotc.families.sdpa_decode import FAMILY
    pdl = arch != "sm_80"
    assert ptx.count("griddepcontrol.launch_dependents;") == (1 if pdl else 0)
    assert "griddepcontrol.wait" not in ptx
    assert FAMILY.launch(v).extra["pdl_trigger"] is pdl



@pytest.mark.parametrize("fields", [
    dict(head_dim=128, kv="paged16", layout="ragged"),
    dict(head_dim=64, kv="paged16", layout="ragged", window=True, sinks=True),
    dict(head_dim=128, kv="paged16", layout="ragged", kv_dtype="fp8_e4m3"),
    dict(head_dim=128, kv="paged16", layout="dense"),
])
def test_lengths_round_loads_together(tmp_path, fields):
    """The schedule's first round of lengths (KvChunks.load_round) issues every load of the round before it
    branches on any loaded value: a ragged sequence's seqlens_kv is read whether or not cu_seqlens_q says the
    kernel serves it, so every CTA starts after one DRAM round trip instead of one per sequence a lane holds
    (the serving entry point's decode steps: benchmarks/results/decode_rows_ab.json)."""
    v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", **fields)
    ptx = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True).ptx
    assert ptx.count("ld.global") >= 2 and "shfl.sync.bfly" in ptx
    assert loads_behind_loaded_branches(ptx) == []


def test_the_check_sees_a_load_behind_a_branch():
    """loads_behind_loaded_branches flags the shape the ragged round had: a length loaded only where a loaded
    query count allows it."""
    ptx = """.entry k(
){
	ld.global.b32 	%r1, [%rd2+4];
	ld.global.b32 	%r2, [%rd2];
	sub.s32 	%r3, %r1, %r2;
	setp.lt.s32 	%p1, %r3, 1;
	setp.ge.s32 	%p2, %r9, %r8;
	@%p2 bra 	$L__BB0_2;
	@%p1 bra 	$L__BB0_5;
	ld.global.b32 	%r4, [%rd3];
	shfl.sync.bfly.b32 	%r5, %r4, 1, 31, -1;
}"""
    assert loads_behind_loaded_branches(ptx) == [("@%p1 bra \t$L__BB0_5;", "ld.global.b32 \t%r4, [%rd3];")]
    # the same round with its last load ahead of the branch: nothing behind it
    ahead = ptx.replace("\t@%p1 bra \t$L__BB0_5;\n\tld.global.b32 \t%r4, [%rd3];",
                        "\tld.global.b32 \t%r4, [%rd3];\n\t@%p1 bra \t$L__BB0_5;")
    assert ahead != ptx and loads_behind_loaded_branches(ahead) == []


def test_plain_compile_record(tmp_path):
    v = Variant.make("sdpa_decode", "sm_90", dtype="fp16", head_dim=128, kv="dense", layout="dense")
    built = kernel.compile(v, dump_dir=str(tmp_path))
    assert isinstance(built.cubin, bytes) and built.cubin[:4] == b"\x7fELF"
    assert built.abi.symbol in cubin_mod.parse(built.cubin).kernels and built.ptx == ""
    assert built.launch.dynamic_smem == tile(128, "sm_90").smem_bytes(128)


@pytest.mark.parametrize("arch", ["sm_90", "sm_89"])  # the big and the small shared-memory classes' tiles
@pytest.mark.parametrize("kv_dtype", [None, "fp8_e4m3"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_static_mappings(head_dim, kv_dtype, arch):
    # P-as-A-operand view, accumulator rows/cols, gather-copy rows and columns, warp key views (fp8: of the
    # e4m3 pairs' tiles, D64's narrow ones)
    assert verify_mappings(head_dim, arch=arch, kv_dtype=kv_dtype) == []


def test_static_mappings_packed_rows():
    assert verify_mappings(64, kv_dtype="fp8_e4m3", tile=PACKED_D64) == []
    with pytest.raises(ValueError, match="packed rows"):
        verify_mappings(128, kv_dtype="fp8_e4m3", tile=PACKED_D64)


def test_tile_configs_fit():
    assert ROWS_PER_CTA == 16
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a"):
        for head_dim in (64, 128, 256):
            t = tile(head_dim, arch)
            assert t.smem_bytes(head_dim) <= t.smem_limit
            assert t.smem_bytes(head_dim) <= 99 * 1024 or arch in ("sm_80", "sm_90", "sm_90a", "sm_100a")


def test_wrong_family(tmp_path):
    v = Variant.make("sdpa_combine", "sm_90", dtype="bf16", head_dim=128, strides="packed")
    with pytest.raises(ValueError):
        kernel.compile(v, dump_dir=str(tmp_path))


@pytest.mark.parametrize("head_dim", [128, 64])
def test_fp8_kv_variant(tmp_path, head_dim):
    """bf16 queries over e4m3 pools: e4m3 -> fp16 by cvt (two values an instruction) in registers, fp16 MMAs,
    Q rewritten in fp16 once (cvt.rn.f16x2.f32), no spills, the family's fp8 tile and smem. D64: rows of 64
    bytes in half a swizzle atom each (unless the tile packs them), so its ring takes D128's bytes for as many
    keys (in fewer, wider blocks)."""
    v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=head_dim, kv="paged16", layout="dense",
                     kv_dtype="fp8_e4m3")
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    ptx = built.ptx
    assert "cvt.rn.f16x2.e4m3x2" in ptx and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "bf16.bf16" not in ptx  # no bf16 MMA: K, V, P and Q are fp16
    assert built.frame_bytes == 0
    t = tile(head_dim, "sm_90", "fp8_e4m3")
    assert t.fp8 and built.launch.dynamic_smem == t.smem_bytes(head_dim) <= t.smem_limit
    assert t.keys_per_warp in (16, 32)
    if head_dim == 64 and not t.packed_rows:  # the ring's rows of 128 bytes (64 of them e4m3), and Q
        assert t.smem_bytes(64) == t.slots * t.block_n * 128 + ROWS_PER_CTA * 64 * 2
        t128 = tile(128, "sm_90", "fp8_e4m3")
        assert t.slots * t.block_n == t128.slots * t128.block_n


def test_fp8_tiles_fit():
    for arch in ("sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a"):
        for head_dim in (64, 128, 256):
            t = tile(head_dim, arch, "fp8_e4m3")
            assert t.fp8 and t.smem_bytes(head_dim) <= t.smem_limit, (arch, head_dim)


@pytest.mark.parametrize("kv", ["dense", "paged16", "paged32", "paged64", "paged128"])
def test_fp8_d64_narrow_tile_every_kv(tmp_path, kv):
    """fp8 D64's narrow tile (rows of 64 bytes, 32 rows a copy pass) at every page size: a pass spans two pages
    at page 16 (each thread's own page per row: one page-table load per row pass, not per page), one page or a
    run of a page from 32 up; 16-byte cp.async only, no spills."""
    v = Variant.make("sdpa_decode", "sm_90", dtype="bf16", head_dim=64, kv=kv, layout="ragged", kv_dtype="fp8_e4m3",
                     sinks=True, window=True)
    t = PACKED_D64
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True, tile=t)
    k = kernel.SdpaDecode(v, t)
    assert (k.KV_PITCH, k.ATOM_W, k.TPR, k.RPP, k.ROW_ITERS) == (32, 32, 4, 32, t.block_n // 32)
    assert built.launch.dynamic_smem == t.smem_bytes(64) == 50 * 1024  # 6 slots of 128 keys x 64 bytes, and Q
    assert k.PG_PER_ROW == (kv == "paged16")
    want_pages = 0 if kv == "dense" else t.block_n // 32 if kv == "paged16" else max(1, t.block_n // k.page)
    assert k.N_PG == want_pages
    ptx = built.ptx
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^\]]+\], \[[^\]]+\], 16", ptx)
    assert not re.search(r"cp\.async\.c[ag]\.shared\.global \[[^\]]+\], \[[^\]]+\], (4|8)\b", ptx)
    assert built.frame_bytes == 0 and ".local" not in ptx


def test_bank_check_sees_an_unswizzled_tile(monkeypatch):
    """The bank-conflict fact of verify_mappings can fail: a row-major (unswizzled) narrow tile puts an ldmatrix
    phase's 8 rows on 2 bank groups (its cp.async stores, 2 rows of 64 bytes a phase, stay conflict-free)."""
    import cutlass.cute as cute
    from aotc.kernels import sdpa_decode_checks as checks
    monkeypatch.setattr(checks, "smem_tile_layout", lambda rows, cols: cute.make_layout((rows, cols), stride=(cols, 1)))
    errors = verify_mappings(64, kv_dtype="fp8_e4m3", tile=PACKED_D64)
    assert errors and all("bank conflict" in e for e in errors)
    assert any("K ldmatrix" in e for e in errors) and any("V ldmatrix" in e for e in errors)
    assert not any("cp.async" in e for e in errors)
