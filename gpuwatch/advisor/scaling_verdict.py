"""Poor scaling (pure): the verdict over a scaling probe's counts (``poor_scaling``), not
over one attempt's figures; the probe's panel and its headless output show it beside the
current attempt's (``advise``).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.advisor.evidence import STEPS_PER_EXECUTION_KEY
from gpuwatch.advisor.findings import MAX_RECOMMENDATIONS, Advice, Remedy
from gpuwatch.runstate import ACCUMULATION_KEY, BATCH_KEY, PREFETCH_KEY
from gpuwatch.scaling import ScalingRow
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
SCALING_PART_NAMES = {"input": "input wait", "compute": "compute", "sync": "all-reduce",
                      "update": "optimizer update", "other": "host and dispatch"}


def poor_scaling(rows: Sequence[ScalingRow], plan: Scale) -> Advice | None:
    """A scaling probe's verdict (gpuwatch/scaling.py's rows): level "poor" when a count's
    efficiency is below POOR_SCALING_EFFICIENCY, naming the part of the step that grew most
    from the smallest count to it, with its remedies; "good" otherwise; None with fewer than
    two counts measured.

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
    base = measured[0]
    worst = min(measured[1:], key=lambda row: row.efficiency or 0.0)
    efficiency = worst.efficiency or 0.0
    unit = plan.unit
    remedies: list[Remedy] = []
    if any(row.shares_cores for row in measured):
        cores = f"{plan.cores} core" + ("s" if plan.cores != 1 else "")
        remedies.append(Remedy(f"{worst.count} {unit} share {cores}: not a real "
                               "scaling measure (run it where every replica has its own "
                               "device)"))

    def advice(level: str, verdict: str) -> Advice:
        kept = tuple(remedies[:MAX_RECOMMENDATIONS])
        return Advice(level, verdict, None, [r.text for r in kept], bottleneck="scaling",
                      share_pct=100.0 * efficiency, remedies=kept)

    if efficiency >= POOR_SCALING_EFFICIENCY:
        return advice("good", f"scales well: {efficiency:.0%} efficiency at {worst.count} "
                              f"{unit} (at least {POOR_SCALING_EFFICIENCY:.0%})")
    verdict = (f"poor scaling: {efficiency:.0%} efficiency at {worst.count} {unit} "
               f"(below {POOR_SCALING_EFFICIENCY:.0%})")
    before, after = base.shares, worst.shares
    if before is None or after is None or not base.examples_per_s or not worst.examples_per_s:
        remedies.append(Remedy("the step's parts are not timed apart: which one grew is not "
                               "known"))
        return advice("poor", verdict)

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
    return advice("poor", verdict)
