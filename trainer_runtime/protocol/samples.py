"""The device readings a ``sample`` event carries: the host, each GPU, a worker's GPUs summed.

Declared once, here, as frozen dataclasses (so any thread may hold them without a copy):
gpuwatch's sampler makes them, the ``Sample`` event carries them and every reader reads
their attributes. Every reading is ``float | int | None``; ``None`` means "not
available", never zero. On the wire each is a JSON object of its fields in declaration
order (``wire_object``), less those whose metadata says ``{"wire": False}``.
``record_from_wire`` reads one back: a field the sender did not write takes its default,
one this reader does not know is kept in ``extra`` and written back after the others, a
value of the wrong kind is refused (``WireRecordError``), and a number is kept as it came,
so a record read and written again is the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def _not_sent(note: str) -> Any:
    return {"wire": False, "note": note}


_EXTRA = _not_sent("the fields of a newer sender, as they came")


# A GPU's field that is not a reading of NVML's but what the GPU is, or how its links are
# read (``gpuwatch doctor`` lists the readings: the other fields).
_NOT_A_READING: Any = {"reading": False}


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process NVML reports on a GPU (host pid, as NVML returns host pids)."""

    pid: int
    used_bytes: int | None
    in_run: bool
    extra: dict[str, Any] = field(default_factory=dict, compare=False, metadata=_EXTRA)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. Rates are bytes per second over the last interval."""

    index: int = field(metadata=_NOT_A_READING)
    name: str | None = field(default=None, metadata=_NOT_A_READING)
    uuid: str | None = field(default=None, metadata=_NOT_A_READING)
    lost: bool = field(default=False, metadata=_NOT_A_READING)
    mig: bool = field(default=False, metadata=_NOT_A_READING)
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
    # Where the PCIe figures came from: "counter" (cumulative NVML counters,
    # differenced) or "window" (nvmlDeviceGetPcieThroughput's 20 ms window, read
    # by a worker thread); None while neither is available.
    pcie_source: str | None = field(default=None, metadata=_NOT_A_READING)
    nvlink_links_active: int | None = field(default=None, metadata=_NOT_A_READING)
    # The NVLink generation of its first active link (nvmlDeviceGetNvLinkVersion): with
    # the active links, the link's peak (gpuwatch.measures.peaks.link_peak). None: no NVLink.
    nvlink_version: int | None = field(default=None, metadata=_NOT_A_READING)
    # Last, so last on the wire (wire_object keeps the declaration order).
    processes: tuple[GpuProcess, ...] = ()
    # Why each None reading is None, for `gpuwatch doctor` and tooltips; not
    # sent in the sample frame (it rarely changes and would bloat every frame).
    unavailable: tuple[tuple[str, str], ...] = field(
        default=(), compare=False, metadata=_not_sent("why each None reading is None"))
    extra: dict[str, Any] = field(default_factory=dict, compare=False, metadata=_EXTRA)


# What a lean sample's host keeps (a summarizing worker's, past SUMMARY_PAST_WORKERS
# workers: per_cpu_pct alone is a number per core, hundreds on a big host).
LEAN_HOST_FIELDS = ("cpu_pct", "mem_used_bytes", "mem_total_bytes", "load_1m")


@dataclass(frozen=True, slots=True)
class HostSample:
    """The host: whole-machine CPU and memory, plus the watched run's processes."""

    cpu_pct: float | None = None
    per_cpu_pct: tuple[float | None, ...] = ()
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
    # A summarizing worker's host: only LEAN_HOST_FIELDS are sent (a host object of no
    # other field reads back lean).
    lean: bool = field(default=False, metadata=_not_sent("only LEAN_HOST_FIELDS are sent"))
    extra: dict[str, Any] = field(default_factory=dict, compare=False, metadata=_EXTRA)

    def leaned(self) -> HostSample:
        """This host as a summarizing worker sends it: LEAN_HOST_FIELDS, the rest unread."""
        return HostSample(**{name: getattr(self, name) for name in LEAN_HOST_FIELDS},
                          lean=True)


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """A summarizing worker's GPUs summed (its sample's gpus are then empty)."""

    count: int
    lost: int
    util_gpu_pct: list[float] | None  # [min, mean, max] over its live GPUs
    mem_used_bytes: float | None
    mem_total_bytes: float | None
    pcie_bytes_per_s: float | None  # TX and RX
    nvlink_bytes_per_s: float | None  # TX and RX
    extra: dict[str, Any] = field(default_factory=dict, compare=False, metadata=_EXTRA)


