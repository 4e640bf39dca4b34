"""gpuwatch's command line: train, run, scale, resume, attach, ls, stop, logs, export, doctor.

Imports are lazy: `gpuwatch --help` must answer in well under half a second, and
only the dashboard needs Textual. TensorFlow is never imported here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

    from gpuwatch.config import LoadedConfig
    from gpuwatch.runs import RunInfo

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
SUPERVISOR_START_TIMEOUT_S = 30.0


def _err(message: str) -> None:
    print(f"gpuwatch: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="Run TensorFlow MirroredStrategy training and watch it live in the terminal.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="start a training run and watch it")
    train.add_argument("config", help="the run's YAML config, e.g. demo/demo.yaml")
    _add_run_options(train, "override a config key, e.g. --set data.prefetch=on (repeatable)",
                     "start the run, print its id and return", "stop after N optimizer steps")
    train.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")

    run = sub.add_parser(
        "run",
        help="start your own command under gpuwatch and watch it: gpuwatch run -- python "
        "train.py",
        usage="gpuwatch run [-h] [--name N] [--set KEY=VALUE] [--headless | --detach] "
        "[--max-steps N] -- COMMAND [ARGS ...]",
        description="Start COMMAND (everything after --) as gpuwatch train starts its "
        "runtime: under a detached supervisor, listed by ls, with attach, stop, logs, export "
        "and TensorBoard scalars, its processes and GPUs sampled, and a crash's cause. A "
        "Python command gets gpuwatch's hook first on its PYTHONPATH: it watches Keras fit "
        "and strategy.run loops once TensorFlow is imported and sends their steps; any other "
        "command is watched from outside (device sampling only), and the screen says so. "
        "It runs in this directory, with this environment; r on the dashboard (or gpuwatch "
        "resume) runs it again as the next attempt.",
    )
    run.add_argument("--name", default=None, metavar="N",
                     help="the run's name (default: the script's or the program's)")
    _add_run_options(run, "a setting the hook applies: data.prefetch=off|on|autotune|N, "
                     "train.max_steps=N, name=N (repeatable); a script's other settings are "
                     "its own", "start the command, print the run id and return",
                     "end the command's training loop after N optimizer steps (the hook's)")
    # Anything before the -- that is not an option: a command typed without its --.
    run.add_argument("words", nargs="*", help=argparse.SUPPRESS)

    scale = sub.add_parser(
        "scale",
        help="how the job scales: a short attempt at each device count, as a table",
        description="Run the same job for a few steps at each device count (replicas on "
        "one host: the first N GPUs, or N logical CPU replicas with no GPU; workers for a "
        "cluster: config), one after another, each in a fresh trainer, and show examples/s, "
        "speed-up, efficiency and where each step's time went, measured after warm-up.",
    )
    scale.add_argument("config", help="the run's YAML config, e.g. demo/demo.yaml")
    scale.add_argument(
        "--replicas", default=None, metavar="1,2,4",
        help="the device counts (workers for a cluster), smallest first; default 1,2, or "
        "1 to every GPU (worker) in powers of two",
    )
    scale.add_argument(
        "--steps", type=int, default=None, metavar="N",
        help="optimizer steps per count, the 5 warm-up steps included (default 40)",
    )
    scale.add_argument(
        "--mode", default="weak", metavar="weak|strong",
        help="weak: keep the per-replica batch (default); strong: keep the global batch",
    )
    scale.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key for every count, e.g. --set data.prefetch=on",
    )
    scale_mode = scale.add_mutually_exclusive_group()
    scale_mode.add_argument(
        "--headless", action="store_true", help="no dashboard: progress lines, then the table"
    )
    scale_mode.add_argument("--detach", action="store_true",
                            help="start the probe, print its run id and return")

    resume = sub.add_parser(
        "resume",
        help="go on with a run that has ended: its next attempt, from its last checkpoint",
        description="Start a run that has ended (finished, stopped, crashed, lost) again: "
        "the same run id, its next attempt, from its last checkpoint (data position "
        "included), with the settings of its last attempt and any --set on top.",
    )
    resume.add_argument("run", help="run id or a unique prefix of it")
    _add_run_options(resume, "change a setting for the resumed attempt, e.g. --set "
                     "data.prefetch=on", "resume the run, print its id and return",
                     "stop once the run's step reaches N (counted from the run's start)")

    attach = sub.add_parser(
        "attach",
        help="watch a run again (the most recent live one by default); a run that has "
        "ended is shown from its record, and r there resumes it",
    )
    attach.add_argument("run", nargs="?", help="run id or a unique prefix of it")

    ls = sub.add_parser("ls", help="list runs")
    ls.add_argument("--json", action="store_true", help="one JSON object per run")

    stop = sub.add_parser("stop", help="stop a run (the trainer checkpoints first)")
    stop.add_argument("run", help="run id or a unique prefix of it")

    logs = sub.add_parser("logs", help="print a run's trainer log")
    logs.add_argument("run", help="run id or a unique prefix of it")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing as it grows")
    logs.add_argument(
        "--worker",
        type=int,
        default=0,
        metavar="I",
        help="a cluster run's worker I (0, the chief, by default)",
    )

    export = sub.add_parser(
        "export",
        help="write a run's steps, device samples or attempts as a table (CSV or JSON lines)",
    )
    export.add_argument("run", help="run id or a unique prefix of it")
    export.add_argument(
        "--what",
        default="steps",
        metavar="steps|samples|attempts|scaling",
        help="one row per step event (default), per GPU per device sample, per attempt, or "
        "per device count of a scaling probe (gpuwatch scale)",
    )
    export.add_argument(
        "--format", default="csv", metavar="csv|jsonl", help="CSV with a header (default) "
        "or one JSON object per line"
    )
    export.add_argument(
        "-o", "--output", default=None, metavar="FILE", help="write here (default: stdout)"
    )
    export.add_argument(
        "--worker",
        type=int,
        default=None,
        metavar="I",
        help="only a cluster run's worker I (default: every worker; steps and samples)",
    )

    sub.add_parser("doctor", help="check Python, TensorFlow, NVML and the GPUs")
    return parser


def _add_run_options(
    parser: argparse.ArgumentParser, set_help: str, detach_help: str, max_steps_help: str
) -> None:
    """--set, --headless | --detach and --max-steps: the options of train, run and resume."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help=set_help,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--headless", action="store_true", help="no dashboard: progress lines, then a summary"
    )
    mode.add_argument("--detach", action="store_true", help=detach_help)
    parser.add_argument("--max-steps", type=int, default=None, help=max_steps_help)


