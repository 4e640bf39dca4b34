"""The command line's words: every command, its options and their help (argparse)."""

from __future__ import annotations

import argparse


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
