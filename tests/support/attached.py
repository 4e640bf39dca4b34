"""A stand-in for a person's dashboard: a real client, subscribed with dashboard=True.

It runs in a thread of its own with its own event loop, so a synchronous test can keep it
attached to a run while it does other things, then detach it (close) at a known moment.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from gpuwatch.follow.client import RunClient


class Attached:
    """A client in a thread of its own, subscribed with dashboard=True until closed."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.events: list[dict[str, Any]] = []
        self.subscribed = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._closing: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        assert self.subscribed.wait(20), "the stand-in dashboard could not subscribe"

    def _main(self) -> None:
        self._loop.run_until_complete(self._follow())

    async def _follow(self) -> None:
        self._closing = asyncio.Event()
        async with RunClient(self.socket_path) as client:
            await client.subscribe(0, dashboard=True)
            self.subscribed.set()
            reading = asyncio.ensure_future(self._read(client))
            await self._closing.wait()
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading

    async def _read(self, client: RunClient) -> None:
        with contextlib.suppress(Exception):
            while True:
                self.events.extend(await client.next_batch())

    def saw_status(self, status: str) -> bool:
        return any(e.get("type") == "status" and e.get("status") == status
                   for e in list(self.events))

    def close(self) -> float:
        """Detach; returns when it did."""
        closing = self._closing
        if closing is not None:
            self._loop.call_soon_threadsafe(closing.set)
        self._thread.join(10)
        return time.time()
