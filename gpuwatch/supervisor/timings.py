"""The supervisor's timings and limits, read from the environment once, in one place.

Each has a default a person never needs to change; the tests (and a slow box) shorten
or lengthen them with the GPUWATCH_* variable named beside it. A value that is not a
positive number is `PROBLEM`, one line naming the variable and the value: a run does not
start with it (spawn.check_startable, the supervisor's main), rather than a traceback
from the module that happened to read it first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from trainer_runtime.protocol import LIVE_DEADLINE_S


class TimingsError(ValueError):
    """A GPUWATCH_* timing that is not a positive number (one line: the variable, the value)."""


@dataclass(frozen=True)
class Timings:
    # A trainer asked to stop gets this long to checkpoint and exit, then SIGKILL.
    stop_grace_s: float = 30.0
    # Once the run has ended and no client follows it, exit after this long.
    linger_s: float = 1.0
    # Started with --await-follower: how long an ended run waits for its first follower.
    first_follower_s: float = 30.0
    # How long every worker has to answer a live change before it is abandoned: the
    # trainer's own deadline, past which it refuses the change (live.py).
    live_timeout_s: float = LIVE_DEADLINE_S
    # Once one worker of a cluster has ended, how long the others get before SIGKILL.
    worker_kill_grace_s: float = 5.0
    # A dashboard that stops reading is cut off once this much is queued for it.
    client_queue_max_bytes: int = 8 << 20
    # A connection that has sent no valid command this long after it was accepted is closed.
    client_idle_s: float = 5.0
    # At most this many such connections (and never over half the open-files limit).
    client_unidentified_max: int = 1024
    # How often each host's devices are sampled.
    sample_interval_s: float = 1.0
    # How often the folded state is written to snapshot.json while events come.
    snapshot_interval_s: float = 5.0

    @staticmethod
    def variable(name: str) -> str:
        """The environment variable of a field: stop_grace_s -> GPUWATCH_STOP_GRACE_S."""
        return "GPUWATCH_" + name.upper()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Timings:
        """The defaults, each replaced by its variable where the environment sets one."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            text = environ.get(cls.variable(field.name))
            if text is None:
                continue
            kind = int if field.type in (int, "int") else float
            try:
                value = kind(text)
            except ValueError:
                value = math.nan
            if not (isinstance(value, int) or math.isfinite(value)) or value <= 0:
                raise TimingsError(
                    f"{cls.variable(field.name)}={text!r}: not a positive "
                    f"{'whole number' if kind is int else 'number of seconds'}")
            values[field.name] = value
        return replace(cls(), **values)


def read(environ: Mapping[str, str]) -> tuple[Timings, str | None]:
    """The timings, or the defaults and the line that says what is wrong."""
    try:
        return Timings.from_environ(environ), None
    except TimingsError as exc:
        return Timings(), str(exc)


TIMINGS, PROBLEM = read(os.environ)
