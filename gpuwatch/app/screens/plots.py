"""The plots screen (key g): the whole run against step, one colour per attempt.

Four textual-plotext charts drawn from ``RunState.run_history`` (gpuwatch/measures/series.py:
every attempt, coarse over a long run), with a vertical line where each later attempt
starts. Two pages of four, ``t`` flips between them: the run's figures (examples/s,
input wait %, step time, loss) and where each step's time went (the shares of input
wait, compute, all-reduce and update). The app repaints it at most once a second while
it is open; closed, it costs nothing (it is not on the stack).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult, RenderResult
from textual.binding import Binding, BindingType
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Footer
from textual_plotext import PlotextPlot

from gpuwatch.app import keys
from gpuwatch.app.axes import step_axis, value_axis
from gpuwatch.app.widgets.breakdown import part_label
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.measures.series import RunHistory, RunSeries
from gpuwatch.runstate import RunState

# (RunHistory field, chart title), in reading order: the figures, the first page.
CHARTS = (
    ("examples_per_s", "examples/s"),
    ("input_wait_pct", "input wait %"),
    ("step_time_ms", "step time (ms)"),
    ("loss", "loss"),
)
# Where each step's time went (t): each part's share, % of the step (input wait again, so
# the four read together). The all-reduce's label is the dashboard's (a cluster's holds
# waiting for the slowest worker: the legend says so).
TIME_CHARTS = (
    ("input_wait_pct", "input wait %"),
    ("compute_pct", f"{part_label('compute')} %"),
    ("sync_pct", f"{part_label('sync')} %"),
    ("update_pct", f"{part_label('update')} %"),
)
PAGES = {"figures": CHARTS, "time": TIME_CHARTS}
# One colour per attempt (cycled): RGB, so the chart and its legend agree.
PALETTE = (
    (0, 175, 255),
    (255, 135, 0),
    (95, 215, 95),
    (215, 95, 215),
    (255, 215, 0),
    (255, 95, 95),
    (135, 135, 255),
    (0, 215, 175),
)

Points = tuple[list[float], list[float]]


def attempt_colour(attempt: int) -> tuple[int, int, int]:
    return PALETTE[(attempt - 1) % len(PALETTE)]


def series_of(history: RunHistory, key: str) -> RunSeries:
    series = getattr(history, key)
    assert isinstance(series, RunSeries)
    return series


# plotext's rows around a chart's canvas: the title, the frame's top and bottom, the x labels.
CHART_FRAME_ROWS = 4


class StepChart(PlotextPlot):
    """A chart against step whose axes fit its size as it renders (gpuwatch/app/axes.py):
    x ticks on whole steps, y labels on rows an equal number apart."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps: tuple[float, float] | None = None  # the first and last step shown
        self.values: tuple[float, float] | None = None  # the least and greatest value

    def show(self, data: dict[int, Points], marks: list[int]) -> None:
        """What it will draw: each attempt's points, and the steps marked by a line."""
        steps = [x for xs, _ in data.values() for x in xs] + marks
        values = [y for _, ys in data.values() for y in ys if math.isfinite(y)]
        self.steps = (min(steps), max(steps)) if steps else None
        self.values = (min(values), max(values)) if values else None

    def render(self) -> RenderResult:
        plt = self.plt
        if self.steps is None or self.values is None:  # nothing to draw: no ticks either
            plt.xlim(None, None)
            plt.ylim(None, None)
            plt.xticks([], [])  # (plotext's xticks(None) fails once ticks were set)
            plt.yticks([], [])
        else:
            x = step_axis(*self.steps, self.size.width)
            y = value_axis(*self.values, self.size.height - CHART_FRAME_ROWS)
            plt.xlim(x.low, x.high)
            plt.xticks(x.ticks, x.labels)
            plt.ylim(y.low, y.high)
            plt.yticks(y.ticks, y.labels)
        return super().render()


# The dashboard's setting keys work here as they do there, but out of this footer (the
# pending bar they act on is not on this screen): 80 columns hold the plots' own keys and
# the app's way around.
_SETTING_KEYS_UNSHOWN = [
    Binding(b.key, f"app.{b.action}", b.description, show=False, id=f"plots.{b.id}",
            tooltip=b.tooltip)
    for b in (*keys.SETTING_BINDINGS, *keys.PENDING_BINDINGS)
]


