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
