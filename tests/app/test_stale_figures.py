"""A running run with no step for several step times: its figures read dim, and say so.

The recording's steps take about 200 ms, so its figures go stale after the 5 s floor.
The clock is the app's own (injected); the app's 1 s tick repaints them.
"""

from __future__ import annotations

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.follow.link import ReplayLink

from .conftest import SIZE, Waiter, load_events, settle


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rate_is_dim(panel: MetricsPanel) -> bool:
    """Whether the examples/s figure (the second line's first) is painted dim."""
    (style,) = [seg.style for seg in panel.render_line(1) if "examples/s" in seg.text]
    return bool(style is not None and style.dim)


async def test_figures_go_stale_after_several_step_times_and_come_back_with_a_step():
    events = load_events("cpu_one_attempt.jsonl")
    steps = [e for e in events if e["type"] == "step"]
    last = steps[-1]
    step_ms = last["step_time_ms"]
    assert all(abs(s["step_time_ms"] - step_ms) <= 20 for s in steps[5:])  # ~200 ms
    clock = FakeClock(last["t"] + 1.0)  # a second after the last step: current
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=clock)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(MetricsPanel)
        assert app.state.status == "running"
        assert "no step for" not in panel.plain
        assert "examples/s" in panel.plain
        assert not rate_is_dim(panel)

        clock.now = last["t"] + 14.0  # 14 s without a step: 70 step times
        await waiter.until(lambda: "no step for 14 s" in panel.plain, "the stale mark", 5.0)
        first, figures = panel.plain.splitlines()
        assert first.startswith(f"step {last['step']}") and first.endswith("no step for 14 s")
        assert "examples/s" in figures, "the last figures stay, dim"
        assert rate_is_dim(panel)
        clock.now = last["t"] + 15.0  # the tick counts on
        await waiter.until(lambda: "no step for 15 s" in panel.plain, "the next second", 5.0)

        # A step arrives: current again, not dim.
        nxt = dict(last, seq=events[-1]["seq"] + 1, step=last["step"] + 1, t=clock.now)
        link.push([nxt])
        await waiter.until(
            lambda: f"step {nxt['step']}" in panel.plain, "the new step", 5.0
        )
        assert "no step for" not in panel.plain
        assert not rate_is_dim(panel)


async def test_under_five_seconds_is_no_stall_and_five_is():
    events = load_events("cpu_one_attempt.jsonl")
    last = [e for e in events if e["type"] == "step"][-1]
    clock = FakeClock(last["t"] + 4.9)  # under the 5 s floor (25 step times)
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=clock)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(MetricsPanel)
        app.refresh_view(flush=True)  # painted with the clock as it is now
        await pilot.pause()
        assert "no step for" not in panel.plain and not rate_is_dim(panel)
        clock.now = last["t"] + 5.0
        await waiter.until(lambda: "no step for" in panel.plain, "the stale mark", 5.0)
        assert panel.plain.splitlines()[0].endswith("  no step for 5 s")


async def test_on_a_narrow_panel_the_learning_rate_gives_way_to_the_mark():
    events = load_events("cpu_one_attempt.jsonl")
    last = [e for e in events if e["type"] == "step"][-1]
    clock = FakeClock(last["t"] + 14.0)
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=clock)
    async with app.run_test(size=(50, 24)) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(MetricsPanel)
        first = panel.plain.splitlines()[0]
        assert panel.content_size.width == 48  # padding 0 1
        assert first == f"step {last['step']}  epoch 0  loss {last['loss']:.4f}  no step for 14 s"
        assert len(first) <= 48
