"""RemoteAgent: an Agent (agent.py) for a trainer on another host, through its agent process.

The supervisor's half of the link (remote.py has the whole link: both halves and every
frame): the agent process is started over ssh or srun and reached through an AgentLink
(link.py). The agent is as untrusted as a trainer: every relayed event is re-checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwatch.runs.folders import worker_dir
from gpuwatch.supervisor.agent import (
    AgentStartError,
    AttemptStamp,
    OnExit,
    OnFrame,
    OnSample,
    relayed_event,
)
from gpuwatch.supervisor.agent_process import EXIT_LOG_LINES, MARKER_NAME
from gpuwatch.supervisor.cluster import remote_argv, through_a_shell
from gpuwatch.supervisor.exits import MAX_LINE_CHARS, TrainerExit
from gpuwatch.supervisor.link import AgentLink
from gpuwatch.supervisor.trainer_start import TRAINER_MODULE_VARIABLE, trainer_module
from gpuwatch.supervisor.worker_role import WorkerLaunch
from trainer_runtime.protocol import (
    AGENT_EVENTS,
    LIVE_DEADLINE_S,
    Hello,
    ProtocolError,
    Reconfigured,
    Sample,
    encode,
    parse_event,
)

log = logging.getLogger("gpuwatch.supervisor.remote")


class RemoteAgent:
    """A trainer on another host, through an agent process reached by ssh or srun.

    argv_prefix: what runs a command there (cluster.ssh_prefix, cluster.srun_prefix, or any
    launcher); python: the interpreter there; remote_dir: the worker's directory
    there (default: resolved there, by the run id, under the account's own gpuwatch
    home: remote.py's first lines); remote_env: variables set for the agent there
    (``env K=V`` before python: ssh does not pass ours on).
    """

    # Its link carries reconfigure frames to the agent there, which sends them down.
    live_capable = True

    def __init__(
        self,
        index: int,
        run_dir: Path,
        *,
        argv_prefix: Sequence[str],
        python: str,
        on_frame: OnFrame,
        on_exit: OnExit,
        on_sample: OnSample,
        sample: bool = True,
        remote_dir: str | None = None,
        remote_env: Mapping[str, str] | None = None,
        host: str | None = None,
        command: bool = False,
    ) -> None:
        self.index = index
        # A person's own command (gpuwatch run) runs there: no reconfigure frame reaches it;
        # every change of its settings is a relaunch.
        self.command_run = command
        self.live_capable = not command
        self.run_dir = run_dir
        self.worker_dir = worker_dir(run_dir, index)  # here: the relayed log's copy
        self.log_path = self.worker_dir / "trainer.log"
        self.argv_prefix = list(argv_prefix)
        self.python = python
        self.remote_dir = remote_dir  # None: resolved there, by the run id
        self.dir_there: str | None = None  # the worker's directory there, as its agent said
        self.remote_env = dict(remote_env or {})
        self.sample = sample
        self.host = host or (self.argv_prefix[-1] if through_a_shell(argv_prefix) else
                             f"worker {index}")
        self._on_frame = on_frame
        self._on_exit = on_exit
        self._on_sample = on_sample
        self.replicas: int | None = None
        self.link = AgentLink(
            self, index=index, host=self.host, argv_prefix=self.argv_prefix,
            log_path=self.log_path,
        )
        # The attempt whose trainer runs (None: none, or its exit was handed up), and a live
        # change sent to it.
        self._stamp = AttemptStamp(None)
        self._trainer_pid: int | None = None
        self._exited = asyncio.Event()
        self._sampling = False
        self.tf_host: str | None = None
        self.tf_port: int | None = None

    # -- the Agent protocol (agent.py) ---------------------------------------------

    @property
    def running(self) -> bool:
        """A trainer was started and its exit has not been handed up yet."""
        return self._stamp.attempt is not None

    @property
    def stoppable(self) -> bool:
        return self.running and self.link.up and not self._exited.is_set()

    @property
    def pid(self) -> int | None:
        """The remote trainer's pid (on its host), while it runs."""
        return self._trainer_pid if self.running else None

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        """The launcher's process (ssh, srun) of the last link."""
        return self.link.process

    @property
    def bad_frames(self) -> int:
        return self.link.bad_frames

    @property
    def spare_pid(self) -> int | None:
        """None: no spare trainer waits for a worker on another host."""
        return None

    def want_spare(self, wanted: bool) -> None:
        """A worker on another host keeps no spare trainer (its agent starts each one cold)."""

    def release_spare(self) -> None:
        """No spare to let go (want_spare)."""

    def release_port(self) -> None:
        """The port the agent holds there goes with its next prepare, a stop, or its link."""

    def command(self) -> list[str]:
        """The full argv that starts the agent there."""
        where = (["--run-id", self.run_dir.name] if self.remote_dir is None
                 else ["--run-dir", self.remote_dir])
        remote = [self.python, "-m", "gpuwatch.supervisor.remote", *where,
                  "--index", str(self.index)]
        if not self.sample:
            remote.append("--no-sample")
        if self.command_run:
            remote.append("--command")
        env = dict(self.remote_env)
        if os.environ.get(TRAINER_MODULE_VARIABLE):  # a stand-in trainer, there too
            env.setdefault(TRAINER_MODULE_VARIABLE, trainer_module())
        if env:
            remote = ["env", *(f"{k}={v}" for k, v in env.items()), *remote]
        return remote_argv(self.argv_prefix, remote)

    async def prepare(self) -> tuple[str, int]:
        """Open the link (if it is not open) and ask the agent for a host and a free port."""
        link = self.link
        await link.open(self.command())
        reply = await link.request("ready", encode("prepare"))
        host, port = reply.get("host"), reply.get("port")
        if not isinstance(host, str) or not host or type(port) is not int or not 0 < port < 65536:
            link.bad_frames += 1
            raise AgentStartError(f"agent on {self.host} answered prepare with {reply!r:.200}")
        marker = reply.get("marker")
        try:
            link.shared_dir = isinstance(marker, str) and bool(marker) and (
                (self.worker_dir / MARKER_NAME).read_text() == marker
            )
        except OSError:
            link.shared_dir = False
        there = reply.get("dir")
        if isinstance(there, str) and there != self.dir_there:
            self.dir_there = there[:MAX_LINE_CHARS]
            log.info("worker %d on %s keeps its files in %s there%s", self.index, self.host,
                     self.dir_there, " (shared with this host)" if link.shared_dir else "")
        self.tf_host, self.tf_port = host, port
        link.prepared = True
        return host, port

    async def start(
        self,
        attempt: int,
        config_path: Path,
        *,
        fresh: bool,
        launch: WorkerLaunch | None = None,
    ) -> None:
        """Start this attempt's trainer there; AgentStartError if it cannot start."""
        try:
            config_text = config_path.read_text()  # noqa: ASYNC240 - one small file
        except OSError as exc:
            raise AgentStartError(f"could not read {config_path}: {exc}") from None
        if not self.link.prepared:  # the marker says whether to copy its log here
            await self.prepare()
        launch_fields = None if launch is None else {
            "index": launch.index, "workers": launch.workers, "env": dict(launch.env)
        }
        self._exited.clear()
        self._stamp.attempt = attempt
        try:
            reply = await self.link.request("started", encode(
                "start", attempt=attempt, config_text=config_text, fresh=fresh,
                launch=launch_fields,
            ))
        except BaseException:
            # No trainer runs, and no exit will be handed up for this attempt: the agent
            # refused, or the link ended (or went silent and was ended) before it answered.
            self._stamp.attempt = None
            self._exited.set()
            raise
        pid = reply.get("pid")
        self._trainer_pid = pid if type(pid) is int else None
        log.info("attempt %d: worker %d's trainer on %s, pid %s", attempt, self.index,
                 self.host, self._trainer_pid)

    async def reconfigure(
        self,
        request_id: int,
        new_attempt: int,
        settings: dict[str, Any],
        at_step: int,
        deadline_s: float = LIVE_DEADLINE_S,
    ) -> None:
        """Send a live change through the link; its trainer's answer comes back as an event."""
        if not self.stoppable:
            raise AgentStartError(f"worker {self.index}'s trainer on {self.host} is not running")
        self._stamp.pending = (request_id, new_attempt)
        try:
            self.link.write(encode("reconfigure", id=request_id, attempt=new_attempt,
                                   settings=settings, at_step=at_step, deadline_s=deadline_s))
        except (RuntimeError, OSError, ProtocolError) as exc:
            self._stamp.pending = None
            raise AgentStartError(f"could not reach the agent on {self.host}: {exc}") from None

    def cancel_reconfigure(self, attempt: int) -> None:
        """The change was abandoned: this trainer's frames are attempt's again."""
        self._stamp.cancel(attempt)

    async def stop(self, grace_s: float) -> None:
        """Ask the agent to stop its trainer; kill the link if it does not answer in grace+5 s."""
        if not self.running:
            return
        if self.stoppable:
            with contextlib.suppress(OSError, RuntimeError):
                self.link.write(encode("stop", grace_s=grace_s))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), grace_s + 5.0)
        if not self._exited.is_set():
            log.warning("agent on %s did not answer stop; ending its link", self.host)
            self.link.kill()
            await self._exited.wait()

    async def close(self, grace_s: float = 10.0) -> None:
        """End the link: the agent sees EOF, stops anything it runs, and exits."""
        await self.link.close(grace_s)

    def start_sampling(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sampling = self.sample  # the agent samples its host; we pass its samples on

    def stop_sampling(self) -> None:
        self._sampling = False

    def join_sampling(self, timeout_s: float = 3.0) -> None:
        pass

    # -- what the link brings (link.LinkListener) --------------------------------------

    def link_ended(self, message: str, starting: bool) -> None:
        # A start still waiting for its answer raises this; it is not also an exit.
        if self._stamp.attempt is not None and not self._exited.is_set() and not starting:
            log.warning("%s", message)
            self._hand_up(TrainerExit(returncode=1, link_lost=message))

    def _hand_up(self, ended: TrainerExit) -> None:
        self._stamp.attempt = None
        self._trainer_pid = None
        self._exited.set()
        self._on_exit(self.index, ended)

    def take_event(self, frame: Any) -> None:
        attempt = self._stamp.attempt
        if attempt is None:
            raise ProtocolError("event while no trainer runs")
        envelope, event = relayed_event(frame, attempt, self.index, AGENT_EVENTS)
        if isinstance(event, Hello):
            self.replicas = event.replicas
            self._trainer_pid = event.pid
        elif isinstance(event, Reconfigured):
            self._stamp.answered(event)
        self._on_frame(self.index, event, envelope.t)

    def take_sample(self, fields: Any) -> None:
        if not isinstance(fields, dict):
            raise ProtocolError("sample: fields must be an object")
        fields = {k: v for k, v in fields.items() if k != "worker"}
        _, sample = parse_event({"v": 1, "type": "sample", **fields})
        if self._sampling and isinstance(sample, Sample):
            self._on_sample(self.index, sample)

    def take_exit(self, frame: dict[str, Any]) -> None:
        if self._stamp.attempt is None:
            raise ProtocolError("exit while no trainer runs")
        returncode, done_reason = frame.get("returncode"), frame.get("done_reason")
        error, lines, oom = frame.get("error"), frame.get("log_lines"), frame.get("oom_killed")
        if (
            type(returncode) is not int
            or not (done_reason is None or isinstance(done_reason, str))
            or not (error is None or isinstance(error, str))
            or not isinstance(lines, list)
            or not all(isinstance(line, str) for line in lines)
            or type(oom) is not bool
        ):
            # The trainer has ended, however it ended; what the agent says of it is unreadable.
            self.link.bad_frames += 1
            self._hand_up(TrainerExit(
                returncode=1, link_lost=f"agent on {self.host} sent an unreadable exit frame"
            ))
            return
        self._hand_up(TrainerExit(
            returncode=returncode,
            done_reason=done_reason,
            error=error,
            log_lines=tuple(line[:MAX_LINE_CHARS] for line in lines[-EXIT_LOG_LINES:]),
            oom_killed=oom,
        ))