class WireRecordError(ValueError):
    """A sample record on the wire that does not fit its declaration; str: what it must be."""


# -- to the wire --------------------------------------------------------------------------

_WIRE_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls) if f.metadata.get("wire", True))
    for cls in (GpuProcess, GpuSample, HostSample, GpuSummary)
}


def wire_field_names(cls: type) -> tuple[str, ...]:
    """The fields a sample record sends, in order (the reference's words, export's columns)."""
    return _WIRE_FIELDS[cls]


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if type(value) in _WIRE_FIELDS:
        return wire_object(value)
    return value


def wire_object(record: Any) -> dict[str, Any]:
    """A sample record as its wire object: its sent fields, in order (tuples as lists)."""
    names = LEAN_HOST_FIELDS if isinstance(record, HostSample) and record.lean else (
        _WIRE_FIELDS[type(record)])
    return {**{name: _plain(getattr(record, name)) for name in names}, **record.extra}


# -- from the wire ------------------------------------------------------------------------

Check = Callable[[Any], Any]  # the value to keep, or WireRecordError(what it must be)


def _scalar(accepts: Callable[[Any], bool], words: str) -> Check:
    def check(value: Any) -> Any:
        if accepts(value):
            return value
        raise WireRecordError(words)

    return check


def _finite(value: Any) -> bool:
    if type(value) not in (int, float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


_SCALARS: Mapping[str, Check] = {
    "int": _scalar(lambda v: type(v) is int, "an integer"),
    "float": _scalar(_finite, "a finite number"),
    "str": _scalar(lambda v: isinstance(v, str), "a string"),
    "bool": _scalar(lambda v: v is True or v is False, "true or false"),
}


def _optional(check: Check) -> Check:
    def optional(value: Any) -> Any:
        if value is None:
            return None
        try:
            return check(value)
        except WireRecordError as exc:
            raise WireRecordError(f"{exc} or null") from None

    return optional


def _sequence(item: Check, make: type) -> Check:
    def sequence(value: Any) -> Any:
        if not isinstance(value, list):
            raise WireRecordError("a list")
        try:
            return make(item(v) for v in value)
        except WireRecordError as exc:
            raise WireRecordError(f"a list, each {exc}") from None

    return sequence


def _field_check(text: str) -> Check:
    """The check of one declared field type: a scalar, a record, a list or tuple of them,
    each maybe "| None"."""
    if text.endswith(" | None"):
        return _optional(_field_check(text.removesuffix(" | None")))
    if text in _SCALARS:
        return _SCALARS[text]
    if text in RECORDS:
        return lambda value: record_from_wire(RECORDS[text], value)
    if text.startswith("tuple[") and text.endswith(", ...]"):
        return _sequence(_field_check(text[len("tuple["):-len(", ...]")]), tuple)
    if text.startswith("list[") and text.endswith("]"):
        return _sequence(_field_check(text[len("list["):-1]), list)
    raise TypeError(f"sample record field type {text!r} has no wire check")


def record_from_wire(cls: type, value: Any) -> Any:
    """The record of class cls a wire object holds; WireRecordError if it does not fit."""
    if not isinstance(value, dict):
        raise WireRecordError(f"an object ({cls.__name__})")
    kept: dict[str, Any] = {}
    for name, check, required in _CHECKS[cls]:
        if name not in value:
            if required:
                raise WireRecordError(f"an object ({cls.__name__}) with {name}")
            continue
        try:
            kept[name] = check(value[name])
        except WireRecordError as exc:
            raise WireRecordError(f"an object ({cls.__name__}) whose {name} is {exc}") from None
    if cls is HostSample and value.keys() <= set(LEAN_HOST_FIELDS):
        kept["lean"] = True
    known = _KNOWN[cls]
    if not value.keys() <= known:
        kept["extra"] = {key: item for key, item in value.items() if key not in known}
    return cls(**kept)


RECORDS: Mapping[str, type] = {
    cls.__name__: cls for cls in (GpuProcess, GpuSample, HostSample, GpuSummary)
}
_KNOWN: dict[type, frozenset[str]] = {
    cls: frozenset(names) for cls, names in _WIRE_FIELDS.items()
}
_CHECKS: dict[type, tuple[tuple[str, Check, bool], ...]] = {
    cls: tuple(
        (f.name, _field_check(str(f.type)),
         f.default is MISSING and f.default_factory is MISSING)
        for f in fields(cls) if f.metadata.get("wire", True)
    )
    for cls in RECORDS.values()
}
