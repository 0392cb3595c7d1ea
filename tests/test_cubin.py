"""Reading facts off real cubins with the standard library, and refusing things that are not cubins."""
from __future__ import annotations

import struct
import sys

import pytest

from aotc.common import cubin
from aotc.common.abi import layout_offsets
from aotc.families import KNOWN_ARCHS


def test_real_artifacts_parse(real_artifacts):
    for art in real_artifacts:
        info = cubin.parse(art.cubin)
        assert info.arch == art.variant.arch
        assert art.abi.symbol in info.kernels, sorted(info.kernels)
        k = info.kernels[art.abi.symbol]
        offsets, total = layout_offsets(art.abi.params)
        assert k.params == [(o, p.size) for o, p in zip(offsets, art.abi.params)]
        assert art.abi.check_layout(k.params) is None
        assert k.param_bytes == total
        assert k.max_threads == art.launch.block
        assert k.registers is not None and 0 < k.registers <= 255
        assert k.registers == art.info["registers"]
        # CuTe DSL reserves 1 KiB of static shared memory in kernels that allocate shared storage (the
        # combine's split-group sums); the storage itself is dynamic (launch facts)
        assert k.static_smem == art.info["static_smem"] in (0, 1024)


@pytest.mark.parametrize("e_flags,abi_version,arch", [
    (0x500550, 7, "sm_80"),
    (0x5a055a, 7, "sm_90"),
    (0x5a0d5a, 7, "sm_90a"),
    (0x600640a, 8, "sm_100a"),
    (0x600780a, 8, "sm_120a"),
])
def test_arch_of(e_flags, abi_version, arch):
    assert cubin.arch_of(e_flags, abi_version) == arch


def test_truncated_cubin(real_artifacts):
    data = real_artifacts[0].cubin
    for n in (0, 3, 63, len(data) // 2, len(data) - 1):
        with pytest.raises(cubin.CubinError):
            cubin.parse(data[:n])


def test_truncated_section(real_artifacts):
    data = bytearray(real_artifacts[0].cubin)
    # keep the header and section table in place but point one section past the end of the file
    e_shoff = struct.unpack_from("<Q", data, 0x28)[0]
    struct.pack_into("<Q", data, e_shoff + 64 + 0x18, len(data) + 100)  # section 1's sh_offset
    with pytest.raises(cubin.CubinError, match="outside the file"):
        cubin.parse(bytes(data))


def test_wrong_magic(real_artifacts):
    data = bytearray(real_artifacts[0].cubin)
    data[1:4] = b"ELG"
    with pytest.raises(cubin.CubinError, match="not an ELF"):
        cubin.parse(bytes(data))
    with pytest.raises(cubin.CubinError, match="not an ELF"):
        cubin.parse(b"PK\x03\x04" + bytes(100))


def test_not_64bit(real_artifacts):
    data = bytearray(real_artifacts[0].cubin)
    data[4] = 1  # ELFCLASS32
    with pytest.raises(cubin.CubinError, match="64-bit"):
        cubin.parse(bytes(data))


def test_non_cuda_elf(real_artifacts):
    # the Python interpreter: an ELF for the host, not for CUDA
    host = open(sys.executable, "rb").read(1 << 20) if sys.platform.startswith("linux") else None
    if host is not None and host[:4] == b"\x7fELF":
        with pytest.raises(cubin.CubinError, match="not CUDA"):
            cubin.parse(host)
    # a cubin whose OS ABI byte or machine field says something else
    data = bytearray(real_artifacts[0].cubin)
    data[7] = 0
    with pytest.raises(cubin.CubinError, match="OS ABI is 0x0, not CUDA"):
        cubin.parse(bytes(data))
    data = bytearray(real_artifacts[0].cubin)
    struct.pack_into("<H", data, 18, 62)  # EM_X86_64
    with pytest.raises(cubin.CubinError, match="machine is 62"):
        cubin.parse(bytes(data))


def test_every_known_arch_compiles_to_its_target():
    pytest.importorskip("cutlass")
    from aotc.build.compile import compile_variant
    from aotc.common.variant import Variant

    for arch in KNOWN_ARCHS:
        v = Variant.make("sdpa_combine", arch, dtype="bf16", head_dim=64, strides="general")
        art = compile_variant(v)
        info = cubin.parse(art.cubin)
        assert info.arch == arch
        assert art.abi.check_layout(info.kernels[art.abi.symbol].params) is None


def test_corrupt_cubins_raise_only_cubin_error(real_artifacts):
    """Random damage to the header, section table and .nv.info: parse returns or raises CubinError, nothing else."""
    import random

    data = real_artifacts[0].cubin
    e_shoff = struct.unpack_from("<Q", data, 0x28)[0]
    regions = [(0, 64), (e_shoff, len(data)), (0, len(data))]
    rng = random.Random(1234)
    refused = 0
    for _ in range(3000):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(*rng.choice(regions))] = rng.randrange(256)
        try:
            cubin.parse(bytes(b))
        except cubin.CubinError:
            refused += 1
    assert refused > 100  # the damage is real often enough to exercise the error paths


def test_compile_refuses_sources_edited_during_the_compile(monkeypatch):
    """A key names the sources at the time it was made; a cubin compiled after an edit must not be stored under it."""
    pytest.importorskip("cutlass")
    from aotc.build.compile import cache_key, compile_variant
    from aotc.common.errors import CompileError
    from aotc.families import Family
    from aotc.common.variant import Variant

    v = Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=64, strides="general")
    key = cache_key(v)
    assert key and compile_variant(v, key).key == key  # unchanged sources: the artifact keeps its key
    real = Family.source_digest
    monkeypatch.setattr(Family, "source_digest", lambda self: "edited-" + real(self))
    with pytest.raises(CompileError, match="sources changed while it compiled") as info:
        compile_variant(v, key)
    assert info.value.hint == "run the build again"
    # a tuning build patches the sources on purpose and names its cubins itself: no check
    assert compile_variant(v, "tune-key", check_sources=False).key == "tune-key"
