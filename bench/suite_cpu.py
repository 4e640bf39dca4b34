"""Where a command's CPU goes, every process of it: `python bench/suite_cpu.py -- COMMAND`.

Made for the test suite (`python bench/suite_cpu.py -- .venv/bin/python -m pytest -q`):
it runs the command and, every 0.25 s, reads /proc for every process (its own CPU
seconds, its command line, and the test that started it: PYTEST_CURRENT_TEST, which
every process a test starts inherits), and /proc/stat for the box's busy share. At the
end it prints the box's busy share, the CPU by kind of process (trainers, a person's
scripts under the hook, xdist workers, gpuwatch commands, supervisors), and the
TensorFlow processes by test module. A process's CPU is its last reading: up to 0.25 s
of a short one's end is missed. Linux only; it reads, it changes nothing.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from dataclasses import dataclass

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Seen:
    cmd: str
    test: str
    cpu: float = 0.0
    before: float = 0.0  # its CPU when the command started (a process already running)


def busy_and_total() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    return sum(values) - values[3] - values[4], sum(values)


def read(pid: str, seen: dict[int, Seen]) -> None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        rest = stat[stat.rfind(")") + 2:].split()
        cpu = (int(rest[11]) + int(rest[12])) / TICK
        record = seen.get(int(pid))
        if record is None:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:300]
            test = ""
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    for item in fh.read().split(b"\0"):
                        if item.startswith(b"PYTEST_CURRENT_TEST="):
                            test = item[20:].decode(errors="replace").rsplit(" (", 1)[0]
            except OSError:
                pass
            record = seen[int(pid)] = Seen(cmd, test)
        record.cpu = cpu
    except (OSError, IndexError, ValueError):
        pass  # gone meanwhile, or not ours to read


def kind(cmd: str) -> str:
    words = cmd.split()
    if "trainer_runtime.spare" in cmd:
        return "spare trainers"
    if "-m trainer_runtime" in cmd:
        return "trainers"
    if "tests/data/scripts" in cmd or "import runpy, sys, tensorflow" in cmd:
        return "a person's scripts (hooked)"
    if "fake_trainer" in cmd:
        return "stand-in trainers"
    if "gpuwatch.supervisor" in cmd:
        return "supervisors"
    if "execnet" in cmd or "exec(eval(sys.stdin.readline()))" in cmd:
        return "xdist workers"
    if "gpuwatch" in cmd and len(words) > 1:
        at = next((i for i, w in enumerate(words) if w.endswith("gpuwatch")), None)
        if at is not None and at + 1 < len(words):
            return f"gpuwatch {words[at + 1]}"
        return "gpuwatch (other)"
    if "pytest" in cmd:
        return "pytest"
    return "other: " + (words[0].rsplit("/", 1)[-1] if words else "?")


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    seen: dict[int, Seen] = {}
    me = os.getpid()
    for pid in os.listdir("/proc"):  # what ran before: only its CPU from now on counts
        if pid.isdigit() and int(pid) != me:
            read(pid, seen)
    for record in seen.values():
        record.before = record.cpu
    busy0, total0 = busy_and_total()
    started = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != me:
                read(pid, seen)
        time.sleep(0.25)
    wall = time.monotonic() - started
    busy1, total1 = busy_and_total()
    busy_s, total_s = (busy1 - busy0) / TICK, (total1 - total0) / TICK
    print(f"\n{wall:.0f} s; the box {100 * busy_s / total_s:.0f} % busy: {busy_s:,.0f} of "
          f"{total_s:,.0f} core-seconds")
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for record in seen.values():
        if record.cpu > record.before:
            by_kind[kind(record.cmd)][0] += 1
            by_kind[kind(record.cmd)][1] += record.cpu - record.before
    print(f"{'CPU-s':>8} {'procs':>6} {'each':>6}  kind")
    for name, (count, cpu) in sorted(by_kind.items(), key=lambda item: -item[1][1])[:20]:
        print(f"{cpu:8.1f} {count:6.0f} {cpu / count:6.2f}  {name}")
    tf_kinds = ("trainers", "spare trainers", "a person's scripts (hooked)")
    by_module: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for record in seen.values():
        if kind(record.cmd) in tf_kinds:
            module = record.test.split("::")[0] or "(no test)"
            by_module[module][0] += 1
            by_module[module][1] += record.cpu - record.before
    print("\nTensorFlow processes (trainers, spares, hooked scripts) by test module:")
    for module, (count, cpu) in sorted(by_module.items(), key=lambda item: -item[1][1])[:25]:
        print(f"{cpu:8.1f} {count:6.0f}  {module}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
