"""Model and data factories the tests load by "tests.trainer.plugins:NAME"."""

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
