"""The dashboard's painters: which part of the screen reads which areas, at what rate.

``Repainter`` owns the app's ``RepaintSchedule`` (``repaint.py``, pure) and its one
timer: the app says when the state changed (``schedule``) and it paints the parts that
are due inside one ``batch_update``; ``paint_now`` paints every part with changes (the
first paint, a switch of runs, tests). One figure, one value: a figure shown in more than
one place is taken once per repaint (``advisor.reading``) and every part that shows it
paints from that reading in the same pass. While the plots screen is open nothing else
is painted (Textual would repaint a pushed screen wherever the one below changed); the
parts catch up when it closes. The app is a ``Host`` here, so this module never imports
the app's. The rates: docs/internals.md, "Dashboard".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gpuwatch.advisor import Reading, reading
from gpuwatch.app.repaint import Pace, Painter, Rate, RepaintSchedule
from gpuwatch.app.screens.plots import PlotsScreen
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.gpus import GpuPanel
from gpuwatch.app.widgets.header import HeaderBar
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.scaling import ScalingPanel
from gpuwatch.app.widgets.workers import WorkersPanel

if TYPE_CHECKING:
    from textual.screen import Screen
    from textual.timer import Timer
    from textual.widget import Widget

    from gpuwatch.runstate import RunState

# The run's socket is read at most this often: with a repaint per batch, the screen is
# current within half a second.
READ_INTERVAL_S = 0.4
# The least time between two repaints of a figure: a safety net for a link that is not
# paced (a replay); under READ_INTERVAL_S, so a paced batch never waits for it.
RENDER_INTERVAL_S = READ_INTERVAL_S / 2
# Views that move rather than figures to read: every 2 s, waiting up to SLOW_LATE_S
# more to join a repaint of the figures rather than make one of their own.
SLOW_REPAINT_S = 2.0
SLOW_LATE_S = 0.5
# The elapsed clock (whole seconds): repainted with any repaint at most every half
# second, and by the tick within a second; so it never skips a second.
# While the dashboard is paced (over its CPU budget) the clock too repaints at the pace.
CLOCK = Rate(0.5, late_s=0.5, paced=True)
# The per-GPU history and the plots: at most once a second.
HISTORY_INTERVAL_S = 1.0
# A part due this soon paints with the others now: fewer, fuller repaints.
SLACK_S = 0.05

_W = TypeVar("_W", bound="Widget")


class Host(Protocol):
    """What a Repainter uses of the app whose parts it paints (GpuwatchApp is one)."""

    @property
    def state(self) -> RunState: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def screen(self) -> Screen[object]: ...

    @property
    def default_screen(self) -> Screen[Any]: ...

    @property
    def screen_stack(self) -> Sequence[Screen[Any]]: ...

    def query_one(self, selector: type[_W]) -> _W: ...

    def batch_update(self) -> AbstractContextManager[None]: ...

    def set_timer(self, delay: float, callback: Callable[[], object]) -> Timer: ...

    def show_pending(self) -> None: ...


class Repainter:
    """Paints the app's parts when the areas they read changed, each at its rate."""

    def __init__(
        self,
        app: Host,
        render_interval_s: float = RENDER_INTERVAL_S,
        history_interval_s: float = HISTORY_INTERVAL_S,
        cpu_budget_pct: float | None = None,
    ) -> None:
        self.app = app
        self.render_interval_s = render_interval_s
        self.history_interval_s = history_interval_s
        # The figures' interval, lengthened while the dashboard would take more than its
        # budget of a core (None: no budget, as in tests that time repaints).
        self.pace = Pace(render_interval_s, cpu_budget_pct, floor_s=READ_INTERVAL_S)
        self.pace_clocks = (time.monotonic, time.process_time)  # wall and this process's CPU
        self.schedule = RepaintSchedule(self._painters())
        # Each paced area's own rate (the figures', the histories', the slow views'): the
        # pace lengthens it to the pace's interval, never shortens it.
        self._base_rates = {
            (painter.name, area): rate
            for painter in self.schedule.painters
            for area, rate in painter.areas.items()
            if rate.paced
        }
        self.passes = 0  # repaints that painted something
        self._timer: Timer | None = None
        self._timer_at = 0.0
        self._reading: Reading | None = None  # the figures on screen

    def _painters(self) -> list[Painter]:
        # Figures a person reads as they change; the pace (and only it) slows them, and the
        # views below, while the dashboard would take more than its budget of a core.
        now = Rate(self.render_interval_s, paced=True)
        # What a person did or must see at once (a key's pending change, the link, the run's
        # status): never slowed by the pace.
        at_once = Rate(self.render_interval_s)
        slow = Rate(max(self.render_interval_s, SLOW_REPAINT_S), late_s=SLOW_LATE_S, paced=True)
        # Joining a repaint of the figures too: a timer of its own would repaint the
        # screen once more each second, out of step with the batches.
        history = Rate(self.history_interval_s, late_s=SLOW_LATE_S, paced=True)
        return [
            Painter("header", {"header": at_once, "link": at_once, "clock": CLOCK}, self._header),
            # Every part that shows a figure, from one reading: metrics, advice, workers,
            # devices (a new sample at once too), the GPUs' title. The tick too: "no step
            # for 14 s" counts on while no step comes; the status: an ended run's figures
            # are its last, and its trainer has none.
            Painter(
                "figures",
                {"metrics": now, "attempts": now, "workers": now, "devices": now,
                 "status": at_once, "tick": CLOCK},
                self._figures,
            ),
            Painter("gpus", {"gpu_history": history}, self._gpus),
            Painter("plots", {"plots": history}, self._plots),
            Painter("history", {"history": slow}, self._history),
            # An attempt ending at once; its running figures slowly.
            Painter("attempts", {"status": at_once, "attempts": slow}, self._attempts),
            Painter("crash", {"status": at_once}, self._crash),
            # A scaling probe's table: a count's end at once, its running figures slowly.
            Painter("scaling", {"scaling": now, "status": at_once, "attempts": slow},
                    self._scaling),
            Painter("pending", {"pending": at_once, "link": at_once}, self.app.show_pending),
        ]

    def add(self, painter: Painter) -> None:
        """Another part of the screen (a widget the app adds): it paints at the next pass,
        then whenever an area it reads changes, at its rate."""
        self.schedule.add(painter)
        self.schedule_paint()

    # ---- when --------------------------------------------------------------

    def schedule_paint(self) -> None:
        """Take the state's changes; paint what is due now, and set a timer for the rest."""
        if not self.app.screen_stack:
            return  # shutting down: a timer may still fire after the screens are gone
        self.schedule.note(self.app.state.take_changes())
        due = self.schedule.next_deadline_s()
        if due is not None and due - time.monotonic() <= SLACK_S:
            self._paint(everything=False)
            due = self.schedule.next_deadline_s()  # later than the slack: a timer
        if due is None:
            return
        if self._timer is not None:
            if self._timer_at <= due:
                return
            self._timer.stop()
        self._timer_at = due
        self._timer = self.app.set_timer(max(0.0, due - time.monotonic()), self._on_timer)

    def tick(self) -> None:
        """The clock moved on (once a second): the elapsed time, and, while no step comes,
        how long ("tick": the figures count "no step for 14 s" on; while steps come they
        repaint with them, not with the clock). And the pace: the CPU this process took
        over the last seconds, against its budget."""
        self.schedule.note(("clock",))
        if self.app.state.no_step_for_s(self.app.clock()) is not None:
            self.schedule.note(("tick",))
        wall, cpu = self.pace_clocks
        if self.pace.observe(wall(), cpu()):
            self._set_pace(self.pace.interval_s)
        self.schedule_paint()

    def _set_pace(self, interval_s: float) -> None:
        """The figures (and the histories, the slow views) repaint at most every
        interval_s from now on, or at their own rate where that is longer; back at the
        base pace, at their own rates again. The header says so."""
        base = not self.pace.paced
        for painter in self.schedule.painters:
            own = {area: self._base_rates.get((painter.name, area)) for area in painter.areas}
            if any(own.values()):
                painter.areas = {
                    area: rate if (mine := own[area]) is None
                    else mine if base or mine.every_s >= interval_s
                    else replace(mine, every_s=interval_s)
                    for area, rate in painter.areas.items()
                }
        self.schedule.note(("header",))

    def restart_pace(self) -> None:
        """A burst that says nothing of what a repaint costs (a resize, another screen):
        the pace is judged afresh from now."""
        self.pace.restart(self.pace_clocks[0]())

    def _on_timer(self) -> None:
        self._timer = None
        self.schedule_paint()

    def paint_now(self) -> None:
        """Paint every part whose areas changed, whatever its rate."""
        if self.app.screen_stack:
            self._paint(everything=True)

    def _paint(self, *, everything: bool) -> None:
        self.schedule.note(self.app.state.take_changes())
        self.schedule.note(("clock",))  # the clock rides along with any repaint
        now = time.monotonic()
        due = self.schedule.take_due(now, slack_s=SLACK_S, everything=everything)
        app = self.app
        if isinstance(app.screen, PlotsScreen):
            # The dashboard is hidden: its parts wait (as changed) until it is back.
            for painter in due:
                if painter.name != "plots":
                    painter.pending.update(painter.areas)
                    painter.last_s = now
            due = [painter for painter in due if painter.name == "plots"]
        if not due:
            return
        self.passes += 1
        main = app.default_screen  # the dashboard, even while a modal is on top
        with app.batch_update():
            main.set_class(app.state.workers > 1, "-cluster")
            main.set_class(len(app.state.attempts) > 1, "-compare")
            main.set_class(self.gpus_shown(), "-gpus")
            main.set_class(app.state.scale is not None, "-scale")
            for painter in due:
                painter.paint()

    def pending_areas(self) -> set[str]:
        """The areas some part has not painted yet (tests, and what waits under the plots)."""
        return set().union(*(painter.pending for painter in self.schedule.painters))

    # ---- what ----------------------------------------------------------------

    @property
    def reading(self) -> Reading:
        """The figures on screen (and the straggler and advice made from them)."""
        if self._reading is None:
            self._reading = reading(self.app.state)
        return self._reading

    def _header(self) -> None:
        every_s = self.pace.interval_s if self.pace.paced else None
        self.app.query_one(HeaderBar).show_state(self.app.state, self.app.clock(), every_s)

    def _figures(self) -> None:
        """Take the figures once and paint every part that shows one of them."""
        app, state = self.app, self.app.state
        now = self._reading = reading(state)
        figures = now.figures
        metrics = app.query_one(MetricsPanel)
        taken = metrics.extra_rows
        metrics.show_state(state, figures, app.clock())
        if metrics.extra_rows != taken and self.gpus_shown():
            self._gpus()  # the GPUs' lines give the breakdown its rows, in the same pass
        app.query_one(AdvicePanel).show_advice(now.advice)
        if state.workers > 1:
            app.query_one(WorkersPanel).show_state(
                state, figures.workers, now.straggler, metrics.extra_rows
            )
        if self.gpus_shown():
            app.query_one(GpuPanel).show_sync(state, figures.grad_sync_bytes_per_s)
        else:
            # With no GPU link to compare it with, the estimate says nothing the measured
            # all-reduce does not: shown only where the all-reduce is not timed.
            timed = figures.bus_bytes_per_s is not None
            estimate = None if timed else figures.grad_sync_bytes_per_s
            app.query_one(DevicesPanel).show_state(state, estimate)

    def gpus_shown(self) -> bool:
        """GPU readings: the per-GPU history replaces the devices panel."""
        sample = self.app.state.sample
        return sample is not None and bool(sample.gpus)

    def _gpus(self) -> None:
        if self.gpus_shown():
            sync = self.reading.figures.grad_sync_bytes_per_s
            taken = self.app.query_one(MetricsPanel).extra_rows
            self.app.query_one(GpuPanel).show_state(self.app.state, sync, taken)

    def _plots(self) -> None:
        screen = self.app.screen
        if isinstance(screen, PlotsScreen):  # closed: nothing to draw
            screen.show_state(self.app.state)

    def _history(self) -> None:
        self.app.query_one(HistoryPanel).show_state(self.app.state)

    def _attempts(self) -> None:
        self.app.query_one(AttemptsPanel).show_state(self.app.state)

    def _scaling(self) -> None:
        if self.app.state.scale is not None:
            self.app.query_one(ScalingPanel).show_state(self.app.state)

    def _crash(self) -> None:
        self.app.query_one(CrashPanel).show_state(self.app.state)
        self.app.default_screen.set_class(self.app.state.failed, "-crashed")
