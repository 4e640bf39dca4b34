"""A stand-in for ``python -m trainer_runtime`` in the agent's tests: the same arguments and
telemetry frames, no TensorFlow, done in milliseconds.

What it does is the word in $GPUWATCH_FAKE_TRAINER (the --config file is not read):
  finish    hello, a step, done (max_steps), exit 0
  crash     hello, a step, an error line on stderr and an error frame, exit 1
  killed    hello, a step, "Fatal Python error: Aborted" on stderr, then SIGKILL itself
  hang      hello, then wait for SIGTERM (done "sigterm") or for its socket to close (the
            supervisor is gone: done "socket_lost", as the real trainer does); exit 0
  stubborn  hello, then ignore SIGTERM and wait to be killed
  slow      3 s of start-up (SIGTERM kills it then, as during TensorFlow's import), then hang
  refuse    an error frame (kind "factory": bad input), exit 2 before any step
  steps     hello, then the config's train.max_steps steps at its device count (its
            strategy.replicas, or cluster.workers) and global batch, done (max_steps), exit 0.
            Step times: $GPUWATCH_FAKE_STEP_MS ("1=10,2=12.5": ms at each count), each
            spread by up to $GPUWATCH_FAKE_STEP_SPREAD (a fraction, default 0.2) over a
            fixed sequence (step_times): the same at every count, nothing random

While it hangs it reads its socket: a reconfigure frame is answered `reconfigured` (ok, then
one more step) unless $GPUWATCH_FAKE_RECONFIGURE says "refuse" (ok false, a message),
"ignore" (no answer) or "late" (ok after 1.5 s: a switch that outlasts a shortened wait).
Its pid never changes: a live change is the same process.

With $GPUWATCH_FAKE_TRAINER_GATE set to a path, it waits for that path to exist before
anything else (after launch-<attempt>.json): a test attaches its dashboard first, so a run
that ends at once cannot end before it. $GPUWATCH_FAKE_TRAINER_FROM ("3=hang") switches the
mode from that attempt on: a scaling probe's later attempts may hang until stopped.

A cluster's workers may do different things: "hang,1=killed" is hang for every worker
but worker 1, which is killed. Each run writes its arguments and TF_CONFIG to
launch-<attempt>.json in its --run-dir, for the tests to read.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time

from trainer_runtime.changes import live_changes
from trainer_runtime.protocol import (
    Done,
    Error,
    FrameBuffer,
    Hello,
    Reconfigured,
    Step,
    encode_event,
)


def step(attempt: int, number: int, examples: int = 64, step_time_ms: float = 10.0) -> Step:
    return Step(attempt=attempt, step=number, micro_step=number, epoch=0, loss=0.5, lr=0.01,
                examples=examples, position=examples * number, step_time_ms=step_time_ms,
                input_wait_ms=1.0, grad_sync_bytes=0)


GOLDEN = (5 ** 0.5 - 1) / 2


def step_times(base_ms: float, spread: float, steps: int) -> list[float]:
    """`steps` step times around base_ms, each within +-spread of it: the i-th at
    base_ms x (1 + spread x (2 x frac(i x 0.618...) - 1)), spread evenly and the same
    sequence at every count (so two counts' medians differ only by their bases)."""
    return [base_ms * (1.0 + spread * (2.0 * ((i * GOLDEN) % 1.0) - 1.0))
            for i in range(1, steps + 1)]


def attempt_mode(spec: str, attempt: int, mode: str) -> str:
    """$GPUWATCH_FAKE_TRAINER_FROM "3=hang": from attempt 3 on, hang."""
    first, _, later = spec.partition("=")
    return later if spec and attempt >= int(first) else mode


def run_steps(sock: socket.socket, attempt: int, config_path: str, worker: int) -> None:
    """The steps mode: the config's steps at its count and batch, timed as the env says."""
    from gpuwatch.config import load_config

    config = load_config(config_path).config
    steps = config.train.max_steps or 1
    cluster = config.cluster
    count = cluster.count if cluster is not None else (config.strategy.replicas or 1)
    batch = config.train.global_batch_size
    by_count = dict(item.split("=") for item in os.environ["GPUWATCH_FAKE_STEP_MS"].split(","))
    spread = float(os.environ.get("GPUWATCH_FAKE_STEP_SPREAD", "0.2"))
    times = step_times(float(by_count[str(count)]), spread, steps)
    frames = [Hello(attempt=attempt, pid=os.getpid(), tf_version="fake", replicas=count,
                    device_kind="cpu", devices=[f"CPU:{i}" for i in range(count)],
                    param_count=1, param_bytes=4, global_batch_size=batch,
                    accumulation_steps=1, per_replica_batch=batch // count, start_step=0,
                    start_micro_step=0, worker=worker)]
    frames += [step(attempt, number, batch, ms) for number, ms in enumerate(times, 1)]
    frames.append(Done(attempt=attempt, reason="max_steps", step=steps))
    sock.sendall(b"".join(encode_event(frame) for frame in frames))


def worker_mode(spec: str, worker: int) -> str:
    """"hang,1=killed": worker 1 is killed, the others hang."""
    default, *special = spec.split(",")
    for item in special:
        index, _, mode = item.partition("=")
        if int(index) == worker:
            return mode
    return default


def answer_reconfigures(
    sock: socket.socket, attempt: int, send: threading.Lock, config_path: str,
    lost: threading.Event | None = None,
) -> None:
    """Read frames down the socket; answer each reconfigure as $GPUWATCH_FAKE_RECONFIGURE says."""
    from gpuwatch.config import load_config

    how = os.environ.get("GPUWATCH_FAKE_RECONFIGURE", "ok")
    frames = FrameBuffer()
    last_step = 1
    try:
        settings = load_config(config_path).config.model_dump(mode="json")
    except Exception:  # a remote test's one-line config: every key reads as changed
        settings = {}
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:  # the supervisor is gone
            if lost is not None:
                lost.set()
            return
        for frame in frames.feed(chunk):
            if frame.get("type") != "reconfigure" or how == "ignore":
                continue
            changed = live_changes(settings, frame["settings"])[0]
            if how == "refuse":
                answer = Reconfigured(attempt=attempt, id=frame["id"], ok=False, step=last_step,
                                      changed=changed, seconds=0.0,
                                      message="fake: cannot apply this change")
                with send:
                    sock.sendall(encode_event(answer))
                continue
            if how == "late":
                time.sleep(1.5)
            settings = frame["settings"]
            answer = Reconfigured(attempt=attempt, id=frame["id"], ok=True, step=last_step,
                                  changed=changed, seconds=0.01)
            last_step += 1
            with send:
                sock.sendall(encode_event(answer) + encode_event(step(attempt, last_step)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--telemetry-fd", type=int, required=True)
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--chief-dir", default=None)
    args = parser.parse_args()
    mode = worker_mode(os.environ["GPUWATCH_FAKE_TRAINER"], args.worker)
    mode = attempt_mode(os.environ.get("GPUWATCH_FAKE_TRAINER_FROM", ""), args.attempt, mode)
    with open(os.path.join(args.run_dir, f"launch-{args.attempt}.json"), "w") as fh:
        json.dump({"argv": sys.argv[1:], "tf_config": os.environ.get("TF_CONFIG"),
                   "pid": os.getpid()}, fh)
    gate = os.environ.get("GPUWATCH_FAKE_TRAINER_GATE")
    while gate and not os.path.exists(gate):  # SIGTERM's default action ends it meanwhile
        time.sleep(0.02)
    sock = socket.socket(fileno=args.telemetry_fd)
    stop = threading.Event()
    if mode == "slow":
        time.sleep(3.0)  # SIGTERM's default action ends it meanwhile
        mode = "hang"
    if mode == "refuse":
        print("error: fake: no such factory", file=sys.stderr, flush=True)
        sock.sendall(encode_event(Error(attempt=args.attempt, kind="factory",
                                        message="fake: no such factory")))
        return 2
    if mode == "hang":
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    elif mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"fake trainer: attempt {args.attempt}, {mode}, fresh={args.fresh}", flush=True)
    attempt = args.attempt
    if mode == "steps":
        run_steps(sock, attempt, args.config, args.worker)
        return 0
    sock.sendall(encode_event(Hello(
        attempt=attempt, pid=os.getpid(), tf_version="fake", replicas=2, device_kind="cpu",
        devices=["CPU:0", "CPU:1"], param_count=1, param_bytes=4, global_batch_size=64,
        accumulation_steps=1, per_replica_batch=32, start_step=0, start_micro_step=0,
        worker=args.worker)) + encode_event(step(attempt, 1)))  # one write: read together
    if mode == "finish":
        sock.sendall(encode_event(Done(attempt=attempt, reason="max_steps", step=1)))
        return 0
    if mode == "crash":
        print("ValueError: deliberate failure", file=sys.stderr, flush=True)
        sock.sendall(encode_event(Error(attempt=attempt, kind="runtime",
                                        message="ValueError: deliberate failure")))
        return 1
    if mode == "killed":
        print("Fatal Python error: Aborted", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        send = threading.Lock()
        lost = threading.Event()
        threading.Thread(target=answer_reconfigures,
                         args=(sock, attempt, send, args.config, lost), daemon=True).start()
        while not stop.wait(0.05):
            if lost.is_set():
                print("fake trainer: the supervisor is gone; exiting", flush=True)
                return 0
        with send:
            sock.sendall(encode_event(Done(attempt=attempt, reason="sigterm", step=1)))
        return 0
    while True:  # stubborn
        stop.wait(60)


if __name__ == "__main__":
    sys.exit(main())
