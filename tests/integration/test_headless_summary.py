"""Headless says what each figure is: the summary's window, short runs' figures.

A longer run's line (warm-up left out) and Ctrl-C's exit code 130 are checked on the runs of
tests/integration/test_run_lifecycle_tf.py (a finished headless run; a stopped run's headless
resume),
which start TensorFlow for other checks anyway."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpuwatch.runs import folders
from tests.conftest import TINY, gpuwatch

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
    # The figure is the steps' own: their median examples/s (of an even count, the mean of
    # the middle two, as the dashboard's over the same steps), as the trainer reported them.
    (info,) = folders.list_runs(home)
    rates = sorted(json.loads(line)["examples"] / json.loads(line)["step_time_ms"] * 1000
                   for line in (info.run_dir / "events.jsonl").read_text().splitlines()
                   if '"type":"step"' in line)
    shown = float(summary.split("examples_per_s=")[1].split()[0])
    assert shown == pytest.approx(statistics.median(rates), rel=1e-3)


def test_with_telemetry_off_the_run_still_tells_its_step_and_the_verdict_says_why_no_figures(
    home: Path
) -> None:
    # telemetry.enabled: false sends no step frames (the bench's knob for their cost): the
    # step the trainer ended at comes from its checkpoint and its done frame, not 0.
    done = gpuwatch("train", str(TINY), "--headless", "--max-steps", "12",
                    "--set", "telemetry.enabled=false")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "verdict: telemetry was off (telemetry.enabled: false): no step figures to judge")
    last_progress = [line for line in done.stdout.splitlines() if " | step " in line][-1]
    assert " finished | step 12 | " in last_progress, last_progress
    (info,) = folders.list_runs(home)
    assert (info.status, info.step) == ("finished", 12)
    events = [json.loads(line) for line in (info.run_dir / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in events if e["type"] == "done"] == [12]
    assert json.loads((info.run_dir / "state.json").read_text())["step"] == 12
