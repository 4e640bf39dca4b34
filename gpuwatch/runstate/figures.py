"""The current attempt's figures at one moment (``Figures``), each taken once (pure).

``step_figures`` takes them over the chief's latest steps (and a cluster's worker
summaries); ``RunState.figures`` adds those that need the state (FLOPs, MFU, the link).
Every panel that shows one of them reads it from there, so a figure shown twice is the
same value. And every figure says the window it was taken over, in the words here
(``recent_window``, ``ATTEMPT_WINDOW``): two examples/s over two windows are two figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuwatch.measures import peaks
from gpuwatch.runstate.steps import (
    StepPoint,
    bus_bandwidth,
    median_value,
    pace_setter,
    share_intervals,
    steps_input_wait_pct,
)
from gpuwatch.runstate.workers import WorkerSummary
from trainer_runtime.protocol import Breakdown, per_second, sum_breakdowns

# A figure over all of its attempt's steps after warm-up (the attempts table's, a scaling
# count's, the headless summary's), as its label says it: "ex/s (attempt)".
ATTEMPT_WINDOW = "attempt"


def recent_window(steps: int, *, short: bool = False) -> str:
    """The window of figures over the latest `steps` steps after warm-up, as its label
    says it: "last 20 steps" ("last step" for one); short: "last 20"."""
    if short:
        return f"last {steps:,}"
    return "last step" if steps == 1 else f"last {steps:,} steps"


@dataclass(frozen=True, slots=True)
class Figures:
    """The current attempt's figures at one moment (``RunState.figures``), each taken once.

    Every panel that shows one of them reads it here, so a figure shown twice is the same
    value: over the chief's latest CURRENT_STEPS steps after warm-up (examples/s and step
    time their medians, input wait and gradient sync their sums' ratio); in a cluster the
    input wait is the worker's that waits most, over its own latest steps, and
    ``input_wait_worker`` says whose. ``steps``: how many steps they are over, for their
    label (``recent_window``).
    """

    examples_per_s: float | None = None
    step_time_ms: float | None = None
    input_wait_pct: float | None = None
    input_wait_worker: int | None = None  # whose input wait, in a cluster; None on one host
    grad_sync_bytes_per_s: float | None = None
    workers: tuple[WorkerSummary, ...] = ()  # every worker's figures, in a cluster
    # Achieved TFLOP/s at examples_per_s (the traced FLOPs per example), and that over the
    # GPUs' dense peak where known (RunState.flops_figures).
    tflops: float | None = None
    mfu_pct: float | None = None
    # The chief's latest steps' breakdown together (input, compute, all-reduce, update,
    # other; None: not timed apart), and the all-reduce bus bandwidth they achieved.
    breakdown: Breakdown | None = None
    bus_bytes_per_s: float | None = None
    # The link that all-reduce crosses, from the chief's host sample (peaks.link_peak;
    # None: no GPU, not told, or across hosts), and the bus bandwidth as a share of it.
    link: peaks.LinkPeak | None = None
    bus_pct_of_link: float | None = None
    steps: int = 0  # the chief's steps they are over (RunState.figures: CURRENT_STEPS at most)
    # Each share's SHARE_CONFIDENCE interval over the same steps (steps.share_intervals:
    # a part left out is graded on its figure alone, None is too few steps); None: not
    # taken from steps (an attempt's sums, a worker's summaries).
    share_intervals: Mapping[str, tuple[float, float] | None] | None = None


def step_figures(
    points: Sequence[StepPoint], workers: Sequence[WorkerSummary] = ()
) -> Figures:
    """The figures of the chief's steps ``points``; with a cluster's ``workers``, the input
    wait of the measured worker that waits most (``pace_setter``), named.

    examples/s is the median of the steps' own, every step with a time counted as its
    attempt's median counts it (``AttemptSummary.rates``): over the same steps the two
    are one value."""
    wait, whose = steps_input_wait_pct(points), None
    parts = [(p, p.event.breakdown) for p in points]
    timed = sum_breakdowns(b for _, b in parts)
    intervals = share_intervals(points)
    if workers:
        pace = pace_setter({w.worker: w.input_wait_pct for w in workers if w.measured})
        if pace is not None:
            whose, wait = pace
            intervals.pop("input", None)  # that worker's steps are not these
    return Figures(
        examples_per_s=median_value(
            [r for p in points if (r := p.examples_per_s) is not None]
        ),
        step_time_ms=median_value([p.step_time_ms for p in points]),
        input_wait_pct=wait,
        input_wait_worker=whose,
        grad_sync_bytes_per_s=per_second(
            sum(p.grad_sync_bytes for p in points), sum(p.step_time_ms for p in points)
        ),
        workers=tuple(workers),
        breakdown=timed,
        bus_bytes_per_s=bus_bandwidth(
            sum(p.grad_sync_bytes for p, b in parts if b is not None), timed
        ),
        steps=len(points),
        share_intervals=intervals,
    )
