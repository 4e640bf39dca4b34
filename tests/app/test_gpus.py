"""The per-GPU history panel: a line per GPU at 80x24, a grid of cells at 160x48, resizes.

Ground truth is the fixture's last sample (gpu_eight.jsonl, eight H100s; see
make_fixtures.eight_gpu_reading), read here from the file, not from the app.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.gpus import CELL_LINES, GpuLines, GpuPanel, GpuView
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.follow.link import ReplayLink
from gpuwatch.measures.series import DEVICE_HISTORY_SAMPLES

from .conftest import SIZE, Waiter, frozen_clock_for, load_events, make_app, settle

pytest.importorskip("pytest_textual_snapshot", reason="pytest-textual-snapshot not installed")

GIB = 1024**3
BIG = (160, 48)


def last_sample(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return next(e for e in reversed(events) if e["type"] == "sample")["gpus"]


def short_rate(value: float) -> str:
    """The fixture's rates in the line's short form: 47,000,000 -> '47.0M', 1.2e9 -> '1.2G'."""
    return f"{value / 1e9:.1f}G" if value >= 1e9 else f"{value / 1e6:.1f}M"


def texts(app: GpuwatchApp) -> list[str]:
    return app.query_one(GpuPanel).texts()


def cells(app: GpuwatchApp) -> list[GpuView]:
    return list(app.query_one(GpuPanel).query(GpuView))


async def test_eight_gpus_fit_at_80x24_one_line_each_with_the_latest_readings():
    gpus = last_sample(load_events("gpu_eight.jsonl"))
    app, link = make_app("gpu_eight.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert not app.query_one(DevicesPanel).display
        panel = app.query_one(GpuLines)
        assert panel.region.height == 8  # the compact form: a line each, no cells
        assert not cells(app)
        lines = texts(app)
        assert len(lines) == 8
        for line, gpu in zip(lines, gpus, strict=True):
            words = line.split()
            assert words[0] == str(gpu["index"])
            assert words[-7:] == [
                f"{gpu['util_gpu_pct']:.0f}%",
                f"{gpu['mem_used_bytes'] / GIB:.1f}/80.0",
                "GiB",
                "PCIe",
                f"{short_rate(gpu['pcie_tx_bytes_per_s'])}/2.0G",
                "NVLink",
                f"{short_rate(gpu['nvlink_tx_bytes_per_s'])}/"
                f"{short_rate(gpu['nvlink_rx_bytes_per_s'])}",
            ]
            assert len(line) <= SIZE[0] - 2
        # Everything fits on the screen: the last GPU, the panels below, the keys.
        assert panel.region.bottom <= app.query_one(HistoryPanel).region.y
        assert app.query_one(PendingBar).region.y == SIZE[1] - 2
        title = str(app.query_one(GpuPanel).border_title)
        # 4,687,942 bytes per 100 ms step = 46.9 MB/s, beside the links' tx/rx.
        assert "gradient sync est. 46.9 MB/s/replica" in title
        assert len(title) <= SIZE[0] - 2


async def test_the_util_sparkline_is_on_a_fixed_scale_and_dips_where_the_samples_did():
    # gpu_eight: attempt 2's utilization is 94 - index %, 30 points lower every 4th sample.
    app, link = make_app("gpu_eight.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        history = app.state.gpu_history
        assert history.samples_seen == 40
        gpu0 = history.gpus[0]
        expected = [(52.0 if k < 15 else 94.0) - (30.0 if k % 4 == 3 else 0.0) for k in range(40)]
        assert list(gpu0.util_pct) == expected
        line = texts(app)[0]
        spark = line[3 : line.index(" 64%")].strip()
        # 40 samples in 17 cells at 80 columns: 3 a cell on fixed boundaries, so the last
        # cell is sample 39 alone (a dip: 64 %), the one before samples 36-38 (94 %).
        assert len(spark) == 14
        assert spark[-1] == "▆"  # 64 % of 100: the 6th of 8 bars (▁▂▃▄▅▆▇█)
        assert spark[-2] == "█"
        # Cell 3 is samples 9-11 (52, 52, 22: mean 42 %), cell 4 is 12-14 (attempt 1's
        # last: 52 %), cell 5 is 15-17 (attempt 2's first: 64, 94, 94: mean 84 %), cell 8
        # is 24-26 (94 % three times).
        assert spark[3:9] == "▄▅▇▇▇█"


async def test_at_160x48_each_gpu_is_a_cell_with_a_sparkline_per_reading():
    gpus = last_sample(load_events("gpu_eight.jsonl"))
    app, link = make_app("gpu_eight.jsonl")
    async with app.run_test(size=BIG) as pilot:
        await settle(app, link, pilot)
        shown = cells(app)
        assert len(shown) == 8
        assert not app.query_one(GpuLines).display
        assert {cell.region.height for cell in shown} == {1 + len(CELL_LINES)}
        assert len({cell.region.y for cell in shown}) == 2  # two rows of four
        for cell, gpu in zip(shown, gpus, strict=True):
            lines = cell.plain.splitlines()
            assert lines[0].startswith(f"GPU {gpu['index']} {gpu['temperature_c']}°C")
            assert "NVIDIA H100 80GB HBM3" in lines[0]
            labels = [line[:10].strip() for line in lines[1:]]
            assert labels == [label for label, _, _ in CELL_LINES]
            assert lines[1].endswith(f"{gpu['util_gpu_pct']:.0f}%")
            assert lines[2].endswith(f"{gpu['mem_used_bytes'] / GIB:.1f}/80.0 GiB")
            assert lines[3].endswith(f"{gpu['pcie_tx_bytes_per_s'] / 1e9:.1f} GB/s")
            assert lines[6].endswith(f"{gpu['nvlink_rx_bytes_per_s'] / 1e6:.1f} MB/s")
            assert max(len(line) for line in lines) <= cell.region.width
        title = str(app.query_one(GpuPanel).border_title)
        assert title.startswith("GPUs of gpu-box-3, last ")
        assert "gradient sync est. 46.9 MB/s per replica (ring all-reduce over 8)" in title


async def test_resizing_switches_between_lines_and_cells():
    app, link = make_app("gpu_eight.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.query_one(GpuLines).region.height == 8 and not cells(app)
        await pilot.resize_terminal(*BIG)
        await pilot.pause()
        assert not app.query_one(GpuLines).display
        assert {view.region.height for view in cells(app)} == {7}
        assert "NVLink rx" in cells(app)[7].plain
        await pilot.resize_terminal(120, 40)  # the smallest grid: three cells a row
        await pilot.pause()
        assert len({view.region.x for view in cells(app)}) == 3
        assert "… and 2 more GPUs (6-7): util" in app.query_one("#gpu-more", StatePanel).plain
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        lines = app.query_one(GpuLines)
        assert lines.region.height == 8 and not cells(app)
        assert len(texts(app)) == 8
        # Built for the width it has now: each line fills the panel's width.
        assert {len(line) for line in texts(app)} == {lines.size.width}
        assert not app.query_one("#gpu-more").display


def with_gpus(count: int) -> list[dict[str, Any]]:
    """gpu_running's events with `count` GPUs in every sample (GPU i: util 90 - i %)."""
    events = load_events("gpu_running.jsonl")
    for event in events:
        if event["type"] == "sample":
            template = event["gpus"][0]
            event["gpus"] = [
                {**template, "index": i, "util_gpu_pct": 90.0 - i} for i in range(count)
            ]
    return events


