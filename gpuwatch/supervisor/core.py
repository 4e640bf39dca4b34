"""The supervisor itself: one run's life cycle, over its event log, client hub and agents.

It records every event (event log first, then the hub's fan-out and the TensorBoard
scalars), turns what its agents report into the run's status, starts and stops attempts
and answers signals. A run's processes live only while it trains or a client follows it:
once the run has ended and no client is subscribed, the supervisor exits within LINGER_S
(1 s) and the run directory is the whole record. Started with ``--await-follower`` (a
command that follows the run itself), it waits up to FIRST_FOLLOWER_S for that first
follower however soon the run ends, so a first attempt that crashes at once is there to
read and relaunch with `r`. ``--resume`` goes on from the last checkpoint; ``--scale``
runs a scaling probe (scale_attempts.py) before the run ends.
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

from gpuwatch.config import ConfigError, expected_replicas, load_config
from gpuwatch.runs import folders
from gpuwatch.supervisor.attempts import Attempts, topology
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.exit_policy import ExitPolicy
from gpuwatch.supervisor.exits import TrainerExit
from gpuwatch.supervisor.hub import Client, TaskSet
from gpuwatch.supervisor.live import LiveChange, LiveChanges
from gpuwatch.supervisor.recorder import Recorder
from gpuwatch.supervisor.scale_attempts import ScaleProbe, read_plan
from gpuwatch.supervisor.timings import PROBLEM, TIMINGS
from gpuwatch.supervisor.workers import Workers
from trainer_runtime.protocol import (
    TERMINAL_STATUSES,
    Checkpoint,
    Done,
    Event,
    Hello,
    Reconfigured,
    Resume,
    Run,
    Sample,
    StatusChange,
    Step,
)
from trainer_runtime.schema import RunConfig

log = logging.getLogger("gpuwatch.supervisor")

# Once the run has ended and no client follows it, exit after this long (seconds).
LINGER_S = TIMINGS.linger_s
# Started with --await-follower: how long an ended run waits for its first follower.
FIRST_FOLLOWER_S = TIMINGS.first_follower_s
# How often the supervisor looks at whether the run has ended with nobody attached.
LIFE_CHECK_S = 0.25


class Supervisor:
    """One run: its record, its dashboards, and its agents (one per trainer host).

    It orchestrates its parts: the agents as one group (workers.py), the attempts
    started and stopped over them (attempts.py), how their exits become the run's
    status (exit_policy.py), live settings changes (live.py).
    """

    def __init__(
        self,
        run_dir: Path,
        socket_path: Path,
        *,
        fresh: bool = False,
        config_path: Path | None = None,
        resume: bool = False,
        scale_path: Path | None = None,
        await_follower: bool = False,
    ) -> None:
        self.run_dir = run_dir
        # Whoever started it follows it (a dashboard, headless): wait for its first attach.
        self.await_follower = await_follower
        self.run_id = run_dir.name
        self.socket_path = socket_path
        self.config_path = config_path or run_dir / "config.yaml"
        self.config: RunConfig = load_config(self.config_path).config
        self.fresh = fresh  # the first attempt ignores existing checkpoints
        # Started again on an ended run's directory: its next attempt, from the checkpoint.
        self.resume = resume
        self.commands = Commands(self)
        self.recorder = Recorder(run_dir, socket_path, self.commands.answer)
        recorder = self.recorder  # its parts, by the names tests and the commands use
        self.events, self.keeper, self.hub = recorder.events, recorder.keeper, recorder.hub
        self.hub.on_attached_change = self._update_spares
        # A single-host run has one agent; a cluster one per worker. Agent 0 is the chief.
        # ClusterError (a ConfigError) when the cluster cannot be launched from here.
        self.workers = Workers(self.config, run_dir, on_frame=self.on_trainer_frame,
                               on_exit=self._on_trainer_exit, on_sample=self._on_sample)
        self.plans = self.workers.plans
        self.agents = self.workers.agents
        self.status = "starting"
        self.attempt = 0
        self.last_step = 0
        self.stop_requested = False
        self._tasks = TaskSet()
        self.exit_policy = ExitPolicy(self, self.workers, self._tasks)
        self.live = LiveChanges(self, self.workers)
        self.attempts = Attempts(self, self.workers, self.exit_policy)
        self._finished = asyncio.Event()
        self.exiting = False  # it has decided to exit: no new attempt starts here
        self.loop: asyncio.AbstractEventLoop | None = None
        # A scaling probe's attempts (scale_attempts.py); ConfigError when a count cannot run here.
        self.scale: ScaleProbe | None = None
        if scale_path is not None:
            self.scale = ScaleProbe(self, *read_plan(scale_path, self.config))

    @property
    def clustered(self) -> bool:
        return self.config.cluster is not None

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

    # -- the record ---------------------------------------------------------------

    def record(self, event: Event, t: float | None = None) -> float:
        """Record an event (recorder.py); returns its time (t: the sender's, default now)."""
        return self.recorder.record(event, t)

    def set_status(self, status: str, **fields: Any) -> None:
        self.status = status
        self.recorder.record_status(
            StatusChange(attempt=self.attempt, status=status, **fields), self.last_step
        )
        self._update_spares()
        if self.scale is not None:
            self.scale.poke()

    @property
    def ended(self) -> bool:
        """The run is over: no trainer runs and its last status is terminal."""
        return not self.trainer_running and self.status in TERMINAL_STATUSES

    @property
    def stopping(self) -> bool:
        """A stop was asked for and the run has not ended yet."""
        return self.stop_requested and not self.ended

    def _update_spares(self) -> None:
        """A spare trainer waits only while a person's dashboard follows a live run (not a
        scaling probe's: a spare importing TensorFlow beside a count would be in its
        measurement, and its counts start fresh trainers as headless ones do)."""
        wanted = (
            self.hub.dashboards > 0
            and self.status not in TERMINAL_STATUSES
            and not self.stop_requested
            and not self.scaling
        )
        self.workers.want_spares(wanted)

    def status_fields(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "attempt": self.attempt,
            "step": self.last_step,
            "trainer_pid": self.agents[0].pid,
            "workers": len(self.agents),
            "worker_pids": self.workers.pids,
            "spare_pids": [pid for a in self.agents if (pid := a.spare_pid)],
            "supervisor_pid": os.getpid(),
            "bad_frames": self.bad_frames,
            "dropped_clients": self.hub.dropped_clients,
            # What keeps an ended run's supervisor up (gpuwatch resume asks): dashboards
            # attached, any followers, the first follower it waits for (--await-follower).
            "dashboards": self.hub.dashboards,
            "followers": self.hub.attached,
            "awaiting_follower": self.await_follower and not self.hub.ever_attached,
            "exiting": self.exiting,
        }

    @property
    def bad_frames(self) -> int:
        """Frames refused from dashboards and from trainers, together."""
        return self.hub.bad_frames + self.workers.bad_frames

    # -- what the agents report -----------------------------------------------------

    def on_trainer_frame(self, index: int, event: Event, t: float | None) -> None:
        if self.live.hold(index, event, t):
            return
        if isinstance(event, Hello):
            self.record(event, t)
            # Running once every worker is up (a cluster's first steps wait for all).
            if self.attempts.hello(index) and self.status == "starting":
                self.set_status("running")
            return
        if isinstance(event, Reconfigured):
            self.record(event, t)
            self.live.answer(index, event)
            return
        if isinstance(event, Step):
            self.live.worker_steps[index] = event.step
            if index == 0:  # the run's step is the chief's
                self.last_step = event.step
        elif isinstance(event, (Checkpoint, Done)) and index == 0:
            # The step it saved or ended at: the run's step too when it sends no Step
            # frames (telemetry.enabled: false), so ls and state.json still tell it.
            self.last_step = max(self.last_step, event.step)
        elif isinstance(event, Resume):
            # Every worker resumes from the chief's checkpoint: lost against the chief's step.
            event = replace(event, lost_steps=self.attempts.lost_steps(event.from_step))
        self.record(event, t)

    def _on_trainer_exit(self, index: int, ended: TrainerExit) -> None:
        self.live.trainer_exited(index)
        self.exit_policy.on_exit(index, ended)
        if self.scale is not None:
            self.scale.poke()

    def _on_sample(self, index: int, sample: Sample) -> None:
        # A finished run lingering for a relaunch records no more samples: the record
        # stays about training, and does not grow while nothing runs.
        if self.trainer_running or self.status not in TERMINAL_STATUSES:
            self.record(replace(sample, worker=index))

    # -- what the commands ask (commands.CommandedRun) --------------------------------

    def subscribe(
        self, client: Client, from_seq: int, snapshot: str | None = None, *,
        dashboard: bool = False,
    ) -> int:
        return self.hub.subscribe(client, from_seq, snapshot, dashboard=dashboard)

    def can_reconfigure(self) -> bool:
        return self.live.possible() and not self.scaling

    @property
    def scaling(self) -> bool:
        """A scaling probe's attempts are under way or still to come."""
        return self.scale is not None and self.scale.running

    def live_in_flight(self) -> str | None:
        return self.live.in_flight()

    async def reconfigure(self, config: RunConfig) -> LiveChange:
        """Send config to the running trainers (live.py): the next attempt, same processes."""
        return await self.live.send(config)

    async def live_outcome(self, change: LiveChange) -> dict[str, Any]:
        return await self.live.outcome(change)

    async def start_attempt(self, config: RunConfig, *, fresh: bool, reason: str) -> int:
        """Start the next attempt with config (attempts.py); returns its number."""
        return await self.attempts.start(config, fresh=fresh, reason=reason)

    async def relaunch(self, config: RunConfig, *, fresh: bool) -> int:
        """Stop the trainers (not a terminal status), then start the next attempt; ValueError
        when this run cannot (its agents would change, a scaling probe runs, it is exiting)."""
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
        return await self.attempts.relaunch(config, fresh=fresh)

    def begin_live_attempt(self, change: LiveChange) -> None:
        """Every worker runs change's settings: its attempt begins now (live.py asks)."""
        self.attempts.begin_live(change)

    async def stop_run(self) -> None:
        """The stop command: end the run. On a run already over it also lets the supervisor
        go at once, dashboards attached or not (`gpuwatch stop` on an ended run)."""
        if self.ended:
            self._finished.set()
            return
        self.stop_requested = True
        self._update_spares()
        if self.trainer_running:
            await self.attempts.stop()
        elif self.status not in TERMINAL_STATUSES:
            self.set_status("stopped", message="stopped on request")

    async def _on_signal(self) -> None:
        """SIGTERM, SIGINT, SIGHUP: stop the run and exit."""
        self.stop_requested = True
        await self.stop_run()
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
            self.loop.add_signal_handler(sig, lambda: self._tasks.spawn(self._on_signal()))
        await self.recorder.open()  # restarted on a run directory: its fold so far, first
        if self.events.next_seq:
            self._restore_progress()
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
                if self.scale is not None:
                    self.record(self.scale.plan)
            self._write_info()  # after the socket exists: `gpuwatch train` waits on this file
            self.workers.start_sampling(self.loop)
            if self.scale is not None:  # its attempts, one after another
                self._tasks.spawn(self.scale.run_all())
            else:
                async with self.commands.lock:  # a relaunch waits until these trainers started
                    if not self.stop_requested:
                        reason = "resume" if self.resume else "start"
                        await self.start_attempt(self.config, fresh=self.fresh, reason=reason)
            while not self._finished.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._finished.wait(), LIFE_CHECK_S)
                self.keeper.tick()
                if self._may_exit():
                    log.info("run over (%s) and nobody attached: exiting", self.status)
                    break
        finally:
            await self.shutdown()
        return 0

    def _may_exit(self) -> bool:
        """The run has ended, no client follows it (for LINGER_S), and no command is
        under way (a relaunch holds the lock from the old attempt's end to the new start),
        nor a scaling probe's next count."""
        linger = (FIRST_FOLLOWER_S if self.await_follower and not self.hub.ever_attached
                  else LINGER_S)
        return (self.ended and self.hub.idle_s >= linger and not self.commands.lock.locked()
                and not self.scaling)

    def _restore_progress(self) -> None:
        """Started again on a recorded run: go on from its last attempt and step."""
        recorded = folders.read_run_info(self.run_dir)
        state = self.keeper.state
        last = state.last_step.step if state.last_step is not None else 0
        self.attempt = max(self.attempt, recorded.attempt, state.attempt or 0)
        self.last_step = max(self.last_step, recorded.step, last)

    async def shutdown(self) -> None:
        self.exiting = True
        if self.trainer_running:
            self.stop_requested = True
            await self.attempts.stop()
        await self.workers.close_links()
        await self.hub.flush(2.0)  # a moment for dashboards to receive the final status
        self.workers.stop_sampling()
        await self.recorder.close_hub()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "supervisor.json").unlink()
        self.recorder.close()
        self.workers.join_sampling(3.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.supervisor")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--socket", type=Path, default=None)
    parser.add_argument(
        "--fresh", action="store_true", help="the first attempt ignores existing checkpoints"
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="the settings (default: RUN_DIR/config.yaml)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with a recorded run: its next attempt, from its last checkpoint",
    )
    parser.add_argument(
        "--scale", type=Path, default=None,
        help="a scaling probe's plan (scale.json): a fresh attempt per device count, in turn",
    )
    parser.add_argument(
        "--await-follower", action="store_true",
        help="whoever started it attaches next (a dashboard, headless): an ended run waits "
             f"up to {FIRST_FOLLOWER_S:g} s for that first follower",
    )
    args = parser.parse_args(argv)
    if PROBLEM is not None:
        print(f"gpuwatch supervisor: {PROBLEM}", file=sys.stderr)
        return 2
    run_dir = args.run_dir.resolve()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    socket_path = args.socket or folders.socket_path_for(run_dir.name, run_dir.parent.parent)
    try:
        supervisor = Supervisor(
            run_dir,
            socket_path,
            fresh=args.fresh,
            config_path=args.config.resolve() if args.config else None,
            resume=args.resume,
            scale_path=args.scale.resolve() if args.scale else None,
            await_follower=args.await_follower,
        )
    except ConfigError as exc:
        print(f"gpuwatch supervisor: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(supervisor.run())
