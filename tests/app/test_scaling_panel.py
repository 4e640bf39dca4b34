"""The scaling probe on the dashboard: its table and efficiency plot, at 80x24.

The fixture (tests/app/data/cpu_scale.jsonl, make_fixtures.cpu_scale) is a probe at 1, 2
and 4 logical CPU replicas on 2 cores, the third count still running. The figures on
screen are checked against the fixture's steps, worked out here by hand: each count's
median examples/s after the warm-up, the ratios to one replica, and the shares of the
step's parts over the measured steps.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.scaling import EfficiencyChart, ScalingPanel, table_text
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.measures.scaling import scaling_rows
from gpuwatch.runstate import RunState

from .conftest import load_events, make_app, settle

FIXTURE = "cpu_scale.jsonl"
WARMUP_STEPS = 5


def by_hand() -> dict[int, dict[str, Any]]:
    """Each attempt's count, median examples/s after warm-up and its parts' shares in %."""
    figures: dict[int, dict[str, Any]] = {}
    for event in load_events(FIXTURE):
        if event["type"] == "attempt":
            figures[event["attempt"]] = {"count": event["settings"]["strategy"]["replicas"],
                                         "steps": []}
        elif event["type"] == "step":
            figures[event["attempt"]]["steps"].append(event)
    for one in figures.values():
        measured = one.pop("steps")[WARMUP_STEPS:]
        rates = [e["examples"] * 1000.0 / e["step_time_ms"] for e in measured]
        one["rate"] = statistics.median(rates)
        one["interval"] = median_interval(rates)
        total = sum(e["step_time_ms"] for e in measured)
        parts = {part: sum(e[key] for e in measured) for part, key in (
            ("in", "input_wait_ms"), ("comp", "compute_ms"), ("sync", "sync_ms"),
            ("upd", "update_ms"))}
        parts["oth"] = total - sum(parts.values())
        one["shares"] = {part: 100.0 * ms / total for part, ms in parts.items()}
    return {one["count"]: one for one in figures.values()}


def median_interval(values: list[float]) -> tuple[float, float]:
    """The median's 97.5 % order-statistics interval, by hand: the r-th smallest and r-th
    largest value for the largest r whose binomial tails, 2 P(B <= r - 1), stay within
    2.5 % (B ~ Binomial(n, 1/2))."""
    n, ordered = len(values), sorted(values)
    r = 0
    while 2 * sum(math.comb(n, i) for i in range(r + 1)) / 2**n <= 0.025:
        r += 1
    assert r >= 1, n
    return ordered[r - 1], ordered[n - r]


def table_rows(text: str) -> dict[int, dict[str, str]]:
    lines = text.splitlines()
    head = lines[0].split()
    rows = {}
    for line in lines[1:]:
        cells = line.split()
        if cells and cells[0].rstrip("*").isdigit():
            rows[int(cells[0].rstrip("*"))] = dict(zip(head, cells, strict=False))
    return rows


async def test_the_probe_shows_its_table_and_plot_instead_of_the_attempts() -> None:
    app, link = make_app(FIXTURE)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, link, pilot)
        screen = app.screen
        assert screen.has_class("-scale")
        panel = app.query_one(ScalingPanel)
        assert panel.display and panel.region.height >= 12
        assert not app.query_one(AttemptsPanel).display
        assert not app.query_one(HistoryPanel).display
        # Its rows' window first (each count's attempt after warm-up), then the probe.
        assert panel.border_title is not None and panel.border_title.startswith(
            "scaling (attempt medians): weak scaling (the per-replica batch kept) over "
            "replicas 1,2,4")
        text = app.query_one("#scaling-table", StatePanel).plain
        rows = table_rows(text)
        truth = by_hand()
        base = truth[1]["rate"]
        for count in (1, 2, 4):
            row, want = rows[count], truth[count]
            assert row["ex/s"] == f"{want['rate']:,.0f}", (count, text)
            assert row["speed"] == f"{want['rate'] / base:.2f}"
            assert row["eff"] == f"{100 * want['rate'] / (count * base):.0f}%"
            for part in ("in", "comp", "sync", "upd", "oth"):
                assert row[part] == f"{want['shares'][part]:.0f}%", (count, part, text)
        assert text.splitlines()[3].lstrip().startswith("4*")  # 4 replicas on 2 cores
        assert "* 4 logical CPU replicas share 2 cores" in text
        # 4 replicas against 1: its lowest rate over 1's highest, its highest over 1's lowest.
        low = truth[4]["interval"][0] / (4 * truth[1]["interval"][1])
        high = truth[4]["interval"][1] / (4 * truth[1]["interval"][0])
        assert (f"poor scaling: {100 * truth[4]['rate'] / (4 * base):.0f}% "
                f"({100 * low:.0f}-{100 * high:.0f}%) efficiency at 4 replicas") in text
        assert "poor scaling: 44% (41-48%) efficiency at 4 replicas (below 80%)" in text
        assert "all-reduce grew most" in text
        chart = app.query_one(EfficiencyChart)
        counts, values = chart.points
        assert counts == [1.0, 2.0, 4.0]
        assert values == pytest.approx(
            [100.0 * truth[n]["rate"] / (n * base) for n in (1, 2, 4)])
        assert chart.values == (0.0, 100.0) and chart.steps == (1.0, 4.0)
        # Every line of the table fits the panel: nothing cut at 80 columns.
        table = app.query_one("#scaling-table", StatePanel)
        assert max(len(line) for line in text.splitlines()[:4]) <= table.content_size.width


async def test_before_any_count_is_measured_the_rows_wait_and_nothing_breaks() -> None:
    from gpuwatch.app.app import GpuwatchApp
    from gpuwatch.follow.link import ReplayLink

    events = load_events(FIXTURE)
    first_step = next(i for i, e in enumerate(events) if e["type"] == "step")
    head = events[:first_step]  # the plan, attempt 1 started, its hello: no step yet
    link = ReplayLink(head, batch_size=50)
    app = GpuwatchApp(link, clock=lambda: head[-1]["t"])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, link, pilot)
        rows = table_rows(app.query_one("#scaling-table", StatePanel).plain)
        assert [(n, row["ex/s"]) for n, row in rows.items()] == [
            (1, "running"), (2, "waiting"), (4, "waiting")]
        chart = app.query_one(EfficiencyChart)
        assert chart.points == ([], []) and chart.values == (0.0, 100.0)


def test_a_wide_panel_shows_each_counts_efficiency_interval() -> None:
    state = RunState()
    for event in load_events(FIXTURE):
        state.apply(event)
    assert state.scale is not None
    text = table_text(state.scale, scaling_rows(state), 120, running=3).plain
    rows, truth = table_rows(text), by_hand()
    assert rows[1]["interval"] == "100-100%"  # the smallest count against itself
    for count in (2, 4):
        # The count's lowest rate over 1's highest, its highest over 1's lowest.
        low = truth[count]["interval"][0] / (count * truth[1]["interval"][1])
        high = truth[count]["interval"][1] / (count * truth[1]["interval"][0])
        assert rows[count]["interval"] == f"{100 * low:.0f}-{100 * high:.0f}%", text