class PlotsScreen(Screen[None]):
    """Charts of the whole run, a page of four; t flips the page, g or Esc goes back to the
    dashboard."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "back", id="plots.close", tooltip="Back to the dashboard"),
        Binding("g", "close", "back", id="plots.close_g", show=False, tooltip="Same as Esc"),
        # One key, two pages: the footer shows the one that applies (check_action).
        Binding("t", "page('time')", "time split", id="plots.time",
                tooltip="Where each step's time went: input, compute, all-reduce, update"),
        Binding("t", "page('figures')", "figures", id="plots.figures",
                tooltip="Back to examples/s, input wait, step time and loss"),
        *_SETTING_KEYS_UNSHOWN,
    ]

    def __init__(self, state: RunState, page: str = "figures") -> None:
        super().__init__()
        self._state = state
        self.page = page
        # What each chart was last given, by attempt: (steps, values). Tests read it.
        self.plotted: dict[str, dict[int, Points]] = {}
        self.boundaries: list[tuple[int, int]] = []  # (attempt, its first step), after the first

    @property
    def charts(self) -> tuple[tuple[str, str], ...]:
        """The page's charts: (RunHistory field, title)."""
        return PAGES[self.page]

    def compose(self) -> ComposeResult:
        yield StatePanel(id="plots-legend")
        with Grid(id="plots-grid"):
            for key, _ in self.charts:
                yield StepChart(id=f"plot-{key}", classes="plot")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.show_state(self._state)

    def action_close(self) -> None:
        self.dismiss()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "page":
            return parameters[0] != self.page  # the other page's key, not this one's
        return True

    async def action_page(self, page: str) -> None:
        """Show the other page's charts, drawn at once."""
        self.page = page
        self.plotted = {}
        await self.recompose()
        self.refresh_bindings()
        self.show_state(self._state)

    def show_state(self, state: RunState) -> None:
        """Redraw every chart of the page from the run's history."""
        self._state = state
        history = state.run_history
        starts = sorted(
            (number, summary.first_step)
            for number, summary in state.attempts.items()
            if summary.first_step is not None
        )
        self.boundaries = [(number, step) for number, step in starts[1:]]
        attempts: list[int] = []
        for key, title in self.charts:
            series = series_of(history, key)
            data = {attempt: series.points(attempt) for attempt in series.attempts()}
            attempts.extend(a for a in data if a not in attempts)
            self.plotted[key] = data
            self._draw(key, title, data)
        self._show_legend(sorted(attempts), cluster=state.workers > 1)

    def _draw(self, key: str, title: str, data: dict[int, Points]) -> None:
        plot = self.query_one(f"#plot-{key}", StepChart)
        plt = plot.plt
        plt.clear_data()
        plt.title(title)
        for attempt, (steps, values) in data.items():
            plt.plot(steps, values, color=attempt_colour(attempt), marker="braille")
        for attempt, step in self.boundaries:
            plt.vline(step, color=attempt_colour(attempt))
        plot.show(data, [step for _, step in self.boundaries])
        plot.refresh()

    def _show_legend(self, attempts: list[int], *, cluster: bool = False) -> None:
        """Each attempt's colour, the mark where an attempt starts, what x is (and, in a
        cluster, that the steps are the chief's: the headline's input wait may be another
        worker's)."""
        text = Text()
        if not attempts:
            text.append("no steps yet", style="dim")
        for attempt in attempts:
            r, g, b = attempt_colour(attempt)
            text.append("  " if text else "")
            text.append("━━ ", style=f"bold rgb({r},{g},{b})")
            text.append(f"attempt {attempt}")
        if self.boundaries:
            text.append("  │ attempt starts", style="dim")
        if self.page == "time":
            text.append(" · x: step · y: % of each step", style="dim")
        else:
            text.append(" · x: step · timings after warm-up", style="dim")
        if cluster:
            text.append(" · the chief's steps", style="dim")
            if self.page == "time":
                text.append(f" ({part_label('sync', cluster=True)})", style="dim")
        self.query_one("#plots-legend", StatePanel).set_text(text)