def _overrides_of(args: argparse.Namespace) -> list[str] | None:
    """The --set overrides, and --max-steps as one; None (said) for a --max-steps below 1."""
    overrides = list(args.overrides)
    if args.max_steps is not None:
        if args.max_steps < 1:
            _err(f"--max-steps must be at least 1 (got {args.max_steps})")
            return None
        overrides.append(f"train.max_steps={args.max_steps}")
    return overrides


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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
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
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    args.argv = command_argv
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
    from gpuwatch.runs import RunError

    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpuwatch logs RUN | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit-time flush
        return EXIT_OK
    except RunError as exc:  # no such run, or an ambiguous prefix: the person's input
        _err(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        _err(str(exc))
        return EXIT_FAILED


# -- train ------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    import importlib.util

    from gpuwatch import runs
    from gpuwatch.config import (
        ConfigError,
        dump_config,
        load_config,
    )

    overrides = _overrides_of(args)
    if overrides is None:
        return EXIT_USAGE
    try:
        loaded = load_config(args.config, overrides)
        check_startable(loaded)
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    if importlib.util.find_spec("tensorflow") is None:
        _err(
            "TensorFlow is not installed in this Python: pip install -e '.[cpu]' "
            "(or '.[gpu]' on a machine with NVIDIA GPUs)"
        )
        return EXIT_USAGE

    home = runs.gpuwatch_home()
    _run_id, run_dir = runs.create_run_dir(home)
    (run_dir / "config.yaml").write_text(dump_config(loaded.config))
    (run_dir / "source.yaml").write_text(loaded.text)
    try:
        info = start_supervisor(run_dir, fresh=args.fresh)
    except RuntimeError as exc:
        _err(str(exc))
        return EXIT_FAILED
    return _follow(info, args)


RUN_USAGE = "gpuwatch run [options] -- COMMAND [ARGS ...]"


def cmd_run(args: argparse.Namespace) -> int:
    """gpuwatch run -- COMMAND: a person's own command under a supervisor, as train starts the
    bundled runtime (its config.yaml holds the command; the supervisor's launcher starts it)."""
    from gpuwatch import runs
    from gpuwatch.config import ConfigError, command_config, dump_config

    if args.words:
        _err(f"run: put the command after --: {RUN_USAGE}")
        return EXIT_USAGE
    if not args.argv:
        _err(f"run: no command given: {RUN_USAGE}")
        return EXIT_USAGE
    overrides = _overrides_of(args)
    if overrides is None:
        return EXIT_USAGE
    cwd = os.getcwd()
    name = args.name if args.name is not None else command_name(args.argv)
    try:
        config = command_config(args.argv, cwd, overrides, name=name)
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    problem = command_problem(args.argv[0], cwd, os.environ.get("PATH"))
    if problem is not None:
        _err(problem)
        return EXIT_USAGE
    _run_id, run_dir = runs.create_run_dir(runs.gpuwatch_home())
    (run_dir / "config.yaml").write_text(dump_config(config))
    try:
        info = start_supervisor(run_dir)
    except RuntimeError as exc:
        _err(str(exc))
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
    name = "".join(char if char.isprintable() else "?" for char in name)[:100]
    return name or "command"


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


def cmd_scale(args: argparse.Namespace) -> int:
    """gpuwatch scale: the probe's plan checked here (every count's settings), then a run
    whose supervisor runs one fresh attempt per count (supervisor/scale.py)."""
    import importlib.util

    from gpuwatch import runs, scaling
    from gpuwatch.config import ConfigError, dump_config, load_config, visible_gpus
    from gpuwatch.supervisor.cluster import plan_workers
    from gpuwatch.supervisor.scale import PLAN_FILE, write_plan

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
        plan = scaling.make_plan(config, counts, args.mode, steps, gpus)
        scaling.plan_configs(config, plan, gpus)
    except ConfigError as exc:
        _err(str(exc))
        return EXIT_USAGE
    if importlib.util.find_spec("tensorflow") is None:
        _err("TensorFlow is not installed in this Python: pip install -e '.[cpu]'")
        return EXIT_USAGE
    _run_id, run_dir = runs.create_run_dir(runs.gpuwatch_home())
    (run_dir / "config.yaml").write_text(dump_config(config))
    (run_dir / "source.yaml").write_text(loaded.text)
    write_plan(run_dir / PLAN_FILE, plan)
    try:
        info = start_supervisor(run_dir, fresh=True, extra=("--scale", str(run_dir / PLAN_FILE)))
    except RuntimeError as exc:
        _err(str(exc))
        return EXIT_FAILED
    if args.headless:
        from gpuwatch.headless import run_headless, scale_ended

        return run_headless(info, ended=scale_ended)
    return _follow(info, args)


def _follow(info: RunInfo, args: argparse.Namespace, after_attempt: int = 0) -> int:
    """After a start or a resume: print the id (--detach), follow headless, or watch."""
    if args.detach:
        print(info.run_id)
        return EXIT_OK
    if args.headless:
        from gpuwatch.headless import run_headless

        return run_headless(info, after_attempt=after_attempt)
    return _dashboard(info)


def cmd_resume(args: argparse.Namespace) -> int:
    from gpuwatch.config import ConfigError
    from gpuwatch.resume import ResumeError, resume_run
    from gpuwatch.runs import resolve_run

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    overrides = _overrides_of(args)
    if overrides is None:
        return EXIT_USAGE
    try:
        resumed = resume_run(info, overrides)
    except (ConfigError, ResumeError) as exc:
        _err(str(exc))
        return EXIT_USAGE
    except RuntimeError as exc:  # the supervisor did not start
        _err(str(exc))
        return EXIT_FAILED
    if not args.detach:
        print(f"gpuwatch: resuming run {info.run_id} as attempt {info.attempt + 1}",
              file=sys.stderr)
    return _follow(resumed, args, after_attempt=info.attempt)


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
    run_dir: Path, *, fresh: bool = False, extra: Sequence[str] = ()
) -> RunInfo:
    """Start the run's supervisor detached from this terminal; wait until its socket answers.

    extra: more arguments for it (a resume's --resume --config FILE)."""
    import subprocess

    from gpuwatch import runs

    env = dict(os.environ)
    env["GPUWATCH_HOME"] = str(run_dir.parent.parent)
    # Factories ("mypkg.models:build") import from where the person ran gpuwatch.
    env["GPUWATCH_USER_CWD"] = os.getcwd()
    cmd = _supervisor_command(run_dir, fresh=fresh, extra=extra)
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
        info = runs.read_supervisor_info(run_dir)
        pid = info.get("pid")
        # Alive, not a resumed run's old supervisor.json (a killed one leaves its file).
        alive = isinstance(pid, int) and runs.supervisor_alive(pid, run_dir)
        if alive and Path(str(info.get("socket"))).exists():
            _reap_when_done(proc)
            return runs.read_run_info(run_dir)
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


