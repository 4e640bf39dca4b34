"""The supervisor's parts, each alone: the event log, exit-to-status, the agent, the client hub
and the commands. No TensorFlow: the agent runs a stand-in trainer (tests/data/fake_trainer.py),
the hub real sockets in a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.config import load_config
from gpuwatch.follow.client import CommandError, ConnectionLost, RunClient
from gpuwatch.supervisor import Supervisor, eventlog
from gpuwatch.supervisor import live as live_module
from gpuwatch.supervisor.agent import LocalAgent
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.exits import LOG_TAIL_LINES, TrainerExit, exit_status
from gpuwatch.supervisor.hub import Client, ClientHub
from tests.conftest import ROOT, TINY
from tests.data.fake_trainer import step as fake_step
from trainer_runtime.protocol import (
    Checkpoint,
    Event,
    ProtocolError,
    Run,
    Sample,
    StatusChange,
    Subscribe,
    decode,
    encode,
    encode_event,
    parse_command,
)
from trainer_runtime.schema import RunConfig


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="gw-parts-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def until(predicate: Callable[[], Any], what: str, timeout_s: float = 10) -> None:
    """Wait, without blocking the loop, until predicate() holds; fail naming what.

    As conftest.wait_for, but async: the state it waits on is changed by callbacks
    from the agent, the hub and the supervisor, so it is polled, with a deadline.
    """

    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


# -- the event log --------------------------------------------------------------------


RUN = Run(run_id="r", config_path="c.yaml", supervisor_pid=1, host="h", settings={})


def step_event(number: int, **changes: Any) -> Event:
    from dataclasses import replace

    return replace(fake_step(1, number), **changes)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def _replayed(log: EventLog, from_seq: int, until_seq: int) -> list[int]:
    seqs: list[int] = []
    async for chunk in log.replay(from_seq, until_seq):
        seqs += [decode(line)["seq"] for line in chunk.splitlines()]
    return seqs


def test_event_log_seq_is_the_line_number_and_each_event_is_on_disk_when_appended(
    tmp_path: Path,
) -> None:
    log = EventLog(tmp_path)
    try:
        for step in range(5):
            seq, t, data = log.append(step_event(step), 100.0 + step)
            assert (seq, t) == (step, 100.0 + step) and data.endswith(b"\n")
            # Flushed before it is sent anywhere: another reader sees it at once.
            last = _lines(tmp_path / "events.jsonl")[-1]
            assert (last["seq"], last["t"], last["step"]) == (step, 100.0 + step, step)
        assert [e["seq"] for e in _lines(tmp_path / "events.jsonl")] == [0, 1, 2, 3, 4]
        assert log.append(StatusChange(attempt=1, status="running"))[1] > 0, "t is filled in"
    finally:
        log.close()


def test_event_log_refuses_an_unencodable_event_without_spending_a_seq(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    try:
        log.append(step_event(1))
        with pytest.raises(ProtocolError):
            log.append(step_event(2, loss=math.nan))
        assert log.append(step_event(2))[0] == 1
    finally:
        log.close()
    assert len(_lines(tmp_path / "events.jsonl")) == 2


def test_a_restarted_event_log_counts_the_events_already_there(tmp_path: Path) -> None:
    first = EventLog(tmp_path)
    for step in range(3):
        first.append(step_event(step))
    first.close()
    again = EventLog(tmp_path)
    try:
        assert again.next_seq == 3
        assert again.append(step_event(3))[0] == 3
    finally:
        again.close()
    assert [e["seq"] for e in _lines(tmp_path / "events.jsonl")] == [0, 1, 2, 3]


async def test_event_log_replays_exactly_the_range_asked_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventlog, "REPLAY_CHUNK_BYTES", 200)  # a few events a chunk
    log = EventLog(tmp_path)
    try:
        for step in range(40):
            log.append(step_event(step))
        chunks = [chunk async for chunk in log.replay(0, 40)]
        assert len(chunks) > 5, "read in bounded chunks, not at once"
        assert await _replayed(log, 0, 40) == list(range(40))
        assert await _replayed(log, 17, 23) == list(range(17, 23))
        assert await _replayed(log, 39, 40) == [39]
        assert await _replayed(log, 40, 40) == []
        # A record that says more than the file holds: what is there, then stop.
        assert await _replayed(log, 35, 99) == list(range(35, 40))
    finally:
        log.close()


def test_state_json_summarises_the_last_status_for_ls(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    try:
        status = StatusChange(attempt=2, status="crashed", exit_code=1, message="boom")
        _, t, _ = log.append(status)
        log.write_state(status, t, step=41)
    finally:
        log.close()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state == {
        "status": "crashed", "attempt": 2, "exit_code": 1, "signal": None, "message": "boom",
        "step": 41, "t": t,
    }
    assert not (tmp_path / "state.json.tmp").exists()


# -- how a trainer's exit becomes the run's status ------------------------------------

SIGKILL, SIGTERM, SIGABRT = -signal.SIGKILL, -signal.SIGTERM, -signal.SIGABRT


@pytest.mark.parametrize(
    ("ended", "relaunching", "stop_requested", "status", "fields"),
    [
        (TrainerExit(SIGTERM), True, False, "relaunching",
         {"exit_code": None, "signal": "SIGTERM", "message": "stopped for relaunch"}),
        (TrainerExit(0, "signal"), True, True, "relaunching",
         {"exit_code": 0, "signal": None, "message": "stopped for relaunch"}),
        (TrainerExit(SIGKILL), False, True, "stopped",
         {"exit_code": None, "signal": "SIGKILL", "message": "stopped on request"}),
        (TrainerExit(0, "max_steps"), False, False, "finished",
         {"exit_code": 0, "message": "reached max steps"}),
        (TrainerExit(0, "epochs"), False, False, "finished",
         {"exit_code": 0, "message": "reached epochs"}),
        (TrainerExit(0, "signal"), False, False, "stopped",
         {"exit_code": 0, "message": "trainer exited (signal)"}),
        (TrainerExit(0), False, False, "stopped",
         {"exit_code": 0, "message": "trainer exited (no reason given)"}),
        (TrainerExit(1, error="ValueError: bad", log_lines=("Traceback", "ValueError: bad")),
         False, False, "crashed",
         {"exit_code": 1, "signal": None, "message": "exited with code 1: ValueError: bad",
          "log_tail": ["Traceback", "ValueError: bad"]}),
        # A crash while relaunching or stopping is still a crash.
        (TrainerExit(1, error="ValueError: bad"), True, True, "crashed",
         {"exit_code": 1, "signal": None, "message": "exited with code 1: ValueError: bad",
          "log_tail": []}),
        (TrainerExit(SIGKILL, oom_killed=True), False, False, "crashed",
         {"exit_code": None, "signal": "SIGKILL", "log_tail": [], "message":
          "killed by SIGKILL (the kernel's OOM killer: the machine ran out of memory)"}),
        (TrainerExit(SIGABRT, log_lines=("INFO built", "Fatal Python error: Aborted", "")),
         False, False, "crashed",
         {"exit_code": None, "signal": "SIGABRT",
          "message": "killed by SIGABRT: Fatal Python error: Aborted",
          "log_tail": ["INFO built", "Fatal Python error: Aborted", ""]}),
    ],
)
def test_exit_status(
    ended: TrainerExit, relaunching: bool, stop_requested: bool, status: str,
    fields: dict[str, Any],
) -> None:
    assert exit_status(ended, relaunching=relaunching, stop_requested=stop_requested) == (
        status, fields
    )


def test_a_crashed_status_carries_only_the_last_lines_of_the_log() -> None:
    lines = tuple(f"line {i}" for i in range(500))
    _, fields = exit_status(TrainerExit(1, log_lines=lines), relaunching=False,
                            stop_requested=False)
    assert fields["log_tail"] == list(lines[-LOG_TAIL_LINES:])


# -- the agent --------------------------------------------------------------------------


class AgentHarness:
    """A LocalAgent running the stand-in trainer, with what it reports collected."""

    def __init__(self, run_dir: Path, monkeypatch: pytest.MonkeyPatch, index: int = 3) -> None:
        self.run_dir = run_dir
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
        self.frames: list[tuple[int, str, dict[str, Any]]] = []
        self.exits: list[tuple[int, TrainerExit]] = []
        self.samples: list[tuple[int, dict[str, Any]]] = []
        self.agent = LocalAgent(
            index,
            run_dir,
            on_frame=lambda *frame: self.frames.append(frame),
            on_exit=lambda *ended: self.exits.append(ended),
            on_sample=lambda *sample: self.samples.append(sample),
        )

    async def start(self, attempt: int, mode: str, fresh: bool = False) -> None:
        self.monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", mode)
        await self.agent.start(attempt, self.run_dir / "attempt.yaml", fresh=fresh)

    def log_text(self) -> str:
        return (self.run_dir / "trainer.log").read_text()

    async def ended(self) -> TrainerExit:
        await until(lambda: self.exits, "the trainer to exit")
        index, ended = self.exits.pop()
        assert index == self.agent.index
        return ended


def test_an_exited_trainer_is_no_pid_of_the_run_while_its_watcher_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the trainer's exit and its watcher's end (its last frames read, up to 5 s),
    the agent still holds the process: its pid, perhaps another process's by then, is not
    the run's to sample. A live pid (this test's own) stands in for it."""
    import os
    from types import SimpleNamespace

    agent = AgentHarness(tmp_path, monkeypatch).agent
    agent.process = SimpleNamespace(pid=os.getpid(), returncode=None)  # type: ignore[assignment]
    assert os.getpid() in agent._run_pids()
    agent.process = SimpleNamespace(pid=os.getpid(), returncode=0)  # type: ignore[assignment]
    assert agent._run_pids() == set()


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AgentHarness:
    # The agent puts the person's working directory on the trainer's path, as gpuwatch does.
    monkeypatch.setenv("GPUWATCH_USER_CWD", str(ROOT))
    return AgentHarness(tmp_path, monkeypatch)


