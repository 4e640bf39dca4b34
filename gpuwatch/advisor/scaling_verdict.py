"""Poor scaling (pure): the verdict over a scaling probe's counts (``poor_scaling``), not
over one attempt's figures; the probe's panel and its headless output show it beside the
current attempt's (``advise``). Efficiency is a noisy figure: the verdict rests on its
interval (``findings.interval_side``), and says "not enough steps to tell" when the
interval straddles the line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuwatch.advisor.evidence import STEPS_PER_EXECUTION_KEY
from gpuwatch.advisor.findings import MAX_RECOMMENDATIONS, Advice, Remedy, interval_side
from gpuwatch.measures.scaling import (
    CONFIDENCE,
    MAX_STEPS,
    MIN_INTERVAL_STEPS,
    ScalingRow,
    efficiency_words,
    pct_range,
)
from gpuwatch.runstate import ACCUMULATION_KEY, BATCH_KEY, PREFETCH_KEY, WARMUP_STEPS
from trainer_runtime.protocol import Scale

# Poor scaling (gpuwatch scale): a probe's efficiency, X(N) x b / (N x X(b)), below this at
# some count is poor: at 80 %, a fifth of every added device's work is lost to what grew
# with the count. The part of the step that grew most is named, with its remedies.
POOR_SCALING_EFFICIENCY = 0.80
# What to try when a part of the step grew with the count, with the dashboard's keys.
SCALING_REMEDIES: dict[str, tuple[Remedy, ...]] = {
    "sync": (
        Remedy("the all-reduce grew with the devices: accumulation (a) syncs once per k "
               "micro-steps", "a", ACCUMULATION_KEY),
        Remedy("a bigger per-replica batch (b) does more work per all-reduce", "b", BATCH_KEY),
    ),
    "input": (
        Remedy("the input grew: every replica reads its own batches; prefetch (p) reads the "
               "next ones while a step runs", "p", PREFETCH_KEY),
        Remedy("parallel reads (data.parallel_calls) keep more replicas fed", None,
               "data.parallel_calls"),
    ),
    "compute": (
        Remedy("compute per example grew: the replicas contend for hardware they share "
               "(cores, memory bandwidth, a PCIe switch)"),
    ),
    "update": (
        Remedy("the optimizer update grew: it runs on every replica each step; a bigger "
               "per-replica batch (b) runs it less often per example", "b", BATCH_KEY),
    ),
    "other": (
        Remedy("host work and dispatch grew: more devices to launch each step; "
               "train.steps_per_execution runs several steps per call", None,
               STEPS_PER_EXECUTION_KEY),
    ),
}
# How many more steps might tell: the interval narrows about as 1/sqrt(steps), and the
# figure itself moves as it does, so the steps at which the interval would reach only
# 1 / STEPS_MARGIN of the way to the line. With 1.5, 26 of 34 noisy probes (30 steps,
# truly 70 %, steps 30 % apart) that could not tell could at the steps suggested; with
# 1.0, 20 of 35 (tests/measures/test_scaling.py builds such probes).
STEPS_MARGIN = 1.5
SCALING_PART_NAMES = {"input": "input wait", "compute": "compute", "sync": "all-reduce",
                      "update": "optimizer update", "other": "host and dispatch"}


def poor_scaling(rows: Sequence[ScalingRow], plan: Scale) -> Advice | None:
    """A scaling probe's verdict (gpuwatch/measures/scaling.py's rows), on each count's efficiency
    interval against POOR_SCALING_EFFICIENCY (``interval_side``): level "poor" when some
    count's interval is all below it, naming the part of the step that grew most from the
    smallest count to the worst such count, with its remedies; "good" when every count's
    interval is at or above it; else "unknown", "not enough steps to tell (X-Y%)", with
    the interval of the count that straddles the line (the lowest, if several) and how
    many steps might tell. None with fewer than two counts measured.

    A part's growth is its device time per example: share x count / examples/s. Perfect
    scaling keeps each part's constant, in weak and strong scaling alike, and the parts'
    growths add up to what the efficiency lost. Counts whose logical CPU replicas share
    fewer cores are said first: they measure the cores, not scaling.

    A verdict over a probe's counts, not over one attempt's figures: the probe's panel and
    headless output show it beside the current attempt's (``advise``).
    """
    measured = [row for row in rows if row.examples_per_s and row.efficiency is not None]
    if len(measured) < 2:
        return None
    base, others = measured[0], measured[1:]
    sides = [(row, interval_side(row.efficiency_interval, POOR_SCALING_EFFICIENCY))
             for row in others]
    below = [row for row, side in sides if side == "below"]
    unsure = [row for row, side in sides if side is None]
    level = "poor" if below else "unknown" if unsure else "good"
    worst = min(below or unsure or others, key=lambda row: row.efficiency or 0.0)
    efficiency = worst.efficiency or 0.0
    unit = plan.unit
    line = f"{POOR_SCALING_EFFICIENCY:.0%}"
    remedies: list[Remedy] = []
    if any(row.shares_cores for row in measured):
        cores = f"{plan.cores} core" + ("s" if plan.cores != 1 else "")
        remedies.append(Remedy(f"{worst.count} {unit} share {cores}: not a real "
                               "scaling measure (run it where every replica has its own "
                               "device)"))

    def advice(verdict: str) -> Advice:
        kept = tuple(remedies[:MAX_RECOMMENDATIONS])
        return Advice(level, verdict, None, [r.text for r in kept], bottleneck="scaling",
                      share_pct=100.0 * efficiency, remedies=kept)

    if level == "good":
        return advice(f"scales well: {efficiency_words(worst)} efficiency at {worst.count} "
                      f"{unit} (at least {line})")
    if level == "unknown":
        remedies.append(more_steps(worst, base, plan))
        interval = worst.efficiency_interval
        if interval is None:
            return advice(f"not enough steps to tell (an interval needs {MIN_INTERVAL_STEPS} "
                          f"measured steps a count): {efficiency:.0%} efficiency at "
                          f"{worst.count} {unit}")
        return advice(f"not enough steps to tell ({pct_range(interval)}): {efficiency:.0%} "
                      f"efficiency at {worst.count} {unit}, its {CONFIDENCE:.0%} interval "
                      f"across the {line} line")
    verdict = (f"poor scaling: {efficiency_words(worst)} efficiency at {worst.count} {unit} "
               f"(below {line})")
    before, after = base.shares, worst.shares
    if before is None or after is None or not base.examples_per_s or not worst.examples_per_s:
        remedies.append(Remedy("the step's parts are not timed apart: which one grew is not "
                               "known"))
        return advice(verdict)

    def device_ms_per_example(shares: dict[str, float], count: int, rate: float,
                              part: str) -> float:
        return shares[part] / 100.0 * count / rate * 1000.0

    growth = {
        part: device_ms_per_example(after, worst.count, worst.examples_per_s, part)
        - device_ms_per_example(before, base.count, base.examples_per_s, part)
        for part in before
    }
    part = max(growth, key=lambda name: growth[name])
    verdict += (f"; {SCALING_PART_NAMES[part]} grew most: {before[part]:.0f}% of the step at "
                f"{base.count} to {after[part]:.0f}% at {worst.count}")
    remedies.extend(SCALING_REMEDIES[part])
    return advice(verdict)


def steps_to_tell(row: ScalingRow, base: ScalingRow) -> int | None:
    """About how many steps per count (warm-up included) might put `row`'s efficiency
    interval on one side of the line: an interval narrows about as 1/sqrt(steps), so the
    measured steps x (STEPS_MARGIN x the interval's reach towards the line / the figure's
    distance to it)**2. An estimate from noisy figures: it may fall short. None when the
    figure sits on the line (no number of steps may tell) or it is past MAX_STEPS."""
    if row.efficiency is None:
        return None
    measured = min(row.measured_steps, base.measured_steps)
    if row.efficiency_interval is None or measured < MIN_INTERVAL_STEPS:
        return WARMUP_STEPS + max(MIN_INTERVAL_STEPS, 2 * measured)
    low, high = row.efficiency_interval
    distance = abs(row.efficiency - POOR_SCALING_EFFICIENCY)
    reach = row.efficiency - low if row.efficiency >= POOR_SCALING_EFFICIENCY else (
        high - row.efficiency)
    if distance <= 0.0 or reach <= 0.0:
        return None
    steps = WARMUP_STEPS + math.ceil(measured * (STEPS_MARGIN * reach / distance) ** 2)
    return steps if steps <= MAX_STEPS else None


def more_steps(row: ScalingRow, base: ScalingRow, plan: Scale) -> Remedy:
    """What might tell, for a count whose interval straddles the line: more steps."""
    steps = steps_to_tell(row, base)
    if steps is None:
        return Remedy(f"{row.count} {plan.unit} sit on the {POOR_SCALING_EFFICIENCY:.0%} "
                      "line: more steps narrow the interval but may never tell")
    return Remedy(f"more steps narrow the interval (about as 1/sqrt(steps)): --steps {steps} "
                  f"(now {plan.steps}) might tell")
