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

import os
import re
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwatch.config import dump_config, load_config, refuse_command_keys
from gpuwatch.runs import folders
from trainer_runtime.schema import RunConfig

# The last 8 bytes of every TensorFlow checkpoint's .index file (an SSTable's footer magic).
INDEX_MAGIC = bytes.fromhex("57fb808b247547db")
# checkpoints/checkpoint, tf.train.CheckpointManager's index: a text protobuf.
LATEST = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"\s*$', re.M)
# The trainer saves checkpoint number = the optimizer step (trainer_runtime/loop.py).
CKPT_STEP = re.compile(r"ckpt-([0-9]{1,15})", re.ASCII)
ATTEMPT_FILE = re.compile(r"attempt-([1-9][0-9]{0,8})\.yaml", re.ASCII)


class ResumeError(Exception):
    """The run cannot be resumed now; the message says why in one line."""


def settings_path(info: folders.RunInfo) -> Path:
    """The settings the run last ran with: its last attempt's file, else its config.yaml."""
    found: dict[int, Path] = {}
    for path in info.run_dir.glob("attempt-*.yaml"):
        number = ATTEMPT_FILE.fullmatch(path.name)
        if number and int(number.group(1)) <= info.attempt and _regular(path):
            found[int(number.group(1))] = path
    return found[max(found)] if found else info.run_dir / "config.yaml"


