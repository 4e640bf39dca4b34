"""The input pipeline: a deterministic synthetic dataset whose knobs act for real, or yours.

Built-in data (``data.name: synthetic``)
    A fixed bank of Gaussian examples (seeded) labelled by a fixed random linear
    "teacher", so the task is learnable and the loss really falls. Per replica the
    pipeline is: batch ids -> shard -> shuffle -> read (gather from the
    bank, plus the knobs below) -> cache -> repeat -> prefetch.

    Knobs (all act on real work, none is cosmetic):
      read_latency_ms  simulated storage latency per batch read: ``time.sleep`` in a
                       ``tf.numpy_function``, which releases the GIL, so parallel
                       reads and prefetch really overlap it.
      decode_cost      CPU work per example (that many rounds of a 32x32 matmul).
      parallel_calls   num_parallel_calls of the read map (1 = serial reads).
      cache            cache read batches after the first epoch (skips the latency).
      prefetch         False: no overlap at all (the runtime also turns off the
                       distributed iterator's own buffer); True/"autotune": AUTOTUNE;
                       an int: that many batches.

Your own data (``data.factory: "pkg.module:make_dataset"`` + ``data.kwargs``)
    The factory is called once per input pipeline, before training starts::

        make_dataset(input_context: tf.distribute.InputContext,
                     per_replica_batch_size: int, **data.kwargs) -> tf.data.Dataset

    It must return a ``tf.data.Dataset`` whose elements are ``(features, labels)``
    already batched to ``per_replica_batch_size`` (use ``drop_remainder=True``),
    and should shard with ``input_context`` (``ds.shard(input_context.num_input_pipelines,
    input_context.input_pipeline_id)``). Labels are integer class ids in
    ``[0, data.classes)``. The runtime repeats it (so a finite dataset is fine;
    its cardinality, when known, defines an epoch) and adds ``data.prefetch``;
    the other built-in knobs (read_latency_ms, decode_cost, parallel_calls, cache)
    do not apply to a factory dataset. A factory that cannot be imported, raises,
    or returns something else stops the trainer before training with exit 2.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from trainer_runtime.factories import FactoryError, load_factory
from trainer_runtime.schema import DataConfig

# The bank is bounded so a large input_shape cannot eat the host's memory; the
# epoch still has data.examples examples (indices wrap around the bank).
BANK_BYTES = 64 << 20


def _bank(cfg: DataConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    dim = int(np.prod(cfg.input_shape))
    rows = max(1, min(cfg.examples, BANK_BYTES // (4 * dim)))
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((rows, dim), dtype=np.float32)
    teacher = rng.standard_normal((dim, cfg.classes), dtype=np.float32)
    labels = np.argmax(features @ teacher, axis=1).astype(np.int32)
    return features, labels


def _sleep_ms(latency_ms: float) -> Callable[[Any], Any]:
    seconds = latency_ms / 1000.0

    def read(token: Any) -> Any:
        time.sleep(seconds)  # releases the GIL: other reads and the trainer run on
        return token

    return read


def synthetic_dataset(cfg: DataConfig, seed: int, input_context: tf.distribute.InputContext,
                      per_replica_batch: int) -> tf.data.Dataset:
    """The built-in per-replica pipeline (before the runtime's repeat/prefetch)."""
    features_np, labels_np = _bank(cfg, seed)
    rows = features_np.shape[0]
    features = tf.constant(features_np)
    labels = tf.constant(labels_np)
    shape = list(cfg.input_shape)

    # Batches are read by batch id: the per-example shuffle is a fixed seeded
    # permutation and only the order of batches reshuffles each epoch. Shuffling
    # and batching single examples costs ~10 us each in tf.data, which on two
    # cores made even a prefetched pipeline the bottleneck.
    batches = max(1, cfg.examples // per_replica_batch)
    rng = np.random.default_rng(seed + 1)
    order = rng.permutation(cfg.examples) if cfg.shuffle else np.arange(cfg.examples)
    batch_rows = tf.constant(
        np.resize(order, batches * per_replica_batch).reshape(batches, per_replica_batch)
        % rows)

    def read_batch(batch_id: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        rows_index = tf.gather(batch_rows, batch_id)
        if cfg.read_latency_ms > 0:
            rows_index = tf.numpy_function(
                _sleep_ms(cfg.read_latency_ms), [rows_index], tf.int64, stateful=True)
            rows_index.set_shape([per_replica_batch])
        x = tf.gather(features, rows_index)
        y = tf.gather(labels, rows_index)
        if cfg.decode_cost > 0:
            # Seeded from the data so constant folding cannot precompute it.
            work = 0.01 * tf.tanh(x[:, :1, None]) + tf.zeros([per_replica_batch, 32, 32])
            for _ in range(cfg.decode_cost):
                work = tf.tanh(tf.matmul(work, work) + 0.01)
            # Tie the work to the output so no optimiser can prune it; the term is
            # exactly zero because tanh is bounded.
            x = x + 0.0 * tf.reduce_mean(work, axis=[1, 2])[:, None]
        return tf.reshape(x, [per_replica_batch, *shape]), y

    ds = tf.data.Dataset.range(batches)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if cfg.shuffle:
        ds = ds.shuffle(batches, seed=seed, reshuffle_each_iteration=True)
    calls = tf.data.AUTOTUNE if cfg.parallel_calls == "autotune" else int(cfg.parallel_calls)
    ds = (ds.map(read_batch) if calls == 1
          else ds.map(read_batch, num_parallel_calls=calls, deterministic=True))
    if cfg.cache:
        ds = ds.cache()
    return ds


def prefetch_buffer(cfg: DataConfig) -> int | None:
    """tf.data prefetch buffer for the knob; None means no prefetch at all."""
    if cfg.prefetch is False:
        return None
    if cfg.prefetch is True or cfg.prefetch == "autotune":
        return tf.data.AUTOTUNE
    return int(cfg.prefetch)


DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


def make_dataset_fn(cfg: DataConfig, seed: int, per_replica_batch: int) -> DatasetFn:
    """The function handed to ``strategy.distribute_datasets_from_function``."""
    factory = load_factory("data.factory", cfg.factory) if cfg.factory else None

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        if factory is not None:
            try:
                ds = factory(input_context, per_replica_batch, **cfg.kwargs)
            except Exception as exc:  # a plug-in may raise anything
                raise FactoryError(
                    f"data.factory {cfg.factory!r} raised {type(exc).__name__}: {exc}") from exc
            if not isinstance(ds, tf.data.Dataset):
                raise FactoryError(
                    f"data.factory {cfg.factory!r} returned {type(ds).__name__}, "
                    "expected a tf.data.Dataset of (features, labels)")
            spec = ds.element_spec
            if not (isinstance(spec, tuple) and len(spec) == 2):
                raise FactoryError(
                    f"data.factory {cfg.factory!r} returned a dataset of {spec!r}, "
                    "expected (features, labels) pairs")
        else:
            ds = synthetic_dataset(cfg, seed, input_context, per_replica_batch)
        ds = ds.repeat()
        buffer = prefetch_buffer(cfg)
        if buffer is not None:
            ds = ds.prefetch(buffer)
        options = tf.data.Options()
        options.deterministic = True
        if buffer is None:
            # tf.data would otherwise inject a prefetch after the last map by
            # itself, and "off" would still overlap reads with compute.
            options.experimental_optimization.inject_prefetch = False
        return ds.with_options(options)

    return dataset_fn


def input_options(cfg: DataConfig, device_kind: str) -> tf.distribute.InputOptions:
    """Distributed-iterator options that honour the prefetch knob.

    The default (PER_WORKER) distributed iterator is a MultiDeviceIterator with a
    buffer of its own, which overlaps reads with compute even when the dataset
    has no prefetch. PER_REPLICA without fetch-to-device gives each replica its
    own pipeline and no extra buffer: "prefetch off" then means off.
    """
    if cfg.prefetch_enabled and device_kind == "gpu":
        return tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )
