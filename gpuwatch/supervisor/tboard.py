"""TensorBoard scalars without TensorFlow: event files written by hand, and the run's board.

An event file is a sequence of TFRecords (TensorFlow's ``record_writer.cc``), each a
hand-encoded ``tensorflow.Event`` with the few protobuf fields scalars need (the framing
and the fields: docs/internals.md, "The supervisor's parts"). The first record carries
``file_version`` "brain.Event:2" (with it TensorBoard never purges data because a step
went back); ours are named ``events.out.tfevents.<seconds>.<host>.<pid>.<n>``.
``RunBoard`` is what the supervisor owns: it turns recorded events into scalars (one log
directory per attempt and worker) and never raises.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from gpuwatch.measures.breakdown import ms_cells, share_cells
from trainer_runtime.protocol import (
    Attempt,
    Event,
    GpuSample,
    HostSample,
    Sample,
    StatusChange,
    Step,
    StepSummary,
)

# A short name of its own: supervisor.log names each line's source by it.
log = logging.getLogger("gpuwatch.tboard")

FILE_VERSION = "brain.Event:2"
# Written to disk at most this often (and on every status change and on close): the
# supervisor records every step, and a write per step would cost a system call each.
FLUSH_EVERY_S = 2.0
# A buffer this large is written at once whatever its age.
FLUSH_BYTES = 1 << 20
_FLOAT32_MAX = 3.4028234663852886e38


# -- CRC-32C (Castagnoli), as TFRecord frames use it --------------------------------------


def _crc32c_tables() -> tuple[tuple[int, ...], ...]:
    """Eight 256-entry tables: the byte-wise one, then each for a byte k positions further."""
    first = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        first.append(crc)
    tables = [first]
    for _ in range(7):
        previous = tables[-1]
        tables.append([(crc >> 8) ^ first[crc & 0xFF] for crc in previous])
    return tuple(tuple(table) for table in tables)


_CRC32C_TABLES = _crc32c_tables()


def crc32c(data: bytes) -> int:
    """CRC-32C of data (the reflected polynomial 0x82F63B78; "123456789" gives 0xE3069283).

    Eight bytes a round (slicing-by-8): a step's record took 8.4 us against 12.5 us
    byte by byte (measured here), and the supervisor frames one per step.
    """
    t0, t1, t2, t3, t4, t5, t6, t7 = _CRC32C_TABLES
    crc = 0xFFFFFFFF
    whole = len(data) - len(data) % 8
    if whole:
        for low, high in struct.iter_unpack("<II", data[:whole]):
            crc ^= low
            crc = (
                t7[crc & 0xFF] ^ t6[(crc >> 8) & 0xFF] ^ t5[(crc >> 16) & 0xFF] ^ t4[crc >> 24]
                ^ t3[high & 0xFF] ^ t2[(high >> 8) & 0xFF] ^ t1[(high >> 16) & 0xFF]
                ^ t0[high >> 24]
            )  # fmt: skip
    for byte in data[whole:]:
        crc = t0[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC as TFRecord stores it: rotated right by 15 bits, plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


# -- the protobuf Event, by hand -----------------------------------------------------------


def _varint(value: int) -> bytes:
    if value < 0:  # int64: two's complement in ten bytes
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    # A float beyond float32's range cannot be packed: it reads as infinite, as in TF.
    if abs(value) > _FLOAT32_MAX and math.isfinite(value):
        value = math.copysign(math.inf, value)
    return struct.pack("<f", value)


@functools.lru_cache(maxsize=4096)
def _value_head(tag: str) -> bytes:
    """A Summary.Value entry up to its float: the same bytes for every value of a tag."""
    tag_field = _length_delimited(1, tag.encode("utf-8"))
    return _varint(1 << 3 | 2) + _varint(len(tag_field) + 5) + tag_field + b"\x15"


def encode_event(
    wall_time: float,
    step: int = 0,
    scalars: Mapping[str, float] | None = None,
    *,
    file_version: str | None = None,
) -> bytes:
    """A serialized tensorflow.Event: wall_time, step, and the scalars as one Summary."""
    out = bytearray(b"\x09" + struct.pack("<d", wall_time))  # field 1, 64-bit
    if step:
        out += b"\x10" + _varint(step)  # field 2, varint
    if file_version is not None:
        out += _length_delimited(3, file_version.encode("utf-8"))
    if scalars:
        summary = b"".join(_value_head(tag) + _float32(value) for tag, value in scalars.items())
        out += _length_delimited(5, summary)
    return bytes(out)


# -- one event file --------------------------------------------------------------------------

_file_numbers = itertools.count()


class EventFileWriter:
    """One event file in logdir: records buffered in memory, written at most every
    flush_every_s (and at close). The directory and the file are made at the first write.
    OSError from a write goes to the caller."""

    def __init__(
        self,
        logdir: Path,
        *,
        flush_every_s: float = FLUSH_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logdir = logdir
        now = time.time()
        host = socket.gethostname().replace("/", "_") or "localhost"
        name = f"events.out.tfevents.{int(now)}.{host}.{os.getpid()}.{next(_file_numbers)}"
        self.path = logdir / name
        self._flush_every_s = flush_every_s
        self._clock = clock
        self._buffer = bytearray(tfrecord(encode_event(now, file_version=FILE_VERSION)))
        self._flushed_at = clock()
        self._file: BinaryIO | None = None
        self.closed = False

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float) -> None:
        """Queue one event holding these scalars at step; written within flush_every_s."""
        self._buffer += tfrecord(encode_event(wall_time, step, scalars))
        if (
            len(self._buffer) >= FLUSH_BYTES
            or self._clock() - self._flushed_at >= self._flush_every_s
        ):
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            if self._file is None:
                self.logdir.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "ab")  # noqa: SIM115 - held open until close
            self._file.write(self._buffer)
            self._file.flush()
            self._buffer.clear()
        self._flushed_at = self._clock()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            if self._file is not None:
                self._file.close()


# -- what a run's events show --------------------------------------------------------------

# A sample's readings -> tag names.
GPU_TAGS: tuple[tuple[Callable[[GpuSample], float | None], str], ...] = (
    (lambda gpu: gpu.util_gpu_pct, "util_pct"),
    (lambda gpu: gpu.util_mem_pct, "memory_util_pct"),
    (lambda gpu: gpu.mem_used_bytes, "memory_used_bytes"),
    (lambda gpu: gpu.pcie_rx_bytes_per_s, "pcie_rx_bytes_per_s"),
    (lambda gpu: gpu.pcie_tx_bytes_per_s, "pcie_tx_bytes_per_s"),
    (lambda gpu: gpu.nvlink_rx_bytes_per_s, "nvlink_rx_bytes_per_s"),
    (lambda gpu: gpu.nvlink_tx_bytes_per_s, "nvlink_tx_bytes_per_s"),
    (lambda gpu: gpu.power_w, "power_w"),
    (lambda gpu: gpu.temperature_c, "temperature_c"),
)
HOST_TAGS: tuple[tuple[Callable[[HostSample], float | None], str], ...] = (
    (lambda host: host.cpu_pct, "cpu_pct"),
    (lambda host: host.mem_used_bytes, "memory_used_bytes"),
    (lambda host: host.run_cpu_pct, "run_cpu_pct"),
)


def _number(value: Any) -> float | None:
    """A reading as a float, or None when it is not a finite number (null, text, a bool)."""
    if type(value) in (int, float) and math.isfinite(value):
        return float(value)
    return None


def summary_scalars(summary: StepSummary) -> dict[str, float]:
    """A worker's second of steps (past 8 workers) as step_scalars' tags, at its last step:
    its last loss, examples/s and input wait % over its sums, its median step time, and
    the shares and times (per step: its sums over its count) of its breakdown."""
    values: dict[str, float | None] = {
        "train/loss": summary.loss,
        "train/examples_per_s": summary.examples_per_s,
        "train/input_wait_pct": summary.input_wait_pct,
        "train/step_time_ms": summary.figure("step_time_ms", "median"),
    }
    parts = summary.breakdown
    if parts is not None and summary.count > 0:
        values.update({f"train/{key}": value for key, value in share_cells(parts).items()})
        values.update({f"train/{key}": value / summary.count
                       for key, value in ms_cells(parts).items() if value is not None})
    return {tag: float(value) for tag, value in values.items() if value is not None}


def step_scalars(step: Step) -> dict[str, float]:
    """A step's scalars: loss (when finite), learning rate, examples/s, input wait %, step
    time; and where its parts were timed apart, each other part's share and time
    (``train/compute_pct`` ... ``train/other_pct``, ``train/compute_ms`` ...: the names
    of gpuwatch/measures/breakdown.py; the input's are input_wait_pct and the step's input wait)."""
    values: dict[str, float | None] = {
        "train/loss": step.loss,
        "train/learning_rate": step.lr,
        "train/examples_per_s": step.examples_per_s,
        "train/input_wait_pct": step.input_wait_pct,
        "train/step_time_ms": step.step_time_ms,
    }
    parts = step.breakdown
    if parts is not None:
        values.update({f"train/{key}": value for key, value in share_cells(parts).items()})
        values.update({f"train/{key}": value for key, value in ms_cells(parts).items()})
    return {tag: float(value) for tag, value in values.items() if value is not None}


def sample_scalars(sample: Sample) -> dict[str, float]:
    """A device sample's scalars: gpu<i>/... per GPU (i: the GPU's index), host/... always.

    A reading that is not available (null) is left out, never written as 0.
    """
    out: dict[str, float] = {}
    for gpu in sample.gpus:
        for read, name in GPU_TAGS:
            value = _number(read(gpu))
            if value is not None:
                out[f"gpu{gpu.index}/{name}"] = value
    for read_host, name in HOST_TAGS:
        value = _number(read_host(sample.host))
        if value is not None:
            out[f"host/{name}"] = value
    return out


def logdir_of(root: Path, attempt: int, worker: int) -> Path:
    """An attempt's log directory: the chief's (worker 0) attempt-N, worker I's below it."""
    base = root / f"attempt-{attempt}"
    return base if worker == 0 else base / f"worker-{worker}"


