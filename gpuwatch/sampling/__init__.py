"""Device sampling for the supervisor: GPUs through NVML, the host through psutil.

Plain data, no Textual, no TensorFlow, no pydantic/yaml: this package must import
with only nvidia-ml-py and psutil installed (tests/gpu runs it that way on GPU
boxes). The supervisor calls ``DeviceSampler.sample()`` from a thread at 2 Hz
and sends ``sample_event(sample)``, the protocol's ``sample`` event.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuwatch.sampling.gpu import GpuReader
from gpuwatch.sampling.host import HostSampler
from gpuwatch.sampling.nvml import cuda_visible_count, describe_init_failure, visible_gpu_count
from gpuwatch.sampling.throughput import WINDOW_MAX_AGE_S, PcieWindowPoller
from gpuwatch.sampling.types import DeviceSample
from trainer_runtime.protocol import GpuSample, HostSample, Sample, wire_field_names

__all__ = [
    "GPU_FRAME_KEYS",
    "HOST_FRAME_KEYS",
    "DeviceSample",
    "DeviceSampler",
    "cuda_version_text",
    "cuda_visible_count",
    "sample_event",
    "visible_gpu_count",
]


def cuda_version_text(version: int | None) -> str | None:
    """NVML's CUDA driver version integer (12040) as text ("12.4")."""
    if version is None:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


class DeviceSampler:
    """Samples every GPU and the host. One nvmlInit per sampler, handles kept, close() once.

    ``run_pids`` returns the host pids of the watched run (the trainer's
    process tree): they mark GPU processes ``in_run`` and are summed into the
    host's ``run_cpu_pct``/``run_rss_bytes``. ``nvml`` injects a fake pynvml
    module (tests/support/fake_nvml.py) in tests; by default ``import pynvml``.
    Neither the constructor nor ``sample()`` raises.
    """

    def __init__(
        self,
        run_pids: Callable[[], set[int]] | None = None,
        nvml: Any | None = None,
        spare_pids: Callable[[], set[int]] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        window_max_age_s: float = WINDOW_MAX_AGE_S,
    ) -> None:
        self._run_pids = run_pids
        self._spare_pids = spare_pids
        self._clock = clock
        self._lock = threading.Lock()
        self._host = HostSampler(clock=clock)
        self._readers: list[GpuReader] = []
        self._poller: PcieWindowPoller | None = None
        self._initialized = False
        self._closed = False
        self.nvml_unavailable: str | None = None
        self.driver_version: str | None = None
        self.nvml_version: str | None = None
        self.cuda_driver_version: int | None = None
        if nvml is None:
            try:
                import pynvml as nvml_module
            except ImportError:
                self.nvml_unavailable = (
                    "nvidia-ml-py is not installed (pip install nvidia-ml-py): no GPU readings"
                )
                return
            nvml = nvml_module
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:  # any failure means "no NVML", said plainly
            self.nvml_unavailable = describe_init_failure(nvml, exc)
            return
        self._initialized = True
        self.driver_version = self._system_text("nvmlSystemGetDriverVersion")
        self.nvml_version = self._system_text("nvmlSystemGetNVMLVersion")
        try:
            self.cuda_driver_version = int(nvml.nvmlSystemGetCudaDriverVersion())
        except Exception:  # informational only
            self.cuda_driver_version = None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.nvml_unavailable = f"NVML cannot count the GPUs: {exc}"
            return
        if count == 0:
            self.nvml_unavailable = (
                f"NVML works (driver {self.driver_version or 'unknown'}) but sees no NVIDIA GPU"
            )
            return
        self._poller = PcieWindowPoller(nvml, max_age_s=window_max_age_s, clock=clock)
        self._readers = [GpuReader(nvml, index, self._poller, clock) for index in range(count)]

    def _system_text(self, function: str) -> str | None:
        try:
            value = getattr(self._nvml, function)()
        except Exception:  # informational only
            return None
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    @property
    def gpu_count(self) -> int:
        return len(self._readers)

    def sample(self) -> DeviceSample:
        """Every GPU and the host, now. Never raises, never waits on a 20 ms PCIe window."""
        with self._lock:
            pids = self._pids()
            try:
                host = self._host.sample(pids, self._spares())
            except Exception:  # host readings degrade, the GPUs still count
                host = HostSample()
            if self._closed:
                return DeviceSample(time.time(), host, (), "sampler closed")
            if self._poller is not None:
                # Start the next window pass now so it runs while we read the rest.
                self._poller.kick()
            gpus = tuple(reader.read(pids or set()) for reader in self._readers)
            return DeviceSample(time.time(), host, gpus, self.nvml_unavailable)

    def _spares(self) -> set[int]:
        if self._spare_pids is None:
            return set()
        try:
            return {int(pid) for pid in self._spare_pids()}
        except Exception:  # a failing callback means "no spare known"
            return set()

    def _pids(self) -> set[int] | None:
        if self._run_pids is None:
            return None
        try:
            return {int(pid) for pid in self._run_pids()}
        except Exception:  # a failing callback means "no run pids known"
            return None

    def close(self) -> None:
        """Stop the PCIe worker and call nvmlShutdown, once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._poller is not None:
                self._poller.close()
            if self._initialized:
                self._initialized = False
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # shutting down: nothing left to do
                    pass

    def __enter__(self) -> DeviceSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_number(value: Any, digits: int | None = None) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, digits) if digits is not None else value
    return value


# The keys of a sample frame's host object and of each object in its gpus, in order
# (gpuwatch.runs.export's columns read them).
HOST_FRAME_KEYS = wire_field_names(HostSample)
GPU_FRAME_KEYS = wire_field_names(GpuSample)


def _whole(value: Any) -> int | None:
    value = _json_number(value, 0)
    return None if value is None else int(value)


def _sent_gpu(gpu: GpuSample) -> GpuSample:
    # Percentages, watts and degrees to 0.1; rates to whole bytes/s: enough for a
    # dashboard, and it keeps the 2 Hz frame short. Why a reading is None is not sent:
    # the event is what a reader of the record gets (the supervisor folds it as is).
    return replace(
        gpu,
        unavailable=(),
        util_gpu_pct=_json_number(gpu.util_gpu_pct, 1),
        util_mem_pct=_json_number(gpu.util_mem_pct, 1),
        temperature_c=_json_number(gpu.temperature_c, 1),
        power_w=_json_number(gpu.power_w, 1),
        power_limit_w=_json_number(gpu.power_limit_w, 1),
        pcie_tx_bytes_per_s=_whole(gpu.pcie_tx_bytes_per_s),
        pcie_rx_bytes_per_s=_whole(gpu.pcie_rx_bytes_per_s),
        nvlink_tx_bytes_per_s=_whole(gpu.nvlink_tx_bytes_per_s),
        nvlink_rx_bytes_per_s=_whole(gpu.nvlink_rx_bytes_per_s),
    )


def sample_event(sample: DeviceSample) -> Sample:
    """The protocol's ``sample`` event of a device sample: host, gpus, nvml, its readings
    rounded as they are sent."""
    host = sample.host
    sent_host = replace(
        host,
        cpu_pct=_json_number(host.cpu_pct, 1),
        per_cpu_pct=tuple(_json_number(p, 1) for p in host.per_cpu_pct),
        load_1m=_json_number(host.load_1m, 2),
        run_cpu_pct=_json_number(host.run_cpu_pct, 1),
    )
    return Sample(host=sent_host, gpus=[_sent_gpu(gpu) for gpu in sample.gpus],
                  nvml=sample.nvml)
