"""Model and data factories the tests load by "tests.data.plugins:NAME"."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def tiny_model(input_shape: tuple[int, ...], classes: int, units: int = 8) -> keras.Model:
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(units, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(classes, dtype="float32")(x))


def ramp_dataset(input_context: tf.distribute.InputContext, per_replica_batch_size: int,
                 features: int = 6) -> tf.data.Dataset:
    x = tf.random.stateless_normal([256, features], seed=[1, 2])
    y = tf.cast(x[:, 0] > 0, tf.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(per_replica_batch_size, drop_remainder=True)


def raises(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("boom")


def not_a_model(*args: Any, **kwargs: Any) -> Any:
    return [1, 2]


def guide_model(embed_dim: int = 32) -> keras.Model:
    """Written as the Keras guides write models: no input_shape, no classes parameter."""
    return keras.Sequential([
        keras.layers.Dense(embed_dim, activation="relu"),
        keras.layers.Dense(4, dtype="float32"),
    ])


def _pairs(ids: tf.Tensor, features: int) -> tuple[tf.Tensor, tf.Tensor]:
    x = tf.cast(ids[..., None], tf.float32) * tf.ones([features]) / 1000.0
    return tf.math.sin(x), tf.cast(ids % 4, tf.int32)


def fixed_batch_dataset(ctx: Any, batch_size: int = 32, **_: Any) -> tf.data.Dataset:
    """Ignores the batch it is given: per_replica_batch_size lands in **_."""
    ds = tf.data.Dataset.range(4096).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.batch(batch_size, drop_remainder=True).map(lambda ids: _pairs(ids, 8))


def half_batch_dataset(input_context: Any, per_replica_batch_size: int) -> tf.data.Dataset:
    """Batches of half the size asked for, with no static batch dimension."""
    ds = tf.data.Dataset.range(4096)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(per_replica_batch_size // 2).map(lambda ids: _pairs(ids, 8))


def _recorder(path: str) -> Any:
    def record(ids: Any) -> Any:
        with open(path, "a", encoding="ascii") as fh:
            fh.write(" ".join(str(int(i)) for i in ids) + "\n")
        return ids

    return record


def counting_dataset(input_context: Any, per_replica_batch_size: int,
                     record: str = "", stateful: bool = False) -> tf.data.Dataset:
    """Example ids 0, 1, 2, ... per pipeline; each batch read is appended to `record`.

    A stateful tap makes the pipeline one tf.data cannot checkpoint.
    """
    ds = tf.data.Dataset.range(1 << 30)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    ds = ds.batch(per_replica_batch_size, drop_remainder=True)
    if record:
        path = f"{record}.{input_context.input_pipeline_id}"

        def tap(ids: tf.Tensor) -> tf.Tensor:
            out = tf.numpy_function(_recorder(path), [ids], tf.int64, stateful=stateful)
            out.set_shape(ids.shape)
            return out

        ds = ds.map(tap)
        # The tap records reads; tf.data would otherwise parallelise a stateless map and
        # read ahead of training (those batches come back from the checkpoint, unrecorded).
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        ds = ds.with_options(options)
    return ds.map(lambda ids: _pairs(ids, 8))


def aborting_dataset(input_context: Any, per_replica_batch_size: int,
                     after_batches: int = 30) -> tf.data.Dataset:
    """Reads `after_batches` batches, then the process aborts (SIGABRT), as a C++ CHECK does."""
    import os

    count = {"n": 0}

    def read(ids: Any) -> Any:
        count["n"] += 1
        if count["n"] > after_batches:
            os.abort()
        return ids

    ds = tf.data.Dataset.range(1 << 30).batch(per_replica_batch_size, drop_remainder=True)
    ds = ds.map(lambda ids: tf.ensure_shape(
        tf.numpy_function(read, [ids], tf.int64, stateful=True), [per_replica_batch_size]))
    return ds.map(lambda ids: _pairs(ids, 8))
