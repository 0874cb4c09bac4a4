"""Pilot tests of `mldoctor tui`: the walkthrough paths, the evidence browser, export, snapshots.

Everything runs headless at 80x24 over real captured evidence (tests/fixtures). Waits poll the
app's state with a deadline; nothing sleeps a fixed time. Snapshots are plain text of the
screen (what a person reads), stored in tests/snapshots/tui/; what would make them flaky is
pinned: the terminal size, no clock on screen, cursor blink off, the agent's step times masked,
no toast on screen. Update them with MLDOCTOR_UPDATE_SNAPSHOTS=1 after looking at the diff.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

pytest.importorskip("textual")

from rich.console import Console  # noqa: E402
from textual.widgets import OptionList, TextArea  # noqa: E402

from doctor.tui import questions as qs  # noqa: E402
from doctor.tui.app import DoctorApp  # noqa: E402
from doctor.tui.session import Session  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EV = ROOT / "tests" / "fixtures" / "evidence"
SNAPSHOTS = ROOT / "tests" / "snapshots" / "tui"
SIZE = (80, 24)


def screen_text(app: DoctorApp) -> str:
    """The screen as plain text: what ``App.export_screenshot`` renders, exported as text."""
    console = Console(width=app.size.width, height=app.size.height, file=io.StringIO(), record=True,
                      force_terminal=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()


async def until(pilot, cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            await pilot.pause()
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{screen_text(pilot.app)}")


async def settled(pilot) -> None:  # noqa: ANN001
    """Wait until no diagnosis runs and a report is in."""
    app = pilot.app
    await until(pilot, lambda: not app.running and (app.session.report is not None or bool(app.error)),
                "the diagnosis to finish", timeout=120)


def run(session: Session, body: Callable[[object], Awaitable[None]]) -> DoctorApp:
    app = DoctorApp(session)

    async def go() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await body(pilot)

    asyncio.run(go())
    return app


def guide_question(app: DoctorApp) -> str:
    q = app.query_one("GuidePane").question
    return q.id if q is not None else ""


# -- the walkthrough ------------------------------------------------------------------------------

def test_offline_hang_shows_cause_and_culprit_and_asks_nothing_open() -> None:
    """A real hung job with a high-confidence finding: the verdict shows at once, and after the
    symptom the walkthrough asks no open question (what changed, scale)."""
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        text = screen_text(app)
        assert "HUNG | collective_mismatch on rank 1 | critical" in text
        assert "1. [CRITICAL] collective_mismatch  rank 1" in text
        assert guide_question(app) == "symptom"
        await pilot.press("1")  # no progress -> hang: a new hint, so the engine runs again
        await settled(pilot)
        assert app.session.symptom == "hang" and app.session.runs == 2
        assert guide_question(app) == ""
        assert "No more questions." in screen_text(app)
        assert app.session.view().source["user_notes"] == ["What do you see? -> no progress (no new steps, stuck)"]

    run(Session(EV / "extra_collective"), body)


def test_unsure_path_asks_what_evidence_cannot_tell_and_keeps_answers_as_notes() -> None:
    """Healthy-looking evidence and an unsure user: stuck-or-slow sets the hint (a new run), then the
    open questions; a typed answer becomes a note in the report and the trace, never a finding."""
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        assert "HEALTHY" in screen_text(app)
        await pilot.press("5")  # not sure
        await until(pilot, lambda: guide_question(app) == "stuck_or_slow", "stuck-or-slow")
        assert "Are new steps still being logged?" in screen_text(app)
        await pilot.press("2")  # yes, but slower -> hint slow
        await settled(pilot)
        assert app.session.symptom == "slow" and app.session.runs == 2
        await until(pilot, lambda: guide_question(app) == "scale", "the scale question")
        assert "Did it ever work at this scale (4 ranks)?" in screen_text(app)
        await pilot.press("2")
        await until(pilot, lambda: guide_question(app) == "changed", "what changed")
        assert "7 type an answer (a note)" in screen_text(app)
        await pilot.press("7")  # the typed answer: focus goes to the input
        await pilot.press(*"new optimizer", "enter")
        await until(pilot, lambda: guide_question(app) == "slow_since", "slow since when")
        await pilot.press("n")  # skip
        await until(pilot, lambda: guide_question(app) == "", "the end of the questions")
        rep = app.session.view()
        notes = rep.source["user_notes"]
        assert "What changed since the last good run? -> typed (new optimizer)" in notes
        assert any("First run at this scale" in n for n in notes)
        assert not rep.findings, "answers must not invent findings"
        assert any(s["action"] == "user" and "new optimizer" in s["detail"] for s in rep.trace)
        await pilot.press("t")
        await until(pilot, lambda: "Your answers (kept in the report as notes):" in screen_text(app), "trace notes")
        assert app.session.runs == 2, "notes alone do not re-run the engine"

    run(Session(EV / "healthy"), body)


def test_loss_answer_asks_for_the_metrics_file_and_reads_it() -> None:
    """Stacks only, and the user says the loss looks wrong: mldoctor asks where the loss is written;
    a wrong path is refused in one line, a real one is read and its finding appears."""
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("4")  # loss looks wrong -> diverge
        await settled(pilot)
        await until(pilot, lambda: guide_question(app) == "metrics_file", "the metrics-file question")
        await pilot.press("2")
        await pilot.press(*"/nonexistent/metrics.csv", "enter")
        await until(pilot, lambda: guide_question(app) == "metrics_file", "the question again")
        assert "no such file or folder" in app.query_one("#progress").lines[-1].text
        await pilot.press("2")  # the typed answer again
        app.query_one("#free").value = str(ROOT / "tests" / "fixtures" / "metrics" / "divergence")
        await pilot.press("enter")
        await settled(pilot)
        assert app.session.runs == 3
        assert "loss_divergence" in [f.cause for f in app.session.report.findings]
        assert "loss_divergence" in screen_text(app)

    run(Session(ROOT / "tests" / "fixtures" / "stacks" / "native_collective"), body)


def test_questions_are_data_with_valid_conditions() -> None:
    """Every condition compiles and evaluates; symptom answers map to the CLI's hints."""
    facts = {"job": {"world_size": 8}, "evidence": {"kinds": ["stacks"]}}
    base = {"symptom": "", "live": False, "has_report": True, "state": "unknown", "n_findings": 0,
            "top_cause": "", "top_confidence": 0.0, "high_confidence": False, "answered": []}
    for q in qs.QUESTIONS:
        assert q.answers and q.text and q.why
        for hi in (True, False):
            for sym in ("", "hang", "slow", "crash", "diverge"):
                qs.applies(q, facts, {**base, "high_confidence": hi, "symptom": sym})  # must not raise
        if q.sets_symptom:
            assert {a.symptom for a in q.answers} <= {"hang", "slow", "crash", "diverge", None}
    # The example: "what changed" only when no rule fired with high confidence.
    changed = qs.by_id("changed")
    assert qs.applies(changed, facts, base)
    assert not qs.applies(changed, facts, {**base, "high_confidence": True})
    assert qs.applies(qs.by_id("metrics_file"), facts, {**base, "symptom": "diverge"})
    assert not qs.applies(qs.by_id("metrics_file"), {"evidence": {"kinds": ["metrics"]}}, {**base, "symptom": "diverge"})
    assert qs.text_of(qs.by_id("scale"), facts) == "Did it ever work at this scale (8 ranks)?"


