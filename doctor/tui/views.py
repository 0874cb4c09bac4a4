"""Pure text for every TUI pane, built from the report model (no textual import).

Every signal carries text as well as colour (a state letter, ``CULPRIT``, ``DIFF``, ``+``/``-``),
so the screens read the same in a monochrome terminal, a screen reader or a test. The derived
views (rank states, and the sections the probes contribute: stack groups, tables, series) come
from ``doctor.render.view``, the same code the Markdown and HTML reports use; panes draw a
section by its presentation type, never by reading a probe's facts.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from rich.text import Text

from doctor.engine.findings import Finding
from doctor.engine.report import Report
from doctor.engine.rule import format_ranks
from doctor.evidence.sections import Cell, Group, Groups, KeyValues, Section, SeriesSet, Table
from doctor.render import view

SEVERITY_STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}
STATE_STYLE = {"hung": "bold red", "crashed": "bold red", "slow": "bold yellow", "diverging": "bold yellow",
               "healthy": "bold green", "unknown": "bold"}
SPARK = "▁▂▃▄▅▆▇█"
NONFINITE = "×"  # a NaN/Inf point in a sparkline: a text mark, not a colour
#: At most this many rank cells are drawn; the legend still counts every rank.
MAX_GRID_CELLS = 2048


# -- status and findings -------------------------------------------------------------------------

def status_line(report: Report | None, note: str = "") -> Text:
    """The top line: state word, top cause and culprits, how sure; plus what is going on."""
    t = Text()
    if report is None:
        t.append("mldoctor", style="bold")
        t.append(f"  {note}" if note else "")
        return t
    state = str(report.verdict.get("state", "unknown"))
    t.append(state.upper(), style=STATE_STYLE.get(state, "bold"))
    if report.findings:
        f = report.findings[0]
        t.append(f" | {f.cause}")
        if f.ranks:
            t.append(f" on {view.ranks_phrase(f.ranks)}")
        t.append(" | ")
        t.append(f.severity, style=SEVERITY_STYLE.get(f.severity, ""))
        t.append(f" {f.confidence:.2f}")
    else:
        t.append(" | " + str(report.verdict.get("summary", ""))[:60])
    if note:
        t.append(f"  [{note}]", style="italic")
    return t


def finding_label(i: int, f: Finding) -> Text:
    t = Text(f"{i}. ")
    t.append(f"[{f.severity.upper()}]", style=SEVERITY_STYLE.get(f.severity, ""))
    t.append(f" {f.cause}")
    if f.ranks:
        t.append(f"  {view.ranks_phrase(f.ranks)}")
    t.append(f"  conf {f.confidence:.2f}", style="dim")
    return t


def finding_detail(f: Finding) -> Text:
    t = Text()
    t.append(f.title, style="bold")
    t.append(f"  ({f.cause}, {f.category or 'uncategorized'})\n", style="dim")
    where = [view.ranks_phrase(f.ranks)] if f.ranks else []
    if f.hosts:
        where.append("hosts " + ", ".join(f.hosts[:6]) + (" ..." if len(f.hosts) > 6 else ""))
    if f.gpus:
        where.append("GPUs " + ", ".join(f.gpus[:6]) + (" ..." if len(f.gpus) > 6 else ""))
    t.append("Culprits: " + ("; ".join(where) or "the job as a whole") + "\n")
    t.append("Severity: ")
    t.append(f.severity, style=SEVERITY_STYLE.get(f.severity, ""))
    t.append(f"  confidence {f.confidence:.2f}  rule {f.rule}"
             + (f" (also {', '.join(f.also_fired)})" if f.also_fired else "") + "\n\n")
    t.append(f.summary + "\n")
    if f.evidence:
        t.append("\nEvidence:\n", style="bold")
        for e in f.evidence[:12]:
            t.append(f" - {e}\n")
        if len(f.evidence) > 12:
            t.append(f" ... {len(f.evidence) - 12} more in the report\n")
    if f.missing:
        t.append("\nMissing evidence:\n", style="bold")
        t.append(f" {f.missing}\n")
    if f.fix:
        t.append("\nFix:\n", style="bold")
        for n, step in enumerate(f.fix, 1):
            t.append(f" {n}. {step}\n")
    return t


def confirm_commands(cause: str) -> list[tuple[str, str]]:
    """The playbook's commands to confirm ``cause``: (command, why)."""
    from doctor.engine import playbook

    pb = playbook.get(cause) or {}
    out = []
    for c in (pb.get("confirm") or {}).get("commands") or []:
        if isinstance(c, dict) and c.get("cmd"):
            out.append((str(c["cmd"]), str(c.get("why") or "")))
        elif isinstance(c, str):
            out.append((c, ""))
    return out


