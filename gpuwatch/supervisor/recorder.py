"""The run's record: each event to events.jsonl first, then the fold, dashboards, TensorBoard.

One place, one order. An event is appended to the event log (seq = its line number)
before anyone sees it; then the StateKeeper folds it into the run's state, the hub
queues the same bytes to every subscribed dashboard, and the RunBoard takes its
scalars. A status change also rewrites state.json (for `gpuwatch ls`) and
snapshot.json (a dashboard attaching then starts from there).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.hub import Answer, ClientHub
from gpuwatch.supervisor.snapshots import StateKeeper
from gpuwatch.supervisor.tboard import RunBoard
from trainer_runtime.protocol import Event, StatusChange


class Recorder:
    """The event log, the run's folded state, the dashboards' socket and the TensorBoard scalars."""

    def __init__(self, run_dir: Path, socket_path: Path, answer: Answer) -> None:
        self.events = EventLog(run_dir)
        # The run folded as a dashboard folds it, and its snapshots (fast attach).
        self.keeper = StateKeeper(run_dir, self.events)
        self.hub = ClientHub(socket_path, self.events, answer, snapshots=self.keeper.snapshot_for)
        self.board = RunBoard(run_dir / "tensorboard")  # scalars, as events are recorded

    async def open(self) -> None:
        """Restore the fold of a run directory recorded before (a restart), then serve."""
        if self.events.next_seq:
            await asyncio.to_thread(self.keeper.restore)
        await self.hub.open()

    def record(self, event: Event, t: float | None = None) -> float:
        """Append an event to events.jsonl, then fan it out; returns its time (default now)."""
        seq, t, data = self.events.append(event, t)
        self.keeper.fold(seq, event, t)
        self.hub.publish(seq, data)
        self.board.observe(event, t)
        return t

    def record_status(self, event: StatusChange, last_step: int) -> None:
        t = self.record(event)
        self.events.write_state(event, t, last_step)
        self.keeper.write()  # a dashboard attaching now starts from here

    async def close_hub(self) -> None:
        """Close the socket and every dashboard's connection (after flushing them)."""
        self.hub.close()
        await self.hub.wait_closed(1.0)

    def close(self) -> None:
        """The last snapshot, then events.jsonl and the scalars closed."""
        self.keeper.write()
        self.events.close()
        self.board.close()
