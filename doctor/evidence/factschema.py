"""Typed facts schemas: what a probe declares it writes, checked against what it really writes.

A probe's ``facts_schema`` maps a fact path to ``"<type>: <meaning>"``. The type grammar is small
and closed, so a typo in a declaration fails loudly instead of documenting nothing:

    string | int | float | bool | any | null      scalars (``float`` accepts ints: JSON numbers)
    list<T>                                       a list of T (elements at ``path[]``)
    map                                           a record whose fields are declared one by one
    map<K,V>                                      an open map: any key, values of type V
    A|B                                           either (e.g. ``int|null``)

Two users: the tests validate every probe's ``build`` output with :func:`validate` (every path
written is declared, with the declared type), and the rule linter checks the paths a CEL
expression reads against the same declarations (``doctor.engine.celpaths``). ``None`` is accepted
for any declared path: a fact that could not be measured stays, with no value.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

SCALARS = ("string", "int", "float", "bool", "any", "null")


@dataclass(frozen=True)
class FactType:
    """One parsed type: ``kind`` is a scalar name, ``list``, ``map`` (record), ``open`` (map<K,V>)
    or ``union``."""

    kind: str
    items: tuple[FactType, ...] = ()

    def __str__(self) -> str:
        if self.kind == "list":
            return f"list<{self.items[0]}>"
        if self.kind == "open":
            return f"map<string,{self.items[0]}>"
        if self.kind == "union":
            return "|".join(str(t) for t in self.items)
        return self.kind


class SchemaError(ValueError):
    """A declaration that does not follow the grammar above."""


def _split_top(text: str, sep: str) -> list[str]:
    depth, start, out = 0, 0, []
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


@lru_cache(maxsize=512)
def parse_type(text: str) -> FactType:
    """Parse a type string; raises ``SchemaError`` naming what is wrong."""
    t = text.strip()
    alts = _split_top(t, "|")
    if len(alts) > 1:
        return FactType("union", tuple(parse_type(a) for a in alts))
    if t in SCALARS:
        return FactType(t)
    if t == "map":
        return FactType("map")
    if t.startswith("list<") and t.endswith(">"):
        return FactType("list", (parse_type(t[5:-1]),))
    if t.startswith("map<") and t.endswith(">"):
        parts = _split_top(t[4:-1], ",")
        if len(parts) != 2 or parts[0].strip() not in ("string", "int"):
            raise SchemaError(f"map types are map<string,V>: {text!r}")
        return FactType("open", (parse_type(parts[1]),))
    raise SchemaError(f"unknown type {text!r}")


def declared_types(schema: dict[str, str]) -> dict[str, FactType]:
    """``path -> type`` for every declaration; raises ``SchemaError`` on the first bad one."""
    out = {}
    for path, doc in schema.items():
        typ, sep, meaning = doc.partition(": ")
        if not sep or not meaning.strip():
            raise SchemaError(f"{path}: write '<type>: <meaning>'")
        try:
            out[path] = parse_type(typ)
        except SchemaError as exc:
            raise SchemaError(f"{path}: {exc}") from None
    return out


def _scalar_ok(kind: str, value: Any) -> bool:
    if kind == "any":
        return True
    if kind == "string":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False  # "null": only None, which is accepted before this is asked


def validate(value: Any, path: str, types: dict[str, FactType], problems: list[str],
             typ: FactType | None = None, limit: int = 50) -> None:
    """Check ``value`` written at ``path`` against the declarations; append one line per problem.

    Lists are checked element by element (only the first 200 elements: a per-rank list of 16k
    ints says nothing more at element 10,000)."""
    if len(problems) >= limit or value is None:
        return
    typ = typ or types.get(path)
    if typ is None:
        problems.append(f"{path}: written but not declared")
        return
    if typ.kind == "union":
        fits = [t for t in typ.items if t.kind != "null" and _fits_shape(t, value)]
        if not fits:
            problems.append(f"{path}: {type(value).__name__} is not {typ}")
            return
        typ = fits[0]
    if typ.kind in SCALARS:
        if not _scalar_ok(typ.kind, value):
            problems.append(f"{path}: {type(value).__name__} is not {typ}")
        return
    if typ.kind == "list":
        if not isinstance(value, (list, tuple)):
            problems.append(f"{path}: {type(value).__name__} is not {typ}")
            return
        elem = typ.items[0]
        for item in list(value)[:200]:
            validate(item, path + "[]", types, problems, types.get(path + "[]") or elem, limit)
        return
    if not isinstance(value, dict):
        problems.append(f"{path}: {type(value).__name__} is not {typ}")
        return
    if typ.kind == "open":
        elem = typ.items[0]
        for item in list(value.values())[:200]:  # keys are data: values live at ``path[]``
            validate(item, path + "[]", types, problems, types.get(path + "[]") or elem, limit)
        return
    for key, item in value.items():  # a record: every field is declared on its own
        validate(item, f"{path}.{key}", types, problems, None, limit)


def _fits_shape(typ: FactType, value: Any) -> bool:
    if typ.kind in SCALARS:
        return _scalar_ok(typ.kind, value)
    if typ.kind == "list":
        return isinstance(value, (list, tuple))
    return isinstance(value, dict)


def validate_namespace(facts: dict[str, Any], ns: str, schema: dict[str, str]) -> list[str]:
    """Problems with what a probe wrote under ``facts[ns]`` (empty: it matches its declaration)."""
    types = declared_types(schema)
    problems: list[str] = []
    value = facts.get(ns)
    if value is None:
        return problems
    if not isinstance(value, dict):
        return [f"{ns}: {type(value).__name__} is not a map"]
    for key, item in value.items():
        validate(item, f"{ns}.{key}", types, problems)
    return problems
