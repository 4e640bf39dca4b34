"""Bench: a settings change applied live against a full relaunch, on the demo.

Not a test: starts `gpuwatch train demo/demo.yaml --detach` (a real supervisor and
trainer) in a private GPUWATCH_HOME, then flips data.prefetch SWITCHES times each way,
interleaved: `relaunch` with live=true (applied in the running trainer) and with
live=false (stop, then a trainer process, TensorFlow import, rebuild, restore). Each is
timed from the command being sent to the end of the first step under the new settings
(that step's own end time, in events.jsonl).

It does this twice, one run each: without the spare trainer (GPUWATCH_SPARE_TRAINER=0:
every relaunch starts a new Python and imports TensorFlow) and with it (the relaunch
takes a process that imported TensorFlow while the last attempt trained). With the
spare, each relaunch waits for the spare's "ready" line first, as a person who reads
the screen before pressing R would; how long the spare took to be ready is printed.
Prints every switch, the medians and a last line
``result: hot_p50_s=X relaunch_p50_s=Y relaunch_spare_p50_s=Z`` (targets: X <= 2.0 and
X <= Y / 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwatch import runs  # noqa: E402
from gpuwatch.client import RunClient  # noqa: E402
from trainer_runtime.spare import READY as SPARE_READY  # noqa: E402

SWITCHES = 5
STEPS_BETWEEN = 30  # steps under each setting before the next switch


def events(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def first_step_end(run_dir: Path, attempt: int, timeout_s: float = 120) -> float:
    """When the first step of `attempt` ended (its own clock), once it has STEPS_BETWEEN."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        steps = [e for e in events(run_dir) if e["type"] == "step" and e["attempt"] == attempt]
        if len(steps) >= STEPS_BETWEEN:
            return float(steps[0]["t"])
        time.sleep(0.1)
    raise SystemExit(f"attempt {attempt} did not reach {STEPS_BETWEEN} steps")


async def switch(socket_path: Path, prefetch: bool, live: bool) -> tuple[int, float, bool]:
    async with RunClient(socket_path) as client:
        sent = time.time()
        reply = await client.command(
            "relaunch", overrides={"data.prefetch": prefetch}, live=live
        )
    return int(reply["attempt"]), sent, bool(reply.get("live"))


def spares_ready(run_dir: Path) -> int:
    """How many spare trainers have said they are ready, in trainer.log."""
    return (run_dir / "trainer.log").read_text(errors="replace").count(SPARE_READY)


def wait_for_spare(run_dir: Path, count: int, timeout_s: float = 120) -> float:
    started = time.monotonic()
    while spares_ready(run_dir) < count:
        if time.monotonic() - started > timeout_s:
            raise SystemExit("the spare trainer never said it was ready")
        time.sleep(0.1)
    return time.monotonic() - started


def one_run(switches: int, spare: bool) -> tuple[list[float], list[float]]:
    """(live switch times, relaunch times) of one demo run."""
    with tempfile.TemporaryDirectory(prefix="gw-bench-reconf-", dir="/tmp") as home:
        env = dict(
            os.environ,
            GPUWATCH_HOME=home,
            GPUWATCH_DETACH="setsid",
            GPUWATCH_SPARE_TRAINER="1" if spare else "0",
        )
        os.environ["GPUWATCH_HOME"] = home
        started = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "train", "demo/demo.yaml", "--detach"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )
        if started.returncode != 0:
            raise SystemExit(f"gpuwatch train failed: {started.stderr}")
        (info,) = runs.list_runs(Path(home))
        socket_path = runs.socket_path_for(info.run_id, Path(home))
        try:
            first_step_end(info.run_dir, 1)
            hot: list[float] = []
            cold: list[float] = []
            prefetch = False
            for i in range(switches):
                # Alternate which goes first, so each way turns prefetch on as often as off.
                ways = ((True, hot), (False, cold)) if i % 2 == 0 else ((False, cold), (True, hot))
                for live, into in ways:
                    if spare and not live:
                        waited = wait_for_spare(info.run_dir, len(cold) + 1)
                        print(f"  (waited {waited:.1f} s more for the spare)", flush=True)
                    prefetch = not prefetch
                    attempt, sent, applied_live = asyncio.run(switch(socket_path, prefetch, live))
                    took = first_step_end(info.run_dir, attempt) - sent
                    if live and not applied_live:
                        raise SystemExit("the live change was not applied live")
                    into.append(took)
                    way = "live    " if live else ("relaunch+spare" if spare else "relaunch")
                    print(f"switch {i + 1} {way} prefetch={prefetch!s:5}: {took:.2f} s",
                          flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "gpuwatch", "stop", info.run_id],
                           cwd=ROOT, env=env, capture_output=True, timeout=120)
    return hot, cold


def summary(name: str, times: list[float]) -> float:
    p50 = statistics.median(times)
    print(f"{name:<15} median {p50:.2f} s ({min(times):.2f}-{max(times):.2f}) over {len(times)}")
    return p50


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--switches", type=int, default=SWITCHES)
    args = parser.parse_args()
    print("-- run 1: no spare trainer", flush=True)
    hot, cold = one_run(args.switches, spare=False)
    print("-- run 2: with the spare trainer", flush=True)
    hot_2, spare = one_run(args.switches, spare=True)
    hot_p50 = summary("live", hot + hot_2)
    cold_p50 = summary("relaunch", cold)
    spare_p50 = summary("relaunch+spare", spare)
    print(f"relaunch / relaunch+spare: {cold_p50 / spare_p50:.2f}x")
    print(
        f"result: hot_p50_s={hot_p50:.2f} relaunch_p50_s={cold_p50:.2f} "
        f"relaunch_spare_p50_s={spare_p50:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
