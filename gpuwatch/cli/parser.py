"""The command line's words: every command, its options and their help (argparse).

Each command's help ends with a few examples, as git's and kubectl's do (EXAMPLES; the
tests parse every one of them with this parser).
"""

from __future__ import annotations

import argparse

# (the command line, what it does) for `gpuwatch --help` ("gpuwatch") and each command's.
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "gpuwatch": [
        ("gpuwatch train demo/demo.yaml", "train the demo and watch it live"),
        ("gpuwatch run -- python train.py", "watch your own script, unchanged"),
        ("gpuwatch scale demo/demo.yaml --replicas 1,2", "how the job scales from 1 to 2"),
        ("gpuwatch attach", "the most recent live run's dashboard again"),
    ],
    "train": [
        ("gpuwatch train demo/demo.yaml", "train and watch live (q detaches; it goes on)"),
        ("gpuwatch train demo/demo.yaml --set data.prefetch=on --headless --max-steps 400",
         "no dashboard: progress lines, then a summary and a verdict"),
        ("gpuwatch train demo/multiworker.yaml --detach", "2 local workers, in the background"),
    ],
    "run": [
        ("gpuwatch run -- python train.py --epochs 3", "your script under gpuwatch, watched"),
        ("gpuwatch run --set data.prefetch=autotune --headless -- python train.py",
         "with the hook's prefetch, no dashboard"),
        ("gpuwatch run --workers 2 -- python main.py", "a multi-worker script, 2 workers here"),
        ("gpuwatch run --set cluster.launcher=ssh --set 'cluster.workers=[gpu1, gpu2]' -- "
         "python main.py", "its workers on two hosts, over your ssh"),
    ],
    "scale": [
        ("gpuwatch scale demo/demo.yaml", "1 and 2 devices (1 to every GPU), weak scaling"),
        ("gpuwatch scale demo/demo.yaml --replicas 1,2 --mode strong --headless",
         "the global batch kept; the table printed"),
    ],
    "resume": [
        ("gpuwatch resume 0521-k7qd", "go on from the last checkpoint, watched"),
        ("gpuwatch resume 0521 --set data.prefetch=on --max-steps 2000 --headless",
         "a unique prefix is enough; change a setting"),
    ],
    "attach": [
        ("gpuwatch attach", "the most recent live run"),
        ("gpuwatch attach 0521-k7qd", "that run: live, or from its record if it ended"),
    ],
    "ls": [
        ("gpuwatch ls", "every run: id, status, attempt, step, examples/s"),
        ("gpuwatch ls --json", "one JSON object per run"),
    ],
    "stop": [("gpuwatch stop 0521-k7qd", "the trainer checkpoints, then the run ends")],
    "logs": [
        ("gpuwatch logs 0521-k7qd -f", "the trainer's output, following it"),
        ("gpuwatch logs 0521-k7qd --worker 1", "a cluster worker's log"),
    ],
    "export": [
        ("gpuwatch export 0521-k7qd -o steps.csv", "one row per step, every worker"),
        ("gpuwatch export 0521-k7qd --what attempts --format jsonl",
         "figures and settings per attempt"),
    ],
    "doctor": [("gpuwatch doctor", "what this machine has: Python, TensorFlow, NVML, GPUs")],
}


