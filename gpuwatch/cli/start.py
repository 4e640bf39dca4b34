"""The commands that start a run: train, run, scale and resume, and what they check first."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err
from gpuwatch.cli.watch import _dashboard
from gpuwatch.runs.spawn import check_startable, command_problem, start_supervisor

if TYPE_CHECKING:
    from gpuwatch.runs.folders import RunInfo


def _overrides_of(args: argparse.Namespace) -> list[str] | None:
    """The --set overrides, and --max-steps as one; None (said) for a --max-steps below 1."""
    overrides = list(args.overrides)
    if args.max_steps is not None:
        from trainer_runtime.schema import MAX_STEPS

        if not 1 <= args.max_steps <= MAX_STEPS:
            err(f"--max-steps must be from 1 to {MAX_STEPS:,} (got {args.max_steps})")
            return None
        overrides.append(f"train.max_steps={args.max_steps}")
    return overrides




def cmd_train(args: argparse.Namespace) -> int:
    import importlib.util

    from gpuwatch.config import (
        ConfigError,
        dump_config,
        load_config,
    )
    from gpuwatch.runs import folders

    overrides = _overrides_of(args)
    if overrides is None:
        return EXIT_USAGE
    try:
        loaded = load_config(args.config, overrides)
        check_startable(loaded)
    except ConfigError as exc:
        err(str(exc))
        return EXIT_USAGE
    if importlib.util.find_spec("tensorflow") is None:
        err(
            "TensorFlow is not installed in this Python: pip install -e '.[cpu]' "
            "(or '.[gpu]' on a machine with NVIDIA GPUs)"
        )
        return EXIT_USAGE

    home = folders.gpuwatch_home()
    _run_id, run_dir = folders.create_run_dir(home)
    (run_dir / "config.yaml").write_text(dump_config(loaded.config))
    (run_dir / "source.yaml").write_text(loaded.text)
    try:
        info = start_supervisor(run_dir, fresh=args.fresh, follow=not args.detach)
    except RuntimeError as exc:
        err(str(exc))
        return EXIT_FAILED
    return _follow(info, args)


RUN_USAGE = "gpuwatch run [options] -- COMMAND [ARGS ...]"


def cmd_run(args: argparse.Namespace) -> int:
    """gpuwatch run -- COMMAND: a person's own command under a supervisor, as train starts the
    bundled runtime (its config.yaml holds the command; the supervisor's launcher starts it)."""
    from gpuwatch.config import ConfigError, command_config, dump_config
    from gpuwatch.runs import folders

    if args.words:
        err(f"run: put the command after --: {RUN_USAGE}")
        return EXIT_USAGE
    if not args.argv:
        err(f"run: no command given: {RUN_USAGE}")
        return EXIT_USAGE
    overrides = _overrides_of(args)
    if overrides is None:
        return EXIT_USAGE
    cwd = os.getcwd()
    name = args.name if args.name is not None else command_name(args.argv)
    try:
        config = command_config(args.argv, cwd, overrides, name=name, workers=args.workers)
    except ConfigError as exc:
        err(str(exc))
        return EXIT_USAGE
    problem = command_problem(args.argv[0], cwd, os.environ.get("PATH"))
    if problem is not None:
        err(problem)
        return EXIT_USAGE
    _run_id, run_dir = folders.create_run_dir(folders.gpuwatch_home())
    (run_dir / "config.yaml").write_text(dump_config(config))
    try:
        info = start_supervisor(run_dir, follow=not args.detach)
    except RuntimeError as exc:
        err(str(exc))
        return EXIT_FAILED
    return _follow(info, args)


def command_name(argv: Sequence[str]) -> str:
    """A run's name from its command: the script of `python train.py` ("train.py"), the
    module of `python -m pkg.train`, else the program's name; at most 100 characters of one
    printable line (schema.MAX_NAME_CHARS)."""
    program = Path(argv[0]).name or argv[0]
    name = program
    if program.startswith("python") and len(argv) > 1:
        rest = list(argv[1:])
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest.pop(0)  # -u, -O, -X...: the interpreter's own options
        if rest[:1] == ["-m"] and len(rest) > 1:
            name = rest[1]
        elif rest and not rest[0].startswith("-"):
            name = Path(rest[0]).name or rest[0]
    from gpuwatch.runstate.command import printable

    name = printable(name)[:100]
    return name or "command"




def cmd_scale(args: argparse.Namespace) -> int:
    """gpuwatch scale: the probe's plan checked here (every count's settings), then a run
    whose supervisor runs one fresh attempt per count (supervisor/scale_attempts.py)."""
    import importlib.util

    from gpuwatch.config import ConfigError, dump_config, load_config, visible_gpus
    from gpuwatch.measures import scaling
    from gpuwatch.runs import folders
    from gpuwatch.supervisor.cluster import plan_workers
    from gpuwatch.supervisor.scale_attempts import PLAN_FILE, write_plan

    try:
        loaded = load_config(args.config, args.overrides)
        config = loaded.config
        if config.command is not None:
            raise ConfigError(f"{args.config}: command: gpuwatch scale runs the bundled "
                              "runtime at each device count; a command's devices are its own")
        plan_workers(config, Path("."), env=os.environ)  # a cluster that can launch from here
        gpus = visible_gpus()
        counts = (scaling.parse_counts(args.replicas) if args.replicas is not None
                  else scaling.default_counts(config, gpus))
        steps = scaling.DEFAULT_STEPS if args.steps is None else args.steps
        rounds = scaling.MAX_ROUNDS if args.rounds is None else args.rounds
        plan = scaling.make_plan(config, counts, args.mode, steps, gpus, rounds=rounds)
        scaling.plan_configs(config, plan, gpus)
    except ConfigError as exc:
        err(str(exc))
        return EXIT_USAGE
    if importlib.util.find_spec("tensorflow") is None:
        err("TensorFlow is not installed in this Python: pip install -e '.[cpu]'")
        return EXIT_USAGE
    _run_id, run_dir = folders.create_run_dir(folders.gpuwatch_home())
    (run_dir / "config.yaml").write_text(dump_config(config))
    (run_dir / "source.yaml").write_text(loaded.text)
    write_plan(run_dir / PLAN_FILE, plan)
    try:
        info = start_supervisor(run_dir, fresh=True, extra=("--scale", str(run_dir / PLAN_FILE)),
                                follow=not args.detach)
    except RuntimeError as exc:
        err(str(exc))
        return EXIT_FAILED
    if args.headless:
        from gpuwatch.cli.headless import run_headless, scale_ended

        return run_headless(info, ended=scale_ended)
    return _follow(info, args)


def _follow(info: RunInfo, args: argparse.Namespace, after_attempt: int = 0) -> int:
    """After a start or a resume: print the id (--detach), follow headless, or watch."""
    if args.detach:
        print(info.run_id)
        return EXIT_OK
    if args.headless:
        from gpuwatch.cli.headless import run_headless

        return run_headless(info, after_attempt=after_attempt)
    return _dashboard(info)


def cmd_resume(args: argparse.Namespace) -> int:
    from gpuwatch.config import ConfigError
    from gpuwatch.runs.folders import resolve_run
    from gpuwatch.runs.resume import ResumeError, resume_run

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    overrides = _overrides_of(args)
    if overrides is None:
        return EXIT_USAGE
    try:
        resumed = resume_run(info, overrides, follow=not args.detach, say=err)
    except (ConfigError, ResumeError) as exc:
        err(str(exc))
        return EXIT_USAGE
    except RuntimeError as exc:  # the supervisor did not start
        err(str(exc))
        return EXIT_FAILED
    if not args.detach:
        print(f"gpuwatch: resuming run {info.run_id} as attempt {info.attempt + 1}",
              file=sys.stderr)
    return _follow(resumed, args, after_attempt=info.attempt)
