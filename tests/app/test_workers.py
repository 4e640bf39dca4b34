"""Pilot tests of a MultiWorkerMirroredStrategy run at 80x24: every worker, the straggler."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.gpus import GpuPanel
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.workers import WorkersPanel, worker_strip
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate import WorkerSummary
from gpuwatch.runstate.workers import WORKER_WINDOW_STEPS

from .conftest import SIZE, frozen_clock_for, load_events, make_app, settle


def text(app: GpuwatchApp, widget_type: type) -> str:
    return app.query_one(widget_type).plain


async def test_two_workers_name_worker_1_the_input_bound_straggler():
    # Fixture ground truth: worker 1 reads with 80 ms latency: it waits 38 % of each
    # step on input; the chief 3 %; both compute ~40 ms; every step is ~200 ms.
    app, link = make_app("cpu_two_workers.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        workers = text(app, WorkersPanel).splitlines()
        assert workers[0].split()[:3] == ["w", "host", "rep"]
        # Slowest first: worker 1 leads, on its host, 1 replica, 38 % input wait.
        assert workers[1].split()[:6] == ["1", "gpu-box-4", "1", "200", "ms", "38%"]
        assert workers[2].split()[:2] == ["0", "gpu-box-3"]
        assert "CPU 97%" in workers[1] and "CPU 62%" in workers[2]  # each host's sampler
        straggler = " ".join(workers[3:])
        assert straggler == (
            "worker 1 (gpu-box-4) is the straggler: input-bound "
            "(input wait 38% vs 3% on the others)"
        )
        # The workers' steps are timed apart: a note on the all-reduce's share (below).
        # The rows' window, then the note (its short words at 80 columns).
        assert app.query_one(WorkersPanel).border_title == (
            f"workers: 2, slowest first, last {WORKER_WINDOW_STEPS} steps"
            " · sync: all-reduce + wait for slowest"
        )
        # The headline is the chief's (256 examples per ~200 ms step) but for input wait:
        # every step waits for worker 1, so it is worker 1's 38.0 %, named.
        metrics = text(app, MetricsPanel)
        assert "input wait 38.0% (worker 1)" in metrics
        assert "step 45 " in metrics
        advice = text(app, AdvicePanel)
        assert "worker 1 waits on input; every step waits for it" in advice
        assert "the input keeps up" not in advice
        devices = text(app, DevicesPanel).splitlines()
        assert devices[0] == (
            "No NVIDIA GPU found: 2 workers x 1 CPU replica (MultiWorkerMirroredStrategy)"
        )
        attempts = text(app, AttemptsPanel).splitlines()
        assert "wkrs" in attempts[0]
        assert attempts[1].split()[:9] == [
            "1", "on", "1", "256", "45", "2", "1,283", "38.0%", "w1"
        ]


async def test_two_workers_fit_80x24_with_nothing_cut_off():
    app, link = make_app("cpu_two_workers.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert not app.query_one(HistoryPanel).display  # the sparklines give their rows
        for widget in (WorkersPanel, AttemptsPanel, DevicesPanel, MetricsPanel):
            panel = app.query_one(widget)
            region = panel.region
            assert region.bottom <= SIZE[1] - 2, widget.__name__  # above pending + footer
            assert panel.content_size.width <= SIZE[0]
            lines = panel.plain.splitlines()
            # Every line fits the panel's width, or the panel grew to hold its wrap.
            needed = sum(max(1, -(-len(line) // panel.content_size.width)) for line in lines)
            assert panel.content_size.height >= needed, widget.__name__
        assert app.query_one(AttemptsPanel).region.height >= 3  # border, header, a row


async def test_a_single_host_run_has_no_workers_panel():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert not app.query_one(WorkersPanel).display
        assert app.query_one(HistoryPanel).display
        assert "wkrs" not in text(app, AttemptsPanel)


def many_workers(count: int) -> list[dict[str, Any]]:
    """The two-worker fixture grown to `count` workers: worker 1's steps copied to the rest."""
    events = load_events("cpu_two_workers.jsonl")
    grown: list[dict[str, Any]] = []
    for event in events:
        if event.get("type") in ("hello", "step"):
            event = {**event, "workers": count} if event["type"] == "hello" else event
            if event.get("worker") == 1:
                for worker in range(1, count):
                    copy = {**event, "worker": worker}
                    if event["type"] == "hello":
                        copy["host"] = f"node-{worker:02d}"
                    if event["type"] == "step" and worker > 1:
                        copy["input_wait_ms"] = 6.0 + worker / 10  # only worker 1 is slow
                    grown.append(copy)
                continue
        if event.get("type") == "hello":
            event = {**event, "replicas": count}
        grown.append(event)
    for seq, event in enumerate(grown):
        event["seq"] = seq
    return grown


