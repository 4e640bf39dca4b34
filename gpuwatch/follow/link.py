"""Links between the dashboard and a run: the socket one, the record of an ended run, and a
replay one for tests and demos.

A link yields batches of events and sends commands. It owns reconnecting: a dropped
connection yields a synthetic ``{"type": "link", "state": "lost"}`` event, retries with
backoff and resubscribes from the last seq it delivered + 1, so the app never sees a gap
or (with RunState's seq check) a duplicate. The first subscription asks for a snapshot
in RunState's format, so attaching to a long run costs the tail, not the whole history;
a reconnect asks for none. ``RecordLink`` reads an ended run's directory the same way
(docs/internals.md, "Dashboard"), and its ``relaunch`` resumes the run and follows the
new supervisor as SocketLink does.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.follow.client import CommandError, ConnectionLost, RunClient, build
from gpuwatch.follow.record_reader import RecordReader, line_offset, saved_snapshot
from gpuwatch.runs.folders import RunInfo, read_run_info, socket_path_for
from gpuwatch.runstate import RunState
from trainer_runtime.protocol import StatusChange, event_frame

BATCH_MAX_EVENTS = 2000
# The from_seq of the latest subscriptions, kept for tests and logs.
SUBSCRIPTIONS_KEPT = 100
# The link state of a run shown from its record: it has ended and nothing of it runs.
RECORD = "record"
# A lost connection to a resumed run's supervisor: how long to wait to learn whether it is
# exiting (its socket is gone before its pid and supervisor.json are).
SUPERVISOR_EXIT_WAIT_S = 3.0


def link_event(state: str, message: str = "") -> dict[str, Any]:
    """The synthetic event a link emits about its own connection."""
    return {"type": "link", "state": state, "message": message}


class RunLink(Protocol):
    """What the app needs from a run: batches of events, and commands."""

    def events(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Batches of events, forever (reconnecting as needed) until close()."""
        ...

    async def command(self, frame_type: str, **fields: Any) -> dict[str, Any]:
        """Send a command; return its ack. Raises CommandError or ConnectionLost."""
        ...

    async def close(self) -> None: ...


class SocketLink:
    """A run's supervisor socket through RunClient, with reconnect and resubscribe."""

    def __init__(
        self,
        socket_path: Path | str,
        *,
        backoff_s: tuple[float, float] = (0.5, 10.0),
        connect_timeout_s: float = 5.0,
        snapshot: bool = True,
        read_interval_s: float = 0.0,
    ) -> None:
        """read_interval_s: read the socket at most this often once caught up (RunClient)."""
        self.socket_path = Path(socket_path)
        self.read_interval_s = read_interval_s
        self.last_seq = -1
        self.subscriptions: list[int] = []  # from_seq of every subscribe, for tests and logs
        # The snapshot format asked for on the first subscription (None: replay it all).
        self.snapshot_format = RunState.snapshot_format() if snapshot else None
        self.snapshot_seq: int | None = None  # the seq of the snapshot the supervisor sent
        self._backoff_s = backoff_s
        self._connect_timeout_s = connect_timeout_s
        self._client: RunClient | None = None
        self._closed = False

    async def events(self) -> AsyncGenerator[list[dict[str, Any]], None]:
        delay, longest = self._backoff_s
        attempt = 0
        while not self._closed:
            client = RunClient(self.socket_path, read_interval_s=self.read_interval_s)
            lost_message = ""
            try:
                await client.connect(self._connect_timeout_s)
                from_seq = self.last_seq + 1
                self.subscriptions.append(from_seq)
                del self.subscriptions[:-SUBSCRIPTIONS_KEPT]  # a flapping link runs for days
                self._client = client
                wanted = self.snapshot_format if from_seq == 0 else None
                # A person's dashboard: the supervisor keeps a spare trainer ready for `r`.
                reply = await client.subscribe(
                    from_seq=from_seq, snapshot=wanted, dashboard=True
                )
                if wanted is not None and isinstance(reply.get("snapshot_seq"), int):
                    self.snapshot_seq = reply["snapshot_seq"]
                attempt = 0
                delay = self._backoff_s[0]
                yield [link_event("connected", f"subscribed from seq {from_seq}")]
                while True:
                    batch = await client.next_batch(BATCH_MAX_EVENTS)
                    for event in batch:
                        seq = event.get("seq")
                        if isinstance(seq, int) and seq > self.last_seq:
                            self.last_seq = seq
                    yield batch
            except (ConnectionLost, TimeoutError) as exc:
                lost_message = str(exc) or "connection lost"
            finally:
                self._client = None
                await client.close()
            if self._closed:
                return
            attempt += 1
            yield [link_event("lost", lost_message)]
            yield [link_event("reconnecting", f"retry {attempt} in {delay:.1f} s")]
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    async def command(self, frame_type: str, **fields: Any) -> dict[str, Any]:
        client = self._client
        if client is None:
            raise ConnectionLost("not connected to the run (reconnecting)")
        return await client.command(frame_type, **fields)

    async def close(self) -> None:
        self._closed = True
        if self._client is not None:
            await self._client.close()


