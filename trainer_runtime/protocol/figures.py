"""The figures a step's fields make: rates, the input-wait share, where its time went.

Each is computed here and nowhere else: ``Step`` and ``StepSummary`` (``events.py``)
read them, and so does everything that shows or sums steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar


def input_wait_pct(input_wait_ms: float, step_time_ms: float) -> float | None:
    """Input wait as a share of step time, in %: the one place this is computed. None
    without a step time, or for a share no float holds (1 ms of a 1e-310 ms step)."""
    if step_time_ms <= 0:
        return None
    pct = 100.0 * input_wait_ms / step_time_ms
    return pct if math.isfinite(pct) else None


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where the time of one step (or of a sum of steps) went, in ms.

    The five parts sum to ``total_ms``: ``other_ms`` is the step time less the four
    measured parts (host work and dispatch between them), never below 0; a step whose
    parts overrun it by float rounding has total_ms = the parts' sum.
    """

    step_ms: float
    input_ms: float
    compute_ms: float
    sync_ms: float
    update_ms: float

    PARTS: ClassVar[tuple[str, ...]] = ("input", "compute", "sync", "update", "other")

    @property
    def other_ms(self) -> float:
        return max(0.0, self.step_ms - self.measured_ms)

    @property
    def measured_ms(self) -> float:
        return self.input_ms + self.compute_ms + self.sync_ms + self.update_ms

    @property
    def total_ms(self) -> float:
        return self.measured_ms + self.other_ms

    def ms(self, part: str) -> float:
        """One part's time: a name from PARTS."""
        return self.other_ms if part == "other" else float(getattr(self, f"{part}_ms"))

    def pct(self, part: str) -> float:
        """One part's share of the step, in %; the five sum to 100."""
        total = self.total_ms
        return 100.0 * self.ms(part) / total if total > 0 else 0.0

    def shares(self) -> dict[str, float]:
        """Every part's share, in %, in PARTS order."""
        return {part: self.pct(part) for part in self.PARTS}

    def __add__(self, other: Breakdown) -> Breakdown:
        """Two steps' (or sums') parts added: the breakdown of their sum."""
        return Breakdown(self.step_ms + other.step_ms, self.input_ms + other.input_ms,
                         self.compute_ms + other.compute_ms, self.sync_ms + other.sync_ms,
                         self.update_ms + other.update_ms)


def sum_breakdowns(parts: Iterable[Breakdown | None]) -> Breakdown | None:
    """The breakdown of several steps together (their sums' shares); steps without one are
    left out; None when none has one."""
    total: Breakdown | None = None
    for part in parts:
        if part is not None:
            total = part if total is None else total + part
    return total


def breakdown(step_time_ms: float, input_wait_ms: float, compute_ms: float | None,
              sync_ms: float | None, update_ms: float | None) -> Breakdown | None:
    """A step's breakdown, or None where a part was not measured (an older trainer, the
    optimizer's own all-reduce) or the step has no time: the one place it is made."""
    if compute_ms is None or sync_ms is None or update_ms is None or step_time_ms <= 0:
        return None
    parts = (step_time_ms, input_wait_ms, compute_ms, sync_ms, update_ms)
    if not all(math.isfinite(v) and v >= 0 for v in parts):
        return None
    return Breakdown(*parts)


def per_second(amount: float, ms: float) -> float | None:
    """`amount` in `ms` milliseconds as a rate per second: the one place a rate (examples/s,
    gradient-sync bytes/s) is computed. None without time, or for a rate no float holds
    (64 examples in a step of 1e-310 ms: finite figures, an infinite rate)."""
    if ms <= 0:
        return None
    rate = amount * 1000.0 / ms
    return rate if math.isfinite(rate) else None
