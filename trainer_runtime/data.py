"""The input pipeline: a deterministic synthetic dataset whose knobs act for real, or yours.

Built-in data (``data.name: synthetic``): a seeded bank of Gaussian examples labelled by a
fixed random linear "teacher", so the loss really falls. The p-th example trained on is
a pure function of p (docs/internals.md, "Steps and counters"), so the saved position is
all a resume needs, whatever the new batch. Its knobs act on real work: read_latency_ms
(a sleep in a ``tf.numpy_function``, which releases the GIL, so parallel reads and
prefetch overlap it), decode_cost (rounds of a 32x32 matmul per example),
parallel_calls, cache, prefetch (False: no overlap, the distributed iterator's own
buffer off too). Your own data (``data.factory``, the contract in docs/factories.md) is
called once per input pipeline; the runtime repeats it and adds ``data.prefetch``, the
other knobs do not apply. A factory that cannot be imported, raises or returns something
else stops the trainer with exit 2.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from trainer_runtime.factories import FactoryError, call_factory, load_factory
from trainer_runtime.schema import DataConfig

# The bank is bounded so a large input_shape cannot eat the host's memory; the
# epoch still has data.examples examples (indices wrap around the bank).
BANK_BYTES = 64 << 20
# Debugging and tests: append "first_position id id ..." per batch read to this file.
RECORD_IDS_ENV = "GPUWATCH_RECORD_EXAMPLE_IDS"


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


def example_ids(positions: tf.Tensor, examples: int, seed: int, shuffle: bool) -> tf.Tensor:
    """The example id at each position of the built-in data's endless stream.

    Position p is the p-th example the run trains on, counted over all replicas,
    micro-steps and attempts. Epoch e = p // examples is a permutation of all ids,
    seeded by (seed, e) and computed per position (``index_shuffle``), so any
    position can be read without the ones before it: a resume, with the same or
    another batch size, continues at the exact example where the checkpoint was taken.
    """
    index = positions % examples
    if not shuffle:
        return index
    epoch = positions // examples
    # The raw op: tf.random.experimental.index_shuffle pads an [n, 2] seed on the
    # wrong axis (TF 2.21). Seed rows are (seed, epoch, 0).
    seeds = tf.stack([tf.fill(tf.shape(epoch), tf.constant(seed, tf.int64)), epoch,
                      tf.zeros_like(epoch)], axis=1)
    return tf.raw_ops.RandomIndexShuffle(
        index=index, seed=seeds, max_index=tf.constant(examples - 1, tf.int64), rounds=4)


def _recorder(path: str) -> Callable[[Any, Any], Any]:
    def record(first: Any, ids: Any) -> Any:
        line = f"{int(first)} {' '.join(str(int(i)) for i in ids)}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write per batch: lines of two pipelines never mix
        finally:
            os.close(fd)
        return ids

    return record


def synthetic_dataset(cfg: DataConfig, seed: int, input_context: tf.distribute.InputContext,
                      per_replica_batch: int, start_position: int = 0) -> tf.data.Dataset:
    """The built-in per-replica pipeline (endless; the runtime adds prefetch).

    The n-th batch of input pipeline i (of P) holds the examples at positions
    ``start_position + (n * P + i) * per_replica_batch`` onwards: consecutive
    micro-steps of all replicas read consecutive stretches of the stream.
    """
    features_np, labels_np = _bank(cfg, seed)
    rows = features_np.shape[0]
    features = tf.constant(features_np)
    labels = tf.constant(labels_np)
    shape = list(cfg.input_shape)
    pipelines = input_context.num_input_pipelines
    pipeline = input_context.input_pipeline_id
    batch = per_replica_batch
    record_path = os.environ.get(RECORD_IDS_ENV)

    def slow_part(x: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
        # Simulated storage latency and decode work: what `cache` saves after one epoch.
        if cfg.read_latency_ms > 0:
            ids = tf.numpy_function(_sleep_ms(cfg.read_latency_ms), [ids], tf.int64,
                                    stateful=True)
            ids.set_shape([batch])
            x = x + 0.0 * tf.cast(ids[:1, None], x.dtype)
        if cfg.decode_cost > 0:
            # Seeded from the data so constant folding cannot precompute it.
            work = 0.01 * tf.tanh(x[:, :1, None]) + tf.zeros([batch, 32, 32])
            for _ in range(cfg.decode_cost):
                work = tf.tanh(tf.matmul(work, work) + 0.01)
            # Tie the work to the output so no optimiser can prune it; the term is
            # exactly zero because tanh is bounded.
            x = x + 0.0 * tf.reduce_mean(work, axis=[1, 2])[:, None]
        return x

    # Plain graph code (tf.cond where it branches on a tensor): autograph has nothing
    # to convert, and converting it cost each trainer ~0.3 CPU-s at start-up.
    @tf.autograph.experimental.do_not_convert
    def read_batch(n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        first = start_position + (n * pipelines + pipeline) * batch
        ids = example_ids(first + tf.range(batch, dtype=tf.int64), cfg.examples, seed,
                          cfg.shuffle)
        if record_path:
            ids = tf.numpy_function(_recorder(record_path), [first, ids], tf.int64,
                                    stateful=True)
            ids.set_shape([batch])
        rows_index = ids % rows
        x = tf.gather(features, rows_index)
        y = tf.gather(labels, rows_index)
        if cfg.read_latency_ms > 0 or cfg.decode_cost > 0:
            if cfg.cache:
                cached = first >= start_position + cfg.examples
                x = tf.cond(cached, lambda: x, lambda: slow_part(x, ids))
            else:
                x = slow_part(x, ids)
        return tf.reshape(x, [batch, *shape]), y

    # Batch numbers with an infinite cardinality, which tf.distribute sees: under
    # MultiWorkerMirroredStrategy a finite dataset makes every next() an all-reduce
    # across workers ("has every worker a batch?"), and one worker's slow input
    # would show up as every worker's input wait.
    ds = tf.data.Dataset.counter(dtype=tf.int64)
    calls = tf.data.AUTOTUNE if cfg.parallel_calls == "autotune" else int(cfg.parallel_calls)
    return (ds.map(read_batch) if calls == 1
            else ds.map(read_batch, num_parallel_calls=calls, deterministic=True))


def prefetch_buffer(cfg: DataConfig) -> int | None:
    """tf.data prefetch buffer for the knob; None means no prefetch at all."""
    if cfg.prefetch is False:
        return None
    if cfg.prefetch is True or cfg.prefetch == "autotune":
        return tf.data.AUTOTUNE
    return int(cfg.prefetch)


DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

def make_dataset_fn(cfg: DataConfig, seed: int, per_replica_batch: int,
                    start_position: int = 0) -> DatasetFn:
    """The function handed to ``strategy.distribute_datasets_from_function``.

    ``start_position`` is where the built-in stream starts (examples already
    trained on); a factory dataset always starts at its beginning.
    """
    factory = load_factory("data.factory", cfg.factory) if cfg.factory else None

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        if factory is not None:
            assert cfg.factory is not None
            ds = call_factory(
                "data.factory", cfg.factory, factory,
                {"input_context": input_context, "per_replica_batch_size": per_replica_batch},
                cfg.kwargs)
            if not isinstance(ds, tf.data.Dataset):
                raise FactoryError(
                    f"data.factory {cfg.factory!r} returned {type(ds).__name__}, "
                    "expected a tf.data.Dataset of (features, labels)")
            spec = ds.element_spec
            if not (isinstance(spec, tuple) and len(spec) == 2):
                raise FactoryError(
                    f"data.factory {cfg.factory!r} returned a dataset of {spec!r}, "
                    "expected (features, labels) pairs")
            check_static_batch(cfg.factory, spec, per_replica_batch)
            ds = ds.repeat()
        else:
            ds = synthetic_dataset(cfg, seed, input_context, per_replica_batch, start_position)
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


def check_static_batch(spec_text: str, spec: Any, per_replica_batch: int) -> None:
    """FactoryError when the dataset's static batch size is known and is not the one asked for."""
    for part, what in zip(spec, ("features", "labels"), strict=True):
        shape = getattr(part, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            continue
        size = shape[0]
        if size is not None and int(size) != per_replica_batch:
            raise FactoryError(batch_mismatch(spec_text, int(size), per_replica_batch, what))


def batch_mismatch(spec_text: str, got: int, wanted: int, what: str = "batches") -> str:
    return (f"data.factory {spec_text!r} yields {what} of {got} examples per replica, but "
            f"was asked for per_replica_batch_size={wanted} (global batch / (replicas x "
            "accumulation steps)); batch with the size it is given, drop_remainder=True")


def input_options(cfg: DataConfig, device_kind: str,
                  multi_worker: bool = False) -> tf.distribute.InputOptions:
    """Distributed-iterator options that honour the prefetch knob.

    The default (PER_WORKER) distributed iterator is a MultiDeviceIterator with a
    buffer of its own, which overlaps reads with compute even when the dataset
    has no prefetch. PER_REPLICA without fetch-to-device gives each replica its
    own pipeline and no extra buffer: "prefetch off" then means off.
    MultiWorkerMirroredStrategy refuses PER_REPLICA: a cluster worker has one
    pipeline (PER_WORKER), fetched to its GPUs only when prefetch is on.
    """
    if multi_worker:
        return tf.distribute.InputOptions(
            experimental_fetch_to_device=cfg.prefetch_enabled and device_kind == "gpu")
    if cfg.prefetch_enabled and device_kind == "gpu":
        return tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    )
