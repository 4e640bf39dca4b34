"""Where a step's time went, read off the dashboard at 80x24 (Pilot), against known parts.

The runs are replayed recordings whose steps carry parts set here: the shares the bar's
legend shows, each worker's in a cluster, and the all-reduce's bus bandwidth against the
link are computed by hand from the events fed, never from the app.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from gpuwatch.advisor import format_rate
from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.breakdown import (
    LOOKS,
    bar,
    bar_cells,
    breakdown_lines,
    bus_text,
    legend,
)
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.workers import WorkersPanel
from gpuwatch.follow.link import ReplayLink
from gpuwatch.measures.peaks import LinkPeak
from gpuwatch.runstate import CURRENT_STEPS, WARMUP_STEPS, WORKER_WINDOW_STEPS, Figures
from trainer_runtime.protocol import Breakdown

from .conftest import SIZE, frozen_clock_for, load_events, settle

LEGEND = re.compile(r"([░█▓▒·])([a-z][a-z. -]*[a-z]) (\d+(?:\.\d)?)%")
# A share of the step, the same for every step of cpu_one_attempt.jsonl (its input wait is
# 38.0 % of every step, jitter included): the other parts as fractions of each step.
SHARES = {"input": 38.0, "compute": 30.0, "sync": 20.0, "update": 5.0, "other": 7.0}


def timed(events: list[dict[str, Any]], **fractions: float) -> list[dict[str, Any]]:
    """The events with each step's parts timed apart: each part the given fraction of its
    step time (compute_ms=0.3: 30 % of the step)."""
    out = []
    for event in events:
        if event["type"] == "step":
            ms = event["step_time_ms"]
            event = {**event, **{part: round(ms * share, 6) for part, share in fractions.items()}}
        out.append(event)
    return out


def app_for(events: list[dict[str, Any]]) -> tuple[GpuwatchApp, ReplayLink]:
    link = ReplayLink(events, batch_size=50)
    return GpuwatchApp(link, clock=frozen_clock_for(events)), link


def legend_of(metrics: str) -> dict[str, tuple[str, float]]:
    """The legend's parts as shown, the line under the bar: {label: (glyph, share %)}."""
    line = metrics.splitlines()[3]
    return {label: (glyph, float(pct)) for glyph, label, pct in LEGEND.findall(line)}


def bar_of(metrics: str) -> str:
    """The bar: the glyphs that open the line after the figures."""
    line = metrics.splitlines()[2]
    return line[: len(line) - len(line.lstrip("░█▓▒·"))]


async def test_the_bar_shows_each_parts_share_as_the_steps_measured_it():
    events = timed(load_events("cpu_one_attempt.jsonl"), compute_ms=0.30, sync_ms=0.20,
                   update_ms=0.05)
    app, link = app_for(events)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(MetricsPanel)
        metrics = panel.plain
        lines = metrics.splitlines()
        assert len(lines) == 4 and all(len(line) <= panel.content_size.width for line in lines)
        # The figures as they were: the breakdown is beside them, not instead.
        # (At 80 columns "of step time" gives way to the window's words.)
        assert lines[1] == (
            f"last {CURRENT_STEPS} steps: 1,283 examples/s  200 ms per step  input wait 38.0%")
        shown = legend_of(metrics)
        labels = {part: LOOKS[part].label for part in Breakdown.PARTS}
        assert list(shown) == list(labels.values())  # every part, in the bar's order
        for part, label in labels.items():
            glyph, pct = shown[label]
            assert glyph == LOOKS[part].glyph
            assert pct == pytest.approx(SHARES[part], abs=0.05), part
        # The bar: each part's glyph in as many cells as its share of the bar's width.
        bar = bar_of(metrics)
        assert len(bar) >= 30
        for part in Breakdown.PARTS:
            cells = bar.count(LOOKS[part].glyph)
            assert abs(cells - SHARES[part] * len(bar) / 100) <= 1, (part, bar)
        assert bar == "".join(sorted(bar, key=lambda c: "░█▓▒·".index(c)))  # one run each
        # No GPU: the achieved bus bandwidth alone, over the latest steps after warm-up.
        steps = [e for e in events if e["type"] == "step"][WARMUP_STEPS:][-CURRENT_STEPS:]
        bus = sum(e["grad_sync_bytes"] for e in steps) / sum(e["sync_ms"] for e in steps) * 1e3
        assert lines[2].endswith(f"  all-reduce {format_rate(bus)} bus")
        assert "NVLink" not in metrics and "PCIe" not in metrics


