"""Tidy tables from a run's events.jsonl: steps, summaries, samples, attempts or scaling.

Streamed: events.jsonl is read a line at a time (a line over the frame limit is skipped
without being held) and each row is written as soon as its event is read, so a day-long
run exports in constant memory. ``attempts`` is the exception: its rows come at the end,
from the fold the dashboard's attempts table uses (``RunState``). Every row of a table
has the same columns, fixed by the declarations before reading, never by scanning the
file; keys they do not know go to one ``extra`` cell. A line that is not an event is
counted and skipped (``ExportReport``). Each table's columns and the cells' encoding:
docs/internals.md, "Export".
"""

from __future__ import annotations

import csv
import json
import math
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from gpuwatch.measures.breakdown import SHARE_KEYS, share_cells
from gpuwatch.sampling import GPU_FRAME_KEYS, HOST_FRAME_KEYS
from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
    SPREAD,
    TERMINAL_STATUSES,
    Attempt,
    Envelope,
    Event,
    ProtocolError,
    Sample,
    StatusChange,
    Step,
    StepSummary,
    decode,
    parse_event,
    wire_object,
)

WHATS = ("steps", "summaries", "samples", "attempts", "scaling")
FORMATS = ("csv", "jsonl")
EXTRA = "extra"

_STEP_FIELDS = tuple(f.name for f in fields(Step) if f.name not in ("attempt", "worker"))
STEP_COLUMNS = (
    "attempt", "worker", "seq", "t", *_STEP_FIELDS, "examples_per_s", "input_wait_pct",
    *SHARE_KEYS,
)
# A StepSummary's spreads, one column per [min, median, max, sum] figure.
_SPREADS = tuple(f.name for f in fields(StepSummary)
                 if str(f.type).startswith("list[float]") and f.name != "breakdown_ms")
_SUMMARY_FIELDS = tuple(f.name for f in fields(StepSummary)
                        if f.name not in ("attempt", "worker", "breakdown_ms", *_SPREADS))
SUMMARY_COLUMNS = (
    "attempt", "worker", "seq", "t", *_SUMMARY_FIELDS,
    *(f"{name.removesuffix('_ms')}_{part}_ms" for name in _SPREADS for part in SPREAD),
    "examples_per_s", "input_wait_pct", *SHARE_KEYS,
)
SAMPLE_COLUMNS = (
    "attempt",
    "worker",
    "seq",
    "t",
    "nvml",
    *(f"host.{key}" for key in HOST_FRAME_KEYS),
    *(f"gpu.{key}" for key in GPU_FRAME_KEYS),
    EXTRA,
)
ATTEMPT_FIGURES = (
    "attempt",
    "reason",
    "fresh",
    "start_t",
    "end_t",
    "status",
    "end",
    "workers",
    "replicas",
    "device_kind",
    "first_step",
    "last_step",
    "steps",
    "measured_steps",
    "input_wait_pct",
    "input_wait_worker",
    "median_examples_per_s",
    "grad_sync_bytes_per_s",
    *SHARE_KEYS,
    "bus_bytes_per_s",
    "resumed_from_step",
    "lost_steps",
    "data_order",
    "config_path",
)

SCALING_COLUMNS = (
    "count",
    "unit",
    "mode",
    "attempt",
    "state",
    "replicas",
    "device_kind",
    "global_batch_size",
    "per_replica_batch",
    "measured_steps",
    "examples_per_s",
    "speedup",
    "efficiency",
    "efficiency_low",
    "efficiency_high",
    "input_wait_pct",
    *SHARE_KEYS,
    "shares_cores",
    "cores",
)

Row = dict[str, Any]


@dataclass
class ExportReport:
    """What an export did: rows written, lines skipped because they are not events."""

    rows: int = 0
    bad_lines: int = 0
    first_bad: str | None = None  # "line N: why", the first one skipped
    incomplete_tail: bool = False  # the last line had no newline yet (the run is live)

    def bad_summary(self, path: Path) -> str | None:
        """One line about the skipped lines, or None if there were none."""
        if not self.bad_lines:
            return None
        what = "line that is not an event" if self.bad_lines == 1 else "lines that are not events"
        return f"{path}: skipped {self.bad_lines} {what} (first: {self.first_bad})"


