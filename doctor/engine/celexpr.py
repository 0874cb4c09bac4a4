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
from doctor.evidence import factschema

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def cel():
    import cel as _cel  # noqa: PLC0415 - deliberately lazy, see module docstring

    return _cel


#: Evaluation steps one expression may take, estimated before it runs (see ``Expr.execute``).
#: The library does about two million comprehension steps a second and holds the GIL while it
#: runs, so nothing can stop it once started: 10 M steps is a few seconds, the bound per rule.
MAX_STEPS = 10_000_000
#: The longest parser message kept in a compile error (a 20 KB expression must not be echoed).
MAX_MESSAGE = 200


class CostError(ValueError):
    """An expression would take more steps than MAX_STEPS on these facts; it is not run."""


class Expr:
    """A compiled expression that refuses to run when its estimated cost is over MAX_STEPS.

    Why estimate instead of a time limit: the CEL library has no step or cost limit, and while
    it evaluates it holds the GIL, so neither a thread nor a signal can interrupt it; nine
    nested ``all()`` over 10-element lists (10^9 steps) ran for minutes. The estimate is the
    product, along each chain of nested macros, of the longest list each macro iterates
    (looked up by the last field name of its receiver, see ``_list_lengths``).
    """

    __slots__ = ("program", "src", "chains")

    def __init__(self, program: Any, src: str) -> None:
        self.program = program
        self.src = src
        self.chains = _macro_chains(src)

    def cost(self, lengths: dict[str, int]) -> int:
        worst = 0
        for chain in self.chains:
            steps = 1
            for receiver in chain:
                steps *= max(1, receiver if isinstance(receiver, int) else lengths.get(receiver, lengths.get("", 1)))
            worst = max(worst, steps)
        return worst

    def execute(self, ctx: Any) -> Any:
        entry = _CTX_LENGTHS.get(id(ctx))
        # One macro over a list costs its length: only nested macros can explode.
        if entry is not None and entry[0] is ctx and any(len(c) > 1 for c in self.chains):
            if entry[2] is None:  # measured once per context, on the first nested macro
                entry[2] = _list_lengths(entry[1])
            steps = self.cost(entry[2])
            if steps > MAX_STEPS:
                raise CostError(f"up to {steps:,} evaluation steps on these facts (nested macros over long "
                                f"lists), over the limit of {MAX_STEPS:,}; not evaluated")
        return self.program.execute(ctx)


@lru_cache(maxsize=4096)
def compile_expr(src: str) -> Expr:
    """Compile once per distinct expression; raises ValueError with the parser's first error
    line, cut to MAX_MESSAGE characters (the parser echoes the expression, however long)."""
    try:
        return Expr(cel().compile(src), src)
    except (ValueError, RuntimeError) as exc:
        lines = str(exc).splitlines()
        msg = next((ln for ln in lines if "ERROR" in ln), lines[0] if lines else "syntax error").strip()
        raise ValueError(msg[:MAX_MESSAGE] + (" ..." if len(msg) > MAX_MESSAGE else "")) from None


def _macro_chains(src: str) -> list[list[str | int]]:
    """For each innermost macro call, the receivers of the macros enclosing it, outermost first:
    a literal list's element count, else the last field name of the receiver path ('' when it
    has none, e.g. a bound variable: the longest list of all is assumed)."""
    try:
        toks = celpaths.tokenize(src)
    except celpaths.CelSyntaxError:
        return []
    stack: list[str | int | None] = []
    chains: list[list[str | int]] = []
    for i, t in enumerate(toks):
        if t.kind == "op" and t.text in "([{":
            macro = (t.text == "(" and i >= 2 and toks[i - 1].kind == "ident"
                     and toks[i - 1].text in celpaths.MACROS and toks[i - 2].text == ".")
            stack.append(_receiver(toks, i - 2) if macro else None)
            if macro:
                chains.append([r for r in stack if r is not None])
        elif t.kind == "op" and t.text in ")]}" and stack:
            stack.pop()
    return chains


