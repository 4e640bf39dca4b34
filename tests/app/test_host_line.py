"""The devices panel's host line: each CPU figure says what it is of, and an exited
trainer has no figures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.devices import DevicesPanel, host_line
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate import RunState
from trainer_runtime.protocol import HostSample

from .conftest import SIZE, Waiter, frozen_clock_for, load_events, settle

GIB = 2**30


def the_host_line(app: GpuwatchApp) -> str:
    (line,) = [ln for ln in app.query_one(DevicesPanel).plain.splitlines()
               if ln.startswith("host CPU")]
    return line


def last_host(events: list[dict[str, Any]]) -> dict[str, Any]:
    host = [e for e in events if e["type"] == "sample"][-1]["host"]
    assert isinstance(host, dict)
    return host


async def test_each_cpu_figure_says_what_it_is_of():
    events = load_events("cpu_one_attempt.jsonl")
    host = last_host(events)
    # The recording's host: 2 cores 90 % busy; its trainer used 160 % of one core.
    assert (host["cpu_pct"], len(host["per_cpu_pct"]), host["run_cpu_pct"]) == (90.0, 2, 160.0)
    rss_gib = host["run_rss_bytes"] / GIB
    mem = f"{host['mem_used_bytes'] / GIB:.1f}/{host['mem_total_bytes'] / GIB:.1f} GiB"
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, link, pilot)
        assert the_host_line(app) == (
            f"host CPU 90% of 2 cores  memory {mem}  load {host['load_1m']:.1f}"
            f"  trainer 1.6 cores, {rss_gib:.1f} GiB RSS"
        )
        # At 80 columns the load gives way: the line fits its 78 cells, on one row.
        await pilot.resize_terminal(*SIZE)
        await pilot.pause()
        await pilot.pause()
        line = the_host_line(app)
        assert line == (
            f"host CPU 90% of 2 cores  memory {mem}  trainer 1.6 cores, {rss_gib:.1f} GiB RSS"
        )
        assert len(line) <= SIZE[0] - 2


def test_a_big_host_and_a_trainer_under_a_core():
    state = RunState()
    host = HostSample(cpu_pct=64.0, per_cpu_pct=(64.0,) * 16, mem_used_bytes=40 * GIB,
                      mem_total_bytes=256 * GIB, load_1m=10.2, run_cpu_pct=45.0,
                      run_rss_bytes=3 * GIB)
    assert host_line(state, host).plain == (
        "host CPU 64% of 16 cores  memory 40.0/256.0 GiB  load 10.2"
        "  trainer 0.5 cores, 3.0 GiB RSS"
    )
    # No per-core readings (a CPU came or went): still said of the whole host.
    host = replace(host, per_cpu_pct=(), run_cpu_pct=None)
    assert host_line(state, host).plain.startswith("host CPU 64% of all cores  memory")
    assert host_line(state, host).plain.endswith("  trainer 3.0 GiB RSS")


def stopped_after_a_zombie_sample() -> list[dict[str, Any]]:
    """The recording, then the sample a supervisor took as its trainer exited (what an
    unfixed sampler reads of a zombie: its last CPU share, no memory), then "stopped"."""
    events = load_events("cpu_one_attempt.jsonl")
    last = events[-1]
    sample = [e for e in events if e["type"] == "sample"][-1]
    zombie = {**sample["host"], "run_cpu_pct": 87.0, "run_rss_bytes": 0}
    return [
        *events,
        {**sample, "seq": last["seq"] + 1, "t": last["t"] + 1, "host": zombie},
        {"v": 1, "type": "status", "seq": last["seq"] + 2, "t": last["t"] + 1,
         "status": "stopped", "attempt": 1, "exit_code": 0, "message": "stopped on request"},
    ]


async def test_after_a_stop_the_host_line_shows_no_trainer_figures():
    events = stopped_after_a_zombie_sample()
    link = ReplayLink(events)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.state.status == "stopped"
        line = the_host_line(app)
        assert line.endswith("  trainer exited"), line
        assert "0 B" not in line and "0.9 cores" not in line and "87" not in line


async def test_the_status_alone_repaints_the_host_line():
    # The stop comes after the last sample: no new sample to repaint the panel with.
    events = stopped_after_a_zombie_sample()
    link = ReplayLink(events[:-1])
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        assert "trainer exited" not in the_host_line(app)
        link.push(events[-1:])
        await waiter.until(
            lambda: the_host_line(app).endswith("  trainer exited"), "the repaint", 5.0
        )
