"""A stand-in for ``python -m trainer_runtime`` in the agent's tests: the same arguments and
telemetry frames, no TensorFlow, done in milliseconds.

What it does is the word in $GPUWATCH_FAKE_TRAINER (the --config file is not read):
  finish    hello, a step, done (max_steps), exit 0
  crash     hello, a step, an error line on stderr and an error frame, exit 1
  killed    hello, a step, "Fatal Python error: Aborted" on stderr, then SIGKILL itself
  hang      hello, then wait for SIGTERM; then done (signal), exit 0
  stubborn  hello, then ignore SIGTERM and wait to be killed
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading

from trainer_runtime.protocol import encode


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--telemetry-fd", type=int, required=True)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    mode = os.environ["GPUWATCH_FAKE_TRAINER"]
    sock = socket.socket(fileno=args.telemetry_fd)
    stop = threading.Event()
    if mode == "hang":
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    elif mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"fake trainer: attempt {args.attempt}, {mode}, fresh={args.fresh}", flush=True)
    sock.sendall(encode("hello", pid=os.getpid(), replicas=2, fresh=args.fresh))
    sock.sendall(encode("step", step=1, loss=0.5))
    if mode == "finish":
        sock.sendall(encode("done", reason="max_steps"))
        return 0
    if mode == "crash":
        print("ValueError: deliberate failure", file=sys.stderr, flush=True)
        sock.sendall(encode("error", kind="runtime", message="ValueError: deliberate failure"))
        return 1
    if mode == "killed":
        print("Fatal Python error: Aborted", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        stop.wait()
        sock.sendall(encode("done", reason="signal"))
        return 0
    while True:  # stubborn
        stop.wait(60)


if __name__ == "__main__":
    sys.exit(main())
