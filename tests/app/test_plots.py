"""The plots screen (g): the whole run against step, per attempt, from the recorded steps.

Ground truth is computed here from the fixture's step events, not from the app.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from textual_plotext import PlotextPlot

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.screens.modals import KeysScreen
from gpuwatch.app.screens.plots import CHARTS, TIME_CHARTS, PlotsScreen, attempt_colour
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate import WARMUP_STEPS

from .conftest import SIZE, frozen_clock_for, load_events, make_app, settle

pytest.importorskip("pytest_textual_snapshot", reason="pytest-textual-snapshot not installed")

BIG = (160, 48)


def expected_series(events: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
    """Each chart's (steps, values) for one attempt, straight from its step events."""
    steps = [e for e in events if e["type"] == "step" and e["attempt"] == attempt]
    timed = steps[WARMUP_STEPS:]  # the first steps of an attempt trace: not timed
    return {
        "examples_per_s": (
            [float(e["step"]) for e in timed],
            [e["examples"] * 1000.0 / e["step_time_ms"] for e in timed],
        ),
        "input_wait_pct": (
            [float(e["step"]) for e in timed],
            [100.0 * e["input_wait_ms"] / e["step_time_ms"] for e in timed],
        ),
        "step_time_ms": ([float(e["step"]) for e in timed], [e["step_time_ms"] for e in timed]),
        "loss": ([float(e["step"]) for e in steps], [e["loss"] for e in steps]),
    }


def approx_series(series: dict[str, Any]) -> dict[str, Any]:
    return {key: (steps, pytest.approx(values)) for key, (steps, values) in series.items()}


