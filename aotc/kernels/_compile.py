"""What the kernel families share at compile time: one cute.compile per ptxas level until no spill."""
from __future__ import annotations

import os
from typing import Any, Callable

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from ..common import cubin as cubin_reader
from ..common.abi import Param

# ptxas optimization levels tried in order: at ~255 registers -O3 sometimes hoists loads far enough to
# spill a few values, where -O2/-O1 do not; the first level with no stack frame wins
PTXAS_LEVELS = ("-O3", "-O2", "-O1")


def compile_least_spilling(build_host: Callable[[], Any], placeholders: list, arch: str, dump_dir: str,
                           keep_ptx: bool):
    """cute.compile the host function at each ptxas level until the kernel has no stack frame.

    Returns (compiled, cubin bytes, kernel symbol, frame bytes, ptxas level) of the first level with no
    frame, else of the level with the smallest frame.
    """
    best = None
    for level in PTXAS_LEVELS:
        # cute.compile writes files named after the host function: one dump_dir per compile
        sub = os.path.join(dump_dir, f"ptxas{level}")
        os.makedirs(sub, exist_ok=True)
        opts = f"--gpu-arch {arch} --keep-cubin --dump-dir={sub} --ptxas-options={level}"
        if keep_ptx:
            opts += " --keep-ptx"
        compiled = cute.compile(build_host(), *placeholders, options=opts)
        symbols = list(compiled.kernel_info)
        if len(symbols) != 1:
            raise RuntimeError(f"expected one kernel in the module, got {symbols}")
        data = bytes(compiled.__cubin__)
        frame = max((k.frame_bytes for k in cubin_reader.parse(data).kernels.values()), default=0)
        if best is None or frame < best[3]:
            best = (compiled, data, str(symbols[0]), frame, level)
        if frame == 0:
            break
    return best


def placeholders(params: tuple[Param, ...], pointers: dict[str, tuple[Any, int]]) -> list:
    """Arguments to trace a host function with, one per kernel parameter, in order.

    A parameter named in `pointers` gets a pointer placeholder of that (element type, assumed
    alignment in bytes): the alignment becomes the kernel parameter's .align, which the
    runtime's checks guarantee. Every other parameter gets a scalar of its kind (the values are
    runtime arguments, never baked into the code).
    """
    from cutlass.cute.runtime import make_ptr

    scalars = {"i32": Int32(1), "i64": Int64(8), "f32": Float32(1.0)}
    args = []
    for p in params:
        if p.name in pointers:
            dtype, align = pointers[p.name]
            args.append(make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align))
        elif p.kind in scalars:
            args.append(scalars[p.kind])
        else:
            raise ValueError(f"parameter {p.name!r} ({p.kind}) needs a pointer placeholder")
    return args


def check_param_kinds(family: str, params: tuple[Param, ...], expected: list[str]) -> None:
    """The kernel code below a family is written against its PARAMS: refuse to compile if they drifted."""
    kinds = [p.kind for p in params]
    if kinds != expected:
        raise RuntimeError(f"{family} PARAMS changed ({kinds}); update aotc/kernels/{family}.py")
