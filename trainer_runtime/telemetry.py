"""Non-blocking telemetry emitter: frames go out over the supervisor's socket fd.

The training thread only appends a typed event (trainer_runtime.protocol) to a
bounded deque (no JSON, no syscalls); a sender thread encodes and writes. When
the reader lags and the deque is full, the newest frame is dropped and counted
(the trainer puts the count in every step's ``dropped`` field). A reader thread watches for the peer
closing (``recv`` returns b'') and the sender for EPIPE/ECONNRESET: either sets
``lost``, and the training loop then checkpoints and exits 0 (reason
``socket_lost``) so no orphan trainer outlives a killed supervisor.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

from trainer_runtime import protocol


class NullEmitter:
    """Stands in when there is no telemetry fd."""

    dropped = 0
    sent = 0

    @property
    def lost(self) -> bool:
        return False

    def emit(self, event: protocol.Event, t: float | None = None) -> None:
        pass

    def close(self, timeout_s: float = 2.0) -> None:
        pass


class SocketEmitter:
    def __init__(self, sock: socket.socket, buffer_frames: int = 4096) -> None:
        self._sock = sock
        self._limit = buffer_frames
        self._queue: collections.deque[tuple[protocol.Event, float]] = collections.deque()
        self._wake = threading.Condition(threading.Lock())
        self._closing = False
        self._lost = threading.Event()
        self.dropped = 0
        self.sent = 0
        self._sender = threading.Thread(target=self._send_loop, name="telemetry-send", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="telemetry-read", daemon=True)
        self._sender.start()
        self._reader.start()

    @classmethod
    def from_fd(cls, fd: int, buffer_frames: int = 4096) -> SocketEmitter:
        return cls(socket.socket(fileno=fd), buffer_frames)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def emit(self, event: protocol.Event, t: float | None = None) -> None:
        """Queue an event (t: when it happened, default now); never blocks. Drops when full."""
        if self._lost.is_set():
            return
        # deque appends are atomic under the GIL; the length check may race with
        # the sender popping, which only ever makes room.
        if len(self._queue) >= self._limit:
            self.dropped += 1
            return
        self._queue.append((event, time.time() if t is None else t))
        if len(self._queue) == 1:
            with self._wake:
                self._wake.notify()

    def _send_loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait(0.5)
                if not self._queue and self._closing:
                    return
            chunks: list[bytes] = []
            while self._queue and len(chunks) < 256:
                event, t = self._queue.popleft()
                try:
                    chunks.append(protocol.encode_event(event, t=t))
                except (protocol.ProtocolError, ValueError, TypeError):
                    self.dropped += 1  # e.g. a NaN loss; never crash the sender
            try:
                self._sock.sendall(b"".join(chunks))
                self.sent += len(chunks)
            except OSError:
                self._lost.set()
                return

    def _read_loop(self) -> None:
        # The supervisor sends nothing we act on; reading only detects its death.
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                if not self._closing:
                    self._lost.set()
                return

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued (up to a deadline), then close the socket."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._sender.join(max(0.0, deadline - time.monotonic()))
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
