"""Each worker of a cluster: folded in O(1) per event, summed up when the screen asks.

``WorkerFigures`` is what the fold keeps of a worker of the current attempt: a fixed
window of its recent steps (past SUMMARY_PAST_WORKERS workers, its latest 1 s
summaries), its status, its hello. ``WorkerSummary`` is its figures as the screen and
the straggler rule read them, made by ``summarize_workers``: medians over at most
WORKER_WINDOW_STEPS steps, remade only for a worker that sent something since.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.runstate import codec
from gpuwatch.runstate.steps import median_value, weighted_median
from trainer_runtime.protocol import (
    Breakdown,
    GpuSample,
    GpuSummary,
    Hello,
    HostSample,
    StepSummary,
    input_wait_pct,
    per_second,
    sum_breakdowns,
)

# Steps per worker its figures (median step time, input wait, compute) are taken over.
WORKER_WINDOW_STEPS = 20


@dataclass(frozen=True, slots=True)
class HostReading:
    """A host's latest sample event as the screen reads it: its readings, and when."""

    host: HostSample
    gpus: list[GpuSample]
    nvml: str | None
    t: float | None
    gpu_summary: GpuSummary | None = None  # a summarizing worker's GPUs, summed


@dataclass(frozen=True, slots=True)
class WorkerStep:
    """What a worker's figures keep of one of its steps (the window holds no full events)."""

    step_time_ms: float
    input_wait_ms: float | None
    compute_ms: float | None
    examples: int
    breakdown: Breakdown | None = None