@pytest.mark.parametrize(("timed", "listed"), [(False, 4), (True, 2)])
async def test_sixty_four_workers_show_the_slowest_and_a_count_of_the_rest(timed, listed):
    # Timed apart, the metrics' breakdown takes two rows: two fewer workers are listed.
    events = many_workers(64)
    if not timed:
        drop = ("sync_ms", "update_ms")
        events = [{k: v for k, v in e.items() if k not in drop} for e in events]
    link = ReplayLink(events, batch_size=500)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        lines = text(app, WorkersPanel).splitlines()
        assert lines[1].split()[:2] == ["1", "node-01"]
        # The count, then every worker at a glance by index, one cell each at 80 columns:
        # worker 1 (the straggler) stands out, the others are alike.
        count = f"… and {64 - listed} more "
        assert lines[1 + listed].startswith(count)
        strip = lines[1 + listed][len(count):].rstrip()
        assert len(strip) == 64
        assert strip[1] == "█" and set(strip[:1] + strip[2:]) == {"▁"}
        assert lines[2 + listed].startswith("worker 1 (node-01) is the straggler: input-bound")
        title = f"workers: 64, slowest first, last {WORKER_WINDOW_STEPS} steps"
        if timed:
            title += " · sync: all-reduce + wait for slowest"
        assert app.query_one(WorkersPanel).border_title == title
        assert app.query_one(AttemptsPanel).region.bottom <= SIZE[1] - 2


async def test_a_crashed_worker_is_named_and_shown_first():
    events = load_events("cpu_two_workers.jsonl")
    last_seq = events[-1]["seq"]
    t = events[-1]["t"]
    events += [
        {"v": 1, "type": "error", "seq": last_seq + 1, "t": t, "attempt": 1, "kind": "runtime",
         "message": "OSError: reading shard 7 failed", "worker": 1},
        {"v": 1, "type": "status", "seq": last_seq + 2, "t": t, "attempt": 1,
         "status": "crashed", "exit_code": 1, "signal": None,
         "message": "worker 1 (gpu-box-4) exited with code 1 at step 45",
         "log_tail": ["Traceback (most recent call last):", "OSError: reading shard 7 failed"],
         "worker": 1},
    ]
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        crash = text(app, CrashPanel).splitlines()
        # The supervisor's message names the worker; without one the status line does.
        assert crash[0] == (
            "crashed: worker 1 (gpu-box-4) exited with code 1 at step 45"
        )
        assert crash[1] == "error (runtime, worker 1): OSError: reading shard 7 failed"
        workers = text(app, WorkersPanel).splitlines()
        assert workers[1].split()[0] == "1" and " error " in workers[1]
        assert workers[2].split()[0] == "0" and " ended " in workers[2]
        assert len(workers) == 3  # the failed worker first; no straggler line after a crash
        assert not app.query_one(DevicesPanel).display
        assert app.query_one(CrashPanel).region.bottom <= SIZE[1] - 2
        assert app.query_one(AttemptsPanel).region.bottom <= SIZE[1] - 2
        assert app.query_one(AttemptsPanel).region.height >= 3


