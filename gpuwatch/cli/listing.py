"""The commands that read runs' records: ls, logs and export; and doctor, of this machine."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, err

if TYPE_CHECKING:
    from gpuwatch.runs.folders import RunInfo


def _format_age(started: float | None) -> str:
    if not started:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))
    except (OverflowError, OSError, ValueError):  # a record's time no calendar holds
        return "-"


def cmd_ls(args: argparse.Namespace) -> int:
    import json
    import shutil

    from gpuwatch.runs.folders import list_runs
    from gpuwatch.runstate import CURRENT_STEPS, recent_window
    from gpuwatch.runstate.command import printable
    from trainer_runtime.protocol import FAILED_STATUSES

    infos = list_runs()
    if args.json:
        for info in infos:
            print(json.dumps(info.as_json()))
        return EXIT_OK
    if not infos:
        print("no runs yet (gpuwatch train CONFIG, or gpuwatch run -- COMMAND, starts one)")
        return EXIT_OK
    header = (
        f"{'RUN':<10} {'NAME':<12} {'STATUS':<9} {'ATTEMPT':>7} {'STEP':>8} {'EX/S':>9}  STARTED"
    )
    print(header)
    width = max(80, shutil.get_terminal_size((80, 24)).columns)
    for info in infos:
        rate = f"{info.examples_per_s:,.0f}" if info.examples_per_s else "-"
        workers = f"  workers={info.workers}" if info.workers > 1 else ""
        if info.scale is not None:  # a scaling probe: its counts, not its last attempt's rate
            plan = info.scale
            workers += f"  scale {plan.mode} {plan.unit}={','.join(map(str, plan.counts))}"
        line = (
            f"{printable(info.run_id):<10} {printable(info.name[:12]):<12} "
            f"{printable(info.status):<9} {info.attempt:>7} "
            f"{info.step:>8,} {rate:>9}  {_format_age(info.started)}{workers}"
        )
        print(line)
        if info.command is not None:  # gpuwatch run: its command, as much as fits a line
            print(f"{'':<10} $ {shorten_command(info.command, width - 13)}")
        if info.status in FAILED_STATUSES and info.message:
            print(f"{'':<10} {printable(info.message)}")
    if any(info.examples_per_s for info in infos):  # what EX/S is over, as the dashboard's
        print(f"EX/S: the median of the latest attempt's {recent_window(CURRENT_STEPS)} "
              "after warm-up (fewer while it has fewer)")
    return EXIT_OK


def shorten_command(argv: Sequence[str], width: int) -> str:
    """A command as a shell would read it (shlex quoting), in `width` characters at most
    (cut with "…"; at least its program's first characters), on one line."""
    import shlex

    from gpuwatch.runstate.command import printable

    text = printable(" ".join(shlex.quote(arg) for arg in argv))
    width = max(width, 12)
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_logs(args: argparse.Namespace) -> int:
    from gpuwatch.runs.folders import read_run_info, resolve_run, worker_dir
    from gpuwatch.runstate.logtext import LogText

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    if not _has_worker(info, args.worker):
        return EXIT_USAGE
    path = worker_dir(info.run_dir, args.worker) / "trainer.log"
    if not path.exists():
        err(f"run {info.run_id} has no trainer log yet ({path})")
        return EXIT_FAILED
    if not path.is_file():
        err(f"{path} is not a file: run {info.run_id}'s trainer log cannot be read")
        return EXIT_FAILED
    # What the run printed reaches the terminal as text (runstate/logtext.py): colour only
    # on a terminal that wants it, never another control sequence, nothing raw in a pipe.
    text = LogText(colour=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 16)
            if chunk:
                sys.stdout.buffer.write(text.feed(chunk).encode())
                continue
            if not args.follow or not read_run_info(info.run_dir).live:
                sys.stdout.buffer.write(text.close().encode())
                sys.stdout.flush()
                return EXIT_OK
            sys.stdout.flush()
            time.sleep(0.5)


def _has_worker(info: RunInfo, worker: int) -> bool:
    """Whether the run has this worker; if not, say so in one line."""
    if 0 <= worker < info.workers:
        return True
    workers = "one worker (0)" if info.workers == 1 else f"workers 0 to {info.workers - 1}"
    err(f"run {info.run_id} has no worker {worker}: it has {workers}")
    return False


def cmd_export(args: argparse.Namespace) -> int:
    from gpuwatch.runs.export import FORMATS, WHATS, export_events
    from gpuwatch.runs.folders import resolve_run

    for option, value, allowed in (("--what", args.what, WHATS),
                                   ("--format", args.format, FORMATS)):
        if value not in allowed:
            err(f"{option} must be one of {', '.join(allowed)} (got {value!r})")
            return EXIT_USAGE
    if args.worker is not None and args.what in ("attempts", "scaling"):
        err(f"--worker picks rows of steps or samples; {args.what} are the run's "
             "(drop --worker)")
        return EXIT_USAGE
    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    if args.worker is not None and not _has_worker(info, args.worker):
        return EXIT_USAGE
    events_path = info.run_dir / "events.jsonl"
    if args.output is not None:
        clash = _in_run_folder(Path(args.output), info)
        if clash:
            err(f"-o {args.output} {clash}: choose a file outside it")
            return EXIT_USAGE
    if args.output is None:
        report = export_events(events_path, args.what, args.format, sys.stdout,
                               worker=args.worker)
    else:
        try:
            out = open(args.output, "w", encoding="utf-8", newline="")  # noqa: SIM115
        except OSError as exc:
            err(f"cannot write {args.output}: {exc.strerror or exc}")
            return EXIT_USAGE
        try:
            with out:
                report = export_events(events_path, args.what, args.format, out,
                                       worker=args.worker)
        except OSError as exc:
            if exc.filename is not None:  # reading the record: main() names its file
                raise
            err(f"cannot write {args.output}: {exc.strerror or exc}")
            return EXIT_FAILED
    skipped = report.bad_summary(events_path)
    if skipped:
        err(skipped)
    if args.what == "samples" and args.worker is not None and report.rows == 0:
        err(_no_samples_note(info, args.worker, events_path))
    if args.output is not None:
        print(f"gpuwatch: {report.rows} {args.what} rows of run {info.run_id} -> {args.output}",
              file=sys.stderr)
    return EXIT_OK


def _in_run_folder(output: Path, info: RunInfo) -> str | None:
    """How -o output would write into a run's record, or None: a path inside the runs'
    folder (this run's or another's, through links too), or an existing file that is one
    of a run's files under another name (a hard link)."""
    from gpuwatch.runs.folders import runs_root

    root = runs_root(info.run_dir.parent.parent)
    try:
        where = output.resolve()
        run_dir = info.run_dir.resolve()
        runs = root.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a path too long
        return f"cannot be followed ({getattr(exc, 'strerror', None) or exc})"
    if where == run_dir or run_dir in where.parents:
        return f"is inside run {info.run_id}'s folder ({run_dir})"
    if where == runs or runs in where.parents:
        return f"is inside the runs' folder ({runs}), another run's record"
    try:
        target = os.stat(output)
    except OSError:
        return None  # not there yet: a new file is no file of a run's
    if not stat.S_ISREG(target.st_mode) or target.st_nlink < 2:
        return None  # one name only (or /dev/null, a pipe): no run's file by another name
    for folder, _dirs, files in os.walk(runs):
        for name in files:
            with contextlib.suppress(OSError):
                mine = os.stat(os.path.join(folder, name))
                if (mine.st_dev, mine.st_ino) == (target.st_dev, target.st_ino):
                    rel = os.path.relpath(os.path.join(folder, name), runs)
                    return f"is the run file {rel} under another name (a hard link)"
    return None


def _no_samples_note(info: RunInfo, worker: int, events_path: Path) -> str:
    """Why a worker has no sample rows: one sampler per host, and which workers have one."""
    import json

    samplers: set[int] = set()
    with contextlib.suppress(OSError), open(events_path, "rb") as fh:
        for line in fh:
            if b'"type":"sample"' in line:
                with contextlib.suppress(ValueError, AttributeError):
                    samplers.add(int(json.loads(line).get("worker", 0)))
    if not samplers:
        return f"run {info.run_id} has no device samples yet"
    others = ", ".join(str(w) for w in sorted(samplers))
    return (
        f"no samples of worker {worker}: each host is sampled once, by one of its workers, "
        f"and only worker(s) {others} sent samples (a worker sharing a host with one of them "
        f"is covered by its samples: --worker {min(samplers)})"
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from gpuwatch.cli.doctor import main as doctor_main

    return doctor_main([])
