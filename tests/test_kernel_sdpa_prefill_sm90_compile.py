"""Compile-only checks of the sdpa_prefill_sm90 (Hopper) CuTe DSL kernel (no GPU needed)."""
import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

from aotc.common import cubin as cubin_mod  # noqa: E402
from aotc.common.abi import KernelABI  # noqa: E402
from aotc.families import get_family  # noqa: E402
from aotc.families.sdpa_prefill_sm90 import (FP8_REGISTERS, PARAMS, RAGGED_REGISTERS, REGISTERS,  # noqa: E402
                                             launch_registers, tile, why_registers_do_not_fit)
from aotc.kernels.compile import check_register_split  # noqa: E402
from aotc.kernels import sdpa_prefill_sm90 as kernel  # noqa: E402
from aotc.common.variant import Variant  # noqa: E402
from ptx_flow import loads_behind_loaded_branches  # noqa: E402

CASES = [  # dtype, head_dim, layout, causal, block_n
    ("bf16", 128, "dense", True, 128),
    ("bf16", 128, "dense", False, 176),
    ("fp16", 64, "ragged", False, 128),
    ("bf16", 256, "ragged", True, 80),
]
SMEM_LIMIT = 227 * 1024  # dynamic + static shared memory per CTA on sm_90


@pytest.mark.parametrize("dtype,head_dim,layout,causal,block_n", CASES)
def test_compile(tmp_path, dtype, head_dim, layout, causal, block_n):
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype=dtype, head_dim=head_dim, layout=layout, causal=causal,
                     block_n=block_n)
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    cubin, symbol, ptx = built.cubin, built.abi.symbol, built.ptx
    info = cubin_mod.parse(cubin)
    assert info.arch == "sm_90a" and symbol in info.kernels
    k = info.kernels[symbol]
    # three 128-byte TMA descriptors first, then the pointer ABI, exactly PARAMS' C layout
    assert KernelABI(symbol, PARAMS).check_layout(k.params) is None
    assert [size for _, size in k.params[:3]] == [128, 128, 128]
    t = tile(head_dim, block_n)
    bm, bn = t.block_m, t.block_n
    n_threads = t.threads
    assert f".reqntid {n_threads}, 1, 1" in ptx and n_threads == 128 * (1 + bm // 64)
    # no spills at the consumer register budget, nor in the producer's 32 registers (D64 ragged's spilled its
    # loop bound, one 4-byte reload a tile, until RaggedTiles loaded a round of query lengths whole);
    # shared memory fits one CTA per SM
    assert built.frame_bytes == 0
    assert built.launch.dynamic_smem == t.smem_bytes(head_dim)
    assert built.launch.dynamic_smem + k.static_smem <= SMEM_LIMIT
    # the Hopper machinery is there: TMA loads of the descriptor's rank, wgmma (the PV GEMM's A operand
    # from registers), register reallocation between producer and consumers, mbarrier transactions
    rank = 3 if layout == "ragged" else 4
    assert re.search(rf"cp\.async\.bulk\.tensor\.{rank}d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx
    t = {"bf16": "bf16", "fp16": "f16"}[dtype]
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bn}k16\.f32\.{t}\.{t}", ptx)  # S = Q K^T
    # O += P V: A (P) is a register list, not a shared-memory descriptor
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_dim}k16\.f32\.{t}\.{t} \{{[^}}]*\}}, \{{", ptx)
    # P (and O) become 16-bit in packed pairs only: lone cvt.rn.bf16.f32 (then merged by movs between the
    # PV wgmmas) made ptxas split the PV GEMM into a wgmma group per instruction (D128 block_n 176: 11, D256: 5;
    # see hopper.store_converted_pairs)
    assert re.search(rf"cvt\.rn\.{t}x2\.f32", ptx) and not re.search(rf"cvt\.rn\.{t}\.f32", ptx)
    producer, consumer = (RAGGED_REGISTERS if layout != "dense" else REGISTERS)[bm // 64]
    # ptxas gave each thread the registers the split was planned against, and the split fits them (more than the
    # CTA was launched with and setmaxnreg.inc waits forever: why_registers_do_not_fit)
    assert k.registers == launch_registers(n_threads)
    assert 128 * producer + (n_threads - 128) * consumer <= n_threads * k.registers
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer};", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer};", ptx)
    assert "mbarrier.arrive.expect_tx" in ptx
    if layout != "dense":  # RaggedTiles.round_tiles: a round's query lengths in one DRAM round trip
        assert loads_behind_loaded_branches(ptx) == []


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_variant(tmp_path, head_dim):
    """Over fp8 pools (paged16): two consumer warpgroups at both head dims (D64's 16-bit tile has three), the fp8
    register split within the registers the CTA is launched with, the e4m3 conversion in registers, fp16 GEMMs, no spills, and the
    shared memory the tile says (its e4m3 staging rings included)."""
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout="paged16", causal=True,
                     block_n=128, kv_dtype="fp8_e4m3")
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    ptx = built.ptx
    t = tile(head_dim, 128, fp8=True)
    assert t.consumer_warpgroups == 2 and ".reqntid 384, 1, 1" in ptx
    producer, consumer = FP8_REGISTERS
    assert 128 * producer + 256 * consumer <= 384 * cubin_mod.parse(built.cubin).kernels[built.abi.symbol].registers
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer};", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer};", ptx)
    assert "cvt.rn.f16x2.e4m3x2" in ptx and "bf16.bf16" not in ptx  # the GEMMs in fp16
    assert built.frame_bytes == 0
    assert built.launch.dynamic_smem == t.smem_bytes(head_dim, True) and built.launch.block == (384, 1, 1)
    with pytest.raises(ValueError, match="exceed the 65536 a CTA of 512"):  # nor a three-consumer tile the fp8 split
        kernel.SdpaPrefillSm90(v, tile(64, 128))


