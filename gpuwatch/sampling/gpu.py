"""NVML readings per GPU: kept handles, per-field degrade, counters turned into rates.

Only gpuwatch.sampling talks to NVML; nvml.py has the rules its calls keep, throughput.py
how PCIe and NVLink counters become rates.

Split by job: NvmlCalls (nvml.py) makes one call for one reading and degrades it;
CounterRates turns cumulative counters into rates; PcieThroughput picks the counters or
the PcieWindowPoller worker; NvlinkThroughput finds the active links and sums their
counters (those four in throughput.py); GpuReader, here, owns the handle and builds the
GpuSample.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuwatch.sampling.nvml import (
    GPU_LOST,
    GpuLostError,
    NvmlCalls,
    error_code,
    nvml_code,
    reason_of,
)
from gpuwatch.sampling.throughput import (
    CounterReads,
    NvlinkThroughput,
    PcieThroughput,
    PcieWindowPoller,
)
from trainer_runtime.protocol import GpuProcess, GpuSample

__all__ = ["GpuReader"]


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class GpuReader:
    """One GPU: its handle, the per-field readings, and its PCIe and NVLink throughput."""

    def __init__(
        self,
        nvml: Any,
        index: int,
        poller: PcieWindowPoller,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self._nvml = nvml
        self._clock = clock
        self._handle: Any = None
        self.name: str | None = None
        self.uuid: str | None = None
        self.lost = False
        self.mig = False
        self._calls = NvmlCalls(nvml)
        self._pcie = PcieThroughput(self._calls, index, poller)
        self._nvlink = NvlinkThroughput(self._calls, clock)
        self._memory_v2: bool | None = None
        try:
            self._open()
        except GpuLostError:
            self._mark_lost()

    def _open(self) -> None:
        self._handle = self._calls.call("handle", "nvmlDeviceGetHandleByIndex", self.index)
        if self._handle is None:
            return
        name = self._calls.call("name", "nvmlDeviceGetName", self._handle)
        uuid = self._calls.call("uuid", "nvmlDeviceGetUUID", self._handle)
        self.name = None if name is None else _text(name)
        self.uuid = None if uuid is None else _text(uuid)
        mode = self._calls.call("mig", "nvmlDeviceGetMigMode", self._handle)
        enabled = nvml_code(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        # Not supported (pre-Ampere, consumer cards) means no MIG.
        self.mig = bool(mode) and mode[0] == enabled
        self._calls.reasons.pop("mig", None)

    def _mark_lost(self) -> None:
        if not self.lost:
            self.lost = True
            self._pcie.stop()

    # -- the sample ------------------------------------------------------------

    def read(self, run_pids: set[int]) -> GpuSample:
        """This GPU now. Never raises."""
        self._calls.reasons = {}
        if self.lost:
            return self._lost_sample()
        try:
            if self._handle is None:
                self._calls.sticky.pop("handle", None)
                self._open()
                if self._handle is None:
                    return GpuSample(
                        index=self.index,
                        name=self.name,
                        uuid=self.uuid,
                        unavailable=(("handle", self._calls.reasons.get("handle", "no handle")),),
                    )
            return self._read(run_pids)
        except GpuLostError:
            self._mark_lost()
            return self._lost_sample()
        except Exception as exc:  # a bug here must not end the sampling
            return GpuSample(
                index=self.index,
                name=self.name,
                uuid=self.uuid,
                mig=self.mig,
                unavailable=(("sample", f"error: {exc!r}"),),
            )

    def _lost_sample(self) -> GpuSample:
        return GpuSample(
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            lost=True,
            mig=self.mig,
            unavailable=(("all", GPU_LOST),),
        )

    def _read(self, run_pids: set[int]) -> GpuSample:
        nvml, handle, reasons = self._nvml, self._handle, self._calls.reasons
        util_gpu: float | None = None
        util_mem: float | None = None
        if self.mig:
            reasons["util_gpu_pct"] = reasons["util_mem_pct"] = (
                "MIG mode: whole-GPU utilization is not available"
            )
        else:
            util = self._calls.call("util", "nvmlDeviceGetUtilizationRates", handle)
            if util is not None:
                util_gpu, util_mem = float(util.gpu), float(util.memory)
        mem_used, mem_total = self._memory()
        temperature = self._calls.call(
            "temperature_c",
            "nvmlDeviceGetTemperature",
            handle,
            nvml_code(nvml, "NVML_TEMPERATURE_GPU", 0),
        )
        power_mw = self._calls.call("power_w", "nvmlDeviceGetPowerUsage", handle)
        limit_mw = self._calls.call("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", handle)
        sm_clock = self._calls.call(
            "sm_clock_mhz", "nvmlDeviceGetClockInfo", handle, nvml_code(nvml, "NVML_CLOCK_SM", 1)
        )
        pcie_gen = self._calls.call("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", handle)
        pcie_width = self._calls.call("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", handle)
        pcie_tx, pcie_rx, nvlink_tx, nvlink_rx = self._throughput(pcie_gen, pcie_width)
        processes = self._processes(run_pids)
        nvlink_links = self._nvlink.links
        return GpuSample(
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            lost=False,
            mig=self.mig,
            util_gpu_pct=util_gpu,
            util_mem_pct=util_mem,
            mem_used_bytes=mem_used,
            mem_total_bytes=mem_total,
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            sm_clock_mhz=None if sm_clock is None else int(sm_clock),
            pcie_gen=None if pcie_gen is None else int(pcie_gen),
            pcie_width=None if pcie_width is None else int(pcie_width),
            pcie_tx_bytes_per_s=pcie_tx,
            pcie_rx_bytes_per_s=pcie_rx,
            nvlink_tx_bytes_per_s=nvlink_tx,
            nvlink_rx_bytes_per_s=nvlink_rx,
            processes=processes,
            pcie_source=self._pcie.source,
            nvlink_links_active=None if nvlink_links is None else len(nvlink_links),
            nvlink_version=self._nvlink.version,
            unavailable=tuple(sorted(reasons.items())),
        )

    def _memory(self) -> tuple[int | None, int | None]:
        # v2 reports driver-reserved memory apart from "used", as nvidia-smi
        # does since R510; v1 folds it into used (hundreds of MiB on an H100).
        reasons = self._calls.reasons
        version = getattr(self._nvml, "nvmlMemory_v2", None)
        if self._memory_v2 is not False and version is not None:
            try:
                info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle, version=version)
                self._memory_v2 = True
                return int(info.used), int(info.total)
            except Exception as exc:  # fall back to v1 below
                if error_code(exc) == self._calls.lost_code:
                    raise GpuLostError from exc
                if self._memory_v2 is None:
                    self._memory_v2 = False
                else:
                    reasons["mem_used_bytes"] = reason_of(self._nvml, exc)
                    return None, None
        info = self._calls.call("mem_used_bytes", "nvmlDeviceGetMemoryInfo", self._handle)
        if info is None:
            reasons["mem_total_bytes"] = reasons["mem_used_bytes"]
            return None, None
        return int(info.used), int(info.total)

    def _processes(self, run_pids: set[int]) -> tuple[GpuProcess, ...]:
        reasons = self._calls.reasons
        found: dict[int, int | None] = {}
        for reading, function in (
            ("processes", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics_processes", "nvmlDeviceGetGraphicsRunningProcesses"),
        ):
            procs = self._calls.call(reading, function, self._handle)
            for proc in procs or ():
                used = getattr(proc, "usedGpuMemory", None)
                used = None if used is None else int(used)
                pid = int(proc.pid)
                known = found.get(pid)
                # A process in both lists is one process: keep its larger figure.
                if pid not in found or (used is not None and (known is None or used > known)):
                    found[pid] = used
        if "graphics_processes" in reasons and "processes" not in reasons:
            # Compute-only boards do not support the graphics list: not worth a note.
            reasons.pop("graphics_processes")
        return tuple(
            GpuProcess(pid=pid, used_bytes=used, in_run=pid in run_pids)
            for pid, used in sorted(found.items())
        )

    def _throughput(
        self, pcie_gen: int | None, pcie_width: int | None
    ) -> tuple[float | None, float | None, float | None, float | None]:
        # PCIe and NVLink counters come back from one nvmlDeviceGetFieldValues call.
        handle = self._handle
        self._pcie.learn_link_max(handle, pcie_gen, pcie_width)
        self._nvlink.discover(handle)
        wanted = self._pcie.wanted() + self._nvlink.wanted()
        reads: CounterReads = {}
        if wanted:
            values = self._calls.call("counters", "nvmlDeviceGetFieldValues", handle, wanted)
            now = self._clock()
            if values is None:
                reason = self._calls.reasons.pop("counters")
                for key in wanted:
                    reads[key] = reason
            else:
                for key, fv in zip(wanted, values, strict=False):
                    reads[key] = self._calls.counter_read(fv, now)
        pcie_tx, pcie_rx = self._pcie.rates(handle, reads)
        nvlink_tx, nvlink_rx = self._nvlink.rates(reads)
        return pcie_tx, pcie_rx, nvlink_tx, nvlink_rx
