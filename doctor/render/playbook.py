"""``mldoctor explain``: a playbook in the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markdown import Markdown


def playbook_markdown(pb: dict[str, Any]) -> str:
    lines = [f"# {pb.get('title', pb['cause'])}", "", f"`{pb['cause']}` ({pb.get('category', '')})", "",
             str(pb.get("means", "")).strip(), ""]
    confirm = pb.get("confirm") or {}
    if confirm:
        lines += ["## How to confirm", ""]
        if confirm.get("probes"):
            lines.append(f"mldoctor probes that look for it: {', '.join(confirm['probes'])}")
            lines.append("")
        for c in confirm.get("commands", []):
            lines += [f"- {c.get('why', '')}", "", f"  `{c.get('cmd', '')}`", ""]
    if pb.get("fix"):
        lines += ["## Fix", ""] + [f"{i}. {s}" for i, s in enumerate(pb["fix"], 1)] + [""]
    if pb.get("healthy"):
        lines += ["## Healthy numbers", "", str(pb["healthy"]).strip(), ""]
    if pb.get("references"):
        lines += ["## References", ""] + [f"- {r.get('title', '')}: {r.get('url', '')}" for r in pb["references"]]
    return "\n".join(lines)


def render_playbook(pb: dict[str, Any]) -> None:
    console = Console()
    text = playbook_markdown(pb)
    if console.is_terminal:
        console.print(Markdown(text))
    else:
        console.file.write(text + "\n")
