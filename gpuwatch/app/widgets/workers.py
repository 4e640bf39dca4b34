"""The workers panel: every worker of a cluster run, slowest first, and the straggler."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich.text import Text

from gpuwatch.advisor import Straggler
from gpuwatch.app import fmt
from gpuwatch.app.widgets.breakdown import look, pct_cell
from gpuwatch.app.widgets.common import is_tall, is_wide, plural
from gpuwatch.app.widgets.devices import device_summary
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.runstate import WORKER_WINDOW_STEPS, RunState, WorkerSummary, recent_window


def slowest_first(rows: list[WorkerSummary]) -> list[WorkerSummary]:
    """Failed workers, then the longest own work per step (input wait + compute), then index."""

    def key(row: WorkerSummary) -> tuple[int, float, int]:
        busy = row.busy_ms
        return (row.status not in ("error", "crashed"), -(busy if busy is not None else -1.0),
                row.worker)

    return sorted(rows, key=key)


# The strip of every worker: a cell's own work per step (input wait + compute) over the
# median worker's: (at most this ratio, its mark, its style).
STRIP_LEVELS = ((1.1, "▁", "green"), (1.25, "▃", "green"), (1.5, "▅", "yellow"),
                (float("inf"), "█", "bold red"))


def worker_strip(rows: Sequence[WorkerSummary], cells: int) -> Text:
    """Every worker at a glance, by index, in at most `cells` cells (a cell holds the worst
    of its workers when there are more): how much longer its own work per step is than
    the median worker's (▁ ▃ ▅ █), ✗ a failed worker, · not measured yet."""
    ordered = sorted(rows, key=lambda row: row.worker)
    busy = sorted(b for row in ordered if (b := row.busy_ms) is not None and row.measured)
    median = busy[len(busy) // 2] if busy else None
    per_cell = max(1, -(-len(ordered) // max(1, cells)))
    strip = Text()
    for first in range(0, len(ordered), per_cell):
        group = ordered[first:first + per_cell]
        if any(row.status in ("error", "crashed") for row in group):
            strip.append("✗", style="bold red")
            continue
        ratios = [b / median for row in group
                  if median and row.measured and (b := row.busy_ms) is not None]
        if not ratios:
            strip.append("·", style="dim")
            continue
        worst = max(ratios)
        mark, style = next((m, st) for limit, m, st in STRIP_LEVELS if worst <= limit)
        strip.append(mark, style=style)
    return strip


class WorkersPanel(StatePanel):
    """Every worker of a cluster run, slowest first, as many as fit, and the straggler.

    Where the workers' steps are timed apart, each row has its shares of compute and of
    the all-reduce ("sync": it holds the wait for the slowest worker, so the straggler's
    is the least) instead of its compute time; update and other too at 120 columns.

    A row's figures are over its worker's latest steps after warm-up, and the title says
    how many ("last 20 steps"; a summarizing worker's summaries cover at least that).
    """

    # What "sync" holds, in the title: the short words where the long do not fit.
    SYNC_NOTES = (" · sync: all-reduce incl. wait for the slowest",
                  " · sync: all-reduce + wait for slowest")

    HOST_CHARS = 10

    _last: tuple[RunState, Sequence[WorkerSummary], Straggler | None, int] | None = None

    def on_resize(self) -> None:
        """The title and the straggler's lines fit the new width (the first show comes
        before the panel is laid out: a cluster's class shows it)."""
        if self._last is not None:
            self.show_state(*self._last)

    def show_state(
        self, state: RunState, workers: Sequence[WorkerSummary], straggler: Straggler | None,
        taken_rows: int = 0,
    ) -> None:
        """workers: the figures' (RunState.figures), so each row is the value shown elsewhere.
        taken_rows: rows the panels above took beyond their own (the metrics' breakdown):
        on a short screen as many fewer workers are listed, so nothing below is cut off."""
        self._last = (state, workers, straggler, taken_rows)
        rows = slowest_first(list(workers))
        text = Text()
        tall = is_tall(self)
        wide = is_wide(self)
        # The parts each row shows: its compute and all-reduce shares (and at 120 columns
        # its update and other), once any worker's steps were timed apart.
        parts: tuple[str, ...] = ()
        if any(row.breakdown is not None for row in rows):
            parts = ("compute", "sync", "update", "other") if wide else ("compute", "sync")
        header = f"{'w':>2} {'host':<{self.HOST_CHARS}} {'rep':>3} {'step':>8} {'wait':>6}"
        if parts:
            header += "".join(f" {look(part).short:>4}" for part in parts)
        else:
            header += f" {'compute':>8}"
        header += f" {'ex/s':>7} {'status':<7} device"
        text.append(header, style="bold")
        keep = 12 if tall else max(1, 4 - taken_rows)
        # After a crash the log tail needs the rows: the failed worker (first) and a count.
        crashed_short = state.failed and not tall
        if crashed_short:
            keep = 1
        shown = rows if len(rows) <= keep + 1 else rows[:keep]
        for row in shown:
            host = row.host or "?"
            if len(host) > self.HOST_CHARS:
                host = host[: self.HOST_CHARS - 1] + "…"
            line = f"{row.worker:>2} {host:<{self.HOST_CHARS}} {row.replicas or '?'!s:>3}"
            line += f" {fmt.ms(row.step_time_ms):>8} {fmt.pct(row.input_wait_pct):>6}"
            if parts:
                line += "".join(f" {pct_cell(row.breakdown, part):>4}" for part in parts)
            else:
                line += f" {fmt.ms(row.compute_ms):>8}"
            line += f" {fmt.count(row.examples_per_s):>7}"
            style = "bold red" if row.status in ("error", "crashed") else ""
            if straggler is not None and row.worker == straggler.worker:
                style = style or "bold yellow"
            status = row.status
            if state.terminal and status in ("starting", "running"):
                status = "ended"  # the run ended with it (one lost worker ends them all)
            text.append("\n" + line)
            text.append(f" {status:<7}", style=style)
            text.append(f" {device_summary(row.sample, wide)}")
        if len(shown) < len(rows):
            hidden = len(rows) - len(shown)
            more = f"… and {hidden} more"
            cells = (self.content_size.width or 78) - len(more) - 1
            if len(rows) > 8 and cells >= 16:
                # Every worker at a glance, by index (worker_strip), after the count.
                text.append(f"\n{more} ", style="dim")
                text.append_text(worker_strip(rows, cells))
            else:
                text.append(f"\n… and {plural(hidden, 'more worker')}", style="dim")
        if not rows:
            text.append("\nno worker has said hello yet", style="dim")
        if straggler is not None and not crashed_short:
            # Wrapped here, at word breaks, so every line fits: a line the panel would wrap
            # itself makes each repaint a new layout of the whole screen.
            width = self.content_size.width  # 0 before the first layout: one line then
            for line in textwrap.wrap(straggler.message, width) if width else [straggler.message]:
                text.append("\n" + line, style="bold yellow")
        title = f"workers: {len(rows)}, slowest first"
        over = max((row.measured_steps for row in rows if row.measured), default=0)
        if over:  # the rows' window: a summarizing worker's covers a few more steps
            title += f", {recent_window(min(over, WORKER_WINDOW_STEPS))}"
        if parts:  # the all-reduce's time holds the wait for the slowest: said once, here
            room = (self.size.width or 80) - 2
            title += next((note for note in self.SYNC_NOTES if len(title + note) <= room),
                          self.SYNC_NOTES[-1])
        show_title(self, title)
        self.set_text(text)
