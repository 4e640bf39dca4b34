"""Bounded telemetry for big clusters: a worker's steps as one summary a second.

Up to SUMMARY_PAST_WORKERS workers every worker's agent passes every step up. Past it,
the chief's still does (the headline, the record and the plots are its steps), and every
other worker's agent folds its steps into one StepSummary a second: count, [min, median,
max, sum] of step time, input wait and the breakdown's parts, examples, the last loss.
StepSummarizer is pure: the agent hands it each event and the time, and it calls
``emit`` with what goes up; ``Upward`` is the agent's end (its timer sends a due summary
when the steps stop). Never held back: an attempt's first WARMUP_STEPS steps (they go
as steps, which the fold counts), a step that falls behind (FALLING_BEHIND times the
last median: the straggler rule hears of it at once), and every other event, before
which the summary so far goes, so the order of what a worker said is kept.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuwatch.runstate import CHIEF, WARMUP_STEPS
from gpuwatch.supervisor.worker_role import WorkerLaunch
from trainer_runtime.protocol import (
    SUMMARY_PAST_WORKERS,
    Event,
    GpuSummary,
    Sample,
    Step,
    StepSummary,
)

# A summary covers at most this long of a worker's steps.
SUMMARY_EVERY_S = 1.0
# A step this many times the last summary's median is sent (with its summary) at once.
FALLING_BEHIND = 2.0
# How often a summarizing agent looks for a summary whose second is up.
SUMMARY_TICK_S = 0.2

Emit = Callable[[Event, float | None], None]
# The agent's callbacks: (its index, event, t) and (its index, its host's sample).
OnFrame = Callable[[int, Event, float | None], None]
OnSample = Callable[[int, Sample], None]


def summarizes(index: int, workers: int) -> bool:
    """Whether worker `index` of `workers` sends summaries rather than steps."""
    return workers > SUMMARY_PAST_WORKERS and index != CHIEF


def _spread(values: Sequence[float]) -> list[float]:
    return _round([min(values), statistics.median(values), max(values), sum(values)])


def _round(values: list[float]) -> list[float]:
    return [round(v, 3) for v in values]  # a microsecond: far below a step's own spread


def lean_sample(sample: Sample) -> Sample:
    """A summarizing worker's device sample: its host's few readings (HostSample.leaned:
    per_cpu_pct alone is a number per core, hundreds on a big host), and its GPUs summed
    (Sample.gpu_summary: how many, lost, utilization min/mean/max, memory and link
    traffic summed) instead of every GPU's every field: at 64 hosts x 8 GPUs, 512 full
    GPU readings a second are some 280 KiB/s of record."""
    gpus = sample.gpus
    live = [g for g in gpus if not g.lost]
    utils = [float(g.util_gpu_pct) for g in live if g.util_gpu_pct is not None]

    def total(*values: float | None) -> float | None:
        known = [v for v in values if v is not None]
        return float(sum(known)) if known else None

    summary = GpuSummary(
        count=len(gpus), lost=len(gpus) - len(live),
        util_gpu_pct=([min(utils), round(sum(utils) / len(utils), 1), max(utils)]
                      if utils else None),
        mem_used_bytes=total(*(g.mem_used_bytes for g in live)),
        mem_total_bytes=total(*(g.mem_total_bytes for g in live)),
        pcie_bytes_per_s=total(*(v for g in live
                                 for v in (g.pcie_tx_bytes_per_s, g.pcie_rx_bytes_per_s))),
        nvlink_bytes_per_s=total(*(v for g in live for v in (g.nvlink_tx_bytes_per_s,
                                                              g.nvlink_rx_bytes_per_s))),
    ) if gpus else None
    return replace(sample, host=sample.host.leaned(), gpus=[], gpu_summary=summary)


def summary_of(steps: Sequence[Step]) -> StepSummary:
    """One summary of `steps` (one worker's, one attempt's, in order; at least one)."""
    last = steps[-1]
    losses = [s.loss for s in steps if s.loss is not None]

    def spread(name: str) -> list[float] | None:
        values = [getattr(s, name) for s in steps]
        if any(v is None for v in values):
            return None
        return _spread(values)

    timed = [b for s in steps if (b := s.breakdown) is not None]
    return StepSummary(
        attempt=last.attempt, worker=last.worker, first_step=steps[0].step,
        last_step=last.step, count=len(steps), epoch=last.epoch,
        examples=sum(s.examples for s in steps), loss=losses[-1] if losses else None,
        position=last.position, dropped=last.dropped,
        step_time_ms=_spread([s.step_time_ms for s in steps]),
        input_wait_ms=spread("input_wait_ms"), compute_ms=spread("compute_ms"),
        sync_ms=spread("sync_ms"), update_ms=spread("update_ms"),
        breakdown_ms=_round([sum(b.step_ms for b in timed), sum(b.input_ms for b in timed),
                             sum(b.compute_ms for b in timed), sum(b.sync_ms for b in timed),
                             sum(b.update_ms for b in timed)]) if timed else None,
    )


class StepSummarizer:
    """One worker's events on their way up: steps past warm-up become summaries."""

    def __init__(self, emit: Emit, every_s: float = SUMMARY_EVERY_S) -> None:
        self.emit = emit
        self.every_s = every_s
        self.attempt: int | None = None
        self.seen = 0  # steps of this attempt so far
        self.steps: list[Step] = []
        self.last_t: float | None = None
        self.opened = 0.0  # when the first step of the summary so far arrived
        self.median_ms: float | None = None  # the last summary's median step time

    def event(self, event: Event, t: float | None, now: float) -> None:
        """Pass `event` on (a step may wait for its summary); `now`: a monotonic clock."""
        if not isinstance(event, Step):
            self.flush()
            self.emit(event, t)
            return
        if event.attempt != self.attempt:  # a relaunch or a live change: warm-up again
            self.flush()
            self.attempt, self.seen, self.median_ms = event.attempt, 0, None
        self.seen += 1
        if self.seen <= WARMUP_STEPS:
            self.emit(event, t)
            return
        if not self.steps:
            self.opened = now
        self.steps.append(event)
        self.last_t = t
        behind = (self.median_ms is not None
                  and event.step_time_ms > FALLING_BEHIND * self.median_ms)
        if behind or now - self.opened >= self.every_s:
            self.flush()

    def due(self, now: float) -> bool:
        """A summary has waited its second (the agent's timer asks: steps may have stopped)."""
        return bool(self.steps) and now - self.opened >= self.every_s

    def flush(self) -> None:
        """Send the summary so far, if any."""
        if not self.steps:
            return
        summary = summary_of(self.steps)
        self.steps = []
        self.median_ms = summary.figure("step_time_ms", "median")
        self.emit(summary, self.last_t)