# -- ranks ---------------------------------------------------------------------------------------

def state_letters(summary: list[tuple[str, list[int]]]) -> dict[str, str]:
    """One letter per state label: the op's or the state's first free letter; '-' for no evidence."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for label, _ in summary:
        if label == view.NO_EVIDENCE:
            out[label] = "-"
            continue
        state, _, op = label.partition(": ")
        for ch in (op + state + "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789").upper():
            if ch.isalnum() and ch not in used:
                out[label] = ch
                used.add(ch)
                break
        else:
            out[label] = "?"
    return out


def rank_grid(report: Report, width: int = 76) -> Text:
    """The rank x state grid: each rank a cell ``<rank> <letter>``, culprits marked ``*``."""
    states = view.rank_states(report)
    if not states:
        return Text("No per-rank evidence: no stacks, flight-recorder dumps or logs named a rank.")
    summary = view.states_summary(states)
    letters = state_letters(summary)
    culprits = view.culprit_ranks(report)
    cell_w = max(len(str(max(states))) + 3, 5) + 1
    per_row = max(1, width // cell_w)
    t = Text()
    t.append("Rank grid: letter = state (legend below), * = culprit of the top finding\n", style="dim")
    for n, (rank, label) in enumerate(states.items()):
        if n >= MAX_GRID_CELLS:
            t.append(f"\n... {len(states) - MAX_GRID_CELLS} more ranks (counted in the legend)")
            break
        mark = "*" if rank in culprits else " "
        style = "bold reverse" if rank in culprits else ("dim" if label == view.NO_EVIDENCE else "")
        t.append(f"{rank:>{cell_w - 3}} {letters[label]}{mark}", style=style)
        t.append("\n" if (n + 1) % per_row == 0 else "")
    if not t.plain.endswith("\n"):
        t.append("\n")
    t.append("\nLegend:\n", style="bold")
    for label, ranks in summary:
        bad = bool(culprits & set(ranks))
        t.append(f" {letters[label]}  {label:<28} {len(ranks):>5} rank{'s' if len(ranks) != 1 else ' '}  "
                 f"{format_ranks(ranks)}" + ("  (culprit)" if bad else "") + "\n",
                 style="bold" if bad else "")
    return t


def rank_rows(report: Report) -> tuple[list[str], list[tuple[str, ...]]]:
    """Columns and rows of the per-rank table: rank, state, CULPRIT mark, the columns the probes
    offer (stack group, last collective), host."""
    states = view.rank_states(report)
    details = view.rank_details(report)
    culprits = view.culprit_ranks(report)
    hosts = (report.facts.get("job") or {}).get("rank_hosts") or {}
    rows = []
    for rank, label in list(states.items())[:MAX_GRID_CELLS]:
        rows.append((str(rank), label, "CULPRIT" if rank in culprits else "",
                     *[str(col.get(rank) or "") for col in details.values()], str(hosts.get(str(rank)) or "")))
    return ["rank", "state", "mark", *details, "host"], rows


# -- stacks --------------------------------------------------------------------------------------

def group_label(g: Group, culprits: set[int]) -> Text:
    t = Text(f"{g.id:<4}")
    t.append(f"{g.label:<26} ")
    t.append(f"{g.n:>4} rank{'s' if g.n != 1 else ' '} {format_ranks(g.ranks)}")
    if g.majority:
        t.append("  majority", style="dim")
    if culprits & set(g.ranks):
        t.append("  * culprit", style="bold")
    return t


def group_detail(g: Group, majority: Group | None) -> Text:
    """A group's frames as a diff against the majority group: '+' only here, '-' only there."""
    t = Text()
    t.append(f"{g.id}: {g.label}, ranks {format_ranks(g.ranks)}\n", style="bold")
    if g.site:
        t.append(f"called from: {g.site}\n")
    if g.top:
        t.append(f"innermost:   {g.top}\n")
    if majority is None or majority is g:
        t.append("\nFrames (innermost first; this is the majority group):\n", style="dim")
        for fr in g.lines:
            t.append(f"  {fr}\n")
        return t
    t.append(f"\nDiff against the majority group {majority.id} ({majority.label}, ranks {format_ranks(majority.ranks)}):\n",
             style="dim")
    t.append("  '+' only in this group, '-' only in the majority, ' ' shared\n", style="dim")
    sm = difflib.SequenceMatcher(a=majority.lines, b=g.lines, autojunk=False)
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op == "equal":
            for fr in g.lines[b0:b1]:
                t.append(f"    {fr}\n")
            continue
        for fr in majority.lines[a0:a1]:
            t.append(f"  - {fr}\n", style="red")
        for fr in g.lines[b0:b1]:
            t.append(f"  + {fr}\n", style="green")
    return t


