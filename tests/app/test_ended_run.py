"""A run that has ended reads as ended: its figures are the last measured, its advice is for
the next attempt, and a crash's cause is said once.

The crash is a real one: a supervisor (`gpuwatch train --detach`) and the stand-in trainer
(tests/data/fake_trainer.py, mode "crash": a step, "ValueError: deliberate failure" on
stderr and in an error frame, exit 1); the dashboard is fed the run's events.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.advisor import MAX_RECOMMENDATIONS
from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.header import HeaderBar
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runs import folders
from gpuwatch.runstate import RunState
from gpuwatch.runstate.state import CURRENT_STEPS
from gpuwatch.supervisor.exits import TrainerExit, exit_status
from tests.conftest import TINY, gpuwatch, wait_for

from .conftest import SIZE, frozen_clock_for, load_events, settle

CAUSE = "ValueError: deliberate failure"  # what the fake trainer raises, in its words
PANELS = (HeaderBar, MetricsPanel, AdvicePanel, DevicesPanel, CrashPanel, AttemptsPanel,
          PendingBar)


def crashed_run_events(home: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """events.jsonl of a real run whose trainer raised CAUSE, once its supervisor is gone."""
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "crash")
    run_id = gpuwatch("train", str(TINY), "--detach", check=True).stdout.strip().splitlines()[-1]
    run_dir = folders.runs_root(home) / run_id

    def ended() -> list[dict[str, Any]] | None:
        path = run_dir / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        events = [json.loads(line) for line in lines if line.strip()]
        if not any(e["type"] == "status" and e["status"] == "crashed" for e in events):
            return None
        pid = folders.read_supervisor_info(run_dir).get("pid")
        if isinstance(pid, int) and folders.pid_alive(pid):
            return None  # its last events may still come
        return events

    return wait_for(ended, 60, "the run to crash and its supervisor to exit")


def everything_shown(app: GpuwatchApp) -> str:
    """Every panel's text, those hidden at this size too, and the crash panel's title."""
    texts = [app.query_one(panel).plain for panel in PANELS]
    return "\n".join([*texts, str(app.query_one(CrashPanel).border_title)])


async def test_a_crashed_runs_cause_is_said_once_and_nothing_reads_as_live(home, monkeypatch):
    events = crashed_run_events(home, monkeypatch)
    (status,) = [e for e in events if e["type"] == "status" and e["status"] == "crashed"]
    (error,) = [e for e in events if e["type"] == "error"]
    # The ground truth: the trainer's cause is in its error frame, in the supervisor's
    # message and in the log tail, each in full.
    assert error["message"] == CAUSE
    assert CAUSE in status["message"] and CAUSE in status["log_tail"]

    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.state.status == "crashed"
        shown = everything_shown(app)
        assert shown.count(CAUSE) == 1, shown
        crash = app.query_one(CrashPanel).plain.splitlines()
        assert crash[0] == f"crashed: {status['message']}"
        # The rest of the log tail is there, the cause's line (said above) is not again.
        rest = [line for line in status["log_tail"] if line != CAUSE]
        assert rest and [line.strip() for line in crash[1:]] == rest
        assert str(app.query_one(CrashPanel).border_title) == (
            f"trainer ended · last {len(rest)} line{'s' * (len(rest) != 1)} of trainer.log, "
            "less the error said above"
        )
        # One step, all warm-up: never measured, and not "warming up" as if it went on.
        metrics = app.query_one(MetricsPanel).plain
        assert "warming up" not in metrics
        assert "not measured: it ended within its first 5 steps" in metrics
        assert metrics.splitlines()[0].endswith("run crashed; last measured")
        advice = app.query_one(AdvicePanel).plain.splitlines()
        assert advice[0] == "no measured steps: it ended while warming up"
        assert advice[1] == (
            "• the run crashed: r goes on from its last checkpoint, with any setting you change"
        )


def crash_status_as_the_supervisor_makes_it(cause: str, log_tail: list[str]) -> dict[str, Any]:
    """The status event the supervisor records for a trainer that sent `cause` and exited 1."""
    status, fields = exit_status(
        TrainerExit(returncode=1, error=cause, log_lines=tuple(log_tail)),
        relaunching=False, stop_requested=False,
    )
    return {"v": 1, "type": "status", "status": status, "attempt": 1, **fields}


async def test_a_cause_the_supervisor_cut_short_is_still_said_once():
    # A long exception message: the supervisor's message cuts it short (exits.py), the
    # error frame and the log have it whole.
    cause = "RuntimeError: " + "the collective timed out waiting for worker 3; " * 20
    log_tail = ["Traceback (most recent call last):", '  File "loop.py", line 9', cause]
    events = load_events("cpu_one_attempt.jsonl")
    seq, t = events[-1]["seq"], events[-1]["t"]
    status = crash_status_as_the_supervisor_makes_it(cause, log_tail)
    assert cause not in status["message"] and status["message"].endswith("...")
    events += [
        {"v": 1, "type": "error", "seq": seq + 1, "t": t, "attempt": 1, "kind": "runtime",
         "message": cause},
        {**status, "seq": seq + 2, "t": t},
    ]
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        crash = app.query_one(CrashPanel).plain
        assert crash.count(cause[:60]) == 1, crash
        assert "error (runtime)" not in crash
        assert [line.strip() for line in crash.splitlines()[1:]] == [
            line.strip() for line in log_tail[:2]
        ]


async def test_a_different_error_is_still_shown():
    # The recording's error frame (an OOM) says more than the supervisor's message (the
    # step it ended at); the log's wrapped lines differ from both: all stay.
    app_events = load_events("cpu_crashed.jsonl")
    link = ReplayLink(app_events)
    app = GpuwatchApp(link, clock=frozen_clock_for(app_events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        lines = app.query_one(CrashPanel).plain.splitlines()
        assert lines[1] == (
            "error (runtime): ResourceExhaustedError: OOM when allocating tensor with "
            "shape[1024,512]"
        )
        assert len(lines) == 2 + 5  # every line of the log tail
        title = str(app.query_one(CrashPanel).border_title)
        assert title == "trainer ended · last 5 lines of trainer.log"


@pytest.mark.parametrize("status", ["stopped", "finished"])
async def test_an_ended_runs_figures_and_advice_are_the_last_measured(status):
    events = load_events("cpu_one_attempt.jsonl")
    last = events[-1]
    events.append({"v": 1, "type": "status", "seq": last["seq"] + 1, "t": last["t"],
                   "status": status, "attempt": 1, "message": "stopped on request"})
    state = RunState()
    state.apply_many(events)
    live = state.figures().examples_per_s
    assert live is not None
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=(120, 40)) as pilot:  # the advice beside the figures
        await settle(app, link, pilot)
        first, figures = app.query_one(MetricsPanel).plain.splitlines()
        assert first.endswith(f"run {status}; last measured")
        # The figures stay, as they were, over the window they were.
        assert figures.startswith(f"last {CURRENT_STEPS} steps: {live:,.0f} examples/s")
        advice = app.query_one(AdvicePanel).plain.splitlines()
        # The recording waits 38 % of each step for input: the verdict, as last measured.
        assert advice[0] == (
            "highly input-bound: 38.0% of step time waiting for input (last measured)"
        )
        assert advice[1] == (
            f"• the run {status}: r goes on from its last checkpoint, with any setting you change"
        )
        assert len(advice) == 1 + MAX_RECOMMENDATIONS
        assert advice[2] == "• turn prefetch on (p): read the next batch while this step runs"