async def test_a_crash_status_without_the_worker_in_its_message_names_it():
    events = load_events("cpu_two_workers.jsonl")
    events.append({"v": 1, "type": "status", "seq": events[-1]["seq"] + 1, "t": events[-1]["t"],
                   "attempt": 1, "status": "crashed", "exit_code": None, "signal": "SIGKILL",
                   "message": "agent lost", "log_tail": [], "worker": 1})
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert text(app, CrashPanel).splitlines()[0] == (
            "crashed (worker 1): signal SIGKILL — agent lost"
        )
        assert " crashed " in text(app, WorkersPanel).splitlines()[1]


def gpu_workers() -> list[dict[str, Any]]:
    """The two-worker run on GPU hosts: 2 GPUs each, the chief's and worker 1's samples."""
    gpu_events = load_events("gpu_running.jsonl")
    gpu_sample = next(e for e in gpu_events if e["type"] == "sample")
    events = []
    for event in load_events("cpu_two_workers.jsonl"):
        if event["type"] == "hello":
            w = event["worker"]
            event = {**event, "device_kind": "gpu", "replicas": 4,
                     "devices": [f"/job:worker/replica:0/task:{w}/device:GPU:{i}" for i in (0, 1)]}
        elif event["type"] == "sample":
            event = {**gpu_sample, "seq": event["seq"], "t": event["t"], "worker": event["worker"]}
        events.append(event)
    return events


async def test_gpu_workers_show_per_host_gpus_and_traffic_when_wide():
    events = gpu_workers()
    for size in (SIZE, (160, 50)):
        link = ReplayLink(events, batch_size=50)
        app = GpuwatchApp(link, clock=frozen_clock_for(events))
        async with app.run_test(size=size) as pilot:
            await settle(app, link, pilot)
            # The chief's host's GPUs, said so, one line or cell per GPU.
            gpus = app.query_one(GpuPanel)
            title = str(gpus.border_title)
            assert title.startswith(
                "the chief's GPUs," if size == SIZE else "GPUs of gpu-box-3 (the chief's host),"
            )
            shown = [line.split() for line in gpus.texts()]
            # First word the index (line) or "GPU" (cell); the first % is its utilization.
            assert [(words[0], next(w for w in words if w.endswith("%"))) for words in shown] == (
                [("0", "92%"), ("1", "85%")] if size == SIZE else
                [("GPU", "92%"), ("GPU", "85%")]
            )
            row = text(app, WorkersPanel).splitlines()[1]
            # gpu_running's sample: utils 92 and 85 -> 88 %; 42.9 of 85.9 GB used -> 50 %.
            assert row.split()[:3] == ["1", "gpu-box-4", "2"]
            assert row.endswith("2 GPU 88% mem 50%" if size == SIZE else
                                "2 GPU 88% mem 50%  PCIe 9.3 GB/s  NVLink 36.9 GB/s")
            for line in text(app, WorkersPanel).splitlines()[:3]:  # the table never wraps
                assert len(line) <= size[0] - 2


def _figures(worker: int, busy: float | None, status: str = "running") -> WorkerSummary:
    return WorkerSummary(
        worker=worker, host=f"h{worker}", replicas=8, status=status, last_step=10,
        measured_steps=20 if busy is not None else 0, step_time_ms=25.0,
        input_wait_pct=4.0, input_wait_ms=None if busy is None else 1.0,
        compute_ms=None if busy is None else busy - 1.0, examples_per_s=100.0, sample=None,
    )


def test_the_strip_marks_each_worker_by_its_own_work_against_the_median() -> None:
    rows = [_figures(w, 9.0) for w in range(10)]
    rows[3] = _figures(3, 9.0 * 1.2)   # a little slower
    rows[5] = _figures(5, 9.0 * 1.4)   # slower
    rows[7] = _figures(7, 9.0 * 3.0)   # the straggler
    rows[8] = _figures(8, None)        # no steps after warm-up yet
    rows[9] = _figures(9, 9.0, "crashed")
    assert worker_strip(rows, 80).plain == "▁▁▁▃▁▅▁█·✗"
    # Fewer cells than workers: a cell shows the worst of its workers.
    assert worker_strip(rows, 5).plain == "▁▃▅█✗"
