"""Advisor: the current figures (+ settings, device sample) -> input-bound verdict and advice.

Plain Python, no Textual. The verdict uses TF Profiler's thresholds
(openxla/xprof ``op_stats_to_input_pipeline_analysis.cc``): input wait / step
time >= 20 % is "highly input-bound", >= 5 % "moderately input-bound", else
"not input-bound". Recommendations name the dashboard key that acts on them.

Several workers: ``find_straggler`` names the worker that holds every synchronous
step back and why (see its docstring for the thresholds).

``reading(state)`` is what one repaint of the dashboard shows: the state's figures
(``RunState.figures``), taken once, with the straggler and the advice made from them,
so the verdict's input wait is the figure the metrics line shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatch.runstate import Figures, RunState, WorkerSummary, get_setting, pace_setter
from gpuwatch.scaling import ScalingRow
from trainer_runtime.protocol import Scale
from trainer_runtime.schema import prefetch_enabled

HIGH_INPUT_BOUND_PCT = 20.0
MODERATE_INPUT_BOUND_PCT = 5.0
LOW_GPU_UTIL_PCT = 50.0
HIGH_GPU_MEM_FRACTION = 0.90
MAX_RECOMMENDATIONS = 3
# Straggler rule. Under synchronous training every worker's step lasts as long as the
# slowest's; the straggler is the one whose own work (input wait or compute) is longer,
# the others spend the difference waiting in the all-reduce. It is named when its extra
# time is at least STRAGGLER_MIN_SHARE_PCT of a step (TF Profiler's "moderate" bar: less
# is noise) and at least the ratio below times the others' median (so a run where every
# worker is input-bound alike has no straggler).
STRAGGLER_MIN_SHARE_PCT = 5.0
STRAGGLER_INPUT_RATIO = 1.5
STRAGGLER_COMPUTE_RATIO = 1.25


@dataclass(frozen=True)
class Advice:
    """What the numbers say: a level, a one-line verdict, and 0-3 things to try."""

    level: str  # "high" | "moderate" | "none" | "unknown"
    verdict: str
    input_wait_pct: float | None
    recommendations: list[str] = field(default_factory=list)


def input_bound_level(input_wait_pct: float | None) -> str:
    """'high' (>= 20 %), 'moderate' (>= 5 %), 'none', or 'unknown' without data."""
    if input_wait_pct is None:
        return "unknown"
    if input_wait_pct >= HIGH_INPUT_BOUND_PCT:
        return "high"
    if input_wait_pct >= MODERATE_INPUT_BOUND_PCT:
        return "moderate"
    return "none"


VERDICTS = {
    "high": "highly input-bound",
    "moderate": "moderately input-bound",
    "none": "not input-bound",
    "unknown": "no measured steps yet (warming up)",
}


def format_rate(bytes_per_s: float | None) -> str:
    """Bytes per second in decimal multiples: '512 B/s', '3.4 MB/s', '12.0 GB/s'."""
    if bytes_per_s is None:
        return "n/a"
    value = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(value) < 1000.0 or unit == "GB/s":
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.1f} {unit}"
        value /= 1000.0
    return f"{value:.1f} TB/s"  # pragma: no cover - loop returns at GB/s


def advise(
    figures: Figures,
    settings: Mapping[str, Any],
    sample: Mapping[str, Any] | None = None,
    replicas: int = 1,
    straggler: Straggler | None = None,
) -> Advice:
    """Verdict and up to three recommendations for the current figures (``RunState.figures``).

    The verdict's input wait is the figures' own: in a cluster the worker's that waits
    most, named (every step waits for it). A straggler (``find_straggler``, from the
    same figures' workers) comes first in the recommendations.
    """
    pct = figures.input_wait_pct
    level = input_bound_level(pct)
    verdict = VERDICTS[level]
    if pct is not None and figures.input_wait_worker is not None:
        verdict = (
            f"{verdict} on worker {figures.input_wait_worker}: {pct:.1f}% of its step time "
            "waiting for input"
        )
    elif pct is not None:
        verdict = f"{verdict}: {pct:.1f}% of step time waiting for input"
    recs: list[str] = []
    if straggler is not None:
        if straggler.cause == "input-bound":
            recs.append(
                f"worker {straggler.worker} waits on input; every step waits for it: "
                "speed up its input"
            )
        else:
            recs.append(
                f"worker {straggler.worker}'s devices are slower: the others wait for it "
                "in the all-reduce"
            )

    prefetch_on = prefetch_enabled(get_setting(settings, "data.prefetch"))
    parallel = get_setting(settings, "data.parallel_calls")
    accumulation = get_setting(settings, "train.accumulation_steps") or 1
    gpus = [g for g in (sample or {}).get("gpus") or [] if not g.get("lost")]

    if level in ("high", "moderate"):
        if not prefetch_on:
            recs.append("turn prefetch on (p): read the next batch while this step runs")
        if parallel == 1:
            recs.append("raise data.parallel_calls (now 1: reads run one at a time), e.g. autotune")
        if prefetch_on and parallel != 1:
            recs.append("prefetch and parallel reads on: try data.cache or cheaper reads/decoding")
        utils = [g["util_gpu_pct"] for g in gpus if g.get("util_gpu_pct") is not None]
        if utils and sum(utils) / len(utils) < LOW_GPU_UTIL_PCT:
            recs.append(
                f"GPUs only {sum(utils) / len(utils):.0f}% busy while waiting: "
                "the input pipeline is the limit"
            )
    elif level == "none":
        utils = [g["util_gpu_pct"] for g in gpus if g.get("util_gpu_pct") is not None]
        if utils and sum(utils) / len(utils) < LOW_GPU_UTIL_PCT:
            recs.append(
                f"GPUs only {sum(utils) / len(utils):.0f}% busy, not waiting on input: "
                "a larger batch (b) adds work"
            )
        elif straggler is None:
            recs.append("the input keeps up: step time is compute (and gradient sync)")

    if replicas > 1:
        sync_per_s = figures.grad_sync_bytes_per_s
        if sync_per_s is not None and sync_per_s > 0:
            if accumulation == 1:
                recs.append(
                    f"gradient sync est. {format_rate(sync_per_s)}: accumulation (a) "
                    "syncs once per k micro-steps"
                )
            else:
                recs.append(
                    f"gradient sync est. {format_rate(sync_per_s)}, "
                    f"one all-reduce per {accumulation} micro-steps"
                )

    for gpu in gpus:
        used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
        if used is not None and total and used / total >= HIGH_GPU_MEM_FRACTION:
            recs.append(
                f"GPU {gpu.get('index')} memory {100 * used / total:.0f}% full: "
                "a larger batch (b) may not fit"
            )
            break

    # A cluster's screen also lists its workers and names the straggler: two lines here.
    most = MAX_RECOMMENDATIONS if straggler is None else min(2, MAX_RECOMMENDATIONS)
    return Advice(level, verdict, pct, recs[:most])


@dataclass(frozen=True)
class Straggler:
    """The worker the others wait for, and what makes it slow."""

    worker: int
    host: str
    cause: str  # "input-bound" | "slow devices"
    value: float  # its input wait % or compute ms
    others: float  # the others' median of the same figure
    extra_ms: float  # its extra time per step over the others' median

    @property
    def message(self) -> str:
        """'worker 1 (host-b) is the straggler: input-bound (input wait 38% vs 3% ...)'."""
        who = f"worker {self.worker}" + (f" ({self.host})" if self.host else "")
        if self.cause == "input-bound":
            figures = f"input wait {self.value:.0f}% vs {self.others:.0f}%"
        else:
            figures = f"compute {self.value:.0f} ms vs {self.others:.0f} ms"
        return f"{who} is the straggler: {self.cause} ({figures} on the others)"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _outlier(
    workers: Sequence[WorkerSummary], figure: str, ratio: float, step_ms: float
) -> tuple[WorkerSummary, float, float, float] | None:
    """(worker, its value, the others' median, extra ms) if one worker stands out."""
    known = {w.worker: w for w in workers if getattr(w, figure) is not None}
    pace = pace_setter({index: getattr(w, figure) for index, w in known.items()})
    if len(known) < 2 or pace is None:
        return None
    top, value = known[pace[0]], pace[1]
    others = _median([float(getattr(w, figure)) for w in known.values() if w is not top])
    # Input wait is a % of the step: its extra time is that share of the median step.
    extra_ms = (value - others) * (step_ms / 100.0 if figure == "input_wait_pct" else 1.0)
    if value < ratio * others or extra_ms < STRAGGLER_MIN_SHARE_PCT * step_ms / 100.0:
        return None
    return top, value, others, extra_ms


def find_straggler(workers: Sequence[WorkerSummary]) -> Straggler | None:
    """The worker that holds the synchronous step back, or None within the margins.

    Only workers with measured steps count; with fewer than two there is nothing to
    compare. Input-bound: its median input wait % is >= STRAGGLER_INPUT_RATIO x the
    others' median and the extra wait is >= STRAGGLER_MIN_SHARE_PCT % of the step.
    Slow devices: the same with compute ms (batch in hand to local gradients ready)
    and STRAGGLER_COMPUTE_RATIO; workers that do not report compute_ms are left out of
    that rule. When both rules name someone, the larger extra time per step wins.
    """
    measured = [w for w in workers if w.measured]
    if len(measured) < 2:
        return None
    step_ms = _median([float(w.step_time_ms) for w in measured if w.step_time_ms is not None])
    if step_ms <= 0:
        return None
    found = [
        (cause, hit)
        for cause, figure, ratio in (
            ("input-bound", "input_wait_pct", STRAGGLER_INPUT_RATIO),
            ("slow devices", "compute_ms", STRAGGLER_COMPUTE_RATIO),
        )
        if (hit := _outlier(measured, figure, ratio, step_ms)) is not None
    ]
    if not found:
        return None
    cause, (top, value, others, extra_ms) = max(found, key=lambda pair: pair[1][3])
    return Straggler(top.worker, top.host, cause, value, others, extra_ms)


@dataclass(frozen=True)
class Reading:
    """What one repaint shows: the figures, taken once, and what the advisor makes of them."""

    figures: Figures
    straggler: Straggler | None
    advice: Advice


def reading(state: RunState) -> Reading:
    """The state's figures now, its straggler (a cluster's) and the advice, all from one
    ``RunState.figures()``: every part of the screen that shows a figure reads it here."""
    figures = state.figures()
    straggler = find_straggler(figures.workers) if figures.workers else None
    current = state.current
    settings = current.settings if current and current.settings else state.settings
    advice = advise(figures, settings, state.sample, state.replicas, straggler)
    if state.terminal:  # what was last measured, and what r would do
        advice = after_the_end(advice, str(state.status))
    return Reading(figures, straggler, advice)


def after_the_end(advice: Advice, status: str) -> Advice:
    """The advice of a run that has ended (`status`): from its last measured figures, and
    for the attempt that `r` would start from its last checkpoint, not for a running one."""
    first = f"the run {status}: r goes on from its last checkpoint, with any setting you change"
    recommendations = [first, *advice.recommendations][:MAX_RECOMMENDATIONS]
    if advice.input_wait_pct is None:
        verdict = "no measured steps: it ended while warming up"
    else:
        verdict = f"{advice.verdict} (last measured)"
    return replace(advice, verdict=verdict, recommendations=recommendations)


# Poor scaling (gpuwatch scale): a probe's efficiency, X(N) x b / (N x X(b)), below this at
# some count is poor: at 80 %, a fifth of every added device's work is lost to what grew
# with the count. The part of the step that grew most is named, with its remedy.
POOR_SCALING_EFFICIENCY = 0.80
# What to try when a part of the step grew with the count (keys as the dashboard has them).
SCALING_REMEDIES = {
    "sync": "the all-reduce grew with the devices: accumulation (a) syncs once per k "
            "micro-steps; a bigger per-replica batch (b) does more work per all-reduce",
    "input": "the input grew: every replica reads its own batches; prefetch (p) and parallel "
             "reads (data.parallel_calls) keep more replicas fed",
    "compute": "compute per example grew: the replicas contend for hardware they share "
               "(cores, memory bandwidth, a PCIe switch)",
    "update": "the optimizer update grew: it runs on every replica each step; a bigger "
              "per-replica batch (b) runs it less often per example",
    "other": "host work and dispatch grew: more devices to launch each step; "
             "train.steps_per_execution runs several steps per call",
}
SCALING_PART_NAMES = {"input": "input wait", "compute": "compute", "sync": "all-reduce",
                      "update": "optimizer update", "other": "host and dispatch"}


def poor_scaling(rows: Sequence[ScalingRow], plan: Scale) -> Advice | None:
    """A scaling probe's verdict (gpuwatch/scaling.py's rows): "poor" when a count's efficiency
    is below POOR_SCALING_EFFICIENCY, naming the part of the step that grew most from the
    smallest count to it, with the remedy; "good" otherwise; None with fewer than two counts
    measured.

    A part's growth is its device time per example: share x count / examples/s. Perfect
    scaling keeps each part's constant, in weak and strong scaling alike, and the parts'
    growths add up to what the efficiency lost. Counts whose logical CPU replicas share
    fewer cores are said first: they measure the cores, not scaling.
    """
    measured = [row for row in rows if row.examples_per_s and row.efficiency is not None]
    if len(measured) < 2:
        return None
    base = measured[0]
    worst = min(measured[1:], key=lambda row: row.efficiency or 0.0)
    efficiency = worst.efficiency or 0.0
    unit = plan.unit
    recs: list[str] = []
    if any(row.shares_cores for row in measured):
        recs.append(f"{worst.count} {unit} share {plan.cores} cores: not a real scaling measure "
                    "(run it where every replica has its own device)")
    if efficiency >= POOR_SCALING_EFFICIENCY:
        verdict = (f"scales well: {efficiency:.0%} efficiency at {worst.count} {unit} "
                   f"(at least {POOR_SCALING_EFFICIENCY:.0%})")
        return Advice("good", verdict, None, recs[:MAX_RECOMMENDATIONS])
    verdict = (f"poor scaling: {efficiency:.0%} efficiency at {worst.count} {unit} "
               f"(below {POOR_SCALING_EFFICIENCY:.0%})")
    before, after = base.shares, worst.shares
    if before is None or after is None or not base.examples_per_s or not worst.examples_per_s:
        recs.append("the step's parts are not timed apart: which one grew is not known")
        return Advice("poor", verdict, None, recs[:MAX_RECOMMENDATIONS])

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
    recs.append(SCALING_REMEDIES[part])
    return Advice("poor", verdict, None, recs[:MAX_RECOMMENDATIONS])
