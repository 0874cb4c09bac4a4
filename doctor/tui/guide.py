"""The walkthrough pane: one question at a time, the probes' progress, the findings so far."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList, RichLog, Static, TabbedContent
from textual.widgets.option_list import Option

from doctor.engine.report import Report
from doctor.tui import views
from doctor.tui.questions import Question


class GuidePane(Vertical):
    """Asks the next question; shows what the agent is doing and what it found."""

    DEFAULT_CSS = """
    GuidePane { height: 1fr; }
    GuidePane #q-text { text-style: bold; height: auto; }
    GuidePane #q-why { color: $text-muted; height: auto; }
    GuidePane #answers { height: auto; max-height: 7; border: none; }
    GuidePane #free { margin: 0 0 0 2; }
    GuidePane .head { text-style: bold; height: 1; margin-top: 1; }
    GuidePane #progress { height: 1fr; min-height: 3; overflow-x: hidden; }
    GuidePane #guide-findings { height: auto; max-height: 4; border: none; }
    """

    class Answered(Message):
        """The user answered ``question`` with answer ``index`` (-1: typed ``text``, -2: skipped)."""

        def __init__(self, question: Question, index: int, text: str = "") -> None:
            super().__init__()
            self.question = question
            self.index = index
            self.text = text

    class OpenFinding(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.question: Question | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="q-text")
        yield Static("", id="q-why")
        yield OptionList(id="answers")
        yield Input(id="free", compact=True)
        yield Static("Progress", classes="head", id="progress-head")
        yield RichLog(id="progress", max_lines=500, wrap=True, markup=False, min_width=20)
        yield Static("Findings (Enter: details and fix)", classes="head", id="findings-head")
        yield OptionList(id="guide-findings")

    def on_mount(self) -> None:
        free = self.query_one("#free", Input)
        free.cursor_blink = False
        free.display = False

    # -- the question ----------------------------------------------------------------------------
    def ask(self, question: Question | None, text: str = "", busy: bool = False) -> None:
        """Show ``question`` (None: nothing left to ask, or ``busy`` while the agent works)."""
        self.question = question
        # The question's height changes the log's: keep its newest line in view afterwards.
        self.call_after_refresh(self._log_to_end)
        answers = self.query_one("#answers", OptionList)
        free = self.query_one("#free", Input)
        answers.clear_options()
        if question is None:
            self.query_one("#q-text", Static).update(
                "Checking the evidence..." if busy else "No more questions.")
            self.query_one("#q-why", Static).update(
                "" if busy else "The findings below are the verdict; f shows each one's fix and commands, "
                "x exports the report.")
            answers.display = False
            free.display = False
            return
        self.query_one("#q-text", Static).update(text or question.text)
        self.query_one("#q-why", Static).update(question.why + "  (number or Enter to answer, n to skip)")
        options = [Option(Text(f"{i} {a.label}"), id=f"a{i - 1}") for i, a in enumerate(question.answers, 1)]
        if question.free_text:
            n = len(question.answers) + 1
            options.append(Option(Text(f"{n} type an answer ({'a path' if question.free_text == 'path' else 'a note'})"),
                                  id="type"))
        answers.add_options(options)
        answers.display = True
        answers.highlighted = 0
        free.display = bool(question.free_text)
        free.value = ""
        free.placeholder = question.placeholder
        if self.app.query_one(TabbedContent).active == "guide":
            answers.focus()

    def _log_to_end(self) -> None:
        self.query_one("#progress", RichLog).scroll_end(animate=False, immediate=True)

    def action_pick(self, n: int) -> None:
        """Answer ``n`` (1-based); the one after the last choice opens the typed answer."""
        if self.question is None:
            return
        if 1 <= n <= len(self.question.answers):
            self._answer(n - 1)
        elif n == len(self.question.answers) + 1 and self.question.free_text:
            self.query_one("#free", Input).focus()

    def action_skip(self) -> None:
        if self.question is not None:
            q, self.question = self.question, None
            self.post_message(self.Answered(q, -2))

    def _answer(self, index: int, text: str = "") -> None:
        q, self.question = self.question, None
        if q is not None:
            self.post_message(self.Answered(q, index, text))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_list.id == "answers" and event.option_id == "type":
            self.query_one("#free", Input).focus()
        elif event.option_list.id == "answers" and event.option_id:
            self._answer(int(event.option_id[1:]))
        elif event.option_list.id == "guide-findings":
            self.post_message(self.OpenFinding(event.option_index))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip() and self.question is not None:
            self._answer(-1, event.value.strip())

    # -- progress and findings ---------------------------------------------------------------------
    def progress(self, line: str) -> None:
        self.query_one("#progress", RichLog).write(line)

    def set_progress_head(self, text: str) -> None:
        self.query_one("#progress-head", Static).update(text)

    def show_findings(self, report: Report | None, label: str = "") -> None:
        lst = self.query_one("#guide-findings", OptionList)
        keep = lst.highlighted
        lst.clear_options()
        head = self.query_one("#findings-head", Static)
        if report is None:
            head.update("Findings: none yet")
            return
        findings = report.findings
        head.update(f"Findings{' (' + label + ')' if label else ''}: "
                    + (f"{len(findings)}, most likely first (Enter: details and fix)" if findings
                       else str(report.verdict.get("summary", ""))[:70]))
        lst.add_options([Option(views.finding_label(i, f), id=f"f{i - 1}") for i, f in enumerate(findings, 1)])
        if findings:
            lst.highlighted = min(keep or 0, len(findings) - 1)
