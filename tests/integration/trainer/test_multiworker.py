"""Trainer processes as a MultiWorkerMirroredStrategy cluster on loopback (real TensorFlow)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import mean, median
from typing import Any

import pytest

from gpuwatch.supervisor.ports import reserve_ports
from tests.integration.trainer.conftest import assert_breakdown_sums
from tests.support.alone import RunAlone
from trainer_runtime import protocol

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 120.0
TIMEOUT_S = 5  # cluster.timeout_s: how long a collective waits for a lost worker


def _free_ports(n: int) -> list[int]:
    """n different ports, as the supervisor picks them (outside the ephemeral range, where
    another test's connection cannot take one while the trainers import TensorFlow)."""
    held = reserve_ports(n)
    for reservation in held:
        reservation.release()
    return [reservation.port for reservation in held]


def _config(run_dir: Path, workers: list[dict[str, Any]], name: str = "cfg.json",
            **data: Any) -> Path:
    cfg = {
        "model": {"hidden_units": [32]},
        "data": {"examples": 4096, "input_shape": [16], **data},
        "train": {"global_batch_size": 48, "learning_rate": 0.02},
        "checkpoint": {"every_steps": 10, "keep": 2},
        "cluster": {"workers": workers, "collective": "ring", "timeout_s": TIMEOUT_S},
    }
    path = run_dir / name
    path.write_text(json.dumps(cfg))
    return path


class Worker:
    """One worker's trainer process on a socketpair; typed events collected by a thread."""

    def __init__(self, index: int, run_dir: Path, config: Path, ports: list[int],
                 *extra: str, chief_dir: Path | None = None) -> None:
        self.index = index
        self.dir = run_dir if index == 0 else run_dir / "workers" / str(index)
        self.dir.mkdir(parents=True, exist_ok=True)
        tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                     "task": {"type": "worker", "index": index}}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CONFIG": json.dumps(tf_config)}
        self.sock, child = socket.socketpair()
        self.stderr_path = self.dir / "trainer-test.log"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainer_runtime", "--run-dir", str(self.dir),
                 "--config", str(config), "--worker", str(index),
                 "--chief-dir", str(chief_dir or run_dir),
                 "--telemetry-fd", str(child.fileno()), *extra],
                pass_fds=[child.fileno()], start_new_session=True, env=env,
                stdout=subprocess.DEVNULL, stderr=stderr)
        child.close()
        self.events: list[protocol.Event] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

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
            with self.changed:
                self.events.extend(events)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pred: Any, what: str) -> Any:
        deadline = time.monotonic() + DEADLINE_S
        with self.changed:
            while True:
                for event in self.events:
                    if pred(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or not self.reader.is_alive():
                    pytest.fail(f"worker {self.index}: no {what}; log: {self.log()[-2000:]}")
                self.changed.wait(min(left, 1.0))

    def log(self) -> str:
        return self.stderr_path.read_text()

    def finish(self, timeout_s: float = DEADLINE_S) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"worker {self.index} did not exit; log: {self.log()[-2000:]}")
        self.reader.join(10)
        self.sock.close()
        return code

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


def _launch(run_dir: Path, config: Path, n: int, *extra: str,
            chief_dir: Path | None = None) -> list[Worker]:
    ports = _free_ports(n)
    return [Worker(i, run_dir, config, ports, *extra, chief_dir=chief_dir) for i in range(n)]


def _kill_all(workers: list[Worker]) -> None:
    for w in workers:
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()


