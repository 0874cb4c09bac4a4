"""Modal dialogs: export the report, and the key help."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

HELP = """\
Keys (mouse works too: click tabs, rows and buttons)

  g  Guide: the walkthrough        1-9  answer    n  skip a question
  f  Findings, their fix and the commands to confirm (c copies one)
  r  Ranks: the rank x state grid  s  Stacks: groups, diff vs majority
  e  Environment per rank (DIFF)   u  GPUs        m  Metrics (loss, step time)
  t  Trace: what mldoctor checked and why
  x  Export the report (Markdown, HTML, or all + the evidence bundle)
  ctrl+r  diagnose again           tab / shift+tab  move between parts
  ?  this help                     q  quit

Signals are words and marks, not only colours: the rank grid's letters and '*',
CULPRIT, DIFF, LOOK/NAMED, '+'/'-' in stack diffs, [SEVERITY] labels.
"""


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 78; height: auto; border: round $primary; padding: 0 1; background: $surface; }
    """
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP)


class ExportScreen(ModalScreen[tuple[str, Path] | None]):
    """Asks where and what to write; returns (format, folder) or None."""

    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 76; height: auto; border: round $primary; padding: 0 1; background: $surface; }
    ExportScreen Input { margin: 1 0; }
    ExportScreen Horizontal { height: auto; }
    ExportScreen Button { margin-right: 1; min-width: 10; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, default: Path) -> None:
        super().__init__()
        self.default = default

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Export the report to this folder (Enter writes all):")
            yield Input(str(self.default), id="export-dir")
            with Horizontal():
                yield Button("Markdown", id="md")
                yield Button("HTML", id="html")
                yield Button("All + bundle", id="all", variant="primary")
                yield Button("Cancel", id="cancel")
            yield Static("Files are written mode 0600 and scrubbed of secrets, like `--out`.", classes="dim")

    def on_mount(self) -> None:
        inp = self.query_one("#export-dir", Input)
        inp.cursor_blink = False
        inp.focus()

    def _folder(self) -> Path:
        return Path(self.query_one("#export-dir", Input).value.strip() or str(self.default))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self.dismiss((str(event.button.id), self._folder()))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(("all", self._folder()))

    def action_cancel(self) -> None:
        self.dismiss(None)
