"""How an attempt ends: each worker's exit becomes the run's one status, and a failure stops all.

exits.py says what one trainer's exit means (pure); this is the bookkeeping over an
attempt's workers around it. One host: the trainer's exit is the status. A cluster:
the first worker to fail (a crash not asked for, or a worker that cannot start)
ends the attempt as crashed, naming it, and the others are stopped (SIGTERM, then
SIGKILL after WORKER_KILL_GRACE_S: a trainer blocked in a collective never reaches
its SIGTERM check). A worker that finishes or stops on its own gives the others the
collective timeout to end too; one still up after it is stuck, and to blame. Once
the last worker is out, the run's status is the chief's ending; asked to end, a chief
that failed after a peer had left (its collective lost the peer) ended with the stop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gpuwatch.supervisor.exits import TrainerExit, exit_status
from gpuwatch.supervisor.hub import TaskSet
from gpuwatch.supervisor.timings import TIMINGS
from gpuwatch.supervisor.workers import Workers
from trainer_runtime.protocol import ProtocolError
from trainer_runtime.schema import RunConfig

# A cluster's attempt that failed: how long the other workers get between SIGTERM and
# SIGKILL (a trainer blocked in a collective never reaches its SIGTERM check).
WORKER_KILL_GRACE_S = TIMINGS.worker_kill_grace_s


class EndingRun(Protocol):
    """What the exit policy needs of the supervisor."""

    config: RunConfig
    stop_requested: bool
    loop: asyncio.AbstractEventLoop | None

    @property
    def clustered(self) -> bool: ...

    def set_status(self, status: str, **fields: Any) -> None: ...


class ExitPolicy:
    """One attempt's endings: who exited how, the worker that failed first, the straggler timer."""

    def __init__(self, run: EndingRun, workers: Workers, tasks: TaskSet) -> None:
        self.run = run
        self.workers = workers
        self.tasks = tasks
        # The supervisor stops the trainers to make way for the next attempt.
        self.relaunching = False
        # Another attempt follows this one's end (a scaling probe's next count).
        self.next_follows = False
        self.exits: dict[int, TrainerExit] = {}
        self.failed_worker: int | None = None
        self._straggler_timer: asyncio.TimerHandle | None = None

    @property
    def asked(self) -> bool:
        """The trainers were asked to end (a relaunch, or a stop)."""
        return self.relaunching or self.run.stop_requested

    def new_attempt(self) -> None:
        """Forget the last attempt's endings."""
        self.exits = {}
        self.failed_worker = None
        self._cancel_straggler_timer()

    def set_exit_status(self, status: str, fields: dict[str, Any]) -> None:
        try:
            self.run.set_status(status, **fields)
        except ProtocolError:  # it cannot be too big (exits.py bounds it); never lose a status
            short = {"message": str(fields.get("message"))[:500], "worker": fields.get("worker")}
            self.run.set_status(status, **short)

    def on_exit(self, index: int, ended: TrainerExit) -> None:
        """A worker's trainer exited: the run's status, once it is known."""
        status, fields = exit_status(
            ended, relaunching=self.relaunching, stop_requested=self.run.stop_requested,
            next_follows=self.next_follows, command=self.run.config.command is not None,
        )
        if not self.run.clustered:
            self.set_exit_status(status, fields)
            return
        self.exits[index] = ended
        if self.failed_worker is not None:
            return  # the attempt has its status: the worker that failed first
        asked = self.asked
        if status == "crashed" and not asked:
            self.fail(index, fields)
            return
        if self.workers.running_indexes(besides=index):
            if not asked and self._straggler_timer is None and self.run.loop is not None:
                # A finished or stopped worker: the others should end at the same step. Those
                # still up after the collective timeout are stuck without it.
                cluster = self.run.config.cluster
                assert cluster is not None
                self._straggler_timer = self.run.loop.call_later(
                    cluster.timeout_s, self._stragglers, index, ended
                )
            return
        # The last worker out: the run's status is the chief's ending (one status).
        self._cancel_straggler_timer()
        chief = self.exits.get(0, ended)
        status, fields = exit_status(
            chief, relaunching=self.relaunching, stop_requested=self.run.stop_requested,
            next_follows=self.next_follows, command=self.run.config.command is not None,
        )
        if status == "crashed":
            who = self.workers.who(0)
            first_out = next(iter(self.exits))
            if asked and first_out != 0:
                # Asked to end, the chief failed after a peer had already left: a worker
                # blocked in a collective fails it once its peer is gone. Part of the
                # stop (or relaunch), not a crash of its own.
                status = "relaunching" if self.relaunching else "stopped"
                said = "stopped for relaunch" if self.relaunching else "stopped on request"
                fields = {"exit_code": fields.get("exit_code"), "signal": fields.get("signal"),
                          "message": f"{said} ({who} ended after "
                                     f"{self.workers.who(first_out)} had: {fields['message']})"}
            else:
                fields = {**fields, "worker": 0, "message": f"{who}: {fields['message']}"}
        self.set_exit_status(status, fields)

    def start_failed(self, index: int, message: str) -> None:
        """A worker could not be prepared or started: the attempt crashed (unless it had)."""
        if self.failed_worker is None:
            self.failed_worker = index
            self.set_exit_status("crashed", {"message": message, "worker": index})

    def fail(self, index: int, fields: dict[str, Any]) -> None:
        """One worker failed: the attempt is over (crashed, naming it) and the others stop."""
        self.failed_worker = index
        self._cancel_straggler_timer()
        message = f"{self.workers.who(index)}: {fields.get('message') or 'failed'}"
        self.set_exit_status("crashed", {**fields, "message": message, "worker": index})
        self.tasks.spawn(self.stop_workers())

    async def stop_workers(self) -> None:
        """Stop every worker still up: SIGTERM, then SIGKILL after WORKER_KILL_GRACE_S."""
        await self.workers.stop(WORKER_KILL_GRACE_S)

    def _stragglers(self, index: int, ended: TrainerExit) -> None:
        self._straggler_timer = None
        others = self.workers.running_indexes()
        if not others or self.asked or self.failed_worker is not None:
            return
        how = ended.done_reason or f"code {ended.returncode}"
        cluster = self.run.config.cluster
        waited = cluster.timeout_s if cluster is not None else 0.0
        # The stuck one is to blame: it did not end at the step the others ended at.
        who = self.workers.who(index)
        self.fail(
            others[0],
            {
                "message": f"still running {waited:.0f} s after {who} ended ({how}): "
                "stuck without it; stopped"
            },
        )

    def _cancel_straggler_timer(self) -> None:
        if self._straggler_timer is not None:
            self._straggler_timer.cancel()
            self._straggler_timer = None
