"""A scaling probe's attempts (``gpuwatch scale``): one fresh attempt per device count, in turn.

Part of the Supervisor, which it reaches only through ``ScalingRun`` (core.py imports
this module, never the reverse). The plan (``protocol.Scale``) comes from ``scale.json``;
each count's settings from ``gpuwatch.measures.scaling.plan_configs``, the rule the command
line checked them with. Each attempt starts as a relaunch does (``fresh``, reason
``scale``) and runs its steps; the next starts once its trainers have exited. Rules: a
finished attempt with another to follow leaves the run ``relaunching``, and the first
that does not reach its steps ends the run. After a round the advisor's verdict over the
supervisor's own fold decides: while it cannot tell, another round runs every count with
twice the steps. While the probe runs, a relaunch or live change is refused: its
attempts are the measurement.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.advisor import Advice, poor_scaling
from gpuwatch.config import ConfigError, visible_gpus
from gpuwatch.measures.scaling import (
    REASON,
    another_round,
    make_plan,
    next_round,
    plan_configs,
    reached_its_steps,
    round_configs,
    round_words,
    scaling_rows,
)
from gpuwatch.supervisor.commands import Commands
from gpuwatch.supervisor.exit_policy import ExitPolicy
from gpuwatch.supervisor.snapshots import StateKeeper
from trainer_runtime.protocol import TERMINAL_STATUSES, Event, Scale
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
    path.write_text(json.dumps({"counts": plan.counts, "mode": plan.mode, "steps": plan.steps,
                                "rounds": plan.rounds}))


def read_plan(path: Path, config: RunConfig) -> tuple[Scale, list[tuple[int, RunConfig]]]:
    """The plan in `path` for the run's config, and each count's settings; ConfigError if the
    file is not one `gpuwatch scale` writes or a count cannot run here. A plan without
    "rounds" has one."""
    try:
        data: Any = json.loads(path.read_text())
        counts, mode, steps = data["counts"], data["mode"], data["steps"]
        rounds = data.get("rounds", 1)
        if not (isinstance(counts, list) and counts and all(type(c) is int for c in counts)
                and type(steps) is int and isinstance(mode, str) and type(rounds) is int):
            raise ValueError("counts, mode, steps and rounds of the wrong kinds")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a scaling plan ({exc})", source=str(path)) from None
    gpus = visible_gpus()
    plan = make_plan(config, counts, mode, steps, gpus, cores=host_cores(), rounds=rounds)
    return plan, plan_configs(config, plan, gpus)


class ScalingRun(Protocol):
    """What the scaling probe needs of the supervisor."""

    status: str
    stop_requested: bool
    exiting: bool
    commands: Commands
    exit_policy: ExitPolicy
    keeper: StateKeeper  # the run folded as recorded: the verdict after each round

    @property
    def trainer_running(self) -> bool: ...

    async def start_attempt(self, config: RunConfig, *, fresh: bool, reason: str) -> int: ...

    def set_status(self, status: str, **fields: Any) -> None: ...

    def record(self, event: Event, t: float | None = None) -> float: ...


class ScaleProbe:
    """Runs the plan's attempts one after another, a round at a time, for the Supervisor
    that holds it."""

    def __init__(self, run: ScalingRun, plan: Scale, configs: list[tuple[int, RunConfig]]
                 ) -> None:
        self.run = run
        self.plan = plan  # the round under way's (its steps, its number)
        self.configs = configs  # each count's settings in that round
        self.index = -1  # the count under way (-1: none yet)
        self.attempts: list[int] = []  # the round's attempts so far
        self.done = False
        self._changed = asyncio.Event()

    @property
    def running(self) -> bool:
        """Its attempts are under way, or still to come."""
        return not self.done

    def in_progress(self) -> str:
        """What it is doing, in words, for a refused command."""
        at = self.configs[max(self.index, 0)][0]
        plan = self.plan
        round_of = f" in round {plan.round} of up to {plan.rounds}" if plan.rounds > 1 else ""
        return (f"the scaling probe is measuring {at} {plan.unit} (count "
                f"{max(self.index, 0) + 1} of {len(self.configs)}){round_of}; its attempts "
                "are the measurement: wait for it to end, or stop it (s)")

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
        """Each round's counts, in order, until one does not reach its steps; another round
        while the verdict cannot tell, up to the plan's rounds."""
        run = self.run
        try:
            while await self._run_round() and self._begin_next_round():
                pass
        finally:
            run.exit_policy.next_follows = False
            self.done = True
            if run.status == "relaunching" and not run.trainer_running:
                # Stopped between two counts (the supervisor is exiting): say so.
                run.set_status("stopped", message="the scaling probe was stopped")

    async def _run_round(self) -> bool:
        """The round's counts, one after another. True when the last one reached its steps
        with another round still possible: the run is left ``relaunching`` for the verdict
        (``_begin_next_round``) to decide. False when the run has ended (the last round's
        last count, a crash or a stop)."""
        run = self.run
        plan = self.plan
        self.attempts = []
        more_rounds = plan.round < plan.rounds
        for index, (count, config) in enumerate(self.configs):
            self.index = index
            run.exit_policy.next_follows = index < len(self.configs) - 1 or more_rounds
            async with run.commands.lock:
                if run.stop_requested or run.exiting:
                    return False
                self._changed.clear()
                log.info("scaling probe: %d %s, %d steps (round %d of %d)", count, plan.unit,
                         plan.steps, plan.round, plan.rounds)
                self.attempts.append(await run.start_attempt(config, fresh=True, reason=REASON))
            while not self._attempt_over():
                await self._changed.wait()
                self._changed.clear()
            if run.status != "relaunching":  # the last count's end, a crash or a stop
                return False
        return True

    def _round_verdict(self) -> tuple[Advice | None, bool]:
        """The advisor's verdict over the run as recorded so far (the rows a dashboard shows),
        and whether the round failed: one of its attempts did not reach its steps measured,
        or the fold is off (then nothing can be told from it)."""
        keeper = self.run.keeper
        state = keeper.state
        failed = keeper.broken is not None or not all(
            reached_its_steps(state.attempts.get(attempt)) for attempt in self.attempts)
        plan = state.scale
        verdict = None if plan is None else poor_scaling(scaling_rows(state), plan)
        return verdict, failed

    def _begin_next_round(self) -> bool:
        """After a round whose last count left the run relaunching: the next round's plan
        recorded and its settings made (True), or the run's end (False): finished, unless
        a stop came meanwhile (then ``run_all`` says stopped)."""
        run = self.run
        plan = self.plan
        verdict, failed = self._round_verdict()
        stop_asked = run.stop_requested or run.exiting
        level = verdict.level if verdict is not None else None
        if verdict is not None and another_round(level, plan.round, plan.rounds,
                                                 failed=failed, stop_asked=stop_asked):
            following = next_round(plan, verdict.verdict)
            try:
                configs = round_configs(self.configs, following)
            except ConfigError as exc:  # checked by make_plan: a bug, but never a hang
                log.error("scaling probe: round %d cannot run: %s", following.round, exc)
            else:
                self.plan, self.configs = following, configs
                run.record(following)
                log.info("scaling probe: %s", round_words(following))
                return True
        if not stop_asked and run.status == "relaunching" and not run.trainer_running:
            told = (f"; round {plan.round} of {plan.rounds} could tell"
                    if level in ("good", "poor") else "")
            run.set_status("finished", exit_code=0, message=f"reached max steps{told}")
        return False
