"""A spare trainer process, started ahead of a relaunch so the relaunch skips the import.

``python -m trainer_runtime.spare`` imports TensorFlow and the trainer's modules and
waits on stdin for the order that makes it this attempt's trainer. The agent starts one
once its trainer has run a step (so the import never competes with the trainer's own
start), its socketpair and log set up as a cold start's, and a relaunch claims it. Off
with ``GPUWATCH_SPARE_TRAINER=0``; a spare that has died is never claimed (a cold start).
Until claimed it sees no accelerator (HIDDEN_ACCELERATORS in its environment), so even a
CUDA context made by mistake could not take GPU memory from the job it waits beside; the
claim replaces its whole environment with the trainer's (trainer_runtime/spare.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("gpuwatch.supervisor")

# A waiting spare's view of the accelerators: none (CUDA and ROCm read these at their
# first device call, which a spare never makes before its claim).
HIDDEN_ACCELERATORS = {"CUDA_VISIBLE_DEVICES": "-1", "HIP_VISIBLE_DEVICES": "-1"}


def spare_enabled() -> bool:
    return os.environ.get("GPUWATCH_SPARE_TRAINER", "1").strip().lower() not in (
        "0",
        "no",
        "off",
        "false",
    )


class SpareTrainer:
    """One waiting ``trainer_runtime.spare`` process with its telemetry socketpair."""

    def __init__(
        self, proc: asyncio.subprocess.Process, parent_sock: socket.socket, child_fd: int
    ) -> None:
        self.proc = proc
        self.parent_sock = parent_sock
        self.child_fd = child_fd  # the telemetry fd's number in the spare

    @classmethod
    async def spawn(
        cls, module: str, log_path: Path, cwd: Path, env: dict[str, str]
    ) -> SpareTrainer | None:
        """Start one; None (and a log line) if it cannot be started."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            parent_sock.close()
            child_sock.close()
            log.warning("no spare trainer: %s", exc)
            return None
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "trainer_runtime.spare",
                "--module",
                module,
                "--run-dir",
                str(cwd),
                stdin=asyncio.subprocess.PIPE,
                stdout=log_fd,
                stderr=log_fd,
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,  # its own process group, as a trainer has
                cwd=str(cwd),
                env={**env, **HIDDEN_ACCELERATORS},
            )
        except OSError as exc:
            parent_sock.close()
            log.warning("no spare trainer: %s", exc)
            return None
        finally:
            os.close(log_fd)
            child_fd = child_sock.fileno()
            child_sock.close()
        log.info("spare trainer pid %d waiting", proc.pid)
        return cls(proc, parent_sock, child_fd)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def claim(
        self, argv: Sequence[str], env: dict[str, str], cwd: Path
    ) -> tuple[asyncio.subprocess.Process, socket.socket] | None:
        """Make it the trainer ``python -m MODULE *argv --telemetry-fd N``; None if it is gone.

        Returns the process and the supervisor's end of its telemetry socket.
        """
        stdin = self.proc.stdin
        if not self.alive or stdin is None:
            self.discard()
            return None
        order = {"argv": [*argv, "--telemetry-fd", str(self.child_fd)], "env": env, "cwd": str(cwd)}
        try:
            stdin.write(json.dumps(order).encode() + b"\n")
            await asyncio.wait_for(stdin.drain(), 5.0)
            stdin.close()
        except (OSError, TimeoutError) as exc:
            log.warning("spare trainer pid %d not claimed: %s", self.proc.pid, exc)
            self.discard()
            return None
        return self.proc, self.parent_sock

    def discard(self) -> None:
        """End it: no order comes (it exits at end of input), and its group is killed."""
        with contextlib.suppress(Exception):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.parent_sock.close()
