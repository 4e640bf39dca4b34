"""A run's attempts: each one started, recorded and stopped, by a relaunch or a live change.

``Attempts`` is part of the Supervisor (core.py): the attempt numbers, the attempt events
recorded before any of their frames, the workers started and stopped together, and the
relaunch command's stop-then-start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwatch.config import dump_config, expected_replicas
from gpuwatch.supervisor.agent import AgentStartError
from gpuwatch.supervisor.live import LiveChange
from gpuwatch.supervisor.timings import TIMINGS
from gpuwatch.supervisor.workers import WorkerStartError
from trainer_runtime.protocol import TERMINAL_STATUSES, Attempt, Event
from trainer_runtime.schema import RunConfig

# How long a trainer has to checkpoint and exit after SIGTERM before SIGKILL.
STOP_GRACE_S = TIMINGS.stop_grace_s

if TYPE_CHECKING:
    from gpuwatch.supervisor.exit_policy import ExitPolicy
    from gpuwatch.supervisor.scale_attempts import ScaleProbe
    from gpuwatch.supervisor.workers import Workers


def topology(config: RunConfig) -> tuple[Any, ...] | None:
    """What a run's agents are made from: fixed for the run (a worker's data, the collective
    and its timeout reach the trainers through each attempt's config, so they may change)."""
    cluster = config.cluster
    if cluster is None:
        return None
    hosts = tuple(worker.host for worker in cluster.workers)
    ports = tuple(cluster.ports) if cluster.ports is not None else None
    return (cluster.launcher, hosts, ports, cluster.python, tuple(cluster.ssh_options))


class Attempts:
    """Starting, recording and stopping the run's attempts (the Supervisor's)."""

    if TYPE_CHECKING:  # the Supervisor's, which these use
        run_id: str
        run_dir: Path
        config: RunConfig
        status: str
        attempt: int
        last_step: int
        stop_requested: bool
        exiting: bool
        workers: Workers
        agents: list[Any]
        exit_policy: ExitPolicy
        scale: ScaleProbe | None
        _hellos: set[int]
        _last_step_before: int

        @property
        def clustered(self) -> bool: ...

        @property
        def ended(self) -> bool: ...

        @property
        def scaling(self) -> bool: ...

        def record(self, event: Event, t: float | None = None) -> float: ...

        def set_status(self, status: str, **fields: Any) -> None: ...

    @property
    def trainer_running(self) -> bool:
        return self.workers.running

    def replicas_for(self, config: RunConfig) -> int:
        """Replicas the trainers reported, or what the config asks for before they have."""
        # The chief's hello says the run's replicas (in a cluster: all workers' together),
        # unless the devices change (strategy.replicas, a relaunch setting).
        replicas: int | None = self.agents[0].replicas
        if config.strategy != self.config.strategy:
            return expected_replicas(config)
        return replicas or expected_replicas(config)

    async def start_attempt(self, config: RunConfig, *, fresh: bool, reason: str) -> int:
        self.attempt += 1
        attempt = self.attempt
        self.config = config
        attempt_path = self.run_dir / f"attempt-{attempt}.yaml"
        try:
            attempt_path.write_text(dump_config(config))
        except OSError as exc:
            self.set_status("crashed", message=f"could not write {attempt_path}: {exc}")
            return attempt
        self._record_attempt(attempt_path, reason, fresh=fresh)
        self.set_status("starting")
        self._hellos = set()
        self.exit_policy.new_attempt()
        if not self.clustered:
            try:
                await self.agents[0].start(attempt, attempt_path, fresh=fresh)
            except AgentStartError as exc:
                self.set_status("crashed", message=str(exc))
                return attempt
            if config.command is not None:
                # A person's own command runs once its process has started: it may never
                # say hello (a program that is not Python, or never imports TensorFlow).
                self.set_status("running")
            return attempt
        await self._start_workers(attempt, attempt_path, fresh=fresh)
        return attempt

    def _record_attempt(self, path: Path, reason: str, *, fresh: bool = False) -> None:
        """Attempt self.attempt begins with self.config: recorded before any of its frames."""
        self._last_step_before = self.last_step
        settings = self.config.model_dump(mode="json")
        attempt = Attempt(attempt=self.attempt, settings=settings, fresh=fresh, reason=reason,
                          config_path=str(path))
        self.record(attempt)

    async def _start_workers(self, attempt: int, attempt_path: Path, *, fresh: bool) -> None:
        """Start every worker, chief first; one that cannot start fails the attempt (the ones
        already started are stopped)."""
        policy = self.exit_policy
        try:
            await self.workers.start(
                self.config, attempt, attempt_path, fresh=fresh,
                # One already started has failed, or a stop came: start no more.
                go_on=lambda: policy.failed_worker is None and not self.stop_requested,
            )
        except WorkerStartError as exc:
            policy.start_failed(exc.index, str(exc))
        if policy.failed_worker is not None:
            await policy.stop_workers()
        elif self.stop_requested and self.trainer_running:
            await self.stop_trainers()

    async def stop_trainers(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every agent's trainer (SIGTERM, then SIGKILL after grace_s); return when gone."""
        if self.workers.stoppable and self.status not in TERMINAL_STATUSES:
            self.set_status("stopping")
        await self.workers.stop(grace_s)

    async def relaunch(self, config: RunConfig, *, fresh: bool) -> int:
        """Stop the trainers (not a terminal status), then start the next attempt."""
        if topology(config) != topology(self.config):
            raise ValueError(
                "cluster workers, hosts, launcher, ports, python and ssh_options cannot "
                "change on a relaunch (the agents are this run's); start a new run with "
                "gpuwatch train"
            )
        if self.scaling:
            assert self.scale is not None
            raise ValueError(self.scale.in_progress())
        if self.exiting:
            raise ValueError(
                f"run {self.run_id} has ended and its supervisor is exiting; "
                f"gpuwatch resume {self.run_id} continues it"
            )
        if self.ended:  # a relaunch after the end (a stop, a crash): the run goes on
            self.stop_requested = False
        self.exit_policy.relaunching = True
        try:
            await self.stop_trainers()
        finally:
            self.exit_policy.relaunching = False
        if self.stop_requested:  # a stop (a signal) came while the old attempt stopped
            if self.status not in TERMINAL_STATUSES:
                self.set_status("stopped", message="stopped on request")
            raise ValueError("the run was stopped while relaunching; nothing was started")
        return await self.start_attempt(config, fresh=fresh, reason="relaunch")

    def begin_live_attempt(self, change: LiveChange) -> None:
        """Every worker runs change's settings: its attempt begins now, before any of its steps."""
        self.attempt = change.attempt
        self.config = change.config
        self._record_attempt(change.path, "live")
        # The status it had (running; stopping if a stop came meanwhile), now the new
        # attempt's, and state.json's for `gpuwatch ls`.
        self.set_status(self.status)