@pytest.mark.alone
def test_three_workers_train_in_lockstep_with_global_examples(tmp_path: Path) -> None:
    # Worker 1 reads from slow storage (serial reads): it waits on input, the others
    # wait for it in the all-reduce.
    slow = {"data": {"read_latency_ms": 40, "parallel_calls": 1}}
    config = _config(tmp_path, [{}, slow, {}])
    workers = _launch(tmp_path, config, 3, "--max-steps", "40")
    try:
        codes = [w.finish() for w in workers]
    finally:
        _kill_all(workers)
    assert codes == [0, 0, 0], [w.log()[-1500:] for w in workers]
    for w in workers:
        (hello,) = w.of(protocol.Hello)
        assert (hello.replicas, hello.workers, hello.worker) == (3, 3, w.index)
        assert hello.device_kind == "cpu" and hello.host == socket.gethostname()
        assert hello.per_replica_batch * hello.replicas * hello.accumulation_steps == 48
        steps = w.of(protocol.Step)
        assert [s.step for s in steps] == list(range(1, 41))
        assert all(s.examples == 48 and s.worker == w.index for s in steps)
        assert [s.position for s in steps] == [48 * s.step for s in steps]
        assert all(s.compute_ms is not None and s.compute_ms > 0 for s in steps)
        # Each update's parts, measured in the graph, fit in its step time.
        assert_breakdown_sums(steps)
        losses = [s.loss for s in steps]
        assert mean(losses[-5:]) < 0.8 * mean(losses[:5]), losses
        (done,) = w.of(protocol.Done)
        assert (done.reason, done.step, done.worker) == ("max_steps", 40, w.index)
        assert w.of(protocol.Checkpoint)[-1].step == 40
    waits = [median(s.input_wait_ms for s in w.of(protocol.Step)[5:]) for w in workers]
    # Worker 1's 40 ms reads show as its own input wait, several times the others' (how
    # much of the 40 ms a step's compute hides depends on how busy the box is).
    assert waits[1] > max(5.0, 5 * max(waits[0], waits[2])), waits


def _finished(workers: list[Worker]) -> list[Worker]:
    """The workers once each has exited 0 (any left is killed)."""
    try:
        codes = [w.finish() for w in workers]
    finally:
        _kill_all(workers)
    assert codes == [0] * len(workers), [w.log()[-1500:] for w in workers]
    return workers


def test_accumulating_workers_stop_at_one_step_on_sigterm_and_resume_from_chief_or_one_before(
        tmp_path: Path) -> None:
    """One run of three attempts, two workers accumulating 2 micro-steps per update and
    running 3 updates per call: in step; SIGTERM stops both at one step; both resume from
    the chief's checkpoint of it; then, worker 1 lacking the newest, from the one before."""
    config = _config(tmp_path, [{}, {}])
    data = json.loads(config.read_text())
    data["train"].update({"accumulation_steps": 2, "steps_per_execution": 3})
    config.write_text(json.dumps(data))
    scratch = tmp_path / "workers" / "1" / "checkpoints"  # worker 1's own copies

    # Attempt 1: two workers trained past step 24, then SIGTERM to worker 1: both stop
    # after the same step, both exit 0, and that step is checkpointed on both.
    first = _launch(tmp_path, config, 2)
    try:
        first[1].wait_for(lambda e: isinstance(e, protocol.Step) and e.step >= 24, "step 24")
        os.kill(first[1].proc.pid, signal.SIGTERM)
        codes = [w.finish() for w in first]
    finally:
        _kill_all(first)
    assert codes == [0, 0], [w.log()[-1500:] for w in first]
    for w in first:
        (hello,) = w.of(protocol.Hello)
        assert (hello.replicas, hello.workers) == (2, 2)
        # 48 examples per update = 2 replicas (one per worker) x 2 micro-steps x 12.
        assert (hello.accumulation_steps, hello.per_replica_batch) == (2, 12)
    stopped = {w.of(protocol.Done)[-1].step for w in first}
    assert len(stopped) == 1, stopped
    (step,) = stopped
    assert step >= 24
    for w in first:
        assert w.of(protocol.Done)[-1].reason == "sigterm"
        steps = w.of(protocol.Step)
        assert [s.step for s in steps] == list(range(1, step + 1))
        assert [s.micro_step for s in steps] == [2 * s.step for s in steps]
        assert all(s.examples == 48 for s in steps)
        assert_breakdown_sums(steps)  # 3 updates per call, 2 micro-steps each
        losses = [s.loss for s in steps]
        assert mean(losses[-4:]) < mean(losses[:4]), losses
        assert w.of(protocol.Checkpoint)[-1].step == step
    assert (tmp_path / "checkpoints" / f"ckpt-{step}.index").exists()
    assert (scratch / f"ckpt-{step}.index").exists()

    # Attempt 2: every worker resumes from the chief's checkpoint of that step.
    second = _finished(_launch(tmp_path, config, 2, "--max-steps", str(step + 3),
                               "--attempt", "2"))
    for w in second:
        (resume,) = w.of(protocol.Resume)
        assert (resume.from_step, resume.position, resume.worker) == (step, step * 48, w.index)
        assert resume.checkpoint == str(tmp_path / "checkpoints" / f"ckpt-{step}")
        assert [s.step for s in w.of(protocol.Step)] == [step + 1, step + 2, step + 3]
        (done,) = w.of(protocol.Done)
        assert (done.reason, done.step) == ("max_steps", step + 3)

    # Attempt 3: a worker on another host reads only its own scratch copies; killed while
    # the chief saved, it may lack the newest. Every worker then resumes from the chief's
    # newest step that all of them have (the chief keeps checkpoint.keep = 2), not from
    # nothing.
    saved = [c.step for w in (first[1], second[1]) for c in w.of(protocol.Checkpoint)]
    latest, before = saved[-1], saved[-2]
    for part in scratch.glob(f"ckpt-{latest}.*"):
        part.unlink()
    elsewhere = tmp_path / "not-shared"  # the chief's directory is not on worker 1's host
    third = _finished(_launch(tmp_path, config, 2, "--max-steps", str(before + 3),
                              "--attempt", "3", chief_dir=elsewhere))
    for w in third:
        (resume,) = w.of(protocol.Resume)
        assert (resume.from_step, resume.position) == (before, before * 48)
        assert [s.step for s in w.of(protocol.Step)] == [before + 1, before + 2, before + 3]
    assert third[1].of(protocol.Resume)[0].checkpoint == str(scratch / f"ckpt-{before}")


