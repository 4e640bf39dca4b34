"""The screen says when a resume restarted the data order, and why."""

from __future__ import annotations

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.link import ReplayLink
from gpuwatch.app.widgets.panels import AttemptsPanel

from .conftest import SIZE, frozen_clock_for, load_events, settle


def _with_resume(data_order: str, data_note: str) -> list[dict]:
    events = load_events("cpu_two_attempts.jsonl")
    hello_2 = next(i for i, e in enumerate(events) if e["type"] == "hello" and e["attempt"] == 2)
    resume = {
        "v": 1, "type": "resume", "seq": events[hello_2]["seq"] + 1, "t": events[hello_2]["t"],
        "attempt": 2, "from_step": 45, "from_micro_step": 45, "checkpoint": "/r/ckpt-45",
        "position": 11520, "data_order": data_order, "data_note": data_note, "lost_steps": 0,
    }
    for later in events[hello_2 + 1 :]:
        later["seq"] += 1
    return [*events[: hello_2 + 1], resume, *events[hello_2 + 1 :]]


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