class RunBoard:
    """A run's TensorBoard scalars, written as the supervisor records its events.

    One log directory per attempt under root (``runs/<id>/tensorboard``): ``attempt-N``
    holds the chief's (worker 0) scalars, ``attempt-N/worker-I`` worker I's, so
    ``tensorboard --logdir $GPUWATCH_HOME/runs`` lists ``<id>/tensorboard/attempt-N``
    per run and attempt. A step's scalars are at its step; a device sample's at the
    latest step its worker reported (the chief's, before that worker's first).
    Samples before the first attempt are not written. An attempt's files are closed when
    the next attempt starts; everything is flushed on each status change and at close.

    Never raises: the first failure (disk full, no permission) is logged in one line and
    turns the board off for the rest of the run; training never notices.
    """

    def __init__(
        self,
        root: Path,
        *,
        flush_every_s: float = FLUSH_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.enabled = True
        self.attempt = 0
        self._flush_every_s = flush_every_s
        self._clock = clock
        self._writers: dict[tuple[int, int], EventFileWriter] = {}
        self._steps: dict[int, int] = {}  # worker -> the latest step it reported

    def observe(self, event: Event, t: float) -> None:
        """Note one recorded event (t: its time)."""
        if not self.enabled:
            return
        try:
            self._observe(event, t)
        except Exception as exc:  # the board is a by-product: never the run's failure
            self._fail(exc)

    def _observe(self, event: Event, t: float) -> None:
        if isinstance(event, Step):
            self._steps[event.worker] = event.step
            self._writer(event.attempt, event.worker).add_scalars(
                event.step, step_scalars(event), t
            )
        elif isinstance(event, StepSummary):
            self._steps[event.worker] = event.last_step
            self._writer(event.attempt, event.worker).add_scalars(
                event.last_step, summary_scalars(event), t
            )
        elif isinstance(event, Sample):
            scalars = sample_scalars(event)
            if scalars and self.attempt > 0:
                step = self._steps.get(event.worker, self._steps.get(0, 0))
                self._writer(self.attempt, event.worker).add_scalars(step, scalars, t)
        elif isinstance(event, Attempt):
            self._close_writers()
            self.attempt = event.attempt
        elif isinstance(event, StatusChange):
            for writer in self._writers.values():
                writer.flush()

    def _writer(self, attempt: int, worker: int) -> EventFileWriter:
        writer = self._writers.get((attempt, worker))
        if writer is None:
            writer = EventFileWriter(
                logdir_of(self.root, attempt, worker),
                flush_every_s=self._flush_every_s,
                clock=self._clock,
            )
            self._writers[(attempt, worker)] = writer
        return writer

    def _close_writers(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        errors = []
        for writer in writers:  # every one closes, even after one failed
            try:
                writer.close()
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _fail(self, exc: BaseException) -> None:
        self.enabled = False
        words = " ".join(str(exc).split()) or type(exc).__name__
        log.warning("tensorboard scalars are off for this run: %s", words)
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception:  # already failing: the first error is the one logged
                pass
        self._writers = {}

    def close(self) -> None:
        """Write what is buffered and close every file (the supervisor's exit)."""
        if not self.enabled:
            return
        try:
            self._close_writers()
        except Exception as exc:
            self._fail(exc)
