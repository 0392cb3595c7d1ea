"""Host halves of the kernels' tile schedulers: the grids the runtime launches (plain Python).

Each kernel-side scheduler in aotc.kernels.tile_scheduler names its host half here; the runtime imports
only this module (it never imports the DSL), the kernels import both halves.
"""
from __future__ import annotations

INT32_LIMIT = 1 << 31


def persistent_grid(m_blocks: int, heads_q: int, batch: int, sm_count: int) -> tuple[int, int, int]:
    """PersistentTiles (aotc.kernels.tile_scheduler): at most one CTA per SM, each walking its share of
    the m_blocks * heads_q * batch query tiles. Raises ValueError when the tile count is not 32-bit."""
    tiles = m_blocks * heads_q * batch
    if tiles >= INT32_LIMIT:
        raise ValueError(f"{tiles} query tiles: the kernel's tile count is 32-bit")
    return (min(tiles, sm_count), 1, 1)
