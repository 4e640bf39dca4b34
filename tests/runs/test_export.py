"""`gpuwatch export`: a run recorded with the real EventLog from typed events of known
values (2 attempts, 2 workers, 2 GPUs each), exported as every table in both formats and
read back with the csv and json modules; every cell is compared with the event it came from.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import tempfile
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.cli import main
from gpuwatch.runs.export import (
    ATTEMPT_FIGURES,
    SAMPLE_COLUMNS,
    STEP_COLUMNS,
    export_events,
    settings_columns,
)
from gpuwatch.runstate import WARMUP_STEPS
from gpuwatch.sampling import GPU_FRAME_KEYS, HOST_FRAME_KEYS
from gpuwatch.sampling.types import DeviceSample
from gpuwatch.supervisor.eventlog import EventLog
from tests.support.sample_frames import sample_frame_fields
from trainer_runtime.protocol import (
    Attempt,
    Done,
    Event,
    GpuProcess,
    GpuSample,
    Hello,
    HostSample,
    Resume,
    Run,
    Sample,
    StatusChange,
    Step,
    encode_event,
    event_frame,
    record_from_wire,
    wire_object,
)
from trainer_runtime.schema import RunConfig

RUN_ID = "0101-abcd"
SETTINGS_1 = RunConfig.model_validate(
    {"name": "exp", "cluster": {"workers": 2}, "data": {"prefetch": False}}
).model_dump(mode="json")
SETTINGS_2 = RunConfig.model_validate(
    {
        "name": "exp",
        "cluster": {"workers": 2},
        "data": {"prefetch": 2},
        "model": {"kwargs": {"width": 3}},
    }
).model_dump(mode="json")
SETTINGS_2["train"]["future_knob"] = 7  # a key this version's schema does not know
STEPS_PER_ATTEMPT = 8


@dataclass
class Recorded:
    """A run as it was recorded: every event with its seq and t, and the attempt it fell in."""

    run_dir: Path
    events: list[tuple[int, float, Event, int]] = field(default_factory=list)

    def of(self, kind: type[Event]) -> list[tuple[int, float, Any, int]]:
        return [item for item in self.events if isinstance(item[2], kind)]

    @property
    def events_path(self) -> Path:
        return self.run_dir / "events.jsonl"


def gpu(index: int, base: float, **more: Any) -> dict[str, Any]:
    return {
        "index": index,
        "name": "Fake H100",
        "uuid": f"GPU-{index}",
        "lost": False,
        "mig": False,
        "util_gpu_pct": base + index,
        "util_mem_pct": base / 2,
        "mem_used_bytes": 10**9 * (index + 1),
        "mem_total_bytes": 80 * 10**9,
        "temperature_c": 60.0 + index,
        "power_w": 250.5,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "pcie_gen": 5,
        "pcie_width": 16,
        "pcie_tx_bytes_per_s": 1000 * int(base),
        "pcie_rx_bytes_per_s": 2000 * int(base),
        "nvlink_tx_bytes_per_s": None,
        "nvlink_rx_bytes_per_s": 0,
        "pcie_source": "counter",
        "nvlink_links_active": 18,
        "processes": [{"pid": 4242, "used_bytes": 5, "in_run": True}],
        **more,
    }


def host(base: float, **more: Any) -> dict[str, Any]:
    return {
        "cpu_pct": base,
        "per_cpu_pct": [base, base + 1.5],
        "mem_used_bytes": 7 * 10**9,
        "mem_total_bytes": 64 * 10**9,
        "load_1m": 1.25,
        "run_cpu_pct": None,
        "run_rss_bytes": 123456789,
        **more,
    }


def sample(host_object: dict[str, Any], gpu_objects: list[dict[str, Any]], **fields: Any
           ) -> Sample:
    """A sample event of these wire objects (a field not declared kept in its extra)."""
    return Sample(host=record_from_wire(HostSample, host_object),
                  gpus=[record_from_wire(GpuSample, g) for g in gpu_objects], **fields)


def step(attempt: int, number: int, worker: int, **changes: Any) -> Step:
    values: dict[str, Any] = {
        "attempt": attempt,
        "step": number,
        "micro_step": 2 * number,
        "epoch": number // 5,
        "loss": 2.0 / number + worker / 1000,
        "lr": 0.001 * number,
        "examples": 256,
        "step_time_ms": 20.0 + number + 0.25 * worker,
        "input_wait_ms": 1.5 * number,
        "grad_sync_bytes": 3_000_000.0,
        "position": 256 * number,
        "dropped": worker,
        "worker": worker,
        "compute_ms": 4.25 if worker else None,
    }
    values.update(changes)
    return Step(**values)


def record_run(home: Path) -> Recorded:
    """A two-worker run of two attempts, recorded event by event with the real EventLog."""
    run_dir = home / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    recorded = Recorded(run_dir)
    log = EventLog(run_dir)
    clock = [1_790_000_000.0]
    attempt = [0]

    def put(event: Event) -> None:
        clock[0] += 0.125
        if isinstance(event, Attempt):
            attempt[0] = event.attempt
        seq, t, _ = log.append(event, clock[0])
        recorded.events.append((seq, t, event, attempt[0]))

    def hello(number: int, worker: int) -> Hello:
        return Hello(
            attempt=number,
            pid=100 + worker,
            tf_version="2.21.0",
            replicas=4,
            device_kind="gpu",
            devices=["GPU:0", "GPU:1"],
            param_count=10,
            param_bytes=40,
            global_batch_size=256,
            accumulation_steps=1,
            per_replica_batch=64,
            start_step=0,
            start_micro_step=0,
            worker=worker,
            workers=2,
            host=f"host-{worker}",
        )

    put(
        Run(
            run_id=RUN_ID,
            name="exp",
            config_path="exp.yaml",
            supervisor_pid=1,
            host="h",
            settings=SETTINGS_1,
        )
    )
    put(sample(host(1.0), [], nvml="NVML not started yet"))  # before attempt 1
    for number, settings_, first in ((1, SETTINGS_1, 1), (2, SETTINGS_2, 7)):
        put(
            Attempt(
                attempt=number,
                settings=settings_,
                fresh=number == 1,
                reason="start" if number == 1 else "relaunch",
                config_path=str(run_dir / f"attempt-{number}.yaml"),
            )
        )
        put(StatusChange(attempt=number, status="starting"))
        if number == 2:
            put(
                Resume(
                    attempt=2,
                    from_step=6,
                    from_micro_step=12,
                    checkpoint="ckpt-6",
                    position=1536,
                    lost_steps=2,
                )
            )
        put(hello(number, 0))
        put(hello(number, 1))
        put(StatusChange(attempt=number, status="running"))
        for n in range(first, first + STEPS_PER_ATTEMPT):
            put(step(number, n, 0, loss=None) if n == 3 else step(number, n, 0))
            put(step(number, n, 1))
            if n % 3 == 0:
                for worker in (0, 1):
                    extra = {"fan_pct": 40} if n == 9 and worker == 1 else {}
                    put(
                        sample(
                            host(10.0 * n + worker, **({"swap_bytes": 0} if extra else {})),
                            [gpu(0, 50.0 + n), gpu(1, 60.0 + n, **extra)],
                            nvml=None,
                            worker=worker,
                        )
                    )
        if number == 1:
            put(StatusChange(attempt=1, status="relaunching", message="stopped for relaunch"))
    put(Done(attempt=2, reason="max_steps", step=14))
    put(StatusChange(attempt=2, status="finished", exit_code=0))
    log.close()
    return recorded


@pytest.fixture
def run(home: Path) -> Recorded:
    return record_run(home)


# -- reading back ------------------------------------------------------------------------


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same_csv(cell: str, value: Any) -> bool:
    """A CSV cell holds this value: empty is null, true/false, numbers, JSON for the rest."""
    if value is None:
        return cell == ""
    if isinstance(value, bool):
        return cell == ("true" if value else "false")
    if isinstance(value, int):
        return int(cell) == value
    if isinstance(value, float):
        return float(cell) == value
    if isinstance(value, (list, dict)):
        return bool(json.loads(cell) == value)
    return cell == value


def same_json(cell: Any, value: Any) -> bool:
    return bool(cell == value and type(cell) is type(value))


def check_rows(
    rows: list[dict[str, Any]],
    expected: list[dict[str, Any]],
    same: Callable[[Any, Any], bool],
) -> None:
    assert len(rows) == len(expected)
    for index, (row, want) in enumerate(zip(rows, expected, strict=True)):
        for column, value in want.items():
            assert same(row[column], value), (index, column, row[column], value)


def export(run: Recorded, tmp_path: Path, what: str, fmt: str, *extra: str) -> Path:
    out = tmp_path / f"{what}.{fmt}"
    assert (
        main(["export", RUN_ID[:6], "--what", what, "--format", fmt, "-o", str(out), *extra]) == 0
    )
    return out


# -- the tables ---------------------------------------------------------------------------


def expected_steps(run: Recorded) -> list[dict[str, Any]]:
    rows = []
    for seq, t, event, _ in run.of(Step):
        row = {f.name: getattr(event, f.name) for f in fields(Step)}
        row.update(seq=seq, t=t)
        rows.append(row)
    return rows


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_steps_are_one_row_per_step_event_with_every_field(
    run: Recorded, tmp_path: Path, fmt: str
) -> None:
    out = export(run, tmp_path, "steps", fmt)
    expected = expected_steps(run)
    assert len(expected) == 2 * 2 * STEPS_PER_ATTEMPT
    if fmt == "csv":
        header, rows = read_csv(out)
        assert header == list(STEP_COLUMNS)
        assert header[:4] == ["attempt", "worker", "seq", "t"]
        assert {f.name for f in fields(Step)} <= set(header)
        check_rows(rows, expected, same_csv)
        derived = [(float(r["examples_per_s"]), float(r["input_wait_pct"])) for r in rows]
    else:
        rows_json = read_jsonl(out)
        assert all(list(row) == list(STEP_COLUMNS) for row in rows_json)
        check_rows(rows_json, expected, same_json)
        derived = [(r["examples_per_s"], r["input_wait_pct"]) for r in rows_json]
    # Derived as the docs define them: examples per second of the step, its input wait share.
    for (rate, wait), want in zip(derived, expected, strict=True):
        assert rate == pytest.approx(want["examples"] * 1000.0 / want["step_time_ms"])
        assert wait == pytest.approx(100.0 * want["input_wait_ms"] / want["step_time_ms"])


def expected_samples(run: Recorded) -> list[dict[str, Any]]:
    rows = []
    for seq, t, event, attempt in run.of(Sample):
        base: dict[str, Any] = {
            "attempt": attempt,
            "worker": event.worker,
            "seq": seq,
            "t": t,
            "nvml": event.nvml,
        }
        host_sent = wire_object(event.host)
        extra = {f"host.{k}": v for k, v in host_sent.items() if k == "swap_bytes"}
        base.update({f"host.{k}": v for k, v in host_sent.items() if k != "swap_bytes"})
        if not event.gpus:
            rows.append(
                {**base, **{f"gpu.{k}": None for k in GPU_FRAME_KEYS}, "extra": extra or None}
            )
        for one in event.gpus:
            sent = wire_object(one)
            row = {**base, **{f"gpu.{k}": v for k, v in sent.items() if k != "fan_pct"}}
            more = {**extra, **{f"gpu.{k}": v for k, v in sent.items() if k == "fan_pct"}}
            row["extra"] = more or None
            rows.append(row)
    return rows


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_samples_are_one_row_per_gpu_and_the_attempt_they_fell_in(
    run: Recorded, tmp_path: Path, fmt: str
) -> None:
    out = export(run, tmp_path, "samples", fmt)
    expected = expected_samples(run)
    # 1 sample with no GPU before the first attempt; then 2 workers x 2 GPUs, 4 times.
    assert len(expected) == 1 + 4 * 2 * 2
    assert [row["attempt"] for row in expected][:2] == [0, 1]
    assert {row["attempt"] for row in expected[-4:]} == {2}
    assert sum(row["extra"] is not None for row in expected) == 2  # swap_bytes' 2 GPUs
    if fmt == "csv":
        header, rows = read_csv(out)
        assert header == list(SAMPLE_COLUMNS)
        check_rows(rows, expected, same_csv)
    else:
        check_rows(read_jsonl(out), expected, same_json)


def test_sample_columns_are_the_sampler_frame_keys() -> None:
    """The columns come from the declarations; the sampler's frame writes exactly them."""
    gpu_sample = GpuSample(index=0, name="x", uuid="u", processes=(GpuProcess(1, 2, True),))
    frame = sample_frame_fields(DeviceSample(0.0, HostSample(), (gpu_sample,), None))
    assert tuple(frame["host"]) == HOST_FRAME_KEYS
    assert tuple(frame["gpus"][0]) == GPU_FRAME_KEYS


