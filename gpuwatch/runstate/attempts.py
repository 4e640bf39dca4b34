"""One attempt as the attempts table and the summaries read it (``AttemptSummary``).

What it ran with and what it measured after warm-up: its chief's figures, but for a
cluster's input wait, which is the worker's that waits most, from every worker's sums
(``WorkerWait``, counted by ``add_wait``). And which settings differ between attempts
(``differing_settings``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.measures.sketch import MedianSketch
from gpuwatch.runstate.settings import ACCUMULATION_KEY, BATCH_KEY, PREFETCH_KEY, get_setting
from gpuwatch.runstate.steps import WARMUP_STEPS, RatioSums, bus_bandwidth, pace_setter
from trainer_runtime.changes import dotted_settings
from trainer_runtime.protocol import Breakdown, Hello, Resume, input_wait_pct, per_second


@dataclass
class WorkerWait:
    """One worker's input wait over an attempt: its sums over its steps after warm-up."""

    steps_seen: int = 0
    measured_steps: int = 0
    sum_step_time_ms: float = 0.0
    sum_input_wait_ms: float = 0.0
    breakdown: Breakdown | None = None  # the same steps' parts together (None: not timed)

    @property
    def input_wait_pct(self) -> float | None:
        if not self.measured_steps:
            return None
        return input_wait_pct(self.sum_input_wait_ms, self.sum_step_time_ms)


@dataclass
class AttemptSummary:
    """One attempt: what it ran with and what it measured after warm-up.

    Its figures are the chief's, but for input wait in a cluster: the worker's that
    waits most (``input_wait_worker``), from every worker's sums (``worker_waits``).
    """

    attempt: int
    settings: dict[str, Any] = field(default_factory=dict)
    fresh: bool = False
    reason: str | None = None
    started_t: float | None = None
    hello: Hello | None = None
    steps_seen: int = 0
    first_step: int | None = None
    last_step: int | None = None
    measured_steps: int = 0
    sum_step_time_ms: float = 0.0
    sum_input_wait_ms: float = 0.0
    # The step time of the measured steps whose input wait was measured (a script's loop
    # may not let it be: those steps count in neither sum).
    sum_waited_ms: float = 0.0
    sum_grad_sync_bytes: float = 0.0
    # The measured steps' breakdown together (None: none timed apart), and the all-reduce
    # bytes of those steps, for the bus bandwidth.
    breakdown: Breakdown | None = None
    # Each share's sums over the chief's measured steps, for its interval over all of them
    # (RatioSums): "input" over the steps whose wait was measured, the breakdown's parts
    # over the steps timed apart.
    share_sums: dict[str, RatioSums] = field(default_factory=dict)
    sum_timed_sync_bytes: float = 0.0
    # examples/s of every measured step, for the median: bounded (exact for a short attempt)
    rates: MedianSketch = field(default_factory=MedianSketch)
    end: str | None = None  # "done: max_steps", "crashed: exit 1", ...
    resume: Resume | None = None  # where it resumed: step, data position, data order
    workers: int = 1  # the cluster size its chief's hello gave (1: one host)
    worker_waits: dict[int, WorkerWait] = field(default_factory=dict)  # by worker

    @property
    def data_restarted(self) -> str | None:
        """Why the data order started over on this attempt's resume, or None if it did not."""
        if self.resume is None or self.resume.data_order != "restarted":
            return None
        return self.resume.data_note or "data order restarted"

    @property
    def measured(self) -> bool:
        return self.measured_steps > 0 and self.sum_step_time_ms > 0

    @property
    def input_wait_pct(self) -> float | None:
        """sum(input_wait_ms) / sum(step_time_ms) over the steps after warm-up, in %: the
        chief's on one host, in a cluster the worker's that waits most."""
        pace = self._input_pace()
        if pace is not None:
            return pace[1]
        if not self.measured or self.sum_waited_ms <= 0:
            return None
        return input_wait_pct(self.sum_input_wait_ms, self.sum_waited_ms)

    @property
    def input_wait_worker(self) -> int | None:
        """Whose input wait ``input_wait_pct`` is, in a cluster; None on one host."""
        pace = self._input_pace()
        return None if pace is None else pace[0]

    def _input_pace(self) -> tuple[int, float] | None:
        if self.workers <= 1:
            return None
        return pace_setter({w: wait.input_wait_pct for w, wait in self.worker_waits.items()})

    @property
    def input_breakdown(self) -> Breakdown | None:
        """The breakdown of the steps ``input_wait_pct`` is over: the chief's measured steps
        on one host, in a cluster the waiting worker's (the summary's five shares)."""
        pace = self._input_pace()
        if pace is None:
            return self.breakdown
        wait = self.worker_waits.get(pace[0])
        return wait.breakdown if wait is not None else None

    @property
    def median_examples_per_s(self) -> float | None:
        return self.rates.median()

    @property
    def grad_sync_bytes_per_s(self) -> float | None:
        if not self.measured:
            return None
        return per_second(self.sum_grad_sync_bytes, self.sum_step_time_ms)

    @property
    def bus_bytes_per_s(self) -> float | None:
        """All-reduce bus bandwidth over the measured steps (``bus_bandwidth``)."""
        return bus_bandwidth(self.sum_timed_sync_bytes, self.breakdown)

    @property
    def prefetch(self) -> Any:
        return get_setting(self.settings, PREFETCH_KEY)

    @property
    def accumulation_steps(self) -> Any:
        return get_setting(self.settings, ACCUMULATION_KEY)

    @property
    def global_batch_size(self) -> Any:
        return get_setting(self.settings, BATCH_KEY)


def add_wait(summary: AttemptSummary, worker: int, step_time_ms: float,
             wait_ms: float | None, timed: Breakdown | None) -> bool:
    """Count a worker's step in its attempt's input wait (and breakdown); whether it was
    measured (a step without an input wait is not)."""
    wait = summary.worker_waits.get(worker)
    if wait is None:
        wait = summary.worker_waits[worker] = WorkerWait()
    wait.steps_seen += 1
    if wait.steps_seen <= WARMUP_STEPS or step_time_ms <= 0 or wait_ms is None:
        return False
    wait.measured_steps += 1
    wait.sum_step_time_ms += step_time_ms
    wait.sum_input_wait_ms += wait_ms
    if timed is not None:
        wait.breakdown = timed if wait.breakdown is None else wait.breakdown + timed
    return True


def _differ(a: Any, b: Any) -> bool:
    # True == 1 in Python, but prefetch on (autotune) is not one batch of prefetch.
    return a != b or isinstance(a, bool) != isinstance(b, bool)


def differing_settings(summaries: Iterable[AttemptSummary]) -> list[str]:
    """The dotted settings whose values differ between these attempts, in the config's order.

    Keys as ``changes.dotted_settings`` splits them (``data.cache``; a deeper value such
    as the cluster's list of workers is one value); an attempt with no settings known
    is left out.
    """
    flat = [dotted_settings(s.settings) for s in summaries if s.settings]
    keys: dict[str, None] = {}
    for one in flat:
        keys.update(dict.fromkeys(one))
    return [
        key for key in keys
        if any(_differ(one.get(key), flat[0].get(key)) for one in flat[1:])
    ]
