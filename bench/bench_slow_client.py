"""Does a dashboard that stops reading slow training down? (issue: runs outlive the terminal)

Runs the same short, compute-bound job through the real supervisor several times,
alternating: no client attached, and a client that subscribes and never reads a
byte. Throughput comes from the trainer's own step events (median examples/s after
warm-up). Prints each run, the medians, the supervisor's peak RSS, and a last line
`result: ratio_stalled_client=X` (stalled / none; target >= 0.98).

    .venv/bin/python bench/bench_slow_client.py [--reps 4] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """
name: bench-slow-client
model: {name: mlp, hidden_units: [512, 512]}
data: {examples: 8192, input_shape: [784], classes: 10, prefetch: on}
train: {global_batch_size: 256}
checkpoint: {every_steps: 100000}
"""
WARMUP_STEPS = 50


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def one_run(home: Path, config: Path, steps: int, stalled: bool) -> tuple[float, int]:
    env = dict(os.environ, GPUWATCH_HOME=str(home), GPUWATCH_DETACH="setsid")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwatch",
            "train",
            str(config),
            "--detach",
            "--max-steps",
            str(steps),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    run_id = out.stdout.strip().splitlines()[-1]
    run_dir = home / "runs" / run_id
    info = json.loads((run_dir / "supervisor.json").read_text())
    client = None
    if stalled:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(info["socket"])
        client.sendall(b'{"v":1,"type":"subscribe","id":1,"from_seq":0}\n')
    peak = 0
    events_path = run_dir / "events.jsonl"
    while True:
        peak = max(peak, rss_kib(info["pid"]))
        lines = events_path.read_text().splitlines()
        last = json.loads(lines[-1]) if lines else {}
        if last.get("type") == "status" and last.get("status") in ("finished", "crashed"):
            break
        time.sleep(0.5)
    if client is not None:
        client.close()
    subprocess.run(
        [sys.executable, "-m", "gpuwatch", "stop", run_id],
        env=env,
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    step_events = [json.loads(x) for x in lines if '"type":"step"' in x][WARMUP_STEPS:]
    rates = [e["examples"] * 1000.0 / e["step_time_ms"] for e in step_events]
    return statistics.median(rates), peak


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"none": [], "stalled": []}
    peaks: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        config = home / "bench.yaml"
        config.write_text(CONFIG)
        for rep in range(args.reps):
            order = ("none", "stalled") if rep % 2 == 0 else ("stalled", "none")
            for mode in order:
                rate, peak = one_run(home, config, args.steps, stalled=mode == "stalled")
                results[mode].append(rate)
                if mode == "stalled":
                    peaks.append(peak)
                print(
                    f"rep {rep + 1} {mode:>7}: {rate:10.0f} examples/s  supervisor peak RSS "
                    f"{peak / 1024:.1f} MiB",
                    flush=True,
                )
    med = {k: statistics.median(v) for k, v in results.items()}
    spread = {k: (max(v) - min(v)) / med[k] * 100 for k, v in results.items()}
    for mode in ("none", "stalled"):
        print(f"{mode:>7}: median {med[mode]:10.0f} examples/s, spread {spread[mode]:.1f}%")
    print(f"supervisor peak RSS with a stalled client: {max(peaks) / 1024:.1f} MiB")
    print(f"result: ratio_stalled_client={med['stalled'] / med['none']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
