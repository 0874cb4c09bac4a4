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

from doctor.engine import celpaths

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def cel():
    import cel as _cel  # noqa: PLC0415 - deliberately lazy, see module docstring

    return _cel


@lru_cache(maxsize=4096)
def compile_expr(src: str) -> Any:
    """Compile once per distinct expression; raises ValueError with the parser's message."""
    return cel().compile(src)


def check_paths(src: str, schema: dict[str, str], namespaces: set[str]) -> list[str]:
    """Problems with the fact paths in ``src`` (unknown namespace or field); empty when fine.

    The paths come from a real parse of the expression (``celpaths``), so a typo after an index
    (``groups[0].stat``) or a macro result (``filter(...)[0].feilds``) is caught too. An
    expression the checker cannot parse is left to the CEL compiler's own error.
    """
    try:
        paths = celpaths.fact_paths(src, namespaces)
    except celpaths.CelSyntaxError:
        return []
    known, maps = _schema_index(tuple(schema.items()))
    return [f"unknown fact path {p!r}" for p in sorted(paths) if not _path_known(p, known, maps)]


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


def _bare(path: str) -> str:
    while path.endswith("[]"):
        path = path[:-2]
    return path


def _path_known(path: str, known: frozenset[str], maps: frozenset[str]) -> bool:
    """Documented, or under a path typed as an open map / any (whose keys are data)."""
    if path in known or path + "[]" in known or _bare(path) in known:
        return True
    parts = path.split(".")
    return any(_bare(".".join(parts[:i])) in maps for i in range(1, len(parts)))


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
