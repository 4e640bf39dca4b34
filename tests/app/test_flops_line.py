"""The metrics line shows the achieved TFLOP/s (and MFU where the GPUs' peak is known) from
the trainer's FLOPs per example and the examples/s on the same line: one reading."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate.state import CURRENT_STEPS

from .conftest import SIZE, frozen_clock_for, load_events, settle

FLOPS = 9_564_160.0  # the demo MLP's hand count (tests/integration/trainer/test_flops.py)


def _with_flops(name: str) -> list[dict[str, Any]]:
    events = load_events(name)
    for event in events:
        if event["type"] == "hello":
            event["flops_per_example"] = FLOPS
    return events


def rate_of(line: str) -> float:
    """The line's examples/s, after its window: "last 20 steps: 1,283 examples/s", in
    shorter words where the TFLOP/s would not fit beside the long ones ("last 20: 1,283
    ex/s"); the fixtures' last 20 steps."""
    match = re.match(r"last (\d+)(?: steps)?: ([\d,]+) (?:examples|ex)/s", line)
    assert match is not None, line
    assert int(match.group(1)) == CURRENT_STEPS
    return float(match.group(2).replace(",", ""))


async def _figures_line(events: list[dict[str, Any]]) -> str:
    """The metrics panel's figures line once the replayed events are all painted."""
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        return app.query_one(MetricsPanel).plain.splitlines()[1]


async def test_the_metrics_line_shows_tflops_from_the_flops_and_the_rate_beside_it() -> None:
    # The fixture's steps are 256 examples in 190 or 210 ms: 1,219 to 1,347 examples/s.
    line = await _figures_line(_with_flops("cpu_one_attempt.jsonl"))
    rate = rate_of(line)
    assert 256 / 0.210 - 1 <= rate <= 256 / 0.190 + 1
    shown = float(line.split(" TFLOP/s")[0].rsplit(" ", 1)[1])
    assert shown == pytest.approx(FLOPS * rate / 1e12, rel=0.005)  # 3 digits of it
    assert "MFU" not in line  # logical CPU replicas: no peak to hold it against
    assert len(line) <= SIZE[0] - 2


async def test_without_a_flops_count_the_line_is_as_before() -> None:
    line = await _figures_line(load_events("cpu_one_attempt.jsonl"))
    assert "TFLOP/s" not in line and line.endswith("input wait 38.0%")


async def test_on_known_gpus_the_line_adds_mfu_against_their_summed_peak() -> None:
    # Two replicas on a host of NVIDIA A100-SXM4-40GB: float32 runs as TF32 on Ampere, whose
    # dense peak NVIDIA's A100 datasheet gives as 156 TFLOP/s a GPU.
    line = await _figures_line(_with_flops("gpu_running.jsonl"))
    rate = rate_of(line)
    mfu = float(line.split("% MFU")[0].rsplit(" ", 1)[1])
    assert mfu == pytest.approx(100 * FLOPS * rate / 1e12 / (2 * 156.0), rel=0.05)  # 2 digits
