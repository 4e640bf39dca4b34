"""Model factories for fault tests; imported by the trainer process, never by gpuwatch."""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf


class _FailAfter(keras.layers.Layer):
    """Passes its input through, then raises inside the running graph after N steps."""

    def __init__(self, fail_after_calls: int, error: type[Exception] = RuntimeError,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_after_calls = fail_after_calls
        self.error = error
        self.calls = 0

    def call(self, x: tf.Tensor) -> tf.Tensor:
        def check(value: tf.Tensor) -> tf.Tensor:
            self.calls += 1
            if self.calls > self.fail_after_calls:
                raise self.error(f"deliberate failure after {self.fail_after_calls} calls")
            return value

        out = tf.py_function(check, [x], x.dtype)
        out.set_shape(x.shape)
        return out


def model_that_fails_after(
    input_shape: tuple[int, ...], classes: int, fail_after_steps: int = 20, replicas: int = 2
) -> keras.Model:
    """A small MLP that trains for `fail_after_steps` optimizer steps, then raises."""
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = _FailAfter(fail_after_steps * replicas)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def model_that_runs_out_of_memory(
    input_shape: tuple[int, ...], classes: int, after_steps: int = 10, replicas: int = 2
) -> keras.Model:
    """A small MLP whose graph raises MemoryError after `after_steps` optimizer steps."""
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = _FailAfter(after_steps * replicas, error=MemoryError)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs)


def model_that_fails_with_replicas(
    input_shape: tuple[int, ...], classes: int, fail_at_replicas: int = 2, after_steps: int = 8
) -> keras.Model:
    """A small MLP that trains, but raises after `after_steps` steps when it is built under a
    strategy of `fail_at_replicas` replicas (a scaling probe's count that crashes)."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(32, activation="relu")(inputs)
    if replicas == fail_at_replicas:
        x = _FailAfter(after_steps * replicas)(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs)


class _Sleep(keras.layers.Layer):
    """Passes its input through after sleeping `seconds` on the host, once the input is in
    hand: compute of a known length, whatever the machine's speed (time.sleep releases the
    GIL, so the input pipeline's threads run on meanwhile, as they would beside a GPU)."""

    def __init__(self, seconds: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = seconds

    def call(self, x: tf.Tensor) -> tf.Tensor:
        def sleep() -> tf.Tensor:
            time.sleep(self.seconds)
            return tf.constant(0.0)

        with tf.control_dependencies([x]):
            slept = tf.py_function(sleep, [], tf.float32)
        with tf.control_dependencies([slept]):
            return tf.identity(x)


def model_with_compute_ms(
    input_shape: tuple[int, ...], classes: int, compute_ms: float = 20.0
) -> keras.Model:
    """A small MLP whose forward pass takes at least `compute_ms` (a host sleep): the
    input tests' compute longer, or shorter, than an injected read by construction."""
    inputs = keras.Input(shape=input_shape)
    x = _Sleep(compute_ms / 1000.0)(inputs)
    x = keras.layers.Dense(32, activation="relu")(x)
    outputs = keras.layers.Dense(classes, dtype="float32")(x)
    return keras.Model(inputs, outputs)
