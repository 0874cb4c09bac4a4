"""The evidence browser: ranks, stack groups, environment, GPUs, metrics and the agent's trace.

Each pane has ``show(report)``; the text comes from ``doctor.tui.views``.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option

from doctor.engine.report import Report
from doctor.evidence.sections import Group
from doctor.render import view
from doctor.tui import views


class TextPane(VerticalScroll):
    """A scrollable block of text (metrics, trace)."""

    DEFAULT_CSS = "TextPane { height: 1fr; } TextPane > Static { width: 1fr; }"

    def compose(self) -> ComposeResult:
        yield Static("No report yet.", classes="body")

    def set_text(self, text) -> None:  # noqa: ANN001 - str or rich Text
        self.query_one(".body", Static).update(text)


class MorePane(TextPane):
    """Sections that no other tab draws (a new evidence kind's tables, key values, groups)."""

    #: Sections with a tab of their own.
    SHOWN = frozenset({"stacks", "env", "gpus", "charts"})
    empty = "No other evidence sections in this report."

    #: Whether the last report had any such section (the app hides the tab when not).
    has_sections = False

    def show(self, report: Report | None) -> None:
        if report is not None:
            rest = [s for s in view.sections(report) if s.id not in self.SHOWN]
            self.has_sections = bool(rest)
            self.set_text(views.more_text(rest, self.empty, width=max(20, self.size.width - 4 or 70)))


class MetricsPane(TextPane):
    """The series section (curves as sparklines, events marked)."""

    section_id = "charts"
    empty = "No loss or step-time series in the evidence (metrics CSV/JSONL, TensorBoard, trainer logs)."

    def show(self, report: Report | None) -> None:
        if report is not None:
            self.set_text(views.series_text(view.section(report, self.section_id), self.empty,
                                            width=max(20, self.size.width - 4 or 70)))


class TracePane(TextPane):
    causes: dict[str, str] = {}

    def show(self, report: Report | None) -> None:
        if report is not None:
            self.set_text(views.trace_text(report, self.causes))


class RanksPane(VerticalScroll):
    """The rank x state grid, then one row per rank."""

    DEFAULT_CSS = """
    RanksPane { height: 1fr; }
    RanksPane #rank-table { height: auto; max-height: 40; }
    """

    def compose(self) -> ComposeResult:
        yield Static("No report yet.", id="rank-grid")
        yield DataTable(id="rank-table", cursor_type="row", zebra_stripes=True)

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        self.query_one("#rank-grid", Static).update(views.rank_grid(report, width=max(20, (self.size.width or 78) - 2)))
        table = self.query_one("#rank-table", DataTable)
        cols, rows = views.rank_rows(report)
        table.clear(columns=True)
        table.add_columns(*cols)
        for row in rows:
            table.add_row(*row)


class StacksPane(Vertical):
    """Stack groups (which ranks are in each); the highlighted one diffed against the majority."""

    DEFAULT_CSS = """
    StacksPane { height: 1fr; }
    StacksPane #group-list { height: auto; max-height: 6; border: none; }
    StacksPane #group-detail { height: 1fr; border-top: solid $primary; }
    """

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.groups: list[Group] = []
        self.culprits: set[int] = set()

    def compose(self) -> ComposeResult:
        yield OptionList(id="group-list")
        with VerticalScroll(id="group-detail"):
            yield Static("No report yet.", id="group-text")

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        self.groups = view.stack_groups(report)
        self.culprits = view.culprit_ranks(report)
        lst = self.query_one("#group-list", OptionList)
        lst.clear_options()
        if not self.groups:
            self.query_one("#group-text", Static).update("No Python stacks in the evidence.")
            return
        lst.add_options([Option(views.group_label(g, self.culprits), id=f"g{i}") for i, g in enumerate(self.groups)])
        # Open on the first group that holds a culprit: that is the one worth the diff.
        first = next((i for i, g in enumerate(self.groups) if self.culprits & set(g.ranks)), 0)
        lst.highlighted = first
        self._detail(first)

    def _detail(self, index: int) -> None:
        if 0 <= index < len(self.groups):
            majority = self.groups[0]
            self.query_one("#group-text", Static).update(views.group_detail(self.groups[index], majority))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self._detail(event.option_index)


class TablePane(Vertical):
    """A table section of the report, its marks (DIFF, LOOK, NAMED) in the first column."""

    DEFAULT_CSS = "TablePane { height: 1fr; } TablePane .head { height: auto; } TablePane DataTable { height: 1fr; }"
    #: The section this pane shows, and what it says when the evidence has none.
    section_id = ""
    empty = "Nothing of this kind in the evidence."

    def compose(self) -> ComposeResult:
        yield Static("", classes="head", id=f"{self.section_id}-head")
        yield DataTable(id=f"{self.section_id}-table", cursor_type="row", zebra_stripes=True)

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        section = view.section(report, self.section_id)
        cols, rows = views.table_rows(section)
        self.query_one(".head", Static).update(views.table_head(section, self.empty))
        table = self.query_one(DataTable)
        table.clear(columns=True)
        if not rows:
            return
        table.add_columns(*cols)
        for row in rows:
            table.add_row(*row)


class EnvPane(TablePane):
    """Allowlisted environment; variables that differ across ranks first, marked DIFF."""

    section_id = "env"
    empty = "No environment in the evidence."


class GpuPane(TablePane):
    """One row per GPU; LOOK = a health flag is set, NAMED = a finding names this GPU."""

    section_id = "gpus"
    empty = "No GPU readings in the evidence (nvidia-smi, NVML)."