async def test_agent_passes_frames_up_tagged_with_its_index_and_the_attempt(
    harness: AgentHarness,
) -> None:
    await harness.start(1, "finish", fresh=True)
    ended = await harness.ended()
    assert ended == TrainerExit(0, done_reason="max_steps")
    assert [(index, event.TYPE) for index, event, _ in harness.frames] == [
        (3, "hello"), (3, "step"), (3, "done")
    ]
    assert harness.frames[0][1].attempt == 1
    assert "fake trainer: attempt 1, finish, fresh=True" in harness.log_text()
    assert harness.agent.replicas == 2
    assert not harness.agent.running and harness.agent.pid is None


async def test_agent_reports_a_crash_with_its_error_frame_and_only_this_attempts_log(
    harness: AgentHarness,
) -> None:
    await harness.start(1, "crash")
    first = await harness.ended()
    await harness.start(2, "crash")
    ended = await harness.ended()
    assert ended.returncode == 1 and ended.error == "ValueError: deliberate failure"
    assert ended.log_lines == (
        "fake trainer: attempt 2, crash, fresh=False", "ValueError: deliberate failure"
    )
    assert first.log_lines[0] == "fake trainer: attempt 1, crash, fresh=False"
    log = (harness.run_dir / "trainer.log").read_text()
    assert "=== gpuwatch: attempt 2 starting at" in log


