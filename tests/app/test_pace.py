"""The dashboard holds itself under its CPU budget: the figures repaint less often while
its own CPU time would take more than its share of a core, and as often again after."""

from __future__ import annotations

import itertools

import pytest

from gpuwatch.app import painters
from gpuwatch.app.repaint import (
    HIGH_SHARE,
    LOW_SHARE,
    MAX_INTERVAL_S,
    MAX_PACE_STEP,
    OVER_JUDGEMENTS,
    PACE_STEP,
    PACE_WINDOW_S,
    Pace,
)
from gpuwatch.app.widgets.header import HeaderBar, header_text
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.runstate import RunState

from .conftest import SIZE, Waiter, make_app

BASE, FLOOR, BUDGET = 0.2, 0.4, 2.0


def feed(pace: Pace, seconds: int, pct: float, start: tuple[float, float] = (0.0, 0.0)
         ) -> tuple[tuple[float, float], list[float]]:
    """Once a second for `seconds`, the CPU growing at pct % of a core; the intervals."""
    now, cpu = start
    intervals = []
    for _ in range(seconds):
        now += 1.0
        cpu += pct / 100.0
        pace.observe(now, cpu)
        intervals.append(pace.interval_s)
    return (now, cpu), intervals


def test_no_budget_never_changes_the_interval():
    pace = Pace(BASE, None, floor_s=FLOOR)
    _, intervals = feed(pace, 60, 50.0)
    assert set(intervals) == {BASE} and not pace.paced


def test_a_start_up_burst_is_not_judged():
    """The first PACE_WINDOW_S seconds (start-up, the record's fold) say nothing."""
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    _, intervals = feed(pace, int(PACE_WINDOW_S) - 1, 80.0)
    assert set(intervals) == {BASE}


def test_over_budget_it_slows_from_the_paced_reads_up_to_the_longest():
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    _, intervals = feed(pace, 120, 10.0)
    changes = [b for a, b in zip([BASE, *intervals], intervals, strict=False) if a != b]
    # The first step starts from what the base comes to with reads every FLOOR s; 10 % of
    # a core is far over the budget: each step is the longest one.
    assert changes[0] == pytest.approx(FLOOR * MAX_PACE_STEP)
    assert all(b == pytest.approx(min(MAX_INTERVAL_S, a * MAX_PACE_STEP))
               for a, b in itertools.pairwise(changes))
    assert intervals[-1] == MAX_INTERVAL_S and pace.paced
    assert pace.last_pct == pytest.approx(10.0)


def test_just_over_the_budget_it_takes_the_shortest_step():
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    _, intervals = feed(pace, int(PACE_WINDOW_S) + OVER_JUDGEMENTS, BUDGET * HIGH_SHARE * 1.05)
    assert intervals[-1] == pytest.approx(FLOOR * PACE_STEP)


def test_one_judgement_over_the_budget_changes_nothing():
    """Over for fewer than OVER_JUDGEMENTS in a row (a window tipped over by noise), then
    back under: the pace stays."""
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    clocks, _ = feed(pace, int(PACE_WINDOW_S), BUDGET * 0.9)
    for _ in range(5):  # each over-budget second is followed by one well under it
        clocks, over = feed(pace, 1, BUDGET * 1.5, clocks)
        clocks, under = feed(pace, 1, BUDGET * 0.3, clocks)
        assert over + under == [BASE, BASE]


def test_within_the_band_it_holds_and_under_it_returns_to_the_base():
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    clocks, intervals = feed(pace, 40, 5.0)
    held = intervals[-1]
    assert held > FLOOR
    between = BUDGET * (HIGH_SHARE + LOW_SHARE) / 2
    clocks, intervals = feed(pace, 30, between, clocks)
    assert set(intervals) == {held}  # neither over HIGH_SHARE nor under LOW_SHARE
    _, intervals = feed(pace, 120, BUDGET * LOW_SHARE / 2, clocks)
    assert intervals[-1] == BASE and not pace.paced
    shorter = [b for a, b in zip([held, *intervals], intervals, strict=False) if a != b]
    assert shorter[-1] == BASE and all(b < a for a, b in zip([held, *shorter], shorter,
                                                             strict=False))


def test_after_a_restart_it_waits_a_whole_window_again():
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    clocks, _ = feed(pace, 10, 0.5)
    pace.restart(clocks[0])
    _, intervals = feed(pace, int(PACE_WINDOW_S) - 1, 90.0, clocks)
    assert set(intervals) == {BASE}


def test_each_judgement_is_of_the_pace_it_ran_at():
    """After a change the window starts afresh: what the old pace cost is not held
    against the new one (no run-away lengthening from one burst)."""
    pace = Pace(BASE, BUDGET, floor_s=FLOOR)
    clocks, _ = feed(pace, int(PACE_WINDOW_S) + OVER_JUDGEMENTS, 20.0)  # a burst: one step
    assert pace.interval_s == pytest.approx(FLOOR * MAX_PACE_STEP)
    _, intervals = feed(pace, 2, 0.1, clocks)  # quiet at once: too soon to judge
    assert intervals == [pytest.approx(FLOOR * MAX_PACE_STEP)] * 2


def test_the_header_says_the_figures_are_paced_and_drops_it_with_the_elapsed_time():
    state = RunState()
    state.run_id, state.status = "1124-abcd", "running"
    assert "refresh " not in header_text(state, 0.0, 80).plain
    assert "refresh 1.2s" in header_text(state, 0.0, 80, 1.25).plain
    narrow = header_text(state, 0.0, 24, 1.25).plain
    assert "refresh " not in narrow and "running" in narrow


