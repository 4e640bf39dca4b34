"""A step as the dashboard holds it, and the figures taken over several steps (pure).

``StepPoint`` wraps the trainer's ``protocol.Step``. The helpers here are what every
figure over steps is made with: input wait % as a ratio of sums
(``steps_input_wait_pct``), medians (plain, and weighted by the steps a summary stands
for), the worker that sets a cluster's pace (``pace_setter``), and the all-reduce's bus
bandwidth and its share of the link (``bus_bandwidth``, ``share_of_link``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch import peaks
from trainer_runtime.protocol import Breakdown, Step, input_wait_pct, per_second

# The first steps of every attempt include tf.function tracing: never measure them.
WARMUP_STEPS = 5


@dataclass(frozen=True, slots=True)
class StepPoint:
    """A step as the dashboard holds it: the trainer's Step, when it ended, and whether
    it was one of its attempt's first WARMUP_STEPS (tracing, never measured).

    The step's fields are the protocol's (``protocol.Step``), read through: this class
    lists none of them.
    """

    event: Step
    t: float | None = None
    warmup: bool = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.event, name)


def steps_input_wait_pct(steps: Iterable[StepPoint]) -> float | None:
    """Input-wait % over several steps: sum(input_wait_ms) / sum(step_time_ms), over the
    steps whose input wait was measured (None: none was; a script's loop may not let it)."""
    points = [p for p in steps if p.input_wait_ms is not None]
    if not points:
        return None
    return input_wait_pct(
        sum(p.input_wait_ms for p in points), sum(p.step_time_ms for p in points)
    )


def pace_setter(values: Mapping[int, float | None]) -> tuple[int, float] | None:
    """(worker, its figure) of the worker whose figure is largest (a tie: the lowest index).

    None when no worker has the figure. Under synchronous training every step waits for
    the slowest worker: a cluster's input wait is the largest of its workers' (the
    current figures, each attempt's), and the straggler rule (advisor.find_straggler)
    takes its candidate from here too.
    """
    known = [(worker, float(value)) for worker, value in values.items() if value is not None]
    if not known:
        return None
    return max(known, key=lambda pair: (pair[1], -pair[0]))


def weighted_median(pairs: Iterable[tuple[float | None, int]]) -> float | None:
    """The median of values that each stand for `count` steps (summaries' medians): the
    value at which half the steps are covered. None without any."""
    known = sorted((value, count) for value, count in pairs if value is not None and count > 0)
    half = sum(count for _, count in known) / 2.0
    covered = 0
    for value, count in known:
        covered += count
        if covered >= half:
            return value
    return None


def median_value(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def share_of_link(bus_bytes_per_s: float | None, link: peaks.LinkPeak | None) -> float | None:
    """A bus bandwidth as a % of the link's peak; None when either is not known."""
    if link is None or bus_bytes_per_s is None or link.bytes_per_s <= 0:
        return None
    return 100.0 * bus_bytes_per_s / link.bytes_per_s


def bus_bandwidth(sync_bytes: float, timed: Breakdown | None) -> float | None:
    """Bus bandwidth as nccl-tests defines it: bytes all-reduced x 2(n-1)/n (a step's
    ``grad_sync_bytes``) over the all-reduce time, in bytes/s; None with no time or bytes."""
    if timed is None or sync_bytes <= 0:
        return None
    return per_second(sync_bytes, timed.sync_ms)
