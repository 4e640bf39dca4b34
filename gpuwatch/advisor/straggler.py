"""The straggler rule (pure): the worker of a cluster that holds every synchronous step
back, and why (``find_straggler``; its docstring says the thresholds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwatch.runstate import WorkerSummary, pace_setter

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


def straggler_text(straggler: Straggler) -> str:
    if straggler.cause == "input-bound":
        return (f"worker {straggler.worker} waits on input; every step waits for it: "
                "speed up its input")
    return (f"worker {straggler.worker}'s devices are slower: the others wait for it "
            "in the all-reduce")
