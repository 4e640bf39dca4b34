"""Gradient accumulation: same update as one big batch, one all-reduce per update."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.integration.trainer.conftest import make_config

pytestmark = pytest.mark.slow


def _trainer(strategy: Any, devices: Any, k: int, optimizer: str, **train: Any) -> Any:
    from trainer_runtime.loop import Trainer

    # 2 replicas x k micro-steps x 8 examples = 64 per update either way; no
    # shuffle so both trainers' updates cover exactly the same 64 examples.
    cfg = make_config(
        model={"hidden_units": [32, 32], "dropout": 0.0},
        data={"shuffle": False, "examples": 512},
        train={"global_batch_size": 64, "accumulation_steps": k, "optimizer": optimizer,
               "learning_rate": 0.01, **train},
    )
    return Trainer(cfg, strategy, devices)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_accumulated_update_equals_one_big_batch(strategy: Any, devices: Any,
                                                 optimizer: str) -> None:
    big = _trainer(strategy, devices, 1, optimizer)
    accumulated = _trainer(strategy, devices, 4, optimizer)
    assert big.per_replica_batch == 32 and accumulated.per_replica_batch == 8
    start = [np.array(w) for w in big.model.get_weights()]
    accumulated.model.set_weights(start)
    big.run_updates(1)
    accumulated.run_updates(1)
    moved = False
    for before, a, b in zip(start, big.model.get_weights(), accumulated.model.get_weights(),
                            strict=True):
        # Relative to the tensor's norm: elementwise, Adam's first step is about
        # lr * sign(g) and a gradient that float32 rounding puts at ~0 can differ
        # by ~1e-7 in absolute terms whichever way the sums are ordered.
        assert np.linalg.norm(b - a) <= 1e-5 * np.linalg.norm(a)
        # The updates themselves agree too, not only the (mostly unchanged) weights.
        update_a, update_b = a - before, b - before
        assert np.linalg.norm(update_b - update_a) <= 1e-3 * np.linalg.norm(update_a) + 1e-9
        moved = moved or not np.allclose(a, before)
    assert moved, "the update did not change the weights; the comparison proves nothing"


@pytest.mark.parametrize("k", [1, 4])
def test_one_cross_replica_reduction_per_update(devices: Any, k: int) -> None:
    from trainer_runtime.devices import make_strategy
    from trainer_runtime.loop import Trainer

    strategy, _ = make_strategy(devices, "auto", count_reductions=True)
    counter = strategy.extended._cross_device_ops
    cfg = make_config(train={"accumulation_steps": k, "global_batch_size": 64})
    trainer = Trainer(cfg, strategy, devices)
    before = counter.reductions
    trainer.concrete_update_fn()  # traces one optimizer update: k micro-steps + apply
    assert counter.reductions - before == 1


def test_lr_schedule_advances_once_per_optimizer_update(strategy: Any, devices: Any) -> None:
    import keras

    trainer = _trainer(strategy, devices, 4, "sgd", lr_schedule="cosine", lr_decay_steps=10)
    steps = trainer.run_updates(1) + trainer.run_updates(1) + trainer.run_updates(1)
    schedule = keras.optimizers.schedules.CosineDecay(0.01, 10)
    expected = [float(schedule(i)) for i in range(3)]
    np.testing.assert_allclose([s.lr for s in steps], expected, rtol=1e-6)
    assert int(trainer.optimizer.iterations.numpy()) == 3
    assert [s.step for s in steps] == [1, 2, 3]
    assert [s.micro_step for s in steps] == [4, 8, 12]
    # ring all-reduce estimate: parameter bytes x 2(R-1)/R, R = 2
    assert steps[0].grad_sync_bytes == trainer.param_bytes


def test_steps_per_execution_reports_every_step(strategy: Any, devices: Any) -> None:
    cfg = make_config(train={"steps_per_execution": 5, "accumulation_steps": 2})
    from trainer_runtime.loop import Trainer
    from trainer_runtime.telemetry import NullEmitter

    class Recording(NullEmitter):
        def __init__(self) -> None:
            self.events: list[tuple[Any, float | None]] = []

        def emit(self, event: Any, t: float | None = None) -> None:
            self.events.append((event, t))

    emitter = Recording()
    trainer = Trainer(cfg, strategy, devices, emitter=emitter)
    steps = trainer.run_updates(5)
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]
    assert all(s.step_time_ms > 0 and s.input_wait_ms >= 0 for s in steps)
    assert all(s.input_wait_ms <= s.step_time_ms for s in steps)
    assert [event for event, _ in emitter.events] == steps, "every step is emitted, once"
    ends = [t for _, t in emitter.events]
    assert all(t is not None for t in ends) and ends == sorted(ends)
