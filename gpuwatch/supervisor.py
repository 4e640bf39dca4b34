"""The per-run daemon: owns the run directory, runs the trainer, samples devices, serves dashboards.

Started by `gpuwatch train` as ``python -m gpuwatch.supervisor --run-dir DIR``,
detached from the terminal, so training outlives the dashboard and the SSH
session. One asyncio loop does everything but device sampling (a thread: NVML
calls may block). Every event is appended to ``events.jsonl`` (flushed) before
it is sent to anyone: the file is the record of truth and replay reads it.

Never imports TensorFlow: the trainer is a child process in its own process
group, talking over a socketpair.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatch import runs
from gpuwatch.config import (
    ConfigError,
    apply_overrides,
    check_replicas,
    dump_config,
    expected_replicas,
    load_config,
)
from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    TERMINAL_STATUSES,
    Command,
    FrameBuffer,
    InvalidCommand,
    ProtocolError,
    Relaunch,
    Status,
    Stop,
    Subscribe,
    encode,
    encode_frame,
    parse_command,
)
from trainer_runtime.schema import RunConfig

log = logging.getLogger("gpuwatch.supervisor")

STOP_GRACE_S = float(os.environ.get("GPUWATCH_STOP_GRACE_S", "30"))
SAMPLE_INTERVAL_S = float(os.environ.get("GPUWATCH_SAMPLE_INTERVAL_S", "1.0"))
# After the run ends, stay up this long with no dashboard attached (relaunch stays possible).
LINGER_S = float(os.environ.get("GPUWATCH_LINGER_S", "600"))
# A dashboard that stops reading is cut off once this much is queued for it.
CLIENT_QUEUE_MAX_BYTES = int(os.environ.get("GPUWATCH_CLIENT_QUEUE_MAX_BYTES", str(8 << 20)))
LOG_TAIL_LINES = 50
TRAINER_FRAMES = frozenset({"hello", "step", "checkpoint", "resume", "done", "error", "log"})
REPLAY_CHUNK_BYTES = 1 << 20


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_allowed(peer_uid: int, own_uid: int | None = None) -> bool:
    """Only the user who owns the run may talk to its supervisor (as tmux does)."""
    return peer_uid == (os.getuid() if own_uid is None else own_uid)


class _Client:
    """One connected dashboard: a bounded outgoing queue drained by its own task."""

    def __init__(self, cid: int, writer: asyncio.StreamWriter) -> None:
        self.cid = cid
        self.writer = writer
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued_bytes = 0
        self.subscribed_from: int | None = None
        self.replay_done = asyncio.Event()
        self.closed = False

    def send(self, data: bytes) -> bool:
        """Queue bytes; False when the client is too far behind (the caller drops it)."""
        if self.closed:
            return True
        if self.queued_bytes + len(data) > CLIENT_QUEUE_MAX_BYTES:
            return False
        self.queued_bytes += len(data)
        self.queue.put_nowait(data)
        return True


class Supervisor:
    def __init__(self, run_dir: Path, socket_path: Path) -> None:
        self.run_dir = run_dir
        self.run_id = run_dir.name
        self.socket_path = socket_path
        self.events_path = run_dir / "events.jsonl"
        self.trainer_log_path = run_dir / "trainer.log"
        self.config_path = run_dir / "config.yaml"
        self.config: RunConfig = load_config(self.config_path).config
        self.next_seq = self._count_existing_events()
        self._events_file = open(self.events_path, "ab", buffering=0)  # noqa: SIM115
        self.clients: dict[int, _Client] = {}
        self._client_ids = 0
        self.status = "starting"
        self.attempt = 0
        self.trainer: asyncio.subprocess.Process | None = None
        self.trainer_task: asyncio.Task[None] | None = None
        self.trainer_replicas: int | None = None
        self.last_step = 0
        self.last_done_reason: str | None = None
        self.last_error: str | None = None
        self._stop_requested = False
        self._relaunching = False
        self._command_lock = asyncio.Lock()
        self._finished = asyncio.Event()
        self._last_client_seen = time.monotonic()
        self.bad_frames = 0
        self.dropped_clients = 0
        self._server: asyncio.AbstractServer | None = None
        self._sampler_stop = threading.Event()
        self._sampler_thread: threading.Thread | None = None
        self._log_offset = 0
        self._trainer_cgroup: Path | None = None
        self._oom_kills_at_start: int | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[Any]] = set()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        """A task kept referenced until it ends (asyncio holds only weak references)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- the record ---------------------------------------------------------------

    def _count_existing_events(self) -> int:
        try:
            with open(self.events_path, "rb") as fh:
                return sum(1 for _ in fh)
        except FileNotFoundError:
            return 0

    def record(self, frame_type: str, /, **fields: Any) -> dict[str, Any]:
        """Append an event to events.jsonl, then fan it out to subscribed dashboards."""
        frame = {"v": PROTOCOL_VERSION, "type": frame_type, **fields}
        frame.setdefault("t", time.time())
        frame["seq"] = self.next_seq
        data = encode_frame(frame)
        self._events_file.write(data)
        self.next_seq += 1
        for client in list(self.clients.values()):
            if client.subscribed_from is None or frame["seq"] < client.subscribed_from:
                continue
            if not client.send(data):
                self._drop_client(client, "too far behind")
        return frame

    def set_status(self, status: str, **fields: Any) -> None:
        self.status = status
        frame = self.record("status", status=status, attempt=self.attempt, **fields)
        # `gpuwatch ls` reads this small file, not the tail of a long events.jsonl.
        state = {k: frame.get(k) for k in ("status", "attempt", "exit_code", "signal", "message")}
        state["step"] = self.last_step
        state["t"] = frame["t"]
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.run_dir / "state.json")

    # -- trainer ------------------------------------------------------------------

    def _replicas_for(self, config: RunConfig) -> int:
        return self.trainer_replicas or expected_replicas(config)

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
            "attempt",
            attempt=attempt,
            settings=config.model_dump(mode="json"),
            fresh=fresh,
            reason=reason,
            config_path=str(attempt_path),
        )
        self.set_status("starting")
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with open(self.trainer_log_path, "ab") as log_file:  # noqa: ASYNC230 - one short line
            log_file.write(
                f"=== gpuwatch: attempt {attempt} starting at {time.strftime('%Y-%m-%d %H:%M:%S')}"
                " ===\n".encode()
            )
            self._log_offset = log_file.tell()
        cmd = [
            sys.executable,
            "-m",
            "trainer_runtime",
            "--run-dir",
            str(self.run_dir),
            "--config",
            str(attempt_path),
            "--attempt",
            str(attempt),
            "--telemetry-fd",
            str(child_sock.fileno()),
        ]
        if fresh:
            cmd.append("--fresh")
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["PYTHONUNBUFFERED"] = "1"
        user_cwd = os.environ.get("GPUWATCH_USER_CWD")
        if user_cwd:
            # As `python -m` would: the person's working directory comes first on the path.
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [user_cwd, env.get("PYTHONPATH")]))
        try:
            log_fd = os.open(self.trainer_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            parent_sock.close()
            child_sock.close()
            self.set_status("crashed", message=f"could not open {self.trainer_log_path}: {exc}")
            return attempt
        try:
            self.trainer = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,
                cwd=str(self.run_dir),
                env=env,
            )
        except OSError as exc:
            parent_sock.close()
            self.set_status("crashed", message=f"could not start the trainer: {exc}")
            return attempt
        finally:
            os.close(log_fd)
            child_sock.close()
        log.info("attempt %d: trainer pid %d", attempt, self.trainer.pid)
        self._trainer_cgroup = _memory_cgroup(self.trainer.pid)
        self._oom_kills_at_start = _oom_kills(self._trainer_cgroup)
        self.last_done_reason = None
        self.last_error = None
        self.trainer_task = asyncio.create_task(
            self._watch_trainer(self.trainer, parent_sock, attempt)
        )
        return attempt

    async def _watch_trainer(
        self, proc: asyncio.subprocess.Process, sock: socket.socket, attempt: int
    ) -> None:
        reader_task = asyncio.create_task(self._read_trainer(sock, attempt))
        returncode = await proc.wait()
        # Whatever it forked (data loaders) goes with it, however it ended.
        _signal_group(proc.pid, signal.SIGKILL)
        # The trainer's last frames may still be in the socket: read them to EOF.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader_task, 5.0)
        reader_task.cancel()
        sock.close()
        self.trainer = None
        exit_code = returncode if returncode >= 0 else None
        sig = -returncode if returncode < 0 else None
        if self._relaunching and returncode in (0, -signal.SIGTERM, -signal.SIGKILL):
            # Not a terminal status: a new attempt follows at once.
            self.set_status(
                "relaunching",
                exit_code=exit_code,
                signal=_signal_name(sig),
                message="stopped for relaunch",
            )
        elif self._stop_requested and returncode in (0, -signal.SIGTERM, -signal.SIGKILL):
            self.set_status(
                "stopped",
                exit_code=exit_code,
                signal=_signal_name(sig),
                message="stopped on request",
            )
        elif returncode == 0 and self.last_done_reason in ("max_steps", "epochs"):
            self.set_status(
                "finished",
                exit_code=0,
                message=f"reached {self.last_done_reason.replace('_', ' ')}",
            )
        elif returncode == 0:
            self.set_status(
                "stopped",
                exit_code=0,
                message=f"trainer exited ({self.last_done_reason or 'no reason given'})",
            )
        else:
            lines = self._trainer_log_lines()
            tail = lines[-LOG_TAIL_LINES:]
            oom = _oom_kills(self._trainer_cgroup)
            oom_killed = oom is not None and self._oom_kills_at_start is not None and (
                oom > self._oom_kills_at_start
            )
            self.set_status(
                "crashed",
                exit_code=exit_code,
                signal=_signal_name(sig),
                message=describe_crash(returncode, self.last_error, lines, oom_killed),
                log_tail=tail,
            )

    def _trainer_log_lines(self) -> list[str]:
        """This attempt's lines of trainer.log (its last 256 KiB at most)."""
        try:
            with open(self.trainer_log_path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(self._log_offset, size - 256 * 1024))
                data = fh.read()
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    async def _read_trainer(self, sock: socket.socket, attempt: int) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=MAX_FRAME_BYTES)
        frames = FrameBuffer()
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
                        self._on_trainer_frame(frame, attempt)
                    except (ProtocolError, ValueError, TypeError) as exc:
                        # e.g. a NaN, or a frame that outgrows the limit once relayed
                        self.bad_frames += 1
                        log.warning("attempt %d: dropped a trainer frame: %s", attempt, exc)
        finally:
            writer.close()

    def _on_trainer_frame(self, frame: dict[str, Any], attempt: int) -> None:
        kind = frame.pop("type")
        if kind not in TRAINER_FRAMES:
            raise ValueError(f"the trainer may not send {kind!r} frames")
        frame.pop("v", None)
        frame.pop("seq", None)
        frame["attempt"] = attempt
        if kind == "hello":
            replicas = frame.get("replicas")
            self.trainer_replicas = replicas if isinstance(replicas, int) else None
            self.record(kind, **frame)
            self.set_status("running")
            return
        if kind == "step":
            step = frame.get("step")
            if isinstance(step, int):
                self.last_step = step
        elif kind == "resume":
            from_step = frame.get("from_step")
            if isinstance(from_step, int):
                frame["lost_steps"] = max(0, self.last_step - from_step)
        elif kind == "done":
            self.last_done_reason = str(frame.get("reason"))
        elif kind == "error":
            self.last_error = str(frame.get("message"))
        self.record(kind, **frame)

    async def stop_trainer(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the trainer's process group, wait, then SIGKILL; return when it is gone."""
        proc, task = self.trainer, self.trainer_task
        if proc is None or task is None or task.done():
            return
        if proc.returncode is not None:  # exited; its watcher is finishing up
            await task
            return
        if self.status not in TERMINAL_STATUSES:
            self.set_status("stopping")
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(task), grace_s)
        except TimeoutError:
            log.warning("trainer did not stop within %.0f s; SIGKILL", grace_s)
            _signal_group(proc.pid, signal.SIGKILL)
            await task
        # Anything the trainer left behind in its group goes too.
        _signal_group(proc.pid, signal.SIGKILL)

    # -- commands -----------------------------------------------------------------

    async def handle_command(self, command: Command, client: _Client) -> dict[str, Any]:
        """Carry out a command parse_command accepted; ValueError/ConfigError become err."""
        if isinstance(command, Subscribe):
            if client.subscribed_from is not None:
                raise ValueError("subscribe: this connection is already subscribed")
            client.subscribed_from = command.from_seq
            self._spawn(self._replay(client, command.from_seq, self.next_seq))
            return {"next_seq": self.next_seq, "run_id": self.run_id}
        if isinstance(command, Status):
            return self.status_fields()
        async with self._command_lock:
            if isinstance(command, Relaunch):
                return await self._relaunch(command)
            if isinstance(command, Stop):
                await self._stop_run()
                return self.status_fields()
        raise ValueError(f"{command.TYPE}: not a command this supervisor carries out")

    def status_fields(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "attempt": self.attempt,
            "step": self.last_step,
            "trainer_pid": self.trainer.pid if self.trainer else None,
            "supervisor_pid": os.getpid(),
            "bad_frames": self.bad_frames,
            "dropped_clients": self.dropped_clients,
        }

    async def _relaunch(self, command: Relaunch) -> dict[str, Any]:
        if self._stop_requested:
            raise ValueError("the run is stopping; start a new one with gpuwatch train")
        # parse_command checked both: overrides maps dotted keys to JSON values, and
        # fresh is a literal true/false (only true may discard the run's progress).
        overrides = dict(command.overrides)
        fresh = command.fresh
        config = apply_overrides(self.config, overrides, source="relaunch")
        check_replicas(config, self._replicas_for(config), source="relaunch")
        self._relaunching = True
        try:
            await self.stop_trainer()
        finally:
            self._relaunching = False
        attempt = await self.start_attempt(config, fresh=fresh, reason="relaunch")
        return {"attempt": attempt, "overrides": overrides}

    async def _stop_run(self) -> None:
        self._stop_requested = True
        if self.trainer is not None:
            await self.stop_trainer()
        elif self.status not in TERMINAL_STATUSES:
            self.set_status("stopped", message="stopped on request")
        self._finished.set()

    # -- dashboards ---------------------------------------------------------------

    async def _replay(self, client: _Client, from_seq: int, until_seq: int) -> None:
        """Send recorded events [from_seq, until_seq) from the file, in chunks, then go live.

        Events recorded meanwhile (seq >= until_seq) wait in the client's queue, which
        its writer drains only once the replay is done: no gap, no duplicate.
        """
        try:
            offset, seq = 0, 0
            while seq < until_seq and not client.closed:
                # File reads happen in a thread: a long history must not stall the loop.
                data, offset, seq = await asyncio.to_thread(
                    _read_event_lines, self.events_path, offset, seq, from_seq, until_seq
                )
                if not data and seq < until_seq:
                    break  # the file is shorter than the record says: nothing more to send
                if data and not await self._write_direct(client, data):
                    return
        finally:
            client.replay_done.set()

    async def _write_direct(self, client: _Client, data: bytes) -> bool:
        if client.closed:
            return False
        try:
            client.writer.write(data)
            await client.writer.drain()
        except OSError:
            self._drop_client(client, "connection lost")
            return False
        return True

    async def _client_writer(self, client: _Client) -> None:
        try:
            # Queued events are newer than the replay: hold them until it is written.
            await client.replay_done.wait()
            while True:
                data = await client.queue.get()
                if data is None:
                    return
                client.queued_bytes -= len(data)
                client.writer.write(data)
                await client.writer.drain()
        except (OSError, asyncio.CancelledError):
            return

    def _drop_client(self, client: _Client, why: str) -> None:
        if client.closed:
            return
        client.closed = True
        self.dropped_clients += why == "too far behind"
        log.info("client %d dropped: %s", client.cid, why)
        self.clients.pop(client.cid, None)
        while not client.queue.empty():
            client.queue.get_nowait()
        client.queued_bytes = 0
        client.queue.put_nowait(None)
        # abort(), not close(): close() waits to flush, forever for a peer that never reads.
        transport = client.writer.transport
        if transport is not None:
            transport.abort()

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sock = writer.get_extra_info("socket")
        try:
            _pid, uid, _gid = peer_credentials(sock)
        except OSError:
            uid = -1
        if not peer_allowed(uid):
            log.warning("refused a connection from uid %d", uid)
            writer.write(encode("err", id=None, message="permission denied: not the run's owner"))
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self._client_ids += 1
        client = _Client(self._client_ids, writer)
        self.clients[client.cid] = client
        self._last_client_seen = time.monotonic()
        writer_task = asyncio.create_task(self._client_writer(client))
        frames = FrameBuffer()
        try:
            while not client.closed:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                try:
                    batch = frames.feed(chunk)
                except ProtocolError as exc:
                    self.bad_frames += 1
                    log.info("client %d sent a bad frame (%s); closing it", client.cid, exc)
                    break
                for frame in batch:
                    self._spawn(self._answer(frame, client))
        except OSError:
            pass
        finally:
            self._drop_client(client, "disconnected")
            writer_task.cancel()
            self._last_client_seen = time.monotonic()

    async def _answer(self, frame: dict[str, Any], client: _Client) -> None:
        try:
            command = parse_command(frame)
        except InvalidCommand as exc:
            # Refused before anything is done: the run is exactly as it was. The id is
            # echoed only when it is itself valid (exc.command_id is None otherwise).
            reply = encode("err", id=exc.command_id, message=str(exc))
        else:
            try:
                result = await self.handle_command(command, client)
                reply = encode("ack", id=command.id, **result)
            except (ConfigError, ValueError) as exc:
                reply = encode("err", id=command.id, message=str(exc))
            except Exception as exc:  # a bug must not take the supervisor down
                log.exception("command %r failed", command.TYPE)
                reply = encode("err", id=command.id, message=f"internal error: {exc}")
        # Replies go straight out, ahead of queued events: a command never waits on a replay.
        if client.closed:
            return
        transport = client.writer.transport
        if transport is not None and transport.get_write_buffer_size() > CLIENT_QUEUE_MAX_BYTES:
            self._drop_client(client, "too far behind")  # sends commands, never reads replies
            return
        try:
            client.writer.write(reply)
        except OSError:
            self._drop_client(client, "connection lost")

    # -- device sampling ----------------------------------------------------------

    def _run_pids(self) -> set[int]:
        proc = self.trainer
        if proc is None:
            return set()
        pids = {proc.pid}
        try:
            import psutil

            pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        except Exception:
            pass
        return pids

    def _sampler_main(self, post: Callable[[dict[str, Any]], None]) -> None:
        try:
            from gpuwatch.sampling import DeviceSampler, sample_to_frame_fields
        except ImportError as exc:  # the sampling package is part of gpuwatch; be loud if absent
            log.error("device sampling unavailable: %s", exc)
            return
        sampler = DeviceSampler(run_pids=self._run_pids)
        try:
            while not self._sampler_stop.is_set():
                started = time.monotonic()
                try:
                    post(sample_to_frame_fields(sampler.sample()))
                except Exception:
                    log.exception("device sample failed")
                self._sampler_stop.wait(max(0.0, SAMPLE_INTERVAL_S - (time.monotonic() - started)))
        finally:
            sampler.close()

    def _post_sample(self, fields: dict[str, Any]) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._record_sample, fields)

    def _record_sample(self, fields: dict[str, Any]) -> None:
        # A finished run lingering for a relaunch records no more samples: the record
        # stays about training, and does not grow while nothing runs.
        if self.trainer is not None or self.status not in TERMINAL_STATUSES:
            self.record("sample", **fields)

    # -- life cycle ---------------------------------------------------------------

    async def _open_socket(self) -> None:
        runs.ensure_private_dir(self.socket_path.parent)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        old_umask = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            self._server = await asyncio.start_unix_server(
                self._serve_client, path=str(self.socket_path), limit=MAX_FRAME_BYTES
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, 0o600)

    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "socket": str(self.socket_path), "started": time.time()}
        tmp = self.run_dir / "supervisor.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.run_dir / "supervisor.json")

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.loop.add_signal_handler(sig, lambda: self._spawn(self._stop_run()))
        await self._open_socket()
        try:
            if self.next_seq == 0:
                self.record(
                    "run",
                    run_id=self.run_id,
                    name=self.config.name,
                    config_path=str(self.config_path),
                    supervisor_pid=os.getpid(),
                    host=socket.gethostname(),
                    settings=self.config.model_dump(mode="json"),
                )
            self._write_info()  # after the socket exists: `gpuwatch train` waits on this file
            self._sampler_thread = threading.Thread(
                target=self._sampler_main,
                args=(self._post_sample,),
                name="gpuwatch-sampler",
                daemon=True,
            )
            self._sampler_thread.start()
            fresh = os.environ.get("GPUWATCH_FRESH") == "1"
            await self.start_attempt(self.config, fresh=fresh, reason="start")
            while not self._finished.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._finished.wait(), 1.0)
                if self.clients:
                    self._last_client_seen = time.monotonic()
                idle = time.monotonic() - self._last_client_seen
                if self.trainer is None and self.status in TERMINAL_STATUSES and idle > LINGER_S:
                    log.info("run over and no dashboard for %.0f s: exiting", idle)
                    break
        finally:
            await self.shutdown()
        return 0

    async def shutdown(self) -> None:
        if self.trainer is not None:
            self._stop_requested = True
            await self.stop_trainer()
        # Give dashboards a moment to receive the final status.
        deadline = time.monotonic() + 2.0
        while any(c.queued_bytes for c in self.clients.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        self._sampler_stop.set()
        if self._server is not None:
            self._server.close()
        for client in list(self.clients.values()):
            self._drop_client(client, "supervisor exiting")
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "supervisor.json").unlink()
        self._events_file.close()
        if self._sampler_thread is not None:
            self._sampler_thread.join(timeout=3.0)