@dataclass
class WorkerFigures:
    """One worker of the current attempt, folded in O(1) per event (a fixed window)."""

    worker: int
    attempt: int = 0
    host: str = ""
    hello: Hello | None = None
    status: str = "starting"  # starting | running | done | error | crashed
    steps_seen: int = 0
    last_step: int | None = None
    window: deque[WorkerStep] = field(
        default_factory=lambda: deque(maxlen=WORKER_WINDOW_STEPS)
    )
    # Past SUMMARY_PAST_WORKERS workers its steps come as summaries: the latest that
    # cover at least WORKER_WINDOW_STEPS steps, and how many they cover.
    summaries: deque[StepSummary] = field(default_factory=deque)
    summarized_steps: int = 0
    # (what it was made from, the WorkerSummary): at 64 workers a repaint remakes only the
    # summaries of the workers that sent something since the last one.
    made: Any = field(default=None, metadata=codec.LOCAL, repr=False, compare=False)

    def start_attempt(self, attempt: int) -> None:
        """A newer attempt: its figures start over (never mixed across settings)."""
        self.attempt = attempt
        self.status = "starting"
        self.steps_seen = 0
        self.last_step = None
        self.window.clear()
        self.summaries.clear()
        self.summarized_steps = 0

    def add_summary(self, event: StepSummary) -> None:
        self.summaries.append(event)
        self.summarized_steps += event.count
        while (len(self.summaries) > 1
               and self.summarized_steps - self.summaries[0].count >= WORKER_WINDOW_STEPS):
            self.summarized_steps -= self.summaries.popleft().count

    @property
    def workers(self) -> int:
        return self.hello.workers if self.hello is not None and self.hello.workers > 0 else 1

    @property
    def replicas(self) -> int | None:
        """This worker's own replicas: on CPU one per worker, else its devices."""
        hello = self.hello
        if hello is None:
            return None
        if hello.device_kind == "cpu" or not hello.devices:
            return max(1, hello.replicas // self.workers)
        return len(hello.devices)


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """A worker's figures as the screen and the straggler rule read them (None: not known).

    Over its last WORKER_WINDOW_STEPS steps after warm-up: medians, but input wait % is
    sum(input_wait_ms) / sum(step_time_ms), as everywhere (``steps_input_wait_pct``);
    examples/s is its share of the update (examples / workers) over its own step time.
    """

    worker: int
    host: str
    replicas: int | None
    status: str
    last_step: int | None
    measured_steps: int
    step_time_ms: float | None
    input_wait_pct: float | None
    input_wait_ms: float | None
    compute_ms: float | None
    examples_per_s: float | None
    sample: HostReading | None
    breakdown: Breakdown | None = None  # its window's steps together (None: not timed)
    summarized: bool = False  # from its 1 s summaries (medians at their resolution)

    @property
    def measured(self) -> bool:
        """It has steps after warm-up with a time: only those workers are compared."""
        return self.step_time_ms is not None and self.measured_steps > 0

    @property
    def busy_ms(self) -> float | None:
        """Time of a step spent on its own work (input + compute), or its step time."""
        if self.input_wait_ms is not None and self.compute_ms is not None:
            return self.input_wait_ms + self.compute_ms
        return self.step_time_ms


def summarize_workers(current: list[WorkerFigures], samples: Mapping[int, HostReading]
                      ) -> list[WorkerSummary]:
    """The workers' summaries by index, each with its host's latest sample (workers on one
    host share one sampler: theirs is that host's)."""
    by_host: dict[str, HostReading] = {}
    for figures in current:
        sample = samples.get(figures.worker)
        if sample is not None and figures.host:
            by_host.setdefault(figures.host, sample)
    out: list[WorkerSummary] = []
    for figures in sorted(current, key=lambda f: f.worker):
        sample = samples.get(figures.worker) or by_host.get(figures.host)
        key = (figures.attempt, figures.steps_seen, figures.last_step, figures.status,
               figures.host, id(figures.hello), figures.summarized_steps,
               id(figures.summaries[-1]) if figures.summaries else None,
               id(sample), sample.t if sample else None)
        if figures.made is None or figures.made[0] != key:
            figures.made = (key, _summarize(figures, sample))
        out.append(figures.made[1])
    return out


def _summarize(figures: WorkerFigures, sample: HostReading | None) -> WorkerSummary:
    if figures.summaries:
        return _from_summaries(figures, sample)
    steps = list(figures.window)
    share = 1.0 / figures.workers  # each worker trains its share of the update's examples
    computes = [s.compute_ms for s in steps if s.compute_ms is not None]
    waited = [(s.step_time_ms, s.input_wait_ms) for s in steps if s.input_wait_ms is not None]
    return _worker_summary(
        figures, sample,
        measured_steps=len(steps),
        step_time_ms=median_value([s.step_time_ms for s in steps]),
        input_wait_pct=_wait_pct(waited),
        input_wait_ms=median_value([wait for _, wait in waited]),
        compute_ms=median_value(computes),
        examples_per_s=median_value(
            [r for s in steps if (r := per_second(s.examples * share, s.step_time_ms)) is not None]
        ),
        breakdown=sum_breakdowns(s.breakdown for s in steps),
    )


def _worker_summary(figures: WorkerFigures, sample: HostReading | None,
                    **measured: Any) -> WorkerSummary:
    """A worker's summary: who and where it is, and its `measured` figures."""
    return WorkerSummary(worker=figures.worker, host=figures.host, replicas=figures.replicas,
                         status=figures.status, last_step=figures.last_step, sample=sample,
                         **measured)


def _wait_pct(waited: Sequence[tuple[float, float]]) -> float | None:
    """Input wait % of (step time, input wait) pairs: sum over sum (None: no pairs)."""
    if not waited:
        return None
    return input_wait_pct(sum(wait for _, wait in waited), sum(step for step, _ in waited))


def _from_summaries(figures: WorkerFigures, sample: HostReading | None) -> WorkerSummary:
    """_summarize's figures from a worker's latest summaries: medians of their medians
    (each counted for its steps), input wait % and the breakdown from their sums."""
    summaries = list(figures.summaries)
    share = 1.0 / figures.workers

    def median_of(name: str) -> float | None:
        return weighted_median((s.figure(name, "median"), s.count) for s in summaries)

    waited = [(step, wait) for s in summaries
              if (step := s.figure("step_time_ms", "sum")) is not None
              and (wait := s.figure("input_wait_ms", "sum")) is not None]
    rates = []
    for s in summaries:
        median = s.figure("step_time_ms", "median")
        rate = per_second(s.examples / s.count * share, median) if median is not None else None
        rates.append((rate, s.count))
    return _worker_summary(
        figures, sample,
        measured_steps=figures.summarized_steps,
        step_time_ms=median_of("step_time_ms"),
        input_wait_pct=_wait_pct(waited),
        input_wait_ms=median_of("input_wait_ms"),
        compute_ms=median_of("compute_ms"),
        examples_per_s=weighted_median(rates),
        breakdown=sum_breakdowns(s.breakdown for s in summaries),
        summarized=True,
    )
