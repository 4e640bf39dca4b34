"""Live settings: a reconfigure frame down the telemetry socket, applied in the same process.

Real trainer processes (``python -m trainer_runtime --telemetry-fd``); the test
plays the supervisor: it sends ``protocol.reconfigure_frame`` and reads events.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import psutil
import pytest

from tests.integration.trainer.test_multiworker import (
    DEADLINE_S,
    ROOT,
    Worker,
    _free_ports,
    _kill_all,
)
from trainer_runtime import protocol
from trainer_runtime.protocol import Hello, Reconfigured, Step
from trainer_runtime.schema import RunConfig
from trainer_runtime.spare import READY

pytestmark = pytest.mark.slow


class Trainer(Worker):
    """A worker that also keeps when each event arrived (this host's clock)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.arrived: list[float] = []
        super().__init__(*args, **kwargs)

    def _read(self) -> None:
        frames = protocol.FrameBuffer()
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            events = [protocol.parse_event(f)[1] for f in frames.feed(data)]
            now = time.monotonic()
            with self.changed:
                self.events.extend(events)
                self.arrived.extend([now] * len(events))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def send(
        self, request_id: int, settings: dict[str, Any], at_step: int = 0,
        deadline_s: float = protocol.LIVE_DEADLINE_S,
    ) -> float:
        """Send the request; when it was sent: taken before the send, so that nothing the
        trainer times from its receipt can start earlier (a time taken after it lagged the
        trainer's own by 33 ms under load, s-2 at 1a29ef1)."""
        sent = time.monotonic()
        self.sock.sendall(protocol.reconfigure_frame(request_id, settings, at_step, deadline_s))
        return sent

    def reconfigured(self, request_id: int) -> Reconfigured:
        event: Reconfigured = self.wait_for(
            lambda e: isinstance(e, Reconfigured) and e.id == request_id,
            f"reconfigured {request_id}")
        return event

    def step(self, n: int) -> Step:
        event: Step = self.wait_for(lambda e: isinstance(e, Step) and e.step >= n, f"step {n}")
        return event

    def stop(self) -> int:
        self.proc.terminate()
        return self.finish()


class SpareTrainer(Trainer):
    """A trainer started as the supervisor starts a spare one (trainer_runtime/spare.py):
    TensorFlow and the trainer's modules imported, it waits on stdin for the arguments,
    environment and directory of the trainer to become. An `alone` test starts it in its
    set-up and calls go() in its body, which so times the training, not the import."""

    def __init__(self, run_dir: Path, config: Path) -> None:
        self.arrived = []
        self.index, self.dir = 0, run_dir
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.sock, child = socket.socketpair()
        self.argv = ["--run-dir", str(run_dir), "--config", str(config),
                     "--telemetry-fd", str(child.fileno())]
        self.stderr_path = run_dir / "trainer-test.log"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer_runtime.spare", "--run-dir", str(run_dir)],
                stdin=subprocess.PIPE, pass_fds=[child.fileno()], start_new_session=True,
                env=self.env, stdout=subprocess.DEVNULL, stderr=stderr)
        child.close()
        self.events = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + DEADLINE_S
        while READY not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the spare trainer is not ready; log: {self.log()[-2000:]}")
            time.sleep(0.1)

    def go(self) -> None:
        """Become the trainer: from here it builds the model and trains."""
        assert self.proc.stdin is not None
        order = {"argv": self.argv, "env": self.env, "cwd": os.getcwd()}
        self.proc.stdin.write(json.dumps(order).encode() + b"\n")
        self.proc.stdin.close()


