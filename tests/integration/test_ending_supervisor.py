"""Any command that meets a supervisor on its way out waits for it or hands over: never a
refusal for a dashboard that does not exist.

A headless run's follower returns at the run's end, while its supervisor is still shutting
down (the hub's flush, the samplers' join): a script that chains commands meets it there.
Hypothesis draws the commands and the pauses between them; each example starts a real run
through the CLI (a detached supervisor, real sockets) with the stand-in trainer, so an
example takes about a second rather than a TensorFlow start-up.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.runs import folders
from tests.conftest import TINY, gpuwatch
from tests.integration.test_run_lifecycle import recorded

pytestmark = pytest.mark.slow  # real supervisors: after the quick tests

COMMANDS = ("resume", "stop", "logs", "export", "ls")


@pytest.fixture
def finishing(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in trainer: hello, a step, done (max_steps), exit 0."""
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "finish")
    return home


def the_new_run(home: Path, before: set[str]) -> str:
    (run_id,) = {p.name for p in folders.runs_root(home).iterdir()} - before
    return run_id


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commands=st.lists(st.sampled_from(COMMANDS), min_size=1, max_size=3),
       pause_s=st.sampled_from([0.0, 0.2, 0.5]))
def test_a_command_meeting_an_ending_supervisor_waits_or_hands_over(
    finishing: Path, commands: list[str], pause_s: float
) -> None:
    root = folders.runs_root(finishing)
    before = {p.name for p in root.iterdir()} if root.exists() else set()
    started = gpuwatch("train", str(TINY), "--headless")
    assert started.returncode == 0, started.stderr
    run_id = the_new_run(finishing, before)
    run_dir = root / run_id
    attempts = 1
    # At once: the follower returned at the end, the supervisor is on its way out.
    for command in commands:
        time.sleep(pause_s)
        args = {"resume": ("resume", run_id, "--headless"), "ls": ("ls",)}.get(
            command, (command, run_id))
        done = gpuwatch(*args)
        said = done.stdout + done.stderr
        assert "Traceback" not in said, said
        assert "dashboard" not in said, (command, said)
        assert done.returncode == 0, (command, said)
        if command == "resume":
            attempts += 1
            assert "summary:" in done.stdout, said
        elif command == "stop":
            # Its supervisor already gone ("is"), or waited for until it went ("was").
            assert re.search(rf"run {run_id} (is|was) already finished", said), said
        elif command == "ls":
            assert run_id in done.stdout
    # Every resume was an attempt of its own, each one finished.
    numbers = [e["attempt"] for e in recorded(run_dir) if e["type"] == "attempt"]
    assert numbers == list(range(1, attempts + 1))
    assert folders.read_run_info(run_dir).status == "finished"
