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

While it hangs it reads its socket: a reconfigure frame is answered `reconfigured` (ok, then
one more step) unless $GPUWATCH_FAKE_RECONFIGURE says "refuse" (ok false, a message),
"ignore" (no answer) or "late" (ok after 1.5 s: a switch that outlasts a shortened wait).
Its pid never changes: a live change is the same process.

With $GPUWATCH_FAKE_TRAINER_GATE set to a path, it waits for that path to exist before
anything else (after launch-<attempt>.json): a test attaches its dashboard first, so a run
that ends at once cannot end before it.

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


def step(attempt: int, number: int) -> Step:
    return Step(attempt=attempt, step=number, micro_step=number, epoch=0, loss=0.5, lr=0.01,
                examples=64, position=64 * number, step_time_ms=10.0, input_wait_ms=1.0,
                grad_sync_bytes=0)


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
