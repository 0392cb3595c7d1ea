"""The kv loops of a Hopper prefill kernel as ptxas scheduled them, and FA3's beside them (SASS; no GPU needed).

    python benchmarks/probes/sass_loops.py artifacts/default.aotc \
        'sdpa_prefill_sm90.sm_90a.block_n=128.causal=1.dtype=bf16.head_dim=128.kv_dtype=bf16.layout=dense.sinks=0.softcap=0.window=0' \
        [--fa3-cubin CUBIN --fa3-kernel SUBSTRING]

A kv loop is the body of a backward branch holding both GEMMs of an iteration (at least 10 wgmma, S's reading Q
from shared memory and PV's reading P from registers) and fewer than 1000 instructions (the tile loops around them
hold more). Prints one line per loop: its instructions, HGMMAs, MUFU.EX2 (exp2), FMNMX (row max), the exp2s
issued between the wait for S (wgmma wait_group 1) and the wait for PV (wait_group 0), which overlap the PV GEMM,
and with --fa3-* the instruction classes where aotc's steadiest loop (the shortest) and FA3's differ.

FA3's cubins are inside the fa3-fwd wheel's _C.abi3.so: `cuobjdump -xelf all _C.abi3.so` (the
nvidia-cuda-cuobjdump wheel) writes them; --fa3-kernel picks the function whose demangled name (c++filt)
holds the substring, e.g. its D128 causal bf16 kernel: 'cute::C<128>, cute::C<128>, cute::C<128> >, 128,
cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false, false, false, false, false, false, true, true,
false, false, false>' (CollectiveMainloopFwdSm90's causal, local, softcap, varlen, paged, ... flags).
tests/test_kernel_sdpa_prefill_sm90_sass.py holds aotc's loops to what was measured with the same parsing.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from aotc.storage.bundle_reader import open_bundle  # noqa: E402

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH_TO = re.compile(r"\bBRA\b\s+`\((\.L_x_\d+)\)")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.(\S+?),")
# the two GEMMs of a kv iteration: S = Q K^T reads its A operand (Q) from shared memory, O += P V from registers
# (a loop of PV wgmmas alone, such as the ragged and paged kernels' last block of a tile, is not a kv loop)
_S_GEMM = re.compile(r"\bHGMMA\.\S+ R\d+, gdesc\[")
_PV_GEMM = re.compile(r"\bHGMMA\.\S+ R\d+, R\d+, gdesc\[")


def nvdisasm() -> str | None:
    """The disassembler: $NVDISASM, else the nvidia-cuda-nvdisasm wheel's (nvidia/cu13/bin), else PATH's."""
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    try:
        import nvidia  # the CUDA wheels' namespace package
    except ImportError:
        return shutil.which("nvdisasm")
    for root in nvidia.__path__:
        for found in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(found)
    return shutil.which("nvdisasm")


def disassemble(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([nvdisasm(), str(path)], capture_output=True, text=True, check=True).stdout


def functions(text: str) -> dict[str, str]:
    """Each function's SASS text of a disassembled cubin, by its (mangled) name."""
    out, name, lines = {}, None, []
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            if name:
                out[name] = "\n".join(lines)
            name, lines = m.group(1), []
        elif name:
            lines.append(line)
    if name:
        out[name] = "\n".join(lines)
    return out


def kv_loops(text: str) -> list[list[str]]:
    """The kv loops (see the module doc) of SASS text, each as its list of instructions."""
    instructions, labels, pending = [], {}, []
    for line in text.splitlines():
        label = _LABEL.match(line.strip())
        if label:
            pending.append(label.group(1))  # the next instruction's address
            continue
        m = _INSTRUCTION.search(line)
        if m and not m.group(2).startswith("."):  # (directives such as .word in the info sections)
            for name in pending:
                labels[name] = len(instructions)
            pending = []
            instructions.append(m.group(2))
    loops = []
    for i, op in enumerate(instructions):
        m = _BRANCH_TO.search(op)
        if m and labels.get(m.group(1), i) < i:
            body = instructions[labels[m.group(1)]:i + 1]
            if (sum("HGMMA" in o for o in body) >= 10 and len(body) < 1000
                    and any(_S_GEMM.search(o) for o in body) and any(_PV_GEMM.search(o) for o in body)):
                loops.append(body)
    return loops


def between_waits(body: list[str]) -> list[str]:
    """The instructions between the wait for S (wait_group 1) and the wait for PV (wait_group 0)."""
    start = next(i for i, op in enumerate(body) if "DEPBAR.LE gsb0, 0x1" in op)
    end = next(i for i, op in enumerate(body) if "DEPBAR.LE gsb0, 0x0" in op and i > start)
    return body[start:end]


def opcode_classes(body: list[str]) -> collections.Counter:
    """How many instructions of each opcode (without modifiers or predicate) a loop holds."""
    return collections.Counter((op.split()[1] if op.startswith("@") else op.split()[0]).split(".")[0] for op in body)


def loop_stats(body: list[str]) -> dict:
    count = opcode_classes(body)
    stats = {"instructions": len(body), "HGMMA": count["HGMMA"], "exp2": sum("MUFU.EX2" in o for o in body),
             "FMNMX": count["FMNMX"], "BAR": count["BAR"]}
    try:
        stats["exp2_before_pv_wait"] = sum("MUFU.EX2" in o for o in between_waits(body))
    except StopIteration:  # not an overlapped iteration (no S wait / PV wait pair)
        stats["exp2_before_pv_wait"] = None
    return stats


def bundle_cubin(bundle: str, variant: str) -> bytes:
    """A variant's cubin from a bundle, read and checked by the bundle reader (aotc.storage.bundle_reader)."""
    index = open_bundle(bundle, check_arch=False, other_sources=True)
    for member in index.members:
        if member.variant.name == variant:
            return member.read().cubin
    raise SystemExit(f"{bundle} holds no variant {variant!r} (`aotc bundle inspect {bundle}` lists them)")


def fa3_function(cubin: Path, substring: str) -> str:
    """The SASS of the function of FA3's cubin whose demangled name holds `substring`."""
    demangle = shutil.which("c++filt")
    for name, text in functions(disassemble(cubin.read_bytes())).items():
        readable = subprocess.run([demangle, name], capture_output=True, text=True).stdout if demangle else name
        if substring in readable:
            return text
    raise SystemExit(f"no function of {cubin} has {substring!r} in its name")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("variant", help="the variant's full name, as `aotc bundle inspect` lists it")
    ap.add_argument("--fa3-cubin", type=Path, help="a cubin extracted from the fa3-fwd wheel")
    ap.add_argument("--fa3-kernel", help="a substring of the FA3 function's demangled name")
    args = ap.parse_args()
    if nvdisasm() is None:
        sys.exit("no nvdisasm (pip install nvidia-cuda-nvdisasm, or set NVDISASM)")
    if (args.fa3_cubin is None) != (args.fa3_kernel is None):
        ap.error("--fa3-cubin and --fa3-kernel go together")
    sides = {"aotc": kv_loops(disassemble(bundle_cubin(args.bundle, args.variant)))}
    if args.fa3_cubin:
        sides["fa3"] = kv_loops(fa3_function(args.fa3_cubin, args.fa3_kernel))
    for side, loops in sides.items():
        for body in loops:
            print(side, loop_stats(body))
    if len(sides) == 2 and all(sides.values()):
        a, b = (opcode_classes(min(loops, key=len)) for loops in sides.values())
        print("shortest loops, classes that differ (aotc, fa3):",
              {k: (a[k], b[k]) for k in sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k])) if a[k] != b[k]})


if __name__ == "__main__":
    main()
