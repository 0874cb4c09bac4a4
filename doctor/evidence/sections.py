"""What a probe contributes to a report: sections in a small, closed set of presentations.

A probe knows its own facts namespace; a renderer knows Markdown, HTML, a terminal. Keeping the
two apart means a new evidence kind shows up in every report without a renderer edit: the probe
turns its facts into :class:`Section` objects (``Probe.report_sections``), and each renderer
draws a section by its presentation type only. The set of presentations is closed on purpose:

- :class:`Table`: columns and rows of text; a row may be highlighted (with the words that say
  why, so the mark reads without colour), and a cell may hold a value that differs by rank.
- :class:`KeyValues`: short ``label: value`` lines.
- :class:`Groups`: groups of ranks that share a list of lines (stack frames); the first group is
  the base that the others are diffed against.
- :class:`SeriesSet`: numeric series over steps with events (the HTML report charts them, the
  TUI draws sparklines), plus summary lines.

Everything here is plain data (no rendering, no markup), so a section can be tested, stored or
drawn by any front end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Cell:
    """One table cell: text, shown as a literal value (code) when ``code``; or, when the value
    differs across ranks, each value with the ranks that hold it (most ranks first)."""

    text: str = ""
    code: bool = False
    by_ranks: Sequence[tuple[str, list[int]]] = ()


@dataclass(slots=True)
class Row:
    """A table row. ``marks`` are short words saying why the row deserves a look ("differs",
    "NAMED", "LOOK"): a row with marks is highlighted, and the words carry the signal where colour
    cannot (a screen reader, a monochrome terminal). ``suffix`` follows the first cell in reports
    ("(differs)")."""

    cells: list[Cell]
    marks: Sequence[str] = ()
    suffix: str = ""

    @property
    def highlighted(self) -> bool:
        return bool(self.marks)


@dataclass
class Table:
    """Columns and rows; ``noun`` names what a row is, for "N more GPU(s)" style notes;
    ``legend`` says what the row marks mean ("LOOK = a health flag is set")."""

    columns: list[str]
    rows: list[Row]
    noun: str = "row"
    legend: str = ""


@dataclass
class KeyValues:
    items: list[tuple[str, str]]


@dataclass
class Group:
    """Ranks that share ``lines`` (innermost frame first). ``label`` says where they are
    (``collective: barrier``); ``site``/``top`` name the call site and the innermost call."""

    id: str
    label: str
    ranks: list[int]
    lines: list[str]
    share: float | None = None
    site: str = ""
    top: str = ""
    majority: bool = False

    @property
    def n(self) -> int:
        return len(self.ranks)


@dataclass
class Groups:
    """Groups of ranks, the base group (the majority) first; renderers diff the others' lines
    against it."""

    groups: list[Group]


@dataclass
class Series:
    """One numeric series over steps. ``chart`` is the caption when it is worth a chart of its
    own in the HTML report ("" = sparkline only); values may be ``"nan"``/``"inf"`` strings."""

    name: str
    steps: list[int]
    values: list[Any]
    label: str = ""
    chart: str = ""


@dataclass
class SeriesSet:
    """Series with the events detected on them (``step``, ``kind``, ``detail``, ``series``,
    ``value``) and summary lines."""

    series: list[Series]
    events: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    #: The series under which the TUI marks the events' steps ("" = none).
    primary: str = ""


Body = Table | KeyValues | Groups | SeriesSet
PRESENTATIONS = {Table: "table", KeyValues: "key_values", Groups: "groups", SeriesSet: "series"}


@dataclass
class Section:
    """A part of the report one probe contributes.

    ``id`` anchors it (``#env`` in HTML); ``title`` heads it; ``nav`` is its short name in the
    HTML navigation; ``summary`` is its one-line digest (the collapsed line in Markdown, the
    head line in the TUI); ``note`` is a sentence under the title in HTML. ``order`` places it
    among the others (lower first).
    """

    id: str
    title: str
    body: Body
    order: int = 50
    nav: str = ""
    summary: str = ""
    note: str = ""

    @property
    def presentation(self) -> str:
        return PRESENTATIONS[type(self.body)]


@dataclass
class SectionContext:
    """What a probe may need from the report to present its facts: the culprit ranks of the
    verdict (the top finding's) and the GPUs any finding names, so rows can be highlighted."""

    culprit_ranks: set[int] = field(default_factory=set)
    gpus: set[str] = field(default_factory=set)


def int_list(values: Any) -> list[int]:
    """Ranks (or other ids) from a fact that should be a list of ints: ints and digit strings kept
    (JSON round trips and hand-made files spell them both ways), booleans and anything else
    dropped. Shared by the probes' section code and the renderers."""
    out = []
    for v in values if isinstance(values, list) else []:
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            out.append(v)
        elif isinstance(v, str) and v.isdigit():
            out.append(int(v))
    return out
