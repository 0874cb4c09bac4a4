"""Report sections: what probes contribute, drawn by presentation type; evidence rendered inert.

A made-up evidence kind registered in the test (the registry monkeypatched) must show up in the
Markdown and HTML reports without any renderer knowing it. Strings planted in real evidence
(a copied fixture with an appended log line, an env value and a file name) must not become live
Markdown (images, links, raw HTML, autolinks) in report.md, nor live HTML in report.html.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
from markdown_it import MarkdownIt

from doctor.engine.diagnose import diagnose_path
from doctor.evidence import plugins
from doctor.evidence.contract import Probe
from doctor.evidence.sections import (
    Cell,
    Group,
    Groups,
    KeyValues,
    Row,
    Section,
    SectionContext,
    Table,
)
from doctor.render import view
from doctor.render.html import render_html
from doctor.render.markdown import render_markdown

from .conftest import FIXTURES

SLOW_ENV = FIXTURES / "env_capture" / "slow_transport"
RANK_EXIT = FIXTURES / "evidence" / "rank_exit"


class RasProbe(Probe):
    """A kind no renderer has heard of: NCCL RAS output, as the architecture walkthrough has it."""

    name: ClassVar[str] = "ras"

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        ras = facts.get("ras") or {}
        if not ras:
            return []
        rows = [Row([Cell(str(r)), Cell(state, code=True)], marks=["MISSING"] if r in ras["missing"] else [])
                for r, state in sorted(ras["states"].items())]
        rows.sort(key=lambda row: not row.highlighted)
        return [
            Section(id="ras", title="NCCL RAS", order=35, nav="RAS", body=Table(["rank", "RAS state"], rows, noun="rank"),
                    summary=f"{len(rows)} rank(s) in the RAS report", note="ranks the RAS thread could not reach"),
            Section(id="ras-peers", title="RAS peers", order=36, body=KeyValues([("coordinator", "node7:29500")])),
            Section(id="ras-groups", title="RAS groups", order=37, body=Groups([
                Group("r0", "reachable", [0, 1], ["ras_poll (ras.cc:10)", "main (ras.cc:1)"]),
                Group("r1", "unreachable", [2], ["ras_wait (ras.cc:20)", "main (ras.cc:1)"])])),
        ]


class BrokenProbe(Probe):
    name: ClassVar[str] = "broken"

    def report_sections(self, facts: dict[str, Any], context: SectionContext) -> list[Section]:
        raise RuntimeError("a third-party probe's report code fails")


@pytest.fixture
def with_ras(monkeypatch: pytest.MonkeyPatch) -> tuple[Probe, ...]:
    registered = (*plugins.probes(), RasProbe(), BrokenProbe())
    monkeypatch.setattr(plugins, "probes", lambda: registered)
    return registered


def test_a_new_kind_shows_in_markdown_and_html_without_a_renderer_edit(with_ras) -> None:  # noqa: ANN001
    report = diagnose_path(SLOW_ENV)
    report.facts["ras"] = {"states": {0: "ok", 1: "ok", 2: "unreachable"}, "missing": [2]}
    ids = [s.id for s in view.sections(report)]
    assert ids.index("env") < ids.index("ras") < ids.index("ras-peers") < ids.index("ras-groups")  # by order
    md = render_markdown(report)
    ras = md[md.index("## NCCL RAS"):]
    assert "<details><summary>3 rank(s) in the RAS report</summary>" in ras
    assert "| rank | RAS state |" in ras and "| **2** | `unreachable` |" in ras  # highlighted row first
    assert ras.index("| **2** |") < ras.index("| 0 | `ok` |")
    assert "- **coordinator:** `node7:29500`" in md
    assert ">> ras_wait (ras.cc:20)" in md and "<details><summary>Group 2: 1 rank(s) 2, unreachable" in md
    assert md.index("## Environment") < md.index("## NCCL RAS") < md.index("## Evidence")
    page = render_html(report)
    assert '<a href="#ras">RAS</a>' in page and '<a href="#ras-peers">RAS peers</a>' in page
    sec = page[page.index('<section id="ras">'):]
    sec = sec[: sec.index("</section>")]
    assert '<p class="muted">ranks the RAS thread could not reach</p>' in sec
    assert '<tr class="diff"><td>2</td><td><code>unreachable</code></td></tr>' in sec
    assert "<dt>coordinator</dt><dd><code>node7:29500</code></dd>" in page
    assert '<li class="diff">ras_wait (ras.cc:20)</li>' in page
    # the TUI draws the same section by its type
    from doctor.tui import views

    cols, rows = views.table_rows(view.section(report, "ras"))
    assert cols == ["mark", "rank", "RAS state"] and rows[0] == ("MISSING", "2", "unreachable")
    # ... and its "More" tab shows every section without a tab of its own, by type
    from doctor.tui.browser import MorePane

    rest = [s for s in view.sections(report) if s.id not in MorePane.SHOWN]
    text = views.more_text(rest, "none").plain
    assert "NCCL RAS" in text and "unreachable" in text and "coordinator: node7:29500" in text
    assert "ras_wait (ras.cc:20)" in text and "Environment" not in text


def test_no_renderer_reads_a_probe_namespace() -> None:
    """Renderers and the TUI reach evidence only through sections and the probe contract."""
    root = Path(__file__).resolve().parents[1]
    names = sorted({p.name for p in plugins.probes()})
    alternatives = "|".join(map(re.escape, names))
    pattern = re.compile(r"""(?:\.get\(|\[)\s*["'](""" + alternatives + r""")["']""")
    hits = [f"{path.relative_to(root)}:{n}: {line.strip()}"
            for folder in ("doctor/render", "doctor/tui") for path in sorted((root / folder).glob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


# -- evidence rendered inert -------------------------------------------------------------------------

EVIL = ("![x](http://evil.example/a.png) [click](javascript:alert(1)) <img src=x onerror=alert(1)> "
        "<http://evil.example/auto> www.evil.example and mail@evil.example")


def _tokens(md: str) -> list[Any]:
    out: list[Any] = []
    todo = list(MarkdownIt("commonmark").enable("table").parse(md))
    while todo:
        tok = todo.pop(0)
        out.append(tok)
        todo[:0] = tok.children or []
    return out


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A copy of a real crashed job's evidence with hostile text in a log line, an env value and
    a file name."""
    dest = tmp_path / "rank_exit"
    shutil.copytree(RANK_EXIT, dest, ignore=shutil.ignore_patterns("truth.yaml"))
    log = dest / "torchrun.log"
    log.write_text(log.read_text().replace("Connection reset by peer", f"Connection reset by {EVIL}"))
    with open(dest / "env-rank0.txt", "a") as fh:
        fh.write(f"NCCL_DEBUG_FILE={EVIL}\n")
    (dest / "![pic](evil.png) [a](javascript:x) www.evil.example.bin").write_text("zz\n")
    return dest


def test_markdown_renders_evidence_as_text_never_as_markup(planted: Path) -> None:
    md = render_markdown(diagnose_path(planted))
    assert md.count("evil.example") >= 3, "the planted text reaches the report (log, env, file name)"
    tokens = _tokens(md)
    assert not [t for t in tokens if t.type in ("image", "link_open")], "no image or link from the evidence"
    raw = [t.content for t in tokens if t.type in ("html_inline", "html_block")]
    assert not [h for h in raw if re.search(r"<(?:img|a|script|iframe)\b", h, re.I)], raw
    # GFM turns bare URLs, www. names and e-mail addresses into links: they must sit in code spans
    live = [t.content for t in tokens if t.type == "text"
            and re.search(r"https?://|www\.|\S@\S+\.\w", t.content)]
    assert live == [], live
    # the report's own structure still works
    assert [t for t in tokens if t.type == "heading_open"] and [t for t in tokens if t.type == "table_open"]
    assert "## Findings" in md and "<details><summary>" in md
    assert "first failure in the logs" in md and "!\\[x\\](`http://evil.example/a.png)`" in md
    assert "!\\[pic\\](evil.png) \\[a\\](javascript:x) `www.evil.example.bin`" in md  # the ignored file's name


def test_html_escapes_the_same_evidence(planted: Path) -> None:
    page = render_html(diagnose_path(planted))
    assert "evil.example" in page
    assert not re.search(r"<(?:img|iframe|object|embed)\b", page, re.I)
    assert all(re.fullmatch(r'<a href="#[\w-]+">', a) for a in re.findall(r"<a\b[^>]*>", page, re.I))  # nav only
    assert page.count("<script>") == 1  # ours
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
