"""Split a spec's variants into N shards for a CI matrix (`aotc build --shard I/N`).

Every machine that enumerates the same spec computes the same partition: it
depends only on each variant's canonical JSON (never on the spec's order, the
host, the Python hash seed or the cache), so N jobs running ``--shard 1/N`` ..
``--shard N/N`` build disjoint sets whose union is the whole spec, and
``aotc bundle merge`` joins their bundles into the bundle an unsharded build
writes.

Two strategies:

``balanced`` (default)
    Variants sorted by canonical JSON, dealt round-robin: shard sizes differ by
    at most one. Adding or removing a variant can move others to another shard.
``hash``
    Shard = sha256(canonical JSON) mod N: a variant stays in its shard however
    the spec changes (good for per-shard CI caches), but sizes vary.
"""
from __future__ import annotations

import hashlib
import re
from typing import Iterable, Sequence

from ..common.errors import SpecError
from ..common.variant import Variant

STRATEGIES = ("balanced", "hash")
_SHARD = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


class ShardError(SpecError):
    """A malformed --shard value (exit code 2, like any usage error)."""


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 1 <= I <= N (1-based, as CI matrix indices usually are)."""
    m = _SHARD.fullmatch(str(text))
    if not m:
        raise ShardError(f"--shard {text!r}: expected I/N, e.g. 2/8 (shard I of N, counting from 1)")
    index, count = int(m.group(1)), int(m.group(2))
    if count < 1:
        raise ShardError(f"--shard {text!r}: the number of shards N must be at least 1")
    if not 1 <= index <= count:
        raise ShardError(f"--shard {text!r}: the shard index I must be in 1..{count} (shards count from 1)")
    return index, count


def shard_index(variant: Variant, count: int) -> int:
    """The 1-based shard of `variant` under the ``hash`` strategy."""
    digest = hashlib.sha256(variant.canonical().encode()).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def assign(variants: Iterable[Variant], count: int, strategy: str = "balanced") -> dict[Variant, int]:
    """Every variant's 1-based shard."""
    if strategy not in STRATEGIES:
        raise ShardError(f"shard strategy {strategy!r}: expected one of {list(STRATEGIES)}")
    variants = list(dict.fromkeys(variants))
    if strategy == "hash":
        return {v: shard_index(v, count) for v in variants}
    ordered = sorted(variants, key=lambda v: v.canonical())
    return {v: i % count + 1 for i, v in enumerate(ordered)}


def select(variants: Sequence[Variant], index: int, count: int, strategy: str = "balanced") -> list[Variant]:
    """The variants of shard `index` of `count`, in the order they came in."""
    if not 1 <= index <= count:
        raise ShardError(f"shard {index}/{count}: the index must be in 1..{count}")
    where = assign(variants, count, strategy)
    return [v for v in dict.fromkeys(variants) if where[v] == index]
