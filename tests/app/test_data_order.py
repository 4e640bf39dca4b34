"""The screen says when a resume restarted the data order, and why."""

from __future__ import annotations

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.follow.link import ReplayLink

from .conftest import SIZE, frozen_clock_for, load_events, settle


def _with_resume(data_order: str, data_note: str) -> list[dict]:
    """The recorded two-attempt run, its resume event as this version writes it."""
    events = load_events("cpu_two_attempts.jsonl")
    resume = next(e for e in events if e["type"] == "resume" and e["attempt"] == 2)
    resume.update(position=11520, data_order=data_order, data_note=data_note, lost_steps=0)
    return events


async def _attempts_text(events: list[dict]) -> str:
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        return str(app.query_one(AttemptsPanel).plain)


async def test_a_restarted_data_order_is_marked_with_its_reason() -> None:
    note = "data order restarted: replicas x per-replica batch changed from 2 x 128"
    shown = await _attempts_text(_with_resume("restarted", note))
    row_2 = next(line for line in shown.splitlines() if line.lstrip().startswith("2 "))
    assert row_2.rstrip().endswith("*")
    assert f"* attempt 2: {note}" in shown


async def test_a_continued_data_order_adds_no_mark() -> None:
    shown = await _attempts_text(_with_resume("continued", ""))
    assert "*" not in shown