# -- attach, ls, stop, logs ---------------------------------------------------------


def _dashboard(info: RunInfo) -> int:
    """The dashboard of a run: following its supervisor, or, once the run has ended and its
    supervisor is gone (an ended run attached to, or one that ended as it started), from
    its record, where `r` resumes it."""
    from gpuwatch.app import run_dashboard
    from gpuwatch.runs import gpuwatch_home, read_run_info

    home = gpuwatch_home()
    if _supervisor_up(info):
        result = run_dashboard(home, info.run_id, info.socket_path)
    else:
        info = read_run_info(info.run_dir)
        if _supervisor_up(info):  # started again meanwhile (a resume elsewhere)
            result = run_dashboard(home, info.run_id, info.socket_path)
        else:
            result = run_dashboard(home, info.run_id, record=info)
    if result == "stop":  # asked for, not yet acknowledged by the supervisor
        return _stop(read_run_info(info.run_dir))
    if result == "stopped":
        print(f"gpuwatch: run {info.run_id} stopped.")
        return EXIT_OK
    if result == "ended":
        status = read_run_info(info.run_dir).status
        print(
            f"gpuwatch: run {info.run_id} has ended ({status}); "
            f"gpuwatch resume {info.run_id} continues it"
        )
        return EXIT_OK
    print(
        f"gpuwatch: detached from run {info.run_id}; training goes on. "
        f"Come back with: gpuwatch attach {info.run_id}"
    )
    return EXIT_OK