def test_boxes_inside_a_page_compile_as_page_16s(tmp_path):
    """D256's 80-key kv blocks over pages of 32: 16-row TMA boxes inside a page (kv_box_rows), each with its own
    row in its page (tests/test_prefill_sm90_paged_boxes.py checks the coordinates). The kernel compiles as the
    page-16 one does: as many TMA loads, no spills, the same shared memory."""
    built = {}
    for page in (16, 32):
        v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=256, layout=f"paged{page}",
                         causal=True, block_n=80)
        built[page] = kernel.compile(v, dump_dir=str(tmp_path / str(page)), keep_ptx=True)
        assert kernel.SdpaPrefillSm90(v).kv_rows == 16 and built[page].frame_bytes == 0
    loads = {p: len(re.findall(r"cp\.async\.bulk\.tensor\.4d", b.ptx)) for p, b in built.items()}
    assert loads[32] == loads[16] > 0
    assert loads_behind_loaded_branches(built[32].ptx) == []  # the paged kernel's rounds of query lengths too
    assert built[32].launch.dynamic_smem == built[16].launch.dynamic_smem == tile(256, 80).smem_bytes(256)


@pytest.mark.parametrize("block_n", [128, 176])
def test_family_records_the_tma_recipe(block_n):
    fam = get_family("sdpa_prefill_sm90")
    for layout, rank in (("dense", 4), ("ragged", 3)):
        v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout=layout, causal=False,
                         block_n=block_n)
        facts = fam.launch(v)
        assert facts.block == (tile(128, block_n).threads, 1, 1) == (384, 1, 1)
        assert facts.extra["block_m"] == 128 and facts.extra["block_n"] == block_n
        tma = facts.extra["tma"]
        assert tma["rank"] == rank and tma["swizzle_bytes"] == 128 and tma["box_cols"] == 64
        assert tma["box_rows"] == {"q": 64, "k": block_n, "v": block_n}


def test_untuned_tile_is_pruned_with_the_reason():
    fam = get_family("sdpa_prefill_sm90")
    assert fam.why_invalid(dict(dtype="bf16", head_dim=128, layout="dense", causal=False, block_n=176)) is None
    why = fam.why_invalid(dict(dtype="bf16", head_dim=64, layout="dense", causal=False, block_n=176))
    assert "block_n 176 is not a tile of head_dim 64" in why and "[128]" in why


def test_refuses_other_archs(tmp_path):
    v = Variant.make("sdpa_prefill_sm90", "sm_90", dtype="bf16", head_dim=128, layout="dense", causal=False,
                     block_n=128)
    with pytest.raises(ValueError, match="sm_90a"):
        kernel.compile(v, dump_dir=str(tmp_path))


def test_register_splits_fit_the_launch_registers():
    """setmaxnreg only moves registers among a CTA's warps, so a split must fit what the CTA was launched with (384
    threads at 168 a thread: 64512), not the 64K register file: 32 / 240 / 240 needs 65536, compiles, and hangs on
    the GPU (its ragged and paged kernels made no progress on an H100: benchmarks/experiments/README.md). Every
    split of the family fits."""
    assert (launch_registers(384), launch_registers(512)) == (168, 128)
    for n_wg, (producer, consumer) in [*REGISTERS.items(), *RAGGED_REGISTERS.items(), (2, FP8_REGISTERS)]:
        assert why_registers_do_not_fit(producer, consumer, n_wg) is None, (n_wg, producer, consumer)
    why = why_registers_do_not_fit(32, 240, 2)
    assert "(65536) exceed the 64512 a CTA of 384 threads is launched with (384 x 168)" in why
    assert why_registers_do_not_fit(24, 240, 2) is None and why_registers_do_not_fit(32, 168, 3) is not None


def test_a_ragged_split_over_the_launch_registers_is_refused(monkeypatch):
    """The kernel refuses such a split when it is built, naming the variant, before anything compiles."""
    monkeypatch.setattr(kernel, "RAGGED_REGISTERS", {2: (32, 240), 3: RAGGED_REGISTERS[3]})
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout="paged16", causal=True,
                     block_n=128)
    with pytest.raises(ValueError, match=r"layout=paged16.*: registers 32 \+ 2 x 240 .* setmaxnreg.inc would wait"):
        kernel.SdpaPrefillSm90(v)


def test_a_cubin_given_fewer_registers_than_its_split_is_refused(tmp_path):
    """After ptxas: the cubin's registers a thread times the CTA's threads must cover the split (here a kernel
    claiming one register more than the 384 x 168 its cubin holds)."""
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout="dense", causal=False,
                     block_n=128)
    built = kernel.compile(v, dump_dir=str(tmp_path))
    fits, over = kernel.SdpaPrefillSm90(v), kernel.SdpaPrefillSm90(v)
    assert fits.registers_after_setmaxnreg == 128 * (24 + 2 * 240) == 384 * 168
    check_register_split(fits, built.cubin, built.launch)
    over.registers_after_setmaxnreg = 384 * 168 + 1
    with pytest.raises(RuntimeError, match="hold 64513 registers after setmaxnreg, but ptxas gave 168 a thread to 384"):
        check_register_split(over, built.cubin, built.launch)
