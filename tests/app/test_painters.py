"""The app's repaints follow the state at their rates, with no explicit refresh."""

from __future__ import annotations

from typing import Any

from gpuwatch.app import painters
from gpuwatch.app.repaint import Painter, Rate
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel

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


def test_a_busy_run_repaints_once_per_batch_and_never_in_between():
    """Batches every READ_INTERVAL_S with steps, a device sample every second, the clock
    ticking: every part's repaint joins a batch's; no timer makes a pass of its own (each
    pass repaints the screen: the costliest thing the dashboard does)."""
    from types import SimpleNamespace

    repainter = painters.Repainter(SimpleNamespace(show_pending=lambda: None))  # type: ignore[arg-type]
    schedule = repainter.schedule
    step_areas = ("header", "metrics", "attempts", "history", "plots")
    painted: dict[str, int] = {}
    between = 0
    batch_s = painters.READ_INTERVAL_S
    for k in range(1, 200):
        now = k * batch_s
        changed = list(step_areas)
        if int(now) != int(now - batch_s):  # a sample arrived in this batch; the clock ticked
            changed += ["devices", "gpu_history", "clock"]
        schedule.note(changed)
        for painter in schedule.take_due(now, slack_s=painters.SLACK_S):
            painted[painter.name] = painted.get(painter.name, 0) + 1
        deadline = schedule.next_deadline_s()
        if deadline is not None and deadline < now + batch_s - painters.SLACK_S:
            between += 1
    assert between == 0
    seconds = 199 * batch_s
    # Each at its rate: figures (and every part that shows one) with every batch, the
    # GPUs about once a second, the history about every 2 s.
    assert painted["figures"] == 199
    assert seconds / 1.6 <= painted["gpus"] <= seconds / painters.HISTORY_INTERVAL_S + 1
    assert seconds / 2.8 <= painted["history"] <= seconds / painters.SLOW_REPAINT_S + 1