def examples_text(command: str) -> str:
    """The examples of `gpuwatch --help` ("gpuwatch") or a command's, as its epilog."""
    lines = ["examples:"]
    for line, what in EXAMPLES[command]:
        lines += [f"  {line}", f"      {what}"]
    return "\n".join(lines)


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's own, but the examples keep their lines (descriptions still wrap)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="Run TensorFlow MirroredStrategy training and watch it live in the terminal.",
        epilog=examples_text("gpuwatch"),
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, usage: str | None = None,
                description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, usage=usage, description=description,
                              epilog=examples_text(name), formatter_class=_HelpFormatter)

    train = command("train", help="start a training run and watch it")
    train.add_argument("config", help="the run's YAML config, e.g. demo/demo.yaml")
    _add_run_options(train, "override a config key, e.g. --set data.prefetch=on (repeatable)",
                     "start the run, print its id and return", "stop after N optimizer steps")
    train.add_argument("--fresh", action="store_true", help="ignore existing checkpoints")

    run = command("run",
        help="start your own command under gpuwatch and watch it: gpuwatch run -- python "
        "train.py",
        usage="gpuwatch run [-h] [--name N] [--workers N] [--set KEY=VALUE] "
        "[--headless | --detach] [--max-steps N] -- COMMAND [ARGS ...]",
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
    run.add_argument("--workers", type=int, default=None, metavar="N",
                     help="start the command N times, as the workers of a "
                     "MultiWorkerMirroredStrategy cluster: each gets its TF_CONFIG "
                     "(worker 0 is the chief) and the dashboard shows them all; on this host, "
                     "or with --set cluster.launcher=slurm on the nodes of your allocation")
    _add_run_options(run, "a setting the hook applies: data.prefetch=off|on|autotune|N, "
                     "train.max_steps=N, name=N, or where the workers run: cluster.launcher="
                     "local|ssh|slurm, cluster.workers=N|[host, ...], cluster.ssh_options, "
                     "cluster.python, cluster.ports, cluster.timeout_s (repeatable); a script's "
                     "other settings are its own", "start the command, print the run id and return",
                     "end the command's training loop after N optimizer steps (the hook's)")
    # Anything before the -- that is not an option: a command typed without its --.
    run.add_argument("words", nargs="*", help=argparse.SUPPRESS)

    scale = command("scale",
        help="how the job scales: a short attempt at each device count, as a table",
        description="Run the same job for a few steps at each device count (replicas on "
        "one host: the first N GPUs, or N logical CPU replicas with no GPU; workers for a "
        "cluster: config), one after another, each in a fresh trainer, and show examples/s, "
        "speed-up, efficiency and where each step's time went, measured after warm-up. "
        "While the verdict on the efficiency cannot tell, every count runs again with twice "
        "the steps, up to 3 rounds (--rounds).",
    )
    scale.add_argument("config", help="the run's YAML config, e.g. demo/demo.yaml")
    scale.add_argument(
        "--replicas", default=None, metavar="1,2,4",
        help="the device counts (workers for a cluster), smallest first; default 1,2, or "
        "1 to every GPU (worker) in powers of two",
    )
    scale.add_argument(
        "--steps", type=int, default=None, metavar="N",
        help="optimizer steps per count, the 5 warm-up steps included (default 40); more "
        "narrow the efficiency's 95%% interval, and a verdict needs it on one side of 80%%",
    )
    scale.add_argument(
        "--rounds", type=int, default=None, metavar="N",
        help="while the verdict cannot tell, run every count again with twice the steps, "
        "up to N rounds in all (default and most 3: the steps, 2x, 4x); 1 runs each count "
        "once",
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

    resume = command("resume",
        help="go on with a run that has ended: its next attempt, from its last checkpoint",
        description="Start a run that has ended (finished, stopped, crashed, lost) again: "
        "the same run id, its next attempt, from its last checkpoint (data position "
        "included), with the settings of its last attempt and any --set on top.",
    )
    resume.add_argument("run", help="run id or a unique prefix of it")
    _add_run_options(resume, "change a setting for the resumed attempt, e.g. --set "
                     "data.prefetch=on", "resume the run, print its id and return",
                     "stop once the run's step reaches N (counted from the run's start)")

    attach = command("attach",
        help="watch a run again (the most recent live one by default); a run that has "
        "ended is shown from its record, and r there resumes it",
    )
    attach.add_argument("run", nargs="?", help="run id or a unique prefix of it")

    ls = command("ls", help="list runs")
    ls.add_argument("--json", action="store_true", help="one JSON object per run")

    stop = command("stop", help="stop a run (the trainer checkpoints first)")
    stop.add_argument("run", help="run id or a unique prefix of it")

    logs = command("logs", help="print a run's trainer log")
    logs.add_argument("run", help="run id or a unique prefix of it")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing as it grows")
    logs.add_argument(
        "--worker",
        type=int,
        default=0,
        metavar="I",
        help="a cluster run's worker I (0, the chief, by default)",
    )

    export = command("export",
        help="write a run's steps, device samples or attempts as a table (CSV or JSON lines)",
    )
    export.add_argument("run", help="run id or a unique prefix of it")
    export.add_argument(
        "--what",
        default="steps",
        metavar="steps|summaries|samples|attempts|scaling",
        help="one row per step event (default), per summary of a worker's second (past 8 "
        "workers), per GPU per device sample, per attempt, or per device count of a scaling "
        "probe (gpuwatch scale)",
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

    command("doctor", help="check Python, TensorFlow, NVML and the GPUs")
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
