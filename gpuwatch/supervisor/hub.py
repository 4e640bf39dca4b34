"""The client hub: the run's Unix socket and every dashboard connected to it.

Only the run's owner may connect (SO_PEERCRED). Each connection reads command
frames (answered by whoever the hub was given) and, once subscribed, gets the
recorded events from its from_seq, then the live ones: no gap, no duplicate.
A client that asks for a snapshot in a format the hub has gets it first (the
run's state after event S), then the events from S + 1 (the log seeks there).
Each client has a bounded outgoing queue; one that falls too far behind is cut
off rather than let the supervisor's memory grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from gpuwatch import runs
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.snapshots import Snapshot
from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
    FrameBuffer,
    ProtocolError,
    encode,
    snapshot_frames,
)

log = logging.getLogger("gpuwatch.supervisor")

# A dashboard that stops reading is cut off once this much is queued for it.
CLIENT_QUEUE_MAX_BYTES = int(os.environ.get("GPUWATCH_CLIENT_QUEUE_MAX_BYTES", str(8 << 20)))


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_allowed(peer_uid: int, own_uid: int | None = None) -> bool:
    """Only the user who owns the run may talk to its supervisor (as tmux does)."""
    return peer_uid == (os.getuid() if own_uid is None else own_uid)


class TaskSet:
    """Tasks kept referenced until they end (asyncio holds only weak references)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class Client:
    """One connected dashboard: a bounded outgoing queue drained by its own task."""

    def __init__(self, cid: int, writer: asyncio.StreamWriter, queue_max_bytes: int) -> None:
        self.cid = cid
        self.writer = writer
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued_bytes = 0
        self.queue_max_bytes = queue_max_bytes
        self.subscribed_from: int | None = None
        self.dashboard = False  # subscribed as a person's dashboard (not headless, not a tool)
        self.snapshot_seq: int | None = None  # the seq of the snapshot it was sent first
        self.replay_done = asyncio.Event()
        self.closed = False

    def send(self, data: bytes) -> bool:
        """Queue bytes; False when the client is too far behind (the caller drops it)."""
        if self.closed:
            return True
        if self.queued_bytes + len(data) > self.queue_max_bytes:
            return False
        self.queued_bytes += len(data)
        self.queue.put_nowait(data)
        return True


# What the hub does with each frame a client sends: the reply to write back.
Answer = Callable[[dict[str, Any], Client], Awaitable[bytes]]
# The latest snapshot in a format (a schema id), if there is one.
SnapshotSource = Callable[[str], Snapshot | None]


