"""The dashboard as on a head node: a recorded run's events replayed at their own pace.

On a real cluster the workers run on other hosts: the head node runs the supervisor
and the dashboard. bench_scale.py runs its 64 simulated workers on this 2-core box,
where their 128 processes take most of both cores even niced, and a dashboard measured
beside them pays for the crowd (one core's two hyperthreads, caches): its CPU seconds
per repaint go up. This measures the same dashboard on the same traffic with the
crowd gone: a stand-in supervisor (this process: the real EventLog and ClientHub on an
AF_UNIX socket, as bench_dashboard.py has it) publishes a recorded events.jsonl, the
events before --from-t at once (the run so far, folded on attach) and the rest at the
pace they were recorded, their times moved to now; the real dashboard
(`gpuwatch.app.run_dashboard`) follows it on a pseudo-terminal, first at 80x24, then
at 160x48, and its CPU time is counted over each half, each after WARMUP_S in which
its pace settles (a dashboard over its CPU budget repaints less often: gpuwatch/app/repaint.py).

    .venv/bin/python bench/head_node.py EVENTS.jsonl [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_dashboard import (  # noqa: E402
    Screen,
    StandIn,
    cpu_seconds,
    end_dashboard,
    set_size,
    start_dashboard,
)

from trainer_runtime.protocol import parse_event  # noqa: E402

# Before measuring: the dashboard's first paint, the record's fold, and its pace settling
# (gpuwatch/app/repaint.py: Pace), as in a dashboard minutes old.
WARMUP_S = 20.0


def publish(stand_in: StandIn, frame: dict[str, Any], t: float) -> None:
    """One recorded frame, as its event, at time t."""
    stand_in.record(parse_event(frame)[1], t)


def read_record(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines() if line.strip()]


async def replay(frames: list[dict[str, Any]], from_t: float | None, seconds: float,
                 sizes: list[tuple[int, int]], profile: str | None = None,
                 warmup_s: float = WARMUP_S) -> list[float]:
    """CPU % of a core of the dashboard at each size, each over seconds / len(sizes)."""
    run_id = next(f["run_id"] for f in frames if f.get("type") == "run")
    if from_t is None:  # the run settled: 10 s after its last worker said hello
        from_t = max(f["t"] for f in frames if f.get("type") == "hello") + 10.0
    head = [f for f in frames if f["t"] < from_t]
    rest = [f for f in frames if f["t"] >= from_t]
    needed_s = warmup_s * len(sizes) + seconds + 1.0
    if not rest or rest[-1]["t"] - from_t < needed_s:
        raise SystemExit(f"the record has under {needed_s:.0f} s of events after --from-t")
    with tempfile.TemporaryDirectory(prefix="gpuwatch-head-") as tmp:
        home = Path(tmp)
        run_dir = home / "runs" / run_id
        run_dir.mkdir(parents=True)
        socket_path = home / "sock" / f"{run_id}.sock"
        stand_in = StandIn(run_dir, socket_path, run_id)
        shift = time.time() - from_t
        for frame in head:
            publish(stand_in, frame, frame["t"] + shift)
        await stand_in.hub.open()
        width, height = sizes[0]
        child, master = await start_dashboard(home, run_id, socket_path, width, height)
        proc = psutil.Process(child.pid)
        screen = Screen(width, height)
        loop = asyncio.get_running_loop()

        def readable() -> None:
            try:
                screen.feed(os.read(master, 1 << 16))
            except OSError:
                loop.remove_reader(master)

        loop.add_reader(master, readable)

        async def feed() -> None:
            began = time.monotonic()
            for frame in rest:
                wait = (frame["t"] - from_t) - (time.monotonic() - began)
                if wait > 0:
                    await asyncio.sleep(wait)
                publish(stand_in, frame, frame["t"] + shift)

        feeder: asyncio.Task[None] | None = None
        try:
            await asyncio.wait_for(stand_in.subscribed.wait(), 60.0)
            # The run's later events from the moment of the attach, at their pace.
            shift = time.time() - from_t
            feeder = asyncio.create_task(feed())
            await asyncio.sleep(warmup_s)
            figures = []
            for index, (width, height) in enumerate(sizes):
                if index:
                    set_size(master, width, height)
                    os.killpg(child.pid, signal.SIGWINCH)
                    screen = Screen(width, height)
                    await asyncio.sleep(warmup_s)  # the new layout: its pace settles again
                before, start = cpu_seconds(proc), time.monotonic()
                if profile:  # py-spy the dashboard over this half (raw, collapsed stacks)
                    spy = await asyncio.create_subprocess_exec(
                        "py-spy", "record", "--nonblocking", "-d",
                        str(int(seconds / len(sizes))), "-f", "raw",
                        "-o", f"{profile}-{width}x{height}.txt", "-p", str(child.pid),
                        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                await asyncio.sleep(seconds / len(sizes))
                figures.append(100.0 * (cpu_seconds(proc) - before) / (time.monotonic() - start))
                if profile:
                    await spy.wait()
            if child.returncode is not None:
                raise SystemExit(f"the dashboard exited early: {child.returncode}")
            print("the head node's dashboard at the end:\n" + "\n".join(screen.lines()))
            return figures
        finally:
            await end_dashboard(child, master)
            if feeder is not None:
                feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeder
            stand_in.hub.close()
            await asyncio.sleep(0.2)
            stand_in.events.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="an events.jsonl")
    parser.add_argument("--from-t", type=float,
                        help="attach here (default: 10 s after the last hello)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--profile", help="py-spy each half to PROFILE-WxH.txt (needs py-spy)")
    args = parser.parse_args()
    small, big = asyncio.run(replay(read_record(args.record), args.from_t, args.seconds,
                                    [(80, 24), (160, 48)], args.profile))
    print(f"result: dashboard_cpu_pct_80x24={small:.2f} dashboard_cpu_pct_160x48={big:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
