"""The record after a live change matches what the trainers ran, whatever the timing.

A live change is in flight from the relaunch command until every trainer has answered
(or exited). The command may be answered before that (``pending``: the wait ran out);
the record must still follow the trainers: every step is filed under the attempt whose
settings the trainer ran for it, a late ``ok`` begins the new attempt, a refusal leaves
the old one going, and an attempt is recorded before any step filed under it.

The property test drives the real Supervisor's frame path (agents' attempt stamps, the
core's on_trainer_frame, LiveChanges, the commands, events.jsonl) with stand-in trainers
whose every move is a hypothesis step: a step, an answer (ok or refused; in a cluster all
workers give the same verdict, as the trainers' agreement makes them), a trainer exit, a
new change asked for, and the wait running out. Each change sets data.read_latency_ms to
a value of its own, so the settings a recorded attempt names say which change it is.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gpuwatch.supervisor.live as live_module
from gpuwatch.supervisor.agent import AttemptStamp
from gpuwatch.supervisor.core import Supervisor
from tests.conftest import TINY
from tests.data.fake_trainer import step as step_event
from trainer_runtime.protocol import Event, Reconfigured, decode

# The first attempt's read latency (tiny.yaml's), and each change's: BASE + its number.
BASE_LATENCY = 1000


@dataclass
class Trainer:
    """What one stand-in trainer runs: the latency in effect, the request it holds."""

    latency: int
    step: int = 0
    alive: bool = True
    request: tuple[int, int] | None = None  # (request id, latency it asks for)
    # (step, the latency it ran with), in the order sent.
    ran: list[tuple[int, int]] = field(default_factory=list)


class StandInAgent:
    """An agent as the core sees one: its attempt stamp, reconfigure down, frames up."""

    live_capable = True
    replicas = None
    bad_frames = 0
    spare_pid = None

    def want_spare(self, wanted: bool) -> None:
        pass

    def release_spare(self) -> None:
        pass

    def __init__(self, index: int, core: Supervisor, trainer: Trainer) -> None:
        self.index = index
        self.core = core
        self.trainer = trainer
        self._stamp = AttemptStamp(1)

    @property
    def stoppable(self) -> bool:
        return self.trainer.alive

    running = stoppable

    async def reconfigure(self, request_id: int, new_attempt: int, settings: dict[str, Any],
                          at_step: int, deadline_s: float) -> None:
        self._stamp.pending = (request_id, new_attempt)
        self.trainer.request = (request_id, settings["data"]["read_latency_ms"])

    def cancel_reconfigure(self, attempt: int) -> None:
        self._stamp.cancel(attempt)

    def take(self, event: Event) -> None:
        """A frame from the trainer, stamped as LocalAgent._take_frame stamps it."""
        stamped = replace(event, attempt=self._stamp.attempt, worker=self.index)  # type: ignore[call-arg]
        if isinstance(stamped, Reconfigured):
            self._stamp.answered(stamped)
        self.core.on_trainer_frame(self.index, stamped, None)


# One move of the world. worker is taken modulo the workers.
Move = tuple[str, int, bool]
moves = st.lists(
    st.tuples(st.sampled_from(["step", "step", "answer", "ask", "wait", "exit"]),
              st.integers(0, 1), st.booleans()),
    max_size=40,
)


def _config_text(workers: int) -> str:
    text = TINY.read_text()
    if workers > 1:
        text += f"cluster:\n  workers: {workers}\n"
    return text


async def _play(run_dir: Path, workers: int, script: list[Move]) -> list[Trainer]:
    core = Supervisor(run_dir, run_dir / "sup.sock", fresh=True)
    trainers = [Trainer(latency=BASE_LATENCY) for _ in range(workers)]
    agents = [StandInAgent(i, core, trainers[i]) for i in range(workers)]
    core.workers.agents[:] = agents  # type: ignore[index]
    core.agents = core.workers.agents
    core.attempt = 1
    core.attempts.record(run_dir / "config.yaml", "start")
    core.status = "running"
    verdicts: dict[int, bool] = {}  # a cluster's trainers agree: one verdict per request
    asked = 0
    commands: list[asyncio.Task[bytes]] = []

    def send(index: int, event: Event) -> None:
        agents[index].take(event)

    for kind, who, ok in script:
        index = who % workers
        trainer = trainers[index]
        if kind == "step" and trainer.alive:
            trainer.step += 1
            trainer.ran.append((trainer.step, trainer.latency))
            send(index, step_event(0, trainer.step))
        elif kind == "answer" and trainer.alive and trainer.request is not None:
            request_id, latency = trainer.request
            verdict = verdicts.setdefault(request_id, ok)
            trainer.request = None
            send(index, Reconfigured(attempt=0, id=request_id, ok=verdict, step=trainer.step,
                                     changed=["data.read_latency_ms"] if verdict else [],
                                     seconds=0.1, message="" if verdict else "refused here"))
            if verdict:
                trainer.latency = latency
        elif kind == "exit" and trainer.alive:
            trainer.alive = False
            trainer.request = None
            core.live.trainer_exited(index)
        elif kind == "ask" and all(t.alive for t in trainers):
            asked += 1
            frame = {"v": 1, "type": "relaunch", "id": asked,
                     "overrides": {"data.read_latency_ms": BASE_LATENCY + asked}}
            commands.append(asyncio.create_task(core.commands.answer(frame, None)))  # type: ignore[arg-type]
        elif kind == "wait":
            await asyncio.sleep(0.05)  # past the (shortened) wait: the command answers
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    # The end of the attempt: the commands' waits run out, every trainer exits; what is in
    # flight settles.
    for _ in range(5):  # every command sent: waiting for its answer, or answered
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    for index, trainer in enumerate(trainers):
        if trainer.alive:
            trainer.alive = False
            core.live.trainer_exited(index)
    for reply in await asyncio.gather(*commands):
        answer = decode(reply)
        assert answer["type"] in ("ack", "err"), answer
        if answer["type"] == "err":  # one line, and none of them an internal error
            assert "internal error" not in answer["message"] and "\n" not in answer["message"]
    assert core.live.change is None
    core.recorder.close()
    return trainers


def _check_record(run_dir: Path, trainers: list[Trainer]) -> None:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    latency_of: dict[int, int] = {}  # attempt -> the read latency its settings name
    filed: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(trainers))}
    for event in events:
        if event["type"] == "attempt":
            assert event["attempt"] not in latency_of, "an attempt recorded twice"
            latency_of[event["attempt"]] = event["settings"]["data"]["read_latency_ms"]
        elif event["type"] == "step":
            # Recorded after its attempt, and filed under the settings the trainer ran.
            assert event["attempt"] in latency_of, f"step filed under unrecorded {event}"
            filed[event["worker"]].append((event["step"], latency_of[event["attempt"]]))
    for index, trainer in enumerate(trainers):
        assert filed[index] == trainer.ran, f"worker {index}'s steps filed wrongly"
    assert sorted(latency_of) == list(range(1, len(latency_of) + 1))


@pytest.mark.parametrize("workers", [1, 2])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=moves)
# A late ok (answered after the command's wait ran out), then steps; the same in a cluster
# with one worker stepping between the two answers; a late refusal; an exit before any ok.
@example(script=[("ask", 0, False), ("wait", 0, False), ("answer", 0, True), ("step", 0, False)])
@example(script=[("ask", 0, False), ("wait", 0, False), ("answer", 0, True), ("step", 0, False),
                 ("step", 0, False), ("answer", 1, True), ("step", 1, False), ("step", 0, False)])
@example(script=[("ask", 0, False), ("wait", 0, False), ("answer", 0, False), ("step", 0, False),
                 ("ask", 0, False), ("answer", 0, True), ("answer", 1, True), ("step", 1, False)])
@example(script=[("ask", 0, False), ("step", 0, False), ("exit", 0, False), ("step", 1, False)])
# A worker exits unanswered, then another says ok: it switched with the rest, so its steps
# after are the new attempt's (an exit alone used to settle the change as not applied).
@example(script=[("ask", 0, False), ("exit", 1, False), ("answer", 0, True), ("step", 0, False)])
def test_every_step_is_filed_under_the_settings_its_trainer_ran(
    workers: int, script: list[Move]
) -> None:
    base = Path(tempfile.mkdtemp(prefix="gw-live-", dir="/tmp"))
    saved = live_module.LIVE_TIMEOUT_S, live_module.LIVE_ANSWER_GRACE_S
    try:
        run_dir = base / "r1"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(_with_latency(workers))
        live_module.LIVE_TIMEOUT_S, live_module.LIVE_ANSWER_GRACE_S = 0.0, 0.02
        trainers = asyncio.run(_play(run_dir, workers, script))
        _check_record(run_dir, trainers)
    finally:
        live_module.LIVE_TIMEOUT_S, live_module.LIVE_ANSWER_GRACE_S = saved
        shutil.rmtree(base, ignore_errors=True)


def _with_latency(workers: int) -> str:
    import yaml

    config = yaml.safe_load(_config_text(workers))
    config.setdefault("data", {})["read_latency_ms"] = BASE_LATENCY
    return yaml.safe_dump(config)


def test_the_stand_in_config_is_a_run_config() -> None:
    from gpuwatch.config import load_config

    base = Path(tempfile.mkdtemp(prefix="gw-live-", dir="/tmp"))
    try:
        path = base / "config.yaml"
        path.write_text(_with_latency(2))
        config = load_config(path).config
        assert config.data.read_latency_ms == BASE_LATENCY and config.cluster is not None
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_late_ok_during_a_stop_begins_the_attempt_on_the_status_the_run_has() -> None:
    """The new attempt is recorded with the status the run had (stopping), never 'running'."""
    base = Path(tempfile.mkdtemp(prefix="gw-live-", dir="/tmp"))
    saved = live_module.LIVE_TIMEOUT_S, live_module.LIVE_ANSWER_GRACE_S
    try:
        run_dir = base / "r1"
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(_with_latency(1))
        live_module.LIVE_TIMEOUT_S, live_module.LIVE_ANSWER_GRACE_S = 0.0, 0.02

        async def play() -> Supervisor:
            core = Supervisor(run_dir, run_dir / "sup.sock", fresh=True)
            trainer = Trainer(latency=BASE_LATENCY)
            agent = StandInAgent(0, core, trainer)
            core.workers.agents[:] = [agent]  # type: ignore[list-item]
            core.agents = core.workers.agents
            core.attempt = 1
            core.attempts.record(run_dir / "config.yaml", "start")
            core.status = "running"
            frame = {"v": 1, "type": "relaunch", "id": 1,
                     "overrides": {"data.read_latency_ms": BASE_LATENCY + 1}}
            reply = decode(await core.commands.answer(frame, None))  # type: ignore[arg-type]
            assert reply["pending"] is True
            core.set_status("stopping")  # a stop came; the trainer answers on its way out
            assert trainer.request is not None
            agent.take(Reconfigured(attempt=0, id=trainer.request[0], ok=True, step=0,
                                    changed=["data.read_latency_ms"], seconds=30.0))
            core.recorder.close()
            return core

        core = asyncio.run(play())
        assert core.attempt == 2 and core.status == "stopping"
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().split("\n")
                  if line]
        statuses = [(e["attempt"], e["status"]) for e in events if e["type"] == "status"]
        assert statuses[-1] == (2, "stopping") and (2, "running") not in statuses
    finally:
        live_module.LIVE_TIMEOUT_S, live_module.LIVE_ANSWER_GRACE_S = saved
        shutil.rmtree(base, ignore_errors=True)


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
