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


# KvChunks' scan packs a prefix of full chunks (at most target chunks) and one of partial chunks (at most
# one per sequence) in one int32, 16 bits each: target_chunks + batch stays below this
MAX_DECODE_CHUNKS = 1 << 15


def decode_columns(heads_q: int, heads_kv: int, seqlen_q: int, rows_per_cta: int) -> int:
    """CTAs per chunk of a decode step (grid.x): one per (KV head, row tile of its packed query rows)."""
    return heads_kv * -(-(heads_q // heads_kv * seqlen_q) // rows_per_cta)


def decode_chunks(columns: int, sm_count: int, ctas_per_sm: int) -> int:
    """KvChunks' target chunk count T: one wave of CTAs (columns of them per chunk) over the GPU."""
    return max(1, sm_count * ctas_per_sm // columns)


def decode_grid(columns: int, chunks: int, batch: int) -> tuple[int, int, int]:
    """KvChunks (aotc.kernels.tile_scheduler): at most chunks + batch chunks, `columns` CTAs each."""
    return (columns, chunks + batch, 1)


def absorbs(blocks: int, chunk: int) -> bool:
    """KvChunks.absorbs: a sequence's rest of under chunk / 4 blocks goes into its last full chunk."""
    return blocks >= chunk and 0 < 4 * (blocks % chunk) < chunk


def kv_chunk_partition(kv_blocks: list[int], chunks: int, min_chunk_blocks: int) -> list[tuple[int, int, int]]:
    """The (sequence, first block, blocks) of every chunk KvChunks makes, in chunk-index order, for the given
    kv blocks per sequence: the same arithmetic as the kernel, for tests and benchmark reports."""
    total = sum(kv_blocks)
    c = max(min_chunk_blocks, -(-total // chunks))
    full = [(b, j * c, c + (n % c if j == n // c - 1 and absorbs(n, c) else 0))
            for b, n in enumerate(kv_blocks) for j in range(n // c)]
    partial = [(b, n // c * c, n % c) for b, n in enumerate(kv_blocks) if (n % c and not absorbs(n, c)) or n == 0]
    return full + partial


def ragged_grid(sm_count: int) -> tuple[int, int, int]:
    """RaggedTiles (aotc.kernels.tile_scheduler): one CTA per SM; the work items are counted on the device."""
    return (sm_count, 1, 1)
