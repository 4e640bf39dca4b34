"""Attempts side by side at 80x24, and a change waiting for `r` in view in every view.

Comparing attempts is the point of `r`: on the design size, the current attempt and the
one before it show, each with its own figures, and what tells their settings apart. The
figures asserted are the fixtures' own numbers (tests/app/data/make_fixtures.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Input

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.screens.settings import field_id
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.follow.link import ReplayLink

from .conftest import SIZE, frozen_clock_for, load_events, make_app, settle

THREE_ENDED = "cpu_three_attempts_ended.jsonl"
WORKERS_RELAUNCHED = "cpu_two_workers_relaunched.jsonl"


def rows(app: GpuwatchApp) -> dict[int, list[str]]:
    """The attempts table's rows by attempt number, split into their columns."""
    lines = app.query_one(AttemptsPanel).plain.splitlines()[1:]
    return {int(cols[0]): cols for line in lines if (cols := line.split()) and cols[0].isdigit()}


def visible(app: GpuwatchApp, widget: Any) -> bool:
    """On screen, whole: displayed, with every row inside the terminal."""
    region = widget.region
    return bool(widget.display and region.height and region.y >= 0
                and region.bottom <= app.size.height)


def attempts_fit(app: GpuwatchApp) -> None:
    panel = app.query_one(AttemptsPanel)
    assert visible(app, panel)
    lines = panel.plain.splitlines()
    assert all(len(line) <= panel.content_size.width for line in lines), lines
    assert len(lines) <= panel.content_size.height, lines
    # Nothing of it under the pending line and the footer.
    assert panel.region.bottom <= app.query_one(PendingBar).region.y


async def test_an_ended_three_attempt_run_shows_the_last_two_with_what_differs():
    app, link = make_app(THREE_ENDED)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        attempts_fit(app)
        shown = rows(app)
        assert {2, 3} <= set(shown), app.query_one(AttemptsPanel).plain
        # Their medians: 256 examples per 130 ms and per 100 ms steps (+/- 6 ms in pairs).
        assert shown[2][1] == "autotune" and shown[3][1] == "autotune"
        medians = {n: float(cols[5].replace(",", "")) for n, cols in shown.items()}
        assert medians[2] == pytest.approx(256 / 0.130, rel=0.01)
        assert medians[3] == pytest.approx(256 / 0.100, rel=0.01)
        # Prefetch, accumulation and batch read alike: the settings that differ are said,
        # each attempt's values in row order.
        text = app.query_one(AttemptsPanel).plain
        order = sorted(shown)
        spe = {1: "1", 2: "1", 3: "8"}
        max_steps = {1: "150", 2: "300", 3: "450"}
        assert "/".join(max_steps[n] for n in order) in text, text
        assert "/".join(spe[n] for n in order) in text, text


async def test_the_multiworker_view_after_r_shows_both_attempts_and_their_parallel_calls():
    app, link = make_app(WORKERS_RELAUNCHED)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        attempts_fit(app)
        shown = rows(app)
        assert set(shown) == {1, 2}, app.query_one(AttemptsPanel).plain
        # The worker that waits most: 38.0 % before, 5.0 % after (worker 1 both times).
        assert shown[1][7:9] == ["38.0%", "w1"] and shown[2][7:9] == ["5.0%", "w1"]
        text = app.query_one(AttemptsPanel).plain
        assert "1/autotune" in text or ("parallel 1" in text and "parallel autotune" in text)


def straggling_app() -> tuple[GpuwatchApp, ReplayLink]:
    """cpu_two_workers_relaunched whose relaunch did not help worker 1: it still waits
    76 ms of its 200 ms steps, so the workers panel keeps the straggler's lines."""
    events = load_events(WORKERS_RELAUNCHED)
    for event in events:
        if event["type"] == "step" and event["attempt"] == 2 and event.get("worker") == 1:
            event["input_wait_ms"] = 76.0
    link = ReplayLink(events, batch_size=50)
    return GpuwatchApp(link, clock=frozen_clock_for(events)), link


async def test_a_straggler_still_named_leaves_both_attempts_in_view():
    app, link = straggling_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert "straggler" in app.query_one("#workers").plain
        attempts_fit(app)
        assert set(rows(app)) == {1, 2}, app.query_one(AttemptsPanel).plain


async def test_a_clusters_current_attempt_stays_in_view_under_a_wrapped_devices_panel():
    # Attempt 1 of the straggling run alone: NVML's message wraps at 80 columns and the
    # straggler takes two lines; the devices panel gives its rows beyond the first two.
    events = load_events(WORKERS_RELAUNCHED)
    events = events[: next(i for i, e in enumerate(events) if e["type"] == "attempt"
                           and e["attempt"] == 2)]
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert "straggler" in app.query_one("#workers").plain
        assert "No NVIDIA GPU found" in app.query_one("#devices").plain
        attempts_fit(app)
        assert set(rows(app)) == {1}, app.query_one(AttemptsPanel).plain


FIXTURES = ["cpu_one_attempt.jsonl", "cpu_two_attempts.jsonl", "cpu_two_workers.jsonl",
            WORKERS_RELAUNCHED, THREE_ENDED, "cpu_crashed.jsonl", "gpu_eight.jsonl",
            "gpu_running.jsonl", "cpu_settings_changed.jsonl", "straggling"]


@pytest.mark.parametrize("fixture", FIXTURES)
async def test_a_change_made_in_the_settings_screen_is_pending_in_view(fixture: str):
    app, link = straggling_app() if fixture == "straggling" else make_app(fixture)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        bar = app.query_one(PendingBar)
        assert visible(app, bar) and "no pending changes" in bar.plain
        await pilot.press("e")
        key = "data.parallel_calls"
        field = app.screen.query_one(f"#{field_id(key)}", Input)
        running = field.value
        field.value = "3" if running != "3" else "5"
        await pilot.press("enter")
        await settle(app, link, pilot)
        assert app.pending.get(key) in (3, 5), app.pending
        assert visible(app, bar), bar.region
        assert bar.plain.startswith("pending"), bar.plain
        assert "paralle" in bar.plain and "r " in bar.plain, bar.plain


async def test_a_relaunch_that_changed_steps_per_execution_shows_both_attempts_while_running():
    # The demo at 80x24 while it runs: the attempts panel holds its header and two lines.
    # The relaunch changed steps_per_execution only (besides prefetch): it fits as a column
    # ("spe"), with the longest "ended" word, so the attempt before stays in view beside the
    # current one (seen in tmux: only attempt 2, and no word of what differed; then, with a
    # longer label, attempt 1 alone, its "ended" word wrapped onto the second line).
    frames = load_events("cpu_two_attempts.jsonl")
    for frame in frames:
        if frame["type"] == "attempt" and frame["attempt"] == 2:
            frame["settings"]["train"]["steps_per_execution"] = 8
    link = ReplayLink(frames, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(frames))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        attempts_fit(app)
        panel = app.query_one(AttemptsPanel)
        shown = rows(app)
        assert set(shown) == {1, 2}, panel.plain
        header = panel.plain.splitlines()[0].split()
        column = header.index("spe")
        assert (shown[1][column], shown[2][column]) == ("1", "8"), panel.plain
        assert shown[1][-1] == "sigterm" and shown[2][-1] == "running", panel.plain
