"""gpuwatch run at 80x24 in a real terminal (tmux): a person's own unmodified fit script
watched live, then p and r run it again with prefetch added."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.conftest import gpuwatch, wait_for
from tests.integration.test_tmux import Tmux, events, gpuwatch_command, the_run, tmux_env  # noqa: F401

SCRIPT = "tests/data/scripts/fit_mirrored.py"


def test_run_a_fit_script_at_80x24_then_p_and_r_relaunch_it_with_prefetch(
    home: Path, tmux_env: dict[str, str]  # noqa: F811
) -> None:
    term = Tmux("script", gpuwatch_command("run", "--", sys.executable, SCRIPT,
                                           "--epochs", "400"), tmux_env)
    term.wait_screen(r"^ step (?:[2-9]\d|\d{3,})\b", timeout_s=90)
    screen = term.wait_screen(r"fit · MirroredStrategy", timeout_s=30).string
    assert "script: " in screen and "fit_mirr" in screen
    assert "2 logical CPU replicas" in screen
    # The figures after their window ("last 20 steps:"; shorter words where the TFLOP/s
    # would not fit beside the long ones).
    assert "input wait" in screen
    assert re.search(r"last \d+(?: steps)?: [\d,]+ (?:examples|ex)/s  ", screen), screen
    assert all(len(line) <= 80 for line in screen.splitlines())

    term.press("p")
    term.wait_screen(r"pending.*prefetch", timeout_s=10)
    term.press("r")
    term.wait_screen(r"attempt 2\s+running", timeout_s=90)
    term.wait_screen(r"^\s+2\s+on\s", timeout_s=60)
    info = the_run(home)
    record = events(info.run_dir)
    attempts = {e["attempt"]: e for e in record if e["type"] == "attempt"}
    assert attempts[2]["reason"] == "relaunch"
    assert attempts[1]["settings"]["data"]["prefetch"] is False
    assert attempts[2]["settings"]["data"]["prefetch"] is True
    assert attempts[2]["settings"]["command"] == attempts[1]["settings"]["command"]
    wait_for(lambda: len([e for e in events(info.run_dir) if e["type"] == "hello"]) == 2, 60,
             "the script's second run to say hello (a new process)")
    assert gpuwatch("stop", info.run_id).returncode == 0


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
