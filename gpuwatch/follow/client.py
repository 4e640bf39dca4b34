"""Asyncio client of a run's supervisor socket: subscribe to events, send commands.

Used by the dashboard (inside a Textual worker) and by headless mode. One reader task
splits incoming frames: replies resolve the waiting ``command()``, snapshot parts are
joined into one ``snapshot`` frame, the rest are events for ``events()``; a lost
connection ends ``events()`` with ``ConnectionLost`` so the caller resubscribes from its
last ``seq``. ``connect`` waits out a full listen backlog until its deadline
(``connect_unix`` says why). Events wait in a bounded inbox: a caller that falls behind
stops the reading, so the supervisor slows to its pace (back-pressure, never a drop).
With ``read_interval_s`` a light stream, once caught up, is read once per interval; a
replay at full speed. Both rules: docs/internals.md, "Supervisor socket", "Dashboard".
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainer_runtime.protocol import (
    SNAPSHOT,
    Command,
    FrameBuffer,
    InvalidCommand,
    ProtocolError,
    SnapshotParts,
    build_command,
    command_frame,
    encode_frame,
    parse_command,
)

READ_CHUNK = 1 << 16
# Events read but not yet taken: past this the reader waits (back-pressure, no loss).
INBOX_MAX_EVENTS = 4096
# More than this read in one read interval is a bulk transfer (a replay): no pauses.
# Under what the kernel holds for an unread Unix socket (about 208 KiB), above a live run.
BULK_BYTES = 1 << 17


# A connect refused for a full backlog is tried again after this long, doubling up to the
# second figure, until the caller's deadline.
CONNECT_RETRY_S = (0.005, 0.1)


class ClientError(Exception):
    """Base of the client's errors."""


class ConnectionLost(ClientError):
    """The supervisor went away (or sent a frame we cannot read)."""


class CommandError(ClientError):
    """The supervisor answered a command with ``err`` (or would: see ``build``)."""


class CommandTimeout(ClientError):
    """The supervisor did not answer a command in time."""


class Inbox:
    """A bounded queue of frames whose end (a ConnectionLost) is a flag, never a slot.

    ``put`` waits while it holds ``max_items``; ``take`` waits for at least one frame
    and returns those queued (up to a count), or raises the end once they are taken.
    """

    def __init__(self, max_items: int | None = None) -> None:
        self.max_items = INBOX_MAX_EVENTS if max_items is None else max_items
        self._items: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._end: BaseException | None = None
        self.waits = 0  # times the reader waited for room (for tests and benches)

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: dict[str, Any]) -> bool:
        """Queue item if there is room now; False: there is none (``put`` waits for it)."""
        if len(self._items) >= self.max_items:
            return False
        self._items.append(item)
        self._ready.set()
        return True

    async def put(self, item: dict[str, Any]) -> None:
        while not self.offer(item):
            self.waits += 1
            self._room.clear()
            await self._room.wait()

    def end(self, failure: BaseException) -> None:
        if self._end is None:
            self._end = failure
        self._ready.set()

    async def take(self, max_items: int) -> list[dict[str, Any]]:
        while not self._items:
            if self._end is not None:
                raise self._end
            self._ready.clear()
            await self._ready.wait()
        count = min(max_items, len(self._items))
        batch = [self._items.popleft() for _ in range(count)]
        self._room.set()
        return batch


