"""Agents on other hosts: a LocalAgent run there over the user's own ssh (or srun), linked by stdio.

Two halves of one link:

* The agent process, run on the worker host as
  ``PYTHON -m gpuwatch.supervisor.remote --run-id ID --index I``. Its worker's
  directory is resolved there, under the account it runs as: that account's own
  gpuwatch home (``$GPUWATCH_HOME``, else ``~/.local/state/gpuwatch`` of *its*
  home), ``runs/ID/workers/I/``, made 0700 (runs.agent_worker_dir); never this
  host's path, which need not exist there (``alice@gpu-b`` has another home).
  ``--run-dir DIR`` names the directory instead. It runs a
  LocalAgent (trainer + that host's sampler) and speaks newline-delimited JSON
  frames (trainer_runtime.protocol's encoding, limits and FrameBuffer) on its
  stdin/stdout. stdout carries only frames; everything else goes to stderr.
  When stdin reaches EOF (the ssh link dropped, the supervisor went away) it
  stops its trainer (SIGTERM, grace, SIGKILL) and exits: nothing stays behind.
* RemoteAgent, on the supervisor's side: LocalAgent's interface, backed by that
  process through an AgentLink (link.py: the launcher process, reading and
  writing its stdio, replies, the log copy). The agent is as untrusted as a
  trainer: every relayed event is re-checked with parse_event (trainer events
  only; attempt and worker are re-stamped here), bad frames are counted, and a
  link that ends while a trainer runs becomes a TrainerExit that says the link
  was lost.

No port of ours listens anywhere and nothing is authenticated here: the link is
whatever ``ssh``/``srun`` gives (their keys, config, ProxyJump).

What the run needs of a worker's files comes over the link: its trainer's log
(``log`` frames, appended to workers/<i>/trainer.log here, so ``gpuwatch logs``
reads it), and a crash's last log lines (in ``exit``). Its scratch checkpoints stay
there: a resume finds them at the same place, as the run id and the index are the
same (the chief's real ones are here, in the run directory).

Link frames (each with "v" and "type"):
  supervisor -> agent
    prepare   reply ready (or error: the worker's directory cannot be made there)
    start     attempt (int), config_text (str: attempt-N.yaml's text), fresh (bool),
              launch ({index, workers, env} or null); reply started or error
    stop      grace_s (float)
  agent -> supervisor
    ready     host (str), port (int: free when found), pid (int: the agent's),
              marker (str: a token written to DIR/.gpuwatch-agent),
              dir (str: the worker's directory there)
    started   attempt (int), pid (int: the trainer's)
    event     frame (a trainer event frame as event_frame writes it)
    sample    fields (host, gpus, nvml: a device sample of the agent's host)
    log       lines (list[str]: new lines of the trainer's log; bounded)
    exit      returncode, done_reason, error, log_lines, oom_killed (a TrainerExit)
    error     message (str: one line; e.g. the trainer could not start)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import pwd
import secrets
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwatch.runs import RunError, agent_worker_dir, ensure_private_tree, worker_dir
from gpuwatch.supervisor.agent import (
    AgentStartError,
    AttemptStamp,
    LocalAgent,
    OnExit,
    OnFrame,
    OnSample,
    relayed_event,
)
from gpuwatch.supervisor.cluster import remote_argv, through_a_shell
from gpuwatch.supervisor.exits import MAX_LINE_CHARS, TrainerExit
from gpuwatch.supervisor.launch import WorkerLaunch
from gpuwatch.supervisor.link import REPLY_TIMEOUT_S, AgentLink, frames_of
from trainer_runtime.protocol import (
    AGENT_EVENTS,
    LIVE_DEADLINE_S,
    MAX_FRAME_BYTES,
    FrameBuffer,
    Hello,
    ProtocolError,
    Reconfigured,
    encode,
    event_frame,
    host_name,
    parse_event,
)

log = logging.getLogger("gpuwatch.supervisor.remote")

# The agent's log relay: lines per frame, bytes per second (the rest is skipped, and
# the skip is said in the log), how often trainer.log is read.
LOG_LINES_PER_FRAME = 200
LOG_BYTES_PER_S = 64 * 1024
LOG_POLL_S = 0.25
# An exit frame carries at most this many of the attempt's last log lines.
EXIT_LOG_LINES = 200
# Written to the agent's stdout but not yet sent: past this, samples and log lines are
# dropped (events and exits never are) until the link drains.
MAX_UNSENT_BYTES = 32 * 1024 * 1024
# How long the agent waits for its trainer to stop when its link ends.
LINK_LOST_GRACE_S = 10.0
MARKER_NAME = ".gpuwatch-agent"


# -- launchers -----------------------------------------------------------------------


# -- the agent process (on the worker host) ------------------------------------------


class _AgentProcess:
    """The worker-host side of a link: a LocalAgent whose callbacks become frames on stdout."""

    def __init__(
        self,
        run_dir: Path,
        index: int,
        trainer_module: str,
        sample: bool,
        out: asyncio.StreamWriter,
    ) -> None:
        self.run_dir = run_dir
        self.index = index
        self.out = out
        self.agent = LocalAgent(
            index,
            run_dir,
            on_frame=self._on_frame,
            on_exit=self._on_exit,
            on_sample=self._on_sample,
            trainer_module=trainer_module,
            sample=sample,
        )
        self.dropped = 0
        self._log_offset = _file_size(self.agent.log_path)
        self._log_partial = b""
        self._log_budget = float(LOG_BYTES_PER_S)
        self._log_skipped = 0
        self._pending: set[asyncio.Task[None]] = set()
        self.handling: asyncio.Task[None] | None = None  # the link frame being handled

    # -- frames out ---------------------------------------------------------------

    def send(self, frame_type: str, droppable: bool = False, **fields: Any) -> None:
        try:
            data = encode(frame_type, **fields)
        except ProtocolError as exc:
            data = encode("error", message=f"could not send a {frame_type} frame: {exc}")
        transport = self.out.transport
        if transport.is_closing():
            return
        if droppable and transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            self.dropped += 1
            return
        self.out.write(data)

    def _on_frame(self, index: int, event: Any, t: float | None) -> None:
        self.send("event", frame=event_frame(event, t=t))

    def _on_sample(self, index: int, fields: dict[str, Any]) -> None:
        self.send("sample", droppable=True, fields=fields)

    def _on_exit(self, index: int, ended: TrainerExit) -> None:
        # The log's last lines go before the exit, so the supervisor's copy is whole.
        self.relay_log(final=True)
        self.send(
            "exit",
            returncode=ended.returncode,
            done_reason=ended.done_reason,
            error=ended.error,
            log_lines=[line[:MAX_LINE_CHARS] for line in ended.log_lines[-EXIT_LOG_LINES:]],
            oom_killed=ended.oom_killed,
        )

    # -- the trainer's log ----------------------------------------------------------

    def relay_log(self, final: bool = False) -> None:
        """Send the complete lines trainer.log has gained (bounded per frame and per second)."""
        try:
            with open(self.agent.log_path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size < self._log_offset:  # truncated or replaced: start over
                    self._log_offset = 0
                budget = max(0, int(self._log_budget))
                start = self._log_offset
                skipping = size - start > budget and not final
                if skipping:
                    # Over this second's budget: skip to the newest part, from a line start.
                    self._log_skipped += size - start - budget
                    start = size - budget
                    self._log_partial = b""
                fh.seek(start)
                data = fh.read(size - start)
        except OSError:
            return
        self._log_offset = start + len(data)
        if skipping:
            cut = data.find(b"\n") + 1 if budget else len(data)
            if cut == 0:
                cut = len(data)
            self._log_skipped += cut
            data = data[cut:]
        self._log_budget -= len(data)
        data = self._log_partial + data
        lines = data.split(b"\n")
        self._log_partial = lines.pop()
        if final and self._log_partial:
            lines.append(self._log_partial)
            self._log_partial = b""
        text = [line.decode("utf-8", "replace")[:MAX_LINE_CHARS] for line in lines]
        if self._log_skipped:
            text.insert(0, f"[gpuwatch: {self._log_skipped} bytes of the log not relayed]")
            self._log_skipped = 0
        for first in range(0, len(text), LOG_LINES_PER_FRAME):
            self.send("log", droppable=True, lines=text[first : first + LOG_LINES_PER_FRAME])

    async def relay_log_forever(self) -> None:
        while True:
            await asyncio.sleep(LOG_POLL_S)
            self._log_budget = min(
                float(LOG_BYTES_PER_S), self._log_budget + LOG_BYTES_PER_S * LOG_POLL_S
            )
            self.relay_log()

    # -- frames in ------------------------------------------------------------------

    async def handle(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "prepare":
            marker = secrets.token_hex(8)
            try:
                self.make_dir()
                (self.run_dir / MARKER_NAME).write_text(marker)
            except AgentStartError as exc:
                self.send("error", message=str(exc))
                return
            except OSError:  # the marker only saves a doubled log copy: no marker, no share
                marker = ""
            self.send(
                "ready", host=host_name(), port=free_port(), pid=os.getpid(),
                marker=marker, dir=str(self.run_dir),
            )
        elif kind == "start":
            await self._start(frame)
        elif kind == "reconfigure":
            await self._reconfigure(frame)
        elif kind == "stop":
            grace_s: Any = frame.get("grace_s")
            if type(grace_s) not in (int, float) or not 0 <= grace_s <= 86400:
                self.send("error", message=f"stop: grace_s must be 0 to 86400 s ({grace_s!r:.50})")
                return
            task = asyncio.create_task(self.agent.stop(float(grace_s)))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        else:
            self.send("error", message=f"unknown link frame {kind!r}")

    async def _reconfigure(self, frame: dict[str, Any]) -> None:
        """Send a live change down to the trainer; one it cannot reach is refused as its answer."""
        request_id, attempt = frame.get("id"), frame.get("attempt")
        settings, at_step = frame.get("settings"), frame.get("at_step")
        deadline = frame.get("deadline_s", LIVE_DEADLINE_S)
        if (type(request_id) is not int or type(attempt) is not int or type(at_step) is not int
                or not isinstance(settings, dict) or type(deadline) not in (int, float)):
            self.send("error", message="reconfigure: id, attempt, at_step integers, settings "
                      "an object, deadline_s a number")
            return
        try:
            await self.agent.reconfigure(request_id, attempt, settings, at_step, deadline)
        except AgentStartError as exc:
            self._on_frame(self.index, Reconfigured(
                attempt=attempt - 1, id=request_id, ok=False, step=0, changed=[],
                seconds=0.0, message=str(exc)
            ), None)

    async def _start(self, frame: dict[str, Any]) -> None:
        attempt, text, fresh = frame.get("attempt"), frame.get("config_text"), frame.get("fresh")
        launch_fields = frame.get("launch")
        try:
            if type(attempt) is not int or attempt < 1:
                raise AgentStartError(f"start: attempt must be an integer >= 1 ({attempt!r})")
            if not isinstance(text, str) or not isinstance(fresh, bool):
                raise AgentStartError("start: config_text must be a string, fresh true or false")
            launch = _launch(launch_fields)
            if self.agent.running:
                raise AgentStartError("start: a trainer is already running")
            config_path = self.run_dir / f"attempt-{attempt}.yaml"
            self.make_dir()
            try:
                config_path.write_text(text)
            except OSError as exc:
                raise AgentStartError(f"could not write {config_path}: {exc}") from None
            await self.agent.start(attempt, config_path, fresh=fresh, launch=launch)
        except AgentStartError as exc:
            self.send("error", message=str(exc))
            return
        self.send("started", attempt=attempt, pid=self.agent.pid)

    def make_dir(self) -> None:
        """This worker's directory, made 0700 with its missing parents; AgentStartError (one
        line naming the directory and the account) if this account cannot make it."""
        try:
            ensure_private_tree(self.run_dir)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.filename is not None and os.fsdecode(exc.filename) != str(self.run_dir):
                why += f" ({os.fsdecode(exc.filename)})"
            raise AgentStartError(
                f"could not make this worker's directory {self.run_dir} as {_account()}: {why}"
            ) from None
        except RunError as exc:
            raise AgentStartError(f"this worker's directory is unusable: {exc}") from None

    async def shut_down(self) -> None:
        """The link ended: stop the trainer (SIGTERM, grace, SIGKILL) and the sampler."""
        if self.handling is not None:  # a start under way finishes first, so it is stopped
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.handling, REPLY_TIMEOUT_S)
        await self.agent.stop(LINK_LOST_GRACE_S)
        for task in list(self._pending):
            with contextlib.suppress(Exception):
                await task
        self.agent.stop_sampling()
        self.agent.release_spare()
        self.agent.join_sampling()


def _launch(fields: Any) -> WorkerLaunch | None:
    if fields is None:
        return None
    if not isinstance(fields, Mapping):
        raise AgentStartError("start: launch must be an object or null")
    index, workers, env = fields.get("index"), fields.get("workers"), fields.get("env", {})
    if type(index) is not int or type(workers) is not int or not 0 <= index < workers:
        raise AgentStartError("start: launch needs integers 0 <= index < workers")
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise AgentStartError("start: launch.env must map strings to strings")
    return WorkerLaunch(index, workers, dict(env))


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _account() -> str:
    """The account this agent runs as (for messages)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no name (a container's)
        return f"uid {os.getuid()}"


def free_port() -> int:
    """A TCP port that was free a moment ago (TensorFlow binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


async def agent_main(run_dir: Path, index: int, trainer_module: str, sample: bool) -> int:
    """Serve one link on stdin/stdout until stdin ends; 0, or 2 if the link sent garbage."""
    loop = asyncio.get_running_loop()
    # stdout is the link's alone: keep a private copy of it and point fd 1 at stderr,
    # so a stray print (ours, a library's) can never corrupt a frame.
    link_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, link_out
    )
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    reader = asyncio.StreamReader(limit=MAX_FRAME_BYTES)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(0), "rb", buffering=0)
    )
    link_ended = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        loop.add_signal_handler(sig, link_ended.set)

    served = _AgentProcess(run_dir, index, trainer_module, sample, out)
    served.agent.start_sampling(loop)
    relay = asyncio.create_task(served.relay_log_forever())
    status = 0

    async def read_link() -> None:
        nonlocal status
        frames = FrameBuffer()
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            try:
                for frame in frames_of(frames, chunk):
                    # Shielded: a signal that ends the link must not cut a start in half
                    # (a trainer spawned but not yet tracked); shut_down waits for it.
                    served.handling = asyncio.create_task(served.handle(frame))
                    await asyncio.shield(served.handling)
            except ProtocolError as exc:
                # Our own supervisor never sends this: the link is not what we think.
                served.send("error", message=f"bad frame from the supervisor: {exc}")
                log.error("bad frame from the supervisor: %s; ending the link", exc)
                status = 2
                return

    reading = asyncio.create_task(read_link())
    waiting = asyncio.create_task(link_ended.wait())
    await asyncio.wait({reading, waiting}, return_when=asyncio.FIRST_COMPLETED)
    reading.cancel()
    waiting.cancel()
    log.info("agent %d: link ended; stopping the trainer", index)
    await served.shut_down()
    relay.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(out.drain(), 2.0)
    with contextlib.suppress(Exception):
        out.close()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwatch.supervisor.remote",
        description="A gpuwatch agent on a worker host: frames on stdin/stdout (run over ssh).",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--run-id", help="the worker's directory is runs/ID/workers/INDEX "
                       "under this account's own gpuwatch home here")
    where.add_argument("--run-dir", type=Path, help="the worker's directory, as given")
    parser.add_argument("--index", required=True, type=int)
    parser.add_argument("--trainer-module", default="trainer_runtime")
    parser.add_argument("--no-sample", action="store_true", help="do not sample this host")
    args = parser.parse_args(argv)
    if args.run_dir is not None:
        run_dir: Path = args.run_dir
    else:
        try:
            run_dir = agent_worker_dir(args.run_id, args.index)
        except ValueError as exc:
            parser.error(str(exc))
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s agent {args.index} %(levelname)s %(message)s",
    )
    try:
        return asyncio.run(
            agent_main(run_dir, args.index, args.trainer_module, not args.no_sample)
        )
    except KeyboardInterrupt:
        return 130


# -- the supervisor's side -------------------------------------------------------------


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
        trainer_module: str = "trainer_runtime",
        remote_dir: str | None = None,
        remote_env: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> None:
        self.index = index
        self.run_dir = run_dir
        self.worker_dir = worker_dir(run_dir, index)  # here: the relayed log's copy
        self.log_path = self.worker_dir / "trainer.log"
        self.argv_prefix = list(argv_prefix)
        self.python = python
        self.trainer_module = trainer_module
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

    # -- LocalAgent's interface ----------------------------------------------------

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

    def command(self) -> list[str]:
        """The full argv that starts the agent there."""
        where = (["--run-id", self.run_dir.name] if self.remote_dir is None
                 else ["--run-dir", self.remote_dir])
        remote = [self.python, "-m", "gpuwatch.supervisor.remote", *where,
                  "--index", str(self.index), "--trainer-module", self.trainer_module]
        if not self.sample:
            remote.append("--no-sample")
        if self.remote_env:
            remote = ["env", *(f"{k}={v}" for k, v in self.remote_env.items()), *remote]
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
        parse_event({"v": 1, "type": "sample", **fields})  # checked as the recorder will
        if self._sampling:
            self._on_sample(self.index, fields)

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


if __name__ == "__main__":
    sys.exit(main())
