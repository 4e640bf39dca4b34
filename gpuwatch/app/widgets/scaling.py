"""A scaling probe's panel (gpuwatch scale): its table, and a small plot of efficiency.

Shown instead of the attempts table and the history on a probe's run (the screen's
``-scale`` class). The rows and every figure in them are gpuwatch/measures/scaling.py's
(``scaling_rows``, ``cells``); the verdict under them is the advisor's
(``poor_scaling``). The plot reuses the plots screen's chart (``StepChart``: whole numbers
on x, evenly spaced labels on y): efficiency in % against the device count, from 0, with
the ideal 100 % drawn across.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal

from gpuwatch.advisor import poor_scaling
from gpuwatch.app.screens.plots import StepChart
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.measures.scaling import ScalingRow, cells, describe, scaling_rows, shared_cores_note
from gpuwatch.runstate import ATTEMPT_WINDOW, RunState
from trainer_runtime.protocol import Breakdown, Scale

# The table's columns: (head, cell key, width); the batch, the efficiency's interval and
# the state only where the width allows (a row without a figure says its state in the ex/s
# column anyway; the verdict under the table gives its count's interval at any width).
COLUMNS = (
    ("ex/s", "examples_per_s", 7),
    ("speed", "speedup", 5),
    ("eff", "efficiency", 4),
    *((head, part, 4) for head, part in (("in", "input"), ("comp", "compute"),
                                         ("sync", "sync"), ("upd", "update"),
                                         ("oth", "other"))),
)
BATCH_COLUMN = ("batch", "batch", 6)
INTERVAL_COLUMN = ("interval", "efficiency_interval", 8)
STATE_WIDTH = 18
# A row's state in the ex/s column's 7 characters, when it has no figure.
STATE_WORDS = {"no steps measured": "0 steps"}
LEVEL_STYLE = {"poor": "bold yellow", "good": "green"}
IDEAL = (95, 95, 95)  # the 100 % line: grey
MEASURED = (0, 175, 255)  # the plots screen's first colour


class EfficiencyChart(StepChart):
    """Efficiency (%) against the device count: each measured count, and the ideal 100 %."""

    points: tuple[list[float], list[float]] = ([], [])  # what it was last given (tests)

    def show_rows(self, rows: list[ScalingRow], unit: str) -> None:
        measured = [row for row in rows if row.efficiency is not None]
        counts = [float(row.count) for row in measured]
        values = [100.0 * (row.efficiency or 0.0) for row in measured]
        self.points = (counts, values)
        plt = self.plt
        plt.clear_data()
        plt.title(f"efficiency % / {unit}")
        every = [row.count for row in rows]
        plt.hline(100.0, color=IDEAL)
        if counts:
            plt.plot(counts, values, color=MEASURED, marker="braille")
            plt.scatter(counts, values, color=MEASURED, marker="●")
        self.show({1: (counts, values)}, every)
        # From 0 to the ideal (or above it): a fall reads as far as it is.
        self.values = (0.0, max([100.0, *values])) if every else None
        self.refresh()


class ScalingPanel(Horizontal):
    """The probe's table (a row per count) beside its efficiency plot."""

    _last_state: RunState | None = None

    def compose(self) -> ComposeResult:
        yield StatePanel(id="scaling-table")
        yield EfficiencyChart(id="scaling-chart")

    def on_resize(self) -> None:
        """The table's columns follow its width: lay it out again at the new one."""
        shown = self._last_state
        if shown is not None:
            self.call_after_refresh(lambda: self.show_state(shown))

    def show_state(self, state: RunState) -> None:
        plan = state.scale
        if plan is None:
            return
        self._last_state = state
        rows = scaling_rows(state)
        table = self.query_one("#scaling-table", StatePanel)
        width = table.content_size.width or 48
        table.set_text(table_text(plan, rows, width, running=state.attempt))
        self.query_one(EfficiencyChart).show_rows(rows, plan.unit)
        # Its window first, where 80 columns still show it: each row is a count's attempt.
        show_title(self, f"scaling ({ATTEMPT_WINDOW} medians): {describe(plan)}")


def table_text(plan: Scale, rows: list[ScalingRow], width: int, *, running: int = 0) -> Text:
    """The table as the panel shows it: a row per count (the batch and state columns where
    they fit; a row cut to `width`), the shared-cores note and the advisor's verdict."""
    columns: list[tuple[str, str, int]] = list(COLUMNS)
    wide = len(plan.unit) + sum(
        w + 1 for _, _, w in (*columns, BATCH_COLUMN, INTERVAL_COLUMN)) + STATE_WIDTH
    count_head = plan.unit if wide <= width else {"replicas": "reps", "workers": "wkrs"}.get(
        plan.unit, plan.unit)
    if wide <= width:
        columns.insert(0, BATCH_COLUMN)
        columns.insert(columns.index(("eff", "efficiency", 4)) + 1, INTERVAL_COLUMN)
    count_width = len(count_head)
    text = Text()
    head = f"{count_head:>{count_width}}" + "".join(f" {h:>{w}}" for h, _, w in columns)
    text.append(head + ("  state" if wide <= width else ""), style="bold")
    for row in rows:
        cell = cells(row)
        if row.examples_per_s is None:
            cell["examples_per_s"] = STATE_WORDS.get(row.state, row.state)[:7]
        line = f"{cell['count']:>{count_width}}" + "".join(
            f" {cell[key]:>{w}}" for _, key, w in columns)
        if wide <= width:
            line += f"  {row.state}"
        style = "bold" if row.attempt == running and row.state == "running" else ""
        if row.failed:
            style = "red"
        text.append("\n")
        text.append(line[:width], style=style)
    notes: list[tuple[str, str]] = []
    note = shared_cores_note(plan, rows)
    if note:
        notes.append((note, "yellow"))
    if all(row.breakdown is None for row in rows):
        parts = ", ".join(Breakdown.PARTS)
        notes.append((f"step parts ({parts}): - until the trainer times them", "dim"))
    verdict = poor_scaling(rows, plan)
    if verdict is not None:
        notes.append((verdict.verdict, LEVEL_STYLE.get(verdict.level, "")))
        # Shared cores come first in its advice: the note above says so already.
        recs = verdict.recommendations[1:] if note else verdict.recommendations
        notes.extend((f"→ {rec}", "") for rec in recs)
    for words, style in notes:  # these wrap; the rows are cut
        text.append("\n")
        text.append(words, style=style)
    return text
