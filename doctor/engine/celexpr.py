"""CEL glue: compile expressions, check the fact paths they name, evaluate against facts.

CEL (the language of Kubernetes admission policies) is side-effect free and has no way to reach
Python objects, which is why rule text can be trusted no further than data. The library is the
Rust-backed ``common-expression-language``; it is imported lazily because it costs ~0.2 s.

One caveat measured on it (0.10): ``filter``/``map`` copy their result list on every element, so
they are quadratic in the list's length. Rules therefore iterate over small, pre-grouped lists
(stack groups, mismatch records) and read per-rank lists only as whole values.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_CHAIN = re.compile(r"(?<![\w.\])])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\s*\()?")
_BIND = re.compile(r"([A-Za-z_][\w.]*)\.(?:exists|all|exists_one|filter|map)\(\s*([A-Za-z_]\w*)\s*,")
_MACROS = {"exists", "all", "exists_one", "filter", "map"}


def cel():
    import cel as _cel  # noqa: PLC0415 - deliberately lazy, see module docstring

    return _cel


@lru_cache(maxsize=4096)
def compile_expr(src: str) -> Any:
    """Compile once per distinct expression; raises ValueError with the parser's message."""
    return cel().compile(src)


def referenced_paths(src: str) -> tuple[set[str], dict[str, str]]:
    """Dotted fact paths an expression reads, and the comprehension variables it binds.

    Strings are blanked first so ``"a.b"`` is not taken for a path. A chain followed by ``(`` is a
    method call, so its last part is dropped. Bound variables map to ``<path>[]``.
    """
    code = _STRING.sub('""', src)
    binds: dict[str, str] = {}
    for recv, var in _BIND.findall(code):
        binds[var] = recv + "[]"
    paths: set[str] = set()
    for chain, call in _CHAIN.findall(code):
        parts = chain.split(".")
        if call:
            parts = parts[:-1]
        if len(parts) >= 1:
            paths.add(".".join(parts))
    return paths, binds


def resolve_binding(path: str, binds: dict[str, str], depth: int = 0) -> str:
    """Rewrite ``g.state`` to ``stacks.groups[].state`` when ``g`` is bound by a macro."""
    head, _, rest = path.partition(".")
    if head not in binds or depth > 8:
        return path
    base = resolve_binding(binds[head].removesuffix("[]"), binds, depth + 1) + "[]"
    return base + ("." + rest if rest else "")


def check_paths(src: str, schema: dict[str, str], namespaces: set[str]) -> list[str]:
    """Problems with the fact paths in ``src`` (unknown namespace or field); empty when fine."""
    paths, binds = referenced_paths(src)
    problems = []
    known, maps = _schema_index(tuple(schema.items()))
    for raw in sorted(paths):
        head = raw.split(".", 1)[0]
        path = resolve_binding(raw, binds) if head in binds else raw
        if path.split(".", 1)[0].removesuffix("[]") not in namespaces:
            continue  # bound to an expression we cannot follow, or a CEL builtin: lenient
        if not _path_known(path, known, maps):
            problems.append(f"unknown fact path {path!r}")
    return problems


@lru_cache(maxsize=8)
def _schema_index(items: tuple[tuple[str, str], ...]) -> tuple[frozenset[str], frozenset[str]]:
    """Every documented path and all of its prefixes; and the paths typed as open maps."""
    known: set[str] = set()
    for path, _doc in items:
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            known.add(prefix)
            known.add(prefix.removesuffix("[]"))
    maps = frozenset(p for p, doc in items if doc.startswith(("map", "any")))
    return frozenset(known), maps


def _path_known(path: str, known: frozenset[str], maps: frozenset[str]) -> bool:
    if path in known or path + "[]" in known:
        return True
    parts = path.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if prefix in maps or prefix.removesuffix("[]") in maps:
            return True
    return False


_IDENT = re.compile(r"(?<![\w.])([A-Za-z_]\w*)")


def identifiers(src: str) -> list[str]:
    """Bare identifiers outside strings (namespace names used on their own, like ``has(gpu)``)."""
    return _IDENT.findall(_STRING.sub('""', src))


def context(facts: dict[str, Any], namespaces: set[str],
            used: dict[str, set[str] | None] | None = None) -> Any:
    """A CEL context with every known namespace defined (absent ones as empty maps).

    With ``used`` (from the loaded rules) only the keys some rule can read are converted.
    """
    variables: dict[str, Any] = {}
    for ns in namespaces:
        value = facts.get(ns) if isinstance(facts.get(ns), dict) else {}
        keys = used.get(ns, set()) if used is not None else None
        if keys is not None:
            value = {k: v for k, v in value.items() if k in keys}
        variables[ns] = value
    return cel().Context(variables)