class FakeClocks:
    """A wall clock and a CPU clock the test moves: each tick a second, at `pct`."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.pct = 0.0

    def tick(self) -> None:
        self.wall += 1.0
        self.cpu += self.pct / 100.0


async def test_the_app_slows_its_figures_over_budget_and_says_so(monkeypatch):
    """The real app: its own CPU clock (made up here) over budget lengthens the figures'
    rate in the schedule and the header shows it; back under, both return."""
    app, link = make_app("cpu_one_attempt.jsonl", cpu_budget_pct=BUDGET)
    clocks = FakeClocks()
    repainter = app.repainter
    repainter.pace_clocks = (lambda: clocks.wall, lambda: clocks.cpu)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook):
        await link.wait_idle()
        figures = next(p for p in repainter.schedule.painters if p.name == "figures")
        assert figures.areas["metrics"].every_s == painters.RENDER_INTERVAL_S
        clocks.pct = 10.0
        for _ in range(30):
            clocks.tick()
            repainter.tick()
        paced = repainter.pace.interval_s
        assert paced > painters.READ_INTERVAL_S
        assert figures.areas["metrics"].every_s == paced
        # The views that move slow down too, where the pace is slower than their own rate.
        gpus = next(p for p in repainter.schedule.painters if p.name == "gpus")
        history = next(p for p in repainter.schedule.painters if p.name == "history")
        assert gpus.areas["gpu_history"].every_s == max(painters.HISTORY_INTERVAL_S, paced)
        assert history.areas["history"].every_s == max(painters.SLOW_REPAINT_S, paced)
        # The clock goes at the pace too (the header's elapsed time moves every `paced`
        # seconds); what a person did or must see at once (a key's pending change, the
        # link, the run's status) is never slowed.
        assert figures.areas["tick"].every_s == paced
        assert figures.areas["status"].every_s == painters.RENDER_INTERVAL_S
        pending = next(p for p in repainter.schedule.painters if p.name == "pending")
        header = next(p for p in repainter.schedule.painters if p.name == "header")
        assert {r.every_s for r in (*pending.areas.values(), header.areas["header"],
                                    header.areas["link"])} == {painters.RENDER_INTERVAL_S}
        await waiter.until(lambda: "refresh " in app.query_one(HeaderBar).plain, "the paced mark")
        assert f"refresh {paced:.1f}s" in app.query_one(HeaderBar).plain
        assert "step" in app.query_one(MetricsPanel).plain
        clocks.pct = 0.1
        for _ in range(200):
            clocks.tick()
            repainter.tick()
        assert figures.areas["metrics"].every_s == painters.RENDER_INTERVAL_S
        assert gpus.areas["gpu_history"].every_s == painters.HISTORY_INTERVAL_S
        assert history.areas["history"].every_s == painters.SLOW_REPAINT_S
        await waiter.until(lambda: "refresh " not in app.query_one(HeaderBar).plain, "unpaced")


async def test_without_a_budget_the_app_never_paces():
    app, link = make_app("cpu_one_attempt.jsonl")
    clocks = FakeClocks()
    app.repainter.pace_clocks = (lambda: clocks.wall, lambda: clocks.cpu)
    async with app.run_test(size=SIZE):
        await link.wait_idle()
        clocks.pct = 90.0
        for _ in range(30):
            clocks.tick()
            app.repainter.tick()
        assert not app.repainter.pace.paced


def test_the_cli_dashboard_has_the_budget(monkeypatch, tmp_path):
    """run_dashboard (attach, train, run) gives the app the budget; tests opt in."""
    from gpuwatch import app as app_package
    from gpuwatch.app import app as app_module
    from gpuwatch.app.repaint import CPU_BUDGET_PCT

    made: list[dict] = []

    class Recorded:
        def __init__(self, link, **kwargs):
            made.append(kwargs)

        def run(self):
            return "detach"

    monkeypatch.setattr(app_module, "GpuwatchApp", Recorded)
    link, _ = make_app("cpu_one_attempt.jsonl")[1], None
    assert app_package.run_dashboard(tmp_path, "1124-abcd", link=link) == "detach"
    assert made[0]["cpu_budget_pct"] == CPU_BUDGET_PCT == 2.0


async def test_the_clocks_tick_repaints_the_figures_only_while_no_step_comes():
    """While steps come the figures repaint with them, not once more a second with the
    clock; once no step has come for a while, each tick counts "no step for N s" on."""
    from .conftest import load_events

    events = load_events("gpu_running.jsonl")
    last_t = max(float(e.get("t") or 0.0) for e in events)
    now = [last_t]
    app, link = make_app("gpu_running.jsonl")
    app.clock = lambda: now[0]
    async with app.run_test(size=SIZE) as pilot:
        await link.wait_idle()
        await pilot.pause()
        app.refresh_view(flush=True)
        figures = next(p for p in app.repainter.schedule.painters if p.name == "figures")
        painted = []
        paint = figures.paint
        figures.paint = lambda: (painted.append(now[0]), paint())[1]
        for _ in range(2):
            app.repainter.tick()
            await pilot.pause(1.2)  # the clock's rate: any repaint it causes comes by now
        assert painted == [] and "no step for" not in app.query_one(MetricsPanel).plain
        now[0] = last_t + 120.0
        app.repainter.tick()
        await pilot.pause(1.2)  # the clock's rate: a repaint within a second
        assert painted, "no repaint once no step came"
        assert "no step for 120 s" in app.query_one(MetricsPanel).plain
