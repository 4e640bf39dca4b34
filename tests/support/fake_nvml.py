"""A stand-in for the ``pynvml`` module (nvidia-ml-py), for tests and bench/bench_sampler.py.

Test-only: it lives with the tests, outside the installed package.

It has the real module's function names, constants and error classes
(``NVMLError`` with ``.value``, one ``NVMLError_<Name>`` subclass per
``NVML_ERROR_*`` code, and ``NVMLError(code)`` returning the subclass), so the
sampler cannot tell it from the real thing. tests/sampling/test_sampling_gpu.py checks
those names and values against the installed pynvml so the fake cannot drift.

Each GPU is a mutable ``FakeGpu``: a test changes its readings, advances the
fake clock, injects an error code per NVML function or per field id, or marks
the GPU lost, then samples again.
"""

from __future__ import annotations

import string
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_NVLINK_MAX_LINKS = 36

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198

nvmlMemory_v2 = 0x02000028

_VALUE_TYPE_WIDTH = {
    NVML_VALUE_TYPE_UNSIGNED_INT: 32,
    NVML_VALUE_TYPE_UNSIGNED_LONG: 64,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: 64,
    NVML_VALUE_TYPE_UNSIGNED_SHORT: 16,
}
_VALUE_TYPE_MEMBER = {
    NVML_VALUE_TYPE_DOUBLE: "dVal",
    NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: ``NVMLError(code)`` builds the matching subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012 (pynvml's own name)
    value: int

    def __new__(cls, value: int, *args: Any) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int, *args: Any) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML error {self.value}")


_ERROR_STRINGS = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _make_error_classes() -> dict[str, type[NVMLError]]:
    # Same naming rule as pynvml._extractNVMLErrorsAsClasses:
    # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    classes: dict[str, type[NVMLError]] = {}
    for name, code in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        words = string.capwords(name.removeprefix("NVML_ERROR_"), "_").replace("_", "")
        cls_name = "NVMLError_" + words

        def make_new(code: int) -> Any:
            def new(subclass: type[NVMLError], *args: Any) -> NVMLError:
                return NVMLError.__new__(subclass, code)

            return new

        cls = type(cls_name, (NVMLError,), {"__new__": make_new(code), "__module__": __name__})
        NVMLError._valClassMapping[code] = cls
        classes[cls_name] = cls
    return classes


ERROR_CLASSES = _make_error_classes()
globals().update(ERROR_CLASSES)
# Named here so type checkers and readers see the ones the sampler relies on.
NVMLError_NotSupported = ERROR_CLASSES["NVMLError_NotSupported"]
NVMLError_NoPermission = ERROR_CLASSES["NVMLError_NoPermission"]
NVMLError_GpuIsLost = ERROR_CLASSES["NVMLError_GpuIsLost"]
NVMLError_LibraryNotFound = ERROR_CLASSES["NVMLError_LibraryNotFound"]
NVMLError_DriverNotLoaded = ERROR_CLASSES["NVMLError_DriverNotLoaded"]
NVMLError_Uninitialized = ERROR_CLASSES["NVMLError_Uninitialized"]
NVMLError_Unknown = ERROR_CLASSES["NVMLError_Unknown"]


@dataclass
class FakeGpu:
    """One simulated GPU; every attribute is what the matching NVML call returns."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util_gpu: int = 50
    util_mem: int = 20
    mem_used: int = 10 * 2**30
    mem_total: int = 80 * 2**30
    mem_reserved: int = 512 * 2**20
    temperature: int = 45
    power_mw: int = 250_000
    power_limit_mw: int = 700_000
    sm_clock: int = 1980
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    # Cumulative byte counters (fields 197/198); reported modulo the width of
    # pcie_counter_type, as a real narrow counter would be.
    pcie_tx_bytes: int = 0
    pcie_rx_bytes: int = 0
    pcie_counter_type: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    # What nvmlDeviceGetPcieThroughput returns, KB/s (after its 20 ms window).
    pcie_window_tx_kbps: int = 0
    pcie_window_rx_kbps: int = 0
    nvlink_active: list[bool] = field(default_factory=list)
    nvlink_tx_kib: list[int] = field(default_factory=list)
    nvlink_rx_kib: list[int] = field(default_factory=list)
    nvlink_version: int | None = 4
    mig: bool = False
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    # NVML function name -> error code it raises; field id -> per-field return code.
    errors: dict[str, int] = field(default_factory=dict)
    field_errors: dict[int, int] = field(default_factory=dict)


class FakeHandle:
    """What nvmlDeviceGetHandleByIndex returns: opaque to the caller."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"FakeHandle({self.index})"


class FakeNVML:
    """A fake ``pynvml`` module. Pass an instance as ``DeviceSampler(nvml=...)``.

    ``window_s`` makes nvmlDeviceGetPcieThroughput block like the real 20 ms
    window (a real sleep, releasing the GIL as the ctypes call does);
    ``window_gate``, when set, makes it block until the event is set, so a test
    can prove that the caller never waits on the window.
    """

    NVMLError = NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        window_s: float = 0.0,
        window_gate: threading.Event | None = None,
        driver_version: str = "550.54.15",
        nvml_version: str = "12.550.54.15",
        cuda_driver_version: int = 12040,
    ) -> None:
        self.gpus = list(gpus) if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.window_s = window_s
        self.window_gate = window_gate
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.cuda_driver_version = cuda_driver_version
        # The fake's own clock, in seconds: field values are stamped with it
        # (NVML stamps them in microseconds), so tests control the interval.
        self.time_s = 1000.0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.window_calls = 0
        self.calls: dict[str, int] = {}
        self.calls_by_gpu: dict[int, int] = {}
        self._initialized = False
        self._lock = threading.Lock()

    # The module's constants and error classes, as attributes like pynvml's.
    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "nvmlMemory")):
            try:
                return globals()[name]
            except KeyError:
                pass
        raise AttributeError(name)

    # -- helpers ---------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the fake clock on (field-value timestamps follow it)."""
        self.time_s += seconds

    def _enter(self, fn: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        with self._lock:
            self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self._initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        with self._lock:
            self.calls_by_gpu[handle.index] = self.calls_by_gpu.get(handle.index, 0) + 1
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        code = gpu.errors.get(fn)
        if code is not None:
            raise NVMLError(code)
        return gpu

    def _gpu(self, fn: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._enter(fn, handle)
        assert gpu is not None
        return gpu

    # -- library ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.shutdown_calls += 1
        self._initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = FakeHandle(index)
        self._gpu("nvmlDeviceGetHandleByIndex", handle)
        return handle

    # -- per device ------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if gpu.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        if version is None:
            # v1 counts the driver's reserved memory as used, as the real one does.
            used = gpu.mem_used + gpu.mem_reserved
            return SimpleNamespace(total=gpu.mem_total, used=used, free=gpu.mem_total - used)
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        free = gpu.mem_total - gpu.mem_reserved - gpu.mem_used
        return SimpleNamespace(
            version=version,
            total=gpu.mem_total,
            reserved=gpu.mem_reserved,
            free=free,
            used=gpu.mem_used,
        )

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        return self._gpu("nvmlDeviceGetClockInfo", handle).sm_clock

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_max_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_max_width

    def nvmlDeviceGetPcieThroughput(self, handle: FakeHandle, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", handle)
        with self._lock:
            self.window_calls += 1
        if self.window_gate is not None:
            self.window_gate.wait()
        if self.window_s:
            time.sleep(self.window_s)
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if counter == NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_window_tx_kbps
        return gpu.pcie_window_rx_kbps

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if not 0 <= link < len(gpu.nvlink_active):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_ENABLED if gpu.nvlink_active[link] else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkVersion(self, handle: FakeHandle, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkVersion", handle)
        if not 0 <= link < len(gpu.nvlink_active) or gpu.nvlink_version is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.nvlink_version

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[SimpleNamespace]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[SimpleNamespace]:
        gpu = self._gpu("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in gpu.graphics_processes
        ]

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[Any]) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        stamp_us = int(self.time_s * 1e6)
        out = []
        for item in field_ids:
            field_id, scope = item if isinstance(item, tuple) else (item, 0)
            value_type, raw = self._field(gpu, field_id, scope)
            ret = gpu.field_errors.get(field_id)
            if ret is None:
                ret = NVML_SUCCESS if raw is not None else NVML_ERROR_NOT_SUPPORTED
            value = SimpleNamespace(
                dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0
            )
            if ret == NVML_SUCCESS and raw is not None:
                width = _VALUE_TYPE_WIDTH.get(value_type)
                setattr(value, _VALUE_TYPE_MEMBER[value_type], raw % (1 << width) if width else raw)
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    timestamp=stamp_us if ret == NVML_SUCCESS else 0,
                    latencyUsec=0,
                    valueType=value_type,
                    nvmlReturn=ret,
                    value=value,
                )
            )
        return out

    @staticmethod
    def _field(gpu: FakeGpu, field_id: int, scope: int) -> tuple[int, int | None]:
        if field_id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES:
            return gpu.pcie_counter_type, gpu.pcie_tx_bytes
        if field_id == NVML_FI_DEV_PCIE_COUNT_RX_BYTES:
            return gpu.pcie_counter_type, gpu.pcie_rx_bytes
        if field_id == NVML_FI_DEV_NVLINK_LINK_COUNT:
            if not gpu.nvlink_active:
                return NVML_VALUE_TYPE_UNSIGNED_INT, None
            return NVML_VALUE_TYPE_UNSIGNED_INT, len(gpu.nvlink_active)
        if field_id in (
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ):
            counters = (
                gpu.nvlink_tx_kib
                if field_id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                else gpu.nvlink_rx_kib
            )
            if scope >= len(counters):
                return NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, None
            return NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, counters[scope]
        return NVML_VALUE_TYPE_UNSIGNED_INT, None


def fake_h100_box(gpu_count: int = 8, **kwargs: Any) -> FakeNVML:
    """An 8-GPU box like an HGX H100 with NVLink, for the bench and demos.

    Its PCIe byte counters are 32 bits wide, as driver 580.159.04 reported them on a real
    H100 80GB HBM3 (docs/gpu-validation.md): too narrow for a gen5 x16 link at 2 Hz, so
    the sampler reads PCIe through the 20 ms window, as it does on the real GPU.
    """
    gpus = [
        FakeGpu(
            uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
            pcie_counter_type=NVML_VALUE_TYPE_UNSIGNED_INT,
            nvlink_active=[True] * 18,
            nvlink_tx_kib=[0] * 18,
            nvlink_rx_kib=[0] * 18,
        )
        for index in range(gpu_count)
    ]
    return FakeNVML(gpus, **kwargs)
