"""The agent process on a worker host: a LocalAgent whose callbacks become frames on stdout.

Run there as ``PYTHON -m gpuwatch.supervisor.remote --run-id ID --index I`` (remote.py
has the whole link: both halves and every frame). It serves one link on its
stdin/stdout until stdin ends, then stops its trainer and exits.
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
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuwatch.runs.folders import RunError, agent_worker_dir, ensure_private_tree
from gpuwatch.supervisor.agent import AgentStartError, LocalAgent
from gpuwatch.supervisor.exits import MAX_LINE_CHARS, TrainerExit
from gpuwatch.supervisor.link import REPLY_TIMEOUT_S, frames_of
from gpuwatch.supervisor.timings import PROBLEM
from gpuwatch.supervisor.worker_role import WorkerLaunch
from trainer_runtime.protocol import (
    ENVELOPE,
    LIVE_DEADLINE_S,
    MAX_FRAME_BYTES,
    FrameBuffer,
    ProtocolError,
    Reconfigured,
    Sample,
    encode,
    event_frame,
    host_name,
)

log = logging.getLogger("gpuwatch.supervisor.remote")

# What a sample sent up leaves out: the envelope and the worker.
_NOT_SENT_UP = frozenset({*ENVELOPE, "worker"})

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


class _AgentProcess:
    """The worker-host side of a link: a LocalAgent whose callbacks become frames on stdout."""

    def __init__(
        self,
        run_dir: Path,
        index: int,
        sample: bool,
        out: asyncio.StreamWriter,
        command: bool = False,
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
            sample=sample,
            command=command,
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

    def _on_sample(self, index: int, sample: Sample) -> None:
        # Its wire fields but the worker (the supervisor's to say) and an empty summary.
        fields = {key: value for key, value in event_frame(sample).items()
                  if key not in _NOT_SENT_UP and (key != "gpu_summary" or value is not None)}
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
            # The port is held here (supervisor/ports.py) until the start frame's trainer.
            _, port = await self.agent.prepare()
            self.send(
                "ready", host=host_name(), port=port, pid=os.getpid(),
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


async def agent_main(run_dir: Path, index: int, sample: bool, command: bool = False) -> int:
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

    served = _AgentProcess(run_dir, index, sample, out, command)
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
    parser.add_argument("--no-sample", action="store_true", help="do not sample this host")
    parser.add_argument("--command", action="store_true",
                        help="start the person's own command the config holds (gpuwatch run), "
                             "not the trainer module")
    args = parser.parse_args(argv)
    if PROBLEM is not None:  # the same refusal as the supervisor's: no trainer, one line
        print(f"gpuwatch agent: {PROBLEM}", file=sys.stderr)
        return 2
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
            agent_main(run_dir, args.index, not args.no_sample, args.command)
        )
    except KeyboardInterrupt:
        return 130
