"""Probe: what a Keras 3 custom loop keeps under ParameterServerStrategy.

    python bench/probe_pss.py [--steps 200] [--workers 2] [--deadline-s 100]

Not a test, and not something gpuwatch runs: it backs docs/strategies.md. It starts a
real cluster on loopback (this process is the chief and coordinator; 2 workers and 1
parameter server are `tf.distribute.Server`s in subprocesses, each in its own process
group, on free ports), then:

1. schedules --steps training steps of a small Keras 3 MLP with a Keras 3 SGD optimizer
   through `ClusterCoordinator.schedule` (the workers run them concurrently) and reads
   three counters that each step adds 1 to: the optimizer's `iterations`, a Keras `Sum`
   metric and a plain `tf.Variable`;
2. tries a Keras `Embedding` that the strategy's `variable_partitioner` shards in two;
3. tries `model.fit` under the strategy.

Prints `pss: scheduled=N optimizer_iterations=X keras_sum_metric=Y tf_variable=Z`, a
verdict line, a line for each of 2 and 3, and how long it took. What it finds is not a
failure: it exits 0 whatever the counters read, 1 only when the probe itself could not
run (a server did not start, a scheduled step failed, the deadline passed). Every
process it starts is killed (its whole group) on the way out, and a server also exits
when its stdin (a pipe from this process) closes, so none outlives a killed probe.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from bench_multiworker import free_ports  # the bench's own: bench/ is this script's path

PARAMETER_SERVERS = 1
BATCH = 32
FEATURES = 8
SERVER_START_S = 45.0  # importing TensorFlow in three processes on two cores


def serve(job: str, index: int, cluster: dict[str, list[str]]) -> int:
    """A worker or parameter server: serve until our stdin (the probe's pipe) closes."""
    import tensorflow as tf

    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                         protocol="grpc", start=True)
    print("ready", flush=True)
    sys.stdin.buffer.read()  # EOF: the probe ended, however it ended
    os._exit(0)


