"""The supervisor's fold and its snapshots: snapshot.json, restore, and attach through the hub.

No TensorFlow. Ground truth is a fold of events.jsonl read back from disk by a fresh
RunState (the dashboard's own fold of every event), never the keeper's state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import RunClient
from gpuwatch.runstate import RunState
from gpuwatch.runstate.codec import snapshotted
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.hub import ClientHub
from gpuwatch.supervisor.snapshots import SNAPSHOT_FILE, StateKeeper
from tests.data.fake_trainer import step as fake_step
from trainer_runtime.protocol import Attempt, Event, HostSample, Run, Sample, StatusChange

FORMAT = RunState.snapshot_format()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="gw-snap-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_fields(state: RunState) -> dict[str, Any]:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if snapshotted(f)}


def fold_of_file(run_dir: Path) -> RunState:
    state = RunState()
    with open(run_dir / "events.jsonl", encoding="utf-8") as fh:
        state.apply_many(json.loads(line) for line in fh)
    return state


def some_events(count: int, attempt: int = 1, first_step: int = 1) -> list[Event]:
    events: list[Event] = [
        Attempt(attempt=attempt, settings={"data": {"prefetch": attempt}}),
        StatusChange(attempt=attempt, status="running"),
    ]
    for i in range(count):
        events.append(replace(fake_step(attempt, first_step + i), step_time_ms=10.0 + i % 7))
        if i % 10 == 9:
            events.append(Sample(host=HostSample(cpu_pct=float(i)), gpus=[], nvml="none"))
    return events


class Recorder:
    """What Supervisor.record does: the log, then the keeper's fold (then the hub)."""

    def __init__(self, run_dir: Path) -> None:
        self.events = EventLog(run_dir)
        self.keeper = StateKeeper(run_dir, self.events)
        self.hub: ClientHub | None = None

    def record(self, *events: Event) -> None:
        for event in events:
            seq, t, data = self.events.append(event, 1000.0 + self.events.next_seq)
            self.keeper.fold(seq, event, t)
            if self.hub is not None:
                self.hub.publish(seq, data)

    def close(self) -> None:
        self.events.close()


@pytest.fixture
def recorder(short_dir: Path) -> Iterator[Recorder]:
    run_dir = short_dir / "run"
    run_dir.mkdir()
    rec = Recorder(run_dir)
    rec.record(Run(run_id="r", config_path="c", supervisor_pid=1, host="h", settings={}))
    yield rec
    rec.close()


# -- the keeper -----------------------------------------------------------------------------


def test_the_snapshot_written_is_the_fold_of_the_log_so_far(recorder: Recorder) -> None:
    recorder.record(*some_events(40))
    recorder.keeper.write()
    run_dir = recorder.events.run_dir
    saved = RunState.from_snapshot((run_dir / SNAPSHOT_FILE).read_text())
    assert run_fields(saved) == run_fields(fold_of_file(run_dir))
    assert recorder.keeper.latest is not None
    assert recorder.keeper.latest.seq == recorder.events.next_seq - 1 == saved.last_seq
    assert not (run_dir / (SNAPSHOT_FILE + ".tmp")).exists()


def test_a_snapshot_is_written_only_when_something_was_folded_since(recorder: Recorder) -> None:
    recorder.keeper.write()
    recorder.keeper.write()
    assert recorder.keeper.writes == 1
    recorder.record(*some_events(1))
    recorder.keeper.interval_s = 3600.0
    recorder.keeper.tick()
    assert recorder.keeper.writes == 1, "not due yet"
    recorder.keeper.interval_s = 0.0
    recorder.keeper.tick()
    assert recorder.keeper.writes == 2


@pytest.mark.parametrize(
    "saved", ["with a snapshot", "without one", "of another format", "ahead of the log"]
)
def test_a_restarted_keeper_folds_on_from_where_it_can(recorder: Recorder, saved: str) -> None:
    recorder.record(*some_events(30))
    recorder.keeper.write()
    recorder.record(*some_events(25, attempt=2, first_step=31))
    recorder.close()
    run_dir = recorder.events.run_dir
    snapshot_path = run_dir / SNAPSHOT_FILE
    if saved == "without one":
        snapshot_path.unlink()
    elif saved == "of another format":
        snapshot_path.write_text(json.dumps({"schema": "0-old", "data": {}}))
    elif saved == "ahead of the log":  # events.jsonl lost lines the snapshot had folded
        log = run_dir / "events.jsonl"
        log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:12]))
    events = EventLog(run_dir)
    try:
        keeper = StateKeeper(run_dir, events)
        folded = keeper.restore()
        assert run_fields(keeper.state) == run_fields(fold_of_file(run_dir))
        assert recorder.keeper.latest is not None
        tail = events.next_seq - (recorder.keeper.latest.seq + 1)
        assert folded == (tail if saved == "with a snapshot" else events.next_seq)
        assert (keeper.latest is not None) == (saved == "with a snapshot")
    finally:
        events.close()


