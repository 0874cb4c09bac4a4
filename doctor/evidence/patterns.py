"""One format for every pattern library: log signatures, stack-frame tables, symptom questions.

A library is a YAML file with a ``patterns:`` list (older signature files say ``signatures:``).
Every entry carries the same core fields, so one loader and one test check them all:

    - id: watchdog_timeout          # unique in its library
      pattern: 'Watchdog caught .*' # a Python regex, searched (``match: search``) or matched
                                    # at the start (``match: match``) as the library says
      means: what a hit tells       # one line, shown with the evidence
      source: upstream file:line or doc URL where the text comes from
      examples: [real text the pattern must hit]
      examples_not: [near misses it must not hit]   # optional
      # ... any fields of the library's own (kind, role, severity, state, question ...)

The older signature key ``regex`` is read as ``pattern``. Libraries are found next to the code
that uses them (``probes/<kind>/patterns/*.yaml``, ``doctor/tui/questions.yaml``);
:func:`every_library` lists them for the test that checks every entry against its examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from doctor.evidence.contract import one_line
from doctor.evidence.errors import UserError
from doctor.evidence.yamlsrc import safe_data

CORE = ("id", "pattern", "means", "source", "examples", "examples_not")
#: Patterns are applied to untrusted text: lines longer than this are cut before matching,
#: which bounds the work of any backtracking regex on a pathological line.
MAX_TEXT = 16 * 1024


@dataclass(frozen=True)
class Pattern:
    """One entry of a library; ``fields`` keeps the library's own keys."""

    id: str
    pattern: str
    regex: re.Pattern[str]
    means: str
    source: str
    examples: tuple[str, ...]
    examples_not: tuple[str, ...]
    library: str
    fields: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def hits(self, text: str) -> bool:
        """Does this pattern hit ``text`` the way its library applies it?"""
        text = text[:MAX_TEXT]
        how = self.fields.get("_match", "search")
        return bool(self.regex.match(text) if how == "match" else self.regex.search(text))


def parse_library(name: str, text: str) -> list[Pattern]:
    """Entries of one library file; any shape error is a one-line ``UserError`` naming it."""
    try:
        data = safe_data(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{name}: not valid YAML ({one_line(exc)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{name}: a pattern library is a mapping with a 'patterns' list")
    entries = data.get("patterns", data.get("signatures"))
    if not isinstance(entries, list):
        raise UserError(f"{name}: 'patterns' must be a list")
    how = str(data.get("match") or "search")
    if how not in ("search", "match"):
        raise UserError(f"{name}: 'match' must be search or match, not {how!r}")
    flags_all = re.I if data.get("ignorecase") else 0
    out: list[Pattern] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        where = f"{name}: entry {i + 1}"
        if not isinstance(e, dict):
            raise UserError(f"{where}: must be a mapping")
        pid = e.get("id")
        if not isinstance(pid, str) or not pid:
            raise UserError(f"{where}: 'id' is missing")
        if pid in seen:
            raise UserError(f"{where}: id {pid!r} is used twice")
        seen.add(pid)
        pat = e.get("pattern", e.get("regex"))
        if not isinstance(pat, str) or not pat:
            raise UserError(f"{where} ({pid}): 'pattern' is missing")
        try:
            rx = re.compile(pat, flags_all | (re.I if e.get("ignorecase") else 0))
        except re.error as exc:
            raise UserError(f"{where} ({pid}): bad pattern: {exc}") from None
        examples = e.get("examples") or []
        examples_not = e.get("examples_not") or []
        if not isinstance(examples, list) or not isinstance(examples_not, list):
            raise UserError(f"{where} ({pid}): 'examples' and 'examples_not' must be lists")
        rest = {k: v for k, v in e.items() if k not in CORE and k != "regex"}
        rest["_match"] = how
        out.append(Pattern(pid, pat, rx, str(e.get("means") or ""), str(e.get("source") or ""),
                           tuple(str(x) for x in examples), tuple(str(x) for x in examples_not),
                           name, rest))
    return out


def load_library(path: Path) -> list[Pattern]:
    return parse_library(path.name, path.read_text(encoding="utf-8"))


def every_library() -> list[Path]:
    """Every pattern library shipped with mldoctor (probes' and the TUI's)."""
    probes = Path(str(resources.files("doctor.probes")))
    doctor = Path(str(resources.files("doctor")))
    return sorted(probes.glob("*/patterns/*.yaml")) + sorted(doctor.glob("tui/*.patterns.yaml"))
