"""Compile-only checks of the sdpa_combine CuTe DSL kernel (no GPU needed)."""
import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

from aotc.families.sdpa_combine import params as family_params  # noqa: E402
from aotc.kernels import sdpa_combine as kernel  # noqa: E402
from aotc.common.variant import Variant  # noqa: E402

CASES = [
    ("sm_90a", "bf16", 128, "packed"),
    ("sm_90a", "fp32", 64, "general"),
    ("sm_80", "fp16", 256, "general"),
]


def _entry_params(ptx: str, symbol: str) -> list[str]:
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    assert m, f"no .entry {symbol} in the PTX"
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


@pytest.mark.parametrize("arch,dtype,head_dim,strides", CASES)
def test_compile(tmp_path, arch, dtype, head_dim, strides):
    v = Variant.make("sdpa_combine", arch, dtype=dtype, head_dim=head_dim, strides=strides)
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    cubin, symbol, ptx = built.cubin, built.abi.symbol, built.ptx
    PARAMS = family_params(v)
    assert built.abi.params == PARAMS
    assert cubin[:4] == b"\x7fELF"
    assert symbol and symbol.encode() in cubin
    assert f".target {arch}" in ptx

    params = _entry_params(ptx, symbol)
    assert len(params) == len(PARAMS)
    want = ["u64" if p.kind in ("ptr", "i64") else "u32" for p in PARAMS]
    assert params == want

    # 128-bit loads of O_partial, no local memory; shared memory only for the split groups' sums,
    # exactly the dynamic smem the launch facts give (the DSL places it in dynamic shared memory)
    assert re.search(r"ld\.global[\w:.]*\.v4\.(b32|f32)|ld\.global[\w:.]*\.v2\.(b64|u64)", ptx)
    assert ".local" not in ptx
    from aotc.families.sdpa_combine import FAMILY, slices_per_cta, smem_bytes
    assert re.findall(r"\.shared\s[^;]*;", ptx) == [".shared .align 1024 .b8 __dynamic_shmem__0[];"]
    assert FAMILY.launch(v).dynamic_smem == smem_bytes(head_dim) == 2048 == built.launch.dynamic_smem
    assert FAMILY.launch(v).extra["slices_per_cta"] == slices_per_cta(head_dim) == 512 // head_dim
    assert "bar.sync" in ptx  # the split groups' sum (runtime split_groups > 1)
    # pass 1 reduces over the lanes by butterfly shuffles
    assert "shfl.sync.bfly" in ptx
    assert "griddepcontrol" not in ptx  # launched as a plain kernel
    if strides == "packed":
        width = {"fp32": "v4.b32", "bf16": "v2.b32", "fp16": "v2.b32"}[dtype]
        assert re.search(r"st\.global[\w:.]*\." + re.escape(width), ptx)


def test_plain_compile_record(tmp_path):
    v = Variant.make("sdpa_combine", "sm_90a", dtype="fp16", head_dim=64, strides="packed")
    built = kernel.compile(v, dump_dir=str(tmp_path))
    assert isinstance(built.cubin, bytes) and built.cubin[:4] == b"\x7fELF"
    assert built.abi.symbol and built.ptx == "" and built.ptxas_level is None
    # O's pointee alignment is a whole vector of fp16 outputs when packed, one element otherwise
    assert {p.name: p.pointee_align for p in built.abi.params if p.kind == "ptr"} == {
        "o_partial": 16, "lse_partial": 4, "o": 8, "lse": 4}
    general = Variant.make("sdpa_combine", "sm_90a", dtype="fp16", head_dim=64, strides="general")
    assert {p.name: p.pointee_align for p in family_params(general)}["o"] == 2