# -- findings, fix, copy ---------------------------------------------------------------------------

def test_findings_fix_and_copy_command() -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("enter")  # on the symptom list: "no progress"
        await settled(pilot)
        await pilot.press("f")
        commands = app.query_one("#commands", OptionList)
        await until(pilot, lambda: commands.option_count > 0, "the playbook's commands")
        text = screen_text(app)
        assert "Culprits: rank 1" in text and "Fix:" in app.query_one("#finding-text").render().plain
        first = app.query_one("FindingsPane").commands[0][0]
        await pilot.press("c")
        assert app.clipboard == first
        assert app.query_one("#command-text", TextArea).text.startswith(first)
        commands.focus()
        await pilot.press("down")
        await pilot.press("enter")  # Enter on a command copies it too
        second = app.query_one("FindingsPane").commands[1][0]
        assert app.clipboard == second
        assert app.query_one("#command-text", TextArea).text.startswith(second)

    run(Session(EV / "extra_collective"), body)


def test_late_playbook_commands_after_quit_are_dropped() -> None:
    """The playbook's commands are read in a thread; when their answer arrives after the app has
    quit (a user pressing q at once, or a script leaving run_test), it is dropped instead of
    failing the exit with NoMatches (seen in bench/bench_tui.py under load)."""
    holder: dict[str, object] = {}

    async def body(pilot) -> None:  # noqa: ANN001
        await settled(pilot)
        holder["pane"] = pilot.app.query_one("FindingsPane")

    run(Session(EV / "extra_collective"), body)
    pane = holder["pane"]
    pane._commands_loaded("collective_mismatch", [("nvidia-smi", "why")])  # type: ignore[attr-defined]
    assert pane.commands == [] or pane.commands[0][0] != "nvidia-smi"  # type: ignore[attr-defined]