async def test_g_opens_the_plots_and_g_or_escape_goes_back():
    app, link = make_app("cpu_two_attempts.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        assert isinstance(app.screen, PlotsScreen)
        assert len(app.screen.query(PlotextPlot)) == len(CHARTS) == 4
        await pilot.press("g")
        assert not isinstance(app.screen, PlotsScreen)
        await pilot.press("g")
        await pilot.press("escape")
        assert not isinstance(app.screen, PlotsScreen)


async def test_the_plotted_series_are_each_attempts_steps():
    events = load_events("cpu_two_attempts.jsonl")
    app, link = make_app("cpu_two_attempts.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, PlotsScreen)
        for attempt in (1, 2):
            plotted = {key: screen.plotted[key][attempt] for key, _ in CHARTS}
            assert plotted == approx_series(expected_series(events, attempt))
        # Attempt 2 starts at the step after attempt 1's checkpoint: its line is there.
        first_of_2 = next(e["step"] for e in events if e["type"] == "step" and e["attempt"] == 2)
        assert screen.boundaries == [(2, first_of_2)] == [(2, 46)]
        legend = screen.query_one("#plots-legend", StatePanel).plain
        assert legend.startswith("━━ attempt 1  ━━ attempt 2  │ attempt starts")
        # One colour per attempt, the same in the legend and the charts.
        assert attempt_colour(1) != attempt_colour(2)


def expected_time_split(events: list[dict[str, Any]], attempt: int) -> dict[str, Any]:
    """The time page's (steps, values) for one attempt: each part's share of each step after
    warm-up, straight from its step events (their parts sum to no more than the step)."""
    timed = [e for e in events if e["type"] == "step" and e["attempt"] == attempt]
    timed = timed[WARMUP_STEPS:]
    steps = [float(e["step"]) for e in timed]

    def share(key: str) -> list[float]:
        return [100.0 * e[key] / e["step_time_ms"] for e in timed]

    return {"input_wait_pct": (steps, share("input_wait_ms")),
            "compute_pct": (steps, share("compute_ms")),
            "sync_pct": (steps, share("sync_ms")),
            "update_pct": (steps, share("update_ms"))}


async def test_t_shows_where_each_steps_time_went_and_t_goes_back():
    events = load_events("cpu_two_attempts.jsonl")
    app, link = make_app("cpu_two_attempts.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, PlotsScreen)
        assert screen.check_action("page", ("time",)) and not screen.check_action(
            "page", ("figures",))
        await pilot.press("t")
        await pilot.pause()
        assert app.screen is screen and screen.page == "time"
        assert [k for k, _ in screen.charts] == [k for k, _ in TIME_CHARTS] == [
            "input_wait_pct", "compute_pct", "sync_pct", "update_pct"]
        assert [t for _, t in TIME_CHARTS] == [
            "input wait %", "compute %", "all-reduce %", "update %"]
        assert len(screen.query(PlotextPlot)) == 4
        for attempt in (1, 2):
            plotted = {key: screen.plotted[key][attempt] for key, _ in TIME_CHARTS}
            assert plotted == approx_series(expected_time_split(events, attempt))
        assert screen.boundaries == [(2, 46)]  # the attempts' line on these charts too
        legend = screen.query_one("#plots-legend", StatePanel).plain
        assert legend.endswith("· x: step · y: % of each step")
        assert not screen.check_action("page", ("time",))  # the footer offers the way back
        await pilot.press("t")
        await pilot.pause()
        assert screen.page == "figures" and set(screen.plotted) == {k for k, _ in CHARTS}
        # The footer keeps to the plots' keys; the dashboard's setting keys still work.
        shown = {b.binding.key for b in screen.active_bindings.values() if b.binding.show}
        assert shown == {"escape", "t", "s", "l", "question_mark", "q"}
        await pilot.press("p")
        assert app.pending
        await pilot.press("escape")
        assert not isinstance(app.screen, PlotsScreen)


async def test_the_plots_repaint_at_most_once_per_interval_and_not_when_closed(monkeypatch):
    events = load_events("gpu_eight.jsonl")
    attempt_2 = next(
        i for i, e in enumerate(events) if e["type"] == "attempt" and e["attempt"] == 2
    )
    later = next(i for i, e in enumerate(events) if e["type"] == "step" and e["step"] == 120)
    calls: list[int] = []
    original = PlotsScreen.show_state

    def counted(screen: PlotsScreen, state: Any) -> None:
        calls.append(len(state.run_history.loss.buckets))
        original(screen, state)

    monkeypatch.setattr(PlotsScreen, "show_state", counted)
    link = ReplayLink(events[:attempt_2], batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events), history_interval_s=3600.0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, PlotsScreen)
        assert calls == [60] and set(screen.plotted["loss"]) == {1}  # drawn on opening
        link.push(events[attempt_2:later])
        await link.wait_idle()
        await pilot.pause()
        app.refresh_view()
        assert calls == [60]  # its turn has not come: the charts wait
        app.refresh_view(flush=True)
        assert calls == [60, 119] and set(screen.plotted["loss"]) == {1, 2}
        await pilot.press("escape")
        link.push(events[later:])
        await link.wait_idle()
        await pilot.pause()
        app.refresh_view(flush=True)
        assert calls == [60, 119]  # closed: never drawn
        assert "plots" not in app.repainter.pending_areas()


async def test_the_dashboard_waits_while_the_plots_are_open_and_catches_up_after():
    events = load_events("cpu_crashed.jsonl")
    crash = next(i for i, e in enumerate(events) if e["type"] == "error")
    link = ReplayLink(events[:crash], batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        link.push(events[crash:])
        await settle(app, link, pilot)
        # Hidden, the dashboard is not repainted (it would repaint the plots over it).
        assert not app.query_one(CrashPanel).plain
        assert "status" in app.repainter.pending_areas()
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen.has_class("-crashed")
        assert app.query_one(CrashPanel).display
        assert app.query_one(CrashPanel).plain.startswith("crashed: trainer exited with code 1")


async def test_a_crash_under_a_modal_screen_marks_the_dashboard():
    events = load_events("cpu_crashed.jsonl")
    crash = next(i for i, e in enumerate(events) if e["type"] == "error")
    link = ReplayLink(events[:crash], batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("question_mark")  # the keys screen: a modal over the dashboard
        assert isinstance(app.screen, KeysScreen)
        link.push(events[crash:])
        await settle(app, link, pilot)
        assert app.default_screen.has_class("-crashed")
        assert not app.screen.has_class("-crashed")
        await pilot.press("escape")
        await pilot.pause()
        assert app.query_one(CrashPanel).display


def shot(snap_compare: Any, size: tuple[int, int]) -> bool:
    app, link = make_app("gpu_eight.jsonl")

    async def run_before(pilot: Any) -> None:
        await settle(app, link, pilot)
        await pilot.press("g")
        await pilot.pause()

    return bool(snap_compare(app, terminal_size=size, run_before=run_before))


def test_plots_80x24(snap_compare):
    assert shot(snap_compare, SIZE)


def test_plots_160x48(snap_compare):
    assert shot(snap_compare, BIG)


def test_plots_time_split_80x24(snap_compare):
    # t: where each step's time went, two attempts whose steps were timed apart.
    app, link = make_app("cpu_two_attempts.jsonl")

    async def run_before(pilot: Any) -> None:
        await settle(app, link, pilot)
        await pilot.press("g", "t")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


# -- the axes: whole steps on x, every labelled row on y --------------------------------


def chart_lines(plot: PlotextPlot) -> list[str]:
    """The chart as the terminal shows it, a line per row."""
    return [plot.render_line(y).text for y in range(plot.size.height)]


def first_steps(count: int) -> list[dict[str, Any]]:
    """The one-attempt recording cut after its step `count`: a short run."""
    events = load_events("cpu_one_attempt.jsonl")
    return [e for e in events if e["type"] != "step" or e["step"] <= count]


def truth(events: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one chart, from the step events (one attempt)."""
    steps, values = expected_series(events, 1)[key]
    return steps, values


@pytest.mark.parametrize("height", [24, 26, 30, 40])
@pytest.mark.parametrize("count", [7, 12])
async def test_x_ticks_are_whole_steps_and_every_labelled_row_has_its_label(count, height):
    events = first_steps(count)
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=(80, height)) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        await pilot.pause()
        await pilot.pause()
        for key, title in CHARTS:
            steps, values = truth(events, key)
            lines = chart_lines(app.screen.query_one(f"#plot-{key}", PlotextPlot))
            assert lines[0].strip() == title
            x_axis, x_labels = lines[-2], lines[-1]
            canvas = lines[2:-2]
            # x: whole steps, in the run's range, one label per tick mark.
            ticks = x_labels.split()
            assert ticks and all(tick.isdigit() for tick in ticks), (key, x_labels)
            numbers = [int(tick) for tick in ticks]
            assert numbers == sorted(set(numbers))
            assert min(steps) <= numbers[0] and numbers[-1] <= max(steps), (key, numbers)
            assert x_axis.count("┬") == len(numbers), (key, x_axis, x_labels)
            # y: a label on each marked row and on no other, rows an equal number apart,
            # from the bottom row (the least value) to the greatest value.
            axis_at = lines[1].index("┌")
            labels = [row[:axis_at].strip() for row in canvas]
            marked = [row[axis_at] == "┤" for row in canvas]
            assert [bool(text) for text in labels] == marked, (key, canvas)
            rows = [i for i, text in enumerate(labels) if text]
            assert len(rows) >= 2 and rows[-1] == len(canvas) - 1, (key, rows)
            gaps = {below - above for above, below in itertools.pairwise(rows)}
            assert len(gaps) == 1, (key, "unevenly spaced labels", rows)
            assert rows[0] < gaps.pop(), (key, "the top label is less than a gap below the top")
            least, greatest = float(labels[rows[-1]]), float(labels[rows[0]])
            places = len(labels[rows[0]].partition(".")[2])
            if max(values) > min(values):
                assert least == pytest.approx(min(values), abs=0.5 * 10**-places)
                assert greatest == pytest.approx(max(values), abs=0.5 * 10**-places)
            else:  # a flat series, spread half to one and a half times its value
                assert (least, greatest) == pytest.approx((0.5 * values[0], 1.5 * values[0]))


async def test_a_chart_with_nothing_yet_has_no_ticks_then_whole_steps_once_it_has():
    events = load_events("cpu_one_attempt.jsonl")
    third = next(i for i, e in enumerate(events) if e["type"] == "step" and e["step"] == 3)
    twelfth = next(i for i, e in enumerate(events) if e["type"] == "step" and e["step"] == 12)
    head = events[: third + 1]  # warm-up only: no timed step, the loss has three
    link = ReplayLink(head)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("g")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PlotsScreen)
        rate = screen.query_one("#plot-examples_per_s", PlotextPlot)
        assert not any("┤" in line or "┬" in line for line in chart_lines(rate))
        assert chart_lines(screen.query_one("#plot-loss", PlotextPlot))[-1].split() == [
            "1", "2", "3"
        ]
        link.push(events[third + 1 : twelfth + 1])
        await link.wait_idle()
        await pilot.pause()
        app.refresh_view(flush=True)
        await pilot.pause()
        assert chart_lines(rate)[-1].split() == ["6", "8", "10", "12"]  # timed: 6 to 12
