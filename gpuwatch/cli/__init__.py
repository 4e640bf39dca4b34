"""gpuwatch's command line: train, run, scale, resume, attach, ls, stop, logs, export, doctor.

Imports are lazy: `gpuwatch --help` must answer in well under half a second, and
only the dashboard needs Textual. TensorFlow is never imported here.

The parts (each imports only the ones above it in this list, never this package):
  common.py   exit codes and the one-line error
  parser.py   argparse: every command, its options and their help
  watch.py    attach (the dashboard of a run, live or ended) and stop
  listing.py  ls, logs, export, doctor
  start.py    train, run, scale, resume, and what they check before starting
Here: main(), which hands each command to its cmd_* function. Starting a run's
supervisor (and checking that it can start) is gpuwatch/runs/spawn.py, which a resume from
the dashboard uses too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from gpuwatch.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err
from gpuwatch.cli.listing import cmd_doctor, cmd_export, cmd_logs, cmd_ls
from gpuwatch.cli.parser import build_parser
from gpuwatch.cli.start import cmd_resume, cmd_run, cmd_scale, cmd_train
from gpuwatch.cli.watch import cmd_attach, cmd_stop

__all__ = ["main", "parse_words"]


def parse_words(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """The command line's words as the command's arguments (argparse exits on bad usage);
    `run`'s command (after its --) in `argv`."""
    command_argv: list[str] = []
    if words[:1] == ["run"] and "--" in words:
        # gpuwatch run's command is everything after the first --, options and all: argparse
        # never sees it.
        split = words.index("--")
        words, command_argv = words[:split], words[split + 1:]
        args = parser.parse_args(words)
    elif words[:1] == ["run"]:
        # A command typed without its --: its options are not ours; cmd_run says where it goes.
        args, unknown = parser.parse_known_args(words)
        args.words = [*args.words, *unknown]
    else:
        args = parser.parse_args(words)
    args.argv = command_argv
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_words(parser, list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handler = {
        "train": cmd_train,
        "run": cmd_run,
        "scale": cmd_scale,
        "resume": cmd_resume,
        "attach": cmd_attach,
        "ls": cmd_ls,
        "stop": cmd_stop,
        "logs": cmd_logs,
        "export": cmd_export,
        "doctor": cmd_doctor,
    }[args.command]
    from gpuwatch.runs.folders import RunError, home_problem

    if sys.stdout is None and _writes_to_stdout(args):  # `gpuwatch ls >&-`
        err("standard output is closed: nothing to write to")
        return EXIT_FAILED
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the lines nobody reads
    problem = home_problem() if args.command != "doctor" else None
    if problem is None and args.command in STARTS:
        from gpuwatch.supervisor.timings import PROBLEM  # a run's supervisor would refuse it

        problem = PROBLEM
    if problem:
        err(problem)
        return EXIT_USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpuwatch logs RUN | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit-time flush
        return EXIT_OK
    except RunError as exc:  # no such run, or an ambiguous prefix: the person's input
        err(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        err(os_error_line(exc))
        return EXIT_FAILED


# The commands that start a supervisor: each refuses a bad GPUWATCH_* timing before it
# makes anything (spawn.check_startable says it for a resume from the dashboard).
STARTS = ("train", "run", "scale", "resume")


def _writes_to_stdout(args: argparse.Namespace) -> bool:
    """Whether the command's output is its standard output (a listing, a log, a table)."""
    if args.command == "export":
        return getattr(args, "output", None) is None
    if getattr(args, "detach", False):  # train, run, resume --detach: the run's id
        return True
    return args.command in ("ls", "logs", "doctor")


def os_error_line(exc: OSError) -> str:
    """An OSError as one line that names its file where it has one."""
    reason = exc.strerror or str(exc)
    if exc.filename is not None:
        return f"{exc.filename}: {reason}"
    return reason
