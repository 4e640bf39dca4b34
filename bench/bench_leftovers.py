"""What ended runs leave running: N headless runs of a config, then the process table.

    python bench/bench_leftovers.py [--runs 10] [--max-steps 50] [--config demo/demo.yaml]
        [--after-s 10] [--gpuwatch PYTHON_OR_CHECKOUT]

Runs `gpuwatch train CONFIG --headless --max-steps N` one after another in a private
GPUWATCH_HOME, as a person would (spare trainers on: the default), waits --after-s seconds
after the last one ended, then counts the processes that belong to those runs (a
supervisor, a trainer, a spare trainer: found by the private home in their command line
or working directory) and sums their resident memory. Then it ends whatever it found, so
nothing is left behind.

--checkout DIR runs another checkout's gpuwatch (e.g. a worktree of an older commit) with
this Python, to compare before and after in one sitting. Prints
`result: processes=P supervisors=S spares=R trainers=T rss_mib=M`.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def kind_of(cmdline: list[str]) -> str:
    joined = " ".join(cmdline)
    if "gpuwatch.supervisor" in joined:
        return "supervisor"
    if "trainer_runtime.spare" in joined:
        return "spare"
    if "trainer_runtime" in joined:
        return "trainer"
    return "other"


def belonging(home: Path) -> list[psutil.Process]:
    """Live processes whose command line or working directory is under home."""
    found = []
    mark = str(home)
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = proc.info["cmdline"] or []
        cwd = proc.info["cwd"] or ""
        if any(mark in part for part in cmdline) or cwd.startswith(mark):
            found.append(proc)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--config", default=str(ROOT / "demo" / "demo.yaml"))
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--checkout", type=Path, default=ROOT,
                        help="the gpuwatch checkout to run (default: this one)")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gw-leftovers-"))
    env = {**os.environ, "GPUWATCH_HOME": str(home), "GPUWATCH_DETACH": "setsid",
           "PYTHONPATH": str(args.checkout.resolve())}
    env.pop("GPUWATCH_SPARE_TRAINER", None)  # as a person runs it: spares on
    env.pop("GPUWATCH_LINGER_S", None)
    codes = []
    started = time.monotonic()
    for _ in range(args.runs):
        done = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "train", args.config, "--headless",
             "--max-steps", str(args.max_steps)],
            cwd=args.checkout, env=env, capture_output=True, text=True, timeout=600,
            check=False,
        )
        codes.append(done.returncode)
    took = time.monotonic() - started
    time.sleep(args.after_s)
    procs = belonging(home)
    kinds = {"supervisor": 0, "spare": 0, "trainer": 0, "other": 0}
    rss = 0
    for proc in procs:
        try:
            kinds[kind_of(proc.cmdline())] += 1
            rss += proc.memory_info().rss
        except psutil.Error:
            continue
    print(f"checkout: {args.checkout}  runs: {args.runs} x {args.max_steps} steps of "
          f"{args.config} in {took:.0f} s, exit codes {sorted(set(codes))}")
    print(f"{args.after_s:.0f} s after the last run ended: {len(procs)} processes of those runs "
          f"({kinds['supervisor']} supervisors, {kinds['spare']} spare trainers, "
          f"{kinds['trainer']} trainers, {kinds['other']} other), "
          f"{rss / 2**20:,.0f} MiB resident")
    print(f"result: processes={len(procs)} supervisors={kinds['supervisor']} "
          f"spares={kinds['spare']} trainers={kinds['trainer']} rss_mib={rss / 2**20:.0f}")
    for proc in procs:  # leave nothing behind
        try:
            if os.getpgid(proc.pid) == proc.pid:  # a group leader: what it forked goes too
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except (OSError, psutil.Error):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
