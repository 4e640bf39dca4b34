"""`gpuwatch run -- COMMAND` in a real terminal: tmux at 80x24, keys sent, the screen read back.

A command that is not a TensorFlow program (a shell that sleeps): the dashboard says what
runs and that no step metrics can come, the keys a command does not take say why, `p`
then `r` runs the command again with prefetch on (its hook's setting), and `q`, stop,
ends it with nothing of it left running.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from gpuwatch.runs import folders
from tests.conftest import wait_for
from tests.integration.test_run_lifecycle import END_TO_GONE_S, assert_gone_by, recorded
from tests.integration.test_tmux import Tmux, gpuwatch_command, tmux_env  # noqa: F401 - a fixture

pytestmark = [
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed (.ci/run installs it)"
    ),
    pytest.mark.slow,  # real processes: after the quick tests
]


def test_a_command_on_the_dashboard_at_80x24(home: Path, tmux_env: dict[str, str]) -> None:  # noqa: F811
    marker = f"tmux-command-{os.getpid()}"
    term = Tmux("run", gpuwatch_command("run", "--", "sh", "-c", f"echo {marker}; exec sleep 90"),
                {**tmux_env, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                 "GPUWATCH_STOP_GRACE_S": "5"})
    try:
        term.wait_screen(r"^ command: sh -c 'echo tmux-command-\d+; exec sleep 90'", 60)
        term.wait_screen(r"no step metrics: not a TensorFlow program \(so far\)")
        screen = term.screen()
        lines = screen.splitlines()
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert "no pending changes · p prefetch" in screen  # the keys it takes, in view
        assert " running " in lines[0]

        term.press("?")
        term.wait_screen(r"Not for a command: a script's batch size is its own")
        term.press("Escape")
        term.wait_screen(r"no pending changes")

        term.press("p")
        term.wait_screen(r"pending \(relaunch\): prefetch off→on")
        term.press("r")
        term.wait_screen(r"attempt 2 +running", 60)
        (info,) = folders.list_runs(home)
        settings = yaml.safe_load((info.run_dir / "attempt-2.yaml").read_text())
        assert settings["data"]["prefetch"] is True
        wait_for(lambda: (info.run_dir / "trainer.log").read_text().count(marker) == 2, 30,
                 "the command's second run")

        term.press("q")
        term.wait_screen(r"Detach", timeout_s=10)
        term.press("s")
        wait_for(lambda: not term.alive(), 60, "the dashboard to exit after stopping the run")
        wait_for(lambda: not folders.read_run_info(info.run_dir).live, 30, "the run to end")
        assert folders.read_run_info(info.run_dir).status == "stopped"
        ends = [e["status"] for e in recorded(info.run_dir) if e["type"] == "status"]
        assert ends[-1] == "stopped" and "crashed" not in ends
        assert_gone_by(info.run_dir, set(), time.time() + END_TO_GONE_S, "after the stop")
    finally:
        term.kill()