def chief_figures(run: Recorded, attempt: int) -> dict[str, float]:
    """The attempts table's figures by hand: the chief's steps after warm-up, but input
    wait is the worker's that waits most (each worker's own steps after warm-up)."""
    chief = [e for _, _, e, _ in run.of(Step) if e.attempt == attempt and e.worker == 0]
    measured = chief[WARMUP_STEPS:]
    total_ms = sum(e.step_time_ms for e in measured)
    waits = {}
    for worker in (0, 1):
        own = [e for _, _, e, _ in run.of(Step) if e.attempt == attempt and e.worker == worker]
        own = own[WARMUP_STEPS:]
        waits[worker] = (
            100.0 * sum(e.input_wait_ms for e in own) / sum(e.step_time_ms for e in own)
        )
    whose = max(waits, key=lambda worker: waits[worker])
    return {
        "first_step": chief[0].step,
        "last_step": chief[-1].step,
        "steps": len(chief),
        "measured_steps": len(measured),
        "input_wait_pct": waits[whose],
        "input_wait_worker": whose,
        "median_examples_per_s": statistics.median(
            e.examples * 1000.0 / e.step_time_ms for e in measured
        ),
        "grad_sync_bytes_per_s": sum(e.grad_sync_bytes for e in measured) * 1000.0 / total_ms,
    }


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_clusters_attempts_export_the_input_wait_the_table_shows(
    tmp_path: Path, fmt: str
) -> None:
    """In a cluster the input wait is the worker's that waits most (the chief's is far
    less), with its worker: the figure the attempts table shows, from the same fold."""
    from gpuwatch.runstate import RunState
    from tests.runstate.test_runstate_workers import measured_wait_pct, relaunch_helps_the_straggler

    frames = relaunch_helps_the_straggler().frames
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(frame) + "\n" for frame in frames))
    out = io.StringIO()
    assert export_events(path, "attempts", fmt, out).rows == 2
    (tmp_path / "out").write_text(out.getvalue())
    if fmt == "csv":
        _, rows = read_csv(tmp_path / "out")
        got = [(float(r["input_wait_pct"]), int(r["input_wait_worker"])) for r in rows]
    else:
        got = [(r["input_wait_pct"], r["input_wait_worker"]) for r in read_jsonl(tmp_path / "out")]
    want = [(measured_wait_pct(frames, attempt, 1), 1) for attempt in (1, 2)]
    assert got == [(pytest.approx(pct), worker) for pct, worker in want]
    assert all(pct > 2 * measured_wait_pct(frames, 1, 0) for pct, _ in got)
    state = RunState()
    state.apply_many(frames)
    table = [(a.input_wait_pct, a.input_wait_worker) for a in state.attempts.values()]
    assert got == [(pytest.approx(pct), worker) for pct, worker in table]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_attempts_are_one_row_each_with_figures_and_dotted_settings(
    run: Recorded, tmp_path: Path, fmt: str
) -> None:
    out = export(run, tmp_path, "attempts", fmt)
    attempt_events = {e.attempt: (t, e) for _, t, e, _ in run.of(Attempt)}
    last_t = {
        n: max(t for _, t, e, _ in run.events if getattr(e, "attempt", 0) == n) for n in (1, 2)
    }
    expected = []
    for number, status, end in ((1, "relaunching", "relaunch"), (2, "finished", "max_steps")):
        t, event = attempt_events[number]
        settings_ = event.settings
        figures = chief_figures(run, number)
        approx = {
            k: figures.pop(k)
            for k in ("input_wait_pct", "median_examples_per_s", "grad_sync_bytes_per_s")
        }
        expected.append(
            (
                approx,
                {
                    "attempt": number,
                    "reason": event.reason,
                    "fresh": event.fresh,
                    "start_t": t,
                    "end_t": last_t[number],
                    "status": status,
                    "end": end,
                    "workers": 2,
                    "replicas": 4,
                    "device_kind": "gpu",
                    **figures,
                    "resumed_from_step": 6 if number == 2 else None,
                    "lost_steps": 2 if number == 2 else None,
                    "data_order": "continued" if number == 2 else None,
                    "config_path": event.config_path,
                    "name": "exp",
                    "data.prefetch": settings_["data"]["prefetch"],
                    "train.global_batch_size": 256,
                    "model.hidden_units": [512, 512],
                    "model.kwargs": settings_["model"]["kwargs"],
                    "model.factory": None,
                    "cluster.launcher": "local",
                    "cluster.workers": settings_["cluster"]["workers"],
                    "cluster.ports": None,
                    "cluster.timeout_s": 60.0,
                    # Every key of attempt 1's full settings has its column; 2 has one unknown.
                    "extra": {"train.future_knob": 7} if number == 2 else None,
                },
            )
        )
    if fmt == "csv":
        header, rows = read_csv(out)
        assert header == [*ATTEMPT_FIGURES, *settings_columns(), "extra"]
        check_rows(rows, [want for _, want in expected], same_csv)
        got = [{k: float(row[k]) for k in approx} for row in rows]
    else:
        rows_json = read_jsonl(out)
        check_rows(rows_json, [want for _, want in expected], same_json)
        got = [{k: row[k] for k in approx} for row in rows_json]
    for figures_got, (approx, _) in zip(got, expected, strict=True):
        assert figures_got == pytest.approx(approx)


