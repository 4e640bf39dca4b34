"""Attaching to a long run: from the supervisor's snapshot against a replay of every event.

Writes a run of --events events (default 1,000,000: steps at ~100/s, 8-GPU samples
each second, 3 attempts) through the real EventLog and snapshot writer
(tests/support/long_run.py), serves it with the real supervisor's hub, and attaches
the real dashboard (Pilot, 120x40) twice, interleaved --repeats times: with the
snapshot (what `gpuwatch attach` does) and with every event replayed (SocketLink
with snapshot=False, what it did before). The time is from starting the app to the
screen showing the last step. Also: the supervisor's fold per event, the cost of
writing a snapshot, and the sizes on disk. Prints figures and exits 0; not a test.

    .venv/bin/python bench/bench_attach.py [--events 1000000] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.follow.link import SocketLink
from gpuwatch.runstate import RunState
from gpuwatch.supervisor import Supervisor
from tests.conftest import ROOT, TINY
from tests.support.long_run import LongRun, gpu_sample, write_long_run
from trainer_runtime.protocol import Envelope, Event, Step


async def attach(supervisor: Supervisor, run: LongRun, snapshot: bool) -> float:
    """Seconds from starting the dashboard to the last step on its screen."""
    link = SocketLink(supervisor.socket_path, snapshot=snapshot)
    last_t = run.keeper.state.last_t or 0.0
    app = GpuwatchApp(link, clock=lambda: last_t)
    wanted = f"step {run.last_step:,}"
    started = time.monotonic()
    async with app.run_test(size=(120, 40)) as pilot:
        while wanted not in app.query_one(MetricsPanel).plain:  # noqa: ASYNC110 - a bench
            await asyncio.sleep(0.01)
        took = time.monotonic() - started
        await pilot.pause()
    return took


def fold_cost_us(count: int = 200_000) -> float:
    """The supervisor's fold (RunState.apply_event) per event: steps with a sample a second."""
    events: list[Event] = []
    for i in range(count):
        if i % 101 == 100:
            events.append(gpu_sample(float(i)))
        else:
            events.append(
                Step(
                    attempt=1,
                    step=i,
                    micro_step=i,
                    epoch=0,
                    loss=0.5,
                    lr=1e-3,
                    examples=256,
                    step_time_ms=9.0 + i % 7,
                    input_wait_ms=1.0,
                    grad_sync_bytes=8e6,
                    position=i * 256,
                )
            )
    runs = []
    for _ in range(3):
        state = RunState()
        started = time.perf_counter()
        for seq, event in enumerate(events):
            state.apply_event(Envelope(event.TYPE, seq, float(seq)), event)
        runs.append((time.perf_counter() - started) / count * 1e6)
    return statistics.median(runs)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("GPUWATCH_USER_CWD", str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="gw-bench-attach-", dir="/tmp"))
    try:
        run_dir = work / "runs" / "r1"
        run_dir.mkdir(parents=True)
        shutil.copy(TINY, run_dir / "config.yaml")
        started = time.monotonic()
        run = await asyncio.to_thread(write_long_run, run_dir, args.events)
        print(
            f"wrote {run.events:,} events in {time.monotonic() - started:.1f} s: "
            f"events.jsonl {(run_dir / 'events.jsonl').stat().st_size / 1e6:.0f} MB, "
            f"events.idx {(run_dir / 'events.idx').stat().st_size:,} B, "
            f"snapshot.json {(run_dir / 'snapshot.json').stat().st_size:,} B "
            f"(at seq {run.snapshot_seq:,}, {run.events - 1 - run.snapshot_seq:,} events after it)",
            flush=True,
        )
        writes = []
        for _ in range(20):  # what StateKeeper.write does, beside the run's own snapshot.json
            began = time.perf_counter()
            text = run.keeper.state.to_snapshot()
            (work / "snapshot.tmp").write_text(text, encoding="utf-8")
            (work / "snapshot.tmp").replace(work / "snapshot.json")
            writes.append(time.perf_counter() - began)
        print(
            f"snapshot write (to_snapshot + tmp + replace): "
            f"{statistics.median(writes) * 1e3:.1f} ms median",
            flush=True,
        )
        print(f"supervisor fold: {fold_cost_us():.1f} us per event (median of 3)", flush=True)

        supervisor = Supervisor(run_dir, work / "sock" / "r1.sock")
        began = time.monotonic()
        folded = await asyncio.to_thread(supervisor.keeper.restore)
        print(
            f"supervisor restart: snapshot + {folded:,} events folded in "
            f"{time.monotonic() - began:.2f} s",
            flush=True,
        )
        supervisor.loop = asyncio.get_running_loop()
        await supervisor.hub.open()
        timings: dict[bool, list[float]] = {True: [], False: []}
        try:
            for _ in range(args.repeats):
                for snapshot in (True, False):
                    took = await attach(supervisor, run, snapshot)
                    timings[snapshot].append(took)
                    way = "snapshot + tail" if snapshot else "full replay    "
                    print(f"attach, {way}: {took:6.2f} s to the last step on screen", flush=True)
        finally:
            supervisor.hub.close()
            supervisor.events.close()
        fast, slow = statistics.median(timings[True]), statistics.median(timings[False])
        print(
            f"result: attach_snapshot_s={fast:.2f} attach_full_replay_s={slow:.2f} "
            f"events={run.events}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