async def test_agent_reports_a_trainer_killed_without_a_frame(harness: AgentHarness) -> None:
    await harness.start(1, "killed")
    ended = await harness.ended()
    assert ended.returncode == -signal.SIGKILL and ended.error is None
    status, fields = exit_status(ended, relaunching=False, stop_requested=False)
    assert status == "crashed"
    assert fields["message"] == "killed by SIGKILL: Fatal Python error: Aborted"


async def test_agent_stop_asks_with_sigterm_and_the_trainer_checkpoints_and_exits(
    harness: AgentHarness,
) -> None:
    await harness.start(1, "hang")
    await until(lambda: harness.frames, "hello")
    assert harness.agent.running and harness.agent.stoppable
    await asyncio.wait_for(harness.agent.stop(grace_s=30), 20)
    assert harness.exits[-1][1] == TrainerExit(0, done_reason="sigterm")
    assert not harness.agent.running and not harness.agent.stoppable
    await harness.agent.stop(grace_s=30)  # nothing to stop: returns at once


async def test_agent_stop_kills_a_trainer_that_ignores_sigterm(harness: AgentHarness) -> None:
    await harness.start(1, "stubborn")
    await until(lambda: harness.frames, "hello")
    await asyncio.wait_for(harness.agent.stop(grace_s=0.5), 20)
    assert harness.exits[-1][1].returncode == -signal.SIGKILL


