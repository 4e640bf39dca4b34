"""A simulated worker for bench/bench_scale.py: the trainer's arguments and telemetry
frames, no TensorFlow.

Run by the real agent as ``python -m bench.sim_worker`` (GPUWATCH_TRAINER_MODULE), it
sends a hello (its worker index from --worker, the cluster's size from
$GPUWATCH_SIM_WORKERS), then one step every $GPUWATCH_SIM_STEP_MS ms (default 25: 40
updates a second) until SIGTERM, then done. Every worker's step takes the same time
(synchronous training); each computes ~8 ms and waits ~1 ms on its input, but worker
$GPUWATCH_SIM_STRAGGLER, from the wall-clock time written in the file
$GPUWATCH_SIM_STRAGGLE_AT_FILE on (read again each second), waits ~12 ms (it becomes
input-bound: the straggler the bench times the naming of).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import time
from pathlib import Path

from trainer_runtime.protocol import Done, Hello, Step, encode_event


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--telemetry-fd", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--worker", type=int, default=0)
    args, _ = parser.parse_known_args()
    workers = int(os.environ.get("GPUWATCH_SIM_WORKERS", "1"))
    step_s = float(os.environ.get("GPUWATCH_SIM_STEP_MS", "25")) / 1000.0
    straggler = int(os.environ.get("GPUWATCH_SIM_STRAGGLER", "-1"))
    straggle_file = os.environ.get("GPUWATCH_SIM_STRAGGLE_AT_FILE")
    straggle_at, read_at = float("inf"), 0.0
    sock = socket.socket(fileno=args.telemetry_fd)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    attempt, worker = args.attempt, args.worker
    sock.sendall(encode_event(Hello(
        attempt=attempt, pid=os.getpid(), tf_version="sim", replicas=8 * workers,
        device_kind="gpu", devices=[f"/job:worker/replica:0/task:{worker}/device:GPU:{i}"
                                    for i in range(8)],
        param_count=25_000_000, param_bytes=100_000_000, global_batch_size=256 * workers,
        accumulation_steps=1, per_replica_batch=32, start_step=0, start_micro_step=0,
        worker=worker, workers=workers, host=f"sim-{worker:02d}",
    ), t=time.time()))
    rng = random.Random(worker)
    number = 0
    due = time.monotonic()
    while not stopping:
        due += step_s
        time.sleep(max(0.0, due - time.monotonic()))
        number += 1
        now = time.time()
        if worker == straggler and straggle_file and now - read_at >= 1.0:
            read_at = now
            with contextlib.suppress(OSError, ValueError):
                straggle_at = float(Path(straggle_file).read_text())
        late = worker == straggler and now >= straggle_at
        step_ms = step_s * 1000.0 * rng.uniform(0.97, 1.03)
        wait = (12.0 if late else 1.0) * rng.uniform(0.9, 1.1)
        compute = 8.0 * rng.uniform(0.95, 1.05)
        update = 1.0
        sync = max(0.0, step_ms - wait - compute - update - 0.5)
        sock.sendall(encode_event(Step(
            attempt=attempt, step=number, micro_step=number, epoch=0,
            loss=2.0 / (1.0 + 0.001 * number), lr=0.1, examples=256, step_time_ms=step_ms,
            input_wait_ms=wait, grad_sync_bytes=100_000_000.0, position=256 * number,
            worker=worker, compute_ms=compute, sync_ms=sync, update_ms=update,
        ), t=now))
    sock.sendall(encode_event(Done(attempt=attempt, reason="sigterm", step=number,
                                   worker=worker), t=time.time()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
