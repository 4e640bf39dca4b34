"""TCP ports for TensorFlow's workers: taken outside the kernel's ephemeral range.

A multi-worker trainer binds its gRPC port (the wildcard address, IPv6 and IPv4) only
after importing TensorFlow, seconds after the port was chosen. A port the kernel hands
out itself (``bind(("", 0))``) comes from the ephemeral range, the same range every
outgoing connection on the box takes its local port from: in those seconds any
process's connect() may take it, and the trainer then dies with "Could not start gRPC
server" (seen in a relaunch on a busy box, 2026-11-27). A port below (or above) that
range is never given out unasked; only a program that names it binds it. So
``reserve_port()`` binds a random such port on the IPv4 and (where the box has it) the
IPv6 wildcard, and keeps it (not listening) until the caller releases it just before the
trainer starts.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import socket
from pathlib import Path

# A short name of its own: supervisor.log names each line's source by it.
log = logging.getLogger("gpuwatch.ports")

# Linux's default range, when /proc says nothing.
DEFAULT_EPHEMERAL = (32768, 60999)
# Below this, ports belong to services more often than not.
LOWEST = 10000
TRIES = 64

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class Reservation:
    """A port held by this process: bound (never listening) on the IPv4 wildcard and, where
    the box has IPv6, the IPv6 one; ``release()`` lets it go (once; again is harmless)."""

    def __init__(self, port: int, sockets: list[socket.socket]) -> None:
        self.port = port
        self._sockets = sockets

    def release(self) -> None:
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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
) -> Reservation:
    """A port free on every wildcard address, outside the ephemeral range, held.

    The caller hands the port on and releases it just before the trainer binds it. If no
    such port is free after TRIES draws (or there is no room outside the range), one the
    kernel picks instead, with a warning: that one may be taken before the trainer binds.
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
        held = hold(port)
        if held is not None:
            return held
    log.warning("no free port outside the ephemeral range %s after %d tries: "
                "one from the kernel", ephemeral or ephemeral_range(), TRIES)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", 0))
    return Reservation(int(sock.getsockname()[1]), [sock])


def reserve_ports(count: int) -> list[Reservation]:
    """`count` reserved ports, all different (each held until released)."""
    return [reserve_port() for _ in range(count)]


def hold(port: int) -> Reservation | None:
    """The port held on the IPv4 wildcard and (where the box has it) the IPv6 one; None if
    anything holds it on either."""
    # No SO_REUSEADDR: stricter than the trainer's own bind (gRPC sets it), the bind fails
    # if anything holds the port, a listener, a connection or one still in TIME_WAIT.
    sockets: list[socket.socket] = []
    try:
        v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sockets.append(v4)
        v4.bind(("", port))
        if socket.has_ipv6:
            try:
                v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            except OSError:  # no IPv6 on this box: the IPv4 hold is all there is
                return Reservation(port, sockets)
            sockets.append(v6)
            v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                v6.bind(("::", port))
            except OSError as exc:
                if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                    raise
                sockets.pop().close()
    except OSError:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        return None
    return Reservation(port, sockets)
