"""One figure, one value: a figure shown in two places reads the same, read off the screen.

The metrics line and the advice's verdict show one input wait; the devices panel (or the
GPUs' title) and the advice show one gradient sync; in a cluster the headline, the verdict
and the attempts table show the input wait of the worker every step waits for.
"""

from __future__ import annotations

import re
from typing import Any

from gpuwatch.advisor import format_bandwidth, format_rate
from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.gpus import GpuPanel
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.workers import WorkersPanel
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate import CURRENT_STEPS, WARMUP_STEPS
from tests.runstate.test_runstate_workers import measured_wait_pct, relaunch_helps_the_straggler

from .conftest import SIZE, Waiter, frozen_clock_for, load_events, make_app, settle
from .test_painters import later_steps


def text(app: GpuwatchApp, widget_type: type) -> str:
    return app.query_one(widget_type).plain


def found(pattern: str, shown: str) -> str:
    match = re.search(pattern, shown)
    assert match is not None, (pattern, shown)
    return match.group(1)


def expected_figures(events: list[dict[str, Any]]) -> tuple[str, str]:
    """By hand, from the steps fed: the last attempt's input wait % and gradient sync over
    its latest CURRENT_STEPS steps after warm-up, as the screen writes them."""
    attempt = max(e["attempt"] for e in events if e["type"] == "step")
    steps = [e for e in events if e["type"] == "step" and e["attempt"] == attempt]
    steps = steps[WARMUP_STEPS:][-CURRENT_STEPS:]
    step_ms = sum(e["step_time_ms"] for e in steps)
    wait = 100.0 * sum(e["input_wait_ms"] for e in steps) / step_ms
    sync = sum(e["grad_sync_bytes"] for e in steps) * 1000.0 / step_ms
    return f"{wait:.1f}", format_rate(sync)


async def test_metrics_line_and_verdict_show_one_input_wait_as_steps_arrive():
    # Each batch changes the input wait and the gradient sync of the window: the metrics
    # line repaints with every batch, and the advice must read the same figures then.
    events = load_events("cpu_one_attempt.jsonl")
    app, link = make_app("cpu_one_attempt.jsonl")
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        shown_before = found(r"input wait ([\d.]+)%", text(app, MetricsPanel))
        for wait_ms, sync_bytes in ((150.0, 9e6), (12.0, 1.5e6), (90.0, 4e6)):
            batch = [
                dict(step, input_wait_ms=wait_ms, grad_sync_bytes=sync_bytes)
                for step in later_steps(events, 8)
            ]
            events += batch
            link.push(batch)
            last = f"step {batch[-1]['step']:,}"
            await waiter.until(lambda last=last: last in text(app, MetricsPanel), last)
            metrics, advice = text(app, MetricsPanel), text(app, AdvicePanel)
            devices = text(app, DevicesPanel)
            want_wait, want_sync = expected_figures(events)
            shown = found(r"input wait ([\d.]+)%", metrics)
            assert shown != shown_before  # the batch moved the figure
            assert shown == want_wait
            assert found(r"([\d.]+)% of step time waiting for input", advice) == shown
            assert found(r"gradient sync ([\d.]+ \w?B/s)", devices) == want_sync
            assert found(r"gradient sync est\. ([\d.]+ \w?B/s)", advice) == want_sync
            shown_before = shown


async def test_gpu_title_and_advice_show_one_gradient_sync():
    events = load_events("gpu_running.jsonl")
    app, link = make_app("gpu_running.jsonl")
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        for sync_bytes in (9e6, 2e6):
            batch = [dict(step, grad_sync_bytes=sync_bytes) for step in later_steps(events, 8)]
            events += batch
            link.push(batch)
            last = f"step {batch[-1]['step']:,}"
            await waiter.until(lambda last=last: last in text(app, MetricsPanel), last)
            _, want_sync = expected_figures(events)
            title = str(app.query_one(GpuPanel).border_title)
            assert found(r"gradient sync est\. ([\d.]+ \w?B/s)", title) == want_sync
            # The advice names the all-reduce by its measured bus bandwidth: the same
            # steps' bus bytes over their all-reduce time, by hand.
            steps = [e for e in events if e["type"] == "step"][WARMUP_STEPS:][-CURRENT_STEPS:]
            bus = (sum(e["grad_sync_bytes"] for e in steps) * 1000.0
                   / sum(e["sync_ms"] for e in steps))
            advice = text(app, AdvicePanel)
            assert found(r"all-reduce \d+% of the step, ([\d.]+ \w?B/s) bus", advice) == (
                format_bandwidth(bus))


async def test_cluster_headline_verdict_and_attempts_show_the_straggler_s_input_wait():
    # Worker 1 waits 110 ms of 200 in attempt 1, 20 ms after the relaunch; the chief 1 ms.
    frames = relaunch_helps_the_straggler().frames
    link = ReplayLink(frames, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(frames))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        now = measured_wait_pct(frames, 2, 1, last=CURRENT_STEPS)
        chief = measured_wait_pct(frames, 2, 0, last=CURRENT_STEPS)
        metrics = text(app, MetricsPanel)
        assert f"input wait {now:.1f}% (worker 1)" in metrics
        assert f"{chief:.1f}%" not in metrics
        assert f"input-bound on worker 1: {now:.1f}% of its step time" in text(app, AdvicePanel)
        workers = text(app, WorkersPanel).splitlines()
        assert workers[1].split()[0] == "1" and f"{now:.0f}%" in workers[1].split()
        rows = {
            line.split()[0]: line for line in text(app, AttemptsPanel).splitlines()[1:]
            if line.split()[0].isdigit()
        }
        for attempt in (1, 2):
            want = measured_wait_pct(frames, attempt, 1)
            assert f"{want:.1f}% w1" in rows[str(attempt)], rows
        assert "input wait: the worker that waits most" in str(
            app.query_one(AttemptsPanel).border_title
        )
        # The sparklines are the chief's steps, and say so: not a second headline.
        assert str(app.query_one(HistoryPanel).border_title).startswith(
            "history: the chief's last"
        )
