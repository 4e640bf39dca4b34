"""Links between the dashboard and a run: the socket one, and a replay one for tests and demos.

A link yields batches of events and sends commands. It owns reconnecting: when
the connection drops it yields a synthetic ``{"type": "link", "state": "lost"}``
event, retries with backoff (``"reconnecting"``), and resubscribes from the last
seq it delivered + 1, so the app never sees a gap or (with RunState's seq check)
a duplicate.

The first subscription asks for a snapshot in RunState's format: the supervisor
then sends its fold up to some seq S (one ``snapshot`` frame, which RunState
takes as its whole state) and only the events after S, so attaching to a long
run costs the tail, not the whole history. A reconnect asks for none: the state
already holds everything up to the last seq.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.client import ConnectionLost, RunClient, build
from gpuwatch.runstate import RunState

BATCH_MAX_EVENTS = 2000
# The from_seq of the latest subscriptions, kept for tests and logs.
SUBSCRIPTIONS_KEPT = 100


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

    async def events(self) -> AsyncIterator[list[dict[str, Any]]]:
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
