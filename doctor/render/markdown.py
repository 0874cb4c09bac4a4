"""The Markdown report: pasteable into a GitHub/GitLab issue or a Jira ticket.

Order: the verdict paragraph, the ranked findings, then the detail sections (rank states, the
sections the probes contribute such as stack groups, environment and GPUs, drawn by presentation
type, then evidence and trace) in collapsible ``<details>`` blocks, and the command that
reproduces the diagnosis from the bundle. GitHub refuses comment bodies above 65,536
characters, so every section is capped and later sections give way to a pointer to the bundle
and the HTML report when the total would not fit.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from doctor import __version__
from doctor.engine.findings import Finding
from doctor.engine.report import Report, incident_key
from doctor.engine.rule import format_ranks
from doctor.evidence.sections import Cell, Groups, KeyValues, Section, Table
from doctor.render import view

#: GitHub's limit for an issue or comment body (characters).
LIMIT = 65_536
_FOOTER_RESERVE = 1_500
_MAX_EVIDENCE = 10
_MAX_FIX = 6
_MAX_ITEM = 400
_MAX_GROUPS = 12
_MAX_FRAMES = 40
_MAX_ROWS = 64
_MAX_COLS = 12
_MAX_TRACE = 60
_MAX_LIST = 30


#: What GitHub/GitLab turn into a link without any markup (GFM's extended autolinks): URLs,
#: ``www.`` names and e-mail addresses. In evidence text they become inline code, inert. An
#: address starts where a token starts and its local part is bounded, so a long run of word
#: characters costs linear time, not quadratic.
_AUTOLINK = re.compile(r"(?:\b(?:https?|ftp|mailto|xmpp):|\bwww\.)[^\s<>]*"
                       r"|(?<![\w.+-])[\w.+-]{1,256}@[\w-]+(?:\.[\w-]+)+", re.I)
#: The backslash too, so that evidence cannot un-escape the brackets that link syntax needs.
_MD_PUNCT = str.maketrans({"\\": "\\\\", "[": "\\[", "]": "\\]"})


def _esc_plain(s: str) -> str:
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.translate(_MD_PUNCT)


def esc(text: object) -> str:
    """Escape text from the evidence for a Markdown paragraph so none of it becomes live markup.

    No raw HTML (``<module>`` must stay visible; ``<img src=...>`` must not load), no link or
    image syntax (``[x](javascript:...)``, ``![x](http://...)``: brackets are escaped, and a
    backslash in the text cannot undo that), and no autolink (a bare URL or e-mail address is
    shown as inline code). The report's own structure is written around this text, never through
    it.
    """
    s = str(text).replace("\r", " ").replace("\n", " ")
    out: list[str] = []
    pos = 0
    for m in _AUTOLINK.finditer(s):
        out += [_esc_plain(s[pos:m.start()]), code(m.group(0))]
        pos = m.end()
    out.append(_esc_plain(s[pos:]))
    return "".join(out)


def td(text: object) -> str:
    """Escape text for a table cell."""
    return cell(esc(text))


def cell(markdown: str) -> str:
    """Markdown already built from escaped text and code spans, made safe for a table cell (a
    pipe would end the cell, even inside a code span); never escaped again, which would break
    the code spans open."""
    return markdown.replace("|", "\\|")


def code(text: object) -> str:
    """Inline code that survives backticks in the content."""
    s = str(text).replace("\n", " ")
    fence = "`"
    while fence in s:
        fence += "`"
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def block(lines: list[str], lang: str = "") -> str:
    body = "\n".join(lines)
    fence = "```"
    while fence in body:
        fence += "`"
    return f"{fence}{lang}\n{body}\n{fence}"


def clip(text: object, n: int = _MAX_ITEM) -> str:
    s = str(text)
    return s if len(s) <= n else s[: n - 3] + "..."


def details(summary: str, body: str, html: bool) -> str:
    """A collapsible section on GitHub/GitLab; a plain sub-heading where HTML is not wanted."""
    if html:
        return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"
    return f"**{summary}**\n\n{body}"


def _finding(i: int, f: Finding, short: bool = False) -> str:
    head = f"### {i}. {esc(f.title)} ({code(f.cause)})"
    lines = [head, "", esc(clip(f.summary, 1200)), ""]
    culprits = []
    if f.ranks:
        culprits.append(f"rank{'s' if len(set(f.ranks)) > 1 else ''} {code(format_ranks(f.ranks))}")
    if f.hosts:
        culprits.append("hosts " + ", ".join(code(h) for h in f.hosts[:8])
                        + (f" and {len(f.hosts) - 8} more" if len(f.hosts) > 8 else ""))
    if f.gpus:
        culprits.append("GPUs " + ", ".join(code(g) for g in f.gpus[:8])
                        + (f" and {len(f.gpus) - 8} more" if len(f.gpus) > 8 else ""))
    lines.append(f"- **Culprits:** {'; '.join(culprits) if culprits else 'the job as a whole'}")
    lines.append(f"- **Confidence:** {f.confidence:.2f} ({f.severity} severity; rule {code(f.rule)}"
                 + (f", also {', '.join(code(r) for r in f.also_fired)}" if f.also_fired else "") + ")")
    if f.evidence and not short:
        lines.append("- **Evidence:**")
        lines += [f"  - {esc(clip(e))}" for e in f.evidence[:_MAX_EVIDENCE]]
        if len(f.evidence) > _MAX_EVIDENCE:
            lines.append(f"  - ... {len(f.evidence) - _MAX_EVIDENCE} more in report.json")
    if f.missing:
        lines.append(f"- **Missing evidence:** {esc(clip(f.missing, 600))}")
    if f.fix and not short:
        lines.append("- **Fix:**")
        lines += [f"  {n}. {esc(clip(s))}" for n, s in enumerate(f.fix[:_MAX_FIX], 1)]
    elif f.fix:
        lines.append(f"- **Fix:** {esc(clip(f.fix[0], 200))} (`mldoctor explain {f.cause}` for the rest)")
    return "\n".join(lines)


def _findings(report: Report, budget: int) -> str:
    if not report.findings:
        return "## Findings\n\nNo rule fired on this evidence."
    out = ["## Findings", "",
           "| # | cause | severity | confidence | culprit ranks | hosts |",
           "| --- | --- | --- | --- | --- | --- |"]
    for i, f in enumerate(report.findings, 1):
        out.append(f"| {i} | {code(f.cause)} | {f.severity} | {f.confidence:.2f} | "
                   f"{td(clip(format_ranks(f.ranks), 80)) if f.ranks else ''} | "
                   f"{td(clip(', '.join(f.hosts), 80))} |")
    text = "\n".join(out)
    omitted = 0
    for i, f in enumerate(report.findings, 1):
        part = _finding(i, f)
        if len(text) + len(part) > budget:
            part = _finding(i, f, short=True)
        if len(text) + len(part) > budget:
            omitted = len(report.findings) - i + 1
            break
        text += "\n\n" + part
    if omitted:
        text += f"\n\n_{omitted} more finding(s) are listed in the table above; details in report.json._"
    return text


def _ranks(report: Report, html: bool) -> str:
    states = view.rank_states(report)
    if not states:
        return ""
    culprits = view.culprit_ranks(report)
    rows = ["| where | ranks | count |", "| --- | --- | --- |"]
    for state, ranks in view.states_summary(states)[:_MAX_LIST]:
        mark = " (culprit)" if culprits & set(ranks) and len(ranks) < len(states) else ""
        rows.append(f"| {td(state)}{mark} | {code(clip(format_ranks(ranks), 300))} | {len(ranks)} |")
    return "## Where each rank is\n\n" + "\n".join(rows)


def _groups(sec: Section, html: bool) -> str:
    """Groups of ranks sharing a stack, each collapsible; lines that differ from the base
    (first) group's are marked ``>>``."""
    groups = sec.body.groups if isinstance(sec.body, Groups) else []
    if not groups:
        return ""
    base = groups[0].lines
    parts = [f"## {esc(sec.title)}", "",
             f"{len(groups)} group(s) of ranks with the same stack; the largest first. Frames marked "
             "`>>` differ from the largest group's stack."]
    for k, g in enumerate(groups[:_MAX_GROUPS], 1):
        share = f", {view.pct(g.share)} of ranks" if g.share is not None else ""
        summary = (f"Group {k}: {g.n} rank(s) {esc(clip(format_ranks(g.ranks), 120))}, "
                   f"{esc(g.label)}{share}{' (majority)' if k == 1 and len(groups) > 1 else ''}")
        diff = view.frame_diff(g.lines, base)
        lines = [f"   at {clip(g.site, 240)}"] if g.site else []
        lines += [(">> " if changed and k > 1 else "   ") + clip(fr, 240) for fr, changed in diff[:_MAX_FRAMES]]
        if len(g.lines) > _MAX_FRAMES:
            lines.append(f"   ... {len(g.lines) - _MAX_FRAMES} more frame(s)")
        body = block(lines) if lines else "_no frames recorded_"
        parts += ["", details(summary, body, html)]
    if len(groups) > _MAX_GROUPS:
        rest = sum(g.n for g in groups[_MAX_GROUPS:])
        parts += ["", f"_{len(groups) - _MAX_GROUPS} smaller group(s) ({rest} rank(s)) are in the bundle._"]
    return "\n".join(parts)


def _cell(c: Cell) -> str:
    """A table cell: a value differing by rank lists each value with its ranks; literal values
    are code; other text is escaped and clipped."""
    if c.by_ranks:
        values = "; ".join(f"{code(clip(v, 80))} on {clip(view.ranks_phrase(rs), 100)}" for v, rs in c.by_ranks[:4])
        if len(c.by_ranks) > 4:
            values += f"; {len(c.by_ranks) - 4} more value(s)"
        return cell(values)
    if c.code:
        return cell(code(clip(c.text, 160)))
    return td(clip(c.text, 60))


def _table(sec: Section, html: bool) -> str:
    """A table; highlighted rows first (the probe orders them) with their first cell in bold."""
    t = sec.body
    if not isinstance(t, Table) or not t.rows or not t.columns:
        return ""
    cols = t.columns[:_MAX_COLS]
    out = ["| " + " | ".join(td(c) for c in cols) + " |", "|" + " --- |" * len(cols)]
    for row in t.rows[:_MAX_ROWS]:
        cells = [_cell(c) for c in row.cells[:len(cols)]]
        cells += [""] * (len(cols) - len(cells))
        if row.highlighted and cells[0]:
            cells[0] = f"**{cells[0]}**" + (f" {esc(row.suffix)}" if row.suffix else "")
        out.append("| " + " | ".join(cells) + " |")
    if len(t.rows) > _MAX_ROWS:
        out.append(f"\n_{len(t.rows) - _MAX_ROWS} more {esc(t.noun)}(s) in report.html and the bundle; "
                   "highlighted ones come first._")
    return f"## {esc(sec.title)}\n\n" + details(esc(sec.summary or sec.title), "\n".join(out), html)


def _key_values(sec: Section, html: bool) -> str:
    kv = sec.body
    if not isinstance(kv, KeyValues) or not kv.items:
        return ""
    lines = [f"- **{esc(clip(k, 120))}:** {code(clip(v, _MAX_ITEM))}" for k, v in kv.items[:_MAX_ROWS]]
    return f"## {esc(sec.title)}\n\n" + details(esc(sec.summary or sec.title), "\n".join(lines), html)


#: How each presentation is written; series are charts, drawn in report.html only.
_PRESENT: dict[type, Callable[[Section, bool], str]] = {Groups: _groups, Table: _table, KeyValues: _key_values}


def _section_name(sec: Section) -> str:
    """``stack groups``, ``GPUs``: the title as it reads inside a sentence."""
    t = sec.title
    return t[:1].lower() + t[1:] if not t[1:2].isupper() else t


def _evidence(report: Report, html: bool) -> str:
    ev = report.facts.get("evidence") if isinstance(report.facts.get("evidence"), dict) else {}
    lines = [f"- Files used: {ev.get('files', 0)} as {', '.join(code(k) for k in ev.get('kinds', [])) or 'nothing'}"]
    for label, key in (("Unusable", "errors"), ("Ignored (no probe recognized them)", "ignored")):
        items = ev.get(key) or []
        if items:
            lines.append(f"- {label}: {len(items)}")
            lines += [f"  - {esc(clip(x, 200))}" for x in items[:_MAX_LIST]]
            if len(items) > _MAX_LIST:
                lines.append(f"  - ... {len(items) - _MAX_LIST} more")
    bad = [p for p in report.probes if isinstance(p, dict) and p.get("status") != "ok"]
    if report.probes:
        lines.append(f"- Probes: {len(report.probes)} run(s), {len(bad)} not ok")
        lines += [f"  - {esc(p.get('name', '?'))} {esc(p.get('status', '?'))}"
                  f"{' on ' + esc(p['host']) if p.get('host') else ''}: {esc(clip(p.get('reason', ''), 200))}"
                  for p in bad[:_MAX_LIST]]
    if report.not_evaluable:
        lines.append(f"- Rules not evaluable for lack of evidence: {len(report.not_evaluable)} ("
                     + ", ".join(code(n.get("rule", "?")) for n in report.not_evaluable[:_MAX_LIST])
                     + (" ..." if len(report.not_evaluable) > _MAX_LIST else "") + ")")
    for e in report.rule_errors[:_MAX_LIST]:
        lines.append(f"- Rule {code(e.get('rule', '?'))} failed: {esc(clip(e.get('error', ''), 200))}")
    return "## Evidence\n\n" + "\n".join(lines)


def _trace(report: Report, html: bool) -> str:
    if not report.trace:
        return ""
    lines = []
    for s in report.trace[:_MAX_TRACE]:
        t = s.get("t")
        stamp = f"{t:7.2f}s" if isinstance(t, (int, float)) else "       "
        lines.append(f"{stamp}  {s.get('action', '')}: {clip(s.get('detail', ''), 200)}")
    if len(report.trace) > _MAX_TRACE:
        lines.append(f"... {len(report.trace) - _MAX_TRACE} more step(s) in report.json")
    return "## How mldoctor got here\n\n" + details(f"Agent trace ({len(report.trace)} step(s))", block(lines), html)


def _reproduce(report: Report, bundle_name: str | None) -> str:
    cmds = view.reproduce_commands(report, bundle_name)
    where = f"the bundle {code(bundle_name)} (attached)" if bundle_name else "the same evidence"
    return f"## Reproduce\n\nFrom {where}, offline, on any machine with mldoctor:\n\n" + block(cmds, "sh")


def render_markdown(report: Report, *, bundle_name: str | None = None, html: bool = True,
                    limit: int = LIMIT) -> str:
    """The whole report as Markdown, at most ``limit`` characters.

    ``html=False`` leaves out the ``<details>`` tags (for terminals that render Markdown).
    """
    v = report.verdict
    state = str(v.get("state", "unknown"))
    head = (f"# mldoctor: {state.upper()} - {esc(clip(view.job_name(report), 80))}\n\n"
            f"> **{esc(state.upper())}**: {esc(clip(view.verdict_paragraph(report).split(': ', 1)[-1], 4000))}")
    tail = _reproduce(report, bundle_name)
    where = f"the bundle {code(bundle_name)}" if bundle_name else "the evidence"
    footer = (f"<sub>mldoctor {__version__}, "
              f"report created {esc(report.created)}, incident key {code(report.key or incident_key(report))}. Full detail: report.html and report.json beside "
              f"this report, and {where}.</sub>")
    fixed = len(head) + len(tail) + len(footer) + _FOOTER_RESERVE
    findings = _findings(report, max(4000, (limit - fixed) * 45 // 100))
    parts = [head, findings]
    used = sum(len(p) + 2 for p in parts) + fixed
    omitted: list[str] = []
    sections: list[tuple[str, Callable[[], str]]] = [("rank states", lambda: _ranks(report, html))]
    for sec in view.sections(report):
        present = _PRESENT.get(type(sec.body))
        if present is not None:
            sections.append((_section_name(sec), lambda sec=sec, present=present: present(sec, html)))
    sections += [("evidence", lambda: _evidence(report, html)), ("trace", lambda: _trace(report, html))]
    for name, fn in sections:
        text = fn()
        if not text:
            continue
        if used + len(text) + 2 > limit:
            omitted.append(name)
            continue
        parts.append(text)
        used += len(text) + 2
    if omitted:
        parts.append(f"_Left out to stay under {limit:,} characters: {', '.join(omitted)}. "
                     f"They are in report.html, report.json and {where}._")
    parts += [tail, footer]
    text = "\n\n".join(parts) + "\n"
    if len(text) > limit:  # a last guard; the budgets above should make this unreachable
        note = f"\n\n_Truncated at {limit:,} characters; the rest is in report.html and {where}._\n"
        text = text[: limit - len(note)] + note
    return text
