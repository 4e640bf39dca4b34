"""The commands a dashboard sends: each frame parsed into a typed command, carried out, answered.

`trainer_runtime.protocol.parse_command` is the only way a frame becomes a
command. A refused one is answered err and changes nothing; a relaunch whose
settings do not validate is refused before the trainer is touched; one that changes
only live keys (changes.LIVE_KEYS) of a running trainer is applied in that trainer (never a
person's own command's: it takes only changes.COMMAND_KEYS, each a relaunch). Relaunch
and stop take turns (one lock; a live change's wait for its trainers' answer is outside
it); status and subscribe never wait on them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.config import (
    ConfigError,
    apply_overrides,
    check_devices,
    check_replicas,
    refuse_command_keys,
)
from gpuwatch.supervisor.hub import Client
from trainer_runtime.changes import live_changes
from trainer_runtime.protocol import (
    Command,
    InvalidCommand,
    Relaunch,
    Status,
    Stop,
    Subscribe,
    encode,
    parse_command,
)
from trainer_runtime.schema import RunConfig

log = logging.getLogger("gpuwatch.supervisor")


class CommandedRun(Protocol):
    """What the commands need of the supervisor."""

    run_id: str
    run_dir: Path
    config: RunConfig
    stop_requested: bool

    @property
    def stopping(self) -> bool: ...

    @property
    def ended(self) -> bool: ...

    def replicas_for(self, config: RunConfig) -> int: ...

    def status_fields(self) -> dict[str, Any]: ...

    def subscribe(
        self, client: Client, from_seq: int, snapshot: str | None = None, *,
        dashboard: bool = False,
    ) -> int: ...

    async def relaunch(self, config: RunConfig, *, fresh: bool) -> int: ...

    def can_reconfigure(self) -> bool: ...

    def live_in_flight(self) -> str | None: ...

    async def reconfigure(self, config: RunConfig) -> Any: ...

    async def live_outcome(self, change: Any) -> dict[str, Any]: ...

    async def stop_run(self) -> None: ...


@dataclass(frozen=True)
class LiveWait:
    """A live change sent to the trainers, its answer still to come."""

    change: Any
    overrides: dict[str, Any]


class Commands:
    """Answers command frames on behalf of one run."""

    def __init__(self, run: CommandedRun) -> None:
        self.run = run
        # Attempts start and stop one at a time: the first start takes it too.
        self.lock = asyncio.Lock()

    async def answer(self, frame: dict[str, Any], client: Client) -> bytes:
        """The reply to one decoded frame: ack with the result, or err with one line."""
        try:
            command = parse_command(frame)
        except InvalidCommand as exc:
            # Refused before anything is done: the run is exactly as it was. The id is
            # echoed only when it is itself valid (exc.command_id is None otherwise).
            return encode("err", id=exc.command_id, message=str(exc))
        try:
            result = await self.carry_out(command, client)
            return encode("ack", id=command.id, **result)
        except (ConfigError, ValueError) as exc:
            return encode("err", id=command.id, message=str(exc))
        except Exception as exc:  # a bug must not take the supervisor down
            log.exception("command %r failed", command.TYPE)
            return encode("err", id=command.id, message=f"internal error: {exc}")

    async def carry_out(self, command: Command, client: Client) -> dict[str, Any]:
        """Carry out a command parse_command accepted; ValueError/ConfigError become err."""
        if isinstance(command, Subscribe):
            next_seq = self.run.subscribe(
                client, command.from_seq, command.snapshot, dashboard=command.dashboard
            )
            reply: dict[str, Any] = {"next_seq": next_seq, "run_id": self.run.run_id}
            if command.snapshot is not None:  # None: the format was not there, events follow
                reply["snapshot_seq"] = client.snapshot_seq
            return reply
        if isinstance(command, Status):
            return self.run.status_fields()
        async with self.lock:
            if isinstance(command, Relaunch):
                answer = await self._relaunch(command)
            elif isinstance(command, Stop):
                await self.run.stop_run()
                return self.run.status_fields()
            else:
                raise ValueError(f"{command.TYPE}: not a command this supervisor carries out")
        if isinstance(answer, LiveWait):
            # A live change's answer is awaited without the lock: a stop goes ahead meanwhile
            # (its trainer's exit settles the change).
            return {**await self.run.live_outcome(answer.change), "overrides": answer.overrides}
        return answer

    async def _relaunch(self, command: Relaunch) -> dict[str, Any] | LiveWait:
        if self.run.stopping:
            raise ValueError("the run is stopping; relaunch it once it has stopped")
        # parse_command checked both: overrides maps dotted keys to JSON values, and
        # fresh is a literal true/false (only true may discard the run's progress).
        overrides = dict(command.overrides)
        if self.run.config.command is not None:
            # A person's own command takes only the settings its hook applies.
            refuse_command_keys(overrides, source="relaunch")
        elif any(key.partition(".")[0] == "command" for key in overrides):
            raise ValueError("relaunch: command: a run's command is set by gpuwatch run; "
                             "this run trains the bundled runtime")
        config = apply_overrides(self.run.config, overrides, source="relaunch")
        if config.command is None:
            if config.strategy != self.run.config.strategy:
                check_devices(config, source="relaunch")
            check_replicas(config, self.run.replicas_for(config), source="relaunch")
        live_keys, other_keys = live_changes(self.run.config, config)
        in_flight = self.run.live_in_flight()
        if in_flight and command.live and not command.fresh and live_keys and not other_keys:
            # One change at a time: the next is measured against what the trainer runs.
            raise ValueError(f"{in_flight}; wait for it (R relaunches in a new trainer instead)")
        if (command.live and not command.fresh and live_keys and not other_keys
                and self.run.can_reconfigure()):
            # Only settings a running trainer can change: the next attempt, same process.
            return LiveWait(await self.run.reconfigure(config), overrides)
        if self.run.ended and not command.fresh:
            # The run's next attempt after its end: what `gpuwatch resume` checks, here too
            # (no trainer is left to save a checkpoint over a damaged one).
            from gpuwatch.runs import resume
            from gpuwatch.runs.folders import read_run_info

            info = read_run_info(self.run.run_dir)
            problem = resume.progress_problem(info, config, resume.settings_path(info))
            if problem:
                raise ValueError(problem)
        attempt = await self.run.relaunch(config, fresh=command.fresh)
        return {"attempt": attempt, "live": False, "overrides": overrides}
