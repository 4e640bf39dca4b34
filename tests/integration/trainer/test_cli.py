"""The trainer process as the supervisor runs it: frames, SIGTERM, lost socket, --fresh,
bad config and factory. Its resumes (after a SIGKILL, under a new batch and accumulation)
are tests/integration/trainer/test_resume_data.py's, which also checks the examples each one
reads."""

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
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 90.0


def _config(tmp_path: Path, name: str = "cfg.json", **train: Any) -> Path:
    cfg = {
        "model": {"hidden_units": [64]},
        "data": {"examples": 4096, "input_shape": [32]},
        "train": {"global_batch_size": 64, "learning_rate": 0.01, **train},
        "checkpoint": {"every_steps": 20, "keep": 2},
    }
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


class Trainer:
    """A trainer subprocess on one end of a socketpair; frames collected by a thread."""

    def __init__(self, run_dir: Path, config: Path, attempt: int, *extra: str) -> None:
        self.sock, child = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer_runtime", "--run-dir", str(run_dir), "--config",
             str(config), "--attempt", str(attempt), "--telemetry-fd", str(child.fileno()),
             *extra],
            pass_fds=[child.fileno()], start_new_session=True, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        child.close()
        self.frames: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            with self.changed:
                self.frames.extend(json.loads(line) for line in lines if line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_frame(self, pred: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE_S
        with self.changed:
            while True:
                for frame in self.frames:
                    if pred(frame):
                        return frame
                left = deadline - time.monotonic()
                if left <= 0 or (not self.reader.is_alive() and self.proc.poll() is not None):
                    pytest.fail(f"no {what} frame; stderr: {self._stderr()[-2000:]}")
                self.changed.wait(min(left, 1.0))

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read() if self.proc.stderr else ""

    def finish(self) -> int:
        try:
            code = self.proc.wait(DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail("trainer did not exit")
        self.reader.join(DEADLINE_S)
        self.sock.close()
        return code

    def of(self, frame_type: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == frame_type]


def test_sigterm_finishes_step_checkpoints_and_says_done_and_fresh_ignores_that_checkpoint(
    tmp_path: Path,
) -> None:
    run = Trainer(tmp_path, _config(tmp_path), 1)
    hello = run.wait_frame(lambda f: f["type"] == "hello", "hello")
    assert hello["replicas"] == 2 and hello["device_kind"] == "cpu"
    run.wait_frame(lambda f: f["type"] == "step" and f["step"] >= 5, "step 5")
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 0
    done = run.of("done")[-1]
    assert done["reason"] == "sigterm"
    assert run.of("checkpoint")[-1]["step"] == done["step"] == run.of("step")[-1]["step"]
    steps = [f["step"] for f in run.of("step")]
    assert steps == list(range(1, len(steps) + 1))

    # --fresh starts at step 1 beside the checkpoint the SIGTERM left.
    second = Trainer(tmp_path, _config(tmp_path), 2, "--max-steps", "3", "--fresh")
    assert second.finish() == 0
    assert not second.of("resume")
    assert [f["step"] for f in second.of("step")] == [1, 2, 3]


def test_lost_socket_checkpoints_and_exits(tmp_path: Path) -> None:
    run = Trainer(tmp_path, _config(tmp_path), 1)
    run.wait_frame(lambda f: f["type"] == "step" and f["step"] >= 3, "step 3")
    run.sock.shutdown(socket.SHUT_RDWR)  # the supervisor died
    assert run.finish() == 0
    assert run.proc.stderr is not None
    assert "done: socket_lost" in run.proc.stderr.read()
    assert list((tmp_path / "checkpoints").glob("ckpt-*.index"))


def test_bad_factory_exits_2_with_one_error_line_and_frame(tmp_path: Path) -> None:
    cfg = json.loads(_config(tmp_path).read_text())
    cfg["model"]["factory"] = "no_such_pkg.models:build"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    run = Trainer(tmp_path, path, 1)
    assert run.finish() == 2
    stderr = run.proc.stderr.read() if run.proc.stderr else ""
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: model.factory 'no_such_pkg.models:build': cannot import module "
        "'no_such_pkg.models' (No module named 'no_such_pkg')"]
    assert run.of("error") and run.of("error")[0]["kind"] == "factory"
    assert not run.of("step")


def test_bad_config_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"train": {"global_batch_size": 63}}))  # 63 % 2 replicas
    run = Trainer(tmp_path, path, 1)
    assert run.finish() == 2
    assert run.of("error")[0]["kind"] == "config"
