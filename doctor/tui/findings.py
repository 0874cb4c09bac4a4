"""The findings pane: ranked findings, the selected one's evidence and fix, commands to copy."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.widgets import OptionList, Static, TextArea
from textual.widgets.option_list import Option

from doctor.engine.report import Report
from doctor.tui import views


class FindingsPane(Vertical):
    """Findings most likely first; Enter or a click shows one; ``c`` copies the chosen command."""

    DEFAULT_CSS = """
    FindingsPane { height: 1fr; }
    FindingsPane #finding-list { height: auto; max-height: 5; border: none; }
    FindingsPane #finding-detail { height: 1fr; border-top: solid $primary; }
    FindingsPane .head { height: 1; text-style: bold; }
    FindingsPane #commands { height: auto; max-height: 4; border: none; }
    FindingsPane #command-text { height: 2; }
    """
    BINDINGS = [Binding("c", "copy", "Copy command")]

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.report: Report | None = None
        self.commands: list[tuple[str, str]] = []

    def compose(self) -> ComposeResult:
        yield OptionList(id="finding-list")
        with VerticalScroll(id="finding-detail"):
            yield Static("", id="finding-text")
        yield Static("Commands to confirm (c copies the highlighted one; select the text below too):",
                     classes="head", id="commands-head")
        yield OptionList(id="commands")
        yield TextArea("", id="command-text", read_only=True, soft_wrap=True, compact=True,
                       highlight_cursor_line=False)

    def on_mount(self) -> None:
        self.query_one("#command-text", TextArea).cursor_blink = False

    def show(self, report: Report | None) -> None:
        self.report = report
        lst = self.query_one("#finding-list", OptionList)
        keep = lst.highlighted
        lst.clear_options()
        if report is None or not report.findings:
            text = "No findings yet." if report is None else (
                f"No findings. {report.verdict.get('summary', '')}")
            self.query_one("#finding-text", Static).update(text)
            self._set_commands([])
            return
        lst.add_options([Option(views.finding_label(i, f), id=f"f{i - 1}")
                         for i, f in enumerate(report.findings, 1)])
        self.select(min(keep or 0, len(report.findings) - 1))

    def select(self, index: int) -> None:
        """Show finding ``index`` (0 = most likely)."""
        if self.report is None or not 0 <= index < len(self.report.findings):
            return
        lst = self.query_one("#finding-list", OptionList)
        if lst.highlighted != index:
            lst.highlighted = index
        f = self.report.findings[index]
        self.query_one("#finding-text", Static).update(views.finding_detail(f))
        self.query_one("#finding-detail", VerticalScroll).scroll_home(animate=False)
        self._set_commands([])
        self._load_commands(f.cause)

    @work(thread=True, exclusive=True, group="commands")
    def _load_commands(self, cause: str) -> None:
        """The playbook's commands, read off the UI thread (the first read parses every playbook)."""
        commands = views.confirm_commands(cause)
        self.app.call_from_thread(self._commands_loaded, cause, commands)

    def _commands_loaded(self, cause: str, commands: list[tuple[str, str]]) -> None:
        # The read ran in a thread: the app may have quit (its widgets removed) meanwhile, and a
        # late answer must not fail the app's exit with NoMatches.
        try:
            idx = self.query_one("#finding-list", OptionList).highlighted
        except NoMatches:
            return
        if self.report is not None and idx is not None and idx < len(self.report.findings) \
                and self.report.findings[idx].cause == cause:
            self._set_commands(commands)

    def _set_commands(self, commands: list[tuple[str, str]]) -> None:
        self.commands = commands
        lst = self.query_one("#commands", OptionList)
        lst.clear_options()
        # One line each in the list (long ones cut with '...'); the whole command is in the box below.
        lst.add_options([Option(Text(f"$ {c}" if len(c) <= 70 else f"$ {c[:67]}...", no_wrap=True), id=f"c{i}")
                         for i, (c, _) in enumerate(commands)])
        if commands:
            lst.highlighted = 0
        self._show_command(0 if commands else None)

    def _show_command(self, index: int | None) -> None:
        area = self.query_one("#command-text", TextArea)
        if index is None or not 0 <= index < len(self.commands):
            area.load_text("")
            return
        cmd, why = self.commands[index]
        area.load_text(cmd + (f"\n# {why}" if why else ""))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option_list.id == "finding-list":
            self.select(event.option_index)
        elif event.option_list.id == "commands":
            self._show_command(event.option_index)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_list.id == "finding-list":
            self.select(event.option_index)
            self.query_one("#finding-detail", VerticalScroll).focus()
        elif event.option_list.id == "commands":
            self.action_copy()

    def action_copy(self) -> None:
        """Put the highlighted command on the clipboard (OSC 52) and say so."""
        idx = self.query_one("#commands", OptionList).highlighted
        if idx is None or not 0 <= idx < len(self.commands):
            self.app.notify("No command to copy.", severity="warning")
            return
        cmd = self.commands[idx][0]
        self.app.copy_to_clipboard(cmd)
        self.app.notify(f"Copied: {cmd}", timeout=4)
