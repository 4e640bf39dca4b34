"""An ended run's dashboard from its record, and `r` there resuming it, end to end.

Real processes: `gpuwatch train --detach` starts a real supervisor; its trainer is the
stand-in (tests/data/fake_trainer.py, GPUWATCH_TRAINER_MODULE), which finishes at once, so
the supervisor exits with nobody attached. The dashboard (Pilot) then reads the run
directory with no supervisor (RecordLink); `r` runs the real resume_run: a supervisor
again, attempt 2, followed live from the last seq read + 1.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.header import HeaderBar
from gpuwatch.follow.link import RECORD, RecordLink
from gpuwatch.runs.folders import read_run_info
from gpuwatch.runstate import RunState
from gpuwatch.runstate.codec import snapshotted
from tests.app.conftest import SIZE, Waiter
from tests.conftest import ROOT, TINY, gpuwatch, wait_for
from trainer_runtime.protocol import SNAPSHOT


class Tap:
    """A link that notes the seq of every event it passes on (a snapshot: its seq), and its
    own link events."""

    def __init__(self, link: RecordLink) -> None:
        self.link = link
        self.seqs: list[int] = []
        self.states: list[str] = []

    async def events(self) -> Any:
        async for batch in self.link.events():
            self.seqs.extend(e["seq"] for e in batch if isinstance(e.get("seq"), int))
            self.states.extend(e["state"] for e in batch if e.get("type") == "link")
            yield batch

    async def command(self, frame_type: str, **fields: Any) -> dict[str, Any]:
        return await self.link.command(frame_type, **fields)

    async def close(self) -> None:
        await self.link.close()


def supervisor_gone(run_dir: Path) -> bool:
    info = read_run_info(run_dir)
    return info.supervisor_pid is None and not (run_dir / "supervisor.json").exists()


def run_fields(state: RunState) -> dict[str, Any]:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if snapshotted(f)}


async def test_an_ended_run_from_its_record_resumes_with_r_and_is_followed_live(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "finish")
    monkeypatch.chdir(ROOT)  # the supervisor's trainers import tests.data from here
    run_id = gpuwatch("train", str(TINY), "--detach", check=True, timeout_s=60).stdout.strip()
    run_dir = home / "runs" / run_id
    wait_for(
        lambda: read_run_info(run_dir).status == "finished" and supervisor_gone(run_dir),
        20,
        lambda: f"run {run_id} to finish and its supervisor to exit: {read_run_info(run_dir)}",
    )
    # The resumed supervisor outlives its run's end a little once the dashboard leaves.
    monkeypatch.setenv("GPUWATCH_LINGER_S", "2")

    link = RecordLink(read_run_info(run_dir))
    tap = Tap(link)
    app = GpuwatchApp(tap, home=home, run_id=run_id)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await waiter.until(lambda: app.state.link_state == RECORD, "the record")
        state = app.state
        assert (state.status, state.attempt) == ("finished", 1)
        read = state.last_seq
        assert link.snapshot_seq is not None, "it started from snapshot.json"
        assert tap.seqs == list(range(link.snapshot_seq, read + 1))

        await pilot.press("r")
        await waiter.until(lambda: link.following, "the resumed run's supervisor followed")
        live = link.live
        assert live is not None
        resumed_pid = link.info.supervisor_pid
        assert resumed_pid is not None
        await waiter.until(
            lambda: app.state.attempt == 2 and app.state.status == "finished",
            "attempt 2 to finish",
            timeout_s=20,
        )
        assert live.subscriptions == [read + 1], "subscribed after the last event read"
        assert link.following, "the supervisor stays while the dashboard is attached"
        app.refresh_view(flush=True)
        await pilot.pause()
        assert "attempt 2" in app.query_one(HeaderBar).plain
        rows = app.query_one(AttemptsPanel).plain.splitlines()
        assert rows[2].split()[0] == "2" and rows[2].split()[-1] == "max_steps"
        await pilot.press("q")
    assert app.return_value == "ended"
    assert tap.states == [RECORD, "connected"]
    link_events = len(tap.states)
    assert app.state.duplicates_skipped == 0
    assert tap.seqs == list(range(link.snapshot_seq, app.state.last_seq + 1)), "no gap, no repeat"

    wait_for(lambda: supervisor_gone(run_dir), 15, "the resumed supervisor to exit")
    # ... and, a child of this process (resume_run started it), not left a zombie.
    wait_for(lambda: not Path(f"/proc/{resumed_pid}").exists(), 15, "the supervisor reaped")
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["seq"] for e in events] == list(range(len(events)))
    attempts = [e for e in events if e["type"] == "attempt"]
    assert [(a["attempt"], a["reason"]) for a in attempts] == [(1, "start"), (2, "resume")]
    # What the dashboard folded is the record up to its last seq, exactly (but for the
    # count of what it applied: its link's own events count there too).
    whole = RunState()
    whole.apply_many(events[: app.state.last_seq + 1])
    folded, recorded = run_fields(app.state), run_fields(whole)
    assert folded.pop("events_applied") == recorded.pop("events_applied") + link_events
    assert folded == recorded
    assert not any(e["type"] == SNAPSHOT for e in events)


async def _live_dashboard(run_dir: Path, home: Path) -> tuple[GpuwatchApp, Tap, RecordLink]:
    info = read_run_info(run_dir)
    assert info.socket_path is not None
    link = RecordLink.live_first(info, info.socket_path)
    tap = Tap(link)
    return GpuwatchApp(tap, home=home, run_id=run_dir.name), tap, link


@pytest.mark.alone(first=True)
async def test_a_killed_supervisor_shows_lost_at_once_not_reconnecting(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard of a live run knows when its supervisor died: `lost`, as `gpuwatch ls`
    says, within a second or two; r then resumes it."""
    import os
    import signal
    import time

    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.chdir(ROOT)
    run_id = gpuwatch("train", str(TINY), "--detach", check=True, timeout_s=60).stdout.strip()
    run_dir = home / "runs" / run_id
    app, tap, link = await _live_dashboard(run_dir, home)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await waiter.until(lambda: app.state.status == "running", "the live run")
        assert link.following and tap.states[0] == "connected"
        os.kill(read_run_info(run_dir).supervisor_pid or 0, signal.SIGKILL)
        killed_at = time.monotonic()
        await waiter.until(lambda: app.state.status == "lost", "lost on screen", timeout_s=5)
        assert time.monotonic() - killed_at < 5
        await waiter.until(lambda: app.state.link_state == RECORD, "the record")
        assert "lost" not in tap.states, "never a lost link: the run is lost, and says so"
        assert "reconnecting" not in tap.states
        app.refresh_view(flush=True)
        await pilot.pause()
        header = app.query_one(HeaderBar).plain
        assert "lost" in header and "reconnecting" not in header
    wait_for(lambda: not any(
        os.fsencode(run_dir) in Path(f"/proc/{p}/cmdline").read_bytes()
        for p in os.listdir("/proc") if p.isdigit() and Path(f"/proc/{p}/cmdline").exists()
    ), 10, "the trainer to see its supervisor gone and exit")


async def test_a_clean_stop_is_an_end_not_a_lost_link(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    monkeypatch.chdir(ROOT)
    run_id = gpuwatch("train", str(TINY), "--detach", check=True, timeout_s=60).stdout.strip()
    run_dir = home / "runs" / run_id
    app, tap, _link = await _live_dashboard(run_dir, home)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await waiter.until(lambda: app.state.status == "running", "the live run")
        assert gpuwatch("stop", run_id).returncode == 0
        await waiter.until(lambda: app.state.status == "stopped", "stopped on screen")
        # `gpuwatch stop` once more: the ended run's supervisor goes; the screen keeps the
        # end, read from the record, and says so (no red link lost, no reconnecting).
        assert gpuwatch("stop", run_id).returncode == 0
        await waiter.until(lambda: app.state.link_state == RECORD, "the record", timeout_s=10)
        assert app.state.status == "stopped"
        assert "lost" not in tap.states and "reconnecting" not in tap.states
        await pilot.press("q")
    assert app.return_value == "ended"


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
