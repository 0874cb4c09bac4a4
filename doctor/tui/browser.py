"""The evidence browser: ranks, stack groups, environment, GPUs, metrics and the agent's trace.

Each pane has ``show(report)``; the text comes from ``doctor.tui.views``.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option

from doctor.engine.report import Report
from doctor.render import view
from doctor.tui import views


class TextPane(VerticalScroll):
    """A scrollable block of text (metrics, trace)."""

    DEFAULT_CSS = "TextPane { height: 1fr; } TextPane > Static { width: 1fr; }"

    def compose(self) -> ComposeResult:
        yield Static("No report yet.", classes="body")

    def set_text(self, text) -> None:  # noqa: ANN001 - str or rich Text
        self.query_one(".body", Static).update(text)


class MetricsPane(TextPane):
    def show(self, report: Report | None) -> None:
        if report is not None:
            self.set_text(views.metric_charts(report.facts, width=max(20, self.size.width - 4 or 70)))


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

    def on_mount(self) -> None:
        self.query_one("#rank-table", DataTable).add_columns("rank", "state", "mark", "stack group",
                                                              "last collective", "host")

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        self.query_one("#rank-grid", Static).update(views.rank_grid(report, width=max(20, (self.size.width or 78) - 2)))
        table = self.query_one("#rank-table", DataTable)
        table.clear()
        for row in views.rank_rows(report):
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
        self.groups: list[view.StackGroup] = []
        self.culprits: set[int] = set()

    def compose(self) -> ComposeResult:
        yield OptionList(id="group-list")
        with VerticalScroll(id="group-detail"):
            yield Static("No report yet.", id="group-text")

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        self.groups = view.stack_groups(report.facts)
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


class EnvPane(Vertical):
    """Allowlisted environment per rank; variables that differ across ranks first, marked DIFF."""

    DEFAULT_CSS = "EnvPane { height: 1fr; } EnvPane #env-head { height: auto; } EnvPane DataTable { height: 1fr; }"

    def compose(self) -> ComposeResult:
        yield Static("", id="env-head")
        yield DataTable(id="env-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one("#env-table", DataTable).add_columns("mark", "variable", "value (per rank when it differs)")

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        rows = views.env_rows(report.facts)
        n_diff = sum(1 for r in rows if r[0])
        env = report.facts.get("env") if isinstance(report.facts.get("env"), dict) else {}
        self.query_one("#env-head", Static).update(
            f"{len(rows)} variable(s) from {env.get('sources', 0)} source(s); {n_diff} differ across ranks "
            "(marked DIFF, listed first)" if rows else "No environment in the evidence.")
        table = self.query_one("#env-table", DataTable)
        table.clear()
        for row in rows:
            table.add_row(*row)


class GpuPane(Vertical):
    """One row per GPU; LOOK = a health flag is set, NAMED = a finding names this GPU."""

    DEFAULT_CSS = "GpuPane { height: 1fr; } GpuPane #gpu-head { height: auto; } GpuPane DataTable { height: 1fr; }"

    def compose(self) -> ComposeResult:
        yield Static("", id="gpu-head")
        yield DataTable(id="gpu-table", cursor_type="row", zebra_stripes=True)

    def show(self, report: Report | None) -> None:
        if report is None:
            return
        cols, rows = views.gpu_rows(report)
        table = self.query_one("#gpu-table", DataTable)
        table.clear(columns=True)
        if not rows:
            self.query_one("#gpu-head", Static).update("No GPU readings in the evidence (nvidia-smi, NVML).")
            return
        self.query_one("#gpu-head", Static).update(
            f"{len(rows)} GPU(s); mark: LOOK = a health flag is set, NAMED = a finding names it")
        table.add_columns(*cols)
        for row in rows:
            table.add_row(*row)
