"""A step as the dashboard holds it, and the figures taken over several steps (pure).

``StepPoint`` wraps the trainer's ``protocol.Step``. The helpers here are what every
figure over steps is made with: input wait % as a ratio of sums
(``steps_input_wait_pct``), medians (plain, and weighted by the steps a summary stands
for), the worker that sets a cluster's pace (``pace_setter``), and the all-reduce's bus
bandwidth and its share of the link (``bus_bandwidth``, ``share_of_link``), and the
confidence interval of a share that is a ratio of sums (``share_intervals``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist
from typing import Any

from gpuwatch.measures import peaks
from trainer_runtime.protocol import Breakdown, Step, input_wait_pct, per_second

# The first steps of every attempt include tf.function tracing: never measure them.
WARMUP_STEPS = 5
# A share's interval (share_intervals): its confidence, and the fewest steps it is taken
# from (fewer leave too few residuals to estimate their spread, and t_quantile's
# expansion is good from 3 degrees of freedom on).
SHARE_CONFIDENCE = 0.95
MIN_SHARE_STEPS = 4


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


@cache
def t_quantile(probability: float, df: int) -> float:
    """Student's t quantile, by the Cornish-Fisher expansion of the normal's (Abramowitz and
    Stegun 26.7.5): within 0.2 % of the exact value from 3 degrees of freedom on (3.179
    for 3.182 at 97.5 %, df 3; 2.093 at df 19)."""
    z = NormalDist().inv_cdf(probability)
    nu = float(df)
    return (z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * nu**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z)
            / (92160 * nu**4))


@dataclass
class RatioSums:
    """What the share sum(part) / sum(whole) and its interval need of any number of steps,
    kept as five sums (one step added in O(1)): an attempt's whole run of steps, whose
    steps are not kept."""

    count: int = 0
    part: float = 0.0
    whole: float = 0.0
    part_sq: float = 0.0
    whole_sq: float = 0.0
    cross: float = 0.0

    def add(self, part: float, whole: float) -> None:
        self.count += 1
        self.part += part
        self.whole += whole
        self.part_sq += part * part
        self.whole_sq += whole * whole
        self.cross += part * whole

    def interval(self, confidence: float = SHARE_CONFIDENCE) -> tuple[float, float] | None:
        """The `confidence` interval, in %, of the share; None with fewer than
        MIN_SHARE_STEPS steps or no time.

        The share the verdict states is a ratio of sums, not a per-step median (one long
        input stall among fast steps moves the first, not the second), so its interval is
        the ratio estimator's (Cochran, Sampling Techniques, 6.4): R +- t x sd(part_i - R
        whole_i) / (mean whole x sqrt(n)), Student's t with n - 1 degrees of freedom, cut
        to 0-100 %. The residuals' sum of squares comes from the five sums: sum(part^2) -
        2R sum(part whole) + R^2 sum(whole^2). It holds the stated share at its middle,
        assumes the steps independent draws from one distribution and needs no
        resampling (so no seed)."""
        count = self.count
        if count < MIN_SHARE_STEPS or self.whole <= 0:
            return None
        ratio = self.part / self.whole
        residual = self.part_sq - 2.0 * ratio * self.cross + ratio * ratio * self.whole_sq
        if residual <= 1e-9 * self.part_sq:  # steps alike: what is left is rounding
            residual = 0.0
        spread = residual / (count - 1)
        half = (t_quantile(1.0 - (1.0 - confidence) / 2.0, count - 1)
                * math.sqrt(spread / count) / (self.whole / count))
        return max(0.0, 100.0 * (ratio - half)), min(100.0, 100.0 * (ratio + half))


def ratio_interval(pairs: Iterable[tuple[float, float]],
                   confidence: float = SHARE_CONFIDENCE) -> tuple[float, float] | None:
    """The `confidence` interval, in %, of sum(part) / sum(whole) over steps' (part_ms,
    whole_ms) `pairs` (``RatioSums.interval``); one pass over them."""
    sums = RatioSums()
    for part, whole in pairs:
        sums.add(part, whole)
    return sums.interval(confidence)


def share_intervals(points: Sequence[StepPoint]) -> dict[str, tuple[float, float] | None]:
    """Each share's interval (``ratio_interval``) over the steps `points`: "input" from the
    steps whose input wait was measured (as ``steps_input_wait_pct``), the breakdown's other
    parts from the steps timed apart (as ``sum_breakdowns``). A part no step measured is
    left out; one with too few steps is None. One pass over the points per part: five
    passes over at most CURRENT_STEPS steps on a repaint."""
    out: dict[str, tuple[float, float] | None] = {}
    waits = [(p.input_wait_ms, p.step_time_ms) for p in points if p.input_wait_ms is not None]
    if waits:
        out["input"] = ratio_interval(waits)
    timed = [b for p in points if (b := p.event.breakdown) is not None]
    if timed:
        for part in Breakdown.PARTS:
            if part != "input":
                out[part] = ratio_interval([(b.ms(part), b.total_ms) for b in timed])
    return out