class Upward:
    """What one agent passes up: each event and sample as it is, or, for a worker that
    summarizes (``summarizes``, decided at each attempt's start), its steps as summaries
    and its samples lean."""

    def __init__(self, index: int, on_frame: OnFrame, on_sample: OnSample) -> None:
        self.index = index
        self.on_frame = on_frame
        self.on_sample = on_sample
        self.summarizer: StepSummarizer | None = None

    def start(self, launch: WorkerLaunch | None) -> None:
        """An attempt starts: this worker's place in its cluster (None: one host)."""
        summarize = launch is not None and summarizes(launch.index, launch.workers)
        self.summarizer = (StepSummarizer(lambda e, t: self.on_frame(self.index, e, t))
                           if summarize else None)

    def event(self, event: Event, t: float | None) -> None:
        if self.summarizer is not None:
            self.summarizer.event(event, t, time.monotonic())
        else:
            self.on_frame(self.index, event, t)

    def sample(self, index: int, sample: Sample) -> None:
        self.on_sample(index, lean_sample(sample) if self.summarizer is not None else sample)

    def flush(self) -> None:
        """The trainer's frames have ended: the summary so far goes (before its exit)."""
        if self.summarizer is not None:
            self.summarizer.flush()

    async def send_due(self) -> None:
        """A summary goes up within its second even when the steps stop coming."""
        while True:
            await asyncio.sleep(SUMMARY_TICK_S)
            summarizer = self.summarizer
            if summarizer is not None and summarizer.due(time.monotonic()):
                summarizer.flush()
