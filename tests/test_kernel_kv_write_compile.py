"""Compile-only checks of the kv_write CuTe DSL kernel (no GPU needed), and its family's description."""
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

from aotc import families  # noqa: E402
from aotc.build.compile import compile_variant  # noqa: E402
from aotc.common import cubin as cubin_mod  # noqa: E402
from aotc.common.abi import KernelABI  # noqa: E402
from aotc.common.variant import Variant  # noqa: E402
from aotc.families.kv_write import FAMILY, PARAMS, ROWS_PER_THREAD, THREADS, tokens_per_cta  # noqa: E402
from aotc.kernels import kv_write as kernel  # noqa: E402

CASES = [
    # arch, dtype, head_dim
    ("sm_90", "bf16", 128),
    ("sm_90", "fp16", 64),
    ("sm_90", "bf16", 256),
    ("sm_80", "fp16", 128),
    ("sm_120a", "bf16", 256),
]


def _entry_params(ptx: str, symbol: str) -> list[str]:
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    assert m, f"no .entry {symbol} in the PTX"
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


@pytest.mark.parametrize("arch,dtype,head_dim", CASES)
def test_compile(tmp_path, arch, dtype, head_dim):
    v = Variant.make("kv_write", arch, dtype=dtype, head_dim=head_dim)
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    cubin, symbol, ptx = built.cubin, built.abi.symbol, built.ptx
    assert cubin[:4] == b"\x7fELF" and symbol.encode() in cubin
    assert f".target {arch}" in ptx

    # the parameter table is exactly PARAMS' C layout, in the cubin and in the PTX
    info = cubin_mod.parse(cubin)
    assert info.arch == arch and symbol in info.kernels
    params = info.kernels[symbol].params
    assert len(params) == len(PARAMS)
    assert KernelABI(symbol, PARAMS).check_layout(params) is None
    want = {"ptr": "u64", "i64": "u64", "i32": "u32", "f32": "f32"}
    assert _entry_params(ptx, symbol) == [want[p.kind] for p in PARAMS]
    # the pointee alignments the runtime checks are the parameters' .align
    aligns = re.findall(r"\.param\s+\.u64\s+\.ptr\s+\.global\s+\.align\s+(\d+)", ptx)
    assert [int(a) for a in aligns] == [p.pointee_align for p in PARAMS if p.kind == "ptr"]
    assert f".reqntid {THREADS}, 1, 1" in ptx

    # launch facts: no shared memory, the token mapping the runtime's grid reads
    assert built.launch.dynamic_smem == 0 and built.launch.block == (THREADS, 1, 1)
    assert built.launch.extra == {"tokens_per_cta": THREADS // (head_dim // 8) * ROWS_PER_THREAD}
    assert built.launch == FAMILY.launch(v) and built.launch.extra == FAMILY.launch(v).extra
    assert ".shared" not in ptx and ".local" not in ptx and built.frame_bytes == 0

    # 128-bit loads and stores only (plus the 8-byte slot loads); every load before the first branch,
    # so key/value reads never wait for the slot read
    body = ptx[ptx.index(".reqntid"):]
    loads = re.findall(r"ld\.global[.\w]*", body)
    stores = re.findall(r"st\.global[.\w]*", body)
    assert loads == ["ld.global.b64", "ld.global.v4.b32", "ld.global.v4.b32"] * ROWS_PER_THREAD
    assert stores == ["st.global.v4.b32"] * (2 * ROWS_PER_THREAD)
    assert body.rindex("ld.global") < body.index("bra")
    # 64-bit addressing: the slot is compared unsigned (negative slots skip) and the page is a shift
    assert "setp.ge.u64" in body and re.search(r"shr\.s64", body)
    assert "div" not in body and "rem" not in body
    assert "atom" not in body and "griddepcontrol" not in body


def test_every_arch_of_the_family_compiles(tmp_path):
    """One variant per arch the family lists (the spec's full matrix builds each), through the build's own
    checks of the cubin (symbol, arch, parameter table)."""
    for arch in FAMILY.archs:
        art = compile_variant(Variant.make("kv_write", arch, dtype="fp16", head_dim=64))
        assert art.variant.arch == arch and art.launch.extra["tokens_per_cta"] == 32


def test_family_description():
    assert FAMILY.name == "kv_write" and families.get_family("kv_write") is FAMILY
    assert FAMILY.archs == families.KNOWN_ARCHS
    assert [f.name for f in FAMILY.fields] == ["dtype", "head_dim", "kv_dtype"]
    assert FAMILY.field("dtype").choices == ("fp16", "bf16") and FAMILY.field("head_dim").choices == (64, 128, 256)
    for dtype in ("fp16", "bf16"):
        for d in (64, 128, 256):
            assert FAMILY.why_invalid({"dtype": dtype, "head_dim": d}) is None
            v = Variant.make("kv_write", "sm_90", dtype=dtype, head_dim=d)
            assert tokens_per_cta(v) * (d // 8) == THREADS * ROWS_PER_THREAD
            assert FAMILY.params(v) is PARAMS
    assert FAMILY.why_invalid({"dtype": "bf16", "head_dim": 96}) is not None  # 12 chunks do not tile 128 threads
    names = [p.name for p in PARAMS]
    assert len(set(names)) == len(names)
    assert [p.name for p in PARAMS if p.kind == "ptr"] == ["key", "value", "k_cache", "v_cache", "slot_mapping",
                                                           "k_scale", "v_scale"]
    assert all(p.kind == "i64" for p in PARAMS if ("stride" in p.name and p.name != "scale_stride_h")
               or p.name == "num_slots")
    # fp8 pools quantize on write, on the archs with e4m3 conversions
    assert FAMILY.why_invalid({"dtype": "bf16", "head_dim": 128, "kv_dtype": "fp8_e4m3", "arch": "sm_90"}) is None
    assert "e4m3" in FAMILY.why_invalid({"dtype": "bf16", "head_dim": 128, "kv_dtype": "fp8_e4m3", "arch": "sm_86"})


def test_fp8_variant_quantizes_with_satfinite_rounding(tmp_path):
    v = Variant.make("kv_write", "sm_90", dtype="bf16", head_dim=128, kv_dtype="fp8_e4m3")
    built = kernel.compile(v, dump_dir=str(tmp_path), keep_ptx=True)
    assert built.ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 16  # 2 rows x (K, V) x 8 values / 2
    assert "div.rn.f32" in built.ptx and "st.global.v2.b32" in built.ptx


def test_source_digests_keep_families_apart(monkeypatch):
    """kv_write is registered in _MODULES: its kernel file is not in the other families' digests (adding
    or editing it rebuilds nothing else), and theirs are not in its own."""
    assert "kv_write" in families._MODULES
    fams = families.all_families()
    target = Path(kernel.__file__).resolve()
    digests = {name: fam.source_digest() for name, fam in fams.items()}
    read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda p: read(p) + (b"\n# edited\n" if p == target else b""))
    after = {name: fam.source_digest() for name, fam in fams.items()}
    assert after["kv_write"] != digests["kv_write"]
    assert {n: d for n, d in after.items() if n != "kv_write"} == {n: d for n, d in digests.items() if n != "kv_write"}


def test_wrong_family(tmp_path):
    v = Variant.make("sdpa_combine", "sm_90", dtype="bf16", head_dim=128, strides="packed")
    with pytest.raises(ValueError):
        kernel.compile(v, dump_dir=str(tmp_path))