def test_a_fold_that_fails_turns_snapshots_off_and_loses_no_event(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder.record(*some_events(5))
    recorder.keeper.write()
    run_dir = recorder.events.run_dir
    assert (run_dir / SNAPSHOT_FILE).exists()

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in the fold")

    monkeypatch.setattr(recorder.keeper.state, "apply_event", broken)
    recorder.record(*some_events(3, attempt=2, first_step=6))
    assert recorder.keeper.broken is not None and "a bug in the fold" in recorder.keeper.broken
    assert not (run_dir / SNAPSHOT_FILE).exists(), "no stale snapshot left to attach from"
    assert recorder.keeper.snapshot_for(FORMAT or "") is None
    assert fold_of_file(run_dir).last_seq == recorder.events.next_seq - 1


# -- attaching through the hub --------------------------------------------------------------


class Serving:
    def __init__(self, recorder: Recorder, directory: Path) -> None:
        self.recorder = recorder
        self.hub = ClientHub(
            directory / "sock" / "hub.sock",
            recorder.events,
            Commands(self).answer,
            snapshots=recorder.keeper.snapshot_for,
        )
        recorder.hub = self.hub
        self.run_id = "r"

    def subscribe(
        self, client: Any, from_seq: int, snapshot: str | None = None, *,
        dashboard: bool = False,
    ) -> int:
        return self.hub.subscribe(client, from_seq, snapshot, dashboard=dashboard)


@pytest.fixture
async def serving(recorder: Recorder, short_dir: Path) -> AsyncIterator[Serving]:
    served = Serving(recorder, short_dir)
    await served.hub.open()
    yield served
    served.hub.close()


async def gather_until(client: RunClient, last_seq: int) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []

    async def gather() -> None:
        while not frames or frames[-1].get("seq") != last_seq:
            frames.extend(await client.next_batch())

    await asyncio.wait_for(gather(), 20)
    return frames


async def test_attach_gets_the_snapshot_then_only_the_events_after_it(serving: Serving) -> None:
    rec = serving.recorder
    rec.record(*some_events(60))
    rec.keeper.write()
    snapshot_seq = rec.events.next_seq - 1
    rec.record(*some_events(15, attempt=2, first_step=61))
    async with RunClient(serving.hub.socket_path) as client:
        reply = await client.subscribe(0, snapshot=FORMAT)
        assert reply["snapshot_seq"] == snapshot_seq
        rec.record(*some_events(5, attempt=3, first_step=76))  # live, after the subscribe
        frames = await gather_until(client, rec.events.next_seq - 1)
    assert frames[0]["type"] == "snapshot" and frames[0]["seq"] == snapshot_seq
    assert [f["seq"] for f in frames[1:]] == list(range(snapshot_seq + 1, rec.events.next_seq))
    dashboard = RunState()
    dashboard.apply_many(frames)
    assert run_fields(dashboard) == run_fields(fold_of_file(rec.events.run_dir))


@pytest.mark.parametrize("asked", [None, "0-another-format"])
async def test_a_client_without_the_format_gets_every_event(
    serving: Serving, asked: str | None
) -> None:
    rec = serving.recorder
    rec.record(*some_events(20))
    rec.keeper.write()
    async with RunClient(serving.hub.socket_path) as client:
        reply = await client.subscribe(0, snapshot=asked)
        frames = await gather_until(client, rec.events.next_seq - 1)
    assert [f["seq"] for f in frames] == list(range(rec.events.next_seq))
    if asked is None:
        assert "snapshot_seq" not in reply, "the reply an older client knows"
    else:
        assert reply["snapshot_seq"] is None


async def test_a_snapshot_older_than_from_seq_is_not_sent(serving: Serving) -> None:
    rec = serving.recorder
    rec.record(*some_events(10))
    rec.keeper.write()
    from_seq = rec.events.next_seq + 3
    rec.record(*some_events(10, attempt=2, first_step=11))
    async with RunClient(serving.hub.socket_path) as client:
        reply = await client.subscribe(from_seq, snapshot=FORMAT)
        frames = await gather_until(client, rec.events.next_seq - 1)
    assert reply["snapshot_seq"] is None
    assert [f["seq"] for f in frames] == list(range(from_seq, rec.events.next_seq))


# -- the supervisor ---------------------------------------------------------------------------


async def test_a_supervisor_keeps_snapshot_json_the_fold_of_its_log_across_a_restart(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwatch.supervisor import Supervisor
    from tests.conftest import ROOT, TINY

    monkeypatch.setenv("GPUWATCH_USER_CWD", str(ROOT))
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "finish")
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    run_dir = short_dir / "runs" / "r1"
    run_dir.mkdir(parents=True)
    shutil.copy(TINY, run_dir / "config.yaml")
    for first in (True, False):  # the second supervisor starts again on the same directory
        supervisor = Supervisor(run_dir, short_dir / "sock" / "r1.sock", fresh=first)
        running = asyncio.create_task(supervisor.run())

        async def finished(supervisor: Supervisor = supervisor) -> None:
            while supervisor.status != "finished":  # noqa: ASYNC110
                await asyncio.sleep(0.01)

        await asyncio.wait_for(finished(), 20)
        # Written at the status change: a dashboard attaching now starts from the end.
        saved = RunState.from_snapshot((run_dir / SNAPSHOT_FILE).read_text())
        assert saved.status == "finished"
        assert saved.last_seq == supervisor.events.next_seq - 1
        await supervisor.stop_run()
        assert await asyncio.wait_for(running, 20) == 0
        whole = fold_of_file(run_dir)
        saved = RunState.from_snapshot((run_dir / SNAPSHOT_FILE).read_text())
        assert run_fields(saved) == run_fields(whole)
        assert run_fields(supervisor.keeper.state) == run_fields(whole)
    assert [
        e["seq"] for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
    ] == list(range(whole.last_seq + 1))
    # A step from each supervisor's trainer: the second goes on as the run's next attempt.
    assert (whole.attempts[1].steps_seen, whole.attempts[2].steps_seen) == (1, 1)