# -- tables (environment, GPUs, any probe's table) ---------------------------------------------------

def _cell(c: Cell) -> str:
    if not c.by_ranks:
        return c.text
    values = "; ".join(f"{v} on r{format_ranks(rs)}" for v, rs in c.by_ranks[:6])
    if len(c.by_ranks) > 6:
        values += f"; ... {len(c.by_ranks) - 6} more values"
    return values


def table_rows(section: Section | None, max_cols: int = 12) -> tuple[list[str], list[tuple[str, ...]]]:
    """Columns and rows of a table section; the first column holds the row's marks (DIFF, LOOK,
    NAMED), so what is highlighted reads without colour."""
    if section is None or not isinstance(section.body, Table):
        return [], []
    cols = section.body.columns[:max_cols]
    out = []
    for row in section.body.rows:
        cells = [_cell(c) for c in row.cells[:len(cols)]]
        out.append((" ".join(row.marks), *cells, *[""] * (len(cols) - len(cells))))
    return ["mark", *cols], out


def table_head(section: Section | None, empty: str) -> str:
    """The line above a table: what it holds, and what its marks mean."""
    if section is None or not isinstance(section.body, Table) or not section.body.rows:
        return empty
    head = section.note or section.summary or section.title
    return head + (f" Marks: {section.body.legend}." if section.body.legend else "")


# -- series (metrics) ----------------------------------------------------------------------------

