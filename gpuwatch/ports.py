"""TCP ports for TensorFlow's workers: taken outside the kernel's ephemeral range.

A multi-worker trainer binds its gRPC port (0.0.0.0:<port>) only after importing
TensorFlow, seconds after the port was chosen. A port the kernel hands out itself
(``bind(("", 0))``) comes from the ephemeral range, the same range every outgoing
connection on the box takes its local port from: in those seconds any process's
connect() may take it, and the trainer then dies with "Could not start gRPC server"
(seen in a relaunch on a busy box, 2026-11-27). A port below (or above) that range is
never given out unasked; only a program that names it binds it. So:
``reserve_port()`` binds a random such port, free on every address, and keeps the
socket (not listening) until the caller closes it just before the trainer starts.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default range, when /proc says nothing.
DEFAULT_EPHEMERAL = (32768, 60999)
# Below this, ports belong to services more often than not.
LOWEST = 10000
TRIES = 64

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), or Linux's default."""
    try:
        first, last = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    if not 1 <= first <= last <= 65535:
        return DEFAULT_EPHEMERAL
    return first, last


def candidate_ports(ephemeral: tuple[int, int]) -> list[range]:
    """The ranges a reserved port is drawn from: at least LOWEST, outside `ephemeral`."""
    first, last = ephemeral
    ranges = [range(LOWEST, first), range(max(LOWEST, last + 1), 65536)]
    return [r for r in ranges if len(r) > 0]


def reserve_port(
    ephemeral: tuple[int, int] | None = None, rng: random.Random | None = None
) -> socket.socket:
    """A TCP socket bound to a port free on every address, outside the ephemeral range.

    The caller reads the port (``getsockname()[1]``), hands it on, and closes the socket
    just before the trainer binds it. If no such port is free after TRIES draws (or there
    is no room outside the range), one from the kernel instead.
    """
    pick = rng or random.SystemRandom()
    ranges = candidate_ports(ephemeral or ephemeral_range())
    total = sum(len(r) for r in ranges)
    for _ in range(TRIES if total else 0):
        index = pick.randrange(total)
        for r in ranges:
            if index < len(r):
                port = r[index]
                break
            index -= len(r)
        sock = _bound(port)
        if sock is not None:
            return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    return sock


def reserve_ports(count: int) -> list[socket.socket]:
    """`count` reserved ports, all different (each held until its socket is closed)."""
    return [reserve_port() for _ in range(count)]


def _bound(port: int) -> socket.socket | None:
    # No SO_REUSEADDR: the bind fails if anything holds the port on any address, a
    # listener, a connection or one still in TIME_WAIT, as the trainer's own bind would.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", port))
    except OSError:
        sock.close()
        return None
    return sock
