"""The history panel: sparklines of examples/s and input wait over the recent steps."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events

from gpuwatch.app import fmt
from gpuwatch.app.widgets.common import is_tall
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.runstate import RunState, recent_window


class HistoryPanel(StatePanel):
    """Sparklines of examples/s and input wait % over the recent steps, with their ranges.

    The figures now are the metrics line's (one value each, RunState.figures): this panel
    shows each step's, so its text is their range, not a second "now".

    One widget of text, not a row of label, sparkline and figure widgets: every widget
    costs the compositor on each repaint of the screen. Built again for a new width.
    """

    LABEL_WIDTH = 7
    VALUE_WIDTH = 30
    TALL_LINES = 4  # the sparklines' height on a tall terminal

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._series: tuple[list[float], list[float]] = ([], [])

    def show_state(self, state: RunState) -> None:
        rates: list[float] = []
        waits: list[float] = []
        for point in state.window:
            if point.warmup:
                continue
            rate, wait = point.event.examples_per_s, point.event.input_wait_pct
            if rate is not None:
                rates.append(rate)
            if wait is not None:  # a script's loop may not let it be measured
                waits.append(wait)
        self._series = (rates, waits)
        self.set_text(self._build(self.size.width))
        # In a cluster the steps are the chief's; the headline's input wait may not be.
        whose = "the chief's " if state.workers > 1 else ""
        show_title(self, f"history: {whose}{recent_window(len(rates))} after warm-up, "
                         "all attempts")

    def on_resize(self, event: events.Resize) -> None:
        self.set_text(self._build(event.size.width))

    def _build(self, width: int) -> Text:
        rates, waits = self._series
        if rates:
            wait_range = (f"range {min(waits):.1f}–{max(waits):.1f}%" if waits
                          else "not measured")
            rows = [
                ("ex/s", rates, "green",
                 f"range {fmt.count(min(rates))}–{fmt.count(max(rates))}"),
                ("wait %", waits, "yellow", wait_range),
            ]
        else:
            rows = [("ex/s", [], "green", "no steps yet"), ("wait %", [], "yellow", "")]
        lines = self.TALL_LINES if is_tall(self) else 1
        room = max(0, width - self.LABEL_WIDTH - 1 - self.VALUE_WIDTH)
        text = Text()
        for label, values, style, figure in rows:
            for line, spark in enumerate(fmt.spark_rows(values, room, lines)):
                if text:
                    text.append("\n")
                text.append(f"{label if line == 0 else '':<{self.LABEL_WIDTH}}", style="dim")
                text.append(spark, style=style)
                if line == 0 and figure:
                    text.append(" ")
                    text.append(figure, style="" if values else "dim")
        return text
