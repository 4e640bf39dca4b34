"""Drill: stop a two-worker cluster run at random moments; every stop must end `stopped`.

A person types `gpuwatch stop RUN` whenever they like: while the workers start TensorFlow,
while the cluster forms, between updates, during a checkpoint. Each try starts
demo/multiworker.yaml's two local workers (detached, a private GPUWATCH_HOME), waits a
random time from the start, stops the run, and reads its end from `gpuwatch ls --json`.
A worker that dies in a collective because its peer left first is part of the stop.

    python bench/drill_cluster_stop.py [--tries 20] [--seed 1] [--longest-s 25] [--skew-s 2]

With --skew-s, the stop reaches one worker (chosen at random) up to that long before the
other, as a stop carried over ssh links or by Slurm can.

Prints one line a try and the count of each ending; exits 1 if any try did not end
`stopped` (or left a process of its run behind).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "demo" / "multiworker.yaml"


def gpuwatch(env: dict[str, str], *args: str,
             timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout_s, check=False)


def run_status(env: dict[str, str]) -> dict[str, object]:
    listing = gpuwatch(env, "ls", "--json").stdout.splitlines()
    return json.loads(listing[0]) if listing else {}


def left_behind(home: str) -> list[int]:
    """Processes whose command line or environment names this try's home."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if home.encode() in blob:
            pids.append(int(entry.name))
    return pids


def trainers(home: str) -> dict[int, int]:
    """This try's trainer processes: {worker index: pid}."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"trainer_runtime" in argv and b"--worker" in argv and home.encode() in environ:
            found[int(argv[argv.index(b"--worker") + 1])] = int(entry.name)
    return found


def one_try(index: int, wait_s: float, skew_s: float, rng: random.Random) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="gw-drill-") as home:
        env = {**os.environ, "GPUWATCH_HOME": home, "GPUWATCH_SPARE_TRAINER": "0",
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        started = time.monotonic()
        proc = gpuwatch(env, "train", str(CONFIG), "--detach")
        if proc.returncode != 0:
            return "not-started", proc.stderr.strip()[-300:]
        run_id = proc.stdout.split()[-1]
        time.sleep(max(0.0, wait_s - (time.monotonic() - started)))
        before = run_status(env)
        skewed = ""
        if skew_s > 0:
            # The stop reaches one worker first, as a stop over ssh or Slurm may: that
            # worker's trainer is signalled directly, the run stopped a moment later.
            pids = trainers(home)
            if pids:
                first = rng.choice(sorted(pids))
                lead_s = rng.uniform(0.0, skew_s)
                try:
                    os.kill(pids[first], 15)
                except ProcessLookupError:
                    pass
                time.sleep(lead_s)
                skewed = f", worker {first} {lead_s:.2f} s first"
        stop = gpuwatch(env, "stop", run_id, timeout_s=180)
        deadline = time.monotonic() + 120
        status: dict[str, object] = {}
        while time.monotonic() < deadline:
            status = run_status(env)
            if status.get("status") in ("stopped", "crashed", "finished"):
                break
            time.sleep(0.5)
        end = str(status.get("status"))
        message = str(status.get("message", ""))[:200]
        detail = (f"stopped at {time.monotonic() - started:5.1f} s, was {before.get('status')}"
                  f" step {before.get('step')}{skewed}; stop exit {stop.returncode}: {message}")
        time.sleep(1.0)
        leftovers = left_behind(home)
        for pid in leftovers:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        if leftovers:
            end = f"{end}+left-{len(leftovers)}"
        return end, detail


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--longest-s", type=float, default=25.0)
    parser.add_argument("--skew-s", type=float, default=0.0,
                        help="signal one worker's trainer up to this long before the stop")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ends: collections.Counter[str] = collections.Counter()
    for i in range(args.tries):
        wait_s = rng.uniform(0.0, args.longest_s)
        end, detail = one_try(i, wait_s, args.skew_s, rng)
        ends[end] += 1
        print(f"try {i + 1:2d}: wait {wait_s:5.1f} s -> {end:10s} {detail}", flush=True)
    print("ends:", dict(ends))
    return 0 if set(ends) == {"stopped"} else 1


if __name__ == "__main__":
    sys.exit(main())