def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def sparkline(values: list[Any], width: int) -> str:
    """Values as block characters, ``width`` wide (bucket maxima, so a spike stays visible);
    a bucket holding a NaN/Inf is drawn as ``×``."""
    if not values or width <= 0:
        return ""
    n = len(values)
    buckets = [values[i * n // width:(i + 1) * n // width] for i in range(min(width, n))]
    finite = [x for x in (_finite(v) for v in values) if x is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    out = []
    for b in buckets:
        nums = [_finite(v) for v in b]
        if not b or any(x is None for x in nums):
            out.append(NONFINITE)
            continue
        top = max(x for x in nums if x is not None)
        idx = 0 if hi == lo else int((top - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5)
        out.append(SPARK[idx])
    return "".join(out)


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def series_text(section: Section | None, empty: str, width: int = 70) -> Text:
    """A sparkline per series with the events' steps marked '^' under the primary one, then the
    section's summary lines and the events."""
    body = section.body if section is not None and isinstance(section.body, SeriesSet) else SeriesSet([])
    events = body.events
    t = Text()
    if not body.series:
        t.append(empty + "\n")
    for s in body.series:
        steps, values = s.steps, s.values
        finite = [x for x in (_finite(v) for v in values) if x is not None]
        w = min(width, len(values))
        t.append(f"{s.name}", style="bold")
        rng = f"min {_fmt(min(finite))}  max {_fmt(max(finite))}" if finite else "no finite values"
        last = _finite(values[-1])
        t.append(f"  steps {steps[0] if steps else '?'}-{steps[-1] if steps else '?'}  {rng}  last "
                 f"{_fmt(last) if last is not None else values[-1]}\n", style="dim")
        t.append(" " + sparkline(values, w) + "\n")
        if steps and s.name == body.primary and events:
            marks = [" "] * w
            s0, s1 = steps[0], steps[-1]
            for e in events:
                step = e.get("step")
                if isinstance(step, int) and s0 <= step <= s1 and s1 > s0:
                    marks[min(w - 1, int((step - s0) / (s1 - s0) * (w - 1)))] = "^"
            t.append(" " + "".join(marks).rstrip() + "  ^ = event below\n", style="bold")
    if body.lines:
        t.append("\n" + "".join(line + "\n" for line in body.lines))
    if events:
        t.append("\nEvents:\n", style="bold")
        for e in events[:20]:
            t.append(f" step {e.get('step', '?'):>6}  {e.get('kind', '')}: {e.get('detail', '')}\n")
    return t


# -- trace ---------------------------------------------------------------------------------------

def trace_line(step: dict[str, Any], causes: dict[str, str] | None = None) -> str:
    """One agent step: time, action, detail (fired rules named with their cause)."""
    detail = str(step.get("detail", ""))
    fired = step.get("fired")
    if isinstance(fired, list) and fired and causes is not None:
        detail += "; fired: " + ", ".join(f"{r} ({causes.get(r, '?')})" for r in fired)
    t = step.get("t")
    when = f"{t:6.2f}s" if isinstance(t, (int, float)) else " " * 7
    return f"{when} {str(step.get('action', '')):<9} {detail}"


def trace_text(report: Report, causes: dict[str, str] | None = None) -> Text:
    """What the agent checked and why, the probes it ran, and what could not be used."""
    t = Text()
    t.append("What mldoctor checked, in order:\n", style="bold")
    for s in report.trace:
        t.append(trace_line(s, causes) + "\n")
    if report.probes:
        t.append("\nProbes:\n", style="bold")
        for p in report.probes:
            reason = f" ({p.get('reason')})" if p.get("reason") else ""
            t.append(f" {str(p.get('status', '')).upper():<7} {p.get('name', '')}{reason}\n")
    ev = report.facts.get("evidence") or {}
    if ev.get("errors"):
        t.append("\nUnusable files:\n", style="bold")
        for e in ev["errors"][:20]:
            t.append(f" - {e}\n")
    if report.not_evaluable:
        t.append(f"\n{len(report.not_evaluable)} rule(s) could not be evaluated (their facts were missing): "
                 + ", ".join(n["rule"] for n in report.not_evaluable[:12])
                 + (" ..." if len(report.not_evaluable) > 12 else "") + "\n", style="dim")
    notes = (report.source or {}).get("user_notes") or []
    if notes:
        t.append("\nYour answers (kept in the report as notes):\n", style="bold")
        for n in notes:
            t.append(f" - {n}\n")
    return t


# -- sections without a tab of their own ---------------------------------------------------------


def more_text(sections: list[Section], empty: str, width: int = 70) -> Text:
    """Every section no other pane draws, one after another, by presentation type: a new evidence
    kind shows up in the TUI without a pane of its own."""
    if not sections:
        return Text(empty, style="dim")
    out = Text()
    for sec in sections:
        out.append(sec.title + "\n", style="bold")
        if sec.summary or sec.note:
            out.append((sec.summary or sec.note) + "\n", style="dim")
        body = sec.body
        if isinstance(body, KeyValues):
            for key, value in body.items:
                out.append(f"  {key}: {value}\n")
        elif isinstance(body, Table):
            cols, rows = table_rows(sec)
            widths = [min(30, max(len(c), *(len(r[i]) for r in rows))) for i, c in enumerate(cols)] if rows else []
            if rows:
                out.append("  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + "\n", style="bold")
                for r in rows:
                    out.append("  " + "  ".join(v[:w].ljust(w) for v, w in zip(r, widths, strict=True)) + "\n",
                               style="yellow" if r[0] else "")
            if body.legend:
                out.append(f"  Marks: {body.legend}\n", style="dim")
        elif isinstance(body, Groups):
            for g in body.groups:
                out.append(f"  {g.label} on ranks {format_ranks(g.ranks)}\n")
                for line in g.lines[:8]:
                    out.append(f"      {line}\n", style="dim")
        elif isinstance(body, SeriesSet):
            out.append_text(series_text(sec, "", width=width))
            out.append("\n")
        out.append("\n")
    return out
