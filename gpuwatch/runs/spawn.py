"""Starting a run: whether its settings can start from here (check_startable), and its
supervisor, detached from this terminal, waited for until it answers (start_supervisor).

Used by the command line (train, run, scale, resume) and by a resume from the dashboard
(gpuwatch/runs/resume.py); it imports neither."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

    from gpuwatch.config import LoadedConfig
    from gpuwatch.runs.folders import RunInfo

SUPERVISOR_START_TIMEOUT_S = 30.0


def _supervisor_command(
    run_dir: Path, *, fresh: bool = False, extra: Sequence[str] = ()
) -> list[str]:
    cmd = [sys.executable, "-m", "gpuwatch.supervisor", "--run-dir", str(run_dir), *extra]
    return [*cmd, "--fresh"] if fresh else cmd


def detach_method() -> str:
    """How the supervisor leaves the terminal: 'systemd-run' with a user manager, else 'setsid'.

    setsid alone survives the terminal and SSH hang-ups, but not logind's
    KillUserProcesses=yes at logout; a transient systemd user unit does (with
    `loginctl enable-linger`). GPUWATCH_DETACH=setsid|systemd-run forces one.
    """
    import shutil
    import subprocess

    forced = os.environ.get("GPUWATCH_DETACH")
    if forced in ("setsid", "systemd-run"):
        return forced
    if shutil.which("systemd-run") is None or not os.environ.get("XDG_RUNTIME_DIR"):
        return "setsid"
    try:
        probe = subprocess.run(
            ["systemctl", "--user", "is-system-running"],
            capture_output=True,
            text=True,
            timeout=2,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "setsid"
    return "systemd-run" if probe.stdout.strip() in ("running", "degraded") else "setsid"


def start_supervisor(
    run_dir: Path, *, fresh: bool = False, extra: Sequence[str] = (), follow: bool = False
) -> RunInfo:
    """Start the run's supervisor detached from this terminal; wait until its socket answers.

    extra: more arguments for it (a resume's --resume --config FILE). follow: the caller
    attaches next (a dashboard, headless): the supervisor waits for it, however soon the
    run ends (--await-follower)."""
    import subprocess

    from gpuwatch.runs import folders
    from gpuwatch.runs.environment import supervisor_environment

    # Factories ("mypkg.models:build") import from where the person ran gpuwatch.
    env = supervisor_environment(os.environ, str(run_dir.parent.parent), os.getcwd())
    cmd = _supervisor_command(
        run_dir, fresh=fresh, extra=[*extra, *(["--await-follower"] if follow else [])])
    method = detach_method()
    log_path = run_dir / "supervisor.log"
    with open(log_path, "ab") as log_file:
        if method == "systemd-run":
            # Pass the whole environment (CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH, TF_*,
            # NCCL_*...): a bare NAME makes systemd-run take the value from its own env.
            env_args = [f"--setenv={name}" for name in env if name.isidentifier()]
            unit = f"gpuwatch-{run_dir.name}"
            cmd = [
                "systemd-run",
                "--user",
                "--collect",
                "--quiet",
                f"--unit={unit}",
                *env_args,
                f"--property=StandardOutput=append:{log_path}",
                f"--property=StandardError=append:{log_path}",
                *cmd,
            ]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
            cwd=str(run_dir),
            env=env,
            close_fds=True,
        )
    deadline = time.monotonic() + SUPERVISOR_START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = folders.read_supervisor_info(run_dir)
        pid = info.get("pid")
        # Alive, not a resumed run's old supervisor.json (a killed one leaves its file).
        alive = isinstance(pid, int) and folders.supervisor_alive(pid, run_dir)
        if alive and Path(str(info.get("socket"))).exists():
            _reap_when_done(proc)
            return folders.read_run_info(run_dir)
        if method == "setsid" and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = ""
    try:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        tail = lines[-1] if lines else ""
    except OSError:
        pass
    raise RuntimeError(
        f"the supervisor for run {run_dir.name} did not start"
        + (f": {tail}" if tail else "")
        + f" (see {log_path})"
    )


def _reap_when_done(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the started process in a thread: a caller that lives on (the dashboard,
    which resumes runs with `r`) would otherwise hold each supervisor that exits as a
    zombie until it quits."""
    import threading

    threading.Thread(target=proc.wait, name="gpuwatch-reap", daemon=True).start()

def check_startable(loaded: LoadedConfig) -> None:
    """ConfigError unless a run of these settings can start from here: a cluster that can
    launch (slurm inside an allocation), the GPUs strategy.replicas asks for, and a batch
    that splits over the replicas; for a person's own command (gpuwatch run), only that
    its program is there."""
    from gpuwatch.config import (
        ConfigError,
        check_devices,
        check_replicas,
        expected_replicas,
        visible_gpus,
    )
    from gpuwatch.supervisor.cluster import plan_workers
    from gpuwatch.supervisor.timings import PROBLEM

    if PROBLEM is not None:
        raise ConfigError(PROBLEM)
    command = loaded.config.command
    if command is not None:  # a person's own command: its program must be there, no more
        problem = command_problem(command.argv[0], command.cwd, os.environ.get("PATH"))
        if problem is not None:
            raise ConfigError(problem)
        return
    plan_workers(loaded.config, Path("."), env=os.environ)
    gpus = visible_gpus()
    check_devices(loaded.config, loaded.where("strategy.replicas"), gpus)
    check_replicas(
        loaded.config,
        expected_replicas(loaded.config, gpus),
        source=loaded.where(
            "train.global_batch_size", "train.accumulation_steps", "strategy.replicas",
            "strategy.cpu_replicas",
        ),
    )

def command_problem(program: str, cwd: str, path: str | None) -> str | None:
    """Why the command's program cannot start from cwd, as a shell would look for it (a
    path with a slash, from cwd; a bare name, on PATH), in one line; None if it can."""
    import shutil

    shown = program if len(program) <= 200 else program[:197] + "..."
    if "/" in program:
        target = os.path.join(cwd, program)
        if os.path.isfile(target) and os.access(target, os.X_OK):
            return None
        if os.path.exists(target):
            return f"command not executable: {shown}"
        return f"command not found: {shown}"
    if not program or shutil.which(program, path=path) is None:
        return f"command not found: {shown}"
    return None