async def test_steps_not_timed_apart_show_the_figures_as_before_and_no_bar():
    events = load_events("cpu_one_attempt.jsonl")  # an older trainer: compute alone at most
    app, link = app_for(timed(events, compute_ms=0.3))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(MetricsPanel)
        assert panel.plain.splitlines()[1:] == [
            f"last {CURRENT_STEPS} steps: 1,283 examples/s  200 ms per step  input wait 38.0%"
        ]
        assert panel.region.height == 2 and panel.extra_rows == 0
        assert not any(glyph in panel.plain for glyph in "░█▓▒")
        assert "comp/sync" not in app.query_one(AttemptsPanel).plain


def worker_shares(events: list[dict[str, Any]], worker: int) -> dict[str, float]:
    """A worker's shares over its latest steps after warm-up, by hand: each part's sum over
    the sum of the step times (other: the rest)."""
    own = [e for e in events if e["type"] == "step" and e.get("worker", 0) == worker]
    own = own[WARMUP_STEPS:][-WORKER_WINDOW_STEPS:]
    total = sum(e["step_time_ms"] for e in own)
    sums = {part: sum(e[f"{part}_ms"] for e in own) for part in ("compute", "sync", "update")}
    sums["input"] = sum(e["input_wait_ms"] for e in own)
    sums["other"] = total - sum(sums.values())
    return {part: 100.0 * value / total for part, value in sums.items()}


async def test_a_cluster_labels_its_all_reduce_honestly_and_shows_each_workers_split():
    events = load_events("cpu_two_workers.jsonl")
    chief, straggler = worker_shares(events, 0), worker_shares(events, 1)
    # The fixture's truth: worker 1 waits on input; the chief's all-reduce waits for it.
    assert chief["sync"] == pytest.approx(70.0) and straggler["sync"] == pytest.approx(34.5)
    app, link = app_for(events)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        metrics = app.query_one(MetricsPanel).plain
        shown = legend_of(metrics)
        # The headline's breakdown is the chief's; its all-reduce holds the wait.
        assert "all-reduce" not in shown and "all-reduce incl. wait" in shown
        assert shown["all-reduce incl. wait"][1] == pytest.approx(chief["sync"], abs=0.5)
        assert shown["compute"][1] == pytest.approx(chief["compute"], abs=0.5)
        assert "of NVLink" not in metrics  # across hosts: no peak to compare with
        panel = app.query_one(WorkersPanel)
        rows = panel.plain.splitlines()
        assert rows[0].split()[:8] == ["w", "host", "rep", "step", "wait", "comp", "sync", "ex/s"]
        # The straggler first, each row its own shares: input wait, compute, all-reduce.
        for row, (worker, shares) in zip(rows[1:3], ((1, straggler), (0, chief)), strict=True):
            cells = row.split()
            assert cells[0] == str(worker)
            assert cells[5:8] == [f"{shares[p]:.0f}%" for p in ("input", "compute", "sync")]
        # At 80 columns the title says what sync holds in its short words.
        assert str(panel.border_title).endswith(" · sync: all-reduce + wait for slowest")
        assert all(len(line) <= panel.content_size.width for line in rows[:3])  # no wrap


# NVLink 4 (H100): 25 GB/s per link and direction (900 GB/s both ways over 18 links).
NVLINK4_LINK_BYTES_PER_S = 25e9
LINKS = 18


def nvlink_gpus(events: list[dict[str, Any]], sync_bytes: float) -> list[dict[str, Any]]:
    """gpu_running's events on H100s with 18 active NVLink 4 links each, every step
    all-reducing sync_bytes (bus bytes: x 2(n-1)/n)."""
    out = []
    for event in events:
        if event["type"] == "sample":
            gpus = [{**gpu, "name": "NVIDIA H100 80GB HBM3", "nvlink_links_active": LINKS,
                     "nvlink_version": 4} for gpu in event["gpus"]]
            event = {**event, "gpus": gpus}
        elif event["type"] == "step":
            event = {**event, "grad_sync_bytes": sync_bytes}
        out.append(event)
    return out


