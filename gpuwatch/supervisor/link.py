"""The supervisor's end of a remote agent's link: the launcher process (ssh, srun) and its stdio.

An AgentLink starts the launcher (in its own process group: killing the link kills
all of it), writes link frames to its stdin, and reads frames from its stdout one
line at a time (``frames_of``). It pairs requests with their replies (``ready``,
``started``), keeps the last lines of the launcher's stderr for the lost-link
message, and copies the agent's ``log`` frames into the worker's trainer.log here
(unless the agent's directory is this one). The rest of what the agent says
(``event``, ``sample``, ``exit``) goes to its listener, the RemoteAgent, and so
does the link's end. A frame that does not decode ends the link: nothing after it
can be trusted. The link frames themselves are listed in remote.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.supervisor.agent import AgentStartError, signal_group
from gpuwatch.supervisor.exits import MAX_LINE_CHARS
from trainer_runtime.protocol import MAX_FRAME_BYTES, FrameBuffer, ProtocolError

log = logging.getLogger("gpuwatch.supervisor.remote")

# How long a reply to prepare/start may take (ssh connecting, python starting).
REPLY_TIMEOUT_S = 60.0
# The last lines of the launcher's stderr kept for the lost-link message.
STDERR_LINES = 20


def frames_of(frames: FrameBuffer, chunk: bytes) -> Iterator[dict[str, Any]]:
    """The frames a chunk completes, one line at a time: the frames before a bad line
    are all yielded before its ProtocolError is raised (FrameBuffer.feed of the whole
    chunk would raise before returning any of them)."""
    start = 0
    while True:
        newline = chunk.find(b"\n", start)
        if newline < 0:
            yield from frames.feed(chunk[start:])
            return
        yield from frames.feed(chunk[start : newline + 1])
        start = newline + 1


class LinkListener(Protocol):
    """What the link passes on: the agent's trainer frames, and the link's end."""

    def take_event(self, frame: Any) -> None: ...

    def take_sample(self, fields: Any) -> None: ...

    def take_exit(self, frame: dict[str, Any]) -> None: ...

    def link_ended(self, message: str, starting: bool) -> None: ...


class AgentLink:
    """One worker's link, opened again after it ends; its bad frames are counted over all."""

    def __init__(
        self,
        listener: LinkListener,
        *,
        index: int,
        host: str,
        argv_prefix: Sequence[str],
        log_path: Path,
    ) -> None:
        self.listener = listener
        self.index = index
        self.host = host
        self.argv_prefix = list(argv_prefix)
        self.log_path = log_path  # the worker's trainer.log here, that log frames go to
        self.bad_frames = 0
        self.process: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task[None] | None = None  # reads the link until it ends
        self._stderr_task: asyncio.Task[None] | None = None
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._link_error: str | None = None  # why we ended the link, if we did
        self._lost: str | None = None  # why the last link ended
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        # The agent's directory is this one (the same host, or a shared filesystem): its
        # trainer.log is already here, so log frames are not appended (they would double).
        self.shared_dir = False
        self.prepared = False  # this link has answered prepare

    @property
    def up(self) -> bool:
        return self.task is not None and not self.task.done()

    async def open(self, cmd: list[str]) -> None:
        """Start the launcher with cmd (unless the link is up); AgentStartError if it cannot."""
        if self.up:
            return
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own group: killing the link kills all of it
                limit=MAX_FRAME_BYTES,
            )
        except OSError as exc:
            raise AgentStartError(f"could not start {cmd[0]} for {self.host}: {exc}") from None
        self.process = proc
        self._stderr_tail.clear()
        self._link_error = None
        self.prepared = False
        self._stderr_task = asyncio.create_task(self._read_stderr(proc))
        self.task = asyncio.create_task(self._read_link(proc))

    def write(self, data: bytes) -> None:
        proc = self.process
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            raise RuntimeError("the link is not open")
        proc.stdin.write(data)

    async def request(self, reply_type: str, data: bytes) -> dict[str, Any]:
        """Write a request and wait for its reply frame; AgentStartError if none comes."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._replies[reply_type] = future
        try:
            try:
                self.write(data)
            except (RuntimeError, OSError):
                # The link is ending: its end answers the future, with ssh's own words.
                task = self.task
                if task is None or task.done():
                    raise AgentStartError(self._lost or self._lost_message()) from None
            return await asyncio.wait_for(future, REPLY_TIMEOUT_S)
        except TimeoutError:
            # An agent that does not answer is of no use, and may yet start something: end it.
            self.kill()
            raise AgentStartError(
                f"agent on {self.host} did not answer within {REPLY_TIMEOUT_S:.0f} s"
            ) from None
        except asyncio.CancelledError:
            self.kill()
            raise
        finally:
            self._replies.pop(reply_type, None)

    def kill(self) -> None:
        proc = self.process
        if proc is not None and proc.returncode is None:
            signal_group(proc.pid, signal.SIGKILL)

    async def close(self, grace_s: float) -> None:
        """End the link: the agent sees EOF, stops anything it runs, and exits."""
        proc = self.process
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), grace_s + 5.0)
        except TimeoutError:
            self.kill()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.task), 5.0)

    # -- reading it ------------------------------------------------------------------

    async def _read_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while True:
            try:
                line = await proc.stderr.readline()
            except (ValueError, asyncio.LimitOverrunError):  # a line over the limit
                continue
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()[:MAX_LINE_CHARS]
            if text:
                self._stderr_tail.append(text)
                log.debug("agent %d: %s", self.index, text)

    async def _read_link(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        frames = FrameBuffer()
        try:
            while True:
                chunk = await proc.stdout.read(1 << 16)
                if not chunk:
                    break
                try:
                    for frame in frames_of(frames, chunk):
                        try:
                            self._take(frame)
                        except (ProtocolError, ValueError, TypeError, KeyError) as exc:
                            self.bad_frames += 1
                            log.warning("agent on %s: dropped a frame: %s", self.host, exc)
                except ProtocolError as exc:
                    # The stream is not frames any more: nothing after this can be trusted.
                    self.bad_frames += 1
                    self._link_error = f"bad frame from the agent: {exc}"
                    log.warning("agent on %s: bad frame: %s; ending the link", self.host, exc)
                    self.kill()
                    break
        finally:
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                self.kill()
                await proc.wait()
            if self._stderr_task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._stderr_task, 2.0)
            self._ended(proc)

    def _ended(self, proc: asyncio.subprocess.Process) -> None:
        message = self._lost = self._lost_message(proc.returncode)
        starting = False
        for reply_type, future in self._replies.items():
            if not future.done():
                future.set_exception(AgentStartError(message))
                starting = starting or reply_type == "started"
        # A start still waiting for its answer raises this; it is not also an exit.
        self.listener.link_ended(message, starting)

    def _lost_message(self, returncode: int | None = None) -> str:
        launcher = os.path.basename(self.argv_prefix[0]) if self.argv_prefix else "agent"
        if returncode is None:
            how = f"{launcher} is gone"
        elif returncode < 0:
            how = f"{launcher} killed by signal {-returncode}"
        else:
            how = f"{launcher} exited {returncode}"
        last = self._link_error or (self._stderr_tail[-1] if self._stderr_tail else "")
        return f"agent link to {self.host} lost: {how}" + (f": {last}" if last else "")

    # -- what the agent says ---------------------------------------------------------

    def _take(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        future = self._replies.get(kind)
        if kind in ("ready", "started"):
            if future is None or future.done():
                raise ProtocolError(f"unasked-for {kind!r} frame")
            future.set_result(frame)
        elif kind == "event":
            self.listener.take_event(frame.get("frame"))
        elif kind == "sample":
            self.listener.take_sample(frame.get("fields"))
        elif kind == "log":
            self._take_log(frame.get("lines"))
        elif kind == "exit":
            self.listener.take_exit(frame)
        elif kind == "error":
            message = str(frame.get("message"))[:MAX_LINE_CHARS]
            log.warning("agent on %s: %s", self.host, message)
            pending = self._replies.get("started") or self._replies.get("ready")
            if pending is not None and not pending.done():
                pending.set_exception(AgentStartError(f"{self.host}: {message}"))
        else:
            raise ProtocolError(f"unknown link frame {kind!r}")

    def _take_log(self, lines: Any) -> None:
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            raise ProtocolError("log: lines must be a list of strings")
        if self.shared_dir or not lines:  # the agent's own file is this one
            return
        text = "".join(line[:MAX_LINE_CHARS] + "\n" for line in lines)
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            log.warning("could not append to %s: %s", self.log_path, exc)
