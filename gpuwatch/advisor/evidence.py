"""What the rules read (``Evidence``): the run's figures, or one worker's in a cluster,
with the settings, the hello, and the GPUs of the host's latest sample (``run_gpus``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwatch.advisor.findings import HIGH_GPU_MEM_FRACTION
from gpuwatch.measures import peaks
from gpuwatch.runstate import (
    ACCUMULATION_KEY,
    BATCH_KEY,
    CHIEF,
    Figures,
    HostReading,
    WorkerSummary,
    command_argv,
    get_setting,
)
from trainer_runtime.protocol import Breakdown, GpuSample, Hello

JIT_KEY = "train.jit_compile"
PRECISION_KEY = "train.mixed_precision"
CROSS_DEVICE_OPS_KEY = "strategy.cross_device_ops"
STEPS_PER_EXECUTION_KEY = "train.steps_per_execution"


@dataclass(frozen=True)
class Evidence:
    """What the rules read: the run's figures, or one worker's in a cluster.

    ``worker``: whose figures (None: the run's, the chief's steps); ``named``: the
    verdict says "on worker N"; ``input_worker``: the worker the run's input wait is
    (a cluster's worker that waits most); ``waits_for``: a straggler this worker waits
    for in the all-reduce.
    """

    input_wait_pct: float | None
    breakdown: Breakdown | None
    settings: Mapping[str, Any]
    gpus: tuple[GpuSample, ...]  # the run's GPUs on this host (none: no GPU, or no sample)
    hello: Hello | None
    replicas: int
    workers: int = 1
    bus_bytes_per_s: float | None = None
    link: peaks.LinkPeak | None = None
    bus_pct_of_link: float | None = None
    mfu_pct: float | None = None
    worker: int | None = None
    named: bool = False
    input_worker: int | None = None
    waits_for: int | None = None
    # The shares' intervals (Figures.share_intervals); None: no per-step values behind them.
    share_intervals: Mapping[str, tuple[float, float] | None] | None = None

    @classmethod
    def of_run(cls, figures: Figures, settings: Mapping[str, Any],
               sample: HostReading | None, replicas: int, hello: Hello | None
               ) -> Evidence:
        return cls(
            input_wait_pct=figures.input_wait_pct, breakdown=figures.breakdown,
            settings=settings, gpus=run_gpus(sample), hello=hello, replicas=replicas,
            workers=max(1, len(figures.workers), hello.workers if hello is not None else 1),
            bus_bytes_per_s=figures.bus_bytes_per_s, link=figures.link,
            bus_pct_of_link=figures.bus_pct_of_link, mfu_pct=figures.mfu_pct,
            input_worker=figures.input_wait_worker, share_intervals=figures.share_intervals,
        )

    def of_worker(self, summary: WorkerSummary, *, named: bool = False,
                  waits_for: int | None = None) -> Evidence:
        """One worker's evidence: its steps, its host's GPUs; the bus figure only for the
        chief (the run's is the chief's); no link across hosts, no run-wide MFU."""
        chief = summary.worker == CHIEF
        return replace(
            self, input_wait_pct=summary.input_wait_pct, breakdown=summary.breakdown,
            gpus=run_gpus(summary.sample), bus_bytes_per_s=self.bus_bytes_per_s if chief else None,
            link=None, bus_pct_of_link=None, mfu_pct=None, worker=summary.worker, named=named,
            input_worker=None, waits_for=waits_for, share_intervals=None,
        )

    @property
    def step(self) -> str:
        """'the step', or 'its step' for a worker's."""
        return "the step" if self.worker is None else "its step"

    @property
    def named_as(self) -> str:
        return f" on worker {self.worker}" if self.named and self.worker is not None else ""

    def share(self, part: str) -> float | None:
        """A part's share of the step, in %: input wait the figures' own (the metrics line's),
        the rest from the breakdown; None where not measured."""
        if part == "input" and self.input_wait_pct is not None:
            return self.input_wait_pct
        return self.breakdown.pct(part) if self.breakdown is not None else None

    def interval(self, part: str) -> tuple[float, float] | None:
        """A part's share's interval (``Figures.share_intervals``): (share, share) where no
        per-step values are behind it, so its grade is its figure's; None with too few
        steps for one, or no share."""
        share = self.share(part)
        if share is None:
            return None
        if self.share_intervals is None or part not in self.share_intervals:
            return share, share
        return self.share_intervals[part]

    def setting(self, dotted: str) -> Any:
        return get_setting(self.settings, dotted)

    @property
    def command(self) -> bool:
        """A person's own command (gpuwatch run): its settings are its own code's."""
        return command_argv(self.settings) is not None

    @property
    def accumulation(self) -> int:
        value = self.setting(ACCUMULATION_KEY)
        return value if isinstance(value, int) and value > 0 else 1

    @property
    def per_replica_batch(self) -> int | None:
        """Examples per replica per micro-step: the settings' (a live change moves it), else
        the hello's."""
        batch = self.setting(BATCH_KEY)
        if isinstance(batch, int) and batch > 0 and self.replicas > 0:
            return batch // (self.replicas * self.accumulation)
        return self.hello.per_replica_batch if self.hello is not None else None

    @property
    def on_gpu(self) -> bool:
        if self.hello is not None:
            return self.hello.device_kind == "gpu"
        return bool(self.gpus)

    @property
    def fullest_gpu(self) -> tuple[int, float] | None:
        """(index, % of its memory used) of the fullest GPU at or above HIGH_GPU_MEM_FRACTION."""
        full: tuple[int, float] | None = None
        for gpu in self.gpus:
            used, total = gpu.mem_used_bytes, gpu.mem_total_bytes
            if used is None or total is None:
                continue
            if total > 0 and used / total >= HIGH_GPU_MEM_FRACTION:
                pct = 100.0 * used / total
                if full is None or pct > full[1]:
                    full = (gpu.index, pct)
        return full


def run_gpus(sample: HostReading | None) -> tuple[GpuSample, ...]:
    """The GPUs of a sample the run uses: those NVML lists a process of the run on, else
    every GPU present (lost ones left out)."""
    present = [g for g in (sample.gpus if sample is not None else ()) if not g.lost]
    in_run = [g for g in present if any(p.in_run for p in g.processes)]
    return tuple(in_run or present)


def mean_util(gpus: Sequence[GpuSample]) -> float | None:
    utils = [u for g in gpus if (u := g.util_gpu_pct) is not None]
    return sum(utils) / len(utils) if utils else None