def test_mouse_opens_a_finding_and_a_tab_and_help_shows_keys() -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.click("#guide-findings", offset=(4, 0))
        await until(pilot, lambda: app.query_one("TabbedContent").active == "findings", "the findings tab")
        await pilot.click("Tab#--content-tab-ranks")
        await until(pilot, lambda: app.query_one("TabbedContent").active == "ranks", "the ranks tab")
        await pilot.press("question_mark")
        await until(pilot, lambda: "Keys (mouse works too" in screen_text(app), "the help")
        await pilot.press("escape")
        await until(pilot, lambda: "Keys (mouse works too" not in screen_text(app), "the help closed")

    run(Session(EV / "extra_collective"), body)


# -- the evidence browser --------------------------------------------------------------------------

def test_browser_ranks_stacks_env_trace_show_text_markers() -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("r")
        text = screen_text(app)
        assert re.search(r"\b1 B\*", text), text  # the culprit cell: state letter and '*'
        assert re.search(r"B\s+collective: barrier\s+1 rank\s+1\s+\(culprit\)", text)
        assert re.search(r"1\s+collective: barrier\s+CULPRIT\s+g1\s+gloo:barrier", text)
        await pilot.press("s")
        text = screen_text(app)
        assert re.search(r"g1\s+collective: barrier\s+1 rank\s+1\s+\* culprit", text)
        assert "+ barrier (torch/distributed/distributed_c10d.py)" in text
        assert "- all_reduce (torch/distributed/distributed_c10d.py)" in text
        assert "+ sync_before_logging (doctor/scenarios/train_job.py)" in text
        await pilot.press("e")
        text = screen_text(app)
        assert re.search(r"DIFF\s+RANK\s+0 on r0; 1 on r1; 2 on r2; 3 on r3", text)
        assert re.search(r"^\s+WORLD_SIZE\s+4\s*$", text, re.M)
        assert "3 differ across ranks" in text
        await pilot.press("t")
        text = screen_text(app)
        assert "What mldoctor checked, in order:" in text
        assert re.search(r"fired:\s+FR003\s+\(collective_mismatch\)", text)  # may wrap at 80 columns
        await pilot.press("u")
        assert "No GPU readings in the evidence" in screen_text(app)

    run(Session(EV / "extra_collective"), body)


def test_browser_gpu_table_marks_named_and_flagged_gpu() -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("u")
        text = screen_text(app)
        assert re.search(r"NAMED LOOK\s+vm:gpu0\s+NVIDIA H200", text), text
        assert "LOOK = a health flag is set" in text

    run(Session(ROOT / "tests" / "fixtures" / "gpu" / "h200" / "stuck"), body)


def test_browser_metrics_chart_marks_nan_and_events() -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("m")
        text = screen_text(app)
        loss = text[text.index("loss  steps"):]
        spark = loss.splitlines()[1]
        assert "×" in spark, "NaN steps are drawn with a text mark"
        assert "^ = event below" in loss
        assert re.search(r"step time: median 0\.17\d*s", text.replace("\n", " ")) or "step time:" in \
            app.query_one("MetricsPane .body").render().plain
        plain = app.query_one("MetricsPane .body").render().plain
        assert "step    374  nan: loss became nan at step 374" in plain

    run(Session(ROOT / "tests" / "fixtures" / "metrics" / "fp16_overflow"), body)


# -- sources, export, errors ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_bundle(tmp_path_factory) -> Path:  # noqa: ANN001
    """A bundle written by the real CLI (`diagnose --out`) from the hung job's evidence."""
    from .conftest import mldoctor

    out = tmp_path_factory.mktemp("saved")
    res = mldoctor("diagnose", "--from", str(EV / "extra_collective"), "--out", str(out))
    assert res.returncode == 1, res.stderr
    return next(out.glob("*.tar.gz"))


