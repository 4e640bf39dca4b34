"""A spare trainer: ``python -m trainer_runtime.spare --module trainer_runtime``.

It imports TensorFlow and the trainer's modules ahead of time, then waits on stdin for
one line, ``{"argv": [...], "env": {...}, "cwd": DIR}``, the trainer it is to become: it
takes that environment and directory and runs ``python -m MODULE ARGV`` in this same
process, so a relaunch skips the interpreter start and the import. End of input without
a line ends it quietly with exit 0. Importing TensorFlow reads no device: CUDA, logical
devices, thread pools and TF_CONFIG are read later, in main(), after the environment (the
C library's too) has been replaced, which is how the accelerators hidden from a waiting
spare become visible. While it waits it runs at idle CPU priority where this host lets
it go back to normal after (checked in a throwaway child first). Stdlib only until the
preload, like ``__main__``'s own top.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from typing import Any

# What `python -m trainer_runtime` imports before its first step (the slow part).
PRELOAD = (
    "tensorflow",
    "keras",
    "trainer_runtime.loop",
    "trainer_runtime.data",
    "trainer_runtime.models",
    "trainer_runtime.devices",
    "trainer_runtime.cluster",
    "trainer_runtime.telemetry",
)
# Its line in trainer.log once the imports are done.
READY = "ready for the next attempt"


def can_leave_idle() -> bool:
    """Whether this process could go SCHED_IDLE and back (tried in a throwaway child)."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    pid = os.fork()
    if pid == 0:  # the child: try, report by exit code, never return
        code = 1
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            code = 0
        except OSError:
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _set_policy(policy: int) -> None:
    """Every thread of this process to policy (threads keep their own)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
        except (OSError, ValueError):
            pass


def _device_context_made() -> bool:
    """Whether TensorFlow has made its runtime context (and with it, its devices) here.

    A waiting spare must not: the context is where TensorFlow takes GPU memory. Only
    read when TensorFlow is already imported (never imports it)."""
    eager = sys.modules.get("tensorflow.python.eager.context")
    if eager is None:
        return False
    try:
        return eager.context()._context_handle is not None
    except Exception:  # a TensorFlow whose internals moved: say nothing was made
        return False


def _read_order(stream: Any) -> dict[str, Any] | None:
    """The one line that says what to become; None at end of input."""
    line = stream.readline()
    if not line:
        return None
    order = json.loads(line)
    if not isinstance(order, dict):
        raise ValueError("spare: the order must be a JSON object")
    argv, env, cwd = order.get("argv"), order.get("env"), order.get("cwd")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise ValueError("spare: argv must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise ValueError("spare: env must map names to strings")
    if not isinstance(cwd, str):
        raise ValueError("spare: cwd must be a string")
    return order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_runtime.spare")
    parser.add_argument("--module", default="trainer_runtime", help="what it becomes")
    parser.add_argument(
        "--run-dir", default=None, help="the run it waits for (so ps tells whose spare it is)"
    )
    args = parser.parse_args(argv)
    idle = can_leave_idle()
    if idle:
        _set_policy(os.SCHED_IDLE)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.monotonic()
    if args.module == "trainer_runtime":
        for name in PRELOAD:
            __import__(name)
    took = time.monotonic() - started
    context = "a device context was made" if _device_context_made() else "no device context"
    print(
        f"spare trainer pid {os.getpid()}: {READY} ({took:.1f} s, {context})",
        file=sys.stderr,
        flush=True,
    )
    try:
        order = _read_order(sys.stdin)
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    if order is None:
        return 0
    if idle:
        _set_policy(os.SCHED_OTHER)
    # Become the trainer: its environment, its directory, no stdin (as a cold start has).
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(order["cwd"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.argv = [args.module, *order["argv"]]
    try:
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
