"""Fixtures for trainer tests: one 2-replica CPU MirroredStrategy per test process."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(autouse=True)
def _tear_down_pipelines_while_young(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that trained in this process, collect its garbage on a thread of its own.

    A tf.data iterator's destructor waits out its autotuner's sleep, and that sleep doubles
    for as long as the iterator lives, even as garbage (FACTS.md, "tf.data teardown").
    Left to Python's collector, a test's dead trainer is torn down in whichever later test
    happens to trigger a full collection, on the main thread: 10 s to 140 s at 0 % CPU
    there, minutes of the suite's time. The runtime's own answer, in the same place:
    collect right away, off the thread that goes on working (trainer_runtime/teardown.py)."""
    yield
    if "strategy" in request.fixturenames:
        threading.Thread(target=gc.collect, name="test-pipeline-reaper", daemon=True).start()


@pytest.fixture(scope="session", autouse=True)
def _private_temporary_directory() -> Iterator[None]:
    """This process's temporary directory, for as long as it runs trainer tests, is one of
    its own, removed after them: TensorFlow in this process (the in-process trainers)
    writes autograph's generated modules there and Python their bytecode, which a worker's
    exit would leave in /tmp (an xdist worker skips the interpreter's exit handlers).
    Processes the tests start are not affected: tempfile.tempdir is this process's.

    It stays this process's temporary directory until the session ends, so the modules
    an xdist worker runs after the trainer tests make theirs in it too: it is searchable
    by all, as /tmp is (the Slurm drill's munged refuses a socket below a directory
    others cannot search; the folders made in it are 0700 as usual)."""
    before = tempfile.tempdir
    private = tempfile.mkdtemp(prefix="gpuwatch-tests-")
    os.chmod(private, 0o755)
    tempfile.tempdir = private
    try:
        yield
    finally:
        tempfile.tempdir = before
        shutil.rmtree(private, ignore_errors=True)


@pytest.fixture(scope="session")
def devices() -> Any:
    from tests.support.tf_devices import TEST_CPU_REPLICAS
    from trainer_runtime.devices import setup_devices

    devs = setup_devices(TEST_CPU_REPLICAS)
    assert len(devs.names) == TEST_CPU_REPLICAS, devs
    return devs


@pytest.fixture(scope="session")
def strategy(devices: Any) -> Any:
    from trainer_runtime.devices import make_strategy

    strat, _ = make_strategy(devices, "auto")
    return strat


def make_config(**sections: dict[str, Any]) -> Any:
    """A small RunConfig: overrides per section merge into fast defaults."""
    from trainer_runtime.schema import RunConfig

    base: dict[str, dict[str, Any]] = {
        "model": {"hidden_units": [32]},
        "data": {"examples": 2048, "input_shape": [16]},
        "train": {"global_batch_size": 64},
        "checkpoint": {"enabled": False},
    }
    for key, value in sections.items():
        base.setdefault(key, {}).update(value)
    return RunConfig.model_validate(base)


# A step's four measured parts may overrun its time by float rounding, not by more.
BREAKDOWN_SLACK_MS = 1.0


def assert_breakdown_sums(steps: Any) -> None:
    """Every step has all four parts measured, none negative, and together no longer
    than the step itself (other >= 0 within BREAKDOWN_SLACK_MS)."""
    assert steps, "no steps: the check proves nothing"
    for s in steps:
        parts = (s.input_wait_ms, s.compute_ms, s.sync_ms, s.update_ms)
        assert all(p is not None and p >= 0 for p in parts), (s.step, parts)
        other = s.step_time_ms - sum(parts)
        assert other >= -BREAKDOWN_SLACK_MS, (s.step, s.step_time_ms, parts)
        assert s.breakdown is not None
        assert abs(sum(s.breakdown.shares().values()) - 100.0) < 1e-6
