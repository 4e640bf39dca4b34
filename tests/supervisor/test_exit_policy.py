"""A cluster's ending as one status (gpuwatch/supervisor/exit_policy.py), worker by worker.

The stand-ins are the policy's two collaborators, the run and its workers; the exits are
what the agents report (TrainerExit). A worker blocked in a collective fails once its
peer has gone: asked to end, that is the stop, whichever worker the stop reached first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuwatch.supervisor.exit_policy import ExitPolicy
from gpuwatch.supervisor.exits import TrainerExit
from gpuwatch.supervisor.hub import TaskSet
from trainer_runtime.schema import RunConfig

# What a worker whose peer left says as it dies in the collective (seen in trainer.log).
LOST_PEER = TrainerExit(returncode=1, error="UnavailableError: Socket closed")
STOPPED = TrainerExit(returncode=0, done_reason="sigterm")


class StandInRun:
    def __init__(self, stop_requested: bool) -> None:
        self.config = RunConfig.model_validate(
            {"cluster": {"workers": [{"host": "localhost"}, {"host": "localhost"}]}})
        self.stop_requested = stop_requested
        self.loop: asyncio.AbstractEventLoop | None = None
        self.statuses: list[tuple[str, dict[str, Any]]] = []

    @property
    def clustered(self) -> bool:
        return True

    def set_status(self, status: str, **fields: Any) -> None:
        self.statuses.append((status, fields))


class StandInWorkers:
    def __init__(self, count: int) -> None:
        self.up = set(range(count))

    def who(self, index: int) -> str:
        return f"worker {index} (localhost)"

    def running_indexes(self, *, besides: int | None = None) -> list[int]:
        return sorted(i for i in self.up if i != besides)

    async def stop(self, grace_s: float) -> None:
        self.up.clear()


def _end(policy: ExitPolicy, workers: StandInWorkers, *exits: tuple[int, TrainerExit]) -> None:
    for index, ended in exits:
        workers.up.discard(index)
        policy.on_exit(index, ended)


def _policy(stop_requested: bool) -> tuple[ExitPolicy, StandInRun, StandInWorkers]:
    run, workers = StandInRun(stop_requested), StandInWorkers(2)
    return ExitPolicy(run, workers, TaskSet()), run, workers  # type: ignore[arg-type]


@pytest.mark.parametrize("first", [0, 1])
def test_a_stop_ends_stopped_whichever_worker_it_reached_first(first: int) -> None:
    policy, run, workers = _policy(stop_requested=True)
    _end(policy, workers, (first, STOPPED), (1 - first, STOPPED))
    assert [status for status, _ in run.statuses] == ["stopped"]


def test_a_chief_that_fails_in_the_collective_after_its_peer_left_is_part_of_the_stop() -> None:
    policy, run, workers = _policy(stop_requested=True)
    _end(policy, workers, (1, STOPPED), (0, LOST_PEER))
    ((status, fields),) = run.statuses
    assert status == "stopped"
    assert fields["message"] == (
        "stopped on request (worker 0 (localhost) ended after worker 1 (localhost) had: "
        "exited with code 1: UnavailableError: Socket closed)")
    assert fields["exit_code"] == 1 and "worker" not in fields


def test_so_is_a_relaunch() -> None:
    policy, run, workers = _policy(stop_requested=False)
    policy.relaunching = True
    _end(policy, workers, (1, STOPPED), (0, LOST_PEER))
    assert [status for status, _ in run.statuses] == ["relaunching"]


def test_a_chief_that_failed_before_any_peer_left_crashed_even_during_a_stop() -> None:
    # Its failure did not come from a peer gone: its own crash, named.
    policy, run, workers = _policy(stop_requested=True)
    _end(policy, workers, (0, LOST_PEER), (1, STOPPED))
    ((status, fields),) = run.statuses
    assert status == "crashed" and fields["worker"] == 0
    assert fields["message"].startswith("worker 0 (localhost): exited with code 1")


async def test_unasked_a_worker_that_fails_after_its_peer_finished_crashed_the_run() -> None:
    policy, run, workers = _policy(stop_requested=False)
    _end(policy, workers, (1, TrainerExit(returncode=0, done_reason="max_steps")),
         (0, LOST_PEER))
    ((status, fields),) = run.statuses
    assert status == "crashed" and fields["worker"] == 0
    await asyncio.sleep(0)  # the stop of the others it spawned runs (none is left)
