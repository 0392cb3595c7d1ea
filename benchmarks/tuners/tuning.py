"""What the tuning scripts share: compile variants with a tile record of their own into one bundle."""
from __future__ import annotations

import hashlib
from pathlib import Path


def write_tuning_bundle(name: str, variants: list, path: Path, merge_into: str | None = None, tile=None) -> bool:
    """Compile `variants` with `tile` (a tile record of their family; None: the family's) and write them
    to `path`.

    Each cubin gets a key of its own: the cache's key would not see the tile, so these artifacts
    must never be stored in (or served from) the cache; compile_variant's source check is off for
    the same reason. Prints each kernel's registers, stack frame and shared memory. A configuration
    that does not compile is reported (False) and writes nothing, so a sweep goes on to the next."""
    from aotc.common import cubin
    from aotc.storage.bundle import write_bundle
    from aotc.build.compile import compile_variant

    arts = []
    try:
        for v in variants:
            art = compile_variant(v, key=hashlib.sha256(f"tune-{name}-{v.name}".encode()).hexdigest(),
                                  tile=tile, check_sources=False)
            k = next(iter(cubin.parse(art.cubin).kernels.values()))
            print(f"{name} {v.name}: {k.registers} regs, frame {k.frame_bytes} B, smem {art.launch.dynamic_smem}",
                  flush=True)
            arts.append(art)
    except Exception as e:
        print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
        return False
    if merge_into:
        from aotc.storage.bundle import read_bundle
        tuned = {a.variant.name for a in arts}
        arts += [a for a in read_bundle(merge_into, check_arch=False).artifacts if a.variant.name not in tuned]
    write_bundle(path, arts)
    return True