class RecordLink:
    """An ended run read from its directory, with no supervisor; `r` resumes it, live.

    events(): the record (gpuwatch/follow/record_reader.py): snapshot.json as the snapshot frame a
    supervisor would send, when its format is RunState's and events.jsonl holds its seq,
    then the events after it (all of them without one), ``batch_size`` at a time from a
    file that is streamed, never held; then a ``record`` link event, and nothing more until
    a resume. A record that stops while the run was live (read_run_info calls it "lost":
    its supervisor is gone) gets a ``lost`` status event first, with no seq.

    command("relaunch", overrides=...) resumes the run: ``gpuwatch.runs.resume.resume_run`` in a
    thread (it waits for the new supervisor's socket), the overrides as its `--set` texts;
    its ConfigError, ResumeError or RuntimeError (or OSError) is a CommandError with the same
    line. The link then follows that supervisor as SocketLink does, subscribing from the
    last seq it delivered + 1: the events already folded are not sent again, and none is
    missed. If that supervisor exits (the resumed run ended and it was told to go), the
    events it recorded after the last one delivered are read from the record, and the link
    is a record again. Any other command while it is a record is refused.
    """

    def __init__(
        self,
        info: RunInfo,
        *,
        batch_size: int = BATCH_MAX_EVENTS,
        snapshot: bool = True,
        read_interval_s: float = 0.0,
        backoff_s: tuple[float, float] = (0.5, 10.0),
    ) -> None:
        self.info = info
        self.run_dir = info.run_dir
        self.batch_size = batch_size
        self.read_interval_s = read_interval_s
        self.last_seq = -1
        self.snapshot_format = RunState.snapshot_format() if snapshot else None
        self.snapshot_seq: int | None = None  # the seq of snapshot.json, when it was used
        self.bad_lines = 0  # lines of events.jsonl that are not frames (skipped)
        self._attempt = 0  # the latest attempt the record read so far names
        self.resumes = 0  # resumes started from this link
        self.live: SocketLink | None = None  # the resumed run's supervisor, once resumed
        self._backoff_s = backoff_s
        self._read = False  # the record was read to its end (a resume waits for that)
        self._resuming = False
        self._follow = asyncio.Event()  # a resume started: follow its supervisor
        self._closed = False

    @classmethod
    def live_first(
        cls, info: RunInfo, socket_path: Path, *, read_interval_s: float = 0.0, **kwargs: Any
    ) -> RecordLink:
        """A live run: follow its supervisor (as SocketLink does, snapshot first) until that
        supervisor is gone, then the rest from the record. So a dashboard knows when the run
        has ended or its supervisor died: a killed supervisor shows `lost` at once (the
        record's status, as `gpuwatch ls` says it), never an endless "reconnecting"."""
        link = cls(info, read_interval_s=read_interval_s, **kwargs)
        link.live = SocketLink(socket_path, read_interval_s=read_interval_s,
                               backoff_s=link._backoff_s)
        return link

    @property
    def following(self) -> bool:
        """Whether a resumed run's supervisor is followed (else the record is shown)."""
        return self.live is not None

    async def events(self) -> AsyncIterator[list[dict[str, Any]]]:
        if self.live is not None:  # live_first: the supervisor, then the record
            async for batch in self._follow_live():
                yield batch
        while not self._closed:
            async for batch in self._read_record():
                yield batch
            if self._closed:
                return
            self.info = info = await asyncio.to_thread(read_run_info, self.run_dir)
            self._read = True
            end = [link_event(RECORD, f"run ended ({info.status}); r resumes it")]
            if info.status == "lost":
                # The record stops while the run was live (its supervisor was killed, the
                # machine went down): say what `gpuwatch ls` says. No seq: not recorded.
                attempt = max(info.attempt, self._attempt)
                lost = StatusChange(attempt=attempt, status="lost", message=info.message)
                end.insert(0, event_frame(lost))
            yield end
            await self._follow.wait()
            self._follow.clear()
            if self._closed:
                return
            self._read = False
            async for batch in self._follow_live():
                yield batch

    async def _read_record(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The record after the last seq delivered: from snapshot.json on, when it fits."""
        offset: int | None = None
        if self.last_seq < 0 and self.snapshot_format is not None:
            saved = await asyncio.to_thread(saved_snapshot, self.run_dir, self.snapshot_format)
            if saved is not None:
                offset = saved.offset
                self.snapshot_seq = self.last_seq = saved.frame["seq"]
                self._attempt = max(self._attempt, saved.attempt)
                yield [saved.frame]
        if offset is None:
            offset = await asyncio.to_thread(line_offset, self.run_dir, self.last_seq + 1)
        # seq is the line number; were it not, reading from the start loses nothing (the
        # seqs already delivered are left out here, and RunState skips them too).
        reader = RecordReader(self.run_dir, offset or 0)
        try:
            while not self._closed:
                frames = await asyncio.to_thread(reader.read, self.batch_size)
                if not frames:
                    return
                batch = []
                for frame in frames:
                    seq = frame.get("seq")
                    if isinstance(seq, int):
                        if seq <= self.last_seq:
                            continue
                        self.last_seq = seq
                    attempt = frame.get("attempt")
                    if type(attempt) is int and attempt > self._attempt:
                        self._attempt = attempt
                    batch.append(frame)
                if batch:
                    yield batch
        finally:
            self.bad_lines += reader.bad_lines

    async def _follow_live(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The resumed run's supervisor, until it exits (then back to the record)."""
        live = self.live
        if live is None:
            return
        stream = live.events()
        try:
            async for batch in stream:
                lost = any(e.get("type") == "link" and e.get("state") == "lost" for e in batch)
                if lost and await self._supervisor_exited():
                    return
                self.last_seq = max(self.last_seq, live.last_seq)
                yield batch
        finally:
            self.live = None
            await stream.aclose()
            await live.close()

    async def _supervisor_exited(self) -> bool:
        """Whether the resumed run's supervisor has exited (waiting a moment for one whose
        socket is gone already: it is on its way out)."""
        deadline = time.monotonic() + SUPERVISOR_EXIT_WAIT_S
        while True:
            info = await asyncio.to_thread(read_run_info, self.run_dir)
            if info.supervisor_pid is None:
                return True
            socket = info.socket_path
            if (socket is not None and socket.exists()) or time.monotonic() >= deadline:
                return False  # it is there: SocketLink reconnects
            await asyncio.sleep(0.05)

    async def command(self, frame_type: str, **fields: Any) -> dict[str, Any]:
        live = self.live
        if live is not None:
            return await live.command(frame_type, **fields)
        build(frame_type, **fields)  # refused here as a supervisor would refuse it
        if frame_type != "relaunch":
            raise CommandError(
                f"run {self.info.run_id} has ended ({self.info.status}): nothing to "
                f"{frame_type} (r resumes it)"
            )
        if fields.get("fresh"):
            raise CommandError("a resume goes on from the last checkpoint; gpuwatch train "
                               "--fresh starts a run from step 0")
        if not self._read or self._closed:
            raise CommandError("the run's record is still being read; try again in a moment")
        if self._resuming:
            raise CommandError("the run is being resumed already")
        from gpuwatch.config import format_override

        overrides = dict(fields.get("overrides") or {})
        texts = [format_override(key, value) for key, value in overrides.items()]
        self._resuming = True
        try:
            before, resumed = await asyncio.to_thread(self._resume, texts)
        finally:
            self._resuming = False
        home = self.run_dir.parent.parent
        socket = resumed.socket_path or socket_path_for(self.run_dir.name, home)
        live = SocketLink(
            socket,
            snapshot=False,  # the state holds everything up to last_seq already
            read_interval_s=self.read_interval_s,
            backoff_s=self._backoff_s,
        )
        live.last_seq = self.last_seq
        self.live = live
        self.info = resumed
        self.resumes += 1
        self._follow.set()
        return {
            "type": "ack",
            "attempt": before.attempt + 1,
            "live": False,
            "resumed": True,
            "overrides": overrides,
        }

    def _resume(self, overrides: Sequence[str]) -> tuple[RunInfo, RunInfo]:
        """Start the run's supervisor again (blocks until its socket answers): the run as it
        was, and as it is now."""
        from gpuwatch.config import ConfigError
        from gpuwatch.runs import resume

        before = read_run_info(self.run_dir)
        try:
            return before, resume.resume_run(before, overrides)
        except (ConfigError, resume.ResumeError, RuntimeError, OSError) as exc:
            raise CommandError(str(exc)) from None

    async def close(self) -> None:
        self._closed = True
        self._follow.set()  # a follower waiting for a resume ends
        if self.live is not None:
            await self.live.close()


class ReplayLink:
    """Recorded events for tests and demos; commands are recorded and acked.

    ``push()`` adds live batches after the replay; ``wait_idle()`` returns once
    every batch pushed so far has been taken *and processed* by the consumer
    (the generator is resumed only after the consumer's loop body ran).
    """

    def __init__(
        self,
        events: Iterable[dict[str, Any]] = (),
        *,
        batch_size: int = BATCH_MAX_EVENTS,
        replies: dict[str, dict[str, Any] | Exception] | None = None,
    ) -> None:
        self.commands: list[tuple[str, dict[str, Any]]] = []
        self.replies = replies or {}
        self._queue: asyncio.Queue[list[dict[str, Any]] | None] = asyncio.Queue()
        self._idle = asyncio.Event()
        self._taken = 0
        self._pushed = 0
        batch: list[dict[str, Any]] = []
        for event in events:
            batch.append(event)
            if len(batch) >= batch_size:
                self.push(batch)
                batch = []
        if batch:
            self.push(batch)
        self._connected_once = False

    @classmethod
    def from_file(cls, path: Path | str, **kwargs: Any) -> ReplayLink:
        with open(path, encoding="utf-8") as fh:
            return cls((json.loads(line) for line in fh if line.strip()), **kwargs)

    def push(self, batch: list[dict[str, Any]]) -> None:
        self._pushed += 1
        self._idle.clear()
        self._queue.put_nowait(list(batch))

    async def events(self) -> AsyncIterator[list[dict[str, Any]]]:
        if not self._connected_once:
            self._connected_once = True
            yield [link_event("connected", "replay")]
        while True:
            if self._queue.empty():
                self._idle.set()
            batch = await self._queue.get()
            if batch is None:
                self._idle.set()
                return
            self._taken += 1
            yield batch

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Until the consumer has processed every pushed batch."""
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def command(self, frame_type: str, **fields: Any) -> dict[str, Any]:
        # Checked as RunClient checks it: a command the supervisor would refuse fails
        # here too (CommandError), so the app's tests catch one.
        build(frame_type, **fields)
        self.commands.append((frame_type, fields))
        reply = self.replies.get(frame_type)
        if isinstance(reply, Exception):
            raise reply
        return {"type": "ack", "id": len(self.commands), **(reply or {})}

    async def close(self) -> None:
        self._queue.put_nowait(None)
