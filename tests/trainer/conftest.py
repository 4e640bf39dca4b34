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
