"""When each part of the dashboard repaints: at most as often as a person can read it.

Plain Python (no Textual), so the rule is unit-tested. A ``Painter`` is one part of
the screen (a panel, a row of figures, a chart): the areas it reads (RunState's
``runstate.AREAS``, or the app's own, like the clock), and for each area a ``Rate``:
the fewest seconds between two repaints that a change of it may cause, and how much
longer it may wait for a repaint that happens anyway. Figures a person reads as they
change (step, loss, rates) repaint at the app's render interval, so the screen is
current within half a second; views that move (history charts, running tables) once
a second, joining a repaint of the figures rather than making one of their own.
Changes to a part that is not due yet wait, coalesced, until it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Rate:
    """How often a change of one area may repaint a part."""

    every_s: float  # at least this long after the part's last repaint
    late_s: float = 0.0  # and it may wait this much longer for a repaint of other parts
    paced: bool = False  # lengthened while the dashboard is over its CPU budget (Pace)


@dataclass
class Painter:
    """One part of the screen: what it reads, how often each read may repaint it, and how."""

    name: str
    areas: Mapping[str, Rate]
    paint: Callable[[], None]
    last_s: float = -math.inf  # when it last painted (monotonic seconds)
    pending: set[str] = field(default_factory=set)  # areas changed since then

    def due_s(self) -> float | None:
        """From when it may repaint, or None while nothing it reads changed."""
        if not self.pending:
            return None
        return self.last_s + min(self.areas[area].every_s for area in self.pending)

    def deadline_s(self) -> float | None:
        """By when it must repaint, even alone, or None while nothing it reads changed."""
        if not self.pending:
            return None
        return self.last_s + min(
            self.areas[area].every_s + self.areas[area].late_s for area in self.pending
        )


class RepaintSchedule:
    """The painters of a screen and the changes each has not painted yet."""

    def __init__(self, painters: Iterable[Painter] = ()) -> None:
        self.painters: list[Painter] = []
        for painter in painters:
            self.add(painter)

    def add(self, painter: Painter) -> None:
        """Add a part; it paints at the next pass (its areas count as changed)."""
        painter.pending.update(painter.areas)
        self.painters.append(painter)

    def note(self, changes: Iterable[str]) -> None:
        """Areas that changed: every painter reading one has it pending."""
        changed = set(changes)
        if not changed:
            return
        for painter in self.painters:
            painter.pending.update(changed.intersection(painter.areas))

    def take_due(
        self, now_s: float, *, slack_s: float = 0.0, everything: bool = False
    ) -> list[Painter]:
        """The painters that may repaint by now_s + slack_s (all with changes: `everything`).

        The slack lets a part that is nearly due paint with the others: one repaint, not
        two in quick succession. Their pending changes are cleared and their time set:
        the caller paints them, in the order they were added.
        """
        due = []
        for painter in self.painters:
            when = painter.due_s()
            if when is None or (when > now_s + slack_s and not everything):
                continue
            painter.pending.clear()
            painter.last_s = now_s
            due.append(painter)
        return due

    def next_deadline_s(self) -> float | None:
        """When the next repaint must happen, or None while no painter has changes."""
        times = [when for painter in self.painters if (when := painter.deadline_s()) is not None]
        return min(times) if times else None


# ---- the CPU budget ----------------------------------------------------------------

# The dashboard's share of one core it holds itself under: a monitor must not compete
# with the job it watches (a 64-host run's record, a 160x48 terminal).
CPU_BUDGET_PCT = 2.0
# Over the budget (HIGH_SHARE of it) it slows down; under LOW_SHARE it speeds up again.
HIGH_SHARE, LOW_SHARE = 1.0, 0.75
# Each step of the interval (up to MAX_PACE_STEP when far over), and its longest: about
# the refresh of top, btop or nvitop.
PACE_STEP = 1.25
MAX_PACE_STEP = 2.0
MAX_INTERVAL_S = 3.0
# CPU is judged over this many seconds, and not before the app has run this long (its
# start-up, the first paint and the record's fold are not what a repaint costs).
PACE_WINDOW_S = 6.0
# Judgements (one a second, each of the last PACE_WINDOW_S) in a row over the budget
# before it slows down.
OVER_JUDGEMENTS = 3


class Pace:
    """How often the figures repaint: as often as the base interval, or less often while
    the dashboard's own CPU time would take more than its budget of a core.

    Fed the process's CPU seconds once a second (``observe``); past PACE_WINDOW_S it
    compares the share of a core taken over the last window with the budget, lengthens
    the interval by PACE_STEP (by up to MAX_PACE_STEP, as far as the share is over)
    while over HIGH_SHARE of it (up to MAX_INTERVAL_S; from
    ``floor_s``, what the base interval comes to where the reads are paced) and shortens
    it again while under LOW_SHARE (back to the base). Plain Python: tested with made-up
    clocks.
    """

    def __init__(
        self, base_s: float, budget_pct: float | None = CPU_BUDGET_PCT, floor_s: float = 0.0
    ) -> None:
        self.base_s = base_s
        self.floor_s = max(base_s, floor_s)  # what the base comes to (reads are paced)
        self.interval_s = base_s
        self.budget_pct = budget_pct
        self._seen: list[tuple[float, float]] = []  # (monotonic s, CPU s), the window's
        self._since_s: float | None = None  # when the window last started afresh
        self.last_pct: float | None = None  # the share of a core over the last window
        self._over = 0  # judgements in a row over the budget

    @property
    def paced(self) -> bool:
        """Slower than the base interval, to keep within the budget."""
        return self.interval_s > self.base_s * 1.01

    def restart(self, now_s: float) -> None:
        """Judge afresh from now (a resize, a screen switch: a burst that says nothing
        of what a repaint costs); the interval stays as it is."""
        self._seen.clear()
        self._since_s = now_s

    def observe(self, now_s: float, cpu_s: float) -> bool:
        """One reading of the clocks; True when the interval changed."""
        if self.budget_pct is None:
            return False
        if self._since_s is None:
            self._since_s = now_s
        self._seen.append((now_s, cpu_s))
        while len(self._seen) > 2 and now_s - self._seen[1][0] >= PACE_WINDOW_S:
            self._seen.pop(0)
        first_s, first_cpu = self._seen[0]
        if now_s - self._since_s < PACE_WINDOW_S or now_s - first_s < PACE_WINDOW_S / 2:
            return False
        pct = 100.0 * (cpu_s - first_cpu) / (now_s - first_s)
        self.last_pct = pct
        before = self.interval_s
        high = self.budget_pct * HIGH_SHARE
        # Over for OVER_JUDGEMENTS in a row: a window that a moment's load on the box tips
        # over is not what the dashboard costs.
        self._over = self._over + 1 if pct > high else 0
        if self._over >= OVER_JUDGEMENTS:
            self._over = 0
            # Far over, a longer step: the cost of repaints goes as 1 / the interval.
            step = min(MAX_PACE_STEP, max(PACE_STEP, pct / high))
            self.interval_s = min(MAX_INTERVAL_S, max(self.interval_s, self.floor_s) * step)
        elif pct < self.budget_pct * LOW_SHARE and self.paced:
            shorter = self.interval_s / PACE_STEP
            self.interval_s = shorter if shorter > self.floor_s * 1.01 else self.base_s
        if self.interval_s == before:
            return False
        # What the last window cost was at the old pace: judge the new one on its own.
        self._seen = [(now_s, cpu_s)]
        self._over = 0
        return True