def _receiver(toks: list[Any], dot: int) -> str | int:
    """What the macro whose ``.`` is at ``dot`` iterates (see ``_macro_chains``)."""
    j = dot - 1
    while j >= 0 and toks[j].kind == "op" and toks[j].text in ")]":  # skip calls and indexes
        close, depth = toks[j].text, 0
        opener = "(" if close == ")" else "["
        while j >= 0:
            if toks[j].text == close:
                depth += 1
            elif toks[j].text == opener:
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        if close == "]" and (j == 0 or toks[j - 1].kind == "op" and toks[j - 1].text not in ")]"):
            return max(1, _count_items(toks, j))  # a list literal
        j -= 1
        if close == "]" and j >= 0 and toks[j].kind == "ident" and (j == 0 or toks[j - 1].text != "."
                                                                     or toks[j - 2].kind == "ident"):
            return toks[j].text + "[]"  # an index: name[k] holds what the values of name hold
        if close == ")" and j >= 1 and toks[j].kind == "ident" and toks[j - 1].text == ".":
            j -= 2  # a chained call: x.filter(...).map(...) iterates at most what x holds
    return toks[j].text if j >= 0 and toks[j].kind == "ident" else ""


def _count_items(toks: list[Any], start: int) -> int:
    depth, n = 0, 1
    for t in toks[start:]:
        if t.kind == "op" and t.text in "([{":
            depth += 1
        elif t.kind == "op" and t.text in ")]}":
            depth -= 1
            if depth == 0:
                return n
        elif t.kind == "op" and t.text == "," and depth == 1:
            n += 1
    return n


def _list_lengths(facts: dict[str, Any]) -> dict[str, int]:
    """The longest list (or map) held under each key name anywhere in ``facts``, and under ''
    the longest of all: what a macro over ``<anything>.name`` may iterate. Iterative, so deep
    facts cannot overflow the stack; each container is visited once."""
    out: dict[str, int] = {}
    stack: list[tuple[str, str, Any]] = [(k, "", v) for k, v in facts.items() if isinstance(v, (dict, list))]
    longest = 0
    push = stack.append
    while stack:
        key, parent, val = stack.pop()
        n = len(val)
        longest = max(longest, n)
        if n > out.get(key, 0):
            out[key] = n
        if n > out.get(parent + "[]", 0):  # what ``parent[i]`` / ``parent[key]`` holds
            out[parent + "[]"] = n
        if isinstance(val, dict):
            for k, v in val.items():
                if type(v) is dict or type(v) is list:
                    push((str(k), key, v))
        else:  # list elements are read as name[i]: same name
            for v in val:
                if type(v) is dict or type(v) is list:
                    push((key, key, v))
    out[""] = longest
    return out


#: The list lengths of the few most recent contexts, keyed by id (the context is kept too, so
#: an id cannot be reused while its entry lives).
_CTX_LENGTHS: dict[int, list[Any]] = {}  # id -> [context, its variables, their list lengths]


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
    maps = frozenset(p for p, doc in items if _keys_are_data(doc))
    return frozenset(known), maps


def _keys_are_data(doc: str) -> bool:
    """An open map (``map<string,V>``) or ``any``: any key below it is fine. A record (plain
    ``map``) is not: its fields are declared one by one, so a typo in one is caught."""
    try:
        typ = factschema.parse_type(doc.partition(": ")[0])
    except factschema.SchemaError:
        return doc.startswith(("map", "any"))
    kinds = {t.kind for t in typ.items} if typ.kind == "union" else {typ.kind}
    return bool(kinds & {"open", "any"})


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
    ctx = cel().Context(variables)
    if len(_CTX_LENGTHS) >= 4:
        _CTX_LENGTHS.pop(next(iter(_CTX_LENGTHS)))
    _CTX_LENGTHS[id(ctx)] = [ctx, variables, None]
    return ctx
