"""A scaling probe's attempts (``gpuwatch scale``): one fresh attempt per device count, in turn.

Part of the Supervisor (core.py), which it reaches only through ``ScalingRun``: it does
not import core.py (core.py imports it). The plan (``protocol.Scale``: the counts, weak or
strong, the steps) comes from the command line in ``scale.json``; each count's settings
from ``gpuwatch.scaling.plan_configs``, the same rule the command line checked them with.
Each attempt is started as a relaunch is (the commands' lock, a new trainer process,
``fresh`` so no checkpoint is reused, reason ``scale``) and runs its steps to the end;
the next starts once its trainers have exited. Until the last count, an attempt that
reaches its steps leaves the run ``relaunching`` (not an end: the supervisor stays); the
last one's end, or the first attempt that does not reach its steps (a crash, a stop), is
the run's end, and no further count starts.

While the probe runs, a relaunch or a live change is refused: its attempts are the
measurement. Once it has ended the run is like any other (``r``, ``gpuwatch resume``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.config import ConfigError, visible_gpus
from gpuwatch.scaling import REASON, make_plan, plan_configs
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.exit_policy import ExitPolicy
from trainer_runtime.protocol import TERMINAL_STATUSES, Scale
from trainer_runtime.schema import RunConfig

log = logging.getLogger("gpuwatch.supervisor")

# The plan's file in the run directory, written by `gpuwatch scale`.
PLAN_FILE = "scale.json"


def host_cores() -> int | None:
    """The CPU cores this process (and the trainers it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def write_plan(path: Path, plan: Scale) -> None:
    """The plan as `gpuwatch scale` hands it to the supervisor."""
    path.write_text(json.dumps({"counts": plan.counts, "mode": plan.mode, "steps": plan.steps}))


def read_plan(path: Path, config: RunConfig) -> tuple[Scale, list[tuple[int, RunConfig]]]:
    """The plan in `path` for the run's config, and each count's settings; ConfigError if the
    file is not one `gpuwatch scale` writes or a count cannot run here."""
    try:
        data: Any = json.loads(path.read_text())
        counts, mode, steps = data["counts"], data["mode"], data["steps"]
        if not (isinstance(counts, list) and counts and all(type(c) is int for c in counts)
                and type(steps) is int and isinstance(mode, str)):
            raise ValueError("counts, mode and steps of the wrong kinds")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a scaling plan ({exc})", source=str(path)) from None
    gpus = visible_gpus()
    plan = make_plan(config, counts, mode, steps, gpus, cores=host_cores())
    return plan, plan_configs(config, plan, gpus)


class ScalingRun(Protocol):
    """What the scaling probe needs of the supervisor."""

    status: str
    stop_requested: bool
    exiting: bool
    commands: Commands
    exit_policy: ExitPolicy

    @property
    def trainer_running(self) -> bool: ...

    async def start_attempt(self, config: RunConfig, *, fresh: bool, reason: str) -> int: ...

    def set_status(self, status: str, **fields: Any) -> None: ...


class ScaleProbe:
    """Runs the plan's attempts one after another for the Supervisor that holds it."""

    def __init__(self, run: ScalingRun, plan: Scale, configs: list[tuple[int, RunConfig]]
                 ) -> None:
        self.run = run
        self.plan = plan
        self.configs = configs
        self.index = -1  # the count under way (-1: none yet)
        self.done = False
        self._changed = asyncio.Event()

    @property
    def running(self) -> bool:
        """Its attempts are under way, or still to come."""
        return not self.done

    def in_progress(self) -> str:
        """What it is doing, in words, for a refused command."""
        at = self.configs[max(self.index, 0)][0]
        return (f"the scaling probe is measuring {at} {self.plan.unit} (count "
                f"{max(self.index, 0) + 1} of {len(self.configs)}); its attempts are the "
                "measurement: wait for it to end, or stop it (s)")

    def poke(self) -> None:
        """The run's status changed, or a trainer exited: look again whether the attempt is
        over."""
        self._changed.set()

    def _attempt_over(self) -> bool:
        run = self.run
        return not run.trainer_running and (
            run.status in TERMINAL_STATUSES or run.status == "relaunching"
        )

    async def run_all(self) -> None:
        """Each count's attempt, in order, until one does not reach its steps."""
        run = self.run
        try:
            for index, (count, config) in enumerate(self.configs):
                self.index = index
                run.exit_policy.next_follows = index < len(self.configs) - 1
                async with run.commands.lock:
                    if run.stop_requested or run.exiting:
                        break
                    self._changed.clear()
                    log.info("scaling probe: %d %s, %d steps", count, self.plan.unit,
                             self.plan.steps)
                    await run.start_attempt(config, fresh=True, reason=REASON)
                while not self._attempt_over():
                    await self._changed.wait()
                    self._changed.clear()
                if run.status != "relaunching":  # the last count's end, a crash or a stop
                    break
        finally:
            run.exit_policy.next_follows = False
            self.done = True
            if run.status == "relaunching" and not run.trainer_running:
                # Stopped between two counts (the supervisor is exiting): say so.
                run.set_status("stopped", message="the scaling probe was stopped")
