"""What the kernel families share at compile time: one cute.compile per ptxas level until no spill."""
from __future__ import annotations

import os
from typing import Any, Callable

import cutlass.cute as cute

from .. import cubin as cubin_reader

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
