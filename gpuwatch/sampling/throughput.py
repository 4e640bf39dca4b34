"""PCIe and NVLink throughput: cumulative counters turned into rates, or NVML's 20 ms window.

PCIe throughput prefers the cumulative counters (fields 197/198) differenced over the
sampling interval; see counters.py for the counter width and wrap. Where they are
missing, or too narrow to difference at 2 Hz, a worker thread reads
nvmlDeviceGetPcieThroughput, which blocks ~20 ms per call, so the caller only ever takes
the latest finished reading and never waits. NVLink sums the data counters of a GPU's
active links.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gpuwatch.sampling.counters import (
    NVLINK_LINK_MAX_BYTES_PER_S,
    counter_rate,
    max_unambiguous_interval_s,
    pcie_link_max_bytes_per_s,
)
from gpuwatch.sampling.nvml import (
    FI_NVLINK_DATA_RX_KIB,
    FI_NVLINK_DATA_TX_KIB,
    FI_NVLINK_LINK_COUNT,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    FIRST_SAMPLE,
    GPU_LOST,
    NOT_SUPPORTED,
    NOT_UPDATED,
    WINDOW_PENDING,
    CounterRead,
    NvmlCalls,
    error_code,
    nvml_code,
    reason_of,
)

# A narrow (32-bit) PCIe counter is only differenced if it cannot wrap twice
# within this interval at the link's full rate: the supervisor samples at 2 Hz,
# and a late sample (a loaded box) can stretch an interval to ~1 s.
LONGEST_EXPECTED_INTERVAL_S = 1.0
# A window reading older than this is stale (the worker is stuck or slow): None.
WINDOW_MAX_AGE_S = 5.0


def interval_between(previous: CounterRead, current: CounterRead) -> float | None:
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
        tx_kind = nvml_code(nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)
        rx_kind = nvml_code(nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)
        lost = nvml_code(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
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
                    reason = GPU_LOST if error_code(exc) == lost else reason_of(nvml, exc)
                with self._lock:
                    self._latest[index] = (tx, rx, self._clock(), reason)
            self.passes += 1


# A counter's key: (field id, NVLink link index; 0 for PCIe).
CounterKey = tuple[int, int]
CounterReads = dict[CounterKey, CounterRead | str]


class CounterRates:
    """Cumulative counters turned into rates: the last read of each, and the rate it gave."""

    def __init__(self) -> None:
        self._counters: dict[CounterKey, CounterRead] = {}
        self._last_rates: dict[CounterKey, float | None] = {}

    def rate(
        self, key: CounterKey, read: CounterRead, unit_bytes: int, ceiling: float
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
            nvml_code(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", FI_PCIE_TX_BYTES),
            0,
        )
        self._rx_key: CounterKey = (
            nvml_code(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", FI_PCIE_RX_BYTES),
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
            if not isinstance(read, CounterRead):
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
        if isinstance(tx_read, CounterRead) and isinstance(rx_read, CounterRead):
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
            nvml_code(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", FI_NVLINK_DATA_TX_KIB),
            nvml_code(nvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", FI_NVLINK_DATA_RX_KIB),
        )
        self._fi_link_count = nvml_code(nvml, "NVML_FI_DEV_NVLINK_LINK_COUNT", FI_NVLINK_LINK_COUNT)

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
        enabled = nvml_code(calls.nvml, "NVML_FEATURE_ENABLED", 1)
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
                if not isinstance(read, CounterRead):
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
