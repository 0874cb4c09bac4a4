"""The fact paths a CEL expression reads, found by tokenizing and parsing it (not by regex).

Why a parser: a rule that reads ``stacks.groups[0].stat`` or
``logs.events.filter(e, e.kind == "x")[0].feilds.reason`` names a path that does not exist and
would silently never fire. Regexes stop at ``]`` and ``)``; a parser follows the value through
indexing, macros (``exists``, ``all``, ``exists_one``, ``filter``, ``map``) and their bound
variables, so those typos fail ``mldoctor rules lint`` like any other.

Paths use the schema's notation: ``stacks.groups[].state`` for a field of a list element (or of
an open map's value). The grammar covered is CEL's expression grammar: literals, lists, maps,
``. [] ()``, unary ``! -``, binary operators, ``in``, and the ternary ``?:``. An expression the
checker cannot parse is left to the CEL compiler, which reports it with its own message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>[rR]?[bB]?(?:\"\"\"(?:[^\\]|\\.)*?\"\"\"|'''(?:[^\\]|\\.)*?'''|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'))
  | (?P<num>0x[0-9a-fA-F]+u?|\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?u?)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<op>\|\||&&|==|!=|<=|>=|[-+*/%!<>?:.,\[\](){}])
""", re.X | re.S)
MACROS = ("exists", "all", "exists_one", "filter", "map")
_BINARY = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "in": 3,
           "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}


class CelSyntaxError(ValueError):
    """The checker could not parse the expression (the CEL compiler will say why)."""


@dataclass
class Token:
    kind: str  # str | num | ident | op | end
    text: str


def tokenize(src: str) -> list[Token]:
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise CelSyntaxError(f"unexpected character {src[pos]!r} at {pos}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append(Token(m.lastgroup or "op", m.group()))
    out.append(Token("end", ""))
    return out


class _Parser:
    """Recursive descent; every expression evaluates to the fact path it denotes, or None."""

    def __init__(self, src: str, namespaces: set[str]) -> None:
        self.toks = tokenize(src)
        self.i = 0
        self.namespaces = namespaces
        self.scopes: list[dict[str, str | None]] = []
        self.paths: set[str] = set()

    # -- helpers ---------------------------------------------------------------------------------
    def peek(self, text: str | None = None) -> bool:
        tok = self.toks[self.i]
        return tok.kind != "end" and (text is None or tok.text == text)

    def take(self, text: str | None = None) -> Token:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise CelSyntaxError(f"expected {text!r}, found {tok.text or 'the end'!r}")
        self.i += 1
        return tok

    def bound(self, name: str) -> tuple[bool, str | None]:
        for scope in reversed(self.scopes):
            if name in scope:
                return True, scope[name]
        return False, None

    def field(self, base: str | None, name: str) -> str | None:
        if base is None:
            return None
        path = f"{base}.{name}"
        self.paths.add(path)
        return path

    # -- grammar ---------------------------------------------------------------------------------
    def parse(self) -> set[str]:
        self.expr()
        if self.toks[self.i].kind != "end":
            raise CelSyntaxError(f"unexpected {self.toks[self.i].text!r}")
        return self.paths

    def expr(self) -> str | None:
        cond = self.binary(1)
        if self.peek("?"):
            self.take("?")
            self.expr()
            self.take(":")
            self.expr()
            return None
        return cond

    def binary(self, level: int) -> str | None:
        left = self.unary()
        while True:
            tok = self.toks[self.i]
            prec = _BINARY.get(tok.text) if tok.kind in ("op", "ident") else None
            if prec is None or prec < level:
                return left
            self.take()
            self.binary(prec + 1)
            left = None

    def unary(self) -> str | None:
        if self.peek("!") or self.peek("-"):
            self.take()
            self.unary()
            return None
        return self.postfix(self.primary())

    def args(self) -> None:
        self.take("(")
        while not self.peek(")"):
            self.expr()
            if not self.peek(")"):
                self.take(",")
        self.take(")")

    def postfix(self, base: str | None) -> str | None:
        while True:
            if self.peek("."):
                self.take(".")
                name = self.take().text
                if self.peek("("):
                    base = self.method(base, name)
                else:
                    base = self.field(base, name)
            elif self.peek("["):
                self.take("[")
                self.expr()
                self.take("]")
                base = None if base is None else base + "[]"
            else:
                return base

    def method(self, recv: str | None, name: str) -> str | None:
        """``recv.name(...)``: a macro binds a variable to the elements of ``recv``."""
        if name not in MACROS:
            self.args()
            return None
        self.take("(")
        var = self.take().text
        self.take(",")
        if recv is not None:
            self.paths.add(recv)
        self.scopes.append({var: None if recv is None else recv + "[]"})
        try:
            if name == "map" and self.toks[self.i + 1].text == ",":  # map(x, filter, transform)
                self.expr()
                self.take(",")
            body = self.expr()
        finally:
            self.scopes.pop()
        self.take(")")
        if name == "filter":
            return recv  # same elements, fewer of them
        if name == "map":
            return None if body is None else body + "@"  # a list of those values: see _clean
        return None

    def primary(self) -> str | None:
        tok = self.take()
        if tok.kind in ("str", "num"):
            return None
        if tok.text == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if tok.text == "[":
            while not self.peek("]"):
                self.expr()
                if not self.peek("]"):
                    self.take(",")
            self.take("]")
            return None
        if tok.text == "{":
            while not self.peek("}"):
                self.expr()
                self.take(":")
                self.expr()
                if not self.peek("}"):
                    self.take(",")
            self.take("}")
            return None
        if tok.text == ".":  # a leading dot: a fully qualified name
            return self.primary()
        if tok.kind == "ident":
            if self.peek("("):  # a function: size(x), has(x.y), int(x) ...
                self.args()
                return None
            is_bound, path = self.bound(tok.text)
            if is_bound:
                return path
            if tok.text in self.namespaces:
                return tok.text
            return None
        raise CelSyntaxError(f"unexpected {tok.text!r}")


def _clean(path: str) -> str:
    """A ``map`` result indexed (``x.map(g, g.ranks)[0]``) is an element of the mapped value."""
    return path.replace("@[]", "")


def fact_paths(src: str, namespaces: set[str]) -> set[str]:
    """Every fact path ``src`` reads (``stacks.groups[].state`` notation); raises
    ``CelSyntaxError`` when the expression cannot be parsed."""
    raw = _Parser(src, namespaces).parse()
    return {_clean(p) for p in raw if "@" not in _clean(p)}
