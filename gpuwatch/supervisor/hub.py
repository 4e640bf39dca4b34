"""The client hub: the run's Unix socket and every dashboard connected to it.

Only the run's owner may connect (SO_PEERCRED). Each connection reads command
frames (answered by whoever the hub was given) and, once subscribed, gets the
recorded events from its from_seq, then the live ones: no gap, no duplicate.
A client that asks for a snapshot in a format the hub has gets it first (the
run's state after event S), then the events from S + 1 (the log seeks there).
Each client has a bounded outgoing queue; one that falls too far behind is cut
off rather than let the supervisor's memory grow.

Under connection load a real dashboard still gets in: the listen backlog is the
system's largest (SOMAXCONN), the open-files limit is raised to its hard limit, and a
connection that sends no valid command is closed after CLIENT_IDLE_S (the oldest such
one at once past a cap), so idle sockets cannot fill the backlog or use up descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from gpuwatch.runs import folders
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.snapshots import Snapshot
from gpuwatch.supervisor.timings import TIMINGS
from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
    FrameBuffer,
    InvalidCommand,
    ProtocolError,
    encode,
    parse_command,
    snapshot_frames,
)

log = logging.getLogger("gpuwatch.supervisor")

# A dashboard that stops reading is cut off once this much is queued for it.
CLIENT_QUEUE_MAX_BYTES = TIMINGS.client_queue_max_bytes
# A connection that has sent no valid command this long after it was accepted is closed.
CLIENT_IDLE_S = TIMINGS.client_idle_s
# At most this many such connections (and never over half the open-files limit): past it
# the oldest is closed at once. A real client sends its first command as it connects.
CLIENT_UNIDENTIFIED_MAX = TIMINGS.client_unidentified_max


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_allowed(peer_uid: int, own_uid: int | None = None) -> bool:
    """Only the user who owns the run may talk to its supervisor (as tmux does)."""
    return peer_uid == (os.getuid() if own_uid is None else own_uid)


def listen_backlog() -> int:
    """The largest listen backlog the system grants (net.core.somaxconn; listen() caps
    any larger figure to it), so a burst of connects waits in the kernel for accept()
    rather than being refused. asyncio's default is 100."""
    try:
        return max(socket.SOMAXCONN, int(Path("/proc/sys/net/core/somaxconn").read_text()))
    except (OSError, ValueError):
        return socket.SOMAXCONN


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the soft limit now.

    Every connection is a descriptor: at the common default of 1,024 a thousand idle
    connections leave accept() failing with EMFILE (asyncio then stops accepting for a
    second) and real dashboards waiting in a full backlog.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
        return soft
    return target


def is_valid_command(frame: Any) -> bool:
    """Whether a decoded frame is a command the supervisor accepts (it may still refuse
    to carry it out): the sign of a real client, not an idle socket."""
    try:
        parse_command(frame)
    except InvalidCommand:
        return False
    return True


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


class Unidentified:
    """Connections that have not sent a valid command yet, oldest first.

    Each is closed (by `close`) idle_s after it was accepted unless it sends one first;
    past max_count the oldest is closed at once. A client that has sent a valid command
    (a subscribed dashboard has) is no longer here and is never closed for idling.
    """

    # A timer this late means the loop was busy: the connection's first command may have
    # arrived meanwhile, read but not yet handled. Look again just after.
    LATE_S = 1.0
    RECHECK_S = 0.1

    def __init__(self, idle_s: float, max_count: int, close: Callable[[Client, str], None]):
        self.idle_s = idle_s
        self.max_count = max_count
        self._close = close
        self._timers: dict[int, tuple[Client, asyncio.TimerHandle]] = {}
        self.culled = 0  # connections closed for sending no command (tests, logs)

    def __len__(self) -> int:
        return len(self._timers)

    def __contains__(self, client: Client) -> bool:
        return client.cid in self._timers

    def add(self, client: Client) -> None:
        timer = asyncio.get_running_loop().call_later(self.idle_s, self._expire, client)
        self._timers[client.cid] = (client, timer)
        while len(self._timers) > self.max_count:
            oldest = next(iter(self._timers.values()))[0]
            self._cull(oldest, f"the oldest of over {self.max_count} with no command yet")

    def discard(self, client: Client) -> None:
        """It sent a valid command, or it is gone: no longer a candidate for closing."""
        entry = self._timers.pop(client.cid, None)
        if entry is not None:
            entry[1].cancel()

    def _expire(self, client: Client) -> None:
        entry = self._timers.get(client.cid)
        if entry is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() - entry[1].when() > self.LATE_S:
            recheck = loop.call_later(self.RECHECK_S, self._expire, client)
            self._timers[client.cid] = (client, recheck)
            return
        self._cull(client, f"no command within {self.idle_s:g} s")

    def _cull(self, client: Client, why: str) -> None:
        self.discard(client)
        self.culled += 1
        self._close(client, why)


# What the hub does with each frame a client sends: the reply to write back.
Answer = Callable[[dict[str, Any], Client], Awaitable[bytes]]
# The latest snapshot in a format (a schema id), if there is one.
SnapshotSource = Callable[[str], Snapshot | None]


class ClientHub:
    """Serves the run's socket: connections, subscriptions, fan-out, back-pressure."""

    # Connections that sent no valid command yet (Unidentified): set up by open().
    unidentified_idle_s: float = CLIENT_IDLE_S
    unidentified_max: int = CLIENT_UNIDENTIFIED_MAX
    unidentified: Unidentified

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
        self.ever_attached = False  # whether a client has followed the run yet
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
        self.ever_attached = self.ever_attached or self.attached > 0
        if self.on_attached_change is not None:
            try:
                self.on_attached_change()
            except Exception:  # a bug there must not take a connection's handler down
                log.exception("attached-change callback failed")

    async def open(self) -> None:
        """Listen on the socket: its directory 0700, the socket itself 0600 from birth.

        The backlog is the system's largest and the open-files limit its hard limit, so
        a burst of connections waits to be accepted instead of being refused.
        """
        open_files = raise_open_files_limit()
        self.unidentified = Unidentified(
            self.unidentified_idle_s,
            max(16, min(self.unidentified_max, open_files // 2)),
            self.drop,
        )
        folders.ensure_private_dir(self.socket_path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            self.server = await asyncio.start_unix_server(
                self._serve,
                path=str(self.socket_path),
                limit=MAX_FRAME_BYTES,
                backlog=listen_backlog(),
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
        self.unidentified.add(client)  # until its first valid command
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
                    if client in self.unidentified and is_valid_command(frame):
                        self.unidentified.discard(client)
                    self._tasks.spawn(self._respond(frame, client))
        except OSError:
            pass
        finally:
            self.unidentified.discard(client)
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
