"""A run's agents as one group: made from the worker plans, started in order, stopped together.

A single-host run has one agent; a cluster one per worker, agent 0 the chief.
The group knows which agent is which worker on which host (``who`` names one in
messages), prepares and starts an attempt's workers chief first, and stops,
samples and closes them all. It decides nothing about what an exit means
(exit_policy.py) or about the run's status (core.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from gpuwatch.supervisor.agent import (
    Agent,
    AgentStartError,
    LocalAgent,
    OnExit,
    OnFrame,
    OnSample,
)
from gpuwatch.supervisor.cluster import (
    WorkerPlan,
    plan_workers,
    through_a_shell,
    worker_launches,
)
from trainer_runtime.schema import RunConfig


class WorkerStartError(Exception):
    """A worker could not be prepared or started; the message names it (``who``)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class Workers:
    """The agents of one run, one per worker (LocalAgent here, RemoteAgent over ssh or srun)."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: Path,
        *,
        on_frame: OnFrame,
        on_exit: OnExit,
        on_sample: OnSample,
    ) -> None:
        self.run_dir = run_dir
        self._callbacks = (on_frame, on_exit, on_sample)
        # ClusterError (a ConfigError) when the cluster cannot be launched from here.
        self.plans = plan_workers(config, run_dir, env=os.environ)
        self.agents: list[Agent] = []
        local: list[LocalAgent] = []  # the workers on this host
        for plan in self.plans:
            if plan.kind == "local":
                local.append(self._local_agent(config, plan))
                self.agents.append(local[-1])
            else:
                self.agents.append(self._remote_agent(config, plan))
        for agent in local:  # one sampler per host counts all the run's processes there
            if agent.sample:
                agent.host_peers = [a for a in local if a is not agent]
        self.hosts = [plan.host for plan in self.plans]  # a worker's host, for messages
        # The workers the current attempt runs: all of them, or the first N (a scaling
        # probe's attempt at N workers).
        self.active = len(self.agents)

    def _local_agent(self, config: RunConfig, plan: WorkerPlan) -> LocalAgent:
        """The agent of a worker on this host."""
        on_frame, on_exit, on_sample = self._callbacks
        clustered = config.cluster is not None
        return LocalAgent(
            plan.index,
            self.run_dir,
            on_frame=on_frame,
            on_exit=on_exit,
            on_sample=on_sample,
            worker_dir=plan.worker_dir,
            sample=plan.sample,
            # A local worker finds the chief's checkpoints in the run directory.
            trainer_args=("--chief-dir", str(self.run_dir)) if clustered else (),
            command=config.command is not None,
        )

    def _remote_agent(self, config: RunConfig, plan: WorkerPlan) -> Agent:
        """The agent of a worker on another host (ssh, srun)."""
        from gpuwatch.supervisor.remote_agent import RemoteAgent  # a cluster over ssh or srun

        on_frame, on_exit, on_sample = self._callbacks
        cluster = config.cluster
        assert cluster is not None
        return RemoteAgent(
            plan.index,
            self.run_dir,  # it finds its worker's directory there, as the plan does
            argv_prefix=list(plan.argv_prefix),
            python=cluster.python or sys.executable,
            on_frame=on_frame,
            on_exit=on_exit,
            on_sample=on_sample,
            sample=plan.sample,
            host=plan.host,
            command=config.command is not None,
        )

    def who(self, index: int) -> str:
        return f"worker {index} ({self.hosts[index]})"

    # -- what they are doing -----------------------------------------------------------

    @property
    def running(self) -> bool:
        return any(agent.running for agent in self.agents)

    def running_indexes(self, *, besides: int | None = None) -> list[int]:
        """The workers whose trainers still run (or are still being watched), in order."""
        return [agent.index for agent in self.agents if agent.running and agent.index != besides]

    @property
    def stoppable(self) -> bool:
        """Some trainer is up that a stop would signal."""
        return any(agent.stoppable for agent in self.agents)

    @property
    def live_capable(self) -> bool:
        """Every worker runs and its agent can send frames down to it."""
        return all(agent.live_capable and agent.stoppable for agent in self.agents[: self.active])

    @property
    def pids(self) -> list[int | None]:
        return [agent.pid for agent in self.agents]

    @property
    def bad_frames(self) -> int:
        return sum(agent.bad_frames for agent in self.agents)

    # -- starting and stopping ---------------------------------------------------------

    async def start(
        self,
        config: RunConfig,
        attempt: int,
        attempt_path: Path,
        *,
        fresh: bool,
        go_on: Callable[[], bool],
    ) -> None:
        """Prepare every agent of the attempt (fresh ports), then start each worker with its
        launch, chief first. The attempt's config says how many: the first N of the run's
        workers (a scaling probe runs fewer than the run has).

        go_on is asked before each start (False: a started one failed, or a stop came:
        start no more). WorkerStartError names the worker that could not be prepared or
        started.
        """
        index = started = 0
        count = config.cluster.count if config.cluster is not None else 1
        self.active = min(count, len(self.agents))
        agents, plans = self.agents[: self.active], self.plans[: self.active]
        try:
            results = await asyncio.gather(
                *(agent.prepare() for agent in agents), return_exceptions=True
            )
            prepared: list[tuple[str, int]] = []
            for i, result in enumerate(results):
                if isinstance(result, BaseException):
                    index = i  # the worker the failure names
                    raise result
                prepared.append(result)
            for plan, (host, _) in zip(plans, prepared, strict=True):
                if plan.kind == "remote" and not through_a_shell(plan.argv_prefix):
                    # e.g. the slurm node's own name; an ssh worker keeps the name the
                    # config gives (user@host: the account is part of who it is).
                    self.hosts[plan.index] = host
            launches = worker_launches(config, plans, prepared, this_host=socket.getfqdn())
            for index, agent in enumerate(agents):
                if not go_on():
                    break
                await agent.start(attempt, attempt_path, fresh=fresh, launch=launches[index])
                started = index + 1
        except (AgentStartError, OSError) as exc:
            raise WorkerStartError(index, f"{self.who(index)}: {exc}") from None
        finally:
            # The ports held for workers this attempt did not start (a remote agent's
            # goes with its next prepare, a stop, or its link).
            for agent in agents[started:]:
                agent.release_port()

    async def stop(self, grace_s: float) -> None:
        """Stop every worker still up: SIGTERM, then SIGKILL after grace_s."""
        await asyncio.gather(*(agent.stop(grace_s) for agent in self.agents))

    # -- the run's life ----------------------------------------------------------------

    def start_sampling(self, loop: asyncio.AbstractEventLoop) -> None:
        for agent in self.agents:
            agent.start_sampling(loop)

    async def close_links(self) -> None:
        """Remote links end now (their agents stop anything left and exit), not at exit."""
        await asyncio.gather(*(agent.close() for agent in self.agents), return_exceptions=True)

    def want_spares(self, wanted: bool) -> None:
        """Keep a spare trainer ready on each worker (True), or none at all (False)."""
        for agent in self.agents:
            agent.want_spare(wanted)

    def stop_sampling(self) -> None:
        """Ask every sampler to stop, and discard the spare trainers (no relaunch will come)."""
        for agent in self.agents:
            agent.stop_sampling()
            agent.release_spare()

    def join_sampling(self, timeout_s: float) -> None:
        for agent in self.agents:
            agent.join_sampling(timeout_s)
