"""Pilot tests of the dashboard of an ended run, shown from its record (RecordLink) at 80x24.

The run directories are recorded fixtures written through the real EventLog and
StateKeeper (tests/support/recorded.py). `r` there resumes the run: resume_run is
replaced here (no supervisor, no TensorFlow); tests/integration/test_resume_attach.py
runs it for real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.header import HeaderBar
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.config import ConfigError
from gpuwatch.follow.link import RECORD, RecordLink
from gpuwatch.runs import resume
from gpuwatch.runs.folders import RunInfo, read_run_info
from tests.support.recorded import finished, write_run_dir

from .conftest import SIZE, Waiter, frozen_clock_for, load_events

RUN_ID = "0612-kq7m"  # the fixtures' run id


def text(app: GpuwatchApp, widget_type: type) -> str:
    return app.query_one(widget_type).plain


def record_app(
    tmp_path: Path, frames: list[dict[str, Any]]
) -> tuple[GpuwatchApp, RecordLink]:
    run_dir = tmp_path / "runs" / RUN_ID
    write_run_dir(run_dir, frames, snapshot_at=len(frames) // 2)
    link = RecordLink(read_run_info(run_dir), batch_size=16)
    app = GpuwatchApp(link, home=tmp_path, run_id=RUN_ID, clock=frozen_clock_for(frames))
    return app, link


async def shown(app: GpuwatchApp, waiter: Waiter, pilot: Any) -> None:
    """Until the record was read to its end, then everything painted."""
    await waiter.until(lambda: app.state.link_state == RECORD, "the record read to its end")
    await pilot.pause()
    app.refresh_view(flush=True)
    await pilot.pause()


@pytest.fixture
def resumes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """resume_run replaced: the calls it got; it starts nothing (a socket nobody serves)."""
    calls: list[tuple[str, list[str]]] = []

    def fake_resume(info: RunInfo, overrides: list[str]) -> RunInfo:
        calls.append((info.run_id, list(overrides)))
        return info

    monkeypatch.setattr(resume, "resume_run", fake_resume)
    return calls


async def test_a_finished_run_is_shown_from_its_record_with_its_end_and_attempts(tmp_path):
    app, link = record_app(tmp_path, finished(load_events("cpu_two_attempts.jsonl")))
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await shown(app, waiter, pilot)
        assert link.snapshot_seq is not None, "it started from snapshot.json"
        header = text(app, HeaderBar)
        assert "attempt 2" in header and " finished " in header
        assert " record " in header and "link" not in header  # not a lost connection
        assert "step 90" in text(app, MetricsPanel)
        rows = text(app, AttemptsPanel).splitlines()
        # Each attempt's compute / all-reduce shares too (the fixture's steps are timed
        # apart): "max_steps" is too long for "comp/sync" at 80 columns, "cp/sync" fits.
        assert rows[0].split()[-2:] == ["cp/sync", "ended"]
        assert rows[1].split() == [
            "1", "off", "1", "256", "45", "1,283", "38.0%", "40/15%", "sigterm"
        ]
        assert rows[2].split() == [
            "2", "on", "1", "256", "45", "1,973", "4.0%", "60/25%", "max_steps"
        ]
        assert text(app, PendingBar).startswith("run ended (finished); r resumes it · ")
        assert app.check_action("relaunch", ()) is True  # r works with nothing pending
        assert app.check_action("discard", ()) is None
        await pilot.press("q")  # no question: nothing runs
    assert app.return_value == "ended"


async def test_a_crashed_run_from_its_record_shows_why(tmp_path):
    app, _link = record_app(tmp_path, load_events("cpu_crashed.jsonl"))
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await shown(app, waiter, pilot)
        assert " crashed " in text(app, HeaderBar)
        crash = text(app, CrashPanel)
        assert crash.startswith("crashed: trainer exited with code 1")
        assert "OOM when allocating tensor" in crash
        assert text(app, PendingBar).startswith("run ended (crashed); r resumes it")


async def test_r_with_nothing_pending_resumes_the_run_as_it_was(tmp_path, resumes, notifications):
    app, link = record_app(tmp_path, finished(load_events("cpu_two_attempts.jsonl")))
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await shown(app, waiter, pilot)
        await pilot.press("r")
        await waiter.until(lambda: link.resumes == 1, "the resume")
        assert resumes == [(RUN_ID, [])]
        assert "resuming as attempt 3" in notifications
        # Nothing serves the socket here, and no supervisor is recorded as up: the link
        # goes back to the record (the run's own e2e test follows a real one).
        await waiter.until(
            lambda: not link.following and app.state.link_state == RECORD, "back to the record"
        )
        # A change made first goes with the resume, as --set texts.
        await pilot.press("p")
        assert app.pending == {"data.prefetch": False}
        await pilot.press("r")
        await waiter.until(lambda: link.resumes == 2, "the second resume")
        assert resumes[1] == (RUN_ID, ["data.prefetch=false"])
        assert "resuming as attempt 3: prefetch on→off" in notifications
        assert app.pending == {}


async def test_a_resume_refused_is_a_notification_not_a_crash(
    tmp_path, monkeypatch, notifications
):
    def refuse(info: RunInfo, overrides: list[str]) -> RunInfo:
        raise ConfigError("resume.yaml: data.read_latency_ms: must be at most 10000")

    monkeypatch.setattr(resume, "resume_run", refuse)
    app, link = record_app(tmp_path, load_events("cpu_crashed.jsonl"))
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await shown(app, waiter, pilot)
        await pilot.press("r")
        expected = "relaunch failed: resume.yaml: data.read_latency_ms: must be at most 10000"
        await waiter.until(lambda: expected in notifications, "the refusal's notification")
        assert app.is_running and not link.following
        assert app.state.link_state == RECORD and " crashed " in text(app, HeaderBar)


async def test_a_record_that_stops_while_running_is_shown_lost_and_r_resumes_it(
    tmp_path, resumes
):
    # The recording ends mid-run and no supervisor is up (killed, or the machine restarted).
    app, link = record_app(tmp_path, load_events("cpu_one_attempt.jsonl"))
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await shown(app, waiter, pilot)
        assert app.state.status == "lost" and app.state.attempt == 1
        header = text(app, HeaderBar)
        assert " lost " in header and " record " in header
        assert "the supervisor is gone" in text(app, CrashPanel)
        assert text(app, PendingBar).startswith("run ended (lost); r resumes it")
        await pilot.press("r")
        await waiter.until(lambda: link.resumes == 1, "the resume")
        assert resumes == [(RUN_ID, [])]
