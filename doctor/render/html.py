"""The HTML report: one self-contained file to attach to a ticket.

Everything is inline (style, script, charts as SVG) and a Content-Security-Policy forbids any
fetch, so the file opens the same offline, from a mail attachment or an artifact store, and
cannot call home even if a bug slipped a URL in. All text from the evidence is escaped.
"""

from __future__ import annotations

import html
import importlib
from collections.abc import Callable
from importlib import resources
from typing import Any

from doctor import __version__
from doctor.engine.report import Report, incident_key
from doctor.engine.rule import format_ranks
from doctor.evidence.sections import Cell, Groups, KeyValues, Section, SeriesSet, Table
from doctor.render import view

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
_MAX_GROUPS_SIDE = 8
_MAX_FRAMES = 60
_MAX_MATRIX_RANKS = 64
_TITLE_RANKS = 2048
_MAX_ROWS = 512
_MAX_COLS = 14
_MAX_LIST = 200
_SHOW_EVIDENCE = 10
_MAX_TRACE = 500
#: Colour slots for states (``s0``..``s11`` in report.css); some states keep a meaning.
_FIXED = {"collective": 0, "dataloader_wait": 1, "io": 2, "compute": 3, "training": 3, "healthy": 3,
          "running": 3, "lock": 4, "dead": 4, "exited": 4, "zombie": 4}
_N_SLOTS = 12


def e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _asset(name: str) -> str:
    return resources.files("doctor.render").joinpath(name).read_text(encoding="utf-8")


