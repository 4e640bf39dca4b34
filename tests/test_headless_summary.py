"""Headless says what each figure is: the summary's window, short runs' figures, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch import runs
from tests.conftest import ROOT, TINY, gpuwatch, wait_for

pytestmark = pytest.mark.slow


def test_a_short_run_reports_what_it_measured_and_says_over_what(home: Path) -> None:
    done = gpuwatch("train", str(TINY), "--headless", "--max-steps", "4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    summary = next(line for line in lines if line.startswith("summary: "))
    assert "examples_per_s=n/a" not in summary and "input_wait_pct=n/a" not in summary
    assert lines[-1].startswith("verdict: ") and lines[-2] == summary  # the verdict is last
    said = lines[lines.index(summary) - 1]
    assert said == ("gpuwatch: attempt 1's figures over all its 4 steps, warm-up included "
                    "(too few to leave it out); a progress line's are its last 20 steps")
    # The figure is the steps' own: their median examples/s, as the trainer reported them.
    (info,) = runs.list_runs(home)
    rates = sorted(json.loads(line)["examples"] / json.loads(line)["step_time_ms"] * 1000
                   for line in (info.run_dir / "events.jsonl").read_text().splitlines()
                   if '"type":"step"' in line)
    shown = float(summary.split("examples_per_s=")[1].split()[0])
    assert shown == pytest.approx(rates[len(rates) // 2], rel=1e-3)


def test_a_longer_run_says_its_summary_leaves_warm_up_out(home: Path) -> None:
    done = gpuwatch("train", str(TINY), "--headless", "--max-steps", "12")
    assert done.returncode == 0, done.stderr
    assert ("gpuwatch: attempt 1's figures over its 7 steps after the first 5 (warm-up); "
            "a progress line's are its last 20 steps") in done.stdout


def test_ctrl_c_stops_the_run_with_the_documented_code(home: Path) -> None:
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "train", str(TINY), "--headless"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        run_dir = wait_for(lambda: next(iter(runs.list_runs(home)), None), 60, "the run")
        run_dir = run_dir.run_dir
        wait_for(lambda: '"type":"step"' in (run_dir / "events.jsonl").read_text(), 120,
                 "a step")
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 130, err  # as gpuwatch/headless.py's docstring says
    assert "summary: " in out and "stopping run" in err
    assert runs.read_run_info(run_dir).status == "stopped"
