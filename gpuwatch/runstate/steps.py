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
from statistics import NormalDist
from typing import Any

from gpuwatch import peaks
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


def ratio_interval(pairs: Sequence[tuple[float, float]],
                   confidence: float = SHARE_CONFIDENCE) -> tuple[float, float] | None:
    """The `confidence` interval, in %, of the share sum(part) / sum(whole) over steps'
    (part_ms, whole_ms) `pairs`; None with fewer than MIN_SHARE_STEPS or no time.

    The share the verdict states is a ratio of sums, not a per-step median (one long input
    stall among fast steps moves the first, not the second), so its interval is the ratio
    estimator's (Cochran, Sampling Techniques, 6.4): R +- t x sd(part_i - R whole_i) /
    (mean whole x sqrt(n)), Student's t with n - 1 degrees of freedom, cut to 0-100 %.
    It holds the stated share at its middle, assumes the steps independent draws from one
    distribution, needs no resampling (so no seed) and costs two passes over the pairs."""
    count = len(pairs)
    if count < MIN_SHARE_STEPS:
        return None
    part_sum = sum(part for part, _ in pairs)
    whole_sum = sum(whole for _, whole in pairs)
    if whole_sum <= 0:
        return None
    ratio = part_sum / whole_sum
    spread = sum((part - ratio * whole) ** 2 for part, whole in pairs) / (count - 1)
    half = (t_quantile(1.0 - (1.0 - confidence) / 2.0, count - 1)
            * math.sqrt(spread / count) / (whole_sum / count))
    return max(0.0, 100.0 * (ratio - half)), min(100.0, 100.0 * (ratio + half))


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


def recentred_intervals(intervals: Mapping[str, tuple[float, float] | None],
                        shares: Mapping[str, float | None]
                        ) -> dict[str, tuple[float, float] | None]:
    """Intervals taken over some steps (the latest), moved to hold `shares` taken over more
    (an attempt's sums, whose steps are not kept): each keeps its reach either side of its
    own middle, as wide as over the fewer steps (more steps would narrow it, as about
    1/sqrt(steps), if they were alike: this does not assume they are), cut to 0-100 %. A
    part without a share or an interval is left as it is."""
    out = dict(intervals)
    for part, interval in intervals.items():
        share = shares.get(part)
        if interval is None or share is None:
            continue
        reach = (interval[1] - interval[0]) / 2.0
        out[part] = max(0.0, share - reach), min(100.0, share + reach)
    return out
