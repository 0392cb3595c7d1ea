"""Read facts off a cubin (a CUDA ELF file) with the standard library alone.

Used by the compile side to check the ABI it records against the machine
code, and by bundle checks to refuse a cubin built for another arch, on
machines without a GPU. The runtime checks again with cuKernelGetParamInfo.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

ELF_MAGIC = b"\x7fELF"
ELFOSABI_CUDA = (0x33, 0x41)  # 0x41: the layout newer toolchains write for sm_100+
EM_CUDA = 190

# .nv.info attribute ids (EIATTR_*) we read
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_REGCOUNT = 0x2F
_EIATTR_FRAME_SIZE = 0x11  # per-thread stack frame: > 0 means local memory (register spills, local arrays)
_EIATTR_MAX_THREADS = 0x10
_EIATTR_CBANK_PARAM_SIZE = 0x19
# .nv.info record formats: (format byte) -> how the value is stored
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


class CubinError(ValueError):
    pass


@dataclass
class KernelInfo:
    name: str
    params: list[tuple[int, int]] = field(default_factory=list)  # (offset, size) by ordinal
    param_bytes: int | None = None
    registers: int | None = None
    frame_bytes: int = 0
    static_smem: int = 0
    max_threads: tuple[int, int, int] | None = None
    # sha256 of the kernel's machine code (its .text section): equal for two cubins that differ only in
    # names (the symbol, ELF metadata), so `aotc bundle diff` can tell a rename from a code change
    code_sha256: str = ""


@dataclass
class CubinInfo:
    arch: str  # e.g. "sm_90a", "sm_80", "sm_100a"
    kernels: dict[str, KernelInfo]


def arch_of(e_flags: int, abi_version: int) -> str:
    """The SM target an ELF header records."""
    if abi_version >= 8:  # CUDA 12.8+ layout: sm in bits 8..15, "a"/"f" feature bits below
        sm = (e_flags >> 8) & 0xFF
        suffix = "a" if e_flags & 0x8 else ("f" if e_flags & 0x4 else "")
        return f"sm_{sm}{suffix}"
    sm = e_flags & 0xFF
    return f"sm_{sm}{'a' if e_flags & 0x800 else ''}"  # 0x800: arch-specific ("a") features


def parse(data: bytes) -> CubinInfo:
    """Facts about a cubin; raises CubinError (never another exception) when data is not a well-formed one."""
    try:
        return _parse(data)
    except CubinError:
        raise
    except (struct.error, ValueError, IndexError, KeyError, UnicodeDecodeError) as e:
        raise CubinError(f"malformed cubin: {type(e).__name__}: {e}") from None


def _parse(data: bytes) -> CubinInfo:
    if len(data) < 64 or data[:4] != ELF_MAGIC:
        raise CubinError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF file")
    if data[7] not in ELFOSABI_CUDA:
        raise CubinError(f"ELF OS ABI is {data[7]:#x}, not CUDA")
    abi_version = data[8]
    (e_type, e_machine, _v, _entry, e_phoff, e_shoff, e_flags, _ehsize, e_phentsize, e_phnum,
     e_shentsize, e_shnum, e_shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
    if e_machine != EM_CUDA:
        raise CubinError(f"ELF machine is {e_machine}, not CUDA ({EM_CUDA})")
    if e_shoff + e_shnum * e_shentsize > len(data) or e_shentsize < 64:
        raise CubinError("section header table lies outside the file (truncated?)")
    # the loader reads the program headers and segments too: a cut-off tail is a truncated cubin
    if e_phnum and (e_phentsize < 56 or e_phoff + e_phnum * e_phentsize > len(data)):
        raise CubinError("program header table lies outside the file (truncated?)")
    for i in range(e_phnum):
        p_offset, p_filesz = struct.unpack_from("<Q16xQ", data, e_phoff + i * e_phentsize + 8)  # Elf64_Phdr
        if p_offset + p_filesz > len(data):
            raise CubinError(f"segment {i} lies outside the file (truncated?)")
    sections = []
    for i in range(e_shnum):
        name, typ, _flags, _addr, off, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
        if typ != 8 and off + size > len(data):  # SHT_NOBITS occupies no file space
            raise CubinError(f"section {i} lies outside the file (truncated?)")
        sections.append((name, typ, off, size, link, info, entsize))
    if e_shstrndx >= len(sections):
        raise CubinError("bad section-name table index")
    shstr_off = sections[e_shstrndx][2]

    def sec_name(sec) -> str:
        start = shstr_off + sec[0]
        end = data.index(b"\0", start)
        return data[start:end].decode("ascii", "replace")

    named = {sec_name(s): s for s in sections}
    kernels: dict[str, KernelInfo] = {}
    for name in named:
        if name.startswith(".text."):
            sec = named[name]
            kernels[name[len(".text."):]] = KernelInfo(
                name[len(".text."):], code_sha256=hashlib.sha256(data[sec[2]:sec[2] + sec[3]]).hexdigest())
    for kname, k in kernels.items():
        shared = named.get(f".nv.shared.{kname}")
        if shared is not None:
            k.static_smem = shared[3]
        info = named.get(f".nv.info.{kname}")
        if info is not None:
            _read_nv_info(data[info[2]:info[2] + info[3]], k)
    # register counts and stack frames live in the global .nv.info, keyed by symbol index
    symtab, glob = named.get(".symtab"), named.get(".nv.info")
    if symtab is not None and glob is not None:
        strtab_off = sections[symtab[4]][2]
        by_index = {}
        for i in range(symtab[3] // 24):
            st_name = struct.unpack_from("<I", data, symtab[2] + 24 * i)[0]
            end = data.index(b"\0", strtab_off + st_name)
            by_index[i] = data[strtab_off + st_name:end].decode("ascii", "replace")
        regs: dict[int, int] = {}
        frames: dict[int, int] = {}
        _read_nv_info(data[glob[2]:glob[2] + glob[3]], KernelInfo("<global>"), regs, frames)
        for idx, count in regs.items():
            if by_index.get(idx) in kernels:
                kernels[by_index[idx]].registers = count
        for idx, size in frames.items():
            if by_index.get(idx) in kernels:
                kernels[by_index[idx]].frame_bytes = size
    return CubinInfo(arch_of(e_flags, abi_version), kernels)


def _read_nv_info(blob: bytes, k: KernelInfo, regs: dict[int, int] | None = None,
                  frames: dict[int, int] | None = None) -> None:
    pos, params = 0, {}
    while pos + 2 <= len(blob):
        fmt, attr = blob[pos], blob[pos + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", blob, pos + 2)
            payload = blob[pos + 4:pos + 4 + size]
            pos += 4 + size
        elif fmt in (_EIFMT_HVAL, _EIFMT_BVAL, _EIFMT_NVAL):
            payload = blob[pos + 2:pos + 4]
            pos += 4
        else:
            raise CubinError(f"unknown .nv.info record format {fmt:#x} in kernel {k.name}")
        if attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
            _index, ordinal, offset, word = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (offset, (word >> 18) & 0x3FFF)
        elif attr == _EIATTR_REGCOUNT and len(payload) >= 8 and regs is not None:
            sym, count = struct.unpack_from("<II", payload)
            regs[sym] = count
        elif attr == _EIATTR_FRAME_SIZE and len(payload) >= 8 and frames is not None:
            sym, size = struct.unpack_from("<II", payload)
            frames[sym] = max(size, frames.get(sym, 0))
        elif attr == _EIATTR_CBANK_PARAM_SIZE:
            k.param_bytes = struct.unpack_from("<H", payload)[0]
        elif attr == _EIATTR_MAX_THREADS and len(payload) >= 12:
            k.max_threads = struct.unpack_from("<III", payload)
    k.params = [params[i] for i in sorted(params)]
    if sorted(params) != list(range(len(params))):
        raise CubinError(f"kernel {k.name}: parameter ordinals are not contiguous: {sorted(params)}")
