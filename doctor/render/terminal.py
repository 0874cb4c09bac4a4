"""The terminal view: verdict first, then findings with culprits, evidence and the fix."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from doctor.engine.report import Report
from doctor.engine.rule import format_ranks

STATE_STYLE = {"hung": "bold red", "crashed": "bold red", "diverging": "bold magenta",
               "slow": "bold yellow", "healthy": "bold green", "unknown": "bold blue"}
SEV_STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}


def render(report: Report, console: Console | None = None, verbose: bool = False) -> None:
    console = console or Console()
    v = report.verdict
    state = v["state"]
    head = Text.assemble((f" {state.upper()} ", STATE_STYLE.get(state, "bold")), "  ", v["summary"])
    if v.get("missing"):
        head.append(f"\nmissing: {v['missing']}", style="dim")
    console.print(Panel(head, title="mldoctor verdict", title_align="left"))
    for i, f in enumerate(report.findings, 1):
        body = [Text(f.summary)]
        meta = Table.grid(padding=(0, 2))
        meta.add_column(style="dim")
        meta.add_column()
        meta.add_row("cause", f"{f.cause}  ({f.rule} {f.rule_name})")
        meta.add_row("severity", Text(f"{f.severity}, confidence {f.confidence:.2f}", style=SEV_STYLE.get(f.severity, "")))
        if f.ranks:
            meta.add_row("ranks", format_ranks(f.ranks))
        if f.hosts:
            meta.add_row("hosts", ", ".join(f.hosts))
        if f.gpus:
            meta.add_row("gpus", ", ".join(f.gpus))
        body.append(meta)
        if f.evidence:
            body.append(Text("evidence:", style="bold"))
            body += [Text(f"  - {e}") for e in f.evidence[:8]]
            if len(f.evidence) > 8:
                body.append(Text(f"  ... {len(f.evidence) - 8} more in the report", style="dim"))
        if f.missing and i > 1:  # the top finding's is in the verdict panel already
            body.append(Text(f"missing: {f.missing}", style="dim"))
        if f.fix:
            body.append(Text("fix:", style="bold"))
            body += [Text(f"  {n}. {s}") for n, s in enumerate(f.fix[:4], 1)]
        console.print(Panel(Group(*body), title=f"#{i} {f.title}", title_align="left",
                            border_style=SEV_STYLE.get(f.severity, "")))
    ev = report.to_json()["evidence"]
    line = f"evidence: {ev['files']} file(s) as {', '.join(ev['kinds']) or 'nothing recognized'}"
    if ev["ignored"]:
        line += f"; {len(ev['ignored'])} ignored"
    console.print(Text(line, style="dim"))
    for err in ev["errors"][:10]:
        console.print(Text(f"  unusable: {err}", style="yellow"))
    for p in report.probes:
        if p.get("status") != "ok":
            console.print(Text(f"  probe {p['name']} {p['status']}: {p.get('reason', '')}", style="yellow"))
    for e in report.rule_errors:
        console.print(Text(f"  rule {e['rule']} failed: {e['error']}", style="red"))
    if verbose:
        for ne in report.not_evaluable:
            console.print(Text(f"  not evaluable: {ne['rule']} ({ne['cause']}): {ne['reason']}", style="dim"))
        for step in report.trace:
            console.print(Text(f"  [{step['t']:6.2f}s] {step['action']}: {step['detail']}", style="dim"))
    elif report.not_evaluable:
        console.print(Text(f"{len(report.not_evaluable)} rule(s) not evaluable for lack of evidence (-v lists them)", style="dim"))
