"""Several workers under MultiWorkerMirroredStrategy: the cluster spec, the strategy, agreements.

The supervisor starts one trainer per worker and hands each its ``TF_CONFIG``
(under every launcher). A trainer started under Slurm with none (one srun task per
worker, no supervisor) gets it from TensorFlow's own ``SlurmClusterResolver``, which
turns the step's environment (``SLURM_PROCID``, ``SLURM_STEP_NODELIST``, ...) into the
same thing. Either way the worker checks the cluster against the run config and
its ``--worker`` index before TensorFlow starts, so a bad launch is one config
error, not a traceback or a hang.

Workers must run the same collectives in the same order, or the others block
in them until ``cluster.timeout_s``. ``Agreement`` is the one small collective
the runtime adds outside the update: a SUM over workers, used to agree on
stopping and on applying live settings (at an execution boundary) and on the
step to resume from.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from trainer_runtime.schema import ClusterConfig

log = logging.getLogger("trainer_runtime")

SLURM_PORT_BASE = 8888


class ClusterError(ValueError):
    """The launch does not describe this worker of this cluster (exit 2, kind config)."""


@contextlib.contextmanager
def _slurm_environ(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ with exactly the SLURM_* variables of `env`, restored afterwards.

    TensorFlow's resolver reads os.environ only.
    """
    saved = dict(os.environ)
    try:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            del os.environ[key]
        os.environ.update({k: v for k, v in env.items() if k.startswith("SLURM_")})
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def tf_config_from_slurm(env: Mapping[str, str], port_base: int = SLURM_PORT_BASE,
                         gpus: int = 0) -> dict[str, Any]:
    """TF_CONFIG for this Slurm task, from TensorFlow's real ``SlurmClusterResolver``.

    `gpus` is the count of GPUs this process sees. The resolver would otherwise ask
    nvidia-smi, and with no GPU it places no task at all; so a CPU node counts one
    device slot per task, and the resolver never sets CUDA_VISIBLE_DEVICES (TensorFlow
    has already seen the GPUs by now; each task uses every GPU it was given).
    """
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        SlurmClusterResolver,
        expand_tasks_per_node,
    )

    # A copy: the trainer passes os.environ itself, which _slurm_environ empties of
    # SLURM_* before it puts env's back.
    env = dict(env)
    try:
        with _slurm_environ(env):
            tasks_per_node = max(expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"]))
            slots = max(gpus, tasks_per_node)
            resolver = SlurmClusterResolver(
                port_base=port_base, gpus_per_node=slots,
                gpus_per_task=max(1, slots // tasks_per_node), auto_set_gpu=False)
            spec = resolver.cluster_spec().as_dict()
            task_type, task_id = resolver.get_task_info()
    except KeyError as exc:
        raise ClusterError(f"launcher slurm: {exc.args[0]} is not set") from None
    except (RuntimeError, ValueError, AssertionError) as exc:
        raise ClusterError(f"launcher slurm: cannot resolve the cluster "
                           f"({' '.join(str(exc).split())[:300]})") from None
    if task_type is None or task_id is None:
        raise ClusterError("launcher slurm: SLURM_PROCID is outside the step's tasks")
    return {"cluster": spec, "task": {"type": task_type, "index": int(task_id)}}


def check_tf_config(text: str | None, cluster: ClusterConfig, worker: int) -> dict[str, Any]:
    """The parsed TF_CONFIG when it describes worker `worker` of `cluster`; else ClusterError."""
    if not text:
        raise ClusterError(f"the config has a cluster: section but TF_CONFIG is not set "
                           f"(worker {worker}); the supervisor sets it for each worker")
    try:
        tf_config = json.loads(text)
    except ValueError as exc:
        raise ClusterError(f"TF_CONFIG is not JSON ({exc})") from None
    spec = tf_config.get("cluster") if isinstance(tf_config, dict) else None
    task = tf_config.get("task") if isinstance(tf_config, dict) else None
    hosts = spec.get("worker") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(hosts, list) or not hosts or not all(
            isinstance(h, str) and ":" in h for h in hosts):
        raise ClusterError('TF_CONFIG needs "cluster": {"worker": ["host:port", ...]}')
    extra = sorted(set(spec) - {"worker"})
    if extra:
        raise ClusterError(f"TF_CONFIG names jobs {extra}: only worker tasks are run "
                           "(worker 0 is the chief)")
    if not isinstance(task, dict) or task.get("type") != "worker":
        raise ClusterError('TF_CONFIG needs "task": {"type": "worker", "index": I}')
    index = task.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ClusterError(f"TF_CONFIG task.index {index!r} is not an integer")
    if index != worker:
        raise ClusterError(f"TF_CONFIG says task index {index} but this is --worker {worker}")
    if len(hosts) != cluster.count:
        raise ClusterError(f"TF_CONFIG lists {len(hosts)} workers but cluster.workers has "
                           f"{cluster.count}")
    if not 0 <= index < len(hosts):
        raise ClusterError(f"TF_CONFIG task index {index} is not one of its "
                           f"{len(hosts)} workers")
    return tf_config  # type: ignore[no-any-return]


def resolve_tf_config(cluster: ClusterConfig, worker: int, env: Mapping[str, str],
                      gpus: int) -> dict[str, Any]:
    """Checked TF_CONFIG for this worker (from Slurm's environment under launcher slurm)."""
    text: str | None
    if cluster.launcher == "slurm" and "TF_CONFIG" not in env:
        port_base = cluster.ports[0] if cluster.ports else SLURM_PORT_BASE
        text = json.dumps(tf_config_from_slurm(env, port_base, gpus))
    else:
        text = env.get("TF_CONFIG")
    return check_tf_config(text, cluster, worker)


def communication_options(cluster: ClusterConfig, gpus: int) -> tuple[Any, str]:
    """CommunicationOptions for cluster.collective and timeout_s, and a fallback note."""
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    note = ""
    choice = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[cluster.collective]
    if cluster.collective == "nccl" and not gpus:
        choice = impl.RING
        note = "cluster.collective 'nccl' needs GPUs; using ring on CPU workers"
    return tf.distribute.experimental.CommunicationOptions(
        implementation=choice, timeout_seconds=float(cluster.timeout_s)), note


def make_multiworker_strategy(cluster: ClusterConfig, tf_config: dict[str, Any],
                              gpus: int) -> tuple[Any, str]:
    """The MultiWorkerMirroredStrategy for this worker; call before any other TF op."""
    import tensorflow as tf

    os.environ["TF_CONFIG"] = json.dumps(tf_config)
    options, note = communication_options(cluster, gpus)
    if note:
        log.warning(note)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)
    return strategy, note


class Agreement:
    """A SUM over all workers of one int64 per worker: agreeing without extra telemetry.

    ``any(flag)``: true on every worker when it is true on one. ``chief(value)``:
    the chief's value on every worker. Every worker must make the same calls in the
    same order (they are collectives).
    """

    def __init__(self, strategy: Any) -> None:
        import tensorflow as tf

        self.strategy = strategy

        def replica_sum(value: Any, chief_only: bool) -> Any:
            ctx = tf.distribute.get_replica_context()
            # A copy made on the replica's device: all_reduce finds its destination there.
            value = tf.identity(value)
            if chief_only:
                value = tf.where(tf.equal(ctx.replica_id_in_sync_group, 0), value,
                                 tf.zeros_like(value))
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

        @tf.function(autograph=False)
        def total(value: Any, chief_only: bool) -> Any:
            out = strategy.run(replica_sum, args=(value, chief_only))
            return strategy.experimental_local_results(out)[0]

        self._total = total

    def _sum(self, value: int, chief_only: bool) -> int:
        import tensorflow as tf

        return int(self._total(tf.constant(value, tf.int64), chief_only).numpy())

    def any(self, flag: bool) -> bool:
        return self._sum(1 if flag else 0, False) > 0

    def sums(self, values: list[int]) -> list[int]:
        """Each value summed over the workers, in one collective (a fixed-length vector)."""
        import tensorflow as tf

        out = self._total(tf.constant(values, tf.int64), False).numpy()
        return [int(v) for v in out]

    def chief(self, value: int) -> int:
        return self._sum(value, True)