def test_settings_columns_cover_a_full_config_including_its_cluster() -> None:
    columns = set(settings_columns())
    assert {
        "name",
        "train.global_batch_size",
        "data.prefetch",
        "model.kwargs",
        "cluster.workers",
        "cluster.launcher",
        "telemetry.buffer_frames",
    } <= columns
    assert not any(c == "cluster" or c.startswith("cluster.workers.") for c in columns)


# -- the command line ---------------------------------------------------------------------


def test_export_writes_csv_to_stdout_by_default(
    run: Recorded, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", RUN_ID]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(captured.out)))
    assert len(rows) == len(run.of(Step))
    assert captured.err == ""


def test_export_says_what_it_wrote_on_stderr(
    run: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = export(run, tmp_path, "samples", "csv")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"gpuwatch: 17 samples rows of run {RUN_ID} -> {out}\n"


def test_worker_picks_one_workers_rows(run: Recorded, tmp_path: Path) -> None:
    out = export(run, tmp_path, "steps", "jsonl", "--worker", "1")
    rows = read_jsonl(out)
    check_rows(rows, [r for r in expected_steps(run) if r["worker"] == 1], same_json)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "zzzz"], "gpuwatch: no run matches 'zzzz' (gpuwatch ls lists runs)"),
        (
            ["export", RUN_ID, "--what", "gpus"],
            "gpuwatch: --what must be one of steps, summaries, samples, attempts, scaling "
            "(got 'gpus')",
        ),
        (
            ["export", RUN_ID, "--format", "xlsx"],
            "gpuwatch: --format must be one of csv, jsonl (got 'xlsx')",
        ),
        (
            ["export", RUN_ID, "--worker", "2"],
            f"gpuwatch: run {RUN_ID} has no worker 2: it has workers 0 to 1",
        ),
        (
            ["export", RUN_ID, "--what", "attempts", "--worker", "1"],
            "gpuwatch: --worker picks rows of steps or samples; attempts are the run's "
            "(drop --worker)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    run: Recorded, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n"
    assert captured.out == ""


@pytest.mark.parametrize("where", ["missing-dir/out.csv", ".", "events"])
def test_an_output_that_cannot_be_written_is_one_line_and_exit_2(
    run: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    before = run.events_path.read_bytes()
    target = run.events_path if where == "events" else tmp_path / where
    assert main(["export", RUN_ID, "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuwatch: ")
    if where == "events":
        assert f"is inside run {RUN_ID}'s folder" in err
    else:
        assert f"cannot write {target}: " in err
    assert run.events_path.read_bytes() == before


def test_lines_that_are_not_events_are_counted_in_one_line_and_the_rest_exported(
    run: Recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run.events_path.read_bytes().splitlines(keepends=True)
    garbage = [b"not json at all\n", b'{"v": 1, "type": "step", "step": "seven"}\n']
    # Garbage after line 5 and line 9; the file ends in the half-written line of a live run.
    torn = encode_event(step(2, 99, 0), t=1.0, seq=999)[:40]
    run.events_path.write_bytes(
        b"".join(lines[:5] + garbage[:1] + lines[5:8] + garbage[1:] + lines[8:]) + torn
    )
    out = export(run, tmp_path, "steps", "csv")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"gpuwatch: {run.events_path}: skipped 2 lines that are not events "
        "(first: line 6: frame is not JSON (Expecting value))"
    )
    assert len(err) == 2 and err[1].startswith("gpuwatch: 32 steps rows")
    check_rows(read_csv(out)[1], expected_steps(run), same_csv)


def test_a_line_over_the_frame_limit_is_skipped_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    steps = [step(1, n, 0) for n in (1, 2)]
    path.write_bytes(
        encode_event(steps[0], t=1.0, seq=0)
        + b"x" * (10 << 20)
        + b"\n"
        + encode_event(steps[1], t=2.0, seq=2)
    )
    out = io.StringIO()
    tracemalloc.start()
    try:
        report = export_events(path, "steps", "jsonl", out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [json.loads(line)["step"] for line in out.getvalue().splitlines()] == [1, 2]
    assert report.bad_lines == 1 and report.first_bad is not None
    assert report.first_bad.startswith("line 2: over the ")
    # A frame's worth (1 MiB) at a time, never the 10 MiB line.
    assert peak < 3 << 20, "the long line was read in bounded pieces"


# -- bounded memory ---------------------------------------------------------------------


class Sink:
    """A text file that keeps nothing."""

    def __init__(self) -> None:
        self.chars = 0

    def write(self, text: str) -> int:
        self.chars += len(text)
        return len(text)


def write_long_run(path: Path, lines: int) -> None:
    gpus = [gpu(0, 50.0), gpu(1, 60.0)]
    with open(path, "wb") as fh:
        for seq in range(lines):
            event = (
                sample(host(5.0), gpus, nvml=None)
                if seq % 10 == 0
                else step(1, seq + 1, seq % 2)
            )
            fh.write(encode_event(event, t=1_790_000_000.0 + seq, seq=seq))


def traced_peak(path: Path, what: str) -> tuple[int, int]:
    tracemalloc.start()
    try:
        report = export_events(path, what, "csv", Sink())
        return report.rows, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_export_streams_a_long_run_in_memory_that_does_not_grow_with_it(
    tmp_path: Path,
) -> None:
    short, long = tmp_path / "short.jsonl", tmp_path / "long.jsonl"
    write_long_run(short, 2_000)
    write_long_run(long, 20_000)  # traced, a line costs ~0.25 ms here: enough to tell
    assert long.stat().st_size > 7 << 20
    export_events(short, "samples", "csv", Sink())  # the first export imports its modules
    for what, rows_per_line in (("steps", 0.9), ("samples", 0.2)):
        short_rows, short_peak = traced_peak(short, what)
        long_rows, long_peak = traced_peak(long, what)
        assert (short_rows, long_rows) == (int(2_000 * rows_per_line), int(20_000 * rows_per_line))
        # Ten times the file, the same memory: the peak is a line and a row or so.
        assert long_peak < 512 << 10, what
        assert long_peak < short_peak * 1.2 + (64 << 10), (what, short_peak, long_peak)


# -- garbage anywhere ---------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False)
wire_int = st.integers(0, 2**53 - 1)
steps_strategy = st.builds(
    Step,
    attempt=st.integers(1, 9),
    step=wire_int,
    micro_step=wire_int,
    epoch=wire_int,
    loss=st.none() | finite,
    lr=finite,
    examples=wire_int,
    step_time_ms=finite,
    input_wait_ms=finite,
    grad_sync_bytes=finite,
    position=st.none() | wire_int,
    dropped=wire_int,
    worker=st.integers(0, 63),
    compute_ms=st.none() | finite,
)
# Ways to spoil a step frame that the protocol refuses (docs: every field is checked).
SPOILERS: list[Callable[[dict[str, Any]], None]] = [
    lambda f: f.pop("step"),
    lambda f: f.update(loss="high"),
    lambda f: f.update(v=2),
    lambda f: f.update(zzz=1),
    lambda f: f.update(type="stepp"),
    lambda f: f.update(examples=True),
    lambda f: f.update(step_time_ms=[1.0]),
    lambda f: f.update(seq=-1),
]
lines_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("step"), steps_strategy),
        st.tuples(st.just("status"), st.sampled_from(["running", "finished"])),
        st.tuples(st.just("spoilt"), st.tuples(steps_strategy, st.integers(0, len(SPOILERS) - 1))),
        st.tuples(
            st.just("bytes"),
            st.binary(max_size=80).filter(
                lambda b: b"\n" not in b and not b.strip().startswith(b"{")
            ),
        ),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=lines_strategy, torn=st.integers(0, 200))
def test_garbage_lines_anywhere_are_counted_and_every_step_still_exported(
    lines: list[tuple[str, Any]], torn: int
) -> None:
    data, want, bad = bytearray(), [], 0
    for seq, (kind, value) in enumerate(lines):
        t = 1000.0 + seq
        if kind == "step":
            data += encode_event(value, t=t, seq=seq)
            want.append((seq, t, value))
        elif kind == "status":
            data += encode_event(StatusChange(attempt=1, status=value), t=t, seq=seq)
        elif kind == "spoilt":
            frame = event_frame(value[0], t=t, seq=seq)
            SPOILERS[value[1]](frame)
            data += json.dumps(frame).encode() + b"\n"
            bad += 1
        else:
            data += value + b"\n"
            bad += bool(value.strip())  # a blank line is no event and no garbage
    # A run still writing: its last line is cut short (no newline yet).
    tail = encode_event(step(1, 5, 0), t=1.0, seq=99)
    data += tail[: min(torn, len(tail) - 1)]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "events.jsonl"
        path.write_bytes(data)
        out = io.StringIO()
        report = export_events(path, "steps", "jsonl", out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert report.bad_lines == bad
    assert report.rows == len(rows) == len(want)
    for row, (seq, t, event) in zip(rows, want, strict=True):
        assert (row["seq"], row["t"]) == (seq, t)
        assert {f.name: row[f.name] for f in fields(Step)} == {
            f.name: getattr(event, f.name) for f in fields(Step)
        }


def test_an_attempt_a_live_change_ended_is_superseded_and_a_user_stop_is_stopped(
    tmp_path: Path,
) -> None:
    """Its last recorded status was `running` (recorded while it ran): the table says how
    it ended instead; a stop's SIGTERM reads `stopped`, not `sigterm`."""
    from trainer_runtime.protocol import Attempt, Done, StatusChange, encode_event

    events = [
        Attempt(attempt=1, settings={}, fresh=True, reason="start", config_path="a1"),
        StatusChange(attempt=1, status="running"),
        Attempt(attempt=2, settings={}, fresh=False, reason="live", config_path="a2"),
        StatusChange(attempt=2, status="running"),
        Done(attempt=2, reason="sigterm", step=9),
        StatusChange(attempt=2, status="stopped", message="stopped on request"),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e, seq=i, t=1.0 + i) for i, e in enumerate(events)))
    out = io.StringIO()
    export_events(path, "attempts", "jsonl", out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["attempt"], r["status"], r["end"]) for r in rows] == [
        (1, "superseded", "live"), (2, "stopped", "stopped")
    ]


