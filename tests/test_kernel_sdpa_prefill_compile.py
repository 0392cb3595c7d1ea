"""Compile-only checks of the sdpa_prefill CuTe DSL kernel (no GPU needed)."""
import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

from aotc.common import cubin as cubin_mod  # noqa: E402
from aotc.common.abi import KernelABI  # noqa: E402
from aotc.families.sdpa_prefill import PAGED_PARAMS, PARAMS, TILES, Tile, params, smem_bytes  # noqa: E402
from aotc.kernels import sdpa_prefill as kernel  # noqa: E402
from aotc.common.variant import Variant  # noqa: E402

CASES = [
    # arch, dtype, head_dim, layout, causal, strides
    ("sm_90", "bf16", 128, "dense", True, "packed"),
    ("sm_80", "fp16", 64, "ragged", False, "general"),
    ("sm_90", "bf16", 256, "dense", False, "general"),
    ("sm_120a", "fp16", 128, "dense", True, "general"),
    # Runtime.attention's portable kernel: a page per kv block of D64 (P = block_n), several per block (P <
    # block_n), a block inside a page (P > block_n), on the archs the specs build it for
    ("sm_80", "fp16", 64, "paged64", True, "general"),
    ("sm_90", "bf16", 128, "paged16", True, "general"),
    ("sm_90", "bf16", 256, "paged128", True, "general"),
]


def _entry_params(ptx: str, symbol: str) -> list[str]:
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    assert m, f"no .entry {symbol} in the PTX"
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


@pytest.mark.parametrize("arch,dtype,head_dim,layout,causal,strides", CASES)
def test_compile(tmp_path, arch, dtype, head_dim, layout, causal, strides):
    v = Variant.make("sdpa_prefill", arch, dtype=dtype, head_dim=head_dim, layout=layout,
                     causal=causal, strides=strides)
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    cubin, symbol, ptx = built.cubin, built.abi.symbol, built.ptx
    assert cubin[:4] == b"\x7fELF"
    assert symbol and symbol.encode() in cubin
    assert f".target {arch}" in ptx

    # the parameter table is exactly the family's list's C layout (PARAMS; paged: PAGED_PARAMS)
    family_params = params(v)
    assert family_params is (PAGED_PARAMS if layout.startswith("paged") else PARAMS)
    info = cubin_mod.parse(cubin)
    assert info.arch == arch
    assert symbol in info.kernels
    cubin_params = info.kernels[symbol].params
    assert len(cubin_params) == len(family_params)
    assert KernelABI(symbol, family_params).check_layout(cubin_params) is None
    want = {"ptr": "u64", "i64": "u64", "i32": "u32", "f32": "f32"}
    assert _entry_params(ptx, symbol) == [want[p.kind] for p in family_params]
    assert ".reqntid 128, 1, 1" in ptx  # block = (32 * warps, 1, 1)

    # dynamic smem: Q + K + V tiles, the only shared memory the PTX declares
    bm, bn = TILES[head_dim].block_m, TILES[head_dim].block_n
    assert built.launch.dynamic_smem == (bm + 2 * bn) * head_dim * 2 > 0
    assert built.launch.dynamic_smem == smem_bytes(head_dim, TILES[head_dim])
    assert (built.launch.extra["block_m"], built.launch.extra["block_n"]) == (bm, bn)
    assert re.findall(r"\.shared\s[^;]*;", ptx) == [".shared .align 1024 .b8 __dynamic_shmem__0[];"]

    # 128-bit cp.async, ldmatrix (plain and transposed), m16n8k16 MMAs, 128-bit O stores
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^\]]+\], \[[^\]]+\], 16", ptx)
    assert not re.search(r"cp\.async\.c[ag]\.shared\.global \[[^\]]+\], \[[^\]]+\], (4|8)\b", ptx)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    ab = {"fp16": "f16", "bf16": "bf16"}[dtype]
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32" in ptx
    assert re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx)
    assert ".local" not in ptx
    # lazy O rescale (a warp vote around the multiplies) exactly where D > block_n
    assert ("vote.sync.any.pred" in ptx) == (head_dim > bn)
    if head_dim in (64, 128) or layout.startswith("paged"):
        assert built.frame_bytes == 0, f"register spills at ptxas {built.ptxas_level}"
    if layout.startswith("paged"):
        # page ids are 32-bit loads (the kernel reads no other global int but the lengths), checked against the
        # pool's page count with one unsigned compare each (a negative id is a large unsigned one)
        assert re.search(r"ld\.global(\.\w+)*\.b32", ptx)
        assert re.search(r"setp\.\w+\.u32", ptx)
        # a CTA walks its sequence's query tiles gridDim.x apart (any max_seqlen_q covers every row)
        assert "%nctaid.x" in ptx


def test_a_tile_record_builds_that_tile(tmp_path):
    """Tuners build a tile the family's table does not hold: the launch facts are the tile's own."""
    v = Variant.make("sdpa_prefill", "sm_80", dtype="bf16", head_dim=64, layout="dense",
                     causal=True, strides="general")
    default = kernel.compile(v, dump_dir=str(tmp_path / "a"))
    assert isinstance(default.cubin, bytes) and default.cubin[:4] == b"\x7fELF"
    assert default.abi.symbol in cubin_mod.parse(default.cubin).kernels and default.ptx == ""
    assert default.launch.dynamic_smem == smem_bytes(64, TILES[64])
    other = Tile(64, 64, 4)
    built = kernel.compile(v, dump_dir=str(tmp_path / "b"), tile=other)
    assert built.launch.extra["block_m"] == 64 and built.launch.dynamic_smem == smem_bytes(64, other)
    assert built.cubin != default.cubin


@pytest.mark.parametrize("head_dim", [64, 128])
def test_static_mappings(head_dim):
    # P-as-A-operand view, mask/LSE coordinates, copy row predicates, chunked P*V
    assert kernel.verify_mappings(head_dim) == []


@pytest.mark.parametrize("layout", ["ragged", "paged16"])
def test_invalid_variant(tmp_path, layout):
    v = Variant.make("sdpa_prefill", "sm_90", dtype="bf16", head_dim=64, layout=layout,
                     causal=False, strides="packed")
    with pytest.raises(ValueError, match="packed specialization is for dense layouts"):
        kernel.compile(v, dump_dir=str(tmp_path))


def test_a_paged_variant_needs_the_paged_kernel_class():
    """The two kernel classes have their own parameter lists: compile() picks the class by layout, and a class
    given the other kind of variant refuses it (its host signature would not be the variant's ABI)."""
    paged = Variant.make("sdpa_prefill", "sm_90", dtype="bf16", head_dim=128, layout="paged32", causal=True,
                         strides="general")
    ragged = Variant.make("sdpa_prefill", "sm_90", dtype="bf16", head_dim=128, layout="ragged", causal=True,
                          strides="general")
    with pytest.raises(ValueError, match="SdpaPrefillPaged"):
        kernel.SdpaPrefill(paged)
    with pytest.raises(ValueError, match="compiled by SdpaPrefill "):
        kernel.SdpaPrefillPaged(ragged)
    k = kernel.SdpaPrefillPaged(paged)
    assert (k.page, k.block_pages, k.log2_page, k.pass_rows) == (32, 1, 5, 16)
