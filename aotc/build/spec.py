"""Spec files: TOML variant matrices, enumerated and pruned by each family's validity rules.

    [[family]]
    name = "sdpa_combine"          # kernel family
    arch = ["sm_90a", "sm_80"]     # target archs
    dtype = ["bf16", "fp16"]       # every other key is one of the family's fields;
    head_dim = [64, 128, 256]      # a field left out takes all of its choices
    exclude = [{dtype = "fp16", head_dim = 256}]   # optional: drop matching combinations

The product of the lists is pruned by (in order) the family's supported archs,
the spec's ``exclude`` tables and the family's validity rule; every pruned
combination keeps its reason, which ``aotc list --why-not`` prints.
"""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..common.errors import SpecError
from ..common.untrusted import UntrustedInput, read_regular_file
from ..families import KNOWN_ARCHS, get_family
from ..common.variant import Variant

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "data" / "default.toml"
MAX_SPEC_BYTES = 16 << 20


@dataclass(frozen=True)
class Pruned:
    family: str
    values: dict
    reason: str


@dataclass(frozen=True)
class Spec:
    name: str
    path: str
    variants: tuple[Variant, ...]
    pruned: tuple[Pruned, ...]


def load_spec(path: str | Path | None = None) -> Spec:
    """Read and enumerate a spec file; None means the embedded default spec."""
    path = Path(path) if path is not None else DEFAULT_SPEC
    try:
        data = read_regular_file(path, MAX_SPEC_BYTES, f"spec {str(path)!r}")
    except UntrustedInput as e:
        raise SpecError(str(e)) from None
    except OSError as e:
        raise SpecError(f"cannot read spec {str(path)!r}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")  # TOML is UTF-8; a byte-order mark some editors write is allowed
    except UnicodeDecodeError as e:
        raise SpecError(f"spec {str(path)!r} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})",
                        hint="save the spec as UTF-8") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"spec {str(path)!r} is not valid TOML: {e}") from None
    name = path.stem
    return enumerate_spec(doc, name=name, where=str(path))


def enumerate_spec(doc: dict, name: str = "spec", where: str = "<spec>") -> Spec:
    families = doc.get("family")
    if not isinstance(families, list) or not families:
        raise SpecError(f"{where}: expected one or more [[family]] tables")
    variants: dict[Variant, None] = {}
    pruned: list[Pruned] = []
    for i, table in enumerate(families):
        ctx = f"{where}: [[family]] #{i + 1}"
        if not isinstance(table, dict) or "name" not in table:
            raise SpecError(f"{ctx}: missing 'name'")
        if not isinstance(table["name"], str):
            raise SpecError(f"{ctx}: name = {table['name']!r}: expected one family name, a string "
                            f"(one [[family]] table per family)")
        try:
            fam = get_family(table["name"])
        except KeyError as e:
            raise SpecError(f"{ctx}: {e.args[0]}") from None
        table = dict(table)
        table.pop("name")
        archs = _as_list(table.pop("arch", None), f"{ctx}: arch")
        if archs is None:
            raise SpecError(f"{ctx}: 'arch' is required (e.g. arch = [\"sm_90a\"])")
        for a in archs:
            if a not in KNOWN_ARCHS:
                raise SpecError(f"{ctx}: arch {a!r} is not one of {list(KNOWN_ARCHS)}")
        excludes = table.pop("exclude", [])
        if not isinstance(excludes, list) or not all(isinstance(e, dict) for e in excludes):
            raise SpecError(f"{ctx}: 'exclude' must be a list of tables")
        field_names = [f.name for f in fam.fields]
        for key in table:
            if key not in field_names:
                raise SpecError(f"{ctx}: unknown field {key!r} for family {fam.name}; fields are {field_names + ['arch', 'exclude']}")
        for ex in excludes:
            for key, value in ex.items():
                if key not in field_names and key != "arch":
                    raise SpecError(f"{ctx}: exclude names unknown field {key!r}")
                # a value no combination can take would silently exclude nothing
                choices = list(KNOWN_ARCHS) if key == "arch" else list(fam.field(key).choices)
                if value not in choices or type(value) is not type(choices[0]):
                    raise SpecError(f"{ctx}: exclude {key} = {value!r} is not one of {choices}")
        distinct = {frozenset(ex.items()) for ex in excludes}
        if len(distinct) != len(excludes):
            raise SpecError(f"{ctx}: an exclude table is listed more than once")
        lists = []
        follows = {}  # field -> the field whose value it takes (Field.unlisted_from, the spec leaving it out)
        for f in fam.fields:
            values = _as_list(table.get(f.name), f"{ctx}: {f.name}")
            if values is None and f.unlisted_from:
                follows[f.name] = f.unlisted_from
                lists.append([None])
                continue
            values = list(f.choices if f.unlisted is None else f.unlisted) if values is None else values
            for v in values:
                if v not in f.choices or type(v) is not type(f.choices[0]):
                    raise SpecError(f"{ctx}: {f.name} = {v!r} is not one of {list(f.choices)}")
            lists.append(values)
        for arch in archs:
            for combo in itertools.product(*lists):
                values = dict(zip(field_names, combo))
                values.update({name: values[other] for name, other in follows.items()})
                reason = None
                if arch not in fam.archs:
                    reason = f"family {fam.name} does not support {arch} (supports {list(fam.archs)})"
                elif any(all((arch if k == "arch" else values[k]) == v for k, v in ex.items()) for ex in excludes):
                    reason = "excluded by the spec"
                else:
                    reason = fam.why_invalid({**values, "arch": arch})
                if reason is not None:
                    pruned.append(Pruned(fam.name, {"arch": arch, **values}, reason))
                else:
                    variants.setdefault(Variant.make(fam.name, arch, **values), None)
    return Spec(name, where, tuple(variants), tuple(pruned))


def _as_list(value: Any, ctx: str) -> list | None:
    if value is None:
        return None
    if isinstance(value, list):
        if not value:
            raise SpecError(f"{ctx}: empty list")
        # a value listed twice is a mistake, and copies multiply: 100 copies in each of five fields
        # would make 10^10 combinations to enumerate
        seen: set = set()
        for v in value:
            ident = (type(v), v) if isinstance(v, (str, int, bool, float)) else (type(v), id(v))
            if ident in seen:
                raise SpecError(f"{ctx}: {v!r} is listed more than once")
            seen.add(ident)
        return value
    if isinstance(value, (str, int, bool)):
        return [value]
    raise SpecError(f"{ctx}: expected a value or a list, got {type(value).__name__}")
