"""The immutable readings the sampler hands out: one host, one entry per GPU.

Every reading is ``float | int | None``; ``None`` means "not available" (not
supported, no permission, GPU lost, first sample of a rate, or an error), never
zero. Plain frozen dataclasses so the supervisor thread can hand them to any
other thread without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process NVML reports on a GPU (host pid, as NVML returns host pids)."""

    pid: int
    used_bytes: int | None
    in_run: bool


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. Rates are bytes per second over the last interval."""

    index: int
    name: str | None
    uuid: str | None
    lost: bool = False
    mig: bool = False
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    # Where the PCIe figures came from: "counter" (cumulative NVML counters,
    # differenced) or "window" (nvmlDeviceGetPcieThroughput's 20 ms window, read
    # by a worker thread); None while neither is available.
    pcie_source: str | None = None
    nvlink_links_active: int | None = None
    # The NVLink generation of its first active link (nvmlDeviceGetNvLinkVersion): with
    # the active links, the link's peak (gpuwatch.measures.peaks.link_peak). None: no NVLink.
    nvlink_version: int | None = None
    # Why each None reading is None, for `gpuwatch doctor` and tooltips; not
    # sent in the 2 Hz frame (it rarely changes and would bloat every frame).
    unavailable: tuple[tuple[str, str], ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class HostSample:
    """The host: whole-machine CPU and memory, plus the watched run's processes."""

    cpu_pct: float | None = None
    per_cpu_pct: tuple[float, ...] = ()
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    load_1m: float | None = None
    # Summed over the run's processes; percent of one core (like top), so it can
    # exceed 100 on a multi-core box. None when there are no run pids.
    run_cpu_pct: float | None = None
    run_rss_bytes: int | None = None
    # The spare trainer waiting for a relaunch (TensorFlow imported): its memory, which the
    # run holds on this host though it is not training. None while no spare waits.
    spare_rss_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """Everything one call to DeviceSampler.sample() saw."""

    t: float
    host: HostSample
    gpus: tuple[GpuSample, ...]
    # None when NVML works; otherwise a plain sentence saying why there are no GPUs.
    nvml: str | None