def read_events(fh: BinaryIO, report: ExportReport) -> Iterator[tuple[Envelope, Event]]:
    """Every event of an events.jsonl opened for reading, in order; bad lines counted in report.

    Holds one line at a time: a line over the frame limit is skipped in chunks.
    """
    line_no = 0
    while True:
        line = fh.readline(MAX_FRAME_BYTES + 1)
        if not line:
            return
        line_no += 1
        if not line.endswith(b"\n"):
            if len(line) <= MAX_FRAME_BYTES:
                report.incomplete_tail = True  # end of file in the middle of a line
                return
            _skip_line(fh)
            _count_bad(report, line_no, f"over the {MAX_FRAME_BYTES} byte frame limit")
            continue
        if not line.strip():
            continue
        try:
            yield parse_event(decode(line))
        except ProtocolError as exc:
            _count_bad(report, line_no, str(exc))


def _skip_line(fh: BinaryIO) -> None:
    while True:
        chunk = fh.readline(1 << 16)
        if not chunk or chunk.endswith(b"\n"):
            return


def _count_bad(report: ExportReport, line_no: int, why: str) -> None:
    report.bad_lines += 1
    if report.first_bad is None:
        report.first_bad = f"line {line_no}: {why}"


# -- rows ---------------------------------------------------------------------------------


def step_rows(events: Iterable[tuple[Envelope, Event]]) -> Iterator[Row]:
    for envelope, event in events:
        if isinstance(event, Step):
            row: Row = {
                "attempt": event.attempt,
                "worker": event.worker,
                "seq": envelope.seq,
                "t": envelope.t,
            }
            for name in _STEP_FIELDS:
                row[name] = getattr(event, name)
            row["examples_per_s"] = event.examples_per_s
            row["input_wait_pct"] = event.input_wait_pct
            row.update(share_cells(event.breakdown))
            yield row


def summary_rows(events: Iterable[tuple[Envelope, Event]]) -> Iterator[Row]:
    """One row per StepSummary (past 8 workers, every worker's but the chief's second of
    steps): its counts, each spread's four figures, examples/s and input wait % from its
    sums, the shares of its steps' summed breakdown."""
    for envelope, event in events:
        if isinstance(event, StepSummary):
            row: Row = {"attempt": event.attempt, "worker": event.worker,
                        "seq": envelope.seq, "t": envelope.t}
            for name in _SUMMARY_FIELDS:
                row[name] = getattr(event, name)
            for name in _SPREADS:
                for part in SPREAD:
                    row[f"{name.removesuffix('_ms')}_{part}_ms"] = event.figure(name, part)
            row["examples_per_s"] = event.examples_per_s
            row["input_wait_pct"] = event.input_wait_pct
            row.update(share_cells(event.breakdown))
            yield row


def sample_rows(events: Iterable[tuple[Envelope, Event]]) -> Iterator[Row]:
    attempt = 0
    for envelope, event in events:
        if isinstance(event, Attempt):
            attempt = event.attempt
        elif isinstance(event, Sample):
            base: Row = {
                "attempt": attempt,
                "worker": event.worker,
                "seq": envelope.seq,
                "t": envelope.t,
                "nvml": event.nvml,
            }
            host_extra = _split(wire_object(event.host), "host.", HOST_FRAME_KEYS, base)
            if event.gpu_summary is not None:  # a summarizing worker's GPUs, summed
                host_extra["gpu_summary"] = wire_object(event.gpu_summary)
            if not event.gpus:
                yield _with_extra(base, host_extra)
            for gpu in event.gpus:
                row = dict(base)
                extra = {**host_extra, **_split(wire_object(gpu), "gpu.", GPU_FRAME_KEYS, row)}
                yield _with_extra(row, extra)


def _split(values: Mapping[str, Any], prefix: str, known: tuple[str, ...], row: Row) -> Row:
    """Put the known keys of values into row as prefix+key; return the others (extra)."""
    extra: Row = {}
    for key, value in values.items():
        if key in known:
            row[prefix + key] = value
        else:
            extra[prefix + key] = value
    return extra