async def test_agent_counts_a_frame_the_trainer_may_not_send_and_reads_on(
    harness: AgentHarness,
) -> None:
    ours, trainer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with trainer_end:
        trainer_end.sendall(
            encode_event(step_event(1)) + encode("ack", id=1) + encode_event(step_event(2))
        )
        trainer_end.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(harness.agent.read_frames(ours, 7), 10)
    assert harness.agent.bad_frames == 1
    assert [(e.TYPE, e.step, e.attempt) for _, e, _ in harness.frames] == [
        ("step", 1, 7), ("step", 2, 7)
    ]


async def test_agent_samples_its_host_in_a_thread_and_stops(harness: AgentHarness) -> None:
    harness.agent.start_sampling(asyncio.get_running_loop())
    try:
        await until(lambda: harness.samples, "a device sample")
    finally:
        harness.agent.stop_sampling()
        await asyncio.to_thread(harness.agent.join_sampling, 10)
    index, sample = harness.samples[0]
    assert index == 3 and isinstance(sample, Sample) and sample.host.mem_total_bytes


# -- the client hub ---------------------------------------------------------------------


class HubHarness:
    """A ClientHub on a real socket, recording events the way the supervisor does."""

    def __init__(self, directory: Path, queue_max_bytes: int = 8 << 20) -> None:
        run_dir = directory / "run"
        run_dir.mkdir()
        self.events = EventLog(run_dir)
        self.hub = ClientHub(
            directory / "sock" / "hub.sock",
            self.events,
            self.answer,
            queue_max_bytes=queue_max_bytes,
        )

    async def answer(self, frame: dict[str, Any], client: Client) -> bytes:
        command = parse_command(frame)
        if isinstance(command, Subscribe):
            next_seq = self.hub.subscribe(client, command.from_seq)
            return encode("ack", id=command.id, next_seq=next_seq)
        return encode("ack", id=command.id)

    def record(self, event: Event) -> None:
        seq, _, data = self.events.append(event)
        self.hub.publish(seq, data)


@pytest.fixture
async def hub(short_dir: Path) -> AsyncIterator[HubHarness]:
    harness = HubHarness(short_dir)
    await harness.hub.open()
    yield harness
    harness.hub.close()
    harness.events.close()