class ClientHub:
    """Serves the run's socket: connections, subscriptions, fan-out, back-pressure."""

    def __init__(
        self,
        socket_path: Path,
        events: EventLog,
        answer: Answer,
        *,
        queue_max_bytes: int = CLIENT_QUEUE_MAX_BYTES,
        snapshots: SnapshotSource | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.events = events
        self._answer = answer
        self._snapshots = snapshots
        self.queue_max_bytes = queue_max_bytes
        self.clients: dict[int, Client] = {}
        self._client_ids = 0
        self.server: asyncio.AbstractServer | None = None
        self.bad_frames = 0
        self.dropped_clients = 0
        self._last_client_seen = time.monotonic()
        # Called when a client subscribes or a subscribed one goes (the supervisor's
        # life and its spare trainers follow who is attached).
        self.on_attached_change: Callable[[], None] | None = None
        self._tasks = TaskSet()
        self._serving: set[asyncio.Task[Any]] = set()  # one per connection (_serve)

    @property
    def attached(self) -> int:
        """Clients following the run (subscribed): dashboards and headless followers."""
        return sum(1 for c in self.clients.values() if c.subscribed_from is not None)

    @property
    def dashboards(self) -> int:
        """Subscribed clients that said a person watches (``subscribe`` with dashboard)."""
        return sum(1 for c in self.clients.values() if c.dashboard)

    @property
    def idle_s(self) -> float:
        """Seconds since a client last followed the run (0 while one does). A connection
        that only asks for status or sends a stop does not count: it keeps nothing alive."""
        if self.attached:
            return 0.0
        return time.monotonic() - self._last_client_seen

    def _attached_changed(self) -> None:
        self._last_client_seen = time.monotonic()
        if self.on_attached_change is not None:
            try:
                self.on_attached_change()
            except Exception:  # a bug there must not take a connection's handler down
                log.exception("attached-change callback failed")

    async def open(self) -> None:
        """Listen on the socket: its directory 0700, the socket itself 0600 from birth."""
        runs.ensure_private_dir(self.socket_path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            self.server = await asyncio.start_unix_server(
                self._serve, path=str(self.socket_path), limit=MAX_FRAME_BYTES
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)

    async def flush(self, timeout_s: float) -> None:
        """Give dashboards up to timeout_s to take what is queued for them."""
        deadline = time.monotonic() + timeout_s
        while any(c.queued_bytes for c in self.clients.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    def close(self) -> None:
        """Stop listening, cut every client off, remove the socket."""
        if self.server is not None:
            self.server.close()
        for client in list(self.clients.values()):
            self.drop(client, "supervisor exiting")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # -- events out ----------------------------------------------------------------

    def publish(self, seq: int, data: bytes) -> None:
        """Queue a just-recorded event for every client subscribed from seq or earlier."""
        for client in list(self.clients.values()):
            if client.subscribed_from is None or seq < client.subscribed_from:
                continue
            if not client.send(data):
                self.drop(client, "too far behind")

    def subscribe(
        self,
        client: Client,
        from_seq: int,
        snapshot: str | None = None,
        *,
        dashboard: bool = False,
    ) -> int:
        """Replay [from_seq, next_seq) from the log, then go live; return next_seq.

        With `snapshot` (a format) and a snapshot of that format at a seq S >= from_seq,
        the snapshot is sent first and the replay starts at S + 1 (client.snapshot_seq
        says S). Nothing awaits between taking next_seq and marking the client
        subscribed, so every later event is queued for it: no gap, no duplicate.
        """
        if client.subscribed_from is not None:
            raise ValueError("subscribe: this connection is already subscribed")
        until_seq = self.events.next_seq
        found = None
        if snapshot is not None and self._snapshots is not None:
            found = self._snapshots(snapshot)
            if found is not None and not from_seq <= found.seq < until_seq:
                found = None
        client.subscribed_from = from_seq
        client.dashboard = dashboard
        client.snapshot_seq = found.seq if found is not None else None
        start = found.seq + 1 if found is not None else from_seq
        self._tasks.spawn(self._replay(client, start, until_seq, found))
        self._attached_changed()
        return until_seq

    async def _replay(
        self, client: Client, from_seq: int, until_seq: int, found: Snapshot | None = None
    ) -> None:
        """Write the snapshot, if any, and recorded events [from_seq, until_seq) straight
        out, then let the queue go.

        Events recorded meanwhile (seq >= until_seq) wait in the client's queue, which
        its writer drains only once the replay is done.
        """
        try:
            if found is not None:
                for frame in snapshot_frames(found.seq, found.schema, found.text):
                    if client.closed or not await self._write_now(client, frame):
                        return
            async with contextlib.aclosing(self.events.replay(from_seq, until_seq)) as chunks:
                async for data in chunks:
                    if client.closed or not await self._write_now(client, data):
                        return
        finally:
            client.replay_done.set()

    async def _write_now(self, client: Client, data: bytes) -> bool:
        try:
            client.writer.write(data)
            await client.writer.drain()
        except OSError:
            self.drop(client, "connection lost")
            return False
        return True

    async def _drain_queue(self, client: Client) -> None:
        try:
            # Queued events are newer than the replay: hold them until it is written.
            await client.replay_done.wait()
            while True:
                data = await client.queue.get()
                if data is None:
                    return
                client.queued_bytes -= len(data)
                client.writer.write(data)
                await client.writer.drain()
        except (OSError, asyncio.CancelledError):
            return

    def drop(self, client: Client, why: str) -> None:
        """Cut a client off at once, whatever is queued for it."""
        if client.closed:
            return
        client.closed = True
        self.dropped_clients += why == "too far behind"
        log.info("client %d dropped: %s", client.cid, why)
        self.clients.pop(client.cid, None)
        if client.subscribed_from is not None:
            self._attached_changed()
        while not client.queue.empty():
            client.queue.get_nowait()
        client.queued_bytes = 0
        client.queue.put_nowait(None)
        # abort(), not close(): close() waits to flush, forever for a peer that never reads.
        transport = client.writer.transport
        if transport is not None:
            transport.abort()

    # -- commands in ---------------------------------------------------------------

    async def wait_closed(self, timeout_s: float) -> None:
        """After close(): let each connection's handler see its end (none is cancelled
        half-way at exit, which asyncio would log as an error)."""
        serving = [task for task in self._serving if not task.done()]
        if serving:
            await asyncio.wait(serving, timeout=timeout_s)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
        sock = writer.get_extra_info("socket")
        try:
            _pid, uid, _gid = peer_credentials(sock)
        except OSError:
            uid = -1
        if not peer_allowed(uid):
            log.warning("refused a connection from uid %d", uid)
            writer.write(encode("err", id=None, message="permission denied: not the run's owner"))
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self._client_ids += 1
        client = Client(self._client_ids, writer, self.queue_max_bytes)
        self.clients[client.cid] = client
        self._last_client_seen = time.monotonic()
        writer_task = asyncio.create_task(self._drain_queue(client))
        frames = FrameBuffer()
        try:
            while not client.closed:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                try:
                    batch = frames.feed(chunk)
                except ProtocolError as exc:
                    self.bad_frames += 1
                    log.info("client %d sent a bad frame (%s); closing it", client.cid, exc)
                    break
                for frame in batch:
                    self._tasks.spawn(self._respond(frame, client))
        except OSError:
            pass
        finally:
            self.drop(client, "disconnected")
            writer_task.cancel()

    async def _respond(self, frame: dict[str, Any], client: Client) -> None:
        reply = await self._answer(frame, client)
        # Replies go straight out, ahead of queued events: a command never waits on a replay.
        if client.closed:
            return
        transport = client.writer.transport
        if transport is not None and transport.get_write_buffer_size() > self.queue_max_bytes:
            self.drop(client, "too far behind")  # sends commands, never reads replies
            return
        try:
            client.writer.write(reply)
        except OSError:
            self.drop(client, "connection lost")
