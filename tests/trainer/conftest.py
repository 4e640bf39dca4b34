"""Fixtures for trainer tests: one 2-replica CPU MirroredStrategy per test process."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def devices() -> Any:
    from trainer_runtime.devices import setup_devices

    devs = setup_devices(2)
    assert len(devs.names) == 2, devs
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
