"""Non-blocking telemetry emitter: frames go out over the supervisor's socket fd.

The training thread only appends a typed event (trainer_runtime.protocol) to a
bounded deque (no JSON, no syscalls); a sender thread encodes and writes. When
the reader lags and the deque is full, the newest frame is dropped and counted
(the trainer puts the count in every step's ``dropped`` field). A reader thread watches for the peer
closing (``recv`` returns b'') and the sender for EPIPE/ECONNRESET: either sets
``lost``, and the training loop then checkpoints and exits 0 (reason
``socket_lost``) so no orphan trainer outlives a killed supervisor.

The one frame the supervisor sends down the socket is ``reconfigure``
(``protocol.reconfigure_frame``): the reader parses it and queues it for the
training loop (``take_request``), which applies it at an update boundary. Any
other frame, or garbage, is logged and ignored: it never stops the trainer.
"""

from __future__ import annotations

import collections
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime import protocol

log = logging.getLogger("trainer_runtime")

# Events a full queue still takes: rare, and the supervisor's record waits on them (a live
# change settles on `reconfigured`; the run's end on `done` or `error`).
NEVER_DROPPED = frozenset({"reconfigured", "done", "error", "hello"})

# How long the hook's sender (gpuwatch run) lets step frames gather before one send: a
# script's loop of 2 ms steps then wakes the supervisor (and its clients) some 20 times a
# second, not 500. The dashboard repaints once a second; frames that must not wait
# (NEVER_DROPPED) go at once. The runtime sends each step as it ends (gather_s 0): its
# tests and resume read the step frames up to a SIGKILL.
HOOK_GATHER_S = 0.05

# Requests waiting for the loop; more than this many unapplied is a confused sender.
MAX_PENDING_REQUESTS = 64


@dataclass(frozen=True)
class ReconfigureRequest:
    """Live settings the supervisor asked for: apply at the first boundary with step >= at_step,
    if that comes within deadline_s of its arrival (``received``, this process's clock)."""

    id: int
    settings: dict[str, Any]
    at_step: int
    deadline_s: float = protocol.LIVE_DEADLINE_S
    received: float = field(default_factory=time.monotonic)

    def age_s(self) -> float:
        return time.monotonic() - self.received

    @property
    def expired(self) -> bool:
        return self.age_s() > self.deadline_s


class NullEmitter:
    """Stands in when there is no telemetry fd."""

    dropped = 0
    sent = 0

    @property
    def lost(self) -> bool:
        return False

    def emit(self, event: protocol.Event, t: float | None = None) -> None:
        pass

    def take_request(self) -> ReconfigureRequest | None:
        return None

    def close(self, timeout_s: float = 2.0) -> None:
        pass


class SocketEmitter:
    def __init__(self, sock: socket.socket, buffer_frames: int = 4096,
                 gather_s: float = 0.0) -> None:
        self._sock = sock
        self._limit = buffer_frames
        self._gather_s = gather_s
        self._urgent = False
        self._queue: collections.deque[tuple[protocol.Event, float]] = collections.deque()
        self._wake = threading.Condition(threading.Lock())
        self._closing = False
        self._lost = threading.Event()
        self.dropped = 0
        self.sent = 0
        self._requests: queue.Queue[ReconfigureRequest] = queue.Queue(MAX_PENDING_REQUESTS)
        self._sender = threading.Thread(target=self._send_loop, name="telemetry-send", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="telemetry-read", daemon=True)
        self._sender.start()
        self._reader.start()

    @classmethod
    def from_fd(cls, fd: int, buffer_frames: int = 4096, gather_s: float = 0.0
                ) -> SocketEmitter:
        return cls(socket.socket(fileno=fd), buffer_frames, gather_s)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def emit(self, event: protocol.Event, t: float | None = None) -> None:
        """Queue an event (t: when it happened, default now); never blocks. Drops when full."""
        if self._lost.is_set():
            return
        # deque appends are atomic under the GIL; the length check may race with
        # the sender popping, which only ever makes room.
        if len(self._queue) >= self._limit and event.TYPE not in NEVER_DROPPED:
            self.dropped += 1
            return
        self._queue.append((event, time.time() if t is None else t))
        if event.TYPE in NEVER_DROPPED:
            with self._wake:
                self._urgent = True
                self._wake.notify()
        elif len(self._queue) == 1:
            with self._wake:
                self._wake.notify()

    def _send_loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait(0.5)
                if not self._queue and self._closing:
                    return
                # Let the steps of a fast loop gather (a frame that must not wait, or a
                # close, cuts it short): one send, and one wake-up of the supervisor, per
                # batch rather than per step.
                if (self._gather_s > 0 and not (self._urgent or self._closing)
                        and len(self._queue) < 256):
                    self._wake.wait(self._gather_s)
                self._urgent = False
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

    def take_request(self) -> ReconfigureRequest | None:
        """The oldest reconfigure request not yet taken, or None; never blocks."""
        try:
            return self._requests.get_nowait()
        except queue.Empty:
            return None

    def _read_loop(self) -> None:
        # EOF means the supervisor is gone; frames are reconfigure requests.
        frames = protocol.FrameBuffer()
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                if not self._closing:
                    self._lost.set()
                return
            while True:
                try:
                    decoded = frames.feed(data)
                except protocol.ProtocolError as exc:
                    # The bad line is consumed; go on with what follows it (an
                    # over-long line without a newline: drop it and start over).
                    log.warning("ignored bytes from the supervisor: %s", exc)
                    if frames.pending_bytes > protocol.MAX_FRAME_BYTES:
                        frames = protocol.FrameBuffer()
                        break
                    data = b""
                    continue
                for frame in decoded:
                    self._accept(frame)
                break

    def _accept(self, frame: dict[str, Any]) -> None:
        try:
            request = ReconfigureRequest(*protocol.parse_reconfigure(frame))
        except protocol.ProtocolError as exc:
            log.warning("ignored a frame from the supervisor: %s", exc)
            return
        try:
            self._requests.put_nowait(request)
        except queue.Full:
            log.warning("ignored reconfigure request %d: %d requests already wait",
                        request.id, MAX_PENDING_REQUESTS)

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
