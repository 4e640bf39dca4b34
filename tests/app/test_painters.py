"""The app's repaints follow the state at their rates, with no explicit refresh."""

from __future__ import annotations

from typing import Any

from gpuwatch.app import painters
from gpuwatch.app.repaint import Painter, Rate
from gpuwatch.app.widgets.panels import HistoryPanel, MetricsPanel

from .conftest import SIZE, Waiter, load_events, make_app


def later_steps(events: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`count` more steps of the fixture's last attempt, after its last seq and step."""
    last = max(e["seq"] for e in events)
    template = [e for e in events if e["type"] == "step"][-1]
    return [
        dict(template, seq=last + 1 + i, step=template["step"] + 1 + i, t=template["t"] + i)
        for i in range(count)
    ]


async def test_a_slow_view_catches_up_on_its_own_while_figures_repaint_per_batch(monkeypatch):
    monkeypatch.setattr(painters, "SLOW_REPAINT_S", 0.5)
    app, link = make_app("cpu_one_attempt.jsonl")
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook):
        await link.wait_idle()
        history = app.query_one(HistoryPanel)
        # The fixture: 45 steps, the first 5 warm-up.
        await waiter.until(lambda: counted(history.border_title) == 40, "the replay's history")
        before = history.border_title
        steps = later_steps(load_events("cpu_one_attempt.jsonl"), 3)
        link.push(steps)
        shown = f"step {steps[-1]['step']:,}"
        await waiter.until(lambda: shown in app.query_one(MetricsPanel).plain, "the figures")
        # The history's title counts its steps: it catches up by its own timer.
        await waiter.until(lambda: history.border_title != before, "the history")
        assert counted(history.border_title) == counted(before) + 3


def counted(title: str | None) -> int:
    """N of "history: last N steps after warm-up, all attempts"."""
    if title is None or not title.startswith("history: last "):
        return -1
    return int(title.split()[2])


async def test_an_added_part_repaints_only_when_an_area_it_reads_changes():
    events = load_events("gpu_running.jsonl")
    app, link = make_app("gpu_running.jsonl")
    waiter = Waiter()
    painted: list[int] = []
    async with app.run_test(size=SIZE, message_hook=waiter.hook):
        await link.wait_idle()
        app.repainter.add(Painter("gpu history", {"devices": Rate(0.1)}, lambda: painted.append(1)))
        await waiter.until(lambda: len(painted) == 1, "its first paint")
        steps = later_steps(events, 2)
        link.push(steps)
        shown = f"step {steps[-1]['step']:,}"
        await waiter.until(lambda: shown in app.query_one(MetricsPanel).plain, "the figures")
        assert len(painted) == 1  # steps are not what it reads
        sample = dict(
            next(e for e in reversed(events) if e["type"] == "sample"),
            seq=steps[-1]["seq"] + 1,
        )
        link.push([sample])
        await waiter.until(lambda: len(painted) == 2, "a repaint for the new sample")
