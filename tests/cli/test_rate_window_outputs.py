"""Every examples/s the text outputs print says its window: a progress line, ls, a probe.

A progress line and ls give the dashboard's headline figure (the chief's last
CURRENT_STEPS steps after warm-up, of its latest attempt); a probe's table each count's
attempt median. The truths are the recorded steps' own rates, by hand
(tests/app/data/make_fixtures.py: 256 examples a step, 200 +/- 10 ms in attempt 1 of
cpu_two_attempts, 130 +/- 6 ms in its attempt 2, in turn, after 5 warm-up steps).
"""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from gpuwatch import cli
from gpuwatch.cli.headless import progress_line, scale_ended
from gpuwatch.runs import folders
from gpuwatch.runstate.state import CURRENT_STEPS, RunState
from gpuwatch.runstate.steps import WARMUP_STEPS
from tests.app.conftest import load_events
from tests.support.recorded import finished, write_run_dir

RUN_ID = "0612-kq7m"  # the recordings' run


def last_steps(events: list[dict[str, Any]], attempt: int) -> list[dict[str, Any]]:
    """The attempt's last CURRENT_STEPS steps after its warm-up, as recorded."""
    steps = [e for e in events if e["type"] == "step" and e["attempt"] == attempt]
    return steps[WARMUP_STEPS:][-CURRENT_STEPS:]


def median_rate(steps: list[dict[str, Any]]) -> float:
    return statistics.median(e["examples"] * 1000.0 / e["step_time_ms"] for e in steps)


def faster_end(events: list[dict[str, Any]], count: int, step_ms: float) -> list[dict[str, Any]]:
    """The recording, its last `count` steps made `step_ms` long: a window that differs
    from the attempt's whole."""
    steps = [i for i, e in enumerate(events) if e["type"] == "step"]
    out = list(events)
    for i in steps[-count:]:
        out[i] = dict(out[i], step_time_ms=step_ms)
    return out


def test_a_progress_line_says_the_window_of_its_figures() -> None:
    events = faster_end(load_events("cpu_two_attempts.jsonl"), 10, 100.0)
    state = RunState()
    state.apply_many(events)
    window = last_steps(events, 2)  # 10 of 130 +/- 6 ms, then 10 of 100
    rate = median_rate(window)
    step_ms = statistics.median(e["step_time_ms"] for e in window)
    assert (f"{rate:,.0f}", step_ms) == ("2,312", 112.0)
    assert (f" | last {CURRENT_STEPS} steps: {rate:,.0f} ex/s, {step_ms:.1f} ms per step, "
            "input wait ") in progress_line(state)


def test_a_progress_line_before_any_measured_step_says_no_window() -> None:
    events = load_events("cpu_one_attempt.jsonl")
    first = next(i for i, e in enumerate(events) if e["type"] == "step")
    state = RunState()
    state.apply_many(events[: first + 1])  # a warm-up step: nothing measured yet
    assert " | n/a ex/s, " in progress_line(state)
    assert "last" not in progress_line(state)


def test_ls_reads_the_headlines_window_of_the_latest_attempt(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = faster_end(load_events("cpu_two_attempts.jsonl"), 10, 100.0)
    write_run_dir(folders.runs_root(home) / RUN_ID, finished(events))
    (info,) = folders.list_runs(home)
    truth = last_steps(events, 2)
    assert info.examples_per_s == pytest.approx(median_rate(truth))
    assert info.examples_per_s_steps == len(truth) == CURRENT_STEPS
    assert cli.main(["ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (row,) = [line for line in lines if line.startswith(RUN_ID)]
    assert row.split()[5] == f"{median_rate(truth):,.0f}" == "2,312"
    assert lines[-1] == (f"EX/S: the median of the latest attempt's last {CURRENT_STEPS} steps "
                         "after warm-up (fewer while it has fewer)")
    assert cli.main(["ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["examples_per_s_steps"] == CURRENT_STEPS


def test_ls_leaves_out_the_warm_up_of_an_attempt_that_began_in_its_tail(home: Path) -> None:
    events = load_events("cpu_crashed.jsonl")  # 15 steps: 5 warm-up of 208 ms, then 10
    write_run_dir(folders.runs_root(home) / RUN_ID, events)
    (info,) = folders.list_runs(home)
    truth = last_steps(events, 1)
    assert len(truth) == 10
    assert info.examples_per_s == pytest.approx(median_rate(truth))
    assert info.examples_per_s_steps == 10


def test_a_headless_probe_says_its_table_is_each_counts_attempt_median(home: Path) -> None:
    # cpu_scale: 1 and 2 replicas measured, 4 running with 10 steps after warm-up (its
    # 90 +/- 2 ms steps of 512 examples): the running count's row and the progress line
    # are over the same steps, and read one value.
    events = load_events("cpu_scale.jsonl")
    write_run_dir(folders.runs_root(home) / "0612-sc4l", events)
    (info,) = folders.list_runs(home)
    state = RunState()
    state.apply_many(events)
    out, err = io.StringIO(), io.StringIO()
    assert scale_ended(info, state, 1, False, out, err) == 0
    lines = out.getvalue().splitlines()
    truth = last_steps(events, 3)
    rate = f"{median_rate(truth):,.0f}"
    assert f" | last {len(truth)} steps: {rate} ex/s, " in lines[0]
    assert lines[1].startswith("gpuwatch: weak scaling (the per-replica batch kept)")
    assert lines[1].endswith("; ex/s: each count's attempt median")
    assert lines[2].split()[:3] == ["replicas", "batch", "ex/s"]
    (running,) = [line for line in lines if line.split()[:1] == ["4*"]]
    assert running.split()[2] == rate
