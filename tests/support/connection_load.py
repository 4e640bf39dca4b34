"""Connection load on a run's socket from a process of its own: idle connections, then bursts.

``python -m tests.support.connection_load SOCKET --idle N --burst M`` opens N connections
that never send a byte (blocking connects, one after another: each waits for room in the
listen backlog) and prints ``idle N``. Then each line ``burst`` on stdin opens M more at
once: M non-blocking sockets connected in a tight loop, those refused for a full backlog
(EAGAIN) tried again until connected or 10 s pass; it prints ``burst CONNECTED REFUSED``
(connects that succeeded, and EAGAIN answers seen on the way); a burst that finds the
socket gone (the supervisor exited) stops there. It holds every connection until stdin
ends, then exits. A connection the supervisor closes stays closed.
"""

from __future__ import annotations

import argparse
import errno
import resource
import socket
import sys
import time

BURST_DEADLINE_S = 10.0


def open_idle(path: str, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Blocking, no timeout: a socket timeout makes CPython connect non-blocking, and
        # an AF_UNIX connect on a full backlog then raises EAGAIN instead of waiting.
        sock.connect(path)
        held.append(sock)
    return held


def burst(path: str, count: int) -> tuple[list[socket.socket], int]:
    """Connect count sockets at once; (the connected ones, EAGAIN answers seen)."""
    waiting = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        waiting.append(sock)
    connected: list[socket.socket] = []
    refused = 0
    deadline = time.monotonic() + BURST_DEADLINE_S
    while waiting and time.monotonic() < deadline:
        still = []
        for sock in waiting:
            try:
                sock.connect(path)
            except BlockingIOError as exc:
                if exc.errno != errno.EAGAIN:
                    raise
                refused += 1
                still.append(sock)
            except (ConnectionRefusedError, FileNotFoundError):
                sock.close()  # the supervisor is gone: no point in the rest
                deadline = 0.0
            else:
                connected.append(sock)
        waiting = still
    for sock in waiting:
        if sock.fileno() >= 0:
            sock.close()
    return connected, refused


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.connection_load")
    parser.add_argument("socket")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=200)
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = open_idle(args.socket, args.idle)
    print(f"idle {len(held)}", flush=True)
    for line in sys.stdin:
        if line.strip() == "burst":
            connected, refused = burst(args.socket, args.burst)
            held.extend(connected)
            print(f"burst {len(connected)} {refused}", flush=True)
    for sock in held:
        sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