# -- where the time of a step went ----------------------------------------------------------

# A measured step of 100 ms: input 10 + compute 50 + all-reduce 20 + update 5 + other 15.
PARTS_MS = {"input_wait_ms": 10.0, "compute_ms": 50.0, "sync_ms": 20.0, "update_ms": 5.0}
KNOWN_SHARES = {"compute_pct": 50.0, "sync_pct": 20.0, "update_pct": 5.0, "other_pct": 15.0}
BUS_BYTES = 4.5e9  # grad_sync_bytes of an update: 4.5 GB in 20 ms is 225 GB/s on the bus


def timed_run(path: Path) -> list[Step]:
    """One attempt: warm-up steps that are all sync (they must not count), then measured
    steps of known parts, then one step of an older trainer (no parts timed apart)."""
    steps = [step(1, n, 0, step_time_ms=900.0, input_wait_ms=0.0, compute_ms=0.0,
                  sync_ms=900.0, update_ms=0.0, grad_sync_bytes=BUS_BYTES)
             for n in range(1, WARMUP_STEPS + 1)]
    steps += [step(1, n, 0, step_time_ms=100.0, grad_sync_bytes=BUS_BYTES, **PARTS_MS)
              for n in range(WARMUP_STEPS + 1, WARMUP_STEPS + 9)]
    steps.append(step(1, WARMUP_STEPS + 9, 0, step_time_ms=100.0, input_wait_ms=10.0,
                      compute_ms=50.0, grad_sync_bytes=BUS_BYTES))
    events: list[Event] = [Attempt(attempt=1, settings={}, fresh=True, reason="start"), *steps]
    path.write_bytes(b"".join(encode_event(e, seq=i, t=1.0 + i) for i, e in enumerate(events)))
    return steps