def _regular(path: Path) -> bool:
    """Whether path is a regular file (never a FIFO or a device, which a read would wait on)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def latest_checkpoint(run_dir: Path) -> tuple[Path | None, str | None]:
    """The run's latest checkpoint (its path prefix) if it looks whole (the index names a
    checkpoint whose .index, with its footer, and data are there), or why it could not be
    restored though the run has one; (None, None) when there is none at all. Read without
    TensorFlow, before anything starts: a trainer given an unreadable index trains from
    step 0 (to TensorFlow that is only a warning), one given a checkpoint with a file
    missing or damaged stops with an error."""
    folder = run_dir / "checkpoints"
    if not os.path.lexists(folder):
        return None, None
    if not folder.is_dir():
        return None, f"{folder} is not a folder"
    index = folder / "checkpoint"
    try:
        if os.path.lexists(index) and not _regular(index):
            return None, f"its checkpoint index {index} is not a regular file"
        with open(index, "rb") as fh:
            text = fh.read(1 << 20).decode("utf-8")
    except FileNotFoundError:
        saved = sorted(p.name for p in folder.glob("ckpt-*.index"))
        if saved:  # the files are there, the index that names the latest is not
            return None, f"its checkpoint index {index} is missing (beside {saved[-1]})"
        return None, None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        return None, f"its checkpoint index {index} cannot be read ({reason})"
    latest = LATEST.search(text)
    if latest is None:
        return None, f"its checkpoint index {index} names no checkpoint"
    prefix = Path(latest.group(1).replace('\\"', '"').replace("\\\\", "\\"))
    prefix = prefix if prefix.is_absolute() else folder / prefix
    index_file = prefix.with_name(prefix.name + ".index")
    if os.path.lexists(index_file) and not _regular(index_file):
        return None, f"its checkpoint {index_file} is not a regular file"
    try:
        with open(index_file, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - len(INDEX_MAGIC)))
            footer = fh.read()
    except OSError as exc:
        return None, f"its checkpoint {index_file} cannot be read ({exc.strerror or exc})"
    if footer != INDEX_MAGIC:
        return None, f"its checkpoint {index_file} is damaged (no TensorFlow index footer)"
    if not list(prefix.parent.glob(prefix.name + ".data-*")):
        return None, f"its checkpoint {prefix} has no data file ({prefix.name}.data-*)"
    return prefix, None


def checkpoint_problem(run_dir: Path) -> str | None:
    """Why the run's checkpoint could not be restored though it has one; None if it looks
    whole or there is none (latest_checkpoint)."""
    return latest_checkpoint(run_dir)[1]


def resume_run(
    info: folders.RunInfo, overrides: Sequence[str] = (), *, follow: bool = True,
    say: Callable[[str], None] | None = None,
) -> folders.RunInfo:
    """Start the ended run's supervisor again; its info once the socket answers.

    follow: the caller attaches next (the dashboard's `r`, `gpuwatch resume` without
    --detach), so the supervisor waits for it (spawn.start_supervisor). say: told
    resume_note's line, if any, before the supervisor starts.

    ResumeError: the run is live (or its supervisor still up); ConfigError: the
    settings or an override are wrong; RuntimeError: the supervisor did not start.
    """
    from gpuwatch.runs.spawn import check_startable, start_supervisor

    current = _once_its_supervisor_is_gone(info, say)
    settings = settings_path(current)
    loaded = load_config(settings, overrides)
    if loaded.config.command is not None:
        for override in overrides:
            key = override.partition("=")[0].strip()
            refuse_command_keys([key], f"--set {key}")
    problem = progress_problem(current, loaded.config, settings)
    if problem:
        raise ResumeError(problem)
    check_startable(loaded)  # as `train` checks: the cluster can launch, the batch splits
    note = resume_note(current, loaded.config)
    if note and say is not None:
        say(note)
    path = info.run_dir / "resume.yaml"
    try:
        path.write_text(dump_config(loaded.config))
    except OSError as exc:
        raise ResumeError(f"cannot write {path}: {exc.strerror or exc}") from None
    return start_supervisor(info.run_dir, extra=("--resume", "--config", str(path)),
                            follow=follow)


# An ended run's supervisor with nobody holding it goes within its linger (LINGER_S, 1 s,
# after the last follower left: a chained `gpuwatch resume --headless` has just been one)
# and its shutdown (the hub's flush, up to 2 s; the samplers' join, up to 3 s). A resume
# that meets it waits this long for it to go.
ENDING_WAIT_S = float(os.environ.get("GPUWATCH_ENDING_WAIT_S", "20"))
ENDING_POLL_S = 0.1
# How often, while waiting, the supervisor is asked what keeps it up.
ENDING_ASK_S = 1.0


def _once_its_supervisor_is_gone(
    info: folders.RunInfo, say: Callable[[str], None] | None = None
) -> folders.RunInfo:
    """The run's record once no supervisor is up on it. One still up after the end with
    nothing keeping it (it is on its way out) is waited for, up to ENDING_WAIT_S; one that
    a dashboard or the follower it was started for keeps up is a ResumeError naming it,
    as is a run that is live."""
    import time

    began = time.monotonic()
    deadline = began + ENDING_WAIT_S
    asked_at = 0.0
    said = False
    while True:
        current = folders.read_run_info(info.run_dir)
        if current.supervisor_pid is None:
            return current
        if current.live:
            raise ResumeError(
                f"run {info.run_id} is {current.status}: it needs no resume "
                f"(gpuwatch attach {info.run_id} watches it)"
            )
        now = time.monotonic()
        if now - asked_at >= ENDING_ASK_S:
            asked_at = now
            held = _what_holds(current)
            if held.get("dashboards"):
                raise ResumeError(
                    f"run {info.run_id} has ended ({current.status}) and a dashboard "
                    f"attached to it keeps its supervisor up: press r there, or quit it "
                    f"and resume again"
                )
            if held.get("awaiting_follower"):
                raise ResumeError(
                    f"run {info.run_id} has ended ({current.status}); its supervisor waits "
                    f"for the dashboard of the command that started it: gpuwatch attach "
                    f"{info.run_id} and press r"
                )
            if now >= deadline:
                followers = held.get("followers") or 0
                whom = (f"{followers} follower{'s' if followers != 1 else ''} attached"
                        if followers else "nothing attached")
                raise ResumeError(
                    f"run {info.run_id} has ended ({current.status}) but its supervisor "
                    f"(pid {current.supervisor_pid}) is still up {ENDING_WAIT_S:g} s later, "
                    f"{whom}: gpuwatch stop {info.run_id} ends it"
                )
        if not said and say is not None and now - began >= 1.0:
            say(f"waiting for run {info.run_id}'s supervisor to exit (the run ended)")
            said = True
        time.sleep(ENDING_POLL_S)


def _what_holds(info: folders.RunInfo) -> dict[str, object]:
    """The supervisor's own word on what keeps it up (its status reply: dashboards,
    followers, awaiting_follower); {} if it does not answer (it is exiting)."""
    import asyncio

    from gpuwatch.follow.client import ClientError, RunClient

    socket_path = info.socket_path
    if socket_path is None:
        return {}

    async def ask() -> dict[str, object]:
        async with RunClient(socket_path) as client:
            return await client.command("status", timeout_s=2.0)

    try:
        return asyncio.run(asyncio.wait_for(ask(), 3.0))
    except (ClientError, OSError, TimeoutError):
        return {}


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run has saved a checkpoint here (its index, or a checkpoint's files)."""
    folder = run_dir / "checkpoints"
    return os.path.lexists(folder / "checkpoint") or (
        folder.is_dir() and any(folder.glob("ckpt-*.index")))


