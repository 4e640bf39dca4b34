"""Starting one worker's trainer on this host: its log file, its command, a spare or a cold start.

The trainer is ``python -m trainer_runtime --run-dir DIR --config ... --attempt N
--telemetry-fd FD`` (worker_role.py says what a cluster worker adds), in its own process
group (a stop signals all of it), stdout and stderr appended to the worker's trainer.log
after one header line per attempt. While a spare is wanted (the supervisor says so) and
the trainer has run a step, a spare (spare.py) waits for the next attempt, which claims
it instead of starting cold; unwanted, it is discarded at once. A person's own command
(``gpuwatch run``) is started the same way, with the hook's fd and settings in
``GPUWATCH_HOOK_FD``/``GPUWATCH_HOOK`` and its directory first on PYTHONPATH, in the
directory the command was typed in; never a spare, which has the runtime imported. The
launcher also reads back this attempt's part of trainer.log (a crash's cause).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpuwatch.runs.environment import command_environment, trainer_environment
from gpuwatch.supervisor.spare import SpareTrainer, spare_enabled
from gpuwatch.supervisor.worker_role import WorkerLaunch
from trainer_runtime.hook import ENV_FD, ENV_SETTINGS, HOOK_DIR, hook_settings
from trainer_runtime.schema import RunConfig

log = logging.getLogger("gpuwatch.supervisor")

# How much of trainer.log an exit reads back for its cause (the end of this attempt's part).
LOG_READ_BYTES = 256 * 1024


class AgentStartError(Exception):
    """The trainer could not be started; the message says why, in one line."""


# The trainer, run as `python -m MODULE`: the bundled one, or where this variable names
# another (the tests' stand-in, tests/data/fake_trainer.py; the 64-host bench's). The one
# seam for it, read as each trainer starts; a remote agent passes it on to its host.
TRAINER_MODULE_VARIABLE = "GPUWATCH_TRAINER_MODULE"


def trainer_module() -> str:
    return os.environ.get(TRAINER_MODULE_VARIABLE) or "trainer_runtime"


class TrainerLauncher:
    """Starts a worker's trainers in its directory, and keeps a spare one ready for the next."""

    def __init__(
        self,
        worker_dir: Path,
        trainer_args: Sequence[str],
        *,
        command: bool = False,
    ) -> None:
        # A person's own command runs, as each attempt's config says (gpuwatch run).
        self.command = command
        self.worker_dir = worker_dir
        self.log_path = worker_dir / "trainer.log"
        # More arguments for every attempt's trainer (a local worker's --chief-dir).
        self.trainer_args = tuple(trainer_args)
        self._log_offset = 0  # where this attempt's part of trainer.log begins
        # A trainer-to-be with TensorFlow imported, for the next relaunch (spare.py).
        self._spare: SpareTrainer | None = None
        self._spare_task: asyncio.Task[None] | None = None
        self._closed = False  # the run is over: no more spares
        # A person's dashboard follows the live run: a relaunch may come (the supervisor
        # says; a headless run never wants one).
        self.spare_wanted = False
        self._stepped = False  # this attempt's trainer has run a step

    @property
    def spare_pid(self) -> int | None:
        """The waiting spare trainer's pid (None: none waits now)."""
        return self._spare.proc.pid if self._spare is not None and self._spare.alive else None

    async def launch(
        self, attempt: int, config_path: Path, *, fresh: bool, launch: WorkerLaunch | None
    ) -> tuple[asyncio.subprocess.Process, socket.socket]:
        """This attempt's trainer and our end of its telemetry socket; AgentStartError if not."""
        try:
            self.worker_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log_file:  # noqa: ASYNC230 - one short line
                log_file.write(
                    f"=== gpuwatch: attempt {attempt} starting at "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S')} ===\n".encode()
                )
                self._log_offset = log_file.tell()
        except OSError as exc:  # not writable, disk full: the attempt cannot start
            raise AgentStartError(f"could not write {self.log_path}: {exc}") from None
        self._stepped = False
        if self.command:
            return await self._start_command(attempt, config_path, launch)
        args = ["--run-dir", str(self.worker_dir), "--config", str(config_path)]
        args += ["--attempt", str(attempt)]
        if launch is not None:
            args += ["--worker", str(launch.index)]
        args += self.trainer_args
        if fresh:
            args.append("--fresh")
        env = trainer_env(launch)
        spare, self._spare = self._spare, None
        claimed = await spare.claim(args, env, self.worker_dir) if spare is not None else None
        if claimed is not None:
            log.info("attempt %d: the spare trainer takes it", attempt)
            return claimed
        return await self._start_cold(args, env)

    async def _start_cold(
        self, args: list[str], env: dict[str, str]
    ) -> tuple[asyncio.subprocess.Process, socket.socket]:
        """A new interpreter: ``python -m MODULE *args --telemetry-fd N``."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [sys.executable, "-m", trainer_module(), *args]
        cmd += ["--telemetry-fd", str(child_sock.fileno())]
        return await self._spawn(cmd, env, str(self.worker_dir), parent_sock, child_sock,
                                 "the trainer")

    async def _start_command(
        self, attempt: int, config_path: Path, launch: WorkerLaunch | None = None
    ) -> tuple[asyncio.subprocess.Process, socket.socket]:
        """A person's own command, as this attempt's config says (gpuwatch run); a cluster's
        worker (`--workers N`) with its TF_CONFIG."""
        from gpuwatch.config import ConfigError, load_config

        try:
            config = load_config(config_path).config
        except ConfigError as exc:
            raise AgentStartError(f"could not read the command: {exc}") from None
        command = config.command
        if command is None:
            raise AgentStartError(f"{config_path} holds no command")
        try:
            if not stat.S_ISDIR(os.stat(command.cwd).st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            if not os.access(command.cwd, os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except OSError as exc:
            # Gone since it was typed in, or, a worker on another host, not there (the
            # command starts in that directory on every worker: a filesystem they share),
            # or not this account's to enter.
            raise AgentStartError(
                f"the command's directory {command.cwd} on {socket.gethostname()}: "
                f"{exc.strerror or exc} (every worker starts the command there)") from None
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = command_env(config, attempt, child_sock.fileno(), launch)
        return await self._spawn(list(command.argv), env, command.cwd, parent_sock, child_sock,
                                 f"the command {command.argv[0]!r}")

    async def _spawn(
        self,
        cmd: list[str],
        env: dict[str, str],
        cwd: str,
        parent_sock: socket.socket,
        child_sock: socket.socket,
        what: str,
    ) -> tuple[asyncio.subprocess.Process, socket.socket]:
        """Start cmd in its own process group, its output appended to trainer.log and the
        child end of the socketpair passed to it; AgentStartError (one line) if it cannot."""
        try:
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            parent_sock.close()
            child_sock.close()
            raise AgentStartError(f"could not open {self.log_path}: {exc}") from None
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,  # its own process group: stop signals all of it
                cwd=cwd,
                env=env,
            )
        except OSError as exc:
            parent_sock.close()
            # e.g. "[Errno 2] No such file or directory: 'trian.py'": a command gone since.
            raise AgentStartError(f"could not start {what}: {exc}") from None
        finally:
            os.close(log_fd)
            child_sock.close()
        return proc, parent_sock

    def trainer_stepped(self) -> None:
        """A trainer has run a step: start the spare for the next relaunch (never two)."""
        self._stepped = True
        self._maybe_spawn()

    def want_spare(self, wanted: bool, *, trainer_up: bool) -> None:
        """A spare is wanted now (and started if the trainer is up and has stepped), or not
        (any spare is discarded at once)."""
        self.spare_wanted = wanted
        if not wanted:
            self._discard_spare()
        elif trainer_up and self._stepped:
            self._maybe_spawn()

    def _maybe_spawn(self) -> None:
        if (
            not self.command
            and self._spare is None
            and self._spare_task is None
            and not self._closed
            and self.spare_wanted
            and spare_enabled()
        ):
            self._spare_task = asyncio.get_running_loop().create_task(self._spawn_spare())

    async def _spawn_spare(self) -> None:
        try:
            spare = await SpareTrainer.spawn(
                trainer_module(), self.log_path, self.worker_dir, trainer_env(None)
            )
        finally:
            self._spare_task = None
        if spare is None:
            return
        if self._spare is not None or self._closed or not self.spare_wanted:
            spare.discard()
            return
        self._spare = spare

    def _discard_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            log.info("spare trainer pid %d discarded: not wanted now", spare.proc.pid)
            spare.discard()

    def release_spare(self) -> None:
        """The run is over: no relaunch will claim the spare."""
        self._closed = True
        self._discard_spare()

    def log_lines(self) -> list[str]:
        """This attempt's lines of trainer.log (its last LOG_READ_BYTES at most)."""
        try:
            with open(self.log_path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(self._log_offset, size - LOG_READ_BYTES))
                data = fh.read()
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()


def trainer_env(launch: WorkerLaunch | None = None) -> dict[str, str]:
    """The bundled trainer's environment (gpuwatch/runs/environment.py), launch's own last."""
    return trainer_environment(os.environ, launch.env if launch is not None else None)


def command_env(config: RunConfig, attempt: int, telemetry_fd: int,
                launch: WorkerLaunch | None = None) -> dict[str, str]:
    """A person's own command's environment (gpuwatch run, gpuwatch/runs/environment.py): theirs
    as they typed gpuwatch in, with the hook's directory first on PYTHONPATH, the
    telemetry socket's fd and the hook's settings; a cluster's worker (`--workers N`) gets
    its TF_CONFIG too, in place of any of the person's."""
    return command_environment(os.environ, str(HOOK_DIR), {
        **(dict(launch.env) if launch is not None else {}),
        ENV_FD: str(telemetry_fd),
        ENV_SETTINGS: hook_settings(attempt=attempt, prefetch=config.data.prefetch,
                                    max_steps=config.train.max_steps,
                                    worker=launch.index if launch is not None else 0),
    })
