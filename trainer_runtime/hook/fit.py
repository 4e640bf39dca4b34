"""Keras 3 ``fit``, watched: the train function Keras would build, with stamps.

Built as Keras' own TensorFlow trainer builds it (v3.7 to v3.15): an inner function that
runs the model's ``train_step`` under ``strategy.run`` and reduces its logs, and an outer
tf.function that takes up to ``steps_per_execution`` batches with
``get_next_as_optional``. What it adds, outside the jitted inner function, per step: host
stamps before the fetch, with the batch in hand and after the step, and the loss
tracker's total and count, whose changes give the batch's loss and examples. With
steps_per_execution > 1 each batch is fetched after the previous step ends, and an
epoch's last partial execution is trained but not reported (docs/own-scripts.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from keras.src.backend.tensorflow.trainer import reduce_per_replica

from trainer_runtime.flops import step_flops_per_example

if TYPE_CHECKING:
    from trainer_runtime.hook.watching import FitWatch

# Per step, in order: stamp before the fetch, batch in hand, step ended, the loss
# tracker's total and count after the step, the learning rate the step used (-1: none
# readable).
_OUTPUTS = 6


def _loss_sums(model: Any) -> tuple[tf.Tensor, tf.Tensor]:
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is None:
        minus = tf.constant(-1.0, tf.float64)
        return minus, minus
    return (tf.cast(tracker.total.value, tf.float64), tf.cast(tracker.count.value, tf.float64))


def _learning_rate(model: Any) -> tf.Tensor:
    """The optimizer's current learning rate, read in the graph (a schedule's value at
    the optimizer's iterations), or -1 where it cannot be read there."""
    try:
        return tf.cast(model.optimizer.learning_rate, tf.float64)
    except Exception:
        return tf.constant(-1.0, tf.float64)


def _flat(batch: Any) -> list[tf.Tensor]:
    return [x for x in tf.nest.flatten(batch, expand_composites=True) if tf.is_tensor(x)]


def train_function(watch: FitWatch, model: Any) -> Any:
    """The function fit calls with each execution's iterator: it returns the last step's
    logs, as Keras' does, and reports each step to watch."""
    strategy = model.distribute_strategy
    keras_function = model._make_function(model.train_step)  # train_on_batch's inputs

    @tf.autograph.experimental.do_not_convert
    def one_step(data: Any) -> Any:
        outputs = strategy.run(model.train_step, args=(data,))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    if not model.run_eagerly:
        one_step = tf.function(one_step, reduce_retracing=True, jit_compile=model.jit_compile)
    one_step = model._autoconvert_optionals(one_step)

    def stamped(batch: Any, t0: tf.Tensor) -> tuple[Any, tf.Tensor]:
        """One step on a batch in hand: its logs, and its row of stamps and sums."""
        with tf.control_dependencies(_flat(batch)):
            t1 = tf.timestamp()
            lr = _learning_rate(model)  # before the step: the rate it uses
        with tf.control_dependencies([lr]):
            logs = one_step(batch)
        with tf.control_dependencies(tf.nest.flatten(logs)):
            t2 = tf.timestamp()
            total, count = _loss_sums(model)
        return logs, tf.stack([t0, t1, t2, total, count, lr])

    @tf.autograph.experimental.do_not_convert
    def steps(iterator: Any) -> Any:
        # The first step as Keras takes it with steps_per_execution 1 (get_next: at the
        # epoch's end its OutOfRangeError ends the epoch, as Keras' does).
        with tf.control_dependencies([]):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            first = iterator.get_next()
        logs, row = stamped(first, t0)
        spe = int(model.steps_per_execution)
        if spe == 1:
            return logs, tf.expand_dims(row, 0)
        # The others, each fetched once the step before it has ended. A last partial
        # execution (fewer batches left than steps_per_execution) ends at the missing
        # batch: its steps are trained, but neither Keras' callbacks nor this report
        # see them (docs/own-scripts.md).
        rows = tf.TensorArray(tf.float64, size=spe).write(0, row)

        def body(i: tf.Tensor, logs: Any, rows: Any, after: tf.Tensor) -> Any:
            with tf.control_dependencies([after]):
                t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                batch = iterator.get_next()
            logs, row = stamped(batch, t0)
            return i + 1, logs, rows.write(i, row), row[2]

        _, logs, rows, _ = tf.while_loop(
            lambda i, *_: i < spe, body, (tf.constant(1), logs, rows, row[2]))
        return logs, rows.stack()

    if not model.run_eagerly:
        steps = tf.function(steps, reduce_retracing=True)

    reader = _Reader(watch)
    counted: list[bool] = []

    def function(iterator: Any) -> Any:
        if not isinstance(iterator, tf.data.Iterator | tf.distribute.DistributedIterator):
            return keras_function(iterator)
        called = time.time()
        logs, rows = steps(iterator)
        table = rows.numpy()
        if not counted and not model.run_eagerly:  # before the first step is sent
            counted.append(True)
            examples = round(float(table[0][4]))  # the first step's: its tracker count
            watch.flops_per_example = step_flops_per_example(
                steps.get_concrete_function(iterator).graph, examples,
                int(strategy.num_replicas_in_sync), "fit's train function")
        reader.read(iterator, called, table)
        return logs

    return function