def chief_checkpoints_here(config: RunConfig) -> bool:
    """Whether the chief's checkpoints are in this run folder: not when the chief runs on
    another host (a cluster's worker 0 over ssh, or in a Slurm allocation), where they are
    under that host's GPUWATCH_HOME and cannot be read from here."""
    cluster = config.cluster
    if cluster is None or cluster.launcher == "local":
        return True
    if cluster.launcher == "slurm":
        return False
    return bool(cluster.workers) and cluster.workers[0].is_local


def start_step(run_dir: Path, config: RunConfig) -> int:
    """The step the next attempt starts from: its whole checkpoint's, else 0."""
    prefix = latest_checkpoint(run_dir)[0] if config.checkpoint.enabled else None
    return _step_of(prefix)


def _step_of(prefix: Path | None) -> int:
    number = CKPT_STEP.fullmatch(prefix.name) if prefix is not None else None
    return int(number.group(1)) if number else 0


def progress_problem(info: folders.RunInfo, config: RunConfig, settings: Path) -> str | None:
    """Why the next attempt of an ended run would quietly lose its place (one line), or
    None: a checkpoint that is there but cannot be restored (the trainer would train from
    step 0, or stop), or a max_steps at or under the step it would start from (it would
    end at once). `gpuwatch resume` and a relaunch after the end both ask. A person's own
    command runs again from its start (nothing to check); a chief on another host keeps
    its checkpoints there (not checked from here)."""
    if config.command is not None or not chief_checkpoints_here(config):
        return None
    again = f"gpuwatch train {settings} starts it over as a new run"
    # One read of the checkpoint: whether it can be restored, and the step it holds.
    prefix, problem = (latest_checkpoint(info.run_dir) if config.checkpoint.enabled
                       else (None, None))
    if problem:  # (none at all is no problem: the note says it)
        return (f"run {info.run_id} reached step {info.step:,}, but {problem}: going "
                f"on cannot restore it; {again}")
    limit = config.train.max_steps
    start = _step_of(prefix)
    if limit is not None and limit <= start:
        return (f"train.max_steps {limit:,}: run {info.run_id} would go on from step "
                f"{start:,}, already there (--max-steps N, over {start:,}, trains on to step "
                "N)")
    return None


def resume_note(info: folders.RunInfo, config: RunConfig) -> str | None:
    """What a person should know before the next attempt starts: that it trains from step
    0, the run having no checkpoint to go on from (none enabled, or none saved yet: a crash
    before the first); None when it goes on from where the run got to, or that cannot be
    told from here (a chief on another host)."""
    if config.command is not None or info.step <= 0 or not chief_checkpoints_here(config):
        return None  # a person's own command runs again from its start, as documented
    if config.checkpoint.enabled and has_checkpoint(info.run_dir):
        return None
    why = ("checkpoint.enabled is false" if not config.checkpoint.enabled
           else f"none saved by step {info.step:,}")
    return (f"run {info.run_id} has no checkpoint to go on from ({why}): attempt "
            f"{info.attempt + 1} trains from step 0")
