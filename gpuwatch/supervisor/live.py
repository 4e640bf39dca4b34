"""Live settings changes: the next attempt's settings applied in the running trainers.

A relaunch that changes only live keys (commands.py decides) comes here: attempt
N+1's YAML is written, every agent sends its trainer a ``reconfigure`` (id N+1;
``at_step`` 0 for one worker, the furthest worker's last step + LIVE_STEP_MARGIN
for a cluster, so all switch after the same update), and every worker's
``reconfigured`` is awaited. All ok: the supervisor begins attempt N+1 (before
any of its steps: frames of workers that switched first are held until then).
A refusal, an unreachable trainer, a trainer that exits, or no answer in time:
nothing is recorded but the answers, the held frames go on as attempt N's, and
the relaunch is answered err.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.config import dump_config
from gpuwatch.supervisor.agent import AgentStartError
from gpuwatch.supervisor.workers import Workers
from trainer_runtime.protocol import LIVE_DEADLINE_S, Event, Reconfigured
from trainer_runtime.schema import RunConfig

# How long every worker has to answer a live change before it is abandoned.
# A live change must begin in the trainer within this (the trainer's own deadline: past
# it the trainer refuses the change, so no "applied" can come after we gave up) ...
LIVE_TIMEOUT_S = float(os.environ.get("GPUWATCH_LIVE_TIMEOUT_S", str(LIVE_DEADLINE_S)))
# ... and its answer arrive within this much more (a rebuild; a slow boundary's refusal).
LIVE_ANSWER_GRACE_S = 30.0
# A cluster's live change applies this many updates past the furthest worker's last step.
LIVE_STEP_MARGIN = 3


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
    """A live settings change sent to every worker, waiting for their `reconfigured`."""

    def __init__(self, attempt: int, config: RunConfig, path: Path, workers: int) -> None:
        self.attempt = attempt  # the attempt it becomes (also the request's id)
        self.config = config
        self.path = path
        self.waiting = set(range(workers))
        # Frames of workers that switched while others have not said so yet: recorded
        # after the new attempt's event (or, if the change is abandoned, as the old one's).
        self.held: list[tuple[int, Event, float | None]] = []
        self.started = time.monotonic()
        # None: applied on every worker; else the one-line reason it was not.
        self.outcome: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

    def settle(self, outcome: str | None) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)


class LiveChanges:
    """One run's live changes: the one in flight, its held frames, each worker's last step."""

    def __init__(self, run: LiveRun, workers: Workers) -> None:
        self.run = run
        self.workers = workers
        self.change: LiveChange | None = None
        self.worker_steps: dict[int, int] = {}  # each worker's last step: where a change applies

    def possible(self) -> bool:
        """A change may be applied live: every worker runs and its agent can send frames down."""
        run = self.run
        return (
            run.status == "running"
            and self.change is None
            and not run.stop_requested
            and self.workers.live_capable
        )

    def hold(self, index: int, event: Event, t: float | None) -> bool:
        """Keep a frame of a worker that switched before the others (True: held, not recorded)."""
        change = self.change
        if (
            change is not None
            and not change.outcome.done()
            and index not in change.waiting
            and not isinstance(event, Reconfigured)
        ):
            change.held.append((index, event, t))
            return True
        return False

    async def apply(self, config: RunConfig) -> dict[str, Any]:
        """Apply config in the running trainers (live keys only): the next attempt, same processes.

        Nothing is recorded unless every worker applied it; ValueError (training goes on with
        the old settings) if one refuses, is not reached, or does not answer in time.
        """
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
        change = self.change = LiveChange(attempt, config, attempt_path, len(agents))
        settings = config.model_dump(mode="json")
        try:
            for agent in agents:
                await agent.reconfigure(attempt, attempt, settings, at_step, LIVE_TIMEOUT_S)
            outcome = await asyncio.wait_for(
                asyncio.shield(change.outcome), LIVE_TIMEOUT_S + LIVE_ANSWER_GRACE_S
            )
        except AgentStartError as exc:
            outcome = str(exc)
        except TimeoutError:
            waited = LIVE_TIMEOUT_S + LIVE_ANSWER_GRACE_S
            outcome = f"the trainer did not answer within {waited:.0f} s"
        finally:
            self.change = None
        if outcome is not None:
            for agent in agents:
                agent.cancel_reconfigure(run.attempt)
            for index, event, t in change.held:  # they stay the old attempt's
                run.on_trainer_frame(index, replace(event, attempt=run.attempt), t)  # type: ignore[call-arg]
            raise ValueError(f"not applied live: {outcome}; training goes on with the old settings")
        return {"attempt": attempt, "live": True, "seconds": time.monotonic() - change.started}

    def answer(self, index: int, event: Reconfigured) -> None:
        """A worker's `reconfigured` (already recorded): the change settles once all have said."""
        change = self.change
        if change is None or event.id != change.attempt or change.outcome.done():
            return
        if not event.ok:
            message = event.message or "refused"
            if self.run.clustered:
                message = f"{self.workers.who(index)}: {message}"
            change.settle(message)
            return
        change.waiting.discard(index)
        if change.waiting:
            return
        # Every worker runs the new settings: the new attempt begins now, before its steps.
        self.run.begin_live_attempt(change)
        change.settle(None)
        held, change.held = change.held, []
        for index, held_event, held_t in held:
            self.run.on_trainer_frame(index, held_event, held_t)

    def trainer_exited(self, index: int) -> None:
        """A trainer that exits before applying the change abandons it."""
        if self.change is not None:
            who = self.workers.who(index)
            self.change.settle(f"{who}'s trainer exited before applying the change")
