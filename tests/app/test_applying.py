"""A live change in flight is on screen: "applying live: ..." from `r` until the trainer has
settled it, with no invitation to press `r` again, whether the supervisor's answer comes at
once, comes as `pending` (its wait ran out) and the record settles it later, or never."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.common import fit_line
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.follow.link import ReplayLink

from .conftest import SIZE, frozen_clock_for, load_events, settle, wait_commands

FIXTURE = "cpu_one_attempt.jsonl"


class HeldLink(ReplayLink):
    """Replays the fixture; a relaunch is answered only once `release` is set, with `reply`."""

    def __init__(self, events: list[dict[str, Any]], reply: dict[str, Any]) -> None:
        super().__init__(events, batch_size=50)
        self.release = asyncio.Event()
        self.reply = reply

    async def command(self, frame_type: str, **fields: Any) -> dict[str, Any]:
        answer = await super().command(frame_type, **fields)
        if frame_type == "relaunch":
            await self.release.wait()
            answer.update(self.reply)
        return answer


def _app(reply: dict[str, Any]) -> tuple[GpuwatchApp, HeldLink, list[dict[str, Any]]]:
    events = load_events(FIXTURE)
    link = HeldLink(events, reply)
    return GpuwatchApp(link, clock=frozen_clock_for(events)), link, events


def _answered_with(error: Exception) -> tuple[GpuwatchApp, ReplayLink, list[dict[str, Any]]]:
    """The fixture replayed; a relaunch is answered with `error`."""
    events = load_events(FIXTURE)
    link = ReplayLink(events, batch_size=50, replies={"relaunch": error})
    return GpuwatchApp(link, clock=frozen_clock_for(events)), link, events


def bar(app: GpuwatchApp) -> str:
    return app.query_one(PendingBar).plain


def _next_attempt(events: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
    """The fixture's attempt event as the supervisor records a live change's."""
    event = copy.deepcopy(next(e for e in events if e["type"] == "attempt"))
    event.update(seq=len(events), attempt=attempt, reason="live")
    event["settings"]["data"]["prefetch"] = True
    return event


async def test_applying_shows_from_r_until_the_answer_and_never_says_press_r() -> None:
    app, link, _ = _app({"attempt": 2, "live": True, "request": 1, "seconds": 0.8})
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p")
        assert "press r" in bar(app) or "r apply live" in bar(app)
        await pilot.press("r")
        await pilot.pause()
        assert bar(app).startswith("applying live: prefetch off→on · ")
        assert "press" not in bar(app) and " r " not in bar(app)
        link.release.set()
        await wait_commands(app)
        await pilot.pause()
        assert bar(app).startswith("no pending changes")


async def test_a_pending_answer_keeps_applying_until_the_new_attempt_is_recorded() -> None:
    app, link, events = _app({"attempt": 2, "live": True, "pending": True, "request": 7,
                              "message": "no answer from the trainer within 40 s"})
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "r")
        link.release.set()
        await wait_commands(app)
        await pilot.pause()
        assert bar(app).startswith("applying live: prefetch off→on")
        app.check_applying()  # the 1 s tick: still no attempt 2 in the record
        assert bar(app).startswith("applying live")
        link.push([_next_attempt(events, 2)])
        await settle(app, link, pilot)
        assert app.state.attempt == 2
        assert bar(app).startswith("no pending changes")


async def test_a_pending_answer_then_a_refusal_settles_it_on_the_old_settings() -> None:
    app, link, events = _app({"attempt": 2, "live": True, "pending": True, "request": 7,
                              "message": "no answer from the trainer within 40 s"})
    refused = {"v": 1, "type": "reconfigured", "seq": len(events), "t": events[-1]["t"],
               "attempt": 1, "id": 6, "ok": False, "step": 45, "changed": [],
               "seconds": 0.0, "message": "not applied: too late"}
    link.push([refused])  # an earlier change's refusal, before r: it settles nothing later
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "r")
        link.release.set()
        await wait_commands(app)
        await pilot.pause()
        assert bar(app).startswith("applying live")
        link.push([dict(refused, seq=len(events) + 1, id=7)])
        await settle(app, link, pilot)
        assert app.state.attempt == 1 and not bar(app).startswith("applying")


async def test_r_is_greyed_out_while_a_change_is_in_flight_and_r_twice_sends_once() -> None:
    app, link, events = _app({"attempt": 2, "live": True, "pending": True, "request": 7,
                              "message": "no answer from the trainer within 40 s"})
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "r")
        await pilot.pause()
        assert app.check_action("relaunch", ()) is None  # r: greyed out
        assert app.check_action("relaunch", (False,)) is True  # R still relaunches
        await pilot.press("b", "r")  # another change, and r again: nothing is sent
        await pilot.pause()
        assert [name for name, _ in link.commands] == ["relaunch"]
        assert bar(app).startswith("applying live: prefetch off→on")
        link.release.set()
        await wait_commands(app)
        await pilot.pause()
        assert bar(app).startswith("applying live")  # pending: the record has not said
        link.push([_next_attempt(events, 2)])
        await settle(app, link, pilot)
        assert app.applying is None and app.check_action("relaunch", ()) is True


async def test_a_lost_link_while_applying_keeps_applying_until_the_record_says() -> None:
    from gpuwatch.follow.client import ConnectionLost

    app, link, events = _answered_with(ConnectionLost("the supervisor's socket closed"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "r")
        await wait_commands(app)
        await pilot.pause()
        assert bar(app).startswith("applying live")  # it may still apply
        link.push([_next_attempt(events, 2)])  # back, and the record has attempt 2
        await settle(app, link, pilot)
        assert app.applying is None and bar(app).startswith("no pending changes")


async def test_an_err_answer_ends_applying_and_says_why(notifications: list[str]) -> None:
    from gpuwatch.follow.client import CommandError

    app, link, _ = _answered_with(CommandError("not applied live: refused"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "r")
        await wait_commands(app)
        await pilot.pause()
        assert app.applying is None and not bar(app).startswith("applying")
        assert any("not applied live: refused" in n for n in notifications)


def test_fit_line_cuts_the_head_and_keeps_the_tail_whole() -> None:
    line = "applying live: prefetch off→on, accumulation 1→2, batch 256→512 · 12 s"
    assert fit_line(line, 200) == line
    cut = fit_line(line, 40, keep=" · 12 s")
    assert len(cut) <= 40 and cut.endswith("… · 12 s") and cut.startswith("applying live: ")


async def test_switching_runs_drops_the_other_runs_change_in_flight() -> None:
    app, link, events = _app({"attempt": 2, "live": True, "request": 1})
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "r")
        await pilot.pause()
        assert bar(app).startswith("applying live")
        other = ReplayLink(events, batch_size=50)
        app.switch_to(other, "0612-other")
        await settle(app, other, pilot)
        assert app.applying is None and bar(app).startswith("no pending changes")
        link.release.set()  # the first run's answer, late: it changes nothing here
        await wait_commands(app)
        await pilot.pause()
        assert app.applying is None and bar(app).startswith("no pending changes")
        assert app._relaunched_attempt == 0  # not the first run's attempt 2