class _Reader:
    """Turns each execution's stamps into steps: its time, wait, examples and loss."""

    def __init__(self, watch: FitWatch) -> None:
        self.watch = watch
        self.iterator: Any = None
        self.total = 0.0
        self.count = 0.0
        self.last_end: float | None = None

    def read(self, iterator: Any, called: float, rows: Any) -> None:
        watch = self.watch
        if iterator is not self.iterator:  # a new epoch (fit makes an iterator per epoch)
            if watch.epoch_start is not None:  # a fit's first: its initial_epoch
                watch.epoch, watch.epoch_start = watch.epoch_start, None
            else:
                watch.epoch += 1
            self.iterator = iterator
        # A step begins where the one before it ended, across epochs too: what Keras does
        # between epochs (a new iterator, callbacks, validation) is the job's time, and it
        # lands on the epoch's first step, as a custom loop's own host time does.
        for t0, t1, t2, totals, counts, lr in rows.tolist():  # plain floats: cheap
            examples, loss = 0, None
            if counts >= 0:  # Keras resets the tracker each epoch: sums start over
                total, count = ((self.total, self.count) if counts >= self.count
                                else (0.0, 0.0))
                examples = round(counts - count)
                if examples > 0:
                    loss = (totals - total) / (counts - count)
                self.total, self.count = totals, counts
            start = self.last_end if self.last_end is not None else called
            self.last_end = t2
            watch.report(step_time_ms=max(0.0, (t2 - start) * 1000.0),
                         input_wait_ms=max(0.0, (t1 - t0) * 1000.0),
                         examples=examples, loss=loss, lr=lr if lr >= 0 else None, end=t2,
                         epoch=watch.epoch)


def _host_learning_rate(model: Any) -> float | None:
    try:
        return float(model.optimizer.learning_rate)
    except Exception:
        return None


def with_callback(watch: FitWatch, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """fit's arguments with a per-batch callback added (callbacks is its 6th parameter):
    the fallback outside the tested Keras range."""
    import keras

    class _Steps(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.total = 0.0
            self.count = 0.0
            self.last: float | None = None

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            watch.epoch = epoch
            self.total = self.count = 0.0
            self.last = time.time()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            now = time.time()
            tracker = getattr(model, "_loss_tracker", None)
            loss = examples = None
            if tracker is not None:
                total, count = float(tracker.total.numpy()), float(tracker.count.numpy())
                if count > self.count:
                    loss = (total - self.total) / (count - self.count)
                    examples = round(count - self.count)
                self.total, self.count = total, count
            start = self.last if self.last is not None else now
            self.last = now
            watch.report(step_time_ms=(now - start) * 1000.0, input_wait_ms=None,
                         examples=examples or 0, loss=loss, lr=_host_learning_rate(model),
                         end=now, epoch=watch.epoch)

    callback = _Steps()
    if len(args) >= 6:
        listed = list(args[5] or [])
        args = (*args[:5], [*listed, callback], *args[6:])
    else:
        kwargs = dict(kwargs)
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
    return args, kwargs