def test_saved_bundle_shows_its_report_before_the_recheck(saved_bundle: Path) -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await pilot.pause()
        assert app.session.saved is not None
        # The saved report is on screen right away, labelled as such.
        assert app.query_one("#guide-findings", OptionList).option_count == 1
        await settled(pilot)
        assert app.session.report.findings[0].cause == "collective_mismatch"
        assert app.session.report.source["type"] == "bundle"
        assert "saved with the bundle" not in screen_text(app)

    run(Session(saved_bundle), body)


def test_export_markdown_html_and_bundle(tmp_path: Path) -> None:
    dest = tmp_path / "exported"

    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("1")
        await settled(pilot)
        await pilot.press("x")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ExportScreen", "the export dialog")
        app.screen.query_one("#export-dir").value = str(dest)
        await pilot.press("enter")  # Enter in the folder field: all + bundle
        await until(pilot, lambda: (dest / "report.json").exists() and any(dest.glob("*.tar.gz")), "the files")
        await pilot.press("x")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ExportScreen", "the export dialog")
        app.screen.query_one("#export-dir").value = str(tmp_path / "md-only")
        await pilot.click("#md")
        await until(pilot, lambda: (tmp_path / "md-only" / "report.md").exists(), "report.md")

    run(Session(EV / "extra_collective"), body)
    md = (dest / "report.md").read_text()
    assert "collective_mismatch" in md
    assert "the user answered: What do you see? -> no progress" in md  # the answer, as a note
    doc = json.loads((dest / "report.json").read_text())
    assert doc["source"]["user_notes"] == ["What do you see? -> no progress (no new steps, stuck)"]
    assert (dest / "report.html").stat().st_size > 1000
    assert oct((dest / "report.md").stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in (tmp_path / "md-only").iterdir()) == ["report.md"]


def test_missing_path_and_no_job_are_one_line_errors() -> None:
    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await until(pilot, lambda: bool(app.error), "the error")
        assert "no such file or folder" in screen_text(app)

    run(Session(Path("/nonexistent/evidence")), body)

    async def live(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await pilot.press("1")
        await until(pilot, lambda: bool(app.error), "the error", timeout=60)
        assert "Traceback" not in screen_text(app)
        assert "mldoctor:" in screen_text(app)

    run(Session(pids=[os.getpid()], budget=5), live)  # pytest is no training job


# -- snapshots -------------------------------------------------------------------------------------

_TIMES = re.compile(r"\b\d+\.\d\ds\b")
#: The rule pack grows; its counts in the agent's "rules" step are not what these snapshots pin.
_RULE_COUNTS = re.compile(r"\b\d+ rules: \d+ fired, \d+ not evaluable")


def check_snapshot(name: str, text: str) -> None:
    """Compare with tests/snapshots/tui/<name>.txt (step times masked, trailing blanks cut)."""
    text = _RULE_COUNTS.sub("N rules: N fired, N not evaluable", _TIMES.sub("t.ttS", text))
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("MLDOCTOR_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}; run with MLDOCTOR_UPDATE_SNAPSHOTS=1 and review it"
    want = path.read_text()
    if text != want:
        path.with_suffix(".actual.txt").write_text(text)
    assert text == want, f"{name}: the screen changed; see {path.with_suffix('.actual.txt')}"


def test_snapshots_80x24(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EV)  # the evidence path shows in the agent's steps: keep it checkout-independent

    async def body(pilot) -> None:  # noqa: ANN001
        app = pilot.app
        await settled(pilot)
        await pilot.press("1")
        await settled(pilot)
        app.clear_notifications()
        log = app.query_one("#progress")
        # The progress log scrolls to its end on its own time: pin it there.
        await until(pilot, lambda: not log._deferred_renders, "the progress log written")
        log.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        check_snapshot("guide_done", screen_text(app))
        for key, name in (("f", "findings"), ("r", "ranks"), ("s", "stacks")):
            await pilot.press(key)
            await until(pilot, lambda: app.query_one("#commands", OptionList).option_count > 0, "commands")
            check_snapshot(name, screen_text(app))
        svg = app.export_screenshot()
        assert svg.startswith("<svg") and "collective_mismatch" in svg

    run(Session(Path("extra_collective")), body)
