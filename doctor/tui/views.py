"""Pure text for every TUI pane, built from the report model (no textual import).

Every signal carries text as well as colour (a state letter, ``CULPRIT``, ``DIFF``, ``+``/``-``),
so the screens read the same in a monochrome terminal, a screen reader or a test. The derived
views (rank states, stack groups, env rows, GPU table) come from ``doctor.render.view``, the same
code the Markdown and HTML reports use.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from rich.text import Text

from doctor.engine.findings import Finding
from doctor.engine.report import Report
from doctor.engine.rule import format_ranks
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


def rank_rows(report: Report) -> list[tuple[str, ...]]:
    """Rows for the per-rank table: rank, state, CULPRIT mark, stack group, last collective, host."""
    states = view.rank_states(report)
    per = report.ranks()
    culprits = view.culprit_ranks(report)
    hosts = (report.facts.get("job") or {}).get("rank_hosts") or {}
    rows = []
    for rank, label in list(states.items())[:MAX_GRID_CELLS]:
        info = per.get(str(rank), {})
        st = info.get("stacks") if isinstance(info.get("stacks"), dict) else {}
        fr = info.get("flight_recorder") if isinstance(info.get("flight_recorder"), dict) else {}
        rows.append((str(rank), label, "CULPRIT" if rank in culprits else "", str(st.get("group") or ""),
                     str(fr.get("last_op") or ""), str(hosts.get(str(rank)) or "")))
    return rows


# -- stacks --------------------------------------------------------------------------------------

def group_label(g: view.StackGroup, culprits: set[int]) -> Text:
    gid = str(g.extra.get("id") or f"g{g.index}")
    t = Text(f"{gid:<4}")
    t.append(f"{g.where:<26} ")
    t.append(f"{g.n:>4} rank{'s' if g.n != 1 else ' '} {format_ranks(g.ranks)}")
    if g.majority:
        t.append("  majority", style="dim")
    if culprits & set(g.ranks):
        t.append("  * culprit", style="bold")
    return t


def group_detail(g: view.StackGroup, majority: view.StackGroup | None) -> Text:
    """A group's frames as a diff against the majority group: '+' only here, '-' only there."""
    t = Text()
    gid = str(g.extra.get("id") or f"g{g.index}")
    t.append(f"{gid}: {g.where}, ranks {format_ranks(g.ranks)}\n", style="bold")
    if g.site:
        t.append(f"called from: {g.site}\n")
    if g.top:
        t.append(f"innermost:   {g.top}\n")
    if majority is None or majority is g:
        t.append("\nFrames (innermost first; this is the majority group):\n", style="dim")
        for fr in g.frames:
            t.append(f"  {fr}\n")
        return t
    mid = str(majority.extra.get("id") or f"g{majority.index}")
    t.append(f"\nDiff against the majority group {mid} ({majority.where}, ranks {format_ranks(majority.ranks)}):\n",
             style="dim")
    t.append("  '+' only in this group, '-' only in the majority, ' ' shared\n", style="dim")
    sm = difflib.SequenceMatcher(a=majority.frames, b=g.frames, autojunk=False)
    for op, a0, a1, b0, b1 in sm.get_opcodes():
        if op == "equal":
            for fr in g.frames[b0:b1]:
                t.append(f"    {fr}\n")
            continue
        for fr in majority.frames[a0:a1]:
            t.append(f"  - {fr}\n", style="red")
        for fr in g.frames[b0:b1]:
            t.append(f"  + {fr}\n", style="green")
    return t


# -- environment and GPUs ------------------------------------------------------------------------

def env_rows(facts: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(marker, variable, value): differing variables first, marked ``DIFF``, with the value of
    each rank group ("0 on r0; 1 on r1-3"); a variable the same on every rank shows its value."""
    rows = []
    for r in view.env_rows(facts):
        if r.differs:
            values = "; ".join(f"{v} on r{format_ranks(rs)}" for v, rs in r.by_value[:6])
            if len(r.by_value) > 6:
                values += f"; ... {len(r.by_value) - 6} more values"
            rows.append(("DIFF", r.key, values))
        else:
            rows.append(("", r.key, r.value))
    return rows


def gpu_rows(report: Report) -> tuple[list[str], list[tuple[str, ...]]]:
    """Columns and rows of the GPU table; the first column says LOOK (flagged) or NAMED (a finding's)."""
    cols, rows, flagged = view.gpu_table(report.facts)
    named = view.gpu_named(rows, report)
    out = []
    for r, flag, name in zip(rows, flagged, named, strict=True):
        mark = " ".join(m for m, on in (("NAMED", name), ("LOOK", flag)) if on)
        out.append((mark, *[r.get(c, "") for c in cols]))
    return ["mark", *cols], out


# -- metrics -------------------------------------------------------------------------------------

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


def metric_charts(facts: dict[str, Any], width: int = 70) -> Text:
    """A sparkline per curve (loss, grad norm, LR, loss scale) with events marked '^' under it."""
    m = facts.get("metrics") if isinstance(facts.get("metrics"), dict) else {}
    curves = m.get("curves") if isinstance(m.get("curves"), dict) else {}
    events = [e for e in (m.get("events") or []) if isinstance(e, dict)]
    t = Text()
    if not curves:
        t.append("No loss or step-time series in the evidence (metrics CSV/JSONL, TensorBoard, trainer logs).\n")
    for name in ("loss", "grad_norm", "lr", "loss_scale", *sorted(set(curves) - {"loss", "grad_norm", "lr", "loss_scale"})):
        c = curves.get(name)
        if not isinstance(c, dict) or not c.get("values"):
            continue
        steps, values = list(c.get("steps") or []), list(c["values"])
        finite = [x for x in (_finite(v) for v in values) if x is not None]
        w = min(width, len(values))
        t.append(f"{name}", style="bold")
        rng = f"min {_fmt(min(finite))}  max {_fmt(max(finite))}" if finite else "no finite values"
        last = _finite(values[-1])
        t.append(f"  steps {steps[0] if steps else '?'}-{steps[-1] if steps else '?'}  {rng}  last "
                 f"{_fmt(last) if last is not None else values[-1]}\n", style="dim")
        t.append(" " + sparkline(values, w) + "\n")
        if steps and name == "loss" and events:
            marks = [" "] * w
            s0, s1 = steps[0], steps[-1]
            for e in events:
                step = e.get("step")
                if isinstance(step, int) and s0 <= step <= s1 and s1 > s0:
                    marks[min(w - 1, int((step - s0) / (s1 - s0) * (w - 1)))] = "^"
            t.append(" " + "".join(marks).rstrip() + "  ^ = event below\n", style="bold")
    st = m.get("step_time") if isinstance(m.get("step_time"), dict) else {}
    if st.get("median") is not None:
        t.append(f"\nstep time: median {_fmt(st['median'])}s, p90 {_fmt(st.get('p90') or 0)}s, "
                 f"max {_fmt(st.get('max') or 0)}s over {st.get('n', '?')} steps ({st.get('series', '')})\n")
    if isinstance(m.get("data_time_share"), (int, float)):
        t.append(f"data loading: {m['data_time_share']:.0%} of step time\n")
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
