"""The trainer side of a run: one agent is one trainer process and its host's device sampler.

A single-host run has one local agent. The agent starts the trainer (trainer_start.py:
its own process group, a socketpair for telemetry, trainer.log, a spare), reads
and checks its frames, stops the whole group, and when the trainer exits hands
the supervisor a TrainerExit (exits.py says what status that is). Every frame and sample it
passes up carries its index, so the supervisor knows which worker spoke; what
is recorded on the wire is unchanged. ``Agent`` is what the supervisor drives of any
agent: LocalAgent here, RemoteAgent (remote_agent.py) for a worker on another host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, cast

from gpuwatch.supervisor.exits import TrainerExit
from gpuwatch.supervisor.ports import Reservation, reserve_port
from gpuwatch.supervisor.summarize import Upward
from gpuwatch.supervisor.timings import TIMINGS
from gpuwatch.supervisor.trainer_start import AgentStartError, TrainerLauncher
from gpuwatch.supervisor.worker_role import WorkerLaunch
from trainer_runtime import scratch
from trainer_runtime.protocol import (
    LIVE_DEADLINE_S,
    MAX_FRAME_BYTES,
    TRAINER_EVENTS,
    Done,
    Envelope,
    Error,
    Event,
    FrameBuffer,
    Hello,
    ProtocolError,
    Reconfigured,
    Sample,
    Step,
    parse_event,
    reconfigure_frame,
)

log = logging.getLogger("gpuwatch.supervisor")

SAMPLE_INTERVAL_S = TIMINGS.sample_interval_s

# (agent index, frame type, fields): a trainer frame with v and seq taken off, attempt put on.
OnFrame = Callable[[int, Event, float | None], None]
# (agent index, how the trainer ended): called once its frames are all read.
OnExit = Callable[[int, TrainerExit], None]
# (agent index, its host's sample): called on the event loop, once per sample.
OnSample = Callable[[int, Sample], None]


class Agent(Protocol):
    """One worker's trainer as the supervisor drives it, whatever host it is on: a LocalAgent
    here, a RemoteAgent (remote_agent.py) through its agent process there."""

    index: int
    live_capable: bool  # it can send a running trainer a reconfigure frame
    replicas: int | None  # from the trainer's last hello

    @property
    def running(self) -> bool: ...

    @property
    def stoppable(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def spare_pid(self) -> int | None: ...

    @property
    def bad_frames(self) -> int: ...

    async def prepare(self) -> tuple[str, int]: ...

    def release_port(self) -> None: ...

    async def start(
        self, attempt: int, config_path: Path, *, fresh: bool, launch: WorkerLaunch | None = None
    ) -> None: ...

    async def stop(self, grace_s: float) -> None: ...

    async def reconfigure(
        self, request_id: int, new_attempt: int, settings: dict[str, Any], at_step: int,
        deadline_s: float = LIVE_DEADLINE_S,
    ) -> None: ...

    def cancel_reconfigure(self, attempt: int) -> None: ...

    def want_spare(self, wanted: bool) -> None: ...

    def release_spare(self) -> None: ...

    def start_sampling(self, loop: asyncio.AbstractEventLoop) -> None: ...

    def stop_sampling(self) -> None: ...

    def join_sampling(self, timeout_s: float = 3.0) -> None: ...

    async def close(self) -> None: ...


class LocalAgent:
    """A trainer on this host, started as ``python -m trainer_runtime`` (or a person's own
    command, gpuwatch run), and this host's sampler."""

    # It can send a running trainer a reconfigure frame (a live settings change); not a
    # command's (set per agent).
    live_capable = True

    def __init__(
        self,
        index: int,
        run_dir: Path,
        *,
        on_frame: OnFrame,
        on_exit: OnExit,
        on_sample: OnSample,
        worker_dir: Path | None = None,
        sample: bool = True,
        trainer_args: Sequence[str] = (),
        command: bool = False,
    ) -> None:
        self.index = index
        # A person's own command (gpuwatch run) takes no reconfigure frame: every change of
        # its settings is a relaunch, a run of the command again.
        self.live_capable = not command
        self.run_dir = run_dir
        # The trainer's own directory: the run's for worker 0 (its checkpoints are the
        # ones resumed), workers/<i>/ for the others (their scratch checkpoints, logs).
        self.worker_dir = worker_dir or run_dir
        self.launcher = TrainerLauncher(self.worker_dir, trainer_args, command=command)
        self.log_path = self.launcher.log_path
        self.sample = sample  # workers on one host: only one of them samples it
        self.host = "localhost"
        self._reserved_port: Reservation | None = None
        # Other local workers on this host: the sampler counts their processes as the run's.
        self.host_peers: list[LocalAgent] = []
        self._on_exit = on_exit
        self.process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.replicas: int | None = None  # from the last hello; kept across attempts
        self.bad_frames = 0
        self._done_reason: str | None = None
        self._error: str | None = None
        self._cgroup: Path | None = None
        self._oom_kills_at_start: int | None = None
        # Past SUMMARY_PAST_WORKERS workers a worker's steps go up as summaries and its
        # samples lean (not the chief's): summarize.py.
        self._upward = Upward(index, on_frame, on_sample)
        self._sampler = _SamplerThread(index, self._run_pids, self._upward.sample,
                                       self._spare_pids)
        # Down the trainer's socket: reconfigure frames (None while no trainer reads it).
        self._writer: asyncio.StreamWriter | None = None
        # The attempt stamped on the trainer's frames: a live change moves it on.
        self._stamp = AttemptStamp(0)

    @property
    def running(self) -> bool:
        """A trainer process is up, or exited and its watcher is still finishing up."""
        return self.process is not None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def spare_pid(self) -> int | None:
        """The waiting spare trainer's pid (None: none waits now)."""
        return self.launcher.spare_pid

    @property
    def stoppable(self) -> bool:
        """A trainer is up that stop() would signal (not one that has already exited)."""
        proc, task = self.process, self._watcher
        return proc is not None and proc.returncode is None and task is not None and not task.done()

    # -- the trainer process -------------------------------------------------------

    async def prepare(self) -> tuple[str, int]:
        """The host other workers dial this one's trainer on, and a free port there.

        The port (gpuwatch/supervisor/ports.py: outside the kernel's ephemeral range, so no other
        process's connection takes it meanwhile) stays bound, not listening, until
        start(): the local workers of one attempt never get the same one, and the
        trainer binds it once it is free. An attempt that never starts this worker (a
        stop, another worker's failure) lets it go through release_port() or stop().
        """
        self.release_port()
        self._reserved_port = reserve_port()
        return self.host, self._reserved_port.port

    def release_port(self) -> None:
        """Let the port prepare() holds go (no trainer of this attempt will bind it)."""
        if self._reserved_port is not None:
            self._reserved_port.release()
            self._reserved_port = None

    async def start(
        self,
        attempt: int,
        config_path: Path,
        *,
        fresh: bool,
        launch: WorkerLaunch | None = None,
    ) -> None:
        """Start this attempt's trainer and watch it; AgentStartError if it cannot start.

        launch: this worker's place in a cluster (None: a single-host run).
        """
        if self.process is not None:
            raise AgentStartError(f"worker {self.index}'s trainer (pid {self.pid}) still runs")
        self.release_port()
        proc, parent_sock = await self.launcher.launch(
            attempt, config_path, fresh=fresh, launch=launch
        )
        log.info("attempt %d: trainer pid %d", attempt, proc.pid)
        self.process = proc
        self._cgroup = memory_cgroup(proc.pid)
        self._oom_kills_at_start = oom_kills(self._cgroup)
        self._done_reason = None
        self._error = None
        self._stamp.attempt = attempt
        self._stamp.pending = None
        self._upward.start(launch)
        self._watcher = asyncio.create_task(self._watch(proc, parent_sock, attempt))

    def release_spare(self) -> None:
        """The run is over: no relaunch will claim the spare."""
        self.launcher.release_spare()

    def want_spare(self, wanted: bool) -> None:
        """Keep a spare trainer ready for a relaunch (a dashboard is attached), or none."""
        self.launcher.want_spare(wanted, trainer_up=self.stoppable)

    async def close(self) -> None:
        """Nothing to end: a trainer here has no link (stop() ends the trainer)."""

    async def _watch(
        self, proc: asyncio.subprocess.Process, sock: socket.socket, attempt: int
    ) -> None:
        reader_task = asyncio.create_task(self.read_frames(sock, attempt))
        returncode = await proc.wait()
        # Whatever it forked (data loaders) goes with it, however it ended.
        signal_group(proc.pid, signal.SIGKILL)
        # A trainer killed outright could not remove its temporary directory.
        scratch.sweep(proc.pid)
        # The trainer's last frames may still be in the socket: read them to EOF.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader_task, 5.0)
        reader_task.cancel()
        sock.close()
        self.process = None
        oom = oom_kills(self._cgroup)
        at_start = self._oom_kills_at_start
        ended = TrainerExit(
            returncode=returncode,
            done_reason=self._done_reason,
            error=self._error,
            log_lines=tuple(self.launcher.log_lines()) if returncode != 0 else (),
            oom_killed=oom is not None and at_start is not None and oom > at_start,
        )
        self._on_exit(self.index, ended)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the trainer's process group, wait, then SIGKILL; return when it is gone
        (and a port prepared for a trainer that never started goes)."""
        self.release_port()
        proc, task = self.process, self._watcher
        if proc is None or task is None or task.done():
            return
        if proc.returncode is not None:  # exited; its watcher is finishing up
            await task
            return
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(task), grace_s)
        except TimeoutError:
            log.warning("trainer did not stop within %.0f s; SIGKILL", grace_s)
            signal_group(proc.pid, signal.SIGKILL)
            await task
        # Anything the trainer left behind in its group goes too.
        signal_group(proc.pid, signal.SIGKILL)

    # -- its frames ----------------------------------------------------------------

    async def read_frames(self, sock: socket.socket, attempt: int) -> None:
        """Pass every frame up until EOF; a frame that does not decode ends the reading."""
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_FRAME_BYTES)
        self._writer = writer
        self._stamp.attempt = attempt
        frames = FrameBuffer()
        ticker = asyncio.create_task(self._upward.send_due())
        try:
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    return
                try:
                    batch = frames.feed(chunk)
                except ProtocolError as exc:
                    self.bad_frames += 1
                    log.warning("attempt %d: bad frame from the trainer: %s", attempt, exc)
                    return
                for frame in batch:
                    try:
                        self._take_frame(frame, attempt)
                    except (ProtocolError, ValueError, TypeError) as exc:
                        # e.g. a NaN, or a frame that outgrows the limit once relayed
                        self.bad_frames += 1
                        log.warning("attempt %d: dropped a trainer frame: %s", attempt, exc)
        finally:
            ticker.cancel()
            self._upward.flush()  # before the exit is handed up
            self._writer = None
            self._stamp.pending = None
            writer.close()

    async def send(self, data: bytes) -> None:
        """Write to the trainer's telemetry socket; AgentStartError if no trainer reads it."""
        writer = self._writer
        if writer is None or writer.is_closing() or not self.stoppable:
            raise AgentStartError(f"worker {self.index}'s trainer is not running")
        try:
            writer.write(data)
            await asyncio.wait_for(writer.drain(), 5.0)
        except (OSError, TimeoutError) as exc:
            raise AgentStartError(
                f"could not write to worker {self.index}'s trainer: {exc or 'timed out'}"
            ) from None

    async def reconfigure(
        self,
        request_id: int,
        new_attempt: int,
        settings: dict[str, Any],
        at_step: int,
        deadline_s: float = LIVE_DEADLINE_S,
    ) -> None:
        """Ask the trainer to apply settings live; once it has, its frames are new_attempt's."""
        self._stamp.pending = (request_id, new_attempt)
        try:
            await self.send(reconfigure_frame(request_id, settings, at_step, deadline_s))
        except AgentStartError:
            self._stamp.pending = None
            raise

    def cancel_reconfigure(self, attempt: int) -> None:
        """The change was abandoned (refused elsewhere, or too late): frames are attempt's again."""
        self._stamp.cancel(attempt)

    def _take_frame(self, frame: dict[str, Any], attempt: int) -> None:
        attempt_now = cast(int, self._stamp.attempt)  # a local agent's is never None
        envelope, event = relayed_event(frame, attempt_now, self.index)
        if isinstance(event, Reconfigured):
            self._stamp.answered(event)
        elif isinstance(event, Hello):
            self.replicas = event.replicas
        elif isinstance(event, Done):
            self._done_reason = event.reason
        elif isinstance(event, Error):
            self._error = event.message
        elif isinstance(event, Step):
            self.launcher.trainer_stepped()
        self._upward.event(event, envelope.t)

    # -- its host's devices --------------------------------------------------------

    def start_sampling(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.sample:
            self._sampler.start(loop)

    def stop_sampling(self) -> None:
        """Ask the sampler to stop (at once); join_sampling waits for it."""
        self._sampler.stop.set()

    def join_sampling(self, timeout_s: float = 3.0) -> None:
        self._sampler.join(timeout_s)

    def _run_pids(self) -> set[int]:
        """The run's processes on this host: whose GPU memory counts as the run's."""
        pids = self._own_pids()
        for peer in self.host_peers:
            pids |= peer._own_pids()
        return pids

    def _spare_pids(self) -> set[int]:
        """The spare trainers waiting on this host (this worker's and its host peers')."""
        pids = {pid for agent in (self, *self.host_peers) if (pid := agent.spare_pid)}
        return pids

    def _own_pids(self) -> set[int]:
        return process_tree(self.process)


def process_tree(proc: asyncio.subprocess.Process | None) -> set[int]:
    """A trainer and everything it forked; none once it has exited (its pid may be
    another process's by then)."""
    if proc is None or proc.returncode is not None:
        return set()
    pids = {proc.pid}
    try:
        import psutil

        pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
    except Exception:
        pass
    return pids


class AttemptStamp:
    """The attempt an agent stamps on its trainer's frames, and the live change that moves it on.

    attempt: None while no trainer runs (a remote agent's). The trainer's `reconfigured`
    ok for the pending request still carries the old attempt; every frame after it the new.
    """

    def __init__(self, attempt: int | None) -> None:
        self.attempt = attempt
        # (request id, the attempt its frames belong to once it says it applied it).
        self.pending: tuple[int, int] | None = None

    def answered(self, event: Reconfigured) -> None:
        pending = self.pending
        if pending is not None and event.id == pending[0]:
            self.pending = None
            if event.ok:  # this one still carries the old attempt, what follows the new
                self.attempt = pending[1]

    def cancel(self, attempt: int) -> None:
        """The change was abandoned: the frames are attempt's again."""
        self.pending = None
        if self.attempt is not None:
            self.attempt = attempt


def relayed_event(frame: Any, attempt: int, worker: int,
                  allowed: frozenset[str] = TRAINER_EVENTS) -> tuple[Envelope, Event]:
    """A trainer's frame (relayed by a remote agent, or read here) as a checked event.

    Trainer events only (a remote agent's relay: its own step summaries too, ``allowed``);
    the attempt and the worker are the agent's to say, so a trainer cannot speak for
    another attempt or another worker. ProtocolError if not.
    """
    if not isinstance(frame, dict):
        raise ProtocolError("event: frame must be an object")
    envelope, event = parse_event(frame)
    if event.TYPE not in allowed:
        raise ProtocolError(f"a trainer may not send {event.TYPE!r} frames")
    return envelope, replace(event, attempt=attempt, worker=worker)  # type: ignore[call-arg]


class _SamplerThread:
    """Samples the host's devices every SAMPLE_INTERVAL_S in a thread (NVML calls may block)
    and posts each sample to the event loop."""

    def __init__(
        self,
        index: int,
        run_pids: Callable[[], set[int]],
        on_sample: OnSample,
        spare_pids: Callable[[], set[int]] | None = None,
    ) -> None:
        self.index = index
        self.run_pids = run_pids
        self.spare_pids = spare_pids
        self.on_sample = on_sample
        self.stop = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread = threading.Thread(target=self._main, name="gpuwatch-sampler", daemon=True)
        self.thread.start()

    def join(self, timeout_s: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout=timeout_s)

    def _main(self) -> None:
        try:
            from gpuwatch.sampling import DeviceSampler, sample_event
        except ImportError as exc:  # the sampling package is part of gpuwatch; be loud if absent
            log.error("device sampling unavailable: %s", exc)
            return
        sampler = DeviceSampler(run_pids=self.run_pids, spare_pids=self.spare_pids)
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    self._post(sample_event(sampler.sample()))
                except Exception:
                    log.exception("device sample failed")
                self.stop.wait(max(0.0, SAMPLE_INTERVAL_S - (time.monotonic() - started)))
        finally:
            sampler.close()

    def _post(self, sample: Sample) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.on_sample, self.index, sample)


def signal_group(pid: int, sig: int) -> None:
    """Signal a process group, if it is still there (and ours)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def memory_cgroup(pid: int) -> Path | None:
    """The memory cgroup directory of a process (v2, or v1's memory controller)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (candidate / "memory.events").exists():
                return candidate
        if "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            if (candidate / "memory.oom_control").exists():
                return candidate
    return None


def oom_kills(cgroup: Path | None) -> int | None:
    """The cgroup's count of OOM kills (memory.events, or v1's memory.oom_control)."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
