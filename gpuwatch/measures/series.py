"""Bounded histories for the dashboard: the whole run coarse, the devices' recent samples fine.

Pure Python; RunState calls these from its fold, so each costs O(1) per event (amortised),
never grows past its bound, and is plain data a snapshot encodes as JSON. ``RunSeries``
keeps one figure against step in at most ``capacity`` buckets, each of ONE attempt (first
and last step, count, sum, min, max); when full, neighbours of the same attempt merge
pairwise and each bucket takes twice the points (``stride``), so the attempt boundaries
stay exact at every resolution. ``RunHistory`` is the plot screen's figures: examples/s,
input wait %, step time and the step's shares after each attempt's warm-up, and the loss
of every step. ``DeviceHistory`` keeps the chief's host's last ``DEVICE_HISTORY_SAMPLES``
samples per GPU as they came, and counts them so a sparkline buckets on fixed boundaries.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from trainer_runtime.protocol import GpuSample, Step

# Buckets per whole-run series: a 160-column chart is about 300 dots wide.
RUN_SERIES_POINTS = 512
# Device samples kept per GPU: five minutes at the supervisor's 1 Hz.
DEVICE_HISTORY_SAMPLES = 300


@dataclass(slots=True)
class Bucket:
    """Consecutive points of one attempt, summarised."""

    attempt: int
    first_x: float
    last_x: float
    count: int
    total: float
    low: float
    high: float

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def mean_x(self) -> float:
        return (self.first_x + self.last_x) / 2.0

    def take(self, x: float, value: float) -> None:
        self.last_x = x
        self.count += 1
        self.total += value
        # min() and max() of the two, as merge() takes them, without the calls (per step)
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value

    def merge(self, later: Bucket) -> None:
        self.last_x = later.last_x
        self.count += later.count
        self.total += later.total
        self.low = min(self.low, later.low)
        self.high = max(self.high, later.high)


@dataclass
class RunSeries:
    """One figure against step over the whole run, in at most `capacity` buckets."""

    capacity: int = RUN_SERIES_POINTS
    stride: int = 1  # points a new bucket takes before the next one starts
    buckets: list[Bucket] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.capacity < 2:
            raise ValueError(f"a RunSeries needs room for 2 buckets (capacity {self.capacity})")

    def __len__(self) -> int:
        return len(self.buckets)

    def add(self, attempt: int, x: float, value: float) -> None:
        buckets = self.buckets
        if buckets:
            last = buckets[-1]
            if last.attempt == attempt and last.count < self.stride:
                last.take(x, value)
                return
        if len(buckets) >= self.capacity:
            self._halve()
        self.buckets.append(Bucket(attempt, x, x, 1, value, value, value))

    def _halve(self) -> None:
        """Merge neighbours of the same attempt pairwise; double the stride."""
        merged: list[Bucket] = []
        buckets = self.buckets
        i = 0
        while i < len(buckets):
            bucket = buckets[i]
            if i + 1 < len(buckets) and buckets[i + 1].attempt == bucket.attempt:
                bucket.merge(buckets[i + 1])
                i += 2
            else:
                i += 1
            merged.append(bucket)
        if len(merged) >= self.capacity:
            # More attempts than buckets (no two neighbours share one): the oldest go.
            merged = merged[len(merged) - self.capacity // 2 :]
        self.buckets = merged
        self.stride *= 2

    def attempts(self) -> list[int]:
        """The attempts with points, in the order they came."""
        return list(dict.fromkeys(bucket.attempt for bucket in self.buckets))

    def points(self, attempt: int) -> tuple[list[float], list[float]]:
        """(steps, values) of one attempt: each bucket's mean step and mean value."""
        chosen = [b for b in self.buckets if b.attempt == attempt]
        return [b.mean_x for b in chosen], [b.mean for b in chosen]


@dataclass
class RunHistory:
    """The plot screen's figures against step, every attempt, the chief's steps."""

    examples_per_s: RunSeries = field(default_factory=RunSeries)
    input_wait_pct: RunSeries = field(default_factory=RunSeries)
    step_time_ms: RunSeries = field(default_factory=RunSeries)
    loss: RunSeries = field(default_factory=RunSeries)
    compute_pct: RunSeries = field(default_factory=RunSeries)
    sync_pct: RunSeries = field(default_factory=RunSeries)
    update_pct: RunSeries = field(default_factory=RunSeries)

    def add(self, step: Step, *, warmup: bool) -> None:
        attempt, x, loss = step.attempt, step.step, step.loss
        if loss is not None:
            self.loss.add(attempt, x, loss)
        if warmup or step.step_time_ms <= 0:
            return
        self.step_time_ms.add(attempt, x, step.step_time_ms)
        rate, wait = step.examples_per_s, step.input_wait_pct
        if rate is not None:
            self.examples_per_s.add(attempt, x, rate)
        if wait is not None:
            self.input_wait_pct.add(attempt, x, wait)
        parts = step.breakdown
        if parts is not None:
            self.compute_pct.add(attempt, x, parts.pct("compute"))
            self.sync_pct.add(attempt, x, parts.pct("sync"))
            self.update_pct.add(attempt, x, parts.pct("update"))


