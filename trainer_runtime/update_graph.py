"""The distributed update graph: one optimizer update of k micro-steps, as tf.functions.

One update is k micro-steps (train.accumulation_steps): with k > 1 each replica adds its
gradients into replica-local accumulators (``ON_READ``: no cross-replica traffic), then
one apply step all-reduces once and updates once. Losses are scaled by the global batch
of the whole update (all replicas, all micro-steps), so the applied gradient is its mean,
as one big batch's. Several updates may run in one tf.function call; each one's times are
stamped in the graph (``tf.timestamp()``), and the all-reduce is timed apart from the
update by all-reducing here and turning the optimizer's own off (``own_all_reduce``):
still one all-reduce per update. The stamps gate nothing (gating cost about 4 % of the
demo's examples/s). The parts' brackets: docs/internals.md, "Steps and counters".
Everything reported is local to this worker: no collective is added for telemetry.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

# Above this many micro-steps the accumulation loop is a tf.while instead of
# being unrolled in the graph (keeps tracing time bounded).
UNROLL_MICRO_STEPS = 16
# The dtypes of one update's outputs (UpdateGraph._one_update): end timestamp, input
# wait, mean loss, learning rate, examples, compute, all-reduce, update (seconds).
UPDATE_OUTPUTS = (tf.float64, tf.float64, tf.float32, tf.float32, tf.int64, tf.float64,
                  tf.float64, tf.float64)


def _passthrough(grads_and_vars: Any) -> list[Any]:
    return list(grads_and_vars)


def own_all_reduce(optimizer: keras.optimizers.Optimizer, own: bool = True) -> bool:
    """Turn off the optimizer's own all-reduce, so the update graph can run (and time)
    it; whether it could (a Keras whose TF optimizer all-reduces elsewhere: False, and
    the optimizer keeps its own, untimed). ``own=False`` gives the optimizer its
    all-reduce back (the fused path, which the tests compare against).

    Keras 3's TF optimizer all-reduces in ``_all_reduce_sum_gradients`` and has no
    switch for it (Keras 2's ``experimental_aggregate_gradients`` is gone); this sets
    that method on this optimizer instance (and a LossScaleOptimizer's inner one) to
    pass the already reduced gradients through. Idempotent.
    """
    targets = [optimizer]
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        targets.append(inner)
    if not all(callable(getattr(type(t), "_all_reduce_sum_gradients", None)) for t in targets):
        return False
    for target in targets:
        if own:
            target._all_reduce_sum_gradients = _passthrough
        else:
            target.__dict__.pop("_all_reduce_sum_gradients", None)
    return own


class UpdateGraph:
    """Traces and caches the update functions for one model, optimizer and strategy.

    It holds no training state of its own: the model, optimizer and accumulators
    are the Trainer's, made under ``strategy.scope()`` before anything traces.
    """

    def __init__(self, strategy: tf.distribute.MirroredStrategy, model: keras.Model,
                 optimizer: keras.optimizers.Optimizer, accumulators: list[tf.Variable],
                 accumulation_steps: int, global_batch: int, jit_compile: bool,
                 split: bool = True) -> None:
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.accumulators = accumulators
        self.k = accumulation_steps
        self.global_batch = global_batch
        self.replicas = strategy.num_replicas_in_sync
        # This worker's replicas (all of them on one host): losses are local means.
        self.local_replicas = len(strategy.extended.worker_devices)
        # One traced function per kind: a single update, or several in a tf.range loop.
        self._fns: dict[bool, Any] = {}
        # XLA compiles the per-replica forward/backward only: the optimizer's
        # all-reduce is a merge_call, which cannot live inside an XLA cluster.
        self._grads_fn: Any = (tf.function(self._grads_eager, jit_compile=True, autograph=False)
                               if jit_compile else None)
        # The all-reduce runs (and is timed) here, not inside the optimizer; split=False
        # leaves it to the optimizer (the fused path: no all-reduce or update time).
        self.split = own_all_reduce(optimizer, split)

    def function(self, multi: bool) -> Any:
        """The update tf.function: ``fn(iterator)``, or ``fn(iterator, n)`` when `multi`."""
        fn = self._fns.get(multi)
        if fn is None:
            fn = self._fns[multi] = self._make_fn(multi)
        return fn

    def trace_first(self, iterator: Any, steps_per_execution: int) -> Any:
        """Trace now the update function the loop calls first; its concrete function.

        The loop's first call reuses this trace (the same function and signature:
        several updates per call when steps_per_execution > 1).
        """
        multi = steps_per_execution > 1
        fn = self.function(multi)
        if multi:
            return fn.get_concrete_function(iterator, tf.TensorSpec([], tf.int32))
        return fn.get_concrete_function(iterator)

    def concrete_update_fn(self, iterator: Any) -> Any:
        """The traced one-update function (tests count its collectives)."""
        return self.function(False).get_concrete_function(iterator)

    def _replica_loss(self, features: tf.Tensor, labels: tf.Tensor) -> tuple[Any, Any]:
        logits = self.model(features, training=True)
        per_example = keras.losses.sparse_categorical_crossentropy(
            labels, tf.cast(logits, tf.float32), from_logits=True)
        scaled = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch)
        if self.model.losses:
            scaled += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses)) / self.k
        return scaled, tf.reduce_mean(per_example)

    def _grads(self, features: tf.Tensor, labels: tf.Tensor) -> tuple[list[Any], Any]:
        if self._grads_fn is not None:
            return self._grads_fn(features, labels)  # type: ignore[no-any-return]
        return self._grads_eager(features, labels)

    def _grads_eager(self, features: tf.Tensor, labels: tf.Tensor) -> tuple[list[Any], Any]:
        with tf.GradientTape() as tape:
            scaled, mean_loss = self._replica_loss(features, labels)
            if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
                scaled = self.optimizer.scale_loss(scaled)
        grads = tape.gradient(scaled, self.model.trainable_variables)
        return grads, mean_loss

    def _probe(self) -> tf.Tensor:
        # Reads of the updated variables: auto control deps order them after the
        # writes, so a timestamp that depends on this marks the end of the update.
        return tf.add_n([tf.reduce_sum(tf.reshape(tf.cast(v, tf.float32), [-1])[:1])
                         for v in self.model.trainable_variables])

    @staticmethod
    def _gate(features: Any, labels: Any, after: tf.Tensor) -> tuple[Any, Any]:
        # MirroredStrategy traces each replica in its own thread, where the
        # caller's tf.control_dependencies context does not reach; gate the
        # inputs explicitly so no replica computes before the whole batch has
        # arrived (otherwise one replica's compute delays the other's read and
        # shows up as input wait).
        with tf.control_dependencies([after]):
            return tf.identity(features), tf.identity(labels)

    def _timed_grads(self, features: tf.Tensor, labels: tf.Tensor
                     ) -> tuple[list[Any], Any, tf.Tensor, tf.Tensor]:
        """Gradients, mean loss, seconds from the batch in hand to the gradients ready,
        and the timestamp of that."""
        with tf.control_dependencies([features, labels]):
            t_in = tf.timestamp()
        with tf.control_dependencies([t_in]):
            features, labels = tf.identity(features), tf.identity(labels)
        grads, mean_loss = self._grads(features, labels)
        # Depends on the gradients only: it fires before the all-reduce they feed.
        with tf.control_dependencies([g for g in grads if g is not None] + [mean_loss]):
            t_ready = tf.timestamp()
        return grads, mean_loss, t_ready - t_in, t_ready

    def _all_reduce(self, grads: list[Any], ready: tf.Tensor) -> tuple[list[Any], tf.Tensor]:
        """This replica's gradients summed over every replica (one all-reduce, started
        after `ready`), and the timestamp of the reduced gradients in hand. Without
        ``split`` the gradients go back as they are (the optimizer all-reduces them)."""
        if not self.split:
            return grads, ready
        present = [g for g in grads if g is not None]
        reduced = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, present)
        # Stamps only: no op waits for them, so the all-reduce of the first gradients
        # may overlap the last ones' backward, and the update the last all-reduce, as
        # they would unwatched; each bracket holds the part not overlapped.
        with tf.control_dependencies([*reduced, ready]):
            t_reduced = tf.timestamp()
        gated = iter(reduced)
        return [None if g is None else next(gated) for g in grads], t_reduced

    def _apply_step(self, features: tf.Tensor, labels: tf.Tensor,
                    after: tf.Tensor) -> tuple[Any, ...]:
        features, labels = self._gate(features, labels, after)
        grads, mean_loss, compute, ready = self._timed_grads(features, labels)
        reduced, t_reduced = self._all_reduce(grads, ready)
        self.optimizer.apply_gradients(
            zip(reduced, self.model.trainable_variables, strict=True))
        return mean_loss, self._probe(), compute, ready, t_reduced

    def _accumulate(self, features: tf.Tensor, labels: tf.Tensor,
                    after: tf.Tensor) -> tuple[Any, Any]:
        features, labels = self._gate(features, labels, after)
        grads, mean_loss, compute, _ = self._timed_grads(features, labels)
        writes = [acc.assign_add(g) for acc, g in zip(self.accumulators, grads, strict=True)]
        with tf.control_dependencies(writes):
            return tf.identity(mean_loss), tf.identity(compute)

    def _apply_accumulated(self, after: tf.Tensor) -> tuple[Any, Any, Any]:
        with tf.control_dependencies([after]):
            grads = [tf.identity(acc.read_value()) for acc in self.accumulators]
        with tf.control_dependencies(grads):
            ready = tf.timestamp()
        reduced, t_reduced = self._all_reduce(grads, ready)
        self.optimizer.apply_gradients(
            zip(reduced, self.model.trainable_variables, strict=True))
        probe = self._probe()
        with tf.control_dependencies([probe]):
            resets = [acc.assign(tf.zeros_like(acc)) for acc in self.accumulators]
        with tf.control_dependencies(resets):
            return tf.identity(probe), ready, t_reduced

    def _local_sum(self, per_replica: Any) -> tf.Tensor:
        # Local reads, not strategy.reduce: the loss must not add a collective.
        return tf.add_n([tf.cast(t, tf.float32)
                         for t in self.strategy.experimental_local_results(per_replica)])

    def _local_max(self, per_replica: Any) -> tf.Tensor:
        parts = self.strategy.experimental_local_results(per_replica)
        return tf.reduce_max(tf.stack([tf.cast(t, tf.float64) for t in parts]))

    def _one_update(self, iterator: Any, after: tf.Tensor) -> tuple[Any, ...]:
        """(end timestamp, input wait s, mean loss, lr, examples, compute s, all-reduce s,
        update s) for one update.

        Loss and examples are this worker's (a mean over its local replicas); compute
        is the slowest local replica's, summed over micro-steps; the all-reduce runs from
        the last local replica's gradients ready to the last one's reduced gradients in
        hand, the update from there to the end.
        """
        lr = tf.cast(self.optimizer.learning_rate, tf.float32)
        wait = tf.constant(0.0, tf.float64)
        compute = tf.constant(0.0, tf.float64)
        loss_sum = tf.constant(0.0, tf.float32)
        examples = tf.constant(0, tf.int64)
        dep = after
        if self.k == 1:
            batch, t0, t1, examples = self._timed_next(iterator, dep)
            with tf.control_dependencies([t1]):
                loss, probe, seconds, ready, reduced = self.strategy.run(
                    self._apply_step, args=(*batch, t1))
            wait += t1 - t0
            compute += self._local_max(seconds)
            loss_sum += self._local_sum(loss)
            dep = self._local_sum(probe)
        else:
            def micro(dep: tf.Tensor) -> tuple[Any, Any, Any, Any, Any]:
                batch, t0, t1, count = self._timed_next(iterator, dep)
                with tf.control_dependencies([t1]):
                    loss, seconds = self.strategy.run(self._accumulate, args=(*batch, t1))
                local = self._local_sum(loss)
                return t1 - t0, local, local, count, self._local_max(seconds)

            if self.k <= UNROLL_MICRO_STEPS:
                for _ in range(self.k):
                    w, loss_local, dep, count, c = micro(dep)
                    wait += w
                    loss_sum += loss_local
                    examples += count
                    compute += c
            else:
                def body(i: Any, wait: Any, loss_sum: Any, examples: Any, compute: Any,
                         dep: Any) -> Any:
                    w, loss_local, dep, count, c = micro(dep)
                    return (i + 1, wait + w, loss_sum + loss_local, examples + count,
                            compute + c, dep)

                _, wait, loss_sum, examples, compute, dep = tf.while_loop(
                    lambda i, *_: i < self.k, body,
                    (tf.constant(0), wait, loss_sum, examples, compute,
                     tf.cast(dep, tf.float32)))
            with tf.control_dependencies([dep]):
                probe, ready, reduced = self.strategy.run(
                    self._apply_accumulated, args=(tf.identity(dep),))
            dep = self._local_sum(probe)
        t_ready, t_reduced = self._local_max(ready), self._local_max(reduced)
        with tf.control_dependencies([dep, t_reduced]):
            t_end = tf.timestamp()
        sync, update = t_reduced - t_ready, t_end - t_reduced
        mean_loss = loss_sum / float(self.local_replicas * self.k)
        return t_end, wait, mean_loss, lr, examples, compute, sync, update

    def _timed_next(self, iterator: Any, after: tf.Tensor
                    ) -> tuple[Any, tf.Tensor, tf.Tensor, tf.Tensor]:
        """The next batch, the host time spent waiting for it, and its examples (local replicas)."""
        with tf.control_dependencies([after]):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            batch = next(iterator)
        with tf.control_dependencies(self._flat(batch)):
            t1 = tf.timestamp()
        examples = tf.add_n([tf.shape(part, out_type=tf.int64)[0]
                             for part in self.strategy.experimental_local_results(batch[0])])
        return batch, t0, t1, examples

    def _flat(self, batch: Any) -> list[tf.Tensor]:
        out: list[tf.Tensor] = []
        for part in tf.nest.flatten(batch):
            out.extend(self.strategy.experimental_local_results(part))
        return out

    def _make_fn(self, multi: bool) -> Any:
        if not multi:
            @tf.function(autograph=False)
            def run_one(iterator: Any) -> Any:
                return tuple(tf.reshape(out, [1])
                             for out in self._one_update(iterator, tf.constant(0.0)))
            return run_one

        @tf.function(autograph=False)
        def run_many(iterator: Any, n: tf.Tensor) -> Any:
            # One array per output of _one_update, in its order.
            arrays = tuple(tf.TensorArray(dtype, size=n) for dtype in UPDATE_OUTPUTS)

            def body(i: Any, dep: Any, arrays: Any) -> Any:
                outs = self._one_update(iterator, dep)
                arrays = tuple(a.write(i, out) for a, out in zip(arrays, outs, strict=True))
                return i + 1, tf.cast(outs[0], tf.float32), arrays

            _, _, arrays = tf.while_loop(lambda i, *_: i < n, body,
                                         (tf.constant(0), tf.constant(0.0), arrays))
            return tuple(a.stack() for a in arrays)
        return run_many