# A line that says what went wrong: a Python exception, a TensorFlow fatal log line
# (F1121 ... Check failed), a C++ terminate, faulthandler's report, the kernel's words.
_ERROR_LINE = re.compile(
    r"(?:^[\w.]*(?:Error|Exception|Exit|Interrupt)\b.*?:"
    r"|^F\d{4} "
    r"|Check failed|terminate called|Fatal Python error|Segmentation fault|Aborted"
    r"|out of memory|Killed)"
)


def describe_crash(
    returncode: int, error_frame: str | None, log_tail: list[str], oom_killed: bool
) -> str:
    """One line for a trainer that ended badly: how it ended, then its root cause.

    The cause is the trainer's own `error` frame when it sent one (a Python
    exception, with TensorFlow's wrapping peeled off); else the last line of its
    log that reads like an error (a C++ abort, a segfault, faulthandler); else,
    for SIGKILL, whether the kernel's OOM killer did it.
    """
    if returncode < 0:
        how = f"killed by {_signal_name(-returncode)}"
    else:
        how = f"exited with code {returncode}"
    cause = error_frame
    if not cause:
        for line in reversed(log_tail):
            text = line.strip()
            if text and _ERROR_LINE.search(text) and not text.startswith("File "):
                cause = text[:500]
                break
    if returncode == -signal.SIGKILL:
        if oom_killed:
            how += " (the kernel's OOM killer: the machine ran out of memory)"
        elif not cause:
            how += " (out of memory, or kill -9)"
    return f"{how}: {cause}" if cause else how


def _memory_cgroup(pid: int) -> Path | None:
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


def _oom_kills(cgroup: Path | None) -> int | None:
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


def _read_event_lines(
    path: Path, offset: int, seq: int, from_seq: int, until_seq: int
) -> tuple[bytes, int, int]:
    """Up to REPLAY_CHUNK_BYTES of events.jsonl lines from byte offset/seq, those in range."""
    out = bytearray()
    with open(path, "rb") as fh:
        fh.seek(offset)
        while seq < until_seq and len(out) < REPLAY_CHUNK_BYTES:
            line = fh.readline()
            if not line:
                break
            if seq >= from_seq:
                out += line
            seq += 1
            offset += len(line)
    return bytes(out), offset, seq


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _signal_name(sig: int | None) -> str | None:
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuwatch.supervisor")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--socket", type=Path, default=None)
    args = parser.parse_args(argv)
    run_dir = args.run_dir.resolve()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    socket_path = args.socket or runs.socket_path_for(run_dir.name, run_dir.parent.parent)
    try:
        supervisor = Supervisor(run_dir, socket_path)
    except ConfigError as exc:
        print(f"gpuwatch supervisor: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(supervisor.run())


if __name__ == "__main__":
    sys.exit(main())
