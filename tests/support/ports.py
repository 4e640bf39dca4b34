"""Whether a port is free, as a trainer would find it."""

from __future__ import annotations

import errno
import socket


def can_bind(port: int) -> bool:
    """Whether a trainer could bind the port now on the IPv4 wildcard (and IPv6's, where
    the box has it), as TensorFlow's gRPC server does."""
    families = [(socket.AF_INET, "")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, address in families:
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with probe:
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind((address, port))
            except OSError as exc:
                if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                    continue  # IPv6 switched off in the kernel
                return False
    return True
