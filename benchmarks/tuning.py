"""What the tuning scripts share: compile variants under a patched tile table into one bundle."""
from __future__ import annotations

import hashlib
from pathlib import Path


def write_tuning_bundle(name: str, variants: list, path: Path) -> None:
    """Compile `variants` as the (patched) kernel sources now stand and write them to `path`.

    Each cubin gets a key of its own: the cache's key would not see the patch, so these artifacts
    must never be stored in (or served from) the cache; compile_variant's source check is off for
    the same reason. Prints each kernel's registers, stack frame and shared memory."""
    from aotc import cubin
    from aotc.bundle import write_bundle
    from aotc.compile import compile_variant

    arts = []
    for v in variants:
        art = compile_variant(v, key=hashlib.sha256(f"tune-{name}-{v.name}".encode()).hexdigest(),
                              check_sources=False)
        k = next(iter(cubin.parse(art.cubin).kernels.values()))
        print(f"{name} {v.name}: {k.registers} regs, frame {k.frame_bytes} B, smem {art.launch.dynamic_smem}",
              flush=True)
        arts.append(art)
    write_bundle(path, arts)
