"""The one compile helper of every kernel family: a kernel object in, one record out.

A kernel class (sdpa_combine.SdpaCombine, sdpa_prefill.SdpaPrefill, ...) holds its compile-time
configuration and offers:

    params            the family's parameter list (aotc.families.<family>.PARAMS), in kernel order
    pointee_types()   {pointer parameter: its CuTe element type} (alignment: Param.pointee_align)
    launch_facts()    LaunchFacts of this configuration (block, dynamic shared memory, tile facts)
    ptxas_levels      ptxas optimization levels to try, in order (None: ptxas' default)
    __call__          the @cute.jit host function, traced with one placeholder per parameter

compile_kernel() traces and compiles it for an arch and returns a KernelBuild: the cubin, the ABI
(symbol and parameters) and the launch facts, plus what the compile found (ptxas level, stack frame)
and, when asked, the PTX. The checks of the result against the cubin itself live in
aotc.build.compile, which turns a KernelBuild into an Artifact.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..common import cubin as cubin_reader
from ..common.abi import KernelABI, LaunchFacts, Param

# ptxas optimization levels tried in order: at ~255 registers -O3 sometimes hoists loads far enough to
# spill a few values, where -O2/-O1 do not; the first level with no stack frame wins
PTXAS_LEVELS = ("-O3", "-O2", "-O1")


@dataclass(frozen=True)
class KernelBuild:
    cubin: bytes
    abi: KernelABI
    launch: LaunchFacts
    ptxas_level: str | None
    frame_bytes: int
    ptx: str = ""


def placeholders(params: tuple[Param, ...], pointee_types: dict[str, Any]) -> list:
    """Arguments to trace a host function with, one per kernel parameter, in order.

    A pointer parameter gets a placeholder of its element type and its Param.pointee_align (the
    alignment the runtime checks before every launch becomes the kernel parameter's .align); every
    other parameter a scalar of its kind (the values are runtime arguments, never baked into the code).
    """
    from cutlass.cute.runtime import make_ptr

    scalars = {"i32": Int32(1), "i64": Int64(8), "f32": Float32(1.0)}
    args = []
    for p in params:
        if p.name in pointee_types:
            args.append(make_ptr(pointee_types[p.name], 16, cute.AddressSpace.gmem, assumed_align=p.pointee_align))
        elif p.kind in scalars:
            args.append(scalars[p.kind])
        else:
            raise ValueError(f"parameter {p.name!r} ({p.kind}) needs a pointer placeholder")
    return args


# the host function's annotation for each parameter kind (a TMA descriptor parameter is traced from a
# pointer: the host function builds a stand-in descriptor from it)
_HOST_TYPES = {"ptr": cute.Pointer, "tensormap": cute.Pointer, "i32": Int32, "i64": Int64, "f32": Float32}


def check_host_signature(kernel) -> None:
    """The host function takes exactly the family's parameters, in order, with matching types: the kernel
    code below a family is written against its parameter list, so refuse to compile if they drifted."""
    sig = inspect.signature(type(kernel).__call__)
    got = [(n, p.annotation) for n, p in sig.parameters.items() if n != "self"]
    want = [(p.name, _HOST_TYPES[p.kind]) for p in kernel.params]
    if got != want:
        raise RuntimeError(f"{type(kernel).__name__}'s host function takes {[n for n, _ in got]}, the family's "
                           f"parameters are {[n for n, _ in want]} (names or types differ)")


def check_register_split(kernel, cubin: bytes, launch: LaunchFacts) -> None:
    """A kernel that moves registers among its warps with setmaxnreg (its `registers_after_setmaxnreg`: what its
    warps hold between them afterwards) must have been given that many at launch: the CTA's threads times the
    cubin's registers a thread. Short of it, the setmaxnreg.inc waits forever on the GPU; refuse the cubin."""
    need = getattr(kernel, "registers_after_setmaxnreg", None)
    if need is None:
        return
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    for info in cubin_reader.parse(cubin).kernels.values():
        if info.registers is None or info.registers * threads < need:
            raise RuntimeError(f"{info.name}: its warps hold {need} registers after setmaxnreg, but ptxas gave "
                               f"{info.registers} a thread to {threads} threads ({(info.registers or 0) * threads}); "
                               "the consumers' setmaxnreg.inc would wait forever")


def compile_kernel(kernel, arch: str, dump_dir: str, *, keep_ptx: bool = False) -> KernelBuild:
    """cute.compile the kernel's host function for `arch`, at each of its ptxas levels until the kernel
    has no stack frame (the first level with none wins, else the smallest frame)."""
    check_host_signature(kernel)
    args = placeholders(kernel.params, kernel.pointee_types())
    best = None
    for level in kernel.ptxas_levels:
        # cute.compile writes files named after the host function: one dump_dir per compile
        sub = os.path.join(dump_dir, f"ptxas{level or ''}")
        os.makedirs(sub, exist_ok=True)
        opts = f"--gpu-arch {arch} --keep-cubin --dump-dir={sub}"
        if level is not None:
            opts += f" --ptxas-options={level}"
        if keep_ptx:
            opts += " --keep-ptx"
        compiled = cute.compile(kernel, *args, options=opts)
        symbols = list(compiled.kernel_info)
        if len(symbols) != 1:
            raise RuntimeError(f"expected one kernel in the module, got {symbols}")
        data = bytes(compiled.__cubin__)
        frame = max((k.frame_bytes for k in cubin_reader.parse(data).kernels.values()), default=0)
        if best is None or frame < best[3]:
            best = (compiled, data, str(symbols[0]), frame, level)
        if frame == 0:
            break
    compiled, data, symbol, frame, level = best
    launch = kernel.launch_facts()
    check_register_split(kernel, data, launch)
    return KernelBuild(cubin=data, abi=KernelABI(symbol, tuple(kernel.params)), launch=launch,
                       ptxas_level=level, frame_bytes=frame, ptx=str(compiled.__ptx__) if keep_ptx else "")