def _supervisor_up(info: RunInfo) -> bool:
    return (
        info.supervisor_pid is not None
        and info.socket_path is not None
        and info.socket_path.exists()
    )


def cmd_attach(args: argparse.Namespace) -> int:
    from gpuwatch.runs import resolve_run

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    # A run that has ended is shown from its record (no supervisor): `r` there resumes it.
    return _dashboard(info)


def _format_age(started: float | None) -> str:
    if not started:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))


def cmd_ls(args: argparse.Namespace) -> int:
    import json
    import shutil

    from gpuwatch.runs import list_runs
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
            f"{info.run_id:<10} {info.name[:12]:<12} {info.status:<9} {info.attempt:>7} "
            f"{info.step:>8,} {rate:>9}  {_format_age(info.started)}{workers}"
        )
        print(line)
        if info.command is not None:  # gpuwatch run: its command, as much as fits a line
            print(f"{'':<10} $ {shorten_command(info.command, width - 13)}")
        if info.status in FAILED_STATUSES and info.message:
            print(f"{'':<10} {info.message}")
    return EXIT_OK


def shorten_command(argv: Sequence[str], width: int) -> str:
    """A command as a shell would read it (shlex quoting), in `width` characters at most
    (cut with "…"; at least its program's first characters), on one line."""
    import shlex

    text = " ".join(shlex.quote(arg) for arg in argv)
    text = "".join(char if char.isprintable() else "?" for char in text)
    width = max(width, 12)
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_stop(args: argparse.Namespace) -> int:
    from gpuwatch.runs import resolve_run

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    return _stop(info)


def _stop(info: RunInfo) -> int:
    import asyncio

    from gpuwatch.client import ClientError, RunClient

    if not info.live:
        return _release(info)
    if info.socket_path is None:
        print(f"gpuwatch: run {info.run_id} is already {info.status}")
        return EXIT_OK

    async def stop() -> str:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            reply = await client.command("stop", timeout_s=120.0)
            return str(reply.get("status"))

    try:
        status = asyncio.run(stop())
    except ClientError as exc:
        _err(f"could not stop run {info.run_id}: {exc}")
        return EXIT_FAILED
    print(f"gpuwatch: run {info.run_id} {status}")
    return EXIT_OK


