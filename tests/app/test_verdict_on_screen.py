"""The advice panel at 80x24 states the advisor's verdict on a run with a measured breakdown:
the part that holds the step back, its share, and the remedy's key."""

from __future__ import annotations

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.follow.link import ReplayLink
from tests.advisor.test_advisor_verdicts import GB, run_events

from .conftest import SIZE, frozen_clock_for, settle


async def test_a_communication_bound_run_reads_as_such_with_accumulation_first() -> None:
    # 100 ms steps, 21 ms of them all-reducing 142 GB/s of bus bytes over 450 GB/s NVLink.
    frames = [{"v": 1, **frame} for frame in run_events(
        {"input": 1.0, "compute": 60.0, "sync": 21.0, "update": 4.0},
        bus_bytes=142 * GB * 0.021)]
    link = ReplayLink(frames, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(frames))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        shown = " ".join(app.query_one(AdvicePanel).plain.split())
        assert shown.startswith("highly communication-bound: all-reduce 21% of the step, "
                                "142 GB/s bus = 32% of NVLink")
        assert "accumulation (a)" in shown
