"""The supervisor itself: one run's life cycle, over its event log, client hub and agents.

It records every event (event log first, then the hub's fan-out and the TensorBoard
scalars), turns what its agents report into the run's status, starts and stops
attempts, answers signals, and lingers after the run ends while a dashboard might
still relaunch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwatch import runs
from gpuwatch.config import ConfigError, dump_config, expected_replicas, load_config
from gpuwatch.supervisor.agent import AgentStartError, LocalAgent
from gpuwatch.supervisor.cluster import WorkerPlan, plan_workers, worker_launches
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.exits import TrainerExit, exit_status
from gpuwatch.supervisor.hub import Client, ClientHub, TaskSet
from gpuwatch.supervisor.snapshots import StateKeeper
from gpuwatch.tboard import RunBoard
from trainer_runtime.protocol import (
    LIVE_DEADLINE_S,
    TERMINAL_STATUSES,
    Attempt,
    Event,
    Hello,
    ProtocolError,
    Reconfigured,
    Resume,
    Run,
    Sample,
    StatusChange,
    Step,
)
from trainer_runtime.schema import RunConfig

log = logging.getLogger("gpuwatch.supervisor")

STOP_GRACE_S = float(os.environ.get("GPUWATCH_STOP_GRACE_S", "30"))
# After the run ends, stay up this long with no dashboard attached (relaunch stays possible).
LINGER_S = float(os.environ.get("GPUWATCH_LINGER_S", "600"))
# A cluster's attempt that failed: how long the other workers get between SIGTERM and
# SIGKILL (a trainer blocked in a collective never reaches its SIGTERM check).
WORKER_KILL_GRACE_S = float(os.environ.get("GPUWATCH_WORKER_KILL_GRACE_S", "5"))
# How long every worker has to answer a live change before it is abandoned.
# A live change must begin in the trainer within this (the trainer's own deadline: past
# it the trainer refuses the change, so no "applied" can come after we gave up) ...
LIVE_TIMEOUT_S = float(os.environ.get("GPUWATCH_LIVE_TIMEOUT_S", str(LIVE_DEADLINE_S)))
# ... and its answer arrive within this much more (a rebuild; a slow boundary's refusal).
LIVE_ANSWER_GRACE_S = 30.0
# A cluster's live change applies this many updates past the furthest worker's last step.
LIVE_STEP_MARGIN = 3


class _LiveChange:
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


class Supervisor:
    """One run: its record, its dashboards, and its agents (one per trainer host)."""

    def __init__(
        self,
        run_dir: Path,
        socket_path: Path,
        *,
        fresh: bool = False,
        trainer_module: str = "trainer_runtime",
    ) -> None:
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.socket_path = socket_path
        self.config_path = run_dir / "config.yaml"
        self.config: RunConfig = load_config(self.config_path).config
        self.fresh = fresh  # the first attempt ignores existing checkpoints
        self.events = EventLog(run_dir)
        # The run folded as a dashboard folds it, and its snapshots (fast attach).
        self.keeper = StateKeeper(run_dir, self.events)
        self.commands = Commands(self)
        self.hub = ClientHub(
            socket_path, self.events, self.commands.answer, snapshots=self.keeper.snapshot_for
        )
        self.board = RunBoard(run_dir / "tensorboard")  # scalars, as events are recorded
        # A single-host run has one agent; a cluster one per worker. Agent 0 is the chief.
        # ClusterError (a ConfigError) when the cluster cannot be launched from here.
        self.plans = plan_workers(self.config, run_dir, env=os.environ)
        self.agents: list[Any] = [self._make_agent(plan, trainer_module) for plan in self.plans]
        for agent in self.agents:  # one sampler per host counts all the run's processes there
            if isinstance(agent, LocalAgent) and agent.sample:
                agent.host_peers = [
                    a for a in self.agents if isinstance(a, LocalAgent) and a is not agent
                ]
        self._hosts = [plan.host for plan in self.plans]  # a worker's host, for messages
        self.status = "starting"
        self.attempt = 0
        self.last_step = 0
        self.stop_requested = False
        self._relaunching = False
        # This attempt, in a cluster: who said hello, who exited how, the worker that failed.
        self._hellos: set[int] = set()
        self._exits: dict[int, TrainerExit] = {}
        self._failed_worker: int | None = None
        self._straggler_timer: asyncio.TimerHandle | None = None
        self._last_step_before = 0  # the chief's step when the attempt started
        self._worker_steps: dict[int, int] = {}  # each worker's last step (live changes)
        self._live: _LiveChange | None = None
        self._finished = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks = TaskSet()

    @property
    def clustered(self) -> bool:
        return self.config.cluster is not None

    def _make_agent(self, plan: WorkerPlan, trainer_module: str) -> Any:
        """A LocalAgent for a worker on this host, a RemoteAgent (ssh, srun) for the others."""
        if plan.kind == "local":
            clustered = self.config.cluster is not None
            return LocalAgent(
                plan.index,
                self.run_dir,
                on_frame=self._on_trainer_frame,
                on_exit=self._on_trainer_exit,
                on_sample=self._on_sample,
                trainer_module=trainer_module,
                worker_dir=plan.worker_dir,
                sample=plan.sample,
                # A local worker finds the chief's checkpoints in the run directory.
                trainer_args=("--chief-dir", str(self.run_dir)) if clustered else (),
            )
        from gpuwatch.supervisor.remote import RemoteAgent  # a cluster over ssh or srun

        cluster = self.config.cluster
        assert cluster is not None
        return RemoteAgent(
            plan.index,
            self.run_dir,  # it finds its worker's directory there, as the plan does
            argv_prefix=list(plan.argv_prefix),
            python=cluster.python or sys.executable,
            on_frame=self._on_trainer_frame,
            on_exit=self._on_trainer_exit,
            on_sample=self._on_sample,
            sample=plan.sample,
            trainer_module=trainer_module,
            host=plan.host,
        )

    # -- the record ---------------------------------------------------------------

    def record(self, event: Event, t: float | None = None) -> float:
        """Append an event to events.jsonl, then fan it out to subscribed dashboards.

        Returns the event's time (t: the sender's, default now).
        """
        seq, t, data = self.events.append(event, t)
        self.keeper.fold(seq, event, t)
        self.hub.publish(seq, data)
        self.board.observe(event, t)
        return t

    def set_status(self, status: str, **fields: Any) -> None:
        self.status = status
        event = StatusChange(attempt=self.attempt, status=status, **fields)
        t = self.record(event)
        self.events.write_state(event, t, self.last_step)
        self.keeper.write()  # a dashboard attaching now starts from here

    def _set_exit_status(self, status: str, fields: dict[str, Any]) -> None:
        try:
            self.set_status(status, **fields)
        except ProtocolError:  # it cannot be too big (exits.py bounds it); never lose a status
            short = {"message": str(fields.get("message"))[:500], "worker": fields.get("worker")}
            self.set_status(status, **short)

    def status_fields(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "attempt": self.attempt,
            "step": self.last_step,
            "trainer_pid": self.agents[0].pid,
            "workers": len(self.agents),
            "worker_pids": [agent.pid for agent in self.agents],
            "supervisor_pid": os.getpid(),
            "bad_frames": self.bad_frames,
            "dropped_clients": self.hub.dropped_clients,
        }

    @property
    def bad_frames(self) -> int:
        """Frames refused from dashboards and from trainers, together."""
        return self.hub.bad_frames + sum(agent.bad_frames for agent in self.agents)

    # -- what the agents report -----------------------------------------------------

    def _on_trainer_frame(self, index: int, event: Event, t: float | None) -> None:
        live = self._live
        if (live is not None and not live.outcome.done() and index not in live.waiting
                and not isinstance(event, Reconfigured)):
            live.held.append((index, event, t))
            return
        if isinstance(event, Hello):
            self.record(event, t)
            self._hellos.add(index)
            # Running once every worker is up (a cluster's first steps wait for all).
            if len(self._hellos) == len(self.agents) and self.status == "starting":
                self.set_status("running")
            return
        if isinstance(event, Reconfigured):
            self.record(event, t)
            self._live_answer(index, event)
            return
        if isinstance(event, Step):
            self._worker_steps[index] = event.step
            if index == 0:  # the run's step is the chief's
                self.last_step = event.step
        elif isinstance(event, Resume):
            # Every worker resumes from the chief's checkpoint: lost against the chief's step.
            lost = max(0, self._last_step_before - event.from_step)
            event = replace(event, lost_steps=lost)
        self.record(event, t)

    def _on_trainer_exit(self, index: int, ended: TrainerExit) -> None:
        if self._live is not None:
            self._live.settle(f"{self._who(index)}'s trainer exited before applying the change")
        status, fields = exit_status(
            ended, relaunching=self._relaunching, stop_requested=self.stop_requested
        )
        if not self.clustered:
            self._set_exit_status(status, fields)
            return
        self._exits[index] = ended
        if self._failed_worker is not None:
            return  # the attempt has its status: the worker that failed first
        asked = self._relaunching or self.stop_requested
        if status == "crashed" and not asked:
            self._fail(index, fields)
            return
        others = [agent.index for agent in self.agents if agent.running and agent.index != index]
        if others:
            if not asked and self._straggler_timer is None and self.loop is not None:
                # A finished or stopped worker: the others should end at the same step. Those
                # still up after the collective timeout are stuck without it.
                cluster = self.config.cluster
                assert cluster is not None
                self._straggler_timer = self.loop.call_later(
                    cluster.timeout_s, self._stragglers, index, ended
                )
            return
        # The last worker out: the run's status is the chief's ending (one status).
        self._cancel_straggler_timer()
        chief = self._exits.get(0, ended)
        status, fields = exit_status(
            chief, relaunching=self._relaunching, stop_requested=self.stop_requested
        )
        if status == "crashed":
            fields = {**fields, "worker": 0, "message": f"{self._who(0)}: {fields['message']}"}
        self._set_exit_status(status, fields)

    def _who(self, index: int) -> str:
        return f"worker {index} ({self._hosts[index]})"

    def _fail(self, index: int, fields: dict[str, Any]) -> None:
        """One worker failed: the attempt is over (crashed, naming it) and the others stop."""
        self._failed_worker = index
        self._cancel_straggler_timer()
        message = f"{self._who(index)}: {fields.get('message') or 'failed'}"
        self._set_exit_status("crashed", {**fields, "message": message, "worker": index})
        self._tasks.spawn(self._stop_workers(WORKER_KILL_GRACE_S))

    def _stragglers(self, index: int, ended: TrainerExit) -> None:
        self._straggler_timer = None
        others = [agent.index for agent in self.agents if agent.running]
        asked = self._relaunching or self.stop_requested
        if not others or asked or self._failed_worker is not None:
            return
        how = ended.done_reason or f"code {ended.returncode}"
        cluster = self.config.cluster
        waited = cluster.timeout_s if cluster is not None else 0.0
        # The stuck one is to blame: it did not end at the step the others ended at.
        self._fail(
            others[0],
            {
                "message": f"still running {waited:.0f} s after {self._who(index)} ended "
                f"({how}): stuck without it; stopped",
            },
        )

    def _cancel_straggler_timer(self) -> None:
        if self._straggler_timer is not None:
            self._straggler_timer.cancel()
            self._straggler_timer = None

    async def _stop_workers(self, grace_s: float) -> None:
        """Stop every worker still up: SIGTERM, then SIGKILL after grace_s."""
        await asyncio.gather(*(agent.stop(grace_s) for agent in self.agents))

    def _on_sample(self, index: int, fields: dict[str, Any]) -> None:
        # A finished run lingering for a relaunch records no more samples: the record
        # stays about training, and does not grow while nothing runs.
        if self.trainer_running or self.status not in TERMINAL_STATUSES:
            self.record(Sample(**{**fields, "worker": index}))

    # -- attempts -----------------------------------------------------------------

    @property
    def trainer_running(self) -> bool:
        return any(agent.running for agent in self.agents)

    def replicas_for(self, config: RunConfig) -> int:
        """Replicas the trainers reported, or what the config asks for before they have."""
        # The chief's hello says the run's replicas (in a cluster: all workers' together).
        replicas: int | None = self.agents[0].replicas
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
        self.record(
            Attempt(
                attempt=attempt,
                settings=config.model_dump(mode="json"),
                fresh=fresh,
                reason=reason,
                config_path=str(attempt_path),
            )
        )
        self.set_status("starting")
        self._hellos = set()
        self._exits = {}
        self._failed_worker = None
        self._cancel_straggler_timer()
        self._last_step_before = self.last_step
        if not self.clustered:
            try:
                await self.agents[0].start(attempt, attempt_path, fresh=fresh)
            except AgentStartError as exc:
                self.set_status("crashed", message=str(exc))
            return attempt
        await self._start_workers(attempt, attempt_path, fresh=fresh)
        return attempt

    async def _start_workers(self, attempt: int, attempt_path: Path, *, fresh: bool) -> None:
        """Prepare every agent (fresh ports), then start each worker with its launch, chief first.

        A worker that cannot be prepared or started fails the attempt: the ones already
        started are stopped.
        """
        index = 0
        try:
            results = await asyncio.gather(
                *(agent.prepare() for agent in self.agents), return_exceptions=True
            )
            prepared: list[tuple[str, int]] = []
            for i, result in enumerate(results):
                if isinstance(result, BaseException):
                    index = i  # the worker the failure names
                    raise result
                prepared.append(result)
            for plan, (host, _) in zip(self.plans, prepared, strict=True):
                if plan.kind == "remote":
                    self._hosts[plan.index] = host  # e.g. the slurm node's own name
            launches = worker_launches(
                self.config, self.plans, prepared, env=os.environ, this_host=socket.getfqdn()
            )
            for index, agent in enumerate(self.agents):
                if self._failed_worker is not None or self.stop_requested:
                    break  # one already started has failed, or a stop came: start no more
                await agent.start(attempt, attempt_path, fresh=fresh, launch=launches[index])
        except (AgentStartError, OSError) as exc:
            if self._failed_worker is None:
                self._failed_worker = index
                self._set_exit_status(
                    "crashed", {"message": f"{self._who(index)}: {exc}", "worker": index}
                )
        if self._failed_worker is not None:
            await self._stop_workers(WORKER_KILL_GRACE_S)
        elif self.stop_requested and self.trainer_running:
            await self.stop_trainers()

    async def stop_trainers(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every agent's trainer (SIGTERM, then SIGKILL after grace_s); return when gone."""
        if any(agent.stoppable for agent in self.agents) and self.status not in TERMINAL_STATUSES:
            self.set_status("stopping")
        await asyncio.gather(*(agent.stop(grace_s) for agent in self.agents))

    # -- what the commands ask (commands.Run) ---------------------------------------

    def subscribe(self, client: Client, from_seq: int, snapshot: str | None = None) -> int:
        return self.hub.subscribe(client, from_seq, snapshot)

    async def relaunch(self, config: RunConfig, *, fresh: bool) -> int:
        """Stop the trainers (not a terminal status), then start the next attempt."""
        if topology(config) != topology(self.config):
            raise ValueError(
                "cluster workers, hosts, launcher, ports, python and ssh_options cannot "
                "change on a relaunch (the agents are this run's); start a new run with "
                "gpuwatch train"
            )
        self._relaunching = True
        try:
            await self.stop_trainers()
        finally:
            self._relaunching = False
        if self.stop_requested:  # a stop (a signal) came while the old attempt stopped
            if self.status not in TERMINAL_STATUSES:
                self.set_status("stopped", message="stopped on request")
            raise ValueError("the run was stopped while relaunching; nothing was started")
        return await self.start_attempt(config, fresh=fresh, reason="relaunch")

    def can_reconfigure(self) -> bool:
        """A change may be applied live: every worker runs and its agent can send frames down."""
        return (
            self.status == "running"
            and self._live is None
            and not self.stop_requested
            and all(getattr(agent, "live_capable", False) and agent.stoppable
                    for agent in self.agents)
        )

    async def reconfigure(self, config: RunConfig) -> dict[str, Any]:
        """Apply config in the running trainers (live keys only): the next attempt, same processes.

        Nothing is recorded unless every worker applied it; ValueError (training goes on with
        the old settings) if one refuses, is not reached, or does not answer in time.
        """
        attempt = self.attempt + 1
        attempt_path = self.run_dir / f"attempt-{attempt}.yaml"
        try:
            attempt_path.write_text(dump_config(config))
        except OSError as exc:
            raise ValueError(f"could not write {attempt_path}: {exc}") from None
        # One worker: its next update boundary. Several: an update every worker has yet to
        # reach, so all switch after the same one.
        at_step = 0
        if self.clustered:
            at_step = max(self._worker_steps.values(), default=0) + LIVE_STEP_MARGIN
        live = self._live = _LiveChange(attempt, config, attempt_path, len(self.agents))
        settings = config.model_dump(mode="json")
        try:
            for agent in self.agents:
                await agent.reconfigure(attempt, attempt, settings, at_step, LIVE_TIMEOUT_S)
            outcome = await asyncio.wait_for(
                asyncio.shield(live.outcome), LIVE_TIMEOUT_S + LIVE_ANSWER_GRACE_S
            )
        except AgentStartError as exc:
            outcome = str(exc)
        except TimeoutError:
            waited = LIVE_TIMEOUT_S + LIVE_ANSWER_GRACE_S
            outcome = f"the trainer did not answer within {waited:.0f} s"
        finally:
            self._live = None
        if outcome is not None:
            for agent in self.agents:
                agent.cancel_reconfigure(self.attempt)
            for index, event, t in live.held:  # they stay the old attempt's
                self._on_trainer_frame(index, replace(event, attempt=self.attempt), t)  # type: ignore[call-arg]
            raise ValueError(f"not applied live: {outcome}; training goes on with the old settings")
        return {"attempt": attempt, "live": True, "seconds": time.monotonic() - live.started}

    def _live_answer(self, index: int, event: Reconfigured) -> None:
        live = self._live
        if live is None or event.id != live.attempt or live.outcome.done():
            return
        if not event.ok:
            message = event.message or "refused"
            if self.clustered:
                message = f"{self._who(index)}: {message}"
            live.settle(message)
            return
        live.waiting.discard(index)
        if live.waiting:
            return
        # Every worker runs the new settings: the new attempt begins now, before its steps.
        self.attempt = live.attempt
        self.config = live.config
        self._last_step_before = self.last_step
        self.record(
            Attempt(
                attempt=live.attempt,
                settings=live.config.model_dump(mode="json"),
                reason="live",
                config_path=str(live.path),
            )
        )
        self.set_status("running")  # the new attempt's, and state.json's for `gpuwatch ls`
        live.settle(None)
        held, live.held = live.held, []
        for index, held_event, held_t in held:
            self._on_trainer_frame(index, held_event, held_t)

    async def stop_run(self) -> None:
        self.stop_requested = True
        if self.trainer_running:
            await self.stop_trainers()
        elif self.status not in TERMINAL_STATUSES:
            self.set_status("stopped", message="stopped on request")
        self._finished.set()

    # -- life cycle ---------------------------------------------------------------

    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "socket": str(self.socket_path), "started": time.time()}
        tmp = self.run_dir / "supervisor.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.run_dir / "supervisor.json")

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.loop.add_signal_handler(sig, lambda: self._tasks.spawn(self.stop_run()))
        if self.events.next_seq:  # restarted on a run directory: its fold so far, first
            await asyncio.to_thread(self.keeper.restore)
        await self.hub.open()
        try:
            if self.events.next_seq == 0:
                self.record(
                    Run(
                        run_id=self.run_id,
                        name=self.config.name,
                        config_path=str(self.config_path),
                        supervisor_pid=os.getpid(),
                        host=socket.gethostname(),
                        settings=self.config.model_dump(mode="json"),
                    )
                )
            self._write_info()  # after the socket exists: `gpuwatch train` waits on this file
            for agent in self.agents:
                agent.start_sampling(self.loop)
            async with self.commands.lock:  # a relaunch waits until these trainers started
                if not self.stop_requested:
                    await self.start_attempt(self.config, fresh=self.fresh, reason="start")
            while not self._finished.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._finished.wait(), 1.0)
                self.keeper.tick()
                idle = self.hub.idle_s
                ended = not self.trainer_running and self.status in TERMINAL_STATUSES
                if ended and idle > LINGER_S:
                    log.info("run over and no dashboard for %.0f s: exiting", idle)
                    break
        finally:
            await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        if self.trainer_running:
            self.stop_requested = True
            await self.stop_trainers()
        # Remote links end now (their agents stop anything left and exit), not at exit.
        closing = [close() for agent in self.agents if (close := getattr(agent, "close", None))]
        await asyncio.gather(*closing, return_exceptions=True)
        await self.hub.flush(2.0)  # a moment for dashboards to receive the final status
        for agent in self.agents:
            agent.stop_sampling()
            if release := getattr(agent, "release_spare", None):
                release()
        self.hub.close()
        await self.hub.wait_closed(1.0)
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "supervisor.json").unlink()
        self.keeper.write()
        self.events.close()
        self.board.close()
        for agent in self.agents:
            agent.join_sampling(3.0)

    # -- names tests written against the one-class supervisor still use ---------------

    @property
    def trainer(self) -> asyncio.subprocess.Process | None:
        return self.agents[0].process

    @property
    def clients(self) -> dict[int, Client]:
        return self.hub.clients

    @property
    def _server(self) -> asyncio.AbstractServer | None:
        return self.hub.server

    @property
    def _events_file(self) -> EventLog:
        return self.events  # close() closes events.jsonl

    async def _open_socket(self) -> None:
        await self.hub.open()

    def _drop_client(self, client: Client, why: str) -> None:
        self.hub.drop(client, why)

    async def _read_trainer(self, sock: socket.socket, attempt: int) -> None:
        await self.agents[0].read_frames(sock, attempt)


def topology(config: RunConfig) -> tuple[Any, ...] | None:
    """What a run's agents are made from: fixed for the run (a worker's data, the collective
    and its timeout reach the trainers through each attempt's config, so they may change)."""
    cluster = config.cluster
    if cluster is None:
        return None
    hosts = tuple(worker.host for worker in cluster.workers)
    ports = tuple(cluster.ports) if cluster.ports is not None else None
    return (cluster.launcher, hosts, ports, cluster.python, tuple(cluster.ssh_options))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.supervisor")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--socket", type=Path, default=None)
    parser.add_argument(
        "--fresh", action="store_true", help="the first attempt ignores existing checkpoints"
    )
    args = parser.parse_args(argv)
    run_dir = args.run_dir.resolve()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    socket_path = args.socket or runs.socket_path_for(run_dir.name, run_dir.parent.parent)
    try:
        supervisor = Supervisor(run_dir, socket_path, fresh=args.fresh)
    except ConfigError as exc:
        print(f"gpuwatch supervisor: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(supervisor.run())