def _with_extra(row: Row, extra: Row) -> Row:
    row[EXTRA] = extra or None
    return row


def settings_columns() -> tuple[str, ...]:
    """The config's settings as dotted keys, from the schema (trainer_runtime.schema)."""
    from trainer_runtime.schema import RunConfig

    return tuple(_leaf_keys(RunConfig, ""))


def _leaf_keys(model: Any, prefix: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        nested = _model_in(info.annotation)
        if nested is None:
            yield prefix + name
        else:
            yield from _leaf_keys(nested, f"{prefix}{name}.")


def _model_in(annotation: Any) -> Any:
    """The pydantic model a field holds (itself, or inside `X | None`), else None."""
    from pydantic import BaseModel

    options: tuple[Any, ...] = (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
    for option in options:
        if isinstance(option, type) and issubclass(option, BaseModel):
            return option
    return None


def flatten_settings(
    settings: Mapping[str, Any], columns: frozenset[str], sections: frozenset[str]
) -> tuple[Row, Row]:
    """(known dotted settings, the others): sections are the dotted keys that hold more."""
    known: Row = {}
    extra: Row = {}

    def walk(values: Mapping[str, Any], prefix: str) -> None:
        for key, value in values.items():
            dotted = prefix + key
            if dotted in columns:
                known[dotted] = value
            elif dotted in sections and isinstance(value, Mapping):
                walk(value, dotted + ".")
            elif not (dotted in sections and value is None):  # `cluster: null`: no cells
                extra[dotted] = value

    walk(settings, "")
    return known, extra


@dataclass
class _AttemptMore:
    """What the attempts table does not keep: its YAML, its last event's time and status."""

    config_path: str | None = None
    end_t: float | None = None
    status: str | None = None


def attempt_rows(
    events: Iterable[tuple[Envelope, Event]], settings_keys: tuple[str, ...]
) -> Iterator[Row]:
    """One row per attempt, after the whole stream (its figures need every step)."""
    from gpuwatch.runstate import RunState, own_settings

    state = RunState()
    more: dict[int, _AttemptMore] = {}
    for envelope, event in events:
        state.apply_event(envelope, event)
        attempt = getattr(event, "attempt", None)
        if isinstance(attempt, int) and attempt > 0:
            noted = more.setdefault(attempt, _AttemptMore())
            if envelope.t is not None:
                noted.end_t = envelope.t
            if isinstance(event, StatusChange):
                noted.status = event.status
            elif isinstance(event, Attempt):
                noted.config_path = event.config_path or None
    columns = frozenset(settings_keys)
    sections = frozenset(
        key.rsplit(".", i)[0] for key in settings_keys for i in range(1, key.count(".") + 1)
    )
    last = max(state.attempts, default=0)
    for number in sorted(state.attempts):
        summary = state.attempts[number]
        noted = more.get(number, _AttemptMore())
        if number < last and noted.status not in TERMINAL_STATUSES | {"relaunching"}:
            # Its last status was recorded while it ran: a live change ended it, in the
            # same process, and the next attempt began.
            noted.status = "superseded"
        hello, resume = summary.hello, summary.resume
        row: Row = {
            "attempt": number,
            "reason": summary.reason,
            "fresh": summary.fresh,
            "start_t": summary.started_t,
            "end_t": noted.end_t,
            "status": noted.status,
            "end": summary.end,
            "workers": summary.workers,
            "replicas": hello.replicas if hello else None,
            "device_kind": hello.device_kind if hello else None,
            "first_step": summary.first_step,
            "last_step": summary.last_step,
            "steps": summary.steps_seen,
            "measured_steps": summary.measured_steps,
            "input_wait_pct": summary.input_wait_pct,
            "input_wait_worker": summary.input_wait_worker,
            "median_examples_per_s": summary.median_examples_per_s,
            "grad_sync_bytes_per_s": summary.grad_sync_bytes_per_s,
            **share_cells(summary.breakdown),
            "bus_bytes_per_s": summary.bus_bytes_per_s,
            "resumed_from_step": resume.from_step if resume else None,
            "lost_steps": resume.lost_steps if resume else None,
            "data_order": resume.data_order if resume else None,
            "config_path": noted.config_path,
        }
        # A person's command: its own settings only, not the schema's defaults.
        known, extra = flatten_settings(own_settings(summary.settings), columns, sections)
        row.update(known)
        yield _with_extra(row, extra)


def scaling_table_rows(events: Iterable[tuple[Envelope, Event]]) -> Iterator[Row]:
    """One row per count of a scaling probe (measures/scaling.py's rows), after the stream."""
    from gpuwatch.measures.scaling import scaling_rows
    from gpuwatch.runstate import RunState

    state = RunState()
    for envelope, event in events:
        state.apply_event(envelope, event)
    plan = state.scale
    if plan is None:
        return
    for row in scaling_rows(state):
        timed, interval = row.breakdown, row.efficiency_interval
        yield {
            "count": row.count,
            "unit": plan.unit,
            "mode": plan.mode,
            "attempt": row.attempt,
            "state": row.state,
            "replicas": row.replicas,
            "device_kind": row.device_kind,
            "global_batch_size": row.global_batch_size,
            "per_replica_batch": row.per_replica_batch,
            "measured_steps": row.measured_steps,
            "examples_per_s": row.examples_per_s,
            "speedup": row.speedup,
            "efficiency": row.efficiency,
            "efficiency_low": interval[0] if interval is not None else None,
            "efficiency_high": interval[1] if interval is not None else None,
            "input_wait_pct": timed.pct("input") if timed is not None else None,
            **share_cells(timed),
            "shares_cores": row.shares_cores,
            "cores": plan.cores,
        }


# -- writing ------------------------------------------------------------------------------


def _json_safe(value: Any) -> Any:
    """A cell JSON can hold: a float that is not finite (an overflowed rate) is null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    return value


def _csv_cell(value: Any) -> Any:
    value = _json_safe(value)
    if value is None:
        return ""
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return value  # numbers as repr (floats round-trip exactly), text as it is


def write_rows(rows: Iterable[Row], columns: tuple[str, ...], fmt: str, out: TextIO) -> int:
    """Write rows (dicts; a missing key is null) as CSV with a header, or as JSON lines."""
    count = 0
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_cell(row.get(column)) for column in columns])
            count += 1
    else:
        for row in rows:
            cells = {column: _json_safe(row.get(column)) for column in columns}
            out.write(json.dumps(cells, separators=(",", ":"), allow_nan=False) + "\n")
            count += 1
    return count


def export_events(
    events_path: Path, what: str, fmt: str, out: TextIO, *, worker: int | None = None
) -> ExportReport:
    """Write one table of events_path to out; the report counts rows and skipped lines.

    worker: only that worker's rows (steps and samples). ValueError for an unknown
    what or fmt; OSError from reading or writing goes to the caller.
    """
    if what not in WHATS:
        raise ValueError(f"--what must be one of {', '.join(WHATS)} (got {what!r})")
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    if worker is not None and what in ("attempts", "scaling"):
        raise ValueError(f"--worker picks rows of steps, summaries or samples; {what} are "
                         "the run's")
    report = ExportReport()
    with open(events_path, "rb") as fh:
        events = read_events(fh, report)
        rows: Iterator[Row]
        if what == "steps":
            rows, columns = step_rows(events), STEP_COLUMNS
        elif what == "summaries":
            rows, columns = summary_rows(events), SUMMARY_COLUMNS
        elif what == "samples":
            rows, columns = sample_rows(events), SAMPLE_COLUMNS
        elif what == "scaling":
            rows, columns = scaling_table_rows(events), SCALING_COLUMNS
        else:
            keys = settings_columns()
            rows, columns = attempt_rows(events, keys), (*ATTEMPT_FIGURES, *keys, EXTRA)
        if worker is not None:
            rows = _of_worker(rows, worker)
        report.rows = write_rows(rows, columns, fmt, out)
    return report


def _of_worker(rows: Iterator[Row], worker: int) -> Iterator[Row]:
    return (row for row in rows if row.get("worker") == worker)
