"""A run's attempts: each one started, recorded and stopped, by a relaunch or a live change.

``Attempts`` is the Supervisor's (core.py) collaborator for an attempt's life: its
number and the attempt event recorded before any of its frames, its workers started
(chief first) and stopped together, the relaunch's stop-then-start, and who of its
workers has said hello. It reaches the run only through ``AttemptsRun``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from gpuwatch.config import dump_config
from gpuwatch.supervisor.agent import AgentStartError
from gpuwatch.supervisor.exit_policy import ExitPolicy
from gpuwatch.supervisor.live import LiveChange
from gpuwatch.supervisor.timings import TIMINGS
from gpuwatch.supervisor.workers import Workers, WorkerStartError
from trainer_runtime.protocol import TERMINAL_STATUSES, Attempt, Event
from trainer_runtime.schema import RunConfig

# How long a trainer has to checkpoint and exit after SIGTERM before SIGKILL.
STOP_GRACE_S = TIMINGS.stop_grace_s


def topology(config: RunConfig) -> tuple[Any, ...] | None:
    """What a run's agents are made from: fixed for the run (a worker's data, the collective
    and its timeout reach the trainers through each attempt's config, so they may change)."""
    cluster = config.cluster
    if cluster is None:
        return None
    hosts = tuple(worker.host for worker in cluster.workers)
    ports = tuple(cluster.ports) if cluster.ports is not None else None
    return (cluster.launcher, hosts, ports, cluster.python, tuple(cluster.ssh_options))


class AttemptsRun(Protocol):
    """What the attempts need of the supervisor: the run's settings, numbers and status."""

    run_dir: Path
    config: RunConfig
    status: str
    attempt: int
    last_step: int
    stop_requested: bool

    @property
    def clustered(self) -> bool: ...

    def record(self, event: Event, t: float | None = None) -> float: ...

    def set_status(self, status: str, **fields: Any) -> None: ...


class Attempts:
    """Starting, recording and stopping the run's attempts, over its workers."""

    def __init__(self, run: AttemptsRun, workers: Workers, exit_policy: ExitPolicy) -> None:
        self.run = run
        self.workers = workers
        self.exit_policy = exit_policy
        self.hellos: set[int] = set()  # this attempt's workers that said hello
        self.step_before = 0  # the chief's step when the attempt started

    async def start(self, config: RunConfig, *, fresh: bool, reason: str) -> int:
        run = self.run
        run.attempt += 1
        attempt = run.attempt
        run.config = config
        attempt_path = run.run_dir / f"attempt-{attempt}.yaml"
        try:
            attempt_path.write_text(dump_config(config))
        except OSError as exc:
            run.set_status("crashed", message=f"could not write {attempt_path}: {exc}")
            return attempt
        self.record(attempt_path, reason, fresh=fresh)
        run.set_status("starting")
        self.hellos = set()
        self.exit_policy.new_attempt()
        if not run.clustered:
            try:
                await self.workers.agents[0].start(attempt, attempt_path, fresh=fresh)
            except AgentStartError as exc:
                run.set_status("crashed", message=str(exc))
                return attempt
            if config.command is not None:
                # A person's own command runs once its process has started: it may never
                # say hello (a program that is not Python, or never imports TensorFlow).
                run.set_status("running")
            return attempt
        await self._start_workers(attempt, attempt_path, fresh=fresh)
        return attempt

    def record(self, path: Path, reason: str, *, fresh: bool = False) -> None:
        """The run's attempt begins with its config: recorded before any of its frames."""
        run = self.run
        self.step_before = run.last_step
        settings = run.config.model_dump(mode="json")
        attempt = Attempt(attempt=run.attempt, settings=settings, fresh=fresh, reason=reason,
                          config_path=str(path))
        run.record(attempt)

    async def _start_workers(self, attempt: int, attempt_path: Path, *, fresh: bool) -> None:
        """Start every worker, chief first; one that cannot start fails the attempt (the ones
        already started are stopped)."""
        run, policy = self.run, self.exit_policy
        try:
            await self.workers.start(
                run.config, attempt, attempt_path, fresh=fresh,
                # One already started has failed, or a stop came: start no more.
                go_on=lambda: policy.failed_worker is None and not run.stop_requested,
            )
        except WorkerStartError as exc:
            policy.start_failed(exc.index, str(exc))
        if policy.failed_worker is not None:
            await policy.stop_workers()
        elif run.stop_requested and self.workers.running:
            await self.stop()

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every agent's trainer (SIGTERM, then SIGKILL after grace_s); return when gone."""
        if self.workers.stoppable and self.run.status not in TERMINAL_STATUSES:
            self.run.set_status("stopping")
        await self.workers.stop(grace_s)

    async def relaunch(self, config: RunConfig, *, fresh: bool) -> int:
        """Stop the trainers (not a terminal status), then start the next attempt."""
        run = self.run
        self.exit_policy.relaunching = True
        try:
            await self.stop()
        finally:
            self.exit_policy.relaunching = False
        if run.stop_requested:  # a stop (a signal) came while the old attempt stopped
            if run.status not in TERMINAL_STATUSES:
                run.set_status("stopped", message="stopped on request")
            raise ValueError("the run was stopped while relaunching; nothing was started")
        return await self.start(config, fresh=fresh, reason="relaunch")

    def begin_live(self, change: LiveChange) -> None:
        """Every worker runs change's settings: its attempt begins now, before any of its steps."""
        run = self.run
        run.attempt = change.attempt
        run.config = change.config
        self.record(change.path, "live")
        # The status it had (running; stopping if a stop came meanwhile), now the new
        # attempt's, and state.json's for `gpuwatch ls`.
        run.set_status(run.status)

    def hello(self, index: int) -> bool:
        """Worker index said hello: True once every worker of the attempt has."""
        self.hellos.add(index)
        return len(self.hellos) == self.workers.active

    def lost_steps(self, from_step: int) -> int:
        """Steps a resume from from_step loses against the chief's step when it started."""
        return max(0, self.step_before - from_step)
