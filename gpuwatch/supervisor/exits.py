"""How a trainer's end becomes the run's status: pure functions, no process, no file.

The agent gathers what it knows when its trainer exits (a TrainerExit); the
supervisor asks exit_status what that means, given whether it had asked the
trainer to stop or to make way for a relaunch.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import Any

# How many of the attempt's last trainer.log lines a crashed status carries.
LOG_TAIL_LINES = 50
# A crash's cause (one line) and each log line it carries: a status event stays far
# below the frame limit even when an exception's message is megabytes long.
MAX_CAUSE_CHARS = 500
MAX_LINE_CHARS = 1000
# Return codes of a trainer that ended because it was asked to (SIGTERM, or SIGKILL
# after the grace period), or that had finished on its own (0).
_ASKED_TO_END = (0, -signal.SIGTERM, -signal.SIGKILL)

# A line that says what went wrong: a Python exception, a TensorFlow fatal log line
# (F1121 ... Check failed), a C++ terminate, faulthandler's report, the kernel's words.
_ERROR_LINE = re.compile(
    r"(?:^[\w.]*(?:Error|Exception|Exit|Interrupt)\b.*?:"
    r"|^F\d{4} "
    r"|Check failed|terminate called|Fatal Python error|Segmentation fault|Aborted"
    r"|out of memory|Killed)"
)


@dataclass(frozen=True)
class TrainerExit:
    """What is known about one trainer process that has exited.

    returncode as asyncio reports it (negative: killed by that signal);
    done_reason and error from its last `done` and `error` frames; log_lines,
    this attempt's lines of trainer.log; oom_killed, whether its memory cgroup
    counted an OOM kill while it ran.
    """

    returncode: int
    done_reason: str | None = None
    error: str | None = None
    log_lines: tuple[str, ...] = ()
    oom_killed: bool = False
    link_lost: str | None = None


def exit_status(
    ended: TrainerExit, *, relaunching: bool, stop_requested: bool, next_follows: bool = False,
    command: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The status a run takes when its trainer exits, and that status event's fields.

    next_follows: another attempt starts once this one reaches its steps (a scaling
    probe's next count), so reaching them is not the run's end. command: it was a
    person's own command (gpuwatch run): ``command_exit_status``."""
    if command:
        return command_exit_status(ended, relaunching=relaunching, stop_requested=stop_requested)
    returncode = ended.returncode
    exit_code = returncode if returncode >= 0 else None
    sig = signal_name(-returncode) if returncode < 0 else None
    asked_to_end = returncode in _ASKED_TO_END or ended.link_lost is not None
    if relaunching and asked_to_end:
        # Not a terminal status: a new attempt follows at once.
        return "relaunching", {
            "exit_code": exit_code,
            "signal": sig,
            "message": "stopped for relaunch",
        }
    if stop_requested and asked_to_end:
        return "stopped", {"exit_code": exit_code, "signal": sig, "message": "stopped on request"}
    if returncode == 0 and ended.done_reason in ("max_steps", "epochs") and next_follows:
        return "relaunching", {
            "exit_code": 0,
            "message": f"reached {ended.done_reason.replace('_', ' ')}; the next attempt follows",
        }
    if returncode == 0 and ended.done_reason in ("max_steps", "epochs"):
        return "finished", {
            "exit_code": 0,
            "message": f"reached {ended.done_reason.replace('_', ' ')}",
        }
    if returncode == 0:
        return "stopped", {
            "exit_code": 0,
            "message": f"trainer exited ({ended.done_reason or 'no reason given'})",
        }
    lines = list(ended.log_lines)
    if ended.link_lost:
        # Not the trainer's own end (its host may still run it): the link's words, bounded.
        return "crashed", {
            "exit_code": None,
            "signal": None,
            "message": ended.link_lost[:MAX_CAUSE_CHARS],
            "log_tail": [line[:MAX_LINE_CHARS] for line in lines[-LOG_TAIL_LINES:]],
        }
    return "crashed", {
        "exit_code": exit_code,
        "signal": sig,
        "message": describe_crash(returncode, ended.error, lines, ended.oom_killed),
        # Bounded, so the status event always fits in a frame, whatever the log holds.
        "log_tail": [line[:MAX_LINE_CHARS] for line in lines[-LOG_TAIL_LINES:]],
    }


def command_exit_status(
    ended: TrainerExit, *, relaunching: bool, stop_requested: bool
) -> tuple[str, dict[str, Any]]:
    """The status a run takes when a person's own command exits (gpuwatch run).

    A command is no runtime of ours: how it answers SIGTERM is its own (a shell's 143, a
    script's cleanup that exits 1), so once the supervisor asked it to end, for a
    relaunch or a stop, that is the story whatever its code. Else exit code 0 is
    finished; any other code, or a signal, crashed, with the cause found as for a
    trainer (its `error` frame, else its log's last error line: a Python traceback's)."""
    returncode = ended.returncode
    exit_code = returncode if returncode >= 0 else None
    sig = signal_name(-returncode) if returncode < 0 else None
    if relaunching:
        return "relaunching", {"exit_code": exit_code, "signal": sig,
                               "message": "stopped for relaunch"}
    if stop_requested:
        return "stopped", {"exit_code": exit_code, "signal": sig, "message": "stopped on request"}
    if returncode == 0:
        message = "the command exited 0"
        if ended.done_reason == "max_steps":
            message = "reached max steps; the command exited 0"
        return "finished", {"exit_code": 0, "message": message}
    lines = list(ended.log_lines)
    return "crashed", {
        "exit_code": exit_code,
        "signal": sig,
        "message": describe_crash(returncode, ended.error, lines, ended.oom_killed),
        "log_tail": [line[:MAX_LINE_CHARS] for line in lines[-LOG_TAIL_LINES:]],
    }


def describe_crash(
    returncode: int, error_frame: str | None, log_tail: list[str], oom_killed: bool
) -> str:
    """One line for a trainer that ended badly: how it ended, then its root cause.

    The cause is the trainer's own `error` frame when it sent one (a Python
    exception, with TensorFlow's wrapping peeled off); else the last line of its
    log that reads like an error (a C++ abort, a segfault, faulthandler); else,
    for SIGKILL, whether the kernel's OOM killer did it.
    """
    if returncode < 0:
        how = f"killed by {signal_name(-returncode)}"
    else:
        how = f"exited with code {returncode}"
    cause = error_frame
    if not cause:
        for line in reversed(log_tail):
            text = line.strip()
            if text and _ERROR_LINE.search(text) and not text.startswith("File "):
                cause = text
                break
    if cause and len(cause) > MAX_CAUSE_CHARS:
        cause = cause[: MAX_CAUSE_CHARS - 3] + "..."
    if returncode == -signal.SIGKILL:
        if oom_killed:
            how += " (the kernel's OOM killer: the machine ran out of memory)"
        elif not cause:
            how += " (out of memory, or kill -9)"
    return f"{how}: {cause}" if cause else how


def signal_name(sig: int | None) -> str | None:
    """SIGTERM for 15; "signal 99" for a number that names no signal; None for None."""
    if sig is None:
        return None
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
