"""The log-signature library (``patterns/*.yaml``) as the scanner needs it: needles, roles, priorities.

Why a library object of its own: the files are parsed and checked by the one loader every pattern
library goes through (:func:`doctor.evidence.patterns.parse_library`), so a signature file can never
be read differently by the scanner and by the test that checks every entry against its examples.
What the scanner adds is speed: the needle prefilter below is built once per process, so that most
lines of a multi-gigabyte log are rejected before any signature regex runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from doctor.evidence.patterns import Pattern, parse_library

ROLES = ("first_failure", "cascade", "context")
SEVERITIES = ("critical", "high", "medium", "low", "info")
#: Fields of the signature format beyond the core every pattern library shares.
REQUIRED = ("kind", "needle", "role", "severity", "priority")


@dataclass(frozen=True)
class Signature:
    """One entry of the signature library."""

    id: str
    kind: str
    needles: tuple[str, ...]
    regex: re.Pattern[str]
    role: str
    severity: str
    priority: int
    means: str
    source: str
    examples: tuple[str, ...]
    ignorecase: bool = False
    shadows: tuple[str, ...] = ()
    file: str = ""

    def needle_in(self, line: str, lower: str) -> bool:
        hay = lower if self.ignorecase else line
        return any(n in hay for n in self.needles)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Characters each side of a break that :meth:`Library.may_cross` compares.
CROSS_CHARS = 3


def _crosses(table: dict[int, dict[str, tuple[str, ...]]], prev: str, cur: str) -> bool:
    """Does a needle cut of ``table`` (see :func:`_crossings`) fit the end of ``prev`` and the
    start of ``cur``?"""
    for k, befores in table.items():
        afters = befores.get(prev[-k:] if k else "")
        if afters is not None and cur.startswith(afters):  # "" (any start) is among them if needed
            return True
    return False


@dataclass(frozen=True)
class Library:
    """All signatures, with the needle prefilter built once.

    Why not one big regex of the needles: Python's re tries every alternative at nearly every
    position (about 30 us a line for ~130 needles). Instead each needle gets a keyword, a whole
    word inside it ("Watchdog", "Duplicate", "preamble"); a line's words are collected once and
    intersected with the keyword set (C speed), and only needles whose keyword occurs are
    confirmed with a substring test. Needles without a usable word are tested directly.
    """

    signatures: tuple[Signature, ...]
    by_needle: dict[str, tuple[Signature, ...]]   # needle (lowercase when ignorecase) -> signatures
    keywords: dict[str, tuple[str, ...]]          # keyword -> case-sensitive needles holding it
    keyword_set: frozenset[str]
    loose: tuple[str, ...]                        # case-sensitive needles without a keyword
    loose_i: tuple[str, ...]                      # case-insensitive needles (tested on the lowercased line)
    order: dict[str, int]                         # signature id -> position in the library
    longest: int = 80                             # characters of the longest needle
    #: Needles cut at each of their spaces, for :meth:`may_cross` (see :func:`_crossings`): the
    #: case-sensitive needles' table and the case-insensitive (lowercase) needles' table.
    crossings: tuple[dict[int, dict[str, tuple[str, ...]]], ...] = ()
    #: The keyword set without the keywords only progress signatures (kind ``train_progress``)
    #: use: the scanner passes ``quiet=True`` while no error waits for progress, so a step line
    #: costs no more than any line without a needle (see survival.py).
    busy_keyword_set: frozenset[str] = frozenset()
    #: the progress signatures that own one of those keywords: once each has filled its kept
    #: events in a file, the scanner may go quiet
    quiet_ids: frozenset[str] = frozenset()

    def may_cross(self, prev: str, cur: str) -> bool:
        """Could a needle occur in ``prev + " " + cur`` across the joining space? False means
        it cannot (the test is exact on at most the CROSS_CHARS characters each side of the
        break, so it errs only towards True): the scanner then skips trying the seam."""
        exact, lowered = self.crossings or ({}, {})
        if lowered and _crosses(lowered, prev[-CROSS_CHARS:].lower(), cur[:CROSS_CHARS].lower()):
            return True
        return _crosses(exact, prev, cur)

    def needles_in(self, line: str, quiet: bool = False) -> set[str]:
        found: set[str] = set()
        kws = (self.busy_keyword_set if quiet else self.keyword_set).intersection(_WORD.findall(line))
        for kw in kws:
            for n in self.keywords[kw]:
                if n in line:
                    found.add(n)
        for n in self.loose:
            if n in line:
                found.add(n)
        if self.loose_i:
            low = line.lower()
            for n in self.loose_i:
                if n in low:
                    found.add(n)
        return found

    def hit(self, line: str) -> bool:
        """Does the line contain any needle? (the cheap test every line goes through)"""
        return bool(self.needles_in(line))

    def candidates(self, line: str, quiet: bool = False) -> list[Signature]:
        """Signatures whose needles occur in the line, in library order (``quiet``: leaving
        out those found only through progress keywords)."""
        found = self.needles_in(line, quiet)
        if not found:
            return []
        sigs: dict[str, Signature] = {}
        for word in found:
            for sig in self.by_needle.get(word, ()):
                sigs[sig.id] = sig
        if len(sigs) == 1:
            return list(sigs.values())
        return sorted(sigs.values(), key=lambda s: self.order[s.id])


def _crossings(needles: list[str]) -> dict[int, dict[str, tuple[str, ...]]]:
    """For each needle and each space in it, the (up to CROSS_CHARS) characters just before and
    just after that space, as {length of the before part: {before: afters}}; an empty before or
    after is where the needle starts or ends, so that side may hold anything."""
    table: dict[int, dict[str, set[str]]] = {}
    for n in needles:
        for i, ch in enumerate(n):
            if ch == " ":
                before, after = n[max(0, i - CROSS_CHARS):i], n[i + 1:i + 1 + CROSS_CHARS]
                table.setdefault(len(before), {}).setdefault(before, set()).add(after)
    return {k: {b: tuple(sorted(a)) for b, a in v.items()} for k, v in sorted(table.items())}


def _keyword(needle: str) -> str | None:
    """The word of a needle to look for among a line's words: preferably one bounded inside the
    needle by non-word characters on both sides (it is a whole word wherever the needle occurs),
    else one at the needle's edge (a whole word in practice: the signature examples, all checked
    by the tests, must pass the prefilter); None when only a fragment is left ("ibv_")."""
    inner = edge = None
    for m in _WORD.finditer(needle):
        word = m.group()
        if len(word) < 3 or word.endswith("_"):
            continue
        left_ok = m.start() > 0 and not (needle[m.start() - 1].isalnum() or needle[m.start() - 1] == "_")
        right_ok = m.end() < len(needle) and not (needle[m.end()].isalnum() or needle[m.end()] == "_")
        if left_ok and right_ok:
            if inner is None or len(word) > len(inner):
                inner = word
        elif edge is None or len(word) > len(edge):
            edge = word
    return inner or edge


class LibraryError(ValueError):
    """A signature file is malformed (caught by the tests, never at a user's site)."""


def _signature(name: str, p: Pattern) -> Signature:
    """A library entry as the scanner uses it; the entry's own fields are checked here because
    the shared loader only knows the core every library has."""
    f: dict[str, Any] = p.fields
    where = f"{name} ({p.id})"
    missing = [k for k in REQUIRED if k not in f]
    missing += [k for k, v in (("means", p.means), ("source", p.source), ("examples", p.examples)) if not v]
    if missing:
        raise LibraryError(f"{where}: missing {', '.join(missing)}")
    if f["role"] not in ROLES or f["severity"] not in SEVERITIES:
        raise LibraryError(f"{where}: bad role or severity")
    needles = f["needle"] if isinstance(f["needle"], list) else [f["needle"]]
    ignorecase = bool(f.get("ignorecase", False))
    return Signature(
        id=p.id, kind=str(f["kind"]),
        needles=tuple(n.lower() if ignorecase else n for n in needles),
        regex=p.regex, role=f["role"], severity=f["severity"], priority=int(f["priority"]),
        means=p.means, source=p.source, examples=p.examples, ignorecase=ignorecase,
        shadows=tuple(f.get("shadows", []) or ()), file=name,
    )


def _load_file(name: str, text: str) -> list[Signature]:
    """One signature file; shape errors are the shared loader's one-line ``UserError``."""
    return [_signature(name, p) for p in parse_library(name, text)]


@lru_cache(maxsize=1)
def library() -> Library:
    """Load every ``patterns/*.yaml`` of this package once per process."""
    base = resources.files(__package__) / "patterns"
    sigs: list[Signature] = []
    for entry in sorted(base.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            sigs.extend(_load_file(entry.name, entry.read_text(encoding="utf-8")))
    ids = [s.id for s in sigs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise LibraryError(f"duplicate signature ids: {', '.join(dup)}")
    by_needle: dict[str, list[Signature]] = {}
    for s in sigs:
        for n in s.needles:
            by_needle.setdefault(n, []).append(s)
    exact = sorted({n for s in sigs if not s.ignorecase for n in s.needles})
    keywords: dict[str, list[str]] = {}
    loose = []
    for n in exact:
        kw = _keyword(n)
        if kw is None:
            loose.append(n)
        else:
            keywords.setdefault(kw, []).append(n)
    progress_only = {kw for kw, ns in keywords.items()
                     if all(s.kind == "train_progress" for n in ns for s in by_needle[n])}
    return Library(
        busy_keyword_set=frozenset(set(keywords) - progress_only),
        quiet_ids=frozenset(s.id for kw in progress_only for n in keywords[kw] for s in by_needle[n]),
        signatures=tuple(sigs),
        by_needle={k: tuple(v) for k, v in by_needle.items()},
        keywords={k: tuple(v) for k, v in keywords.items()},
        keyword_set=frozenset(keywords),
        loose=tuple(loose),
        loose_i=tuple(sorted({n for s in sigs if s.ignorecase for n in s.needles})),
        order={s.id: i for i, s in enumerate(sigs)},
        longest=max((len(n) for s in sigs for n in s.needles), default=80),
        crossings=(_crossings(exact), _crossings(sorted({n for s in sigs if s.ignorecase for n in s.needles}))),
    )