async def test_on_nvlink_the_bus_bandwidth_is_a_share_of_the_links_peak():
    events = nvlink_gpus(load_events("gpu_running.jsonl"), 1.5e9)
    steps = [e for e in events if e["type"] == "step"][WARMUP_STEPS:][-CURRENT_STEPS:]
    bus = sum(e["grad_sync_bytes"] for e in steps) / (sum(e["sync_ms"] for e in steps) / 1e3)
    share = 100.0 * bus / (LINKS * NVLINK4_LINK_BYTES_PER_S)
    assert 10 < share < 100
    app, link = app_for(events)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(MetricsPanel)
        line = panel.plain.splitlines()[2]
        found = re.search(r"all-reduce ([\d.]+ GB/s) bus = (\d+)% of NVLink$", line)
        assert found is not None, line
        assert found.group(1) == format_rate(bus)
        assert int(found.group(2)) == round(share)
        assert len(line) <= panel.content_size.width


# -- the drawing, without a screen -----------------------------------------------------------


def test_every_part_has_a_glyph_and_a_colour_of_its_own():
    assert list(LOOKS) == list(Breakdown.PARTS)
    assert len({look.glyph for look in LOOKS.values()}) == len(LOOKS)
    assert len({look.style for look in LOOKS.values()}) == len(LOOKS)


@pytest.mark.parametrize("width", [1, 7, 16, 31, 78])
@pytest.mark.parametrize(
    "parts", [(100, 10, 50, 20, 5), (100, 0.2, 99.0, 0.3, 0.1), (7, 0, 0, 0, 0), (3, 1, 1, 1, 0)]
)
def test_the_bar_fills_its_width_each_part_by_its_share(parts, width):
    breakdown = Breakdown(*map(float, parts))
    cells = bar_cells(breakdown, width)
    assert [part for part, _ in cells] == list(Breakdown.PARTS)
    assert sum(n for _, n in cells) == width
    for part, n in cells:
        assert abs(n - breakdown.pct(part) * width / 100) < 1, (part, cells)
    assert bar(breakdown, width).cell_len == width


@pytest.mark.parametrize("cluster", [False, True])
@pytest.mark.parametrize("width", [30, 50, 60, 72, 78, 120])
def test_the_legend_keeps_to_its_width_full_names_first(width, cluster):
    breakdown = Breakdown(100.0, 3.0, 20.0, 70.0, 2.0)  # other 5 %
    text = legend(breakdown, width, cluster).plain
    assert len(text) <= width
    if width >= 78:  # the whole story at 80 columns, the cluster's wait said
        assert ("▓all-reduce incl. wait 70%" in text) is cluster
        assert "█compute 20%" in text and "·other 5.0%" in text


def test_the_bus_bandwidth_against_the_link_or_alone():
    timed = Breakdown(100.0, 10.0, 50.0, 20.0, 5.0)
    alone = Figures(breakdown=timed, bus_bytes_per_s=142e9)
    assert bus_text(alone) == "all-reduce 142.0 GB/s bus"
    nvlink = replace(alone, link=LinkPeak("NVLink", 450e9), bus_pct_of_link=100 * 142 / 450)
    assert bus_text(nvlink) == "all-reduce 142.0 GB/s bus = 32% of NVLink"
    pcie = replace(alone, bus_bytes_per_s=0.3e9, link=LinkPeak("PCIe", 32e9),
                   bus_pct_of_link=100 * 0.3 / 32)
    assert bus_text(pcie) == "all-reduce 300.0 MB/s bus = 0.94% of PCIe"
    assert bus_text(Figures(breakdown=timed)) == ""
    assert not breakdown_lines(Figures(), 78)  # no breakdown: nothing drawn
    lines = breakdown_lines(nvlink, 78).plain.splitlines()
    assert len(lines) == 2 and all(len(line) == 78 for line in lines[:1])


@pytest.mark.parametrize(("first", "then"), [((100, 30), SIZE), (SIZE, (100, 30)),
                                             (SIZE, (130, 40))])
async def test_the_bar_is_drawn_again_for_a_new_width(first, then):
    # An ended run's figures do not change: only the resize can draw the bar again.
    events = load_events("cpu_two_attempts.jsonl")
    app, link = app_for(events)
    async with app.run_test(size=first) as pilot:
        await settle(app, link, pilot)
        await pilot.resize_terminal(*then)
        await pilot.pause()
        await pilot.pause()
        panel = app.query_one(MetricsPanel)
        lines = panel.plain.splitlines()
        assert len(lines) == 4
        assert len(lines[2]) == panel.content_size.width, (lines[2], panel.content_size)
        assert all(len(line) <= panel.content_size.width for line in lines)
