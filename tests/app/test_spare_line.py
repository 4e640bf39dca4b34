"""The devices panel's host line shows the spare trainer's memory while one waits."""

from __future__ import annotations

import copy

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.follow.link import ReplayLink

from .conftest import SIZE, frozen_clock_for, load_events, settle


def with_spare(events: list[dict], spare_rss_bytes: int | None) -> list[dict]:
    """The recorded run, its last sample saying a spare of that size waits (None: none)."""
    events = copy.deepcopy(events)
    last = max(i for i, e in enumerate(events) if e["type"] == "sample")
    events[last]["host"]["spare_rss_bytes"] = spare_rss_bytes
    return events


async def test_a_waiting_spare_shows_its_memory_on_the_host_line() -> None:
    events = with_spare(load_events("cpu_one_attempt.jsonl"), 503_316_480)  # 480 MiB
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        host = next(line for line in app.query_one(DevicesPanel).plain.splitlines()
                    if "host CPU" in line)
        assert "spare trainer 480.0 MiB" in host, host


async def test_no_spare_no_spare_figure() -> None:
    events = with_spare(load_events("cpu_one_attempt.jsonl"), None)
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert "spare" not in app.query_one(DevicesPanel).plain
