"""Input knobs act for real: injected read latency shows up as input wait, prefetch hides it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.trainer.conftest import make_config

pytestmark = pytest.mark.slow

READ_LATENCY_MS = 12.0
STEPS = 40


def _measure(strategy: Any, devices: Any, latency_ms: float, prefetch: Any,
             parallel: Any) -> tuple[float, float]:
    """(input-wait fraction, median compute ms = step minus wait), after warm-up."""
    from trainer_runtime.loop import Trainer

    cfg = make_config(
        model={"hidden_units": [512, 512]},
        data={"input_shape": [256], "read_latency_ms": latency_ms, "prefetch": prefetch,
              "parallel_calls": parallel},
        train={"global_batch_size": 256},
    )
    trainer = Trainer(cfg, strategy, devices)
    trainer.run_updates(1)  # tracing
    trainer.run_updates(1)
    trainer.reset_timing()
    steps = []
    for _ in range(STEPS):
        steps += trainer.run_updates(1)
    step_ms = np.array([s.step_time_ms for s in steps])
    wait_ms = np.array([s.input_wait_ms for s in steps])
    return (float(np.median(wait_ms) / np.median(step_ms)),
            float(np.median(step_ms - wait_ms)))


@pytest.mark.alone
def test_read_latency_without_prefetch_is_all_input_wait(strategy: Any, devices: Any) -> None:
    # Compute time C comes from the same run's frames (same load on a noisy
    # box); the latency L is the injected ground truth, not a measurement.
    fraction, compute_ms = _measure(strategy, devices, READ_LATENCY_MS, False, 1)
    expected = READ_LATENCY_MS / (READ_LATENCY_MS + compute_ms)
    assert abs(fraction - expected) <= 0.05, (fraction, expected, compute_ms)


@pytest.mark.alone
def test_prefetch_and_parallel_reads_hide_read_latency(strategy: Any, devices: Any) -> None:
    fraction, _ = _measure(strategy, devices, READ_LATENCY_MS, "autotune", "autotune")
    assert fraction < 0.05, fraction


@pytest.mark.alone
def test_decode_cost_adds_input_time(strategy: Any, devices: Any) -> None:
    from trainer_runtime.loop import Trainer

    waits = []
    for cost in (0, 200):
        cfg = make_config(data={"decode_cost": cost, "prefetch": False},
                          train={"global_batch_size": 256})
        trainer = Trainer(cfg, strategy, devices)
        trainer.run_updates(2)
        steps = []
        for _ in range(10):
            steps += trainer.run_updates(1)
        waits.append(float(np.median([s.input_wait_ms for s in steps])))
    # Seen here: 0.22-0.25 ms without decode work, 1.6-1.8 ms with 200 rounds (the
    # pipeline's own threads absorb much of it). A ratio holds on a loaded 2-core box
    # where an absolute margin did not.
    assert waits[1] > 3 * waits[0] and waits[1] > waits[0] + 0.5, waits
