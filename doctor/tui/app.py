"""The textual app: a status line, eight tabs (guide, findings, and the evidence browser), keys.

The diagnosis runs in a worker thread (the engine is blocking); the agent's trace is polled
every 0.2 s so the probes' progress shows while they run. A second run asked for while one is
going (a new symptom hint from an answer) waits and starts when the first finishes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, OptionList, Static, TabbedContent, TabPane

from doctor.engine.report import Report
from doctor.evidence.errors import UserError
from doctor.tui import questions as qs
from doctor.tui import views
from doctor.tui.browser import (
    EnvPane,
    GpuPane,
    MetricsPane,
    MorePane,
    RanksPane,
    StacksPane,
    TracePane,
)
from doctor.tui.dialogs import ExportScreen, HelpScreen
from doctor.tui.findings import FindingsPane
from doctor.tui.guide import GuidePane
from doctor.tui.session import Session, stamp

if TYPE_CHECKING:
    from doctor.engine.trace import Trace

#: (tab id, label with its key, the widget that gets the focus there)
TABS = (
    ("guide", "g Guide", "#answers"), ("findings", "f Findings", "#finding-list"),
    ("ranks", "r Ranks", "#rank-table"), ("stacks", "s Stacks", "#group-list"),
    ("env", "e Env", "#env-table"), ("gpu", "u GPU", "#gpus-table"),
    ("metrics", "m Metrics", "MetricsPane"), ("more", "o More", "MorePane"), ("trace", "t Trace", "TracePane"),
)


class DoctorApp(App[int]):
    """``mldoctor tui``: walkthrough and evidence browser over one :class:`Session`."""

    TITLE = "mldoctor"
    AUTO_FOCUS = "#answers"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #status { height: 1; padding: 0 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    TabbedContent { height: 1fr; }
    TabPane { padding: 0 1; }
    """
    BINDINGS = [
        *[Binding(label[0], f"tab('{tid}')", label.split()[1], show=False) for tid, label, _ in TABS],
        *[Binding(str(n), f"pick({n})", show=False) for n in range(1, 10)],
        Binding("n", "skip", "Skip question"),
        Binding("x", "export", "Export"),
        Binding("ctrl+r", "rerun", "Diagnose again", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.running = False
        self.error = ""
        self._pending = False
        self._trace: Trace | None = None
        self._seen = 0
        self._label = ""
        self.causes: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        panes = {"guide": GuidePane, "findings": FindingsPane, "ranks": RanksPane, "stacks": StacksPane,
                 "env": EnvPane, "gpu": GpuPane, "metrics": MetricsPane, "more": MorePane,
                 "trace": TracePane}
        with TabbedContent(id="tabs", initial="guide"):
            for tid, label, _ in TABS:
                with TabPane(label, id=tid):
                    yield panes[tid](id=f"{tid}-pane")
        yield Footer()

    # -- start -------------------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.query_one(TabbedContent).hide_tab("more")
        self._timer = self.set_interval(0.2, self._poll, pause=True)
        guide = self.query_one(GuidePane)
        guide.progress(f"Evidence: {self.session.label()}")
        try:
            saved = self.session.open()
        except UserError as exc:
            self._fail(str(exc))
            return
        if saved is not None:
            self._label = "saved with the bundle; re-checking"
            guide.progress(f"Showing the report saved with the bundle ({saved.created}); re-checking it now.")
            self._show(self.session.view())
        if self.session.symptom is not None and "symptom" not in self.session.answered:
            self.session.answer("symptom", "What do you see?", self.session.symptom,
                                note=f"{self.session.symptom} (given with --symptom)")
        if not self.session.live or "symptom" in self.session.answered:
            # After the first frame: the saved findings (if any) paint before the engine loads.
            self.call_after_refresh(self.start_run)
        else:
            self._status(self.session.label() + "; nothing probed before your answer")
        self._ask_next()

    # -- diagnosis ---------------------------------------------------------------------------------
    def start_run(self) -> None:
        if self.running:
            self._pending = True
            return
        from doctor.engine.trace import Trace

        self.running, self.error = True, ""
        self._trace, self._seen = Trace(), 0
        hint = self.session.symptom or "no symptom hint"
        what = "probing the job" if self.session.live else "reading the evidence"
        self.query_one(GuidePane).progress(f"-- diagnosis {self.session.runs + 1}: {what} ({hint}) --")
        self.query_one(GuidePane).set_progress_head(f"Progress: {what}...")
        self._status("checking")
        self._timer.resume()
        # A daemon thread, not a textual worker: quitting must not wait for a live run's probes.
        threading.Thread(target=self._run, args=(self._trace,), name="mldoctor-diagnose", daemon=True).start()

    def _run(self, trace: Trace) -> None:
        """The engine, off the UI thread; its result goes back through call_from_thread."""
        report, error = None, ""
        try:
            from doctor.engine import ruleset as engine

            rules = engine.load_ruleset(self.session.rules_dirs or None)
            self.causes = {r.id: r.cause for r in rules.rules}
            report = self.session.diagnose(trace)
        except UserError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the screen spinning
            error = f"internal error: {type(exc).__name__}: {exc}"
        try:
            self.call_from_thread(self._done, report, error)
        except RuntimeError:
            pass  # the app has quit meanwhile

    def _poll(self) -> None:
        trace = self._trace
        if trace is None:
            return
        steps = trace.steps
        guide = self.query_one(GuidePane)
        for step in steps[self._seen:]:
            guide.progress(views.trace_line(step, self.causes))
        self._seen = len(steps)

    def _done(self, report: Report | None, error: str) -> None:
        self._poll()
        self._timer.pause()
        self.running = False
        guide = self.query_one(GuidePane)
        if report is None:
            self._fail(error)
        else:
            self._label = ""
            guide.set_progress_head(f"Progress: done ({len(report.trace)} steps); ctrl+r runs it again")
            guide.progress(f"Verdict: {str(report.verdict.get('state', '')).upper()}: {report.verdict.get('summary', '')}")
            self._show(self.session.view())
        if self._pending:
            self._pending = False
            self.start_run()
        self._ask_next()

    def _fail(self, error: str) -> None:
        self.error = error
        guide = self.query_one(GuidePane)
        guide.set_progress_head("Progress: failed")
        guide.progress(f"mldoctor: {error}")
        self._status("")
        self.notify(error, severity="error", timeout=8)

    # -- showing -----------------------------------------------------------------------------------
    def _status(self, note: str) -> None:
        report = self.session.view()
        if self.error:
            note = "error: " + self.error[:60]
        elif self.running:
            note = "checking..."
        elif self._label:
            note = self._label
        self.query_one("#status", Static).update(views.status_line(report, note or self.session.label()))

    def _show(self, report: Report | None) -> None:
        self._status("")
        self.query_one(GuidePane).show_findings(report, self._label)
        self.query_one(TracePane).causes = self.causes
        for pane in (FindingsPane, RanksPane, StacksPane, EnvPane, GpuPane, MetricsPane, MorePane, TracePane):
            self.query_one(pane).show(report)
        # The "More" tab is there only when some evidence kind has sections no other tab draws.
        tabs = self.query_one(TabbedContent)
        if self.query_one(MorePane).has_sections:
            tabs.show_tab("more")
        else:
            tabs.hide_tab("more")

    def _ask_next(self) -> None:
        guide = self.query_one(GuidePane)
        report = self.session.report or self.session.saved
        facts = report.facts if report else {}
        q = qs.next_question(facts, self.session.facts_context())
        if q is not None and self.running and q.id != "symptom":
            q = None  # later questions depend on the report being made now
        guide.ask(q, qs.text_of(q, facts) if q else "", busy=self.running)

    def on_guide_pane_answered(self, msg: GuidePane.Answered) -> None:
        q, guide = msg.question, self.query_one(GuidePane)
        report = self.session.report or self.session.saved
        text = qs.text_of(q, report.facts if report else {})
        try:
            if msg.index == -2:
                self.session.answered.append(q.id)
                guide.progress(f"You skipped: {text}")
                rerun = False
            elif msg.index == -1:
                path = msg.text if q.free_text == "path" else ""
                rerun = self.session.answer(q.id, text, "typed", text="" if path else msg.text, path=path)
                guide.progress(f"You: {msg.text}" + ("  (added as evidence)" if path else ""))
            else:
                a = q.answers[msg.index]
                rerun = self.session.answer(q.id, text, a.label, symptom=a.symptom, sets_symptom=q.sets_symptom,
                                            note=a.note or a.label, facts=a.facts, pattern_id=a.pattern_id)
                guide.progress(f"You: {a.label}")
        except UserError as exc:
            self.session.answered.remove(q.id)
            self.notify(str(exc), severity="error")
            guide.progress(f"mldoctor: {exc}")
            self._ask_next()
            return
        if rerun:
            self.start_run()
        else:
            self._show(self.session.view())
        self._ask_next()

    def on_guide_pane_open_finding(self, msg: GuidePane.OpenFinding) -> None:
        self.action_tab("findings")
        self.query_one(FindingsPane).select(msg.index)

    def on_resize(self) -> None:
        if self.session.view() is not None:
            for pane in (RanksPane, MetricsPane):
                self.query_one(pane).show(self.session.view())

    # -- actions -----------------------------------------------------------------------------------
    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        target = dict((t, sel) for t, _, sel in TABS)[tab]
        for widget in self.query_one(f"#{tab}-pane").query(target) if target.startswith("#") else [
                self.query_one(f"#{tab}-pane")]:
            if widget.display and widget.focusable:
                widget.focus()
                return
        fallback = self.query_one(f"#{tab}-pane").query("OptionList, DataTable").results()
        for widget in fallback:
            if isinstance(widget, (OptionList, DataTable)) and widget.display:
                widget.focus()
                return

    def action_pick(self, n: int) -> None:
        """Digits answer the Guide's question wherever the focus is (an input takes them first)."""
        if self.query_one(TabbedContent).active == "guide":
            self.query_one(GuidePane).action_pick(n)

    def action_skip(self) -> None:
        if self.query_one(TabbedContent).active == "guide":
            self.query_one(GuidePane).action_skip()

    def action_rerun(self) -> None:
        self.start_run()

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_export(self) -> None:
        if self.session.view() is None:
            self.notify("Nothing to export yet: the diagnosis has not finished.", severity="warning")
            return
        self.push_screen(ExportScreen(Path.cwd() / stamp()), self._export_chosen)

    def _export_chosen(self, choice: tuple[str, Path] | None) -> None:
        if choice is not None:
            self._export(*choice)

    @work(thread=True, group="export")
    def _export(self, fmt: str, folder: Path) -> None:
        try:
            written = self.session.export(fmt, folder)
        except (UserError, OSError) as exc:
            self.call_from_thread(self.notify, f"Export failed: {exc}", severity="error", timeout=8)
            return
        names = ", ".join(p.name for p in written.values())
        self.call_from_thread(self.query_one(GuidePane).progress, f"Exported to {folder}: {names}")
        self.call_from_thread(self.notify, f"Wrote {names} in {folder}", timeout=6)

    def on_unmount(self) -> None:
        self.session.close()


def run_tui(path: Path | None = None, pids: list[int] | None = None, symptom: str | None = None,
            logs: list[Path] | None = None, rules_dirs: list[Path] | None = None, budget: float = 30.0,
            job: str | None = None) -> int:
    """Run the TUI in this terminal until the user quits; 0 on a normal exit."""
    session = Session(path=path, pids=list(pids or []), logs=list(logs or []), job=job, budget=budget,
                      rules_dirs=list(rules_dirs or []), symptom=symptom)
    try:
        DoctorApp(session).run()
    finally:
        session.close()
    return 0