def _release(info: RunInfo) -> int:
    """An ended run whose supervisor lingers (for a relaunch): tell it to exit now."""
    import asyncio

    from gpuwatch.client import ClientError, RunClient
    from gpuwatch.runs import pid_alive

    pid = info.supervisor_pid
    if pid is None or info.socket_path is None or not info.socket_path.exists():
        print(f"gpuwatch: run {info.run_id} is already {info.status}")
        return EXIT_OK

    async def release() -> None:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            await client.command("stop", timeout_s=30.0)

    with contextlib.suppress(ClientError, TimeoutError, OSError):
        asyncio.run(release())  # it may hang up before the ack: its exit is what counts
    deadline = time.monotonic() + 15.0
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        _err(f"run {info.run_id} is already {info.status}, but its supervisor (pid {pid}) "
             "did not exit")
        return EXIT_FAILED
    print(f"gpuwatch: run {info.run_id} was already {info.status}; its supervisor "
          f"(pid {pid}) has exited")
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    from gpuwatch.runs import read_run_info, resolve_run, worker_dir

    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    if not _has_worker(info, args.worker):
        return EXIT_USAGE
    path = worker_dir(info.run_dir, args.worker) / "trainer.log"
    if not path.exists():
        _err(f"run {info.run_id} has no trainer log yet ({path})")
        return EXIT_FAILED
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 16)
            if chunk:
                sys.stdout.buffer.write(chunk)
                continue
            sys.stdout.flush()
            if not args.follow or not read_run_info(info.run_dir).live:
                return EXIT_OK
            time.sleep(0.5)


def _has_worker(info: RunInfo, worker: int) -> bool:
    """Whether the run has this worker; if not, say so in one line."""
    if 0 <= worker < info.workers:
        return True
    workers = "one worker (0)" if info.workers == 1 else f"workers 0 to {info.workers - 1}"
    _err(f"run {info.run_id} has no worker {worker}: it has {workers}")
    return False


def cmd_export(args: argparse.Namespace) -> int:
    from gpuwatch.export import FORMATS, WHATS, export_events
    from gpuwatch.runs import resolve_run

    for option, value, allowed in (("--what", args.what, WHATS),
                                   ("--format", args.format, FORMATS)):
        if value not in allowed:
            _err(f"{option} must be one of {', '.join(allowed)} (got {value!r})")
            return EXIT_USAGE
    if args.worker is not None and args.what in ("attempts", "scaling"):
        _err(f"--worker picks rows of steps or samples; {args.what} are the run's "
             "(drop --worker)")
        return EXIT_USAGE
    info = resolve_run(args.run)  # RunError: main() prints it, exit 2
    if args.worker is not None and not _has_worker(info, args.worker):
        return EXIT_USAGE
    events_path = info.run_dir / "events.jsonl"
    if args.output is not None and Path(args.output).resolve() == events_path.resolve():
        _err(f"-o {args.output} is the run's own events.jsonl: choose another file")
        return EXIT_USAGE
    if args.output is None:
        report = export_events(events_path, args.what, args.format, sys.stdout,
                               worker=args.worker)
    else:
        try:
            out = open(args.output, "w", encoding="utf-8", newline="")  # noqa: SIM115
        except OSError as exc:
            _err(f"cannot write {args.output}: {exc.strerror or exc}")
            return EXIT_USAGE
        with out:
            report = export_events(events_path, args.what, args.format, out,
                                   worker=args.worker)
    skipped = report.bad_summary(events_path)
    if skipped:
        _err(skipped)
    if args.what == "samples" and args.worker is not None and report.rows == 0:
        _err(_no_samples_note(info, args.worker, events_path))
    if args.output is not None:
        print(f"gpuwatch: {report.rows} {args.what} rows of run {info.run_id} -> {args.output}",
              file=sys.stderr)
    return EXIT_OK


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
    from gpuwatch.doctor import main as doctor_main

    return doctor_main([])


if __name__ == "__main__":
    sys.exit(main())
