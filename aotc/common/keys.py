"""Cache keys: what a key is made of, and what a recorded key says about the artifact that carries it.

key = sha256 of canonical JSON over the variant record, its arch, a digest of the kernel family's
source files, the aotc version, every installed nvidia-cutlass-dsl* distribution and version, and the
compile options. Everything but the variant is an artifact's *key parts*; the compile records them in
the artifact's ``info["key_parts"]``, so any reader can recompute the key from the variant it is
labelled with, whichever sources and versions made it. A relabelled artifact (a D256 kernel labelled
head_dim 128, a made-up key) then no longer matches its own key. ``info["key_parts"] = None`` marks
a key that is deliberately not a cache key (a tuning build of patched sources). Artifacts made before
the parts were recorded carry neither; their keys can be recomputed only with this aotc's sources.

Standard library only, and no DSL import: the runtime classifies keys too.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re

from .. import __version__
from .variant import Variant

KEY_LAYOUT = "aotc-cache-v1"
# Options every compile passes besides --gpu-arch; part of the key.
COMPILE_OPTIONS = ""
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PART_NAMES = ("aotc", "dsl", "family_source", "options")


def key_from_parts(variant: Variant, parts: dict) -> str:
    """The key of `variant` built with `parts` ({"family_source", "aotc", "dsl", "options"})."""
    doc = {
        "layout": KEY_LAYOUT,
        "variant": variant.to_json(),  # family, arch and every code-changing field
        "family_source": parts["family_source"],  # kernel and family description source files
        "aotc": parts["aotc"],
        "dsl": parts["dsl"],  # every nvidia-cutlass-dsl* distribution and version
        "arch": variant.arch,
        "options": parts["options"],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def family_source_digest(family: str) -> str | None:
    """This aotc's source digest of a family, computed once per process (None for an unknown family).

    Readers use this; the compile side recomputes it on every key (aotc.build.compile.cache_key), so a
    source edited during a build is noticed there."""
    from ..families import get_family

    try:
        return get_family(family).source_digest()
    except KeyError:
        return None


def local_dsl_versions() -> dict[str, str]:
    """The installed DSL distributions (read once per process; empty on a runtime-only machine)."""
    from .versions import dsl_versions  # importlib.metadata: imported only when a key needs it

    return dsl_versions()


def this_aotc_parts(variant: Variant, dsl: dict[str, str]) -> dict | None:
    """The key parts this aotc would record for `variant` with these DSL versions (None: unknown family)."""
    digest = family_source_digest(variant.family)
    if digest is None:
        return None
    return {"family_source": digest, "aotc": __version__, "dsl": dict(dsl), "options": COMPILE_OPTIONS}


class KeyStatus:
    """What an artifact's recorded key says about it.

    state:
      "lie"        the key is not the one its recorded parts give for its variant: relabelled or made up
      "consistent" the key its recorded parts give for its variant
      "custom"     recorded as not a cache key (key_parts None)
      "current"    no parts recorded; the key this aotc's sources give the variant with the DSL versions
                   the artifact records, or with the installed DSL's
      "unmatched"  no parts recorded; this aotc computes another key for the variant (relabelled, or
                   made by another aotc, DSL or sources: the two cannot be told apart)
      "unknown"    no parts recorded and no DSL versions, here or recorded, to compute a key with
    same_sources: made from this aotc's version, family sources and options (its family's rules apply).
    local_dsl: the DSL is installed here (looked up only when a key without parts does not match).
    """


    __slots__ = ("state", "reason", "same_sources", "local_dsl")

    def __init__(self, state: str, reason: str = "", same_sources: bool = False, local_dsl: bool = False):
        self.state, self.reason, self.same_sources, self.local_dsl = state, reason, same_sources, local_dsl

    def __repr__(self) -> str:
        return f"KeyStatus({self.state!r}, same_sources={self.same_sources}, local_dsl={self.local_dsl})"


def check_recorded(variant: Variant, key: str, info: dict) -> KeyStatus:
    """What `key`, recorded for `variant` with `info` (an artifact header's info), says."""
    if "key_parts" in info:
        parts = info["key_parts"]
        if parts is None:
            return KeyStatus("custom", "the producer recorded its key as not a cache key")
        problem = _parts_problem(parts)
        if problem:
            return KeyStatus("lie", f"recorded key parts are malformed: {problem}")
        if key_from_parts(variant, parts) != key:
            return KeyStatus("lie", f"key {key[:16]}... is not the key of {variant.name} with the sources and "
                                    f"versions it records (relabelled, or the key was edited)")
        same = (parts["aotc"] == __version__ and parts["options"] == COMPILE_OPTIONS
                and parts["family_source"] == family_source_digest(variant.family))
        return KeyStatus("consistent", same_sources=same)
    # no parts recorded: try this aotc's sources with the DSL versions the artifact records (what its
    # producer used; no lookup of the installed DSL, which costs more than reading a whole bundle), then
    # with the installed DSL's
    recorded = _recorded_dsl(info)
    parts = this_aotc_parts(variant, recorded) if recorded else None
    if parts is not None and key_from_parts(variant, parts) == key:
        return KeyStatus("current", same_sources=True)
    local = local_dsl_versions()
    parts = this_aotc_parts(variant, local) if local and local != recorded else None
    if parts is not None and key_from_parts(variant, parts) == key:
        return KeyStatus("current", same_sources=True, local_dsl=True)
    if not recorded and not local:
        return KeyStatus("unknown", "no DSL versions to recompute the key with")
    return KeyStatus("unmatched", f"key {key[:16]}... is not the key this aotc computes for {variant.name} "
                                  f"(relabelled, or made by another aotc, DSL or kernel sources)",
                     local_dsl=bool(local))


def is_this_aotcs_key(variant: Variant, key: str, info: dict) -> bool:
    """Whether `key` is the key this aotc computes for `variant` here: with the installed DSL, or on a
    machine without one, with the DSL versions the artifact records. What the cache serves."""
    parts = this_aotc_parts(variant, local_dsl_versions() or _recorded_dsl(info))
    return parts is not None and bool(parts["dsl"]) and key_from_parts(variant, parts) == key


def _recorded_dsl(info: dict) -> dict[str, str]:
    parts = info.get("key_parts")
    if isinstance(parts, dict) and isinstance(parts.get("dsl"), dict):
        return parts["dsl"]
    versions = info.get("versions")
    if not isinstance(versions, dict):
        return {}
    return {k: v for k, v in versions.items() if isinstance(k, str) and k.startswith("nvidia-cutlass-dsl")
            and isinstance(v, str)}


def _parts_problem(parts) -> str | None:
    if not isinstance(parts, dict) or sorted(parts) != sorted(_PART_NAMES):
        return f"expected an object with {list(_PART_NAMES)}"
    if not isinstance(parts["family_source"], str) or not _HEX64.fullmatch(parts["family_source"]):
        return "family_source is not a sha256 hex digest"
    if not isinstance(parts["aotc"], str) or not isinstance(parts["options"], str):
        return "aotc and options must be strings"
    dsl = parts["dsl"]
    if not isinstance(dsl, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in dsl.items()):
        return "dsl must map distribution names to version strings"
    return None
