"""Helpers for the dashboard's Pilot tests: recorded fixtures, a frozen clock, settling."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.message import Message

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.follow.link import ReplayLink

DATA = Path(__file__).parent / "data"
SIZE = (80, 24)


def load_events(name: str) -> list[dict[str, Any]]:
    with open(DATA / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def frozen_clock_for(events: list[dict[str, Any]]) -> Any:
    last_t = max(float(e.get("t") or 0.0) for e in events)
    return lambda: last_t


def make_app(name: str, **kwargs: Any) -> tuple[GpuwatchApp, ReplayLink]:
    events = load_events(name)
    link = ReplayLink(events, batch_size=kwargs.pop("batch_size", 50))
    app = GpuwatchApp(link, clock=frozen_clock_for(events), **kwargs)
    return app, link


async def settle(app: GpuwatchApp, link: ReplayLink, pilot: Any) -> None:
    """Until every batch was folded, then paint what changed (not waiting on the 4 Hz timer,
    nor on the history areas' once a second)."""
    await link.wait_idle()
    await pilot.pause()
    app.refresh_view(flush=True)
    await pilot.pause()


class Waiter:
    """Waits until a condition on the app holds, re-checked as each message is dispatched.

    Pass `waiter.hook` as run_test's message_hook. No fixed pauses: the test wakes on the
    message after which the condition holds, or fails naming what it waited for once the
    deadline passes. A change made by a timer's callback (a repaint) may be followed by no
    message at all, so the condition is also looked at every CHECK_EVERY_S.
    """

    CHECK_EVERY_S = 0.05

    def __init__(self) -> None:
        self._waiting: list[tuple[Callable[[], bool], asyncio.Event]] = []

    def hook(self, message: Message) -> None:
        for condition, event in self._waiting:
            if not event.is_set() and condition():
                event.set()

    async def until(
        self, condition: Callable[[], bool], what: str, timeout_s: float = 10.0
    ) -> None:
        if condition():
            return
        entry = (condition, asyncio.Event())
        self._waiting.append(entry)
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            while not entry[1].is_set() and not condition():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry[1].wait(), min(left, self.CHECK_EVERY_S))
        finally:
            self._waiting.remove(entry)


async def wait_commands(app: GpuwatchApp) -> None:
    """Until the commands sent so far got their replies (the link follower never ends)."""
    commands = [w for w in app.workers if w.group == "command"]
    if commands:  # an empty list would mean "every worker", the endless follower included
        await app.workers.wait_for_complete(commands)


@pytest.fixture
def notifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every message the app passes to notify()."""
    seen: list[str] = []
    original = GpuwatchApp.notify

    def record(self: GpuwatchApp, message: str, *args: Any, **kwargs: Any) -> None:
        seen.append(str(message))
        original(self, message, *args, **kwargs)

    monkeypatch.setattr(GpuwatchApp, "notify", record)
    return seen
