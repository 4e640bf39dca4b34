"""NVML readings per GPU: kept handles, per-field degrade, counters turned into rates.

Only this module talks to NVML (the ``pynvml`` module of nvidia-ml-py, or a fake
with the same names). Rules it keeps, learnt from nvitop and NVML's docs:

- Each reading is fetched on its own; NotSupported / NoPermission / an unknown
  error makes *that* reading None and never loses the sample. NotSupported and
  NoPermission do not change while the process lives, so they are remembered
  and the call is not repeated every 0.5 s.
- NVML_ERROR_GPU_IS_LOST from any call marks the GPU lost for good (a GPU that
  fell off the bus needs a reset, which also invalidates the handle); the other
  GPUs carry on.
- On a MIG-enabled GPU whole-device utilization is not available: None, not 0.
- PCIe throughput prefers the cumulative counters (fields 197/198) differenced
  over the sampling interval; see counters.py for the counter width and wrap.
  Where they are missing, or too narrow to difference at 2 Hz, a worker thread
  reads nvmlDeviceGetPcieThroughput, which blocks ~20 ms per call, so the
  caller only ever takes the latest finished reading and never waits.

Split by job: NvmlCalls makes one call for one reading and degrades it;
CounterRates turns cumulative counters into rates; PcieThroughput picks the
counters or the PcieWindowPoller worker; NvlinkThroughput finds the active links
and sums their counters; GpuReader owns the handle and builds the GpuSample.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwatch.sampling.counters import (
    NVLINK_LINK_MAX_BYTES_PER_S,
    counter_rate,
    max_unambiguous_interval_s,
    pcie_link_max_bytes_per_s,
)
from gpuwatch.sampling.types import GpuProcess, GpuSample

# Field ids (nvml.h); read from the module when it has them, these are the values.
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_DATA_TX_KIB = 138
FI_NVLINK_DATA_RX_KIB = 139
FI_PCIE_TX_BYTES = 197
FI_PCIE_RX_BYTES = 198

# A narrow (32-bit) PCIe counter is only differenced if it cannot wrap twice
# within this interval at the link's full rate: the supervisor samples at 2 Hz,
# and a late sample (a loaded box) can stretch an interval to ~1 s.
LONGEST_EXPECTED_INTERVAL_S = 1.0
# A window reading older than this is stale (the worker is stuck or slow): None.
WINDOW_MAX_AGE_S = 5.0

NOT_SUPPORTED = "not supported"
NO_PERMISSION = "no permission"
GPU_LOST = "GPU is lost"
FIRST_SAMPLE = "rate needs a second sample"
NOT_UPDATED = "counter not updated yet"
WINDOW_PENDING = "PCIe window reading not finished yet"
# Reasons that mean "supported, just no figure yet" (doctor counts these as supported).
PENDING_REASONS = frozenset({FIRST_SAMPLE, NOT_UPDATED, WINDOW_PENDING})


class _GpuLostError(Exception):
    """Raised inside a read when NVML says NVML_ERROR_GPU_IS_LOST."""


def _code(nvml: Any, name: str, default: int) -> int:
    value = getattr(nvml, name, default)
    return value if isinstance(value, int) else default


def error_code(exc: BaseException) -> int | None:
    """The NVML error code of an exception raised by pynvml (or the fake)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe_init_failure(nvml: Any, exc: BaseException) -> str:
    """A plain sentence for why nvmlInit failed, for the sample's ``nvml`` field."""
    code = error_code(exc)
    if code == _code(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"
    if code == _code(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVIDIA driver not loaded: NVML cannot reach any GPU"
    if code == _code(nvml, "NVML_ERROR_NO_PERMISSION", 4):
        return "no permission to open the NVIDIA devices (/dev/nvidia*)"
    if code == _code(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18):
        return "NVML library and kernel driver versions differ (driver updated, reboot needed)"
    return f"NVML failed to start: {exc}"


def visible_gpu_count(nvml: Any | None = None) -> int:
    """The NVIDIA GPUs CUDA will use: NVML's devices, narrowed by CUDA_VISIBLE_DEVICES as
    CUDA reads it. Any NVML failure (no nvidia-ml-py, no library, no driver) counts as 0.

    ``nvml`` injects a fake pynvml module in tests; by default ``import pynvml``, lazily,
    so a box without the driver never pays for it.
    """
    if nvml is None:
        try:
            import pynvml as nvml_module
        except ImportError:
            return 0
        nvml = nvml_module
    try:
        nvml.nvmlInit()
    except Exception:
        return 0
    try:
        count = int(nvml.nvmlDeviceGetCount())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return count
        uuids: list[str] | None = None
        chosen: set[int] = set()
        # CUDA reads entries up to the first one it cannot match and ignores the rest.
        for raw_entry in visible.split(","):
            entry = raw_entry.strip()
            if not entry:
                break
            if entry.lstrip("-").isdigit():
                index = int(entry)
                if not 0 <= index < count:
                    break
            else:
                if uuids is None:
                    uuids = [_uuid(nvml, i) for i in range(count)]
                matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
                if len(matches) != 1:
                    break
                index = matches[0]
            if index in chosen:
                return 0  # CUDA refuses a list that names a device twice
            chosen.add(index)
        return len(chosen)
    except Exception:
        return 0
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _uuid(nvml: Any, index: int) -> str:
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


_VALUE_MEMBER_AND_WIDTH: dict[str, tuple[str, int | None]] = {
    "NVML_VALUE_TYPE_DOUBLE": ("dVal", None),
    "NVML_VALUE_TYPE_UNSIGNED_INT": ("uiVal", 32),
    # c_ulong: 64 bits on Linux (LP64), 32 on Windows.
    "NVML_VALUE_TYPE_UNSIGNED_LONG": ("ulVal", ctypes.sizeof(ctypes.c_ulong) * 8),
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": ("ullVal", 64),
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": ("sllVal", 63),
    "NVML_VALUE_TYPE_SIGNED_INT": ("siVal", 31),
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": ("usVal", 16),
}
_VALUE_TYPE_DEFAULTS = {
    "NVML_VALUE_TYPE_DOUBLE": 0,
    "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "NVML_VALUE_TYPE_UNSIGNED_LONG": 2,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": 4,
    "NVML_VALUE_TYPE_SIGNED_INT": 5,
    "NVML_VALUE_TYPE_UNSIGNED_SHORT": 6,
}


def field_value(nvml: Any, fv: Any) -> tuple[float | int, int | None]:
    """(value, counter width in bits or None for a double) of one nvmlFieldValue_t."""
    value_type = int(fv.valueType)
    for name, (member, width) in _VALUE_MEMBER_AND_WIDTH.items():
        if value_type == _code(nvml, name, _VALUE_TYPE_DEFAULTS[name]):
            return getattr(fv.value, member), width
    raise ValueError(f"unknown NVML value type {value_type}")


@dataclass(frozen=True, slots=True)
class _CounterRead:
    value: int
    width_bits: int
    nvml_us: int  # NVML's own timestamp of the read (microseconds), 0 if none
    clock_s: float  # our clock when we read it, used when NVML gives no timestamp


def interval_between(previous: _CounterRead, current: _CounterRead) -> float | None:
    """Seconds between two counter reads; None when NVML served the same cached read."""
    if previous.nvml_us > 0 and current.nvml_us > 0:
        if current.nvml_us == previous.nvml_us:
            return None
        return (current.nvml_us - previous.nvml_us) / 1e6
    return current.clock_s - previous.clock_s


class PcieWindowPoller:
    """Reads nvmlDeviceGetPcieThroughput for some GPUs in a worker thread.

    Each call blocks for NVML's ~20 ms sampling window, TX and RX separately, so
    8 GPUs take >= 320 ms serially: far too long for the caller. ``kick()`` asks
    for one more pass and returns at once; ``latest()`` returns the newest
    finished reading. Passes follow the caller's kicks, so the worker reads no
    more often than the caller samples and sleeps while nobody samples.
    """

    def __init__(
        self,
        nvml: Any,
        max_age_s: float = WINDOW_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._handles: dict[int, Any] = {}
        # index -> (tx bytes/s, rx bytes/s, when read, reason when None)
        self._latest: dict[int, tuple[float | None, float | None, float, str | None]] = {}
        self._thread: threading.Thread | None = None
        self.passes = 0

    def watch(self, index: int, handle: Any) -> None:
        with self._lock:
            self._handles[index] = handle
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(
                    target=self._run, name="gpuwatch-pcie-window", daemon=True
                )
                self._thread.start()

    def unwatch(self, index: int) -> None:
        with self._lock:
            self._handles.pop(index, None)

    def kick(self) -> None:
        self._wake.set()

    def latest(self, index: int) -> tuple[float | None, float | None, str | None]:
        with self._lock:
            reading = self._latest.get(index)
        if reading is None:
            return None, None, WINDOW_PENDING
        tx, rx, at, reason = reading
        if self._clock() - at > self._max_age_s:
            return None, None, "PCIe window reading is stale"
        return tx, rx, reason

    def close(self, timeout_s: float = 2.0) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        nvml = self._nvml
        tx_kind = _code(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx_kind = _code(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)
        lost = _code(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                if self._stopping:
                    return
                handles = list(self._handles.items())
            for index, handle in handles:
                if self._stopping:
                    return
                tx: float | None = None
                rx: float | None = None
                reason: str | None = None
                try:
                    # NVML documents the value as KB/s; nvitop and nvidia-smi
                    # treat it as KiB/s, and so do we.
                    tx = float(nvml.nvmlDeviceGetPcieThroughput(handle, tx_kind)) * 1024
                    rx = float(nvml.nvmlDeviceGetPcieThroughput(handle, rx_kind)) * 1024
                except Exception as exc:  # the worker must outlive any error
                    tx = rx = None
                    reason = GPU_LOST if error_code(exc) == lost else _reason(nvml, exc)
                with self._lock:
                    self._latest[index] = (tx, rx, self._clock(), reason)
            self.passes += 1


def _reason(nvml: Any, exc: BaseException) -> str:
    code = error_code(exc)
    if code == _code(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
        return NOT_SUPPORTED
    if code == _code(nvml, "NVML_ERROR_NO_PERMISSION", 4):
        return NO_PERMISSION
    if code == _code(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
        return "not in this driver's NVML"
    if code == _code(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
        return GPU_LOST
    return f"error: {exc}"


class NvmlCalls:
    """One GPU's NVML calls, each degraded on its own: None with a reason, never an error.

    ``reasons`` says why readings are missing from the sample being read (the
    reader starts a fresh dict per sample); ``sticky`` keeps the reasons that
    will not change while the process lives, so those calls are not repeated.
    NVML_ERROR_GPU_IS_LOST raises _GpuLostError for the reader to catch.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.sticky: dict[str, str] = {}
        self.reasons: dict[str, str] = {}
        self.lost_code = _code(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._sticky_codes = {
            _code(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
            _code(nvml, "NVML_ERROR_NO_PERMISSION", 4),
            _code(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
        }
        self._success = _code(nvml, "NVML_SUCCESS", 0)

    def call(self, reading: str, function: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call for one reading; None (with a reason) instead of an error."""
        if reading in self.sticky:
            self.reasons[reading] = self.sticky[reading]
            return None
        try:
            fn = getattr(self.nvml, function)
        except AttributeError:
            self.sticky[reading] = self.reasons[reading] = "not in this nvidia-ml-py"
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # any failure degrades this reading only
            code = error_code(exc)
            if code == self.lost_code:
                raise _GpuLostError from exc
            reason = _reason(self.nvml, exc)
            if code in self._sticky_codes:
                self.sticky[reading] = reason
            self.reasons[reading] = reason
            return None

    def counter_read(self, fv: Any, now: float) -> _CounterRead | str:
        """One nvmlFieldValue_t as a counter read, or why it is not one."""
        ret = int(fv.nvmlReturn)
        if ret == self.lost_code:
            raise _GpuLostError
        if ret != self._success:
            code_reason = {
                _code(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3): NOT_SUPPORTED,
                _code(self.nvml, "NVML_ERROR_NO_PERMISSION", 4): NO_PERMISSION,
            }
            return code_reason.get(ret, f"error: NVML return code {ret}")
        value, width = field_value(self.nvml, fv)
        if width is None:
            return "counter is not an integer"
        return _CounterRead(int(value), width, int(fv.timestamp), now)


# A counter's key: (field id, NVLink link index; 0 for PCIe).
CounterKey = tuple[int, int]
CounterReads = dict[CounterKey, _CounterRead | str]


class CounterRates:
    """Cumulative counters turned into rates: the last read of each, and the rate it gave."""

    def __init__(self) -> None:
        self._counters: dict[CounterKey, _CounterRead] = {}
        self._last_rates: dict[CounterKey, float | None] = {}

    def rate(
        self, key: CounterKey, read: _CounterRead, unit_bytes: int, ceiling: float
    ) -> tuple[float | None, str | None]:
        """(bytes/s, None) or (None, why); see counters.py for wrap and reset."""
        previous = self._counters.get(key)
        if previous is None:
            self._counters[key] = read
            return None, FIRST_SAMPLE
        interval = interval_between(previous, read)
        if interval is None:
            # NVML served the same cached read again: repeat the last rate
            # rather than flicker to n/a.
            last = self._last_rates.get(key)
            return last, None if last is not None else NOT_UPDATED
        self._counters[key] = read
        rate = counter_rate(
            previous.value, read.value, interval, read.width_bits, unit_bytes, ceiling
        )
        self._last_rates[key] = rate
        if rate is None:
            return None, "counter reset, or interval too long for its width"
        return rate, None


class PcieThroughput:
    """One GPU's PCIe TX/RX bytes/s, from the counters or from the window worker.

    The first sample decides the source for good: the cumulative counters
    (fields 197/198) when both read and are wide enough not to wrap twice in
    LONGEST_EXPECTED_INTERVAL_S at the link's top speed, else the 20 ms
    nvmlDeviceGetPcieThroughput window, read by the shared PcieWindowPoller.
    """

    def __init__(self, calls: NvmlCalls, index: int, poller: PcieWindowPoller) -> None:
        self._calls = calls
        self._index = index
        self._poller = poller
        self.source: str | None = None  # "counter" or "window"; None = not decided yet
        self._max_bytes_per_s: float | None = None
        self._rates = CounterRates()
        nvml = calls.nvml
        self._tx_key: CounterKey = (
            _code(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", FI_PCIE_TX_BYTES),
            0,
        )
        self._rx_key: CounterKey = (
            _code(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", FI_PCIE_RX_BYTES),
            0,
        )

    def learn_link_max(self, handle: Any, pcie_gen: int | None, pcie_width: int | None) -> None:
        """Once: the most the link can move, the ceiling of the counter arithmetic."""
        if self._max_bytes_per_s is not None:
            return
        calls = self._calls
        # The link can train up under load between two samples: bound the
        # counter arithmetic by the most the link can do, not its idle speed.
        max_gen = calls.call("pcie_max", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
        max_width = calls.call("pcie_max", "nvmlDeviceGetMaxPcieLinkWidth", handle)
        calls.reasons.pop("pcie_max", None)
        self._max_bytes_per_s = pcie_link_max_bytes_per_s(
            max_gen if max_gen is not None else pcie_gen,
            max_width if max_width is not None else pcie_width,
        )

    def wanted(self) -> list[CounterKey]:
        """The counter fields to read this sample (none once the window is the source)."""
        if self.source in (None, "counter"):
            return [self._tx_key, self._rx_key]
        return []

    def rates(self, handle: Any, reads: CounterReads) -> tuple[float | None, float | None]:
        """(TX, RX) bytes/s; a missing one gets its reason in the calls' reasons."""
        reasons = self._calls.reasons
        if self.source is None:
            self._choose_source(handle, reads)
        if self.source == "window":
            tx, rx, reason = self._poller.latest(self._index)
            if reason is not None:
                reasons["pcie_tx_bytes_per_s"] = reasons["pcie_rx_bytes_per_s"] = reason
            return tx, rx
        ceiling = self._max_bytes_per_s or 0.0
        rates: list[float | None] = []
        for key, reading in (
            (self._tx_key, "pcie_tx_bytes_per_s"),
            (self._rx_key, "pcie_rx_bytes_per_s"),
        ):
            read = reads.get(key)
            if not isinstance(read, _CounterRead):
                reasons[reading] = read or "not read"
                rates.append(None)
                continue
            rate, why = self._rates.rate(key, read, 1, ceiling)
            if why is not None:
                reasons[reading] = why
            rates.append(rate)
        return rates[0], rates[1]

    def _choose_source(self, handle: Any, reads: CounterReads) -> None:
        tx_read, rx_read = reads.get(self._tx_key), reads.get(self._rx_key)
        if isinstance(tx_read, _CounterRead) and isinstance(rx_read, _CounterRead):
            assert self._max_bytes_per_s is not None
            safe_s = max_unambiguous_interval_s(
                min(tx_read.width_bits, rx_read.width_bits), 1, self._max_bytes_per_s
            )
            self.source = "counter" if safe_s > LONGEST_EXPECTED_INTERVAL_S else "window"
        else:
            self.source = "window"
        if self.source == "window":
            self._poller.watch(self._index, handle)
            self._poller.kick()

    def stop(self) -> None:
        """The GPU is lost: the window worker stops reading it."""
        self._poller.unwatch(self._index)


class NvlinkThroughput:
    """One GPU's NVLink TX/RX bytes/s: the data counters (fields 138/139, KiB) of
    its active links, each differenced on its own and summed; found once per process.
    """

    def __init__(self, calls: NvmlCalls, clock: Callable[[], float] = time.monotonic) -> None:
        self._calls = calls
        self._clock = clock
        self.links: list[int] | None = None  # active link indices; None = not found yet
        self.version: int | None = None  # the first active link's NVLink generation
        self._rates = CounterRates()
        nvml = calls.nvml
        self._fields = (
            _code(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", FI_NVLINK_DATA_TX_KIB),
            _code(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", FI_NVLINK_DATA_RX_KIB),
        )
        self._fi_link_count = _code(nvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", FI_NVLINK_LINK_COUNT)

    def discover(self, handle: Any) -> None:
        """Find the active links, until found or known not to be there."""
        calls = self._calls
        if self.links is not None or "nvlink" in calls.sticky:
            return
        values = calls.call(
            "nvlink", "nvmlDeviceGetFieldValues", handle, [(self._fi_link_count, 0)]
        )
        if values is None:
            return
        read = calls.counter_read(values[0], self._clock())
        if isinstance(read, str):
            calls.sticky["nvlink"] = calls.reasons["nvlink"] = read
            return
        active: list[int] = []
        enabled = _code(calls.nvml, "NVML_FEATURE_ENABLED", 1)
        for link in range(read.value):
            state = calls.call("nvlink_state", "nvmlDeviceGetNvLinkState", handle, link)
            if state == enabled:
                active.append(link)
        calls.reasons.pop("nvlink_state", None)
        self.links = active
        if not active:
            calls.sticky["nvlink"] = "no active NVLink link"
            return
        version = calls.call("nvlink_version", "nvmlDeviceGetNvLinkVersion", handle, active[0])
        self.version = int(version) if isinstance(version, int) and version > 0 else None

    def wanted(self) -> list[CounterKey]:
        """The counter fields to read this sample: TX and RX of each active link."""
        wanted: list[CounterKey] = []
        for link in self.links or ():
            wanted += [(self._fields[0], link), (self._fields[1], link)]
        return wanted

    def rates(self, reads: CounterReads) -> tuple[float | None, float | None]:
        """(TX, RX) bytes/s summed over the active links; None if any link has no rate."""
        reasons = self._calls.reasons
        if not self.links:
            reason = self._calls.sticky.get("nvlink") or reasons.get("nvlink") or NOT_SUPPORTED
            reasons.pop("nvlink", None)
            reasons["nvlink_tx_bytes_per_s"] = reasons["nvlink_rx_bytes_per_s"] = reason
            return None, None
        totals: list[float | None] = []
        for field_id, reading in zip(
            self._fields, ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"), strict=True
        ):
            total: float | None = 0.0
            for link in self.links:
                read = reads.get((field_id, link))
                if not isinstance(read, _CounterRead):
                    reasons[reading] = read or "not read"
                    total = None
                    continue
                rate, why = self._rates.rate(
                    (field_id, link), read, 1024, NVLINK_LINK_MAX_BYTES_PER_S
                )
                if rate is None:
                    # One link without a rate makes the sum wrong: the sum is n/a.
                    reasons[reading] = why or "n/a"
                    total = None
                elif total is not None:
                    total += rate
            totals.append(total)
        return totals[0], totals[1]


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
        except _GpuLostError:
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
        enabled = _code(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)
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
        except _GpuLostError:
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
            _code(nvml, "NVML_TEMPERATURE_GPU", 0),
        )
        power_mw = self._calls.call("power_w", "nvmlDeviceGetPowerUsage", handle)
        limit_mw = self._calls.call("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", handle)
        sm_clock = self._calls.call(
            "sm_clock_mhz", "nvmlDeviceGetClockInfo", handle, _code(nvml, "NVML_CLOCK_SM", 1)
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
                    raise _GpuLostError from exc
                if self._memory_v2 is None:
                    self._memory_v2 = False
                else:
                    reasons["mem_used_bytes"] = _reason(self._nvml, exc)
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
