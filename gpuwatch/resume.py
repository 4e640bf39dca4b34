"""Resuming a run that has ended: a supervisor again on its directory, the next attempt.

The run directory is the whole record of an ended run: nothing of it runs. `gpuwatch
resume RUN` (or `r` on the dashboard of an ended run) takes the settings of the run's
last attempt (attempt-N.yaml; config.yaml before any attempt), applies `--set`
overrides as `train` does, writes the result to resume.yaml and starts a supervisor
with ``--resume --config resume.yaml``: the same run id, attempt N + 1, from the last
checkpoint, data position included, recorded in the same events.jsonl. A person's own
command (gpuwatch run) has no checkpoint of ours: it runs again, from the start, as the
next attempt, with the settings its hook applies (changes.COMMAND_KEYS) as `--set`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuwatch import runs
from gpuwatch.config import dump_config, load_config, refuse_command_keys


class ResumeError(Exception):
    """The run cannot be resumed now; the message says why in one line."""


def settings_path(info: runs.RunInfo) -> Path:
    """The settings the run last ran with: its last attempt's file, else its config.yaml."""
    run_dir = info.run_dir
    for attempt in range(info.attempt, 0, -1):
        path = run_dir / f"attempt-{attempt}.yaml"
        if path.exists():
            return path
    return run_dir / "config.yaml"


def resume_run(
    info: runs.RunInfo, overrides: Sequence[str] = (), *, follow: bool = True
) -> runs.RunInfo:
    """Start the ended run's supervisor again; its info once the socket answers.

    follow: the caller attaches next (the dashboard's `r`, `gpuwatch resume` without
    --detach), so the supervisor waits for it (starting.start_supervisor).

    ResumeError: the run is live (or its supervisor still up); ConfigError: the
    settings or an override are wrong; RuntimeError: the supervisor did not start.
    """
    from gpuwatch.starting import check_startable, start_supervisor

    current = runs.read_run_info(info.run_dir)
    if current.supervisor_pid is not None:
        if current.live:
            raise ResumeError(
                f"run {info.run_id} is {current.status}: it needs no resume "
                f"(gpuwatch attach {info.run_id} watches it)"
            )
        # Up after the end for a dashboard: one attached, or the one that started the run
        # on its way (--await-follower). Attaching and `r` works in either case.
        raise ResumeError(
            f"run {info.run_id} has ended ({current.status}) but its supervisor is still up "
            f"for a dashboard (one attached, or the one that started it): gpuwatch attach "
            f"{info.run_id} and press r"
        )
    loaded = load_config(settings_path(current), overrides)
    if loaded.config.command is not None:
        for override in overrides:
            key = override.partition("=")[0].strip()
            refuse_command_keys([key], f"--set {key}")
    check_startable(loaded)  # as `train` checks: the cluster can launch, the batch splits
    path = info.run_dir / "resume.yaml"
    try:
        path.write_text(dump_config(loaded.config))
    except OSError as exc:
        raise ResumeError(f"cannot write {path}: {exc.strerror or exc}") from None
    return start_supervisor(info.run_dir, extra=("--resume", "--config", str(path)),
                            follow=follow)
