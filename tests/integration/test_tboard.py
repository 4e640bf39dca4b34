"""TensorBoard scalars written without TensorFlow (supervisor/tboard.py), read back with
TensorFlow's own event reader; and the supervisor writing them live as it records."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.supervisor import Supervisor
from gpuwatch.supervisor import agent as agent_module
from gpuwatch.supervisor.tboard import EventFileWriter, RunBoard, crc32c, step_scalars
from tests.conftest import ROOT, TINY
from tests.supervisor.test_supervisor_parts import until
from trainer_runtime.protocol import Attempt, GpuSample, HostSample, Sample, StatusChange, Step

# What a scalar reads back as: TensorBoard keeps simple_value as a float32.


def f32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def crc32c_bitwise(data: bytes) -> int:
    """A reference without tables: the reflected Castagnoli polynomial, bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_crc32c_matches_the_rfc_3720_vectors_and_a_bitwise_reference() -> None:
    # RFC 3720, appendix B.4, and the usual check value.
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    assert crc32c(bytes(range(31, -1, -1))) == 0x113FDB5C
    assert crc32c(b"123456789") == 0xE3069283
    for size in (0, 1, 7, 8, 9, 15, 16, 17, 146, 1000):
        data = os.urandom(size)
        assert crc32c(data) == crc32c_bitwise(data), size


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_event_file_is_written_at_most_every_two_seconds_and_at_close(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    writer = EventFileWriter(tmp_path / "logdir", clock=clock)
    writer.add_scalars(1, {"train/loss": 1.0}, 1.0)
    clock.now += 1.9
    writer.add_scalars(2, {"train/loss": 1.0}, 2.0)
    assert not writer.path.exists(), "buffered: no directory, no file, no system call yet"
    clock.now += 0.1
    writer.add_scalars(3, {"train/loss": 1.0}, 3.0)
    written = writer.path.stat().st_size
    assert written > 0
    writer.add_scalars(4, {"train/loss": 1.0}, 4.0)
    assert writer.path.stat().st_size == written, "the next one waits for the next flush"
    writer.close()
    assert writer.path.stat().st_size > written
    assert "tfevents" in writer.path.name  # TensorBoard reads only such files


def test_a_status_change_flushes_the_board(tmp_path: Path) -> None:
    clock = FakeClock()
    board = RunBoard(tmp_path / "tb", clock=clock)
    board.observe(Attempt(attempt=1, settings={}), 1.0)
    board.observe(step_event(1, 1), 2.0)
    assert not (tmp_path / "tb").exists()
    board.observe(StatusChange(attempt=1, status="finished"), 3.0)
    (path,) = (tmp_path / "tb" / "attempt-1").glob("events.out.tfevents.*")
    assert path.stat().st_size > 0
    board.close()


def test_a_board_that_cannot_write_turns_itself_off_in_one_line_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "tb"
    blocker.write_text("a file where the directory should be")
    clock = FakeClock()
    board = RunBoard(blocker, clock=clock)
    board.observe(Attempt(attempt=1, settings={}), 1.0)
    with caplog.at_level(logging.WARNING, logger="gpuwatch.tboard"):
        board.observe(step_event(1, 1), 2.0)
        clock.now += 5.0
        board.observe(step_event(1, 2), 3.0)  # the flush fails here
        board.observe(step_event(1, 3), 4.0)
        board.observe(StatusChange(attempt=1, status="finished"), 5.0)
        board.close()
    assert not board.enabled
    (record,) = caplog.records
    assert record.getMessage().startswith("tensorboard scalars are off for this run: ")
    assert "\n" not in record.getMessage()


# -- read back with TensorFlow -----------------------------------------------------------

Scalars = list[tuple[int, float, dict[str, float]]]


def read_logdir(logdir: Path) -> tuple[list[str], Scalars]:
    """(file versions, [(step, wall_time, {tag: value})]) of the one event file in logdir."""
    import tensorflow as tf  # noqa: TID251 - the test reads with TensorFlow's own reader

    (path,) = logdir.glob("events.out.tfevents.*")
    versions: list[str] = []
    scalars: Scalars = []
    # summary_iterator checks every record's CRCs (a wrong one is a DataLossError).
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        if event.file_version:
            versions.append(event.file_version)
            continue
        values = {value.tag: value.simple_value for value in event.summary.value}
        scalars.append((event.step, event.wall_time, values))
    return versions, scalars


def logdirs(root: Path) -> set[str]:
    return {p.parent.relative_to(root).as_posix() for p in root.rglob("events.out.tfevents.*")}


@pytest.mark.slow
def test_written_scalars_read_back_with_tensorflow_as_written(tmp_path: Path) -> None:
    written: Scalars = [
        (0, 1_790_000_000.123456, {"a/zero_step": 1.5}),
        (1, 1_790_000_001.5, {"train/loss": 0.1, "train/learning_rate": 3e-4}),
        (7, 1_790_000_002.25, {"gpu0/memory_used_bytes": 81_559_388_160.0, "neg": -2.5}),
        (2**40 + 3, 1_790_000_003.0, {"big/step": 12345.678}),
        (9, 1_790_000_004.0, {"huge": 1e300, "tiny": 1e-50}),  # past float32: inf, 0
    ]
    writer = EventFileWriter(tmp_path / "logdir")
    for step, wall_time, values in written:
        writer.add_scalars(step, values, wall_time)
    writer.close()
    versions, read = read_logdir(tmp_path / "logdir")
    assert versions == ["brain.Event:2"]
    assert [(s, w) for s, w, _ in read] == [(s, w) for s, w, _ in written]  # doubles, exact
    for (_, _, got), (_, _, want) in zip(read[:-1], written[:-1], strict=True):
        assert list(got) == list(want)
        assert got == {tag: f32(value) for tag, value in want.items()}
    assert read[-1][2] == {"huge": float("inf"), "tiny": 0.0}, "as a float32 holds them"


def step_event(attempt: int, number: int, **changes: Any) -> Step:
    fields: dict[str, Any] = {
        "attempt": attempt,
        "step": number,
        "micro_step": number,
        "epoch": 0,
        "loss": 1.0 / number,
        "lr": 0.001 * number,
        "examples": 256,
        "step_time_ms": 20.0 + number,
        "input_wait_ms": 2.0,
        "grad_sync_bytes": 0.0,
    }
    fields.update(changes)
    return Step(**fields)


def gpu(index: int, util: float | None, memory: int) -> GpuSample:
    return GpuSample(**{
        "index": index,
        "name": "Fake H100",
        "uuid": None,
        "util_gpu_pct": util,
        "util_mem_pct": 10.0,
        "mem_used_bytes": memory,
        "pcie_rx_bytes_per_s": 1_000_000 * (index + 1),
        "pcie_tx_bytes_per_s": 2_000_000,
        "nvlink_rx_bytes_per_s": None,
        "nvlink_tx_bytes_per_s": 5_000,
        "power_w": 300.5,
        "temperature_c": 61.0,
    })


@pytest.mark.slow
def test_the_run_board_puts_each_attempt_and_worker_where_tensorboard_shows_them(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tensorboard"
    board = RunBoard(root)
    host = HostSample(cpu_pct=42.5, mem_used_bytes=8_000_000_000, run_cpu_pct=None)
    early = Sample(host=host, gpus=[gpu(0, 1.0, 1)], nvml=None)
    board.observe(early, 1.0)  # before any attempt: not written
    board.observe(Attempt(attempt=1, settings={}), 2.0)
    board.observe(step_event(1, 1), 3.0)
    board.observe(step_event(1, 1, worker=1, step_time_ms=40.0), 3.1)
    board.observe(
        Sample(host=host, gpus=[gpu(0, 91.5, 10**9), gpu(1, 88.0, 2 * 10**9)], nvml=None), 4.0
    )
    board.observe(
        Sample(host=HostSample(cpu_pct=None), gpus=[gpu(0, None, 5), gpu(1, 7.0, 6)], nvml=None,
               worker=1),
        4.1,
    )
    board.observe(step_event(1, 2, loss=None), 5.0)
    board.observe(StatusChange(attempt=1, status="relaunching"), 6.0)
    board.observe(Attempt(attempt=2, settings={}), 7.0)
    board.observe(Sample(host=HostSample(cpu_pct=3.0), gpus=[], nvml="no GPU", worker=1), 8.0)
    board.observe(step_event(2, 3), 9.0)
    board.observe(Sample(host=HostSample(cpu_pct=4.0), gpus=[], nvml="no GPU"), 10.0)
    board.close()

    assert logdirs(root) == {"attempt-1", "attempt-1/worker-1", "attempt-2", "attempt-2/worker-1"}

    def train(number: int, step_ms: float, loss: bool = True) -> dict[str, float]:
        # examples/s and input wait % by hand: 256 examples, 2 ms of input wait.
        values = {
            "train/loss": 1.0 / number,
            "train/learning_rate": 0.001 * number,
            "train/examples_per_s": 256 * 1000.0 / step_ms,
            "train/input_wait_pct": 100.0 * 2.0 / step_ms,
            "train/step_time_ms": step_ms,
        }
        return values if loss else {k: v for k, v in values.items() if k != "train/loss"}

    def gpu_tags(i: int, util: float | None, memory: int) -> dict[str, float]:
        tags = {
            f"gpu{i}/util_pct": util,
            f"gpu{i}/memory_util_pct": 10.0,
            f"gpu{i}/memory_used_bytes": memory,
            f"gpu{i}/pcie_rx_bytes_per_s": 1_000_000 * (i + 1),
            f"gpu{i}/pcie_tx_bytes_per_s": 2_000_000,
            f"gpu{i}/nvlink_tx_bytes_per_s": 5_000,
            f"gpu{i}/power_w": 300.5,
            f"gpu{i}/temperature_c": 61.0,
        }
        return {k: float(v) for k, v in tags.items() if v is not None}

    expected: dict[str, Scalars] = {
        "attempt-1": [
            (1, 3.0, train(1, 21.0)),
            (
                1,
                4.0,
                {
                    **gpu_tags(0, 91.5, 10**9),
                    **gpu_tags(1, 88.0, 2 * 10**9),
                    "host/cpu_pct": 42.5,
                    "host/memory_used_bytes": 8e9,
                },
            ),
            (2, 5.0, train(2, 22.0, loss=False)),
        ],
        "attempt-1/worker-1": [
            (1, 3.1, train(1, 40.0)),
            (1, 4.1, {**gpu_tags(0, None, 5), **gpu_tags(1, 7.0, 6)}),
        ],
        # A sample's step is the latest its worker reported, even from the attempt before.
        "attempt-2/worker-1": [(1, 8.0, {"host/cpu_pct": 3.0})],
        "attempt-2": [(3, 9.0, train(3, 23.0)), (3, 10.0, {"host/cpu_pct": 4.0})],
    }
    for logdir, want in expected.items():
        versions, read = read_logdir(root / logdir)
        assert versions == ["brain.Event:2"], logdir
        assert [(s, w) for s, w, _ in read] == [(s, w) for s, w, _ in want], logdir
        for (_, _, got), (_, _, values) in zip(read, want, strict=True):
            assert got == {tag: f32(value) for tag, value in values.items()}, logdir


# -- where the time of a step went -----------------------------------------------------------

# A chief's step of 100 ms: input 10 + compute 50 + all-reduce 20 + update 5 + other 15;
# worker 1's of 100 ms: input 40 + compute 45 + all-reduce 5 + update 5 + other 5 (it is
# the one the chief's all-reduce waits for).
PARTS = {
    0: {"input_wait_ms": 10.0, "compute_ms": 50.0, "sync_ms": 20.0, "update_ms": 5.0},
    1: {"input_wait_ms": 40.0, "compute_ms": 45.0, "sync_ms": 5.0, "update_ms": 5.0},
}


def breakdown_tags(worker: int) -> dict[str, float]:
    """The parts' scalars of one worker's step, by hand from PARTS: a step of 100 ms, so
    each part's share in % is its time in ms."""
    parts = PARTS[worker]
    times = {"compute": parts["compute_ms"], "sync": parts["sync_ms"],
             "update": parts["update_ms"], "other": 100.0 - sum(parts.values())}
    return {**{f"train/{part}_ms": ms for part, ms in times.items()},
            **{f"train/{part}_pct": ms for part, ms in times.items()}}


def test_a_step_without_its_parts_timed_apart_has_the_scalars_it_always_had() -> None:
    older = step_scalars(step_event(1, 1))
    assert set(older) == {"train/loss", "train/learning_rate", "train/examples_per_s",
                          "train/input_wait_pct", "train/step_time_ms"}
    timed = step_scalars(step_event(1, 1, step_time_ms=100.0, **PARTS[0]))
    assert {k: v for k, v in timed.items() if k not in older} == pytest.approx(breakdown_tags(0))
    assert timed["train/input_wait_pct"] + sum(
        v for k, v in timed.items() if k.endswith("_pct") and k != "train/input_wait_pct"
    ) == pytest.approx(100.0)


@pytest.mark.slow
def test_each_workers_step_breakdown_reads_back_in_its_own_log_directory(
    tmp_path: Path,
) -> None:
    root = tmp_path / "tensorboard"
    board = RunBoard(root)
    board.observe(Attempt(attempt=1, settings={}), 1.0)
    for worker in (0, 1):
        board.observe(step_event(1, 7, worker=worker, step_time_ms=100.0, **PARTS[worker]),
                      2.0 + worker)
    board.close()
    assert logdirs(root) == {"attempt-1", "attempt-1/worker-1"}
    for worker, logdir in ((0, "attempt-1"), (1, "attempt-1/worker-1")):
        _, ((at_step, _, got),) = read_logdir(root / logdir)
        assert at_step == 7
        want = {**breakdown_tags(worker), "train/input_wait_pct": PARTS[worker]["input_wait_ms"]}
        assert {tag: got[tag] for tag in want} == {t: f32(v) for t, v in want.items()}, logdir


# -- live, from the supervisor's record ----------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gw-tb-", dir="/tmp"))  # AF_UNIX path limit
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_supervisor(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Supervisor:
    monkeypatch.setenv("GPUWATCH_USER_CWD", str(ROOT))
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setattr(agent_module, "SAMPLE_INTERVAL_S", 0.2)
    run_dir = short_dir / "runs" / "r1"
    run_dir.mkdir(parents=True)
    shutil.copy(TINY, run_dir / "config.yaml")
    return Supervisor(
        run_dir,
        short_dir / "sock" / "r1.sock",
        fresh=True,
    )


def recorded(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def samples_after_a_step(run_dir: Path, attempt: int) -> int:
    """Device samples recorded since attempt's first step."""
    count, seen = 0, False
    for event in recorded(run_dir):
        seen = seen or (event["type"] == "step" and event["attempt"] == attempt)
        count += seen and event["type"] == "sample"
    return count


async def run_two_attempts(sup: Supervisor) -> None:
    from gpuwatch.follow.client import RunClient

    running = asyncio.create_task(sup.run())
    await until(lambda: sup.status == "running", "the first attempt to run")
    await until(lambda: samples_after_a_step(sup.run_dir, 1) >= 2, "samples in attempt 1")
    async with RunClient(sup.socket_path) as client:
        await client.command("relaunch", overrides={"data.prefetch": 2}, live=False)
        await until(lambda: sup.status == "running", "the second attempt to run")
        await until(lambda: samples_after_a_step(sup.run_dir, 2) >= 2, "samples in attempt 2")
        await client.command("stop")
    assert await asyncio.wait_for(running, 30) == 0


def expected_from_events(events: list[dict[str, Any]]) -> dict[str, Scalars]:
    """The scalars each attempt's log directory should hold, from events.jsonl by hand."""
    out: dict[str, Scalars] = {}
    attempt, last_step = 0, 0
    for event in events:
        if event["type"] == "attempt":
            attempt = event["attempt"]
            out[f"attempt-{attempt}"] = []
        elif event["type"] == "step":
            last_step = event["step"]
            ms = event["step_time_ms"]
            values = {
                "train/loss": event["loss"],
                "train/learning_rate": event["lr"],
                "train/examples_per_s": event["examples"] * 1000.0 / ms,
                "train/input_wait_pct": 100.0 * event["input_wait_ms"] / ms,
                "train/step_time_ms": ms,
            }
            out[f"attempt-{event['attempt']}"].append((event["step"], event["t"], values))
        elif event["type"] == "sample" and attempt > 0:
            host = event["host"]
            values = {
                f"host/{name}": host[key]
                for key, name in (
                    ("cpu_pct", "cpu_pct"),
                    ("mem_used_bytes", "memory_used_bytes"),
                    ("run_cpu_pct", "run_cpu_pct"),
                )
                if host.get(key) is not None
            }
            if values:
                out[f"attempt-{attempt}"].append((last_step, event["t"], values))
    return out


@pytest.mark.slow
async def test_the_supervisor_writes_each_attempts_scalars_as_it_records_them(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = make_supervisor(short_dir, monkeypatch)
    await run_two_attempts(sup)
    root = sup.run_dir / "tensorboard"
    assert logdirs(root) == {"attempt-1", "attempt-2"}
    expected = expected_from_events(recorded(sup.run_dir))
    assert sum(1 for _, _, v in expected["attempt-2"] if "host/cpu_pct" in v) >= 2
    for logdir, want in expected.items():
        versions, read = read_logdir(root / logdir)
        assert versions == ["brain.Event:2"]
        assert [(s, w) for s, w, _ in read] == [(s, w) for s, w, _ in want], logdir
        for (_, _, got), (_, _, values) in zip(read, want, strict=True):
            assert got == {tag: f32(float(value)) for tag, value in values.items()}, logdir


async def test_a_supervisor_whose_scalars_cannot_be_written_records_the_run_all_the_same(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sup = make_supervisor(short_dir, monkeypatch)
    (sup.run_dir / "tensorboard").write_text("not a directory: every write fails")
    with caplog.at_level(logging.WARNING, logger="gpuwatch.tboard"):
        await run_two_attempts(sup)
    kinds = [e["type"] if e["type"] != "status" else e["status"] for e in recorded(sup.run_dir)]
    assert kinds.count("step") == 2 and kinds.count("hello") == 2 and kinds[-1] == "stopped"
    warnings = [r.getMessage() for r in caplog.records if r.name == "gpuwatch.tboard"]
    assert len(warnings) == 1 and "tensorboard scalars are off" in warnings[0]
