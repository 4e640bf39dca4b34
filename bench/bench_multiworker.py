"""Bench: one worker against two local workers under MultiWorkerMirroredStrategy.

Not a test: prints examples/s for each (median over the steps after warm-up, per
repeat, repeats interleaved) and a last line ``result: scaling_2w=X`` (two workers'
examples/s over one worker's). Same model (784-512-512-10 MLP), same built-in data,
same global batch (256); each worker is a real ``python -m trainer_runtime`` process
with its own TF_CONFIG on loopback, as gpuwatch's local launcher starts them.

On a CPU-only machine every worker is one CPU replica and the workers share the
same cores, so the figure measures the multi-worker overhead (gRPC collectives,
two processes), not a speed-up; on hosts with their own GPUs it is the scaling.
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
sys.path.insert(0, str(ROOT))

from gpuwatch.supervisor.ports import reserve_ports  # noqa: E402
from trainer_runtime.protocol import FrameBuffer, Step, parse_event  # noqa: E402

STEPS = 120
WARMUP = 20
REPEATS = 3

CONFIG = {
    "name": "bench-multiworker",
    "model": {"hidden_units": [512, 512]},
    "data": {"examples": 16384, "input_shape": [784], "prefetch": "autotune",
             "parallel_calls": "autotune"},
    "train": {"global_batch_size": 256, "optimizer": "adam", "max_steps": STEPS},
    "checkpoint": {"enabled": False},
}


def free_ports(n: int) -> list[int]:
    """n different ports outside the ephemeral range, as the supervisor picks them."""
    held = reserve_ports(n)
    for reservation in held:
        reservation.release()
    return [reservation.port for reservation in held]


def run_cluster(workers: int, tmp: Path) -> float:
    """Train STEPS updates with `workers` local workers; the chief's median examples/s."""
    config = dict(CONFIG, cluster={"launcher": "local", "workers": workers, "timeout_s": 60})
    config_path = tmp / f"bench-{workers}w.json"
    config_path.write_text(json.dumps(config))
    ports = free_ports(workers)
    addresses = [f"localhost:{port}" for port in ports]
    procs, socks = [], []
    for index in range(workers):
        run_dir = tmp / f"w{workers}-{index}-{time.monotonic_ns()}"
        run_dir.mkdir()
        parent, child = socket.socketpair()
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), TF_CONFIG=json.dumps(
            {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}))
        cmd = [sys.executable, "-m", "trainer_runtime", "--run-dir", str(run_dir),
               "--config", str(config_path), "--attempt", "1", "--worker", str(index),
               "--telemetry-fd", str(child.fileno()), "--fresh"]
        procs.append(subprocess.Popen(cmd, env=env, pass_fds=(child.fileno(),),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        child.close()
        socks.append(parent)
    rates: list[float] = []
    frames = FrameBuffer()
    with socks[0].makefile("rb") as chief:
        for chunk in iter(lambda: chief.read1(1 << 16), b""):
            for frame in frames.feed(chunk):
                _, event = parse_event(frame)
                if isinstance(event, Step) and event.step > WARMUP and event.examples_per_s:
                    rates.append(event.examples_per_s)
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"a worker failed ({proc.returncode}): {err.decode()[-2000:]}")
    for sock in socks:
        sock.close()
    if not rates:
        raise SystemExit("no step frames from the chief")
    return statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    one: list[float] = []
    two: list[float] = []
    with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-mw-") as tmp:
        for repeat in range(args.repeats):
            # Interleaved, so drift on a noisy machine falls on both alike.
            one.append(run_cluster(1, Path(tmp)))
            two.append(run_cluster(2, Path(tmp)))
            print(f"repeat {repeat + 1}: 1 worker {one[-1]:,.0f} ex/s, "
                  f"2 workers {two[-1]:,.0f} ex/s", flush=True)
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"1 worker:  {m1:,.0f} examples/s (median of {len(one)} runs, "
          f"{min(one):,.0f}-{max(one):,.0f})")
    print(f"2 workers: {m2:,.0f} examples/s (median of {len(two)} runs, "
          f"{min(two):,.0f}-{max(two):,.0f})")
    print(f"result: scaling_2w={m2 / m1:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
