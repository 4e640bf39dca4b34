"""The real dashboard, in tmux at 80x24, keeps a spare trainer only while it is attached,
and an ended run's processes go once it quits."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.runs import folders
from tests.conftest import TINY, gpuwatch, wait_for
from tests.integration.test_run_lifecycle import (
    END_TO_GONE_S,
    assert_gone_by,
    run_groups,
    run_processes,
)
from tests.integration.test_tmux import Tmux, gpuwatch_command, the_run
from tests.support.alone import RunAlone

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)"
    ),
]


@pytest.fixture
def tmux_env(home: Path) -> Iterator[dict[str, str]]:
    env = {"GPUWATCH_HOME": str(home), "GPUWATCH_DETACH": "setsid", "TERM": "xterm-256color",
           "PATH": os.environ["PATH"]}
    yield env
    subprocess.run(["tmux", "-L", f"gpuwatch-test-{os.getpid()}", "kill-server"],
                   capture_output=True, check=False)


def spares(run_dir: Path) -> list[str]:
    return [line for line in run_processes(run_dir, set()) if "trainer_runtime.spare" in line]


def test_the_dashboard_keeps_a_spare_while_attached_and_nothing_once_it_quits_an_ended_run(
    home: Path, tmux_env: dict[str, str], run_first: RunAlone
) -> None:
    env = {**tmux_env, "GPUWATCH_SPARE_TRAINER": "1"}
    # Reading 100 ms a batch (tiny's is 10): what is checked is the spare's life, and the
    # trainer, mostly asleep, leaves the CPU to other tests while this one waits its turns
    # to run alone.
    term = Tmux("life", gpuwatch_command("train", str(TINY), "--set", "data.read_latency_ms=100"),
                env)
    term.wait_screen(r"step\s+(?:[2-9]\d|\d{3,})\b", timeout_s=120)
    run_dir = the_run(home).run_dir
    wait_for(lambda: spares(run_dir), 60, "a spare while the dashboard is attached")
    # The 5 s bounds are measured first in line for the CPU, every other test's processes
    # at idle priority (the spare runs at idle priority itself: a busy box would starve
    # its exit); starting and attaching run beside other tests.
    with run_first():
        # q, then d: detach. The run goes on; its spare goes within 5 s.
        term.press("q")
        term.wait_screen(r"Detach", timeout_s=10)
        term.press("d")
        wait_for(lambda: not term.alive(), 30, "the dashboard to exit")
        detached_at = time.time()
        wait_for(lambda: not spares(run_dir), END_TO_GONE_S, "the spare to go after the detach")
        assert time.time() - detached_at <= END_TO_GONE_S
    assert folders.read_run_info(run_dir).live, "detaching stops nothing"

    # Attach again, stop the run from the dashboard (s, then confirm), and read the end.
    term = Tmux("again", gpuwatch_command("attach", run_dir.name), env)
    term.wait_screen(r"running", timeout_s=60)
    wait_for(lambda: spares(run_dir), 60, "a spare once a dashboard is attached again")
    with run_first():
        assert gpuwatch("stop", run_dir.name).returncode == 0
        term.wait_screen(r"stopped", timeout_s=60)
        wait_for(lambda: not spares(run_dir), END_TO_GONE_S, "the spare to go at the run's end")
        time.sleep(1.5)  # past the supervisor's linger: the attached dashboard keeps it
        pid = folders.read_supervisor_info(run_dir)["pid"]
        assert folders.supervisor_alive(pid, run_dir)
        groups = run_groups(run_dir)
        term.press("q")  # an ended run quits at once
        wait_for(lambda: not term.alive(), 30, "the dashboard to exit")
        assert_gone_by(run_dir, groups, time.time() + END_TO_GONE_S, "after the dashboard quit")