def exported(path: Path, what: str, fmt: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(header, rows) of one table of events.jsonl at path; CSV's numbers as floats, its
    empty cells as None, as JSON lines hold them."""
    out = path.with_suffix(f".{what}.{fmt}")
    with open(out, "w", encoding="utf-8") as fh:
        export_events(path, what, fmt, fh)
    if fmt == "jsonl":
        rows = read_jsonl(out)
        return list(rows[0]), rows

    def cell(value: str) -> Any:
        try:
            return float(value) if value else None
        except ValueError:
            return value

    header, text_rows = read_csv(out)
    return header, [{k: cell(v) for k, v in row.items()} for row in text_rows]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_step_rows_carry_each_parts_time_and_share_beside_the_input_wait(
    tmp_path: Path, fmt: str
) -> None:
    steps = timed_run(tmp_path / "events.jsonl")
    header, rows = exported(tmp_path / "events.jsonl", "steps", fmt)
    assert len(rows) == len(steps)
    # Beside input_wait_pct, after every field of Step (the parts' times among them).
    at = header.index("input_wait_pct")
    assert header[at + 1 : at + 5] == ["compute_pct", "sync_pct", "update_pct", "other_pct"]
    assert {"sync_ms", "update_ms", "compute_ms", "input_wait_ms"} <= set(header[:at])
    measured = rows[WARMUP_STEPS:-1]
    assert len(measured) == 8
    for row in measured:
        assert {k: row[k] for k in PARTS_MS} == PARTS_MS
        assert {k: row[k] for k in KNOWN_SHARES} == pytest.approx(KNOWN_SHARES)
        assert row["input_wait_pct"] + sum(row[k] for k in KNOWN_SHARES) == pytest.approx(100)
    assert rows[0]["sync_pct"] == pytest.approx(100.0)  # a warm-up step is a row as it is
    older = rows[-1]  # no sync or update time: no shares, never a made-up 0
    assert older["sync_ms"] is None and older["input_wait_pct"] == pytest.approx(10.0)
    assert all(older[k] is None for k in KNOWN_SHARES)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_an_attempts_row_carries_its_measured_breakdown_and_bus_bandwidth(
    tmp_path: Path, fmt: str
) -> None:
    timed_run(tmp_path / "events.jsonl")
    _, (row,) = exported(tmp_path / "events.jsonl", "attempts", fmt)
    at = ATTEMPT_FIGURES.index("grad_sync_bytes_per_s")
    assert ATTEMPT_FIGURES[at + 1 : at + 6] == (*KNOWN_SHARES, "bus_bytes_per_s")
    # The warm-up (all sync) is left out; the older trainer's step has no parts to add.
    assert {k: row[k] for k in KNOWN_SHARES} == pytest.approx(KNOWN_SHARES)
    assert row["bus_bytes_per_s"] == pytest.approx(BUS_BYTES / 0.020)


def test_an_attempt_with_no_step_timed_apart_has_empty_breakdown_cells(
    run: Recorded, tmp_path: Path
) -> None:
    _, rows = read_csv(export(run, tmp_path, "attempts", "csv"))
    assert rows and all(row[k] == "" for row in rows for k in (*KNOWN_SHARES, "bus_bytes_per_s"))