def _state_classes(states: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    used: set[int] = set()
    for s in states:
        base = s.split(":", 1)[0]
        if s == view.NO_EVIDENCE:
            out[s] = "sx"
        elif base in _FIXED and _FIXED[base] not in used:
            out[s] = f"s{_FIXED[base]}"
            used.add(_FIXED[base])
    free = [i for i in range(_N_SLOTS) if i not in used and i not in _FIXED.values()]
    free += [i for i in range(_N_SLOTS) if i not in used and i not in free]
    for s in states:
        if s not in out:
            out[s] = f"s{free.pop(0)}" if free else "s8"
    return out


def _verdict(report: Report) -> str:
    state = str(report.verdict.get("state", "unknown"))
    return (f'<header class="verdict st-{e(state)}"><div class="inner">'
            f'<div class="badge">{e(state.upper())}</div>'
            f'<div><h1 id="verdict">{e(report.verdict.get("summary", ""))}</h1>'
            f'<p>{e(view.verdict_details(report))}</p></div></div></header>')


def _findings(report: Report) -> str:
    if not report.findings:
        return '<section id="findings"><h2>Findings</h2><p>No rule fired on this evidence.</p></section>'
    cards = []
    for i, f in enumerate(report.findings, 1):
        rows = [("cause", f'<code>{e(f.cause)}</code> <span class="muted">({e(f.category)})</span>'),
                ("severity", f'<span class="sev">{e(f.severity)}</span>, confidence {f.confidence:.2f}'
                             f' <span class="muted">(score {f.score:.3f}, rule <code>{e(f.rule)}</code>'
                             + (f', also {e(", ".join(f.also_fired))}' if f.also_fired else "") + ")</span>")]
        if f.ranks:
            rows.append(("ranks", f"<code>{e(format_ranks(f.ranks))}</code> ({len(f.ranks)})"))
        if f.hosts:
            rows.append(("hosts", e(", ".join(f.hosts))))
        if f.gpus:
            rows.append(("GPUs", e(", ".join(f.gpus))))
        if f.missing:
            rows.append(("missing", e(f.missing)))
        dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
        ev = "".join(f"<li>{e(x)}</li>" for x in f.evidence[:_SHOW_EVIDENCE])
        if len(f.evidence) > _SHOW_EVIDENCE:
            rest = f.evidence[_SHOW_EVIDENCE:_MAX_LIST]
            ev += (f"<li><details><summary>{len(f.evidence) - _SHOW_EVIDENCE} more</summary><ul>"
                   + "".join(f"<li>{e(x)}</li>" for x in rest)
                   + (f'<li class="muted">... {len(f.evidence) - _MAX_LIST} more in report.json</li>'
                      if len(f.evidence) > _MAX_LIST else "") + "</ul></details></li>")
        fix = "".join(f"<li>{e(x)}</li>" for x in f.fix)
        cards.append(
            f'<article class="finding sev-{e(f.severity)}"><h3>{i}. {e(f.title)}</h3>'
            f"<p>{e(f.summary)}</p><dl>{dl}</dl>"
            + (f"<h4>Evidence</h4><ul>{ev}</ul>" if ev else "")
            + (f"<h4>Fix</h4><ol>{fix}</ol>" if fix else "") + "</article>")
    return '<section id="findings"><h2>Findings</h2>' + "".join(cards) + "</section>"


def _ranks(report: Report) -> str:
    states = view.rank_states(report)
    if not states:
        return ""
    summary = view.states_summary(states)
    cls = _state_classes([s for s, _ in summary])
    culprits = view.culprit_ranks(report)
    legend = "".join(
        f'<button type="button" data-cls="{cls[s]}" data-state="{e(s)}">'
        f'<span class="sw {cls[s]}"></span>{e(s)}: {len(rs)} <span class="muted mono">{e(format_ranks(rs)[:80])}</span></button>'
        for s, rs in summary)
    titled = len(states) <= _TITLE_RANKS
    cells = []
    for r, s in states.items():
        c = cls[s] + (" c" if r in culprits else "")
        title = f' title="rank {r}: {e(s)}{" (culprit)" if r in culprits else ""}"' if titled else ""
        cells.append(f'<i class="{c}" data-r="{r}"{title}></i>')
    big = " big" if len(states) > 1024 else ""
    out = [f'<section id="ranks"><h2>Where each rank is</h2>'
           f'<p class="muted">{len(states)} rank(s) by state; outlined cells are the culprits the verdict names. '
           f'Click a state to highlight its ranks.</p><div class="legend">{legend}</div>'
           f'<div class="grid{big}" id="rank-grid">{"".join(cells)}</div><p id="rank-status" class="muted mono"></p>']
    if len(states) <= _MAX_MATRIX_RANKS and len(summary) > 1:
        head = "".join(f"<th>{r}</th>" for r in states)
        rows = []
        for s, rs in summary:
            members = set(rs)
            tds = "".join(
                f'<td class="on{" c" if r in culprits else ""}">&#9679;</td>' if r in members else "<td></td>"
                for r in states)
            rows.append(f'<tr><th><span class="sw {cls[s]}"></span>{e(s)}</th>{tds}</tr>')
        out.append(f'<table class="matrix"><tr><th>state \\ rank</th>{head}</tr>{"".join(rows)}</table>')
    out.append("</section>")
    return "".join(out)


def _series(sec: Section) -> str:
    """Charts from ``doctor.render.charts`` for the series that carry a chart caption."""
    body = sec.body
    if not isinstance(body, SeriesSet):
        return ""
    try:  # optional: the report works without it
        draw = importlib.import_module("doctor.render.charts").loss_chart_svg
    except Exception:
        return ""
    figs = []
    for series in body.series:
        if not series.chart or not series.values:
            continue
        source = {"curves": {series.name: {"steps": series.steps, "values": series.values, "series": series.label}},
                  "events": body.events}
        try:
            svg = draw(source, metric=series.name)
        except Exception:  # a chart must never cost the report
            continue
        if isinstance(svg, str) and svg.lstrip().startswith("<svg") and "<script" not in svg.lower():
            figs.append(f"<figure>{svg}<figcaption>{e(series.chart)}</figcaption></figure>")
    if not figs:
        return ""
    return (f'<section id="{e(sec.id)}"><h2>{e(sec.title)}</h2><div class="charts">' + "".join(figs)
            + "</div></section>")


def _groups(sec: Section) -> str:
    """Groups of ranks side by side; lines that differ from the base (first) group's are marked."""
    groups = sec.body.groups if isinstance(sec.body, Groups) else []
    if not groups:
        return ""
    base = groups[0].lines
    cols = []
    for k, g in enumerate(groups[:_MAX_GROUPS_SIDE], 1):
        diff = view.frame_diff(g.lines, base)
        items = "".join(f'<li class="diff">{e(fr)}</li>' if changed and k > 1 else f"<li>{e(fr)}</li>"
                        for fr, changed in diff[:_MAX_FRAMES])
        if len(g.lines) > _MAX_FRAMES:
            items += f'<li class="muted">... {len(g.lines) - _MAX_FRAMES} more</li>'
        share = f", {view.pct(g.share)}" if g.share is not None else ""
        n_diff = sum(1 for _, c in diff if c) if k > 1 else 0
        cols.append(
            f'<div class="group{" majority" if k == 1 else ""}"><header><b>Group {k}</b>: {g.n} rank(s){share}'
            f'{" (majority)" if k == 1 and len(groups) > 1 else ""}<br><span class="mono">{e(format_ranks(g.ranks)[:160])}</span>'
            f'<br>state <code>{e(g.label)}</code>'
            + (f'<br>at <span class="mono">{e(g.site)}</span>' if g.site else "")
            + (f'<br>top <span class="mono">{e(g.top)}</span>' if g.top else "")
            + (f' &middot; {n_diff} frame(s) differ' if k > 1 else "")
            + f'</header><ol class="frames mono">{items or "<li class=muted>no frames recorded</li>"}</ol></div>')
    more = ""
    if len(groups) > _MAX_GROUPS_SIDE:
        rest = groups[_MAX_GROUPS_SIDE:]
        more = (f'<p class="muted">{len(rest)} smaller group(s) with {sum(g.n for g in rest)} rank(s) '
                "are in report.json and the bundle.</p>")
    return (f'<section id="{e(sec.id)}"><h2>{e(sec.title)}</h2><p class="muted">Ranks grouped by identical stacks, '
            "largest first; highlighted frames differ from the largest group's stack.</p>"
            f'<div class="groups">{"".join(cols)}</div>{more}</section>')


def _cell(c: Cell) -> str:
    if c.by_ranks:
        return "<br>".join(f"<code>{e(v)}</code> <span class=muted>on {e(view.ranks_phrase(rs)[:120])}</span>"
                           for v, rs in c.by_ranks[:8])
    return f"<code>{e(c.text)}</code>" if c.code else e(c.text)


def _table(sec: Section) -> str:
    """A table; highlighted rows (the probe puts them first) carry the ``diff`` class."""
    t = sec.body
    if not isinstance(t, Table) or not t.rows or not t.columns:
        return ""
    cols = t.columns[:_MAX_COLS]
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    trs = []
    for row in t.rows[:_MAX_ROWS]:
        cells = [_cell(c) for c in row.cells[:len(cols)]]
        cells += [""] * (len(cols) - len(cells))
        if row.suffix:
            cells[0] = f"<b>{cells[0]}</b> {e(row.suffix)}"
        tr = '<tr class="diff">' if row.highlighted else "<tr>"
        trs.append(tr + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    more = (f'<p class="muted">{len(t.rows) - _MAX_ROWS} more {e(t.noun)}(s) in report.json and the bundle.</p>'
            if len(t.rows) > _MAX_ROWS else "")
    note = f'<p class="muted">{e(sec.note)}</p>' if sec.note else ""
    return (f'<section id="{e(sec.id)}"><h2>{e(sec.title)}</h2>{note}'
            f'<table><tr>{head}</tr>{"".join(trs)}</table>{more}</section>')


def _key_values(sec: Section) -> str:
    kv = sec.body
    if not isinstance(kv, KeyValues) or not kv.items:
        return ""
    dl = "".join(f"<dt>{e(k)}</dt><dd><code>{e(v)}</code></dd>" for k, v in kv.items[:_MAX_ROWS])
    note = f'<p class="muted">{e(sec.note)}</p>' if sec.note else ""
    return f'<section id="{e(sec.id)}"><h2>{e(sec.title)}</h2>{note}<dl>{dl}</dl></section>'


#: How each presentation is drawn.
_PRESENT: dict[type, Callable[[Section], str]] = {SeriesSet: _series, Groups: _groups, Table: _table,
                                                  KeyValues: _key_values}


def _evidence(report: Report) -> str:
    ev = report.facts.get("evidence") if isinstance(report.facts.get("evidence"), dict) else {}
    parts = [f"<p>{e(ev.get('files', 0))} file(s) used as <code>{e(', '.join(ev.get('kinds', [])) or 'nothing')}</code>.</p>"]
    for label, key in (("Unusable files", "errors"), ("Ignored files (no probe recognized them)", "ignored")):
        items = ev.get(key) or []
        if items:
            lis = "".join(f"<li>{e(x)}</li>" for x in items[:_MAX_LIST])
            parts.append(f"<details><summary>{label}: {len(items)}</summary><ul>{lis}</ul></details>")
    if report.probes:
        trs = "".join(f"<tr><td>{e(p.get('name', ''))}</td><td>{e(p.get('host', ''))}</td><td>{e(p.get('status', ''))}</td>"
                      f"<td>{e(p.get('duration_s', ''))}</td><td>{e(p.get('reason', ''))}</td></tr>"
                      for p in report.probes if isinstance(p, dict))
        parts.append("<h3>Probes</h3><table><tr><th>probe</th><th>host</th><th>status</th><th>s</th>"
                     f"<th>reason</th></tr>{trs}</table>")
    if report.not_evaluable:
        lis = "".join(f"<li><code>{e(n.get('rule', ''))}</code> ({e(n.get('cause', ''))}): {e(n.get('reason', ''))}</li>"
                      for n in report.not_evaluable)
        parts.append(f"<details><summary>Rules not evaluable for lack of evidence: {len(report.not_evaluable)}"
                     f"</summary><ul>{lis}</ul></details>")
    for err in report.rule_errors:
        parts.append(f"<p>Rule <code>{e(err.get('rule', ''))}</code> failed: {e(err.get('error', ''))}</p>")
    return '<section id="evidence"><h2>Evidence</h2>' + "".join(parts) + "</section>"


def _trace(report: Report) -> str:
    if not report.trace:
        return ""
    trs = "".join(
        f"<tr><td class=mono>{e(s.get('t', ''))}</td><td>{e(s.get('action', ''))}</td><td>{e(s.get('detail', ''))}</td></tr>"
        for s in report.trace[:_MAX_TRACE])
    more = f'<p class="muted">{len(report.trace) - _MAX_TRACE} more step(s) in report.json.</p>' if len(report.trace) > _MAX_TRACE else ""
    return (f'<section id="trace"><h2>How mldoctor got here</h2><table><tr><th>t (s)</th><th>step</th>'
            f"<th>detail</th></tr>{trs}</table>{more}</section>")


def _reproduce(report: Report, bundle_name: str | None) -> str:
    cmds = "\n".join(view.reproduce_commands(report, bundle_name))
    where = f"the bundle <code>{e(bundle_name)}</code>" if bundle_name else "the same evidence"
    return (f'<section id="reproduce"><h2>Reproduce</h2><p>From {where}, offline, on any machine with mldoctor:</p>'
            f'<button type="button" class="copy" data-target="repro-cmd">copy</button>'
            f'<pre id="repro-cmd">{e(cmds)}</pre></section>')


def render_html(report: Report, *, bundle_name: str | None = None) -> str:
    """The whole report as one HTML document (no external resources)."""
    state = str(report.verdict.get("state", "unknown"))
    sections = [_findings(report), _ranks(report)]
    titles = {"findings": "Findings", "ranks": "Ranks"}
    for sec in view.sections(report):
        present = _PRESENT.get(type(sec.body))
        if present is not None and sec.id not in titles:
            sections.append(present(sec))
            titles[sec.id] = sec.nav or sec.title
    sections += [_evidence(report), _trace(report), _reproduce(report, bundle_name)]
    titles.update(evidence="Evidence", trace="Trace", reproduce="Reproduce")
    present_ids = [sid for sid in titles if any(sec.startswith(f'<section id="{e(sid)}"') for sec in sections)]
    nav = "<nav>" + "".join(f'<a href="#{e(sid)}">{e(titles[sid])}</a>' for sid in present_ids) + "</nav>"
    body = [
        _verdict(report), nav, "<main>", *sections, "</main>",
        f"<footer>mldoctor {e(__version__)}, report created {e(report.created)}; source: "
        f"{e((report.source or {}).get('type', ''))}; incident key "
        f"<code class=\"incident-key\">{e(report.key or incident_key(report))}</code>.</footer>",
    ]
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>mldoctor: {e(state.upper())} - {e(view.job_name(report))}</title>"
            f"<style>{_asset('report.css')}</style></head>\n<body>\n"
            + "\n".join(b for b in body if b)
            + f"\n<script>{_asset('report.js')}</script>\n</body></html>\n")
