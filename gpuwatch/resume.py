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
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwatch import runs
from gpuwatch.config import dump_config, load_config, refuse_command_keys
from trainer_runtime.schema import RunConfig

# The last 8 bytes of every TensorFlow checkpoint's .index file (an SSTable's footer magic).
INDEX_MAGIC = bytes.fromhex("57fb808b247547db")
# checkpoints/checkpoint, tf.train.CheckpointManager's index: a text protobuf.
LATEST = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"\s*$', re.M)


class ResumeError(Exception):
    """The run cannot be resumed now; the message says why in one line."""


def settings_path(info: runs.RunInfo) -> Path:
    """The settings the run last ran with: its last attempt's file, else its config.yaml."""
    run_dir = info.run_dir
    numbers = []
    for path in run_dir.glob("attempt-*.yaml"):
        number = path.name[len("attempt-"):-len(".yaml")]
        if number.isdigit() and len(number) < 10 and int(number) <= info.attempt:
            numbers.append(int(number))
    if numbers:
        return run_dir / f"attempt-{max(numbers)}.yaml"
    return run_dir / "config.yaml"


def checkpoint_problem(run_dir: Path) -> str | None:
    """Why the run's checkpoint could not be restored though it has one, or None: it looks
    whole (the index names a checkpoint whose .index, with its footer, and data are
    there), or there is none at all (has_checkpoint). Read without TensorFlow, before
    anything starts: a trainer that cannot read it trains from step 0 (to TensorFlow an
    unreadable index is only a warning)."""
    folder = run_dir / "checkpoints"
    if not os.path.lexists(folder):
        return None
    if not folder.is_dir():
        return f"{folder} is not a folder"
    index = folder / "checkpoint"
    try:
        text = index.read_bytes()[: 1 << 20].decode("utf-8")
    except FileNotFoundError:
        saved = sorted(p.name for p in folder.glob("ckpt-*.index"))
        if saved:  # the files are there, the index that names the latest is not
            return f"its checkpoint index {index} is missing (beside {saved[-1]})"
        return None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not text"
        return f"its checkpoint index {index} cannot be read ({reason})"
    latest = LATEST.search(text)
    if latest is None:
        return f"its checkpoint index {index} names no checkpoint"
    prefix = Path(latest.group(1).replace('\\"', '"').replace("\\\\", "\\"))
    prefix = prefix if prefix.is_absolute() else folder / prefix
    index_file = prefix.with_name(prefix.name + ".index")
    try:
        with open(index_file, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - len(INDEX_MAGIC)))
            footer = fh.read()
    except OSError as exc:
        return f"its checkpoint {index_file} cannot be read ({exc.strerror or exc})"
    if footer != INDEX_MAGIC:
        return f"its checkpoint {index_file} is damaged (no TensorFlow index footer)"
    if not list(prefix.parent.glob(prefix.name + ".data-*")):
        return f"its checkpoint {prefix} has no data file ({prefix.name}.data-*)"
    return None


def resume_run(
    info: runs.RunInfo, overrides: Sequence[str] = (), *, follow: bool = True,
    say: Callable[[str], None] | None = None,
) -> runs.RunInfo:
    """Start the ended run's supervisor again; its info once the socket answers.

    follow: the caller attaches next (the dashboard's `r`, `gpuwatch resume` without
    --detach), so the supervisor waits for it (starting.start_supervisor). say: told
    resume_note's line, if any, before the supervisor starts.

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
    settings = settings_path(current)
    loaded = load_config(settings, overrides)
    if loaded.config.command is not None:
        for override in overrides:
            key = override.partition("=")[0].strip()
            refuse_command_keys([key], f"--set {key}")
    else:
        _check_progress_kept(current, settings, loaded.config)
    note = resume_note(current, loaded.config)
    if note and say is not None:
        say(note)
    check_startable(loaded)  # as `train` checks: the cluster can launch, the batch splits
    path = info.run_dir / "resume.yaml"
    try:
        path.write_text(dump_config(loaded.config))
    except OSError as exc:
        raise ResumeError(f"cannot write {path}: {exc.strerror or exc}") from None
    return start_supervisor(info.run_dir, extra=("--resume", "--config", str(path)),
                            follow=follow)


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run has saved a checkpoint (its index is there)."""
    return os.path.lexists(run_dir / "checkpoints" / "checkpoint")


def resume_note(info: runs.RunInfo, config: RunConfig) -> str | None:
    """What a person should know before the next attempt starts: that it trains from step
    0, the run having no checkpoint to go on from (none enabled, or none saved yet: a crash
    before the first); None when it goes on from where the run got to."""
    if config.command is not None or info.step <= 0:
        return None  # a person's own command runs again from its start, as documented
    if config.checkpoint.enabled and has_checkpoint(info.run_dir):
        return None
    why = ("checkpoint.enabled is false" if not config.checkpoint.enabled
           else f"none saved by step {info.step:,}")
    return (f"run {info.run_id} has no checkpoint to go on from ({why}): attempt "
            f"{info.attempt + 1} trains from step 0")


def _check_progress_kept(info: runs.RunInfo, settings: Path, config: RunConfig) -> None:
    """ResumeError when the next attempt would quietly lose the run's place: a checkpoint
    that is there but cannot be restored (the trainer would train from step 0 instead),
    or a max_steps the run has reached (it would end at once). A new run from the same
    settings is what starts over on purpose."""
    if info.step > 0 and config.checkpoint.enabled:
        problem = checkpoint_problem(info.run_dir)
        if problem:
            raise ResumeError(
                f"run {info.run_id} reached step {info.step:,}, but {problem}: a resume "
                f"would train from step 0; gpuwatch train {settings} starts it over as a "
                "new run"
            )
    limit = config.train.max_steps
    if limit is not None and limit <= info.step:
        raise ResumeError(
            f"train.max_steps {limit:,}: run {info.run_id} is already at step {info.step:,} "
            f"(--max-steps N, over {info.step:,}, trains on to step N)"
        )