def untimed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events as an older trainer sends them: no step's parts timed apart."""
    drop = ("compute_ms", "sync_ms", "update_ms")
    return [{k: v for k, v in e.items() if k not in drop} if e["type"] == "step" else e
            for e in events]


@pytest.mark.parametrize(
    ("timed", "lines", "more"),
    [
        # GPUs 7-11: util 83 to 79 %; 21.3 GB used each (19.8 GiB).
        (False, 7, "… and 5 more GPUs (7-11): util 79–83%, memory 19.8–19.8 GiB used"),
        # The metrics' breakdown takes two rows: the GPUs' lines give them back.
        (True, 5, "… and 7 more GPUs (5-11): util 79–85%, memory 19.8–19.8 GiB used"),
    ],
)
async def test_more_gpus_than_lines_are_summed_up_honestly(timed, lines, more):
    events = with_gpus(12) if timed else untimed(with_gpus(12))
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert [line.split()[0] for line in texts(app)] == [str(i) for i in range(lines)]
        assert ("▓all-reduce" in app.query_one(MetricsPanel).plain) is timed
        summary = app.query_one("#gpu-more", StatePanel)
        assert summary.display
        assert summary.plain == more
        assert app.query_one(PendingBar).region.y == SIZE[1] - 2


async def test_a_run_without_gpus_keeps_the_devices_panel():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.query_one(DevicesPanel).display
        assert not app.query_one(GpuPanel).display
        assert app.query_one(DevicesPanel).plain.startswith("No NVIDIA GPU found")
        assert app.state.gpu_history.gpus == []


async def test_gpu_history_repaints_at_most_once_per_interval_and_numbers_do_not_wait():
    events = load_events("gpu_eight.jsonl")
    samples = [i for i, e in enumerate(events) if e["type"] == "sample"]
    head = events[: samples[11] + 1]  # up to the 12th sample (index 11: a dip, 22 %)
    link = ReplayLink(head, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events), history_interval_s=3600.0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)  # settle flushes the history areas
        first = texts(app)[0]
        assert " 22%" in first
        link.push(events[len(head) :])
        await link.wait_idle()
        # The numbers move on to the last step within their own render interval (a paint
        # just before may defer it that long: CI once looked at once and saw step 48). A
        # deadline, not a count of looks (300 looks last longer or shorter with the load).
        deadline = asyncio.get_running_loop().time() + 30.0
        while ("step 160" not in app.query_one(MetricsPanel).plain
               and asyncio.get_running_loop().time() < deadline):
            app.refresh_view()
            await pilot.pause(0.01)
        assert "step 160" in app.query_one(MetricsPanel).plain
        # ... while the history waits for its turn (its interval here: an hour).
        assert texts(app)[0] == first
        assert "gpu_history" in app.repainter.pending_areas()
        app.refresh_view(flush=True)
        await pilot.pause()
        assert " 64%" in texts(app)[0]


async def test_the_held_history_repaints_on_its_own_timer():
    events = load_events("gpu_eight.jsonl")
    samples = [i for i, e in enumerate(events) if e["type"] == "sample"]
    head = events[: samples[11] + 1]
    link = ReplayLink(head, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events), history_interval_s=0.3)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        link.push(events[len(head) :])
        await link.wait_idle()
        await waiter.until(lambda: " 64%" in texts(app)[0], "the history's timed repaint")
        assert app.state.gpu_history.samples_seen == 40
        assert DEVICE_HISTORY_SAMPLES >= 40


def test_eight_gpus_80x24(snap_compare):
    app, link = make_app("gpu_eight.jsonl")

    async def run_before(pilot: Any) -> None:
        await settle(app, link, pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_eight_gpus_160x48(snap_compare):
    app, link = make_app("gpu_eight.jsonl")

    async def run_before(pilot: Any) -> None:
        await settle(app, link, pilot)

    assert snap_compare(app, terminal_size=BIG, run_before=run_before)