def _settings(base: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    merged = json.loads(json.dumps(base))
    for key, value in sections.items():
        merged.setdefault(key, {}).update(value)
    return RunConfig.model_validate(merged).model_dump(mode="json")


def _start(tmp_path: Path, cfg: dict[str, Any], *extra: str, name: str = "run") -> Trainer:
    run_dir = tmp_path / name
    run_dir.mkdir()
    path = run_dir / "cfg.json"
    path.write_text(json.dumps(cfg))
    return Trainer(0, run_dir, path, _free_ports(1), *extra)


def _wait_pct(steps: list[Step]) -> float:
    return 100.0 * sum(s.input_wait_ms for s in steps) / sum(s.step_time_ms for s in steps)


INPUT_BOUND = {
    "model": {"hidden_units": [512, 512]},
    "data": {"examples": 4096, "input_shape": [128], "read_latency_ms": 8,
             "prefetch": False, "parallel_calls": 1},
    "train": {"global_batch_size": 64, "max_steps": 100000},
    "checkpoint": {"every_steps": 100000, "keep": 1},
}


# INPUT_BOUND with a step of known length, whatever the machine: the model sleeps 4 ms a
# replica (tests/data/factories.py), so eight reads of 12 ms at once deliver a batch
# faster than a step takes, and before the switch each step waits out its whole read.
PREFETCH_SWITCH = {
    **INPUT_BOUND,
    "model": {"factory": "tests.data.factories:model_with_compute_ms",
              "kwargs": {"compute_ms": 4.0}},
    "data": {**INPUT_BOUND["data"], "read_latency_ms": 12},
}


@pytest.fixture
def input_bound(tmp_path: Path) -> Iterator[SpareTrainer]:
    """A trainer for PREFETCH_SWITCH, imported and waiting (the import in the test's set-up)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "cfg.json"
    path.write_text(json.dumps(PREFETCH_SWITCH))
    trainer = SpareTrainer(run_dir, path)
    yield trainer
    _kill_all([trainer])


@pytest.mark.alone
def test_prefetch_switch_applies_live_without_a_new_process(input_bound: SpareTrainer) -> None:
    trainer = input_bound
    trainer.go()
    try:
        trainer.step(15)
        sent = trainer.send(1, _settings(PREFETCH_SWITCH,
                                         data={"prefetch": 8, "parallel_calls": 8}))
        event = trainer.reconfigured(1)
        assert event.ok, event.message
        assert event.changed == ["data.parallel_calls", "data.prefetch"]
        # How fast is bench/bench_reconfigure.py's to measure (a timed test flakes on a
        # busy box); here: it took some time, and the trainer said how much.
        assert event.seconds > 0.0
        first_new = trainer.step(event.step + 1)
        arrived = trainer.arrived[trainer.events.index(first_new)]
        assert arrived > sent
        trainer.step(event.step + 55)
    finally:
        assert trainer.stop() == 0
    steps = trainer.of(Step)
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))  # contiguous
    assert len(trainer.of(Hello)) == 1  # the same process throughout
    before = [s for s in steps if 3 <= s.step <= event.step]
    # From once the new pipeline's buffers are full (a few steps) on.
    after = [s for s in steps if event.step + 15 <= s.step <= event.step + 55]
    assert _wait_pct(before) > 30.0, _wait_pct(before)
    # Against the injected latency (12 ms a batch, waited out in full before): the median
    # step now waits under a quarter of it. The share of the step falls by more than
    # two thirds because the step's compute is longer than a batch's read with eight at
    # once by construction (PREFETCH_SWITCH), not by the machine's speed.
    latency_ms = PREFETCH_SWITCH["data"]["read_latency_ms"]
    waits = [s.input_wait_ms for s in after]
    assert median(waits) < latency_ms / 4, waits
    assert median(s.input_wait_ms for s in before) > latency_ms / 2
    assert _wait_pct(after) < _wait_pct(before) / 3
    # The data position carries on: no example skipped or repeated.
    assert all(b.position == a.position + b.examples for a, b in itertools.pairwise(steps))


@dataclass
class Refusals:
    trainer: Trainer
    odd: Reconfigured
    model: Reconfigured
    invalid: Reconfigured
    late: Reconfigured
    late_sent: float  # when the late request was sent, and when its answer came
    late_answered: float


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> Refusals:
    """One trainer, finished, that was asked for changes it must refuse while it trained on:
    three it cannot take (requests 1 to 3) and two frames that are no request; then one
    (request 4) due at a step it does not reach within its 1 s deadline. The two tests
    below read it: one TensorFlow start-up for both."""
    cfg = {**INPUT_BOUND, "data": {**INPUT_BOUND["data"], "read_latency_ms": 0}}
    trainer = _start(tmp_path_factory.mktemp("refusals"), cfg)
    try:
        trainer.step(3)
        # 68 examples do not split over 2 replicas x 4 micro-steps.
        trainer.send(1, _settings(cfg, train={"global_batch_size": 68,
                                              "accumulation_steps": 4}))
        odd = trainer.reconfigured(1)
        trainer.send(2, _settings(cfg, model={"hidden_units": [8]}, data={"prefetch": True}))
        model = trainer.reconfigured(2)
        trainer.send(3, {"train": {"global_batch_size": "lots"}})
        invalid = trainer.reconfigured(3)
        trainer.sock.sendall(b"not json\n{\"v\":1,\"type\":\"reconfigure\",\"id\":true}\n")
        trainer.step(model.step + 10)
        # Due only at a step it will not reach for minutes: refused once 1 s has passed.
        sent = trainer.send(4, _settings(cfg, data={"prefetch": True}), at_step=10**9,
                            deadline_s=1.0)
        late = trainer.reconfigured(4)
        answered = trainer.arrived[trainer.events.index(late)]
        trainer.step(late.step + 20)
    finally:
        assert trainer.stop() == 0
    return Refusals(trainer, odd, model, invalid, late, sent, answered)


def test_refused_change_keeps_training_on_the_old_settings(refusals: Refusals) -> None:
    odd, model, invalid = refusals.odd, refusals.model, refusals.invalid
    for event in (odd, model, invalid):
        assert not event.ok
        assert event.message and "\n" not in event.message
    assert "not divisible" in odd.message
    assert "model.hidden_units" in model.message and "relaunch" in model.message
    assert "global_batch_size" in invalid.message
    steps = refusals.trainer.of(Step)
    assert {s.examples for s in steps} == {64}
    # Contiguous (for the late refusal's test too: the same run).
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))


def _weights(prefix: str) -> dict[str, np.ndarray]:
    """The model's and the optimizer's variables in a checkpoint."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(("model", "optimizer"))}


def test_live_batch_change_matches_a_restore_with_the_new_settings(tmp_path: Path) -> None:
    old = {"model": {"hidden_units": [32]},
           "data": {"examples": 4096, "input_shape": [16]},
           "train": {"global_batch_size": 48, "learning_rate": 0.02, "optimizer": "adam"},
           "checkpoint": {"every_steps": 10, "keep": 3}}
    new = _settings(old, train={"global_batch_size": 96, "accumulation_steps": 3})
    # Live: one process, switched after step 10 (asked before it gets there).
    live = _start(tmp_path, old, "--max-steps", "20", name="live")
    # Reference: train 10 steps on the old settings, then restore with the new.
    first = _start(tmp_path, old, "--max-steps", "10", name="ref")
    try:
        live.wait_for(lambda e: isinstance(e, Hello), "hello")
        live.send(5, new, at_step=10)
        event = live.reconfigured(5)
        assert first.finish() == 0
        assert live.finish() == 0
    finally:
        _kill_all([live, first])
    assert event.ok and event.step == 10, event
    assert event.changed == ["train.accumulation_steps", "train.global_batch_size"]
    new_path = tmp_path / "ref" / "new.json"
    new_path.write_text(json.dumps({**new, "train": {**new["train"], "max_steps": None}}))
    second = Trainer(0, tmp_path / "ref", new_path, _free_ports(1), "--max-steps", "20")
    assert second.finish() == 0
    assert second.of(protocol.Resume)[0].from_step == 10
    steps = live.of(Step)
    assert [s.examples for s in steps] == [48] * 10 + [96] * 10
    assert [s.micro_step for s in steps][9:11] == [10, 13]
    got = _weights(str(tmp_path / "live" / "checkpoints" / "ckpt-20"))
    want = _weights(str(tmp_path / "ref" / "checkpoints" / "ckpt-20"))
    assert got.keys() == want.keys() and got
    for name in got:
        err = np.linalg.norm(got[name] - want[name]) / max(np.linalg.norm(want[name]), 1e-12)
        assert err < 1e-5, (name, err)


def test_many_live_switches_do_not_grow_memory_or_threads(tmp_path: Path) -> None:
    cfg = {**INPUT_BOUND, "data": {**INPUT_BOUND["data"], "read_latency_ms": 1}}
    variants = [
        _settings(cfg, data={"prefetch": "autotune", "parallel_calls": 2}),
        _settings(cfg, train={"global_batch_size": 128, "accumulation_steps": 2}),
        _settings(cfg, data={"prefetch": 2}, train={"global_batch_size": 32}),
        _settings(cfg),
    ]
    trainer = _start(tmp_path, cfg)
    proc = psutil.Process(trainer.proc.pid)
    levels: list[tuple[int, int]] = []
    try:
        trainer.step(3)
        for i in range(20):
            trainer.send(i + 1, variants[i % len(variants)])
            event = trainer.reconfigured(i + 1)
            assert event.ok, event.message
            trainer.step(event.step + 3)
            levels.append((proc.memory_info().rss, proc.num_threads()))
    finally:
        assert trainer.stop() == 0
    # Against the level after the first lap (every variant built once).
    (rss0, threads0), (rss, threads) = levels[len(variants) - 1], levels[-1]
    assert rss <= rss0 * 1.10, [r for r, _ in levels]
    assert threads <= threads0 * 1.10, [t for _, t in levels]


TWO_WORKERS = {"model": {"hidden_units": [32]},
               "data": {"examples": 4096, "input_shape": [16], "read_latency_ms": 2},
               "train": {"global_batch_size": 48, "max_steps": 100000},
               "checkpoint": {"every_steps": 100000, "keep": 1},
               "cluster": {"workers": 2, "collective": "ring", "timeout_s": 10}}


def _two_workers(tmp_path: Path, base: dict[str, Any]) -> list[Trainer]:
    """Two real workers of one cluster on loopback, sharing a run dir."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "cfg.json"
    path.write_text(json.dumps(base))
    ports = _free_ports(2)
    return [Trainer(i, run_dir, path, ports) for i in range(2)]


@dataclass
class TwoAsked:
    workers: list[Trainer]
    codes: list[int]
    refused: Reconfigured  # request 4, sent to worker 0 only
    switched: list[Reconfigured]  # request 9, each worker's answer


@pytest.fixture(scope="module")
def two_asked(tmp_path_factory: pytest.TempPathFactory) -> TwoAsked:
    """Two workers of one cluster, finished, that were asked twice while they trained: a
    change that reached worker 0 only (request 4), then one that reached both at different
    times (request 9). The two tests below read it: two TensorFlow start-ups for both."""
    base = TWO_WORKERS
    workers = _two_workers(tmp_path_factory.mktemp("two-asked"), base)
    new = _settings(base, data={"prefetch": True}, train={"global_batch_size": 96})
    try:
        workers[0].step(5)
        workers[0].send(4, _settings(base, data={"prefetch": True}), deadline_s=1.0)
        refused = workers[0].reconfigured(4)
        for w in workers:
            w.step(refused.step + 10)
        # The requests reach the workers at different times; both switch together.
        workers[0].send(9, new)
        time.sleep(0.3)
        workers[1].send(9, new)
        switched = [w.reconfigured(9) for w in workers]
        for w in workers:
            w.step(switched[0].step + 5)
    finally:
        # SIGTERM to the chief: both stop at one step
        # (tests/integration/trainer/test_multiworker.py).
        # Signalling both at different moments races one's exit against the other's
        # per-update agreement collective ("Socket closed", exit 1), as CI once saw.
        workers[0].proc.terminate()
        codes = [w.finish() for w in workers]
        _kill_all(workers)
    return TwoAsked(workers, codes, refused, switched)


def test_two_workers_switch_after_the_same_update(two_asked: TwoAsked) -> None:
    workers, events = two_asked.workers, two_asked.switched
    # Both exit 0 (after the one-worker refusal too: the same run).
    assert two_asked.codes == [0, 0]
    assert all(e.ok for e in events), events
    assert events[0].step == events[1].step
    for w in workers:
        steps = w.of(Step)
        # Contiguous (for the one-worker refusal's test too: the same run).
        assert [s.step for s in steps] == list(range(1, len(steps) + 1))
        assert {s.examples for s in steps if s.step <= events[0].step} == {48}
        assert {s.examples for s in steps if s.step > events[0].step} == {96}


def test_a_change_not_reached_within_its_deadline_is_refused_and_never_applied_later(
    refusals: Refusals,
) -> None:
    late, trainer = refusals.late, refusals.trainer
    assert not late.ok and late.changed == []
    assert "not ready for it within its 1 s" in late.message
    assert refusals.late_answered - refusals.late_sent >= 1.0
    # One answer to each request, the late one's last: nothing applied after the refusal
    # (its 20 steps after it are contiguous: the test above checks every step).
    assert [e.id for e in trainer.of(Reconfigured)] == [1, 2, 3, 4]
    assert len(trainer.of(Hello)) == 1


def test_a_change_that_fails_while_applying_goes_back_to_the_old_settings(
    strategy: Any, devices: Any
) -> None:
    from tests.integration.trainer.conftest import make_config
    from trainer_runtime.loop import Trainer as LoopTrainer
    from trainer_runtime.loop import reconfigure
    from trainer_runtime.telemetry import NullEmitter, ReconfigureRequest

    class Kept(NullEmitter):
        def __init__(self) -> None:
            self.events: list[Any] = []

        def emit(self, event: Any, t: float | None = None) -> None:
            self.events.append(event)

    cfg = make_config(data={"examples": 512, "input_shape": [8], "prefetch": False},
                      train={"global_batch_size": 32})
    emitter = Kept()
    trainer = LoopTrainer(cfg, strategy, devices, emitter=emitter)
    trainer.run_updates(3)
    make_data = trainer._make_data
    calls: list[int] = []

    def fails_once(position: int) -> None:
        calls.append(position)
        if len(calls) == 1:
            raise MemoryError("no room for the new pipeline's buffers")
        make_data(position)

    trainer._make_data = fails_once  # type: ignore[method-assign]
    wanted = _settings(cfg.model_dump(mode="json"), data={"prefetch": True},
                       train={"global_batch_size": 64, "accumulation_steps": 2})
    event = reconfigure(trainer, ReconfigureRequest(1, wanted, 0))
    assert not event.ok
    assert "could not apply them: no room for the new pipeline's buffers" in event.message
    assert event.message.endswith("back on the old settings")
    assert trainer.cfg == cfg and trainer.global_batch == 32 and trainer.k == 1
    assert calls == [3 * 32, 3 * 32]  # the failed build, then the old one at the same place
    steps = trainer.run_updates(2)
    assert [s.step for s in steps] == [4, 5] and {s.examples for s in steps} == {32}
    assert trainer.position == 5 * 32
    assert [e for e in emitter.events if isinstance(e, Reconfigured)] == [event]


def test_a_change_that_reaches_one_worker_only_is_refused_there_after_its_deadline(
    two_asked: TwoAsked,
) -> None:
    refused, workers = two_asked.refused, two_asked.workers
    assert not refused.ok and "not ready for it within its 1 s" in refused.message
    # Worker 1 never had request 4: its one answer is to request 9, which both had.
    assert [e.id for e in workers[1].of(Reconfigured)] == [9]
    assert [e.id for e in workers[0].of(Reconfigured)] == [4, 9]


def test_reconfigure_frames_round_trip_and_refuse_bad_fields() -> None:
    frame = protocol.decode(protocol.reconfigure_frame(3, {"a": 1}, 7, 2.5))
    assert protocol.parse_reconfigure(frame) == (3, {"a": 1}, 7, 2.5)
    no_deadline = {k: v for k, v in frame.items() if k != "deadline_s"}
    assert protocol.parse_reconfigure(no_deadline)[3] == protocol.LIVE_DEADLINE_S
    for bad in ({**frame, "id": True}, {**frame, "at_step": -1}, {**frame, "extra": 1},
                {k: v for k, v in frame.items() if k != "settings"}, {**frame, "settings": []},
                {**frame, "type": "relaunch"}, {**frame, "deadline_s": 0},
                {**frame, "deadline_s": -1.0}, {**frame, "deadline_s": float("nan")},
                {**frame, "deadline_s": True}, {**frame, "deadline_s": "10"},
                {**frame, "deadline_s": 1e9}):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_reconfigure(bad)


def test_live_changes_splits_live_and_relaunch_keys() -> None:
    from trainer_runtime.changes import live_changes

    old = RunConfig()
    new = RunConfig.model_validate({"data": {"prefetch": True}, "model": {"hidden_units": [4]},
                                    "train": {"global_batch_size": 128}})
    assert live_changes(old, new) == (["data.prefetch", "train.global_batch_size"],
                                      ["model.hidden_units"])
    assert live_changes(old, RunConfig()) == ([], [])

