"""A step split into input, compute, all-reduce and update, checked against the truth.

- The all-reduce the update graph runs itself (to time it apart) gives the weights the
  optimizer's own (fused) all-reduce gives, update after update.
- The parts fit in the step on every update (other >= 0 within 1 ms), for one or several
  updates per call and one or several micro-steps per update.
- The all-reduce time of an update is that of the same all-reduce run alone on the same
  devices, within the measured noise, and grows with the bytes reduced.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.integration.trainer.conftest import assert_breakdown_sums, make_config

pytestmark = pytest.mark.slow


def _trainer(strategy: Any, devices: Any, split: bool = True, **train: Any) -> Any:
    from trainer_runtime.loop import Trainer

    cfg = make_config(
        model={"hidden_units": [32, 32], "dropout": 0.0},
        data={"shuffle": False, "examples": 512},
        train={"global_batch_size": 64, "learning_rate": 0.01, **train},
    )
    trainer = Trainer(cfg, strategy, devices)
    if not split:
        trainer.graph = trainer.make_update_graph(trainer.cfg.train.jit_compile, split=False)
    return trainer


@pytest.mark.parametrize("optimizer,k,precision", [
    ("sgd", 1, "float32"), ("adam", 1, "float32"), ("adam", 4, "float32"),
    ("adam", 1, "mixed_float16"),  # a LossScaleOptimizer: its inner optimizer's too
])
def test_weights_after_n_updates_equal_the_fused_paths(
    strategy: Any, devices: Any, optimizer: str, k: int, precision: str
) -> None:
    import keras

    try:
        fused = _trainer(strategy, devices, split=False, optimizer=optimizer,
                         accumulation_steps=k, mixed_precision=precision)
        assert not fused.graph.split
        start = [np.array(w) for w in fused.model.get_weights()]
        fused_steps = fused.run_updates(1) + fused.run_updates(5)
        split = _trainer(strategy, devices, optimizer=optimizer, accumulation_steps=k,
                         mixed_precision=precision)
        assert split.graph.split
        split.model.set_weights(start)
        split_steps = split.run_updates(1) + split.run_updates(5)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert [s.sync_ms for s in fused_steps] == [None] * 6  # not timed apart: not shown
    assert all(s.sync_ms is not None for s in split_steps)
    moved = False
    for before, a, b in zip(start, fused.model.get_weights(), split.model.get_weights(),
                            strict=True):
        # The same sum in the same order: equal but for float rounding.
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)
        moved = moved or not np.allclose(a, before)
    assert moved, "the updates did not change the weights; the comparison proves nothing"
    assert int(split.optimizer.iterations.numpy()) == int(fused.optimizer.iterations.numpy())


@pytest.mark.parametrize("spe,k", [(1, 1), (4, 1), (1, 3), (3, 2), (2, 20)])
def test_the_parts_fit_in_every_step(strategy: Any, devices: Any, spe: int, k: int) -> None:
    # k = 20 runs the micro-steps in a tf.while loop (above UNROLL_MICRO_STEPS).
    trainer = _trainer(strategy, devices, steps_per_execution=spe, accumulation_steps=k,
                       global_batch_size=2 * k * 8)
    steps = [s for _ in range(3) for s in trainer.run_updates(spe)]
    assert len(steps) == 3 * spe
    assert_breakdown_sums(steps)
    assert all(s.sync_ms > 0 and s.update_ms > 0 and s.compute_ms > 0 for s in steps)


def _all_reduce_alone(strategy: Any, shapes: list[tuple[int, ...]]) -> Callable[[], float]:
    """The same all-reduce (the gradients' shapes, one SUM over the replicas), timed in
    the graph the way the update graph times its own: from the last replica's tensors in
    hand to the last replica's reduced tensors in hand. Traced here; each call runs it
    once and gives its time (ms)."""
    import tensorflow as tf

    def replica() -> Any:
        ctx = tf.distribute.get_replica_context()
        # Random, so nothing folds the sum into a constant before it runs.
        tensors = [tf.random.uniform(shape) for shape in shapes]
        with tf.control_dependencies(tensors):
            ready = tf.timestamp()
        with tf.control_dependencies([ready]):
            tensors = [tf.identity(t) for t in tensors]
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tensors)
        with tf.control_dependencies(reduced):
            done = tf.timestamp()
        # Every sum returned and fetched, as the update uses every reduced gradient: a
        # sum nothing reads is pruned from the graph, its all-reduce with it.
        return ready, done, tf.add_n([tf.reduce_sum(r) for r in reduced])

    @tf.function
    def once() -> Any:
        ready, done, reduced = strategy.run(replica)
        latest = [tf.reduce_max(tf.stack(strategy.experimental_local_results(x)))
                  for x in (ready, done)]
        used = tf.add_n(strategy.experimental_local_results(reduced))
        return (latest[1] - latest[0]) * 1000.0, used

    once()  # trace
    return lambda: float(once()[0])


def _spread(values: list[float]) -> float:
    """p90 - p10."""
    deciles = statistics.quantiles(values, n=10)
    return deciles[-1] - deciles[0]


def _quartile(values: list[float]) -> float:
    """The lower quartile: on a shared box, contention only adds time, so the low end of
    the spread is the figure's own cost."""
    return statistics.quantiles(values, n=4)[0]


@pytest.fixture
def two_widths(strategy: Any, devices: Any) -> list[Any]:
    """Two trainers whose gradients differ 4x in bytes, built, traced and warmed up here:
    set-up, beside other tests, so the `alone` body only measures."""
    from trainer_runtime.loop import Trainer

    # A small batch keeps compute small; 2048^2 vs 4096^2 hidden weights: 4.0x the bytes.
    trainers = []
    for width in (2048, 4096):
        cfg = make_config(model={"hidden_units": [width, width], "dropout": 0.0},
                          data={"examples": 4096},
                          train={"global_batch_size": 8, "optimizer": "sgd"})
        trainers.append(Trainer(cfg, strategy, devices))
    for trainer in trainers:
        trainer.run_updates(3)
    return trainers


@pytest.fixture
def two_widths_alone(strategy: Any, two_widths: list[Any]) -> list[Callable[[], float]]:
    """Each trainer's all-reduce by itself (_all_reduce_alone), traced in set-up."""
    return [_all_reduce_alone(strategy, [tuple(v.shape) for v in t.model.trainable_variables])
            for t in two_widths]


@pytest.mark.alone
def test_all_reduce_time_is_the_same_all_reduce_alone_and_grows_with_the_bytes(
    two_widths: list[Any], two_widths_alone: list[Callable[[], float]]
) -> None:
    trainers = two_widths
    ratio = trainers[1].param_bytes / trainers[0].param_bytes
    assert 3.9 < ratio < 4.1
    syncs: list[list[float]] = [[], []]
    alone: list[list[float]] = [[], []]
    for _ in range(10):  # in turns, so every figure sees the same machine
        for i, trainer in enumerate(trainers):
            syncs[i] += [s.sync_ms for s in trainer.run_updates(5)]
            alone[i] += [two_widths_alone[i]() for _ in range(5)]
    figures = []
    for i in range(2):
        # Each figure's own spread (p90-p10): the two agree within the larger. The alone's
        # spread alone was once 0.02 ms short when the updates' quartile came out lower
        # (1.24 ms against 1.77 +- 0.51, on a noisy 2-core box).
        spread = max(_spread(alone[i]), _spread(syncs[i]))
        figures.append((_quartile(syncs[i]), _quartile(alone[i]), spread))
    print("all-reduce ms (update, alone, the larger p90-p10):", figures)
    for sync, by_itself, noise in figures:
        assert by_itself - noise <= sync <= by_itself + noise, (sync, by_itself, noise)
    # Four times the bytes: the same all-reduce by itself (the ground truth) takes more
    # time, not out of proportion. In the update it overlaps the backward pass and only
    # the part left over is bracketed: never more than the all-reduce by itself (above),
    # but how much is left over is the overlap's, not the bytes'. With 2x the bytes the
    # updates' quartiles came out 1.48 and 1.52 ms (the alone ones 1.63 and 2.65); under a
    # CPU burner the small model's exposed part fell to 0.13-0.19 ms while the large one's
    # stayed 3.7-4.1; and once (s-2 at 1a29ef1) both were nearly all hidden, the large
    # model's 0.18 ms against the small one's 0.20 (alone 4.79 and 1.37): so the exposed
    # part is not asserted to grow.
    assert 2.0 <= figures[1][1] / figures[0][1] <= 10.0, figures
