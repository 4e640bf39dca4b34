"""Live settings changes: the next attempt's settings applied in the running trainers.

A relaunch that changes only live keys (commands.py decides) comes here: attempt N+1's
YAML is written, every agent sends its trainer a ``reconfigure`` (its own request id;
``at_step`` so all workers switch after the same update), and every worker's
``reconfigured`` is awaited. The record follows what the trainers run, whenever they
answer: all ok begins attempt N+1 (frames of workers that switched first are held until
then); a refusal, or no trainer having applied it, leaves attempt N going. The command
is answered when the trainers answer, or after LIVE_TIMEOUT_S + LIVE_ANSWER_GRACE_S with
``pending: true``; no other live change is sent while one is in flight. The wait holds
no lock: a stop or full relaunch goes ahead and its trainer's exit settles the change.
The whole protocol: docs/internals.md, "The supervisor's parts".
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.config import dump_config
from gpuwatch.supervisor.agent import AgentStartError
from gpuwatch.supervisor.timings import TIMINGS
from gpuwatch.supervisor.workers import Workers
from trainer_runtime.protocol import Event, Reconfigured
from trainer_runtime.schema import RunConfig

# How long every worker has to answer a live change before it is abandoned.
# A live change must begin in the trainer within this (the trainer's own deadline: past
# it the trainer refuses the change, so no "applied" can come after we gave up) ...
LIVE_TIMEOUT_S = TIMINGS.live_timeout_s
# ... and its answer arrive within this much more (a rebuild; a slow boundary's refusal).
LIVE_ANSWER_GRACE_S = 30.0
# A cluster's live change applies this many updates past the furthest worker's last step.
LIVE_STEP_MARGIN = 3
# Frames held for a worker that switched while another has not answered, at most: past
# it the change counts as applied (that worker runs it; the workers agree on a switch).
MAX_HELD_FRAMES = 10_000


class LiveRun(Protocol):
    """What live changes need of the supervisor."""

    run_dir: Path
    status: str
    attempt: int
    stop_requested: bool

    @property
    def clustered(self) -> bool: ...

    def on_trainer_frame(self, index: int, event: Event, t: float | None) -> None: ...

    def begin_live_attempt(self, change: LiveChange) -> None: ...


class LiveChange:
    """A live settings change sent to every worker, in flight until every one has answered."""

    def __init__(
        self, request_id: int, attempt: int, config: RunConfig, path: Path, workers: int
    ) -> None:
        self.id = request_id  # the reconfigure request's id: one per change, never reused
        self.attempt = attempt  # the attempt it becomes
        self.config = config
        self.path = path
        self.waiting = set(range(workers))
        self.applied: set[int] = set()  # workers whose trainer said ok
        self.exited: str | None = None  # the first worker whose trainer exited unanswered
        # Frames of workers that switched while others have not said so yet: recorded
        # after the new attempt's event (or, if the change is refused, as the old one's).
        self.held: list[tuple[int, Event, float | None]] = []
        self.started = time.monotonic()
        # None: applied on every worker; else the one-line reason it was not.
        self.outcome: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def age_s(self) -> float:
        return time.monotonic() - self.started


class LiveChanges:
    """One run's live changes: the one in flight, its held frames, each worker's last step."""

    def __init__(self, run: LiveRun, workers: Workers) -> None:
        self.run = run
        self.workers = workers
        self.change: LiveChange | None = None
        self.worker_steps: dict[int, int] = {}  # each worker's last step: where a change applies
        self._last_id = 0

    def possible(self) -> bool:
        """A change may be applied live: every worker runs and its agent can send frames down."""
        run = self.run
        return (
            run.status == "running"
            and self.change is None
            and not run.stop_requested
            and self.workers.live_capable
        )

    def in_flight(self) -> str | None:
        """A line saying which change the trainers have yet to answer (None: none)."""
        change = self.change
        if change is None:
            return None
        return (f"the live change to attempt {change.attempt} is still being applied "
                f"(asked {change.age_s():.0f} s ago)")

    def hold(self, index: int, event: Event, t: float | None) -> bool:
        """Keep a frame of a worker that switched before the others (True: held, not recorded)."""
        change = self.change
        if change is None or index not in change.applied or isinstance(event, Reconfigured):
            return False
        if len(change.held) >= MAX_HELD_FRAMES:
            self._finish(change, None)  # the held frames first, then this one
            return False
        change.held.append((index, event, t))
        return True

    async def send(self, config: RunConfig) -> LiveChange:
        """Send config to the running trainers (live keys only): the next attempt, same
        processes, once they say so. ValueError if attempt N+1's YAML cannot be written."""
        run = self.run
        attempt = run.attempt + 1
        attempt_path = run.run_dir / f"attempt-{attempt}.yaml"
        try:
            attempt_path.write_text(dump_config(config))
        except OSError as exc:
            raise ValueError(f"could not write {attempt_path}: {exc}") from None
        # One worker: its next update boundary. Several: an update every worker has yet to
        # reach, so all switch after the same one.
        at_step = 0
        if run.clustered:
            at_step = max(self.worker_steps.values(), default=0) + LIVE_STEP_MARGIN
        agents = self.workers.agents
        # Unique across the run's supervisors too (a resumed run's record holds the ids of
        # the ones before): milliseconds of the clock, or one more than the last.
        self._last_id = max(self._last_id + 1, int(time.time() * 1000))
        change = self.change = LiveChange(self._last_id, attempt, config, attempt_path,
                                          len(agents))
        settings = config.model_dump(mode="json")
        try:
            for agent in agents:
                await agent.reconfigure(change.id, attempt, settings, at_step, LIVE_TIMEOUT_S)
        except AgentStartError as exc:
            # A worker that never got it never applies it: in a cluster, the ones that did
            # refuse it when it runs out of time (their answers come for a change gone).
            self._finish(change, str(exc))
        return change

    async def outcome(self, change: LiveChange) -> dict[str, Any]:
        """The command's answer: when every trainer has answered, or after the wait (pending:
        True, the change still in flight); ValueError (training goes on with the old
        settings) if one refuses, is not reached, or exits first."""
        waited = LIVE_TIMEOUT_S + LIVE_ANSWER_GRACE_S
        try:
            outcome = await asyncio.wait_for(asyncio.shield(change.outcome), waited)
        except TimeoutError:
            # Still in flight: whatever comes later is honoured (answer, trainer_exited), so
            # the record follows what the trainer runs. Until then, the old settings run.
            return {"attempt": change.attempt, "live": True, "pending": True,
                    "request": change.id, "seconds": change.age_s(),
                    "message": (f"no answer from the trainer within {waited:.0f} s: training "
                                f"goes on with the old settings until it applies the change, "
                                f"which then becomes attempt {change.attempt}")}
        if outcome is not None:
            raise ValueError(f"not applied live: {outcome}; training goes on with the old settings")
        return {"attempt": change.attempt, "live": True, "request": change.id,
                "seconds": change.age_s()}

    def answer(self, index: int, event: Reconfigured) -> None:
        """A worker's `reconfigured` (already recorded): the change settles once all have said,
        however late (the command's answer may have gone)."""
        change = self.change
        if change is None or event.id != change.id:
            return  # an answer to a change already settled
        if not event.ok:
            message = event.message or "refused"
            if self.run.clustered:
                message = f"{self.workers.who(index)}: {message}"
            self._finish(change, message)
            return
        change.applied.add(index)
        change.waiting.discard(index)
        if not change.waiting:
            self._finish(change, None)

    def trainer_exited(self, index: int) -> None:
        """A trainer that exits before answering: the change is applied if any worker said it
        applied it (the workers agree on it, in one collective); not applied once no worker
        is left to answer and none said ok."""
        change = self.change
        if change is None:
            return
        change.waiting.discard(index)
        if change.exited is None:
            change.exited = self.workers.who(index)
        if change.applied:
            self._finish(change, None)
        elif not change.waiting:
            self._finish(change, f"{change.exited}'s trainer exited before applying the change")
        # Else the others have yet to answer, and may still say ok: a worker that switched
        # with the rest and exited before its answer came. Their answer settles it.

    def _finish(self, change: LiveChange, outcome: str | None) -> None:
        """Settle change. Applied: the new attempt begins now, before any of its frames (the
        held ones follow). Not: the agents stamp the old attempt again, on the held frames too."""
        if self.change is change:
            self.change = None
        run = self.run
        if outcome is None:
            run.begin_live_attempt(change)
            for index, held_event, held_t in change.held:
                run.on_trainer_frame(index, held_event, held_t)
        else:
            for agent in self.workers.agents:
                agent.cancel_reconfigure(run.attempt)
            for index, event, t in change.held:  # they stay the old attempt's
                run.on_trainer_frame(index, replace(event, attempt=run.attempt), t)  # type: ignore[call-arg]
        change.held = []
        if not change.outcome.done():
            change.outcome.set_result(outcome)