async def _gather(client: RunClient, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while len(events) < count:
        events += await client.next_batch()
    return events


async def test_hub_socket_is_private(hub: HubHarness) -> None:
    path = hub.hub.socket_path
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


async def test_hub_replays_then_goes_live_with_no_gap_and_no_duplicate(
    hub: HubHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventlog, "REPLAY_CHUNK_BYTES", 256)  # a replay of many small reads
    for step in range(300):
        hub.record(step_event(step))
    async with RunClient(hub.hub.socket_path) as client:
        reply = await client.subscribe(120)
        assert reply["next_seq"] == 300
        # Events recorded while the replay is still being read wait behind it.
        for step in range(300, 400):
            hub.record(step_event(step))
            await asyncio.sleep(0)
        events = await asyncio.wait_for(_gather(client, 280), 20)
    assert [e["seq"] for e in events] == list(range(120, 400))


async def test_hub_sends_nothing_before_subscribe_and_refuses_a_second_one(
    hub: HubHarness,
) -> None:
    async def answer(frame: dict[str, Any], client: Client) -> bytes:
        try:
            return await HubHarness.answer(hub, frame, client)
        except ValueError as exc:
            return encode("err", id=frame.get("id"), message=str(exc))

    hub.hub._answer = answer
    hub.record(RUN)
    async with RunClient(hub.hub.socket_path) as client:
        await client.command("status")
        hub.record(step_event(1))
        await client.subscribe(1)
        with pytest.raises(CommandError, match="already subscribed"):
            await client.subscribe(0)
        events = await asyncio.wait_for(_gather(client, 1), 10)
    assert [e["seq"] for e in events] == [1]


async def test_hub_holds_a_subscription_from_a_later_seq_until_it_is_reached(
    hub: HubHarness,
) -> None:
    hub.record(RUN)
    async with RunClient(hub.hub.socket_path) as client:
        assert (await client.subscribe(3))["next_seq"] == 1
        for step in range(1, 6):
            hub.record(step_event(step))
        events = await asyncio.wait_for(_gather(client, 3), 10)
    assert [e["seq"] for e in events] == [3, 4, 5]


async def test_hub_cuts_off_a_client_that_never_reads_and_serves_the_others(
    short_dir: Path,
) -> None:
    harness = HubHarness(short_dir, queue_max_bytes=32 * 1024)
    await harness.hub.open()
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        async with RunClient(harness.hub.socket_path) as reader:
            await reader.subscribe(0)
            await asyncio.to_thread(stalled.connect, str(harness.hub.socket_path))
            stalled.sendall(b'{"v":1,"type":"subscribe","id":1,"from_seq":0}\n')
            await until(lambda: len(harness.hub.clients) == 2 and all(
                c.subscribed_from is not None for c in harness.hub.clients.values()
            ), "both clients to subscribe")
            padding = "x" * 1000
            sent = 0
            # ~2 MB in bursts of ~10 KB: far past the kernel's buffers and the stalled
            # client's 32 KiB queue, never past the reader's.
            for _ in range(200):
                for _ in range(10):
                    harness.record(Checkpoint(attempt=1, step=sent, micro_step=sent,
                                              path=padding, seconds=0.0))
                    sent += 1
                events = await asyncio.wait_for(_gather(reader, 10), 10)
                assert [e["step"] for e in events] == list(range(sent - 10, sent))
            assert harness.hub.dropped_clients == 1
            assert len(harness.hub.clients) == 1, "only the reader is left"
            queued = max(c.queued_bytes for c in harness.hub.clients.values())
            assert queued <= 32 * 1024
    finally:
        stalled.close()
        harness.hub.close()
        harness.events.close()


async def test_hub_refuses_a_peer_that_is_not_the_runs_owner(
    hub: HubHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwatch.supervisor import hub as hub_module

    monkeypatch.setattr(hub_module, "peer_allowed", lambda uid: False)
    reader, writer = await asyncio.open_unix_connection(str(hub.hub.socket_path))
    try:
        reply = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    answer = decode(reply.splitlines()[0])
    assert answer["type"] == "err" and "permission denied" in answer["message"]
    assert hub.hub.clients == {}


async def test_hub_closes_only_the_connection_that_sent_a_bad_frame(hub: HubHarness) -> None:
    async with RunClient(hub.hub.socket_path) as good:
        await good.subscribe(0)
        reader, writer = await asyncio.open_unix_connection(str(hub.hub.socket_path))
        writer.write(b"not json\n")
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert hub.hub.bad_frames == 1
        hub.record(step_event(1))
        assert (await asyncio.wait_for(good.next_batch(), 10))[0]["step"] == 1
    with pytest.raises(ConnectionLost):
        await asyncio.wait_for(good.next_batch(), 10)  # closed by us, and said so


# -- the commands -----------------------------------------------------------------------


class FakeRun:
    """What the commands see of a supervisor, keeping a list of what they asked."""

    def __init__(self) -> None:
        self.run_id = "r1"
        self.run_dir = TINY.parent  # read only by a relaunch after the end (ended: never here)
        self.config: RunConfig = load_config(TINY).config
        self.stop_requested = False
        self.asked: list[tuple[str, Any]] = []

    def replicas_for(self, config: RunConfig) -> int:
        return 2

    def status_fields(self) -> dict[str, Any]:
        return {"status": "running", "attempt": 1}

    @property
    def stopping(self) -> bool:
        return self.stop_requested

    @property
    def ended(self) -> bool:
        return False  # a running run (status_fields): tests/cli/test_run_folder_input.py has one

    def subscribe(
        self, client: Client, from_seq: int, snapshot: str | None = None, *,
        dashboard: bool = False,
    ) -> int:
        self.asked.append(("subscribe", from_seq))
        return 42

    async def relaunch(self, config: RunConfig, *, fresh: bool) -> int:
        self.asked.append(("relaunch", (config.train.global_batch_size, fresh)))
        return 2

    async def stop_run(self) -> None:
        self.asked.append(("stop", None))

    def can_reconfigure(self) -> bool:
        return False

    def live_in_flight(self) -> str | None:
        return None

    async def reconfigure(self, config: RunConfig) -> dict[str, Any]:
        raise AssertionError("no trainer runs here")


async def _answer(run: FakeRun, **frame: Any) -> dict[str, Any]:
    reply = await Commands(run).answer({"v": 1, **frame}, client=None)  # type: ignore[arg-type]
    return decode(reply)


async def test_commands_carry_out_each_typed_command() -> None:
    run = FakeRun()
    assert await _answer(run, type="subscribe", id=1, from_seq=5) == {
        "v": 1, "type": "ack", "id": 1, "next_seq": 42, "run_id": "r1"
    }
    status = await _answer(run, type="status", id="s")
    assert status["type"] == "ack" and status["status"] == "running"
    reply = await _answer(
        run, type="relaunch", id=2, overrides={"train.global_batch_size": 128}, fresh=True
    )
    assert reply["type"] == "ack" and reply["attempt"] == 2
    assert reply["overrides"] == {"train.global_batch_size": 128}
    assert (await _answer(run, type="stop", id=3))["type"] == "ack"
    assert run.asked == [("subscribe", 5), ("relaunch", (128, True)), ("stop", None)]


@pytest.mark.parametrize(
    ("frame", "echoed_id", "message"),
    [
        ({"type": "relaunch", "id": 1, "fresh": "no"}, 1, "relaunch: fresh must be"),
        ({"type": "relaunch", "id": True}, None, "relaunch: id must be"),
        ({"type": "relaunch", "id": 2, "overrides": {"train.accumulation_steps": 3}}, 2,
         "divisible"),
        ({"type": "relaunch", "id": 3, "overrides": {"no.such_key": 1}}, 3, "unknown key"),
        ({"type": "reconfigure", "id": 4}, 4, "type must be one of"),
    ],
)
async def test_commands_refuse_what_does_not_check_and_change_nothing(
    frame: dict[str, Any], echoed_id: object, message: str
) -> None:
    run = FakeRun()
    reply = await _answer(run, **frame)
    assert reply["type"] == "err" and reply["id"] == echoed_id
    assert message in reply["message"]
    assert run.asked == []


async def test_commands_refuse_a_relaunch_once_the_run_is_stopping() -> None:
    run = FakeRun()
    run.stop_requested = True
    reply = await _answer(run, type="relaunch", id=1)
    assert reply["type"] == "err" and "stopping" in reply["message"]
    assert run.asked == []


async def test_a_failing_command_is_an_internal_error_not_a_dead_supervisor() -> None:
    run = FakeRun()

    async def broken(config: RunConfig, *, fresh: bool) -> int:
        raise RuntimeError("a bug")

    run.relaunch = broken  # type: ignore[method-assign]
    reply = await _answer(run, type="relaunch", id=9)
    assert reply == {"v": 1, "type": "err", "id": 9, "message": "internal error: a bug"}


# -- the core, over all of them ---------------------------------------------------------


@pytest.fixture
def core(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    monkeypatch.setenv("GPUWATCH_USER_CWD", str(ROOT))
    run_dir = short_dir / "runs" / "r1"
    run_dir.mkdir(parents=True)
    shutil.copy(TINY, run_dir / "config.yaml")
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    sup = Supervisor(run_dir, short_dir / "sock" / "r1.sock", fresh=True)
    yield sup


def _recorded(run_dir: Path) -> list[tuple[str, Any]]:
    """(type, status or attempt) of every event but device samples, in order."""
    return [
        (e["type"], e.get("status", e.get("attempt")))
        for e in _lines(run_dir / "events.jsonl")
        if e["type"] != "sample"
    ]


async def test_the_core_runs_attempts_relaunches_and_stops_with_one_agent(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    running = asyncio.create_task(core.run())
    await until(lambda: core.status == "running", "the first attempt to run")
    async with RunClient(core.socket_path) as client:
        reply = await client.command("relaunch", overrides={"data.prefetch": 2}, live=False)
        assert reply["attempt"] == 2 and reply["live"] is False
        await until(lambda: core.status == "running", "the second attempt to run")
        assert (await client.command("status"))["trainer_pid"] == core.agents[0].pid
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    assert _recorded(core.run_dir) == [
        ("run", None),
        ("attempt", 1), ("status", "starting"), ("hello", 1), ("status", "running"),
        ("step", 1), ("status", "stopping"), ("done", 1), ("status", "relaunching"),
        ("attempt", 2), ("status", "starting"), ("hello", 2), ("status", "running"),
        ("step", 2), ("status", "stopping"), ("done", 2), ("status", "stopped"),
    ]
    events = _lines(core.run_dir / "events.jsonl")
    attempts = [e for e in events if e["type"] == "attempt"]
    assert [a["fresh"] for a in attempts] == [True, False], "--fresh is the first attempt's"
    assert attempts[1]["settings"]["data"]["prefetch"] == 2
    assert [e["seq"] for e in events] == list(range(len(events)))
    state = json.loads((core.run_dir / "state.json").read_text())
    assert state["status"] == "stopped" and state["attempt"] == 2
    assert not (core.run_dir / "supervisor.json").exists() and not core.socket_path.exists()


async def test_the_core_records_a_finished_run_and_waits_for_a_relaunch(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "finish")
    running = asyncio.create_task(core.run())
    await until(lambda: core.status == "finished", "the run to finish")
    assert not running.done(), "it lingers: a dashboard may still relaunch"
    await core.stop_run()
    assert await asyncio.wait_for(running, 20) == 0
    assert _recorded(core.run_dir)[-3:] == [("step", 1), ("done", 1), ("status", "finished")]


def test_fresh_reaches_the_supervisor_as_an_argument(tmp_path: Path) -> None:
    from gpuwatch.runs.spawn import _supervisor_command

    assert _supervisor_command(tmp_path, fresh=True)[-1] == "--fresh"
    assert "--fresh" not in _supervisor_command(tmp_path)


async def test_agent_start_says_why_when_the_trainer_log_cannot_be_written(
    harness: AgentHarness,
) -> None:
    from gpuwatch.supervisor.agent import AgentStartError

    harness.agent.log_path.mkdir()  # trainer.log is a directory: the header cannot be written
    with pytest.raises(AgentStartError, match=r"could not write .*trainer\.log"):
        await harness.start(1, "finish")
    assert harness.agent.pid is None and not harness.frames


# -- live changes: the next attempt in the same trainer process ----------------------------


async def _running_core(core: Supervisor) -> asyncio.Task[int]:
    running = asyncio.create_task(core.run())
    await until(lambda: core.status == "running", "the first attempt to run")
    return running


async def test_a_live_relaunch_is_a_new_attempt_in_the_same_trainer_process(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    running = await _running_core(core)
    pid = core.agents[0].pid
    async with RunClient(core.socket_path) as client:
        reply = await client.command("relaunch", overrides={"data.prefetch": 2})
        assert reply["attempt"] == 2 and reply["live"] is True and reply["seconds"] >= 0
        await until(lambda: core.last_step == 2, "the step after the change")
        status = await client.command("status")
        assert status["trainer_pid"] == pid and status["attempt"] == 2
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    assert core.config.data.prefetch == 2
    assert _recorded(core.run_dir) == [
        ("run", None),
        ("attempt", 1), ("status", "starting"), ("hello", 1), ("status", "running"),
        ("step", 1), ("reconfigured", 1), ("attempt", 2), ("status", "running"), ("step", 2),
        ("status", "stopping"), ("done", 2), ("status", "stopped"),
    ]
    events = _lines(core.run_dir / "events.jsonl")
    live = [e for e in events if e["type"] == "attempt"][1]
    assert live["reason"] == "live" and live["settings"]["data"]["prefetch"] == 2
    assert live["config_path"].endswith("attempt-2.yaml")
    assert (core.run_dir / "attempt-2.yaml").exists()
    assert json.loads((core.run_dir / "state.json").read_text())["attempt"] == 2
    (answer,) = [e for e in events if e["type"] == "reconfigured"]
    assert answer["ok"] is True and answer["changed"] == ["data.prefetch"]


async def test_a_refused_live_change_is_an_err_and_the_old_settings_go_on(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.setenv("GPUWATCH_FAKE_RECONFIGURE", "refuse")
    running = await _running_core(core)
    pid, prefetch = core.agents[0].pid, core.config.data.prefetch
    async with RunClient(core.socket_path) as client:
        with pytest.raises(CommandError, match="fake: cannot apply this change"):
            await client.command("relaunch", overrides={"data.prefetch": 2})
        status = await client.command("status")
        assert status["trainer_pid"] == pid and status["attempt"] == 1
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    assert core.config.data.prefetch == prefetch
    types = [kind for kind, _ in _recorded(core.run_dir)]
    assert types.count("attempt") == 1 and "reconfigured" in types


async def test_a_live_change_with_no_answer_stays_in_flight_until_the_trainer_goes(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.setenv("GPUWATCH_FAKE_RECONFIGURE", "ignore")
    monkeypatch.setattr(live_module, "LIVE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(live_module, "LIVE_ANSWER_GRACE_S", 0.5)
    running = await _running_core(core)
    async with RunClient(core.socket_path) as client:
        reply = await client.command("relaunch", overrides={"data.prefetch": 2})
        assert reply["pending"] is True and reply["attempt"] == 2
        assert "training goes on with the old settings until it applies" in reply["message"]
        assert (await client.command("status"))["attempt"] == 1
        # One change at a time: the next is refused while this one is in flight.
        with pytest.raises(CommandError, match="still being applied"):
            await client.command("relaunch", overrides={"data.prefetch": 3})
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    assert core.live.change is None  # the trainer went: the change with it
    assert [kind for kind, _ in _recorded(core.run_dir)].count("attempt") == 1


async def test_a_stop_goes_ahead_while_a_live_change_waits_and_settles_it(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.setenv("GPUWATCH_FAKE_RECONFIGURE", "ignore")  # the default 40 s wait
    running = await _running_core(core)
    async with RunClient(core.socket_path) as relauncher, RunClient(core.socket_path) as stopper:
        change = asyncio.create_task(
            relauncher.command("relaunch", overrides={"data.prefetch": 2}))
        await until(lambda: core.live.change is not None, "the change to be sent")
        started = time.monotonic()
        await asyncio.wait_for(stopper.command("stop"), 10)
        assert time.monotonic() - started < 10, "the stop did not wait out the change"
        with pytest.raises(CommandError, match="exited before applying the change"):
            await asyncio.wait_for(change, 10)
    assert await asyncio.wait_for(running, 20) == 0
    assert [kind for kind, _ in _recorded(core.run_dir)].count("attempt") == 1


async def test_a_late_ok_is_the_new_attempt_and_its_steps_are_filed_under_it(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.setenv("GPUWATCH_FAKE_RECONFIGURE", "late")  # ok after 1.5 s
    monkeypatch.setattr(live_module, "LIVE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(live_module, "LIVE_ANSWER_GRACE_S", 0.3)
    running = await _running_core(core)
    async with RunClient(core.socket_path) as client:
        reply = await client.command("relaunch", overrides={"data.prefetch": 2})
        assert reply["pending"] is True and reply["attempt"] == 2
        await until(lambda: core.attempt == 2, "the late ok to begin attempt 2")
        await until(lambda: core.last_step == 2, "the step after the change")
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    assert core.config.data.prefetch == 2
    recorded = _recorded(core.run_dir)
    at = recorded.index(("reconfigured", 1))
    assert recorded[at:at + 4] == [("reconfigured", 1), ("attempt", 2), ("status", "running"),
                                   ("step", 2)]


@pytest.mark.parametrize(
    ("overrides", "live"),
    [({"data.prefetch": 2}, False), ({"model.hidden_units": [8]}, True)],
    ids=["live-false", "non-live-key"],
)
async def test_a_relaunch_that_cannot_or_may_not_be_live_starts_a_new_trainer(
    core: Supervisor, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], live: bool
) -> None:
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    running = await _running_core(core)
    pid = core.agents[0].pid
    async with RunClient(core.socket_path) as client:
        reply = await client.command("relaunch", overrides=overrides, live=live)
        assert reply["attempt"] == 2 and reply["live"] is False
        await until(lambda: core.status == "running", "the second attempt to run")
        assert (await client.command("status"))["trainer_pid"] not in (None, pid)
        await client.command("stop")
    assert await asyncio.wait_for(running, 20) == 0
    events = _lines(core.run_dir / "events.jsonl")
    assert [e["reason"] for e in events if e["type"] == "attempt"] == ["start", "relaunch"]
    assert not [e for e in events if e["type"] == "reconfigured"]