def test_sigkilled_worker_fails_the_others_within_the_collective_timeout(
        tmp_path: Path, run_first: RunAlone) -> None:
    # Slow reads (mostly asleep): the workers leave the CPU to the other tests.
    config = _config(tmp_path, [{}, {}], read_latency_ms=100)
    workers = _launch(tmp_path, config, 2, "--max-steps", "100000")
    try:
        workers[0].wait_for(lambda e: isinstance(e, protocol.Step) and e.step >= 5, "step 5")
        with run_first():  # from the kill to the survivor's exit: a measured time
            os.killpg(workers[1].proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            code = workers[0].finish(TIMEOUT_S + 10)
            took = time.monotonic() - killed
    finally:
        _kill_all(workers)
    assert code == 1
    (error,) = workers[0].of(protocol.Error)
    assert (error.kind, error.worker) == ("runtime", 0)
    assert took < TIMEOUT_S + 10
    assert not workers[0].of(protocol.Done)


def test_a_worker_whose_port_another_program_holds_names_the_port_in_one_line(
        tmp_path: Path) -> None:
    """cluster.ports pinned to a port in use, or a port taken between the pick and the
    bind: the worker exits 1 with an error naming the port and what to do, not only
    TensorFlow's "Could not start gRPC server"."""
    config = _config(tmp_path, [{}, {}])
    ports = _free_ports(2)
    with socket.socket() as other:  # another program serving on worker 0's port
        other.bind(("", ports[0]))
        other.listen()
        worker = Worker(0, tmp_path, config, ports)
        code = worker.finish()
    assert code == 1
    (error,) = worker.of(protocol.Error)
    assert (error.kind, error.worker) == ("runtime", 0)
    assert error.message == (
        f"UnknownError: Could not start gRPC server: port {ports[0]} (localhost:{ports[0]}, "
        f"this worker's in TF_CONFIG) is probably in use by another program: free it, or "
        f"relaunch (each attempt takes a new port unless cluster.ports or Slurm's port base "
        f"fixes it)"), error.message
    assert not worker.of(protocol.Hello)