def _wait_ready(proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
    assert proc.stdout is not None
    if proc.stdout.readline().strip() == b"ready":
        ready.set()


class Servers:
    """The cluster's worker and ps processes; `kill` ends each one's process group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()

    def start(self, cluster: dict[str, list[str]]) -> None:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        for job in ("ps", "worker"):
            for index in range(len(cluster[job])):
                cmd = [sys.executable, os.path.abspath(__file__), "--serve", f"{job}:{index}",
                       "--cluster", json.dumps(cluster)]
                with self._lock:
                    self.procs.append(subprocess.Popen(
                        cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + SERVER_START_S
        for proc in list(self.procs):
            ready = threading.Event()
            threading.Thread(target=_wait_ready, args=(proc, ready), daemon=True).start()
            if not ready.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"server pid {proc.pid} did not start within "
                                   f"{SERVER_START_S:.0f} s (exit code {proc.poll()})")

    def kill(self) -> None:
        with self._lock:
            procs, self.procs = self.procs, []
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def probe(steps: int, cluster: dict[str, list[str]]) -> None:
    import warnings

    import keras
    import numpy as np
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    # Variables of 4 KiB or more are sharded in two: the MLP's (at most 16x16 float32 =
    # 1 KiB) stay whole; the Embedding's (1000x16 float32 = 64 KiB) is split.
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=4096, max_shards=2)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    rng = np.random.default_rng(0)
    features = rng.normal(size=(BATCH, FEATURES)).astype("float32")
    targets = rng.normal(size=(BATCH, 1)).astype("float32")
    tokens = rng.integers(0, 1000, size=(BATCH, 4)).astype("int32")

    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, "relu"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)  # before tracing (FACTS.md)
        keras_sum = keras.metrics.Sum()
        tf_counter = tf.Variable(0, dtype=tf.int64)

    def dataset_fn() -> Any:
        return tf.data.Dataset.from_tensors((features, targets)).repeat()

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step_fn(it: Any) -> Any:
        def replica_fn(batch: Any) -> Any:
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            keras_sum.update_state(1.0)
            tf_counter.assign_add(1)
            return loss

        return strategy.run(replica_fn, args=(next(it),))

    workers = len(cluster["worker"])
    started = time.monotonic()
    for _ in range(steps):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()  # raises if any scheduled step failed
    took = time.monotonic() - started
    iterations = int(optimizer.iterations.numpy())
    summed = float(keras_sum.result().numpy())
    plain = int(tf_counter.numpy())
    print(f"pss: scheduled={steps} optimizer_iterations={iterations} "
          f"keras_sum_metric={summed:g} tf_variable={plain}", flush=True)
    if iterations == steps and summed == steps:
        verdict = "Keras counters kept every update"
    else:
        verdict = (f"Keras counters lost updates: optimizer.iterations kept "
                   f"{iterations}/{steps} ({100 * iterations / steps:.1f}%), Sum metric "
                   f"{summed:g}/{steps}; the tf.Variable kept {plain}/{steps}")
    print(f"verdict: {verdict} ({steps} steps on {workers} worker(s) in {took:.1f} s)",
          flush=True)

    # 2. A sharded Keras Embedding.
    with strategy.scope():
        embedder = keras.Sequential([keras.Input((4,), dtype="int32"),
                                     keras.layers.Embedding(1000, 16),
                                     keras.layers.GlobalAveragePooling1D(),
                                     keras.layers.Dense(1)])
        embed_optimizer = keras.optimizers.SGD(0.01)
        embed_optimizer.build(embedder.trainable_variables)
    table = embedder.layers[0].embeddings.value
    shards = len(getattr(table, "variables", [table]))

    def embed_dataset_fn() -> Any:
        return tf.data.Dataset.from_tensors((tokens, targets)).repeat()

    embed_iterator = iter(coordinator.create_per_worker_dataset(embed_dataset_fn))

    @tf.function
    def embed_step_fn(it: Any) -> Any:
        def replica_fn(batch: Any) -> Any:
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(embedder(x, training=True) - y))
            grads = tape.gradient(loss, embedder.trainable_variables)
            embed_optimizer.apply_gradients(
                zip(grads, embedder.trainable_variables, strict=True))
            return loss

        return strategy.run(replica_fn, args=(next(it),))

    try:
        for _ in range(10):
            coordinator.schedule(embed_step_fn, args=(embed_iterator,))
        coordinator.join()
        print(f"embedding: {type(table).__name__} with {shards} shards trained 10 steps "
              f"(optimizer.iterations={int(embed_optimizer.iterations.numpy())})", flush=True)
    except Exception as error:  # the finding, not a failure of the probe
        print(f"embedding: {type(table).__name__} with {shards} shards fails: "
              f"{first_line(error)}", flush=True)

    # 3. model.fit under the strategy.
    try:
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        dataset = tf.data.Dataset.from_tensors((features, targets)).repeat()
        with warnings.catch_warnings():  # Keras: "shuffle=True ... ignored" for a Dataset
            warnings.simplefilter("ignore", UserWarning)
            model.fit(dataset, epochs=1, steps_per_epoch=5, verbose=0)
        print("fit: model.fit ran 5 steps", flush=True)
    except Exception as error:  # the finding, not a failure of the probe
        print(f"fit: model.fit fails: {first_line(error)}", flush=True)


def first_line(error: BaseException) -> str:
    """The error in one line; a traced function's names its cause and our line it came from."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if not lines[0].startswith("in user code"):
        return f"{type(error).__name__}: {lines[0][:240]}"
    # "in user code:", then `File ... in fn` / source line pairs, then "Type: message".
    ours = [lines[i + 1] for i, line in enumerate(lines[:-1])
            if line.startswith("File ") and os.path.basename(__file__) in line]
    where = f" (at `{ours[-1]}`)" if ours else ""
    return f"{lines[-1][:240]}{where}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2,
                        help="1 is the control: no two steps run at once")
    parser.add_argument("--deadline-s", type=float, default=100.0,
                        help="kill everything and exit 1 after this long")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        job, index = args.serve.split(":")
        return serve(job, int(index), json.loads(args.cluster))

    started = time.monotonic()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ports = free_ports(1 + args.workers + PARAMETER_SERVERS)
    addresses = [f"localhost:{port}" for port in ports]
    cluster = {"chief": addresses[:1], "worker": addresses[1:1 + args.workers],
               "ps": addresses[1 + args.workers:]}
    servers = Servers()

    def on_deadline() -> None:
        # A lost worker makes the coordinator wait for it to come back, not raise.
        print(f"probe_pss: deadline of {args.deadline_s:.0f} s passed; killing the cluster",
              file=sys.stderr, flush=True)
        servers.kill()
        os._exit(1)

    watchdog = threading.Timer(args.deadline_s, on_deadline)
    watchdog.daemon = True
    watchdog.start()
    code = 0
    try:
        servers.start(cluster)
        print(f"cluster: chief (this process) + {args.workers} worker(s) + {PARAMETER_SERVERS} ps "
              f"on loopback, up in {time.monotonic() - started:.1f} s", flush=True)
        probe(args.steps, cluster)
    except Exception as error:
        print(f"probe_pss: failed: {first_line(error)}",
              file=sys.stderr, flush=True)
        code = 1
    finally:
        watchdog.cancel()
        servers.kill()
    print(f"took: {time.monotonic() - started:.1f} s", flush=True)
    # The coordinator's threads would wait for the servers just killed: skip teardown.
    os._exit(code)


if __name__ == "__main__":
    raise SystemExit(main())