class RunClient:
    """One connection to one run's supervisor."""

    def __init__(self, socket_path: Path | str, *, read_interval_s: float = 0.0) -> None:
        self.socket_path = Path(socket_path)
        self.read_interval_s = read_interval_s
        self._window_start = -float("inf")  # the current read interval, and what it read
        self._window_bytes = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._events = Inbox()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._read_task: asyncio.Task[None] | None = None
        self._lost: ConnectionLost | None = None
        self._closed = False

    async def connect(self, timeout_s: float = 5.0) -> None:
        """Connect within timeout_s, waiting out a full listen backlog (see connect_unix)."""
        sock = await connect_unix(self.socket_path, timeout_s)
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                sock=sock, limit=READ_CHUNK
            )
        except OSError as exc:
            sock.close()
            raise ConnectionLost(f"cannot connect to {self.socket_path}: {exc}") from None
        self._read_task = asyncio.create_task(self._read_loop(), name="gpuwatch-client-reader")

    async def __aenter__(self) -> RunClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _read_loop(self) -> None:
        assert self._reader is not None
        frames = FrameBuffer()
        snapshot = SnapshotParts()
        failure = ConnectionLost("the supervisor closed the connection")
        try:
            while True:
                chunk = await self._reader.read(READ_CHUNK)
                if not chunk:
                    break
                self._count_read(len(chunk))
                for frame in frames.feed(chunk):
                    kind = frame["type"]
                    # type() is int: a reply with "id": true is not the reply to command 1.
                    if kind in ("ack", "err") and type(frame.get("id")) is int:
                        future = self._pending.pop(frame["id"], None)
                        if future is not None and not future.done():
                            future.set_result(frame)
                        continue
                    if kind == SNAPSHOT:
                        joined = snapshot.feed(frame)
                        if joined is None:
                            continue
                        frame = joined
                    # offer() first: a coroutine per frame costs more than the rest of the
                    # loop, and put() only matters when the inbox is full.
                    if not self._events.offer(frame):
                        await self._events.put(frame)
                if len(chunk) < READ_CHUNK and 0 < self._window_bytes < BULK_BYTES:
                    await self._rest_until(self._window_start + self.read_interval_s)
        except ProtocolError as exc:
            failure = ConnectionLost(f"bad frame from the supervisor: {exc}")
        except (OSError, asyncio.IncompleteReadError) as exc:
            failure = ConnectionLost(f"connection to the supervisor failed: {exc}")
        finally:
            # As the supervisor does with a bad frame: the connection is over, close it;
            # a command sent from now on fails at once instead of waiting for its timeout.
            self._lost = failure
            if self._writer is not None:
                self._writer.close()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionLost("connection lost before the reply"))
            self._pending.clear()
            self._events.end(failure)

    def _count_read(self, size: int) -> None:
        """Count a read against the current read interval (none without an interval)."""
        if self.read_interval_s <= 0:
            return
        now = time.monotonic()
        if now - self._window_start >= self.read_interval_s:
            self._window_start, self._window_bytes = now, 0
        self._window_bytes += size

    async def _rest_until(self, until: float) -> None:
        """Leave the socket unread until then: what arrives meanwhile waits in the kernel."""
        transport = self._writer.transport if self._writer is not None else None
        if not isinstance(transport, asyncio.Transport) or transport.is_closing():
            return
        transport.pause_reading()
        try:
            await asyncio.sleep(max(0.0, until - time.monotonic()))
        finally:
            if not transport.is_closing():
                transport.resume_reading()

    async def command(
        self, frame_type: str, timeout_s: float = 60.0, **fields: Any
    ) -> dict[str, Any]:
        """Send a command built from a type and fields; see ``send``.

        The command is checked here exactly as the supervisor checks it, so one
        it would refuse is refused before it is sent (CommandError, same message).
        """
        return await self.send(build(frame_type, **fields), timeout_s)

    async def send(self, command: Command, timeout_s: float = 60.0) -> dict[str, Any]:
        """Send a command (its id is this client's own) and wait for its ack.

        Raises CommandError on err, CommandTimeout, or ConnectionLost.
        """
        if self._writer is None:
            raise ConnectionLost("not connected")
        if self._lost is not None:
            raise ConnectionLost(str(self._lost))
        command_id = next(self._ids)
        try:
            # Every command leaves through here, checked as the supervisor will check
            # it, even one built directly (a dataclass does not check its fields).
            frame = command_frame(replace(command, id=command_id))
            parse_command(frame)
            data = encode_frame(frame)
        except ProtocolError as exc:
            raise CommandError(str(exc)) from None
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        try:
            self._writer.write(data)
            await self._writer.drain()
        except OSError as exc:
            self._pending.pop(command_id, None)
            raise ConnectionLost(f"cannot send to the supervisor: {exc}") from None
        try:
            reply = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self._pending.pop(command_id, None)
            raise CommandTimeout(
                f"no answer to {command.TYPE!r} from the supervisor within {timeout_s:.0f} s"
            ) from None
        if reply["type"] == "err":
            raise CommandError(str(reply.get("message", "command failed")))
        return reply

    async def subscribe(
        self, from_seq: int = 0, snapshot: str | None = None, *, dashboard: bool = False
    ) -> dict[str, Any]:
        """Ask for every recorded event with seq >= from_seq, then live ones.

        With `snapshot` (the format the caller reads, gpuwatch.runstate.codec.schema_id) the
        supervisor may send its state after some seq S >= from_seq instead of the
        events up to S: one ``snapshot`` frame (seq, schema, data) comes first, and the
        ack's ``snapshot_seq`` is S (null when it had none in that format).

        dashboard: a person watches (the supervisor keeps a spare trainer ready for a
        relaunch while one does); headless followers and tools leave it false.
        """
        return await self.send(
            build("subscribe", from_seq=from_seq, snapshot=snapshot, dashboard=dashboard)
        )

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Yield events until the connection ends; then raise ConnectionLost."""
        while True:
            for item in await self._events.take(1):
                yield item

    async def next_batch(self, max_items: int = 500) -> list[dict[str, Any]]:
        """Wait for at least one event, return it with every other already queued one."""
        return await self._events.take(max_items)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        if self._read_task is not None:
            self._read_task.cancel()
            try:
                await self._read_task
            except (asyncio.CancelledError, Exception):
                pass


async def connect_unix(path: Path, timeout_s: float) -> socket.socket:
    """A non-blocking AF_UNIX socket connected to path, tried again until timeout_s while
    the supervisor's listen backlog is full; else ConnectionLost with one line.

    Why not ``asyncio.open_unix_connection(path)``: on Linux a non-blocking AF_UNIX connect
    to a listener whose backlog is full fails at once with EAGAIN (unix_stream_connect:
    the receive queue is full and the socket may not wait); the socket stays unconnected
    and nothing is ever queued for it. asyncio's ``sock_connect`` takes every
    BlockingIOError, EAGAIN included, for a TCP-style "connect in progress": it waits
    for the socket to be writable, which an unconnected Unix socket is at once (epoll
    says EPOLLOUT|EPOLLHUP), finds SO_ERROR 0 and reports success. The transport's first
    recv() on that socket then fails with EINVAL (unix_stream_read_generic: not
    TCP_ESTABLISHED), the stream reader keeps that error, and the first
    ``writer.drain()`` raises it: the "cannot send to the supervisor: [Errno 22] Invalid
    argument" seen with 400 idle connections on a run's socket (strace: connect = -1
    EAGAIN, getsockopt SO_ERROR = 0, recvfrom = -1 EINVAL; no sendto at all). A busy
    box makes it likelier: the supervisor accepts less often, the backlog stays full.

    So connect here and treat EAGAIN as the refusal it is: wait a moment (the supervisor
    accepts in bursts) and try again with a new socket. ECONNREFUSED while the socket
    file exists is tried again too: it is what BSDs answer for a full backlog, and what
    Linux answers in the instant between a supervisor's bind() and listen(). No socket
    file (ENOENT, on any try) fails at once; no room for the whole of timeout_s fails then.
    """
    deadline = time.monotonic() + timeout_s
    delay_s, longest_s = CONNECT_RETRY_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(path))
            return sock
        except (BlockingIOError, ConnectionRefusedError) as exc:
            sock.close()
            if isinstance(exc, BlockingIOError) and exc.errno != errno.EAGAIN:
                raise ConnectionLost(f"cannot connect to {path}: {exc}") from None
            why = (
                "its listen backlog stayed full (the supervisor is not accepting)"
                if isinstance(exc, BlockingIOError)
                else "connection refused (nobody listens on it)"
            )
        except OSError as exc:
            sock.close()
            raise ConnectionLost(f"cannot connect to {path}: {exc}") from None
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise ConnectionLost(f"cannot connect to {path}: {why} for {timeout_s:g} s")
        await asyncio.sleep(min(delay_s, left_s))
        delay_s = min(2 * delay_s, longest_s)


def build(frame_type: str, /, **fields: Any) -> Command:
    """A command checked by the protocol's declarations; CommandError if it is not valid."""
    try:
        return build_command(frame_type, **fields)
    except InvalidCommand as exc:
        raise CommandError(str(exc)) from None