def _recent() -> deque[float | None]:
    return deque(maxlen=DEVICE_HISTORY_SAMPLES)


# Each series of a GPU's history, and the reading of a GpuSample it keeps.
_READINGS: tuple[tuple[str, Callable[[GpuSample], float | None]], ...] = (
    ("util_pct", lambda gpu: gpu.util_gpu_pct),
    ("mem_used_bytes", lambda gpu: gpu.mem_used_bytes),
    ("pcie_tx_bytes_per_s", lambda gpu: gpu.pcie_tx_bytes_per_s),
    ("pcie_rx_bytes_per_s", lambda gpu: gpu.pcie_rx_bytes_per_s),
    ("nvlink_tx_bytes_per_s", lambda gpu: gpu.nvlink_tx_bytes_per_s),
    ("nvlink_rx_bytes_per_s", lambda gpu: gpu.nvlink_rx_bytes_per_s),
)


def _reading(value: float | None) -> float | None:
    return None if value is None else float(value)


@dataclass
class GpuHistory:
    """One GPU's last samples (None: no reading in that sample); its latest state."""

    index: int
    name: str | None = None
    mem_total_bytes: float | None = None
    temperature_c: float | None = None
    lost: bool = False
    mig: bool = False
    present: bool = True  # in the latest sample
    util_pct: deque[float | None] = field(default_factory=_recent)
    mem_used_bytes: deque[float | None] = field(default_factory=_recent)
    pcie_tx_bytes_per_s: deque[float | None] = field(default_factory=_recent)
    pcie_rx_bytes_per_s: deque[float | None] = field(default_factory=_recent)
    nvlink_tx_bytes_per_s: deque[float | None] = field(default_factory=_recent)
    nvlink_rx_bytes_per_s: deque[float | None] = field(default_factory=_recent)

    def add(self, gpu: GpuSample | None) -> None:
        """One sample's reading of this GPU (None: the GPU was not in the sample)."""
        self.present = gpu is not None
        if gpu is not None:
            self.name = gpu.name or self.name
            self.mem_total_bytes = _reading(gpu.mem_total_bytes) or self.mem_total_bytes
            self.temperature_c = _reading(gpu.temperature_c)
            self.lost = gpu.lost
            self.mig = gpu.mig
        for attr, read in _READINGS:
            series: deque[float | None] = getattr(self, attr)
            series.append(None if gpu is None else _reading(read(gpu)))

    def latest(self, attr: str) -> float | None:
        series: deque[float | None] = getattr(self, attr)
        return series[-1] if series else None


@dataclass
class DeviceHistory:
    """The chief's host's GPUs, their last DEVICE_HISTORY_SAMPLES samples each."""

    samples_seen: int = 0
    t: deque[float | None] = field(default_factory=_recent)
    gpus: list[GpuHistory] = field(default_factory=list)  # by index

    def add(self, gpus: Iterable[GpuSample], t: float | None) -> None:
        by_index = {gpu.index: gpu for gpu in gpus}
        known = {history.index for history in self.gpus}
        new = [GpuHistory(index) for index in sorted(by_index) if index not in known]
        for history in new:  # a GPU seen late: its earlier samples were not there
            for series_attr, _ in _READINGS:
                getattr(history, series_attr).extend([None] * len(self.t))
        if new:
            self.gpus = sorted([*self.gpus, *new], key=lambda history: history.index)
        for history in self.gpus:
            history.add(by_index.get(history.index))
        self.t.append(t)
        self.samples_seen += 1

    @property
    def span_s(self) -> float | None:
        """Seconds between the oldest and the newest sample kept."""
        times = [t for t in self.t if t is not None]
        return times[-1] - times[0] if len(times) >= 2 else None


def bucket_means(
    values: Sequence[float | None], seen: int, per_cell: int, cells: int
) -> list[float | None]:
    """The mean of each `per_cell` samples on fixed boundaries, the newest cell last.

    `values` are the last len(values) of `seen` samples; cell boundaries fall on
    multiples of `per_cell` in the sample count, so a new sample changes only the last
    cell (the sparkline moves one cell every `per_cell` samples, instead of shimmering).
    None for a cell with no reading; at most `cells` cells, fewer early in the run.
    """
    if per_cell < 1 or cells < 1 or not values:
        return []
    first = seen - len(values)  # the sample number of values[0]
    last_cell = (seen - 1) // per_cell
    first_cell = max(first // per_cell, last_cell - cells + 1)
    sums: list[float] = [0.0] * (last_cell - first_cell + 1)
    counts: list[int] = [0] * len(sums)
    for offset, value in enumerate(values):
        cell = (first + offset) // per_cell - first_cell
        if cell >= 0 and value is not None:
            sums[cell] += value
            counts[cell] += 1
    return [total / count if count else None for total, count in zip(sums, counts, strict=True)]


__all__ = [
    "DEVICE_HISTORY_SAMPLES",
    "RUN_SERIES_POINTS",
    "Bucket",
    "DeviceHistory",
    "GpuHistory",
    "RunHistory",
    "RunSeries",
    "bucket_means",
]
