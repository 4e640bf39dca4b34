"""The spare trainer: a process with TensorFlow imported, waiting to become the next attempt.

While a spare is wanted (a person's dashboard is attached to the live run: the
supervisor says so, tests/integration/test_run_lifecycle.py checks that side) the agent starts one
once its trainer has run a step; a relaunch claims it (the new
attempt's trainer is that very process: same pid, the attempt's argv, environment and
directory), and a new spare follows. A spare that died is never claimed; the run's end
ends it; a spare whose supervisor vanished (end of its stdin) exits by itself.

The suite runs with GPUWATCH_SPARE_TRAINER=0 (tests/conftest.py: one more TensorFlow
import per real run would double the suite's CPU on a 2-core box); these tests turn it on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatch.follow.client import RunClient
from gpuwatch.runs import folders
from gpuwatch.supervisor.spare import SpareTrainer
from tests.conftest import ROOT, run_async, wait_for
from tests.integration.test_supervisor import collect, read_events, start_run
from tests.supervisor.test_supervisor_parts import AgentHarness, until
from tests.support.attached import Attached
from trainer_runtime.spare import READY


@pytest.fixture
def spare_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWATCH_SPARE_TRAINER", "1")


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spare_on: None) -> AgentHarness:
    monkeypatch.setenv("GPUWATCH_USER_CWD", str(ROOT))
    harness = AgentHarness(tmp_path, monkeypatch)
    harness.agent.want_spare(True)  # as while a dashboard is attached
    return harness


def alive(pid: int) -> bool:
    return folders.pid_alive(pid)


def launch_record(run_dir: Path, attempt: int) -> dict[str, Any]:
    """What the stand-in trainer wrote about itself: its argv, TF_CONFIG and pid."""
    return json.loads((run_dir / f"launch-{attempt}.json").read_text())


async def waiting_spare(harness: AgentHarness) -> int:
    await until(lambda: harness.agent.spare_pid, "a spare trainer")
    pid = harness.agent.spare_pid
    assert pid is not None
    return pid


async def test_a_relaunch_becomes_the_spare_with_the_attempts_argv_env_and_directory(
    harness: AgentHarness,
) -> None:
    await harness.start(1, "hang")
    spare_pid = await waiting_spare(harness)
    assert spare_pid != harness.agent.pid
    await asyncio.wait_for(harness.agent.stop(grace_s=30), 20)
    harness.frames.clear()
    await harness.start(2, "hang", fresh=True)  # the env says "hang" again: read at claim
    assert harness.agent.pid == spare_pid
    await until(lambda: len(harness.frames) >= 2, "attempt 2's hello and step")
    hello = harness.frames[0][1]
    assert (hello.TYPE, hello.attempt, hello.pid) == ("hello", 2, spare_pid)
    record = launch_record(harness.run_dir, 2)
    assert record["pid"] == spare_pid
    argv = record["argv"]
    assert argv[argv.index("--attempt") + 1] == "2"
    assert argv[argv.index("--run-dir") + 1] == str(harness.run_dir)
    assert "--fresh" in argv and "--telemetry-fd" in argv
    cold = launch_record(harness.run_dir, 1)["argv"]  # attempt 1 started cold
    assert argv[argv.index("--config") + 1] == cold[cold.index("--config") + 1]
    log = harness.log_text()
    assert log.index("=== gpuwatch: attempt 2 starting") < log.index(
        "fake trainer: attempt 2, hang, fresh=True"
    )
    # Attempt 2 ran a step: a new spare waits for attempt 3.
    next_spare = await waiting_spare(harness)
    assert next_spare not in (spare_pid, None)
    await asyncio.wait_for(harness.agent.stop(grace_s=30), 20)
    harness.agent.release_spare()


async def test_a_dead_spare_is_never_claimed_and_the_relaunch_starts_cold(
    harness: AgentHarness,
) -> None:
    await harness.start(1, "hang")
    spare_pid = await waiting_spare(harness)
    os.kill(spare_pid, signal.SIGKILL)
    await until(lambda: not alive(spare_pid), "the spare to die")
    await asyncio.wait_for(harness.agent.stop(grace_s=30), 20)
    harness.agent.release_spare()  # no new spare either: this attempt must start cold
    harness.frames.clear()
    await harness.start(2, "hang")
    assert harness.agent.pid not in (None, spare_pid)
    await until(lambda: harness.frames, "attempt 2's hello")
    assert harness.frames[0][1].pid == harness.agent.pid
    await asyncio.wait_for(harness.agent.stop(grace_s=30), 20)


async def test_the_runs_end_ends_the_spare_and_starts_no_other(harness: AgentHarness) -> None:
    await harness.start(1, "hang")
    spare_pid = await waiting_spare(harness)
    harness.agent.release_spare()
    await until(lambda: not alive(spare_pid), "the spare to end")
    assert harness.agent.spare_pid is None
    await asyncio.wait_for(harness.agent.stop(grace_s=30), 20)
    await asyncio.sleep(0.5)
    assert harness.agent.spare_pid is None


def _spare_process(*extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.spare", "--module", "tests.data.fake_trainer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def test_a_spare_whose_supervisor_is_gone_exits_quietly() -> None:
    proc = _spare_process()
    _out, err = proc.communicate("", timeout=60)  # end of input: no order will come
    assert proc.returncode == 0
    assert READY in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("order", "problem"),
    [
        ("not json\n", "Expecting value"),
        ("[1, 2]\n", "the order must be a JSON object"),
        ('{"argv": "x", "env": {}, "cwd": "/"}\n', "argv must be a list of strings"),
        ('{"argv": [], "env": {"A": 1}, "cwd": "/"}\n', "env must map names to strings"),
        ('{"argv": [], "env": {}, "cwd": 5}\n', "cwd must be a string"),
    ],
)
def test_a_spare_refuses_a_bad_order_in_one_line(order: str, problem: str) -> None:
    proc = _spare_process()
    _out, err = proc.communicate(order, timeout=60)
    assert proc.returncode == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and problem in lines[0]
    assert "Traceback" not in err


async def test_spare_spawn_reports_an_unwritable_log_and_starts_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "dir" / "trainer.log"
    assert await SpareTrainer.spawn("tests.data.fake_trainer", missing, tmp_path, {}) is None


@pytest.mark.slow
def test_a_full_relaunch_of_a_real_trainer_takes_the_spare_and_resumes(
    home: Path, spare_on: None
) -> None:
    info = start_run()
    assert info.socket_path is not None
    dashboard = Attached(info.socket_path)  # a spare waits only while a dashboard is attached
    log = info.run_dir / "trainer.log"
    wait_for(lambda: READY in log.read_text(errors="replace"), 120, "the spare to be ready")
    spare_line = next(line for line in log.read_text().splitlines() if READY in line)
    spare_pid = int(spare_line.split("pid ")[1].split(":")[0])

    async def relaunch() -> dict[str, Any]:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            return await client.command(
                "relaunch", overrides={"data.read_latency_ms": 5}, live=False
            )

    reply = run_async(relaunch())
    assert reply["attempt"] == 2 and reply["live"] is False
    run_async(
        collect(
            info.socket_path,
            lambda ev: sum(e["type"] == "step" and e.get("attempt") == 2 for e in ev) >= 5,
        )
    )
    events = read_events(info.run_dir)
    hellos = {e["attempt"]: e for e in events if e["type"] == "hello"}
    assert hellos[2]["pid"] == spare_pid != hellos[1]["pid"]
    resume = next(e for e in events if e["type"] == "resume" and e["attempt"] == 2)
    steps_2 = [e["step"] for e in events if e["type"] == "step" and e["attempt"] == 2]
    assert steps_2[0] == resume["from_step"] + 1
    settings = yaml.safe_load((info.run_dir / "attempt-2.yaml").read_text())
    assert settings["data"]["read_latency_ms"] == 5
    dashboard.close()


# -- a waiting spare takes no accelerator ---------------------------------------------

ENV_PROBE = "tests.data.env_probe"


def initial_environment(pid: int) -> list[bytes]:
    """The environment a process was started with (/proc/PID/environ). Read as soon as
    the process is spawned it can still be empty: the kernel closes the spawner's
    close-on-exec pipe (Popen returns) before it has laid out the new program's
    environment (seen once on a loaded box), so an empty one is read again."""
    environ = Path(f"/proc/{pid}/environ")
    content = wait_for(environ.read_bytes, 10, f"pid {pid}'s environment")
    return content.split(b"\0")


async def test_a_waiting_spare_sees_no_accelerator_and_its_claim_restores_the_persons(
    tmp_path: Path,
) -> None:
    """Hidden while it waits (CUDA reads CUDA_VISIBLE_DEVICES at its first device call);
    the claim's environment, the trainer's, is what the C library's getenv sees after."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    spare = await SpareTrainer.spawn(ENV_PROBE, tmp_path / "trainer.log", tmp_path, env)
    assert spare is not None
    try:
        waiting = initial_environment(spare.proc.pid)
        assert b"CUDA_VISIBLE_DEVICES=-1" in waiting and b"HIP_VISIBLE_DEVICES=-1" in waiting
        out = tmp_path / "probe.json"
        out_text = out.read_text
        person = {**env, "CUDA_VISIBLE_DEVICES": "0,1"}
        person.pop("HIP_VISIBLE_DEVICES", None)
        claimed = await spare.claim(["--out", str(out)], person, tmp_path)
        assert claimed is not None
        proc, _sock = claimed
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        seen = json.loads(out_text())
        assert seen["pid"] == spare.proc.pid  # the spare itself became it
        assert seen["CUDA_VISIBLE_DEVICES"] == {"python": "0,1", "libc": "0,1"}
        assert seen["HIP_VISIBLE_DEVICES"] == {"python": None, "libc": None}
    finally:
        spare.discard()


def test_a_spare_with_tensorflow_imported_has_made_no_device_context(tmp_path: Path) -> None:
    """The real preload (TensorFlow, Keras, the trainer's modules): TensorFlow's runtime
    context, where devices are made and GPU memory taken, does not exist yet."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.spare", "--module", "trainer_runtime",
         "--run-dir", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT,
    )
    _out, err = proc.communicate("", timeout=120)
    ready = next(line for line in err.splitlines() if READY in line)
    assert "no device context" in ready, ready
    assert proc.returncode == 0
