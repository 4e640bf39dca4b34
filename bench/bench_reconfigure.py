"""Bench: a settings change applied live at any age of a run, against a relaunch, on the demo.

Not a test: starts `gpuwatch train demo/demo.yaml --detach` (a real supervisor and
trainer, no spare trainer) in a private GPUWATCH_HOME and flips data.prefetch with
`relaunch` live=true (applied in the running trainer, the command the dashboard's `r`
sends) at run ages 10 s, 40 s, 70 s, ... up to --max-age-s (each switch 30 s after
the last, so every old pipeline is 30 s old or more: past the first few seconds, where
tearing a tf.data pipeline down is quick, into the range where its autotuner sleeps
for tens of seconds). The age is counted from the end of the run's first step. Then it
flips it RELAUNCHES times with live=false (stop, then a trainer process, TensorFlow
import, rebuild, restore).

Each switch is timed from the command being sent to the end of the first step under
the new settings (that step's own end time, in events.jsonl); a live one also shows
when the supervisor's answer came and what the trainer's `reconfigured` event said.
Prints every switch, the medians and a last line
``result: hot_p50_s=X hot_max_s=Y relaunch_p50_s=Z age_max_s=A`` (targets: X <= 1.5,
Y <= 3). Takes about 7 minutes with the defaults.
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

from gpuwatch.follow.client import RunClient  # noqa: E402
from gpuwatch.runs import folders  # noqa: E402

FIRST_AGE_S = 10.0
EVERY_S = 30.0
MAX_AGE_S = 310.0
RELAUNCHES = 3
STEPS_AFTER = 30  # steps under the new settings before a switch counts as done
TEARDOWN_LINE = "old input pipeline torn down in"  # trainer_runtime/teardown.py's log line


def events(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def first_step_end(run_dir: Path, attempt: int, timeout_s: float = 120) -> float:
    """When the first step of `attempt` ended (its own clock), once it has STEPS_AFTER."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        steps = [e for e in events(run_dir) if e["type"] == "step" and e["attempt"] == attempt]
        if len(steps) >= STEPS_AFTER:
            return float(steps[0]["t"])
        time.sleep(0.1)
    raise SystemExit(f"attempt {attempt} did not reach {STEPS_AFTER} steps")


def reconfigured_seconds(run_dir: Path, attempt: int) -> float | None:
    """The trainer's own time for the switch to `attempt` (its `reconfigured` event: the one
    recorded just before attempt's `attempt` event)."""
    answer = None
    for event in events(run_dir):
        if event["type"] == "reconfigured" and event["ok"]:
            answer = event
        elif event["type"] == "attempt" and event["attempt"] == attempt and answer is not None:
            return float(answer["seconds"])
    return None


async def switch(socket_path: Path, prefetch: bool, live: bool) -> tuple[int, float, float, bool]:
    """(attempt, sent, answered, applied live): wall-clock times."""
    async with RunClient(socket_path) as client:
        sent = time.time()
        reply = await client.command(
            "relaunch", overrides={"data.prefetch": prefetch}, live=live
        )
        answered = time.time()
    return int(reply["attempt"]), sent, answered, bool(reply.get("live"))


def one_run(max_age_s: float, relaunches: int) -> tuple[list[float], list[float], float]:
    """(live switch times, relaunch times, the oldest age switched at) of one demo run."""
    with tempfile.TemporaryDirectory(prefix="gw-bench-reconf-", dir="/tmp") as home:
        env = dict(os.environ, GPUWATCH_HOME=home, GPUWATCH_DETACH="setsid",
                   GPUWATCH_SPARE_TRAINER="0")
        os.environ["GPUWATCH_HOME"] = home
        started = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "train", "demo/demo.yaml", "--detach"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )
        if started.returncode != 0:
            raise SystemExit(f"gpuwatch train failed: {started.stderr}")
        (info,) = folders.list_runs(Path(home))
        socket_path = folders.socket_path_for(info.run_id, Path(home))
        hot: list[float] = []
        cold: list[float] = []
        age_max = 0.0
        try:
            first_end = first_step_end(info.run_dir, 1)
            # The step events' clock is wall time on this host (time.time()).
            prefetch = False
            last_sent: float | None = None
            age = FIRST_AGE_S
            while age <= max_age_s:
                delay = first_end + age - time.time()
                if delay > 0:
                    time.sleep(delay)
                prefetch = not prefetch
                attempt, sent, answered, live = asyncio.run(switch(socket_path, prefetch, True))
                if not live:
                    raise SystemExit("the live change was not applied live")
                took = first_step_end(info.run_dir, attempt) - sent
                trainer_s = reconfigured_seconds(info.run_dir, attempt)
                age_now = sent - first_end
                since = f"{sent - last_sent:5.1f} s" if last_sent is not None else "  (first)"
                print(f"live     age {age_now:5.1f} s (last switch {since} before) "
                      f"prefetch={prefetch!s:5}: {took:.2f} s to the first new step "
                      f"(answered {answered - sent:.2f} s, trainer {trainer_s} s)", flush=True)
                hot.append(took)
                age_max = max(age_max, age_now)
                last_sent = sent
                age += EVERY_S
            # Where the old pipelines' teardowns went: the trainer logs each one's time.
            log = (info.run_dir / "trainer.log").read_text(errors="replace")
            teardowns = [line.rsplit(" in ", 1)[-1].split("s ", 1)[0]
                         for line in log.splitlines() if TEARDOWN_LINE in line]
            print(f"old pipelines torn down off the training thread in (s): "
                  f"{' '.join(teardowns) or 'none logged'}", flush=True)
            for _ in range(relaunches):
                prefetch = not prefetch
                attempt, sent, _answered, _live = asyncio.run(
                    switch(socket_path, prefetch, False))
                took = first_step_end(info.run_dir, attempt) - sent
                print(f"relaunch prefetch={prefetch!s:5}: {took:.2f} s", flush=True)
                cold.append(took)
        finally:
            subprocess.run([sys.executable, "-m", "gpuwatch", "stop", info.run_id],
                           cwd=ROOT, env=env, capture_output=True, timeout=120)
    return hot, cold, age_max


def summary(name: str, times: list[float]) -> float:
    p50 = statistics.median(times)
    print(f"{name:<9} median {p50:.2f} s ({min(times):.2f}-{max(times):.2f}) over {len(times)}")
    return p50


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-age-s", type=float, default=MAX_AGE_S,
                        help="the oldest run age to switch at (every 30 s from 10 s)")
    parser.add_argument("--relaunches", type=int, default=RELAUNCHES)
    args = parser.parse_args()
    hot, cold, age_max = one_run(args.max_age_s, max(1, args.relaunches))
    hot_p50 = summary("live", hot)
    cold_p50 = summary("relaunch", cold)
    print(
        f"result: hot_p50_s={hot_p50:.2f} hot_max_s={max(hot):.2f} "
        f"relaunch_p50_s={cold_p50:.2f} age_max_s={age_max:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
