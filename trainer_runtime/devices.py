"""Replica devices and the MirroredStrategy over them: the first N GPUs, else logical CPUs.

How many (``strategy.replicas``; none: every GPU, or ``strategy.cpu_replicas``) is
``schema.replica_count``'s rule. On a box with no GPU the one physical CPU is split
into N logical devices so MirroredStrategy really runs N replicas (tests, CI and
laptops all train this way). With GPUs, the first N are made visible and the others
left alone; asking for more than there are is a ``DeviceShortage`` (a config error).
The split and the visibility must be set before TensorFlow runs any op, so call
``setup_devices`` first thing after importing TensorFlow.

A worker of a cluster (MultiWorkerMirroredStrategy) uses every GPU it sees, or
its one CPU: the strategy ignores logical CPU devices, so on CPU replicas = workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from trainer_runtime.schema import StrategyConfig, gpu_shortage, replica_count

log = logging.getLogger("trainer_runtime")


@dataclass(frozen=True)
class Devices:
    kind: str  # "gpu" | "cpu"
    names: list[str]


def _grow_gpu_memory(gpus: list[Any]) -> None:
    for gpu in gpus:
        try:
            # Without growth TF grabs all memory at start-up, which makes the
            # dashboard's memory column meaningless.
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            pass  # already initialised in this process


class DeviceShortage(ValueError):
    """More GPUs asked for (strategy.replicas) than this host has visible: a config error."""


def setup_devices(strategy: StrategyConfig | int) -> Devices:
    """Make the replica devices visible; idempotent within one process.

    strategy: the config's (an int: that many logical CPU replicas, as the bench asks).
    """
    if isinstance(strategy, int):
        strategy = StrategyConfig(cpu_replicas=strategy)
    gpus = tf.config.list_physical_devices("GPU")
    count = replica_count(strategy, len(gpus))
    if gpus:
        shortage = gpu_shortage(strategy, len(gpus))
        if shortage:
            raise DeviceShortage(shortage)
        used = gpus[:count]
        if len(used) < len(gpus):
            try:
                # The others stay untouched: no memory, no context, no NCCL ring member.
                tf.config.set_visible_devices(used, "GPU")
            except RuntimeError:
                pass  # already initialised in this process: keep its devices, use the first N
        _grow_gpu_memory(used)
        names = [d.name for d in tf.config.list_logical_devices("GPU")]
        return Devices("gpu", names[:count])
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        # Already initialised (a second trainer in the same process, e.g. the
        # bench): keep whatever split exists.
        pass
    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    return Devices("cpu", names[:count] if len(names) >= count else names)


def setup_worker_devices() -> int:
    """A cluster worker's GPUs (memory growth on), counted without starting TensorFlow's runtime.

    The strategy must be created before any op runs, so the worker's device names
    come from it afterwards (``worker_devices``).
    """
    gpus = tf.config.list_physical_devices("GPU")
    _grow_gpu_memory(gpus)
    return len(gpus)


def worker_devices(strategy: Any, gpus: int) -> Devices:
    """This worker's replica devices under a MultiWorkerMirroredStrategy."""
    return Devices("gpu" if gpus else "cpu", list(strategy.extended.worker_devices))


class CountingCrossDeviceOps(tf.distribute.CrossDeviceOps):
    """Delegates to another CrossDeviceOps and counts reductions as they are traced.

    Tests use it to prove that accumulation does one all-reduce per optimizer
    update: the count is taken from what the traced graph actually contains,
    not from what the loop intends.
    """

    def __init__(self, inner: tf.distribute.CrossDeviceOps) -> None:
        super().__init__()
        self.inner = inner
        self.reductions = 0
        self.on_reduce: Callable[[str], None] | None = None

    def _count(self, what: str) -> None:
        self.reductions += 1
        if self.on_reduce is not None:
            self.on_reduce(what)

    def reduce_implementation(self, reduce_op: Any, per_replica_value: Any,
                              destinations: Any, options: Any) -> Any:
        self._count("reduce")
        return self.inner.reduce_implementation(
            reduce_op, per_replica_value, destinations, options)

    def batch_reduce_implementation(self, reduce_op: Any, value_destination_pairs: Any,
                                    options: Any) -> Any:
        self._count("batch_reduce")
        return self.inner.batch_reduce_implementation(reduce_op, value_destination_pairs, options)

    def broadcast_implementation(self, tensor: Any, destinations: Any) -> Any:
        return self.inner.broadcast_implementation(tensor, destinations)


def cross_device_ops_for(choice: str, kind: str) -> tuple[tf.distribute.CrossDeviceOps | None, str]:
    """The CrossDeviceOps for a config choice, and a note when it had to fall back."""
    if choice == "reduce_to_one":
        return tf.distribute.ReductionToOneDevice(), ""
    if kind != "gpu":
        note = ""
        if choice in ("nccl", "hierarchical_copy"):
            note = (f"strategy.cross_device_ops {choice!r} needs GPUs; "
                    "using reduce_to_one on CPU replicas")
        # "auto" on CPU would pick the same, but say so explicitly so the
        # counting wrapper has something to wrap.
        return tf.distribute.ReductionToOneDevice(), note
    if choice == "nccl":
        return tf.distribute.NcclAllReduce(), ""
    if choice == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce(), ""
    return None, ""  # auto on GPUs: let TF choose (NCCL when it can)


def make_strategy(devices: Devices, cross_device_ops: str,
                  count_reductions: bool = False) -> tuple[tf.distribute.MirroredStrategy, str]:
    ops, note = cross_device_ops_for(cross_device_ops, devices.kind)
    if note:
        log.warning(note)
    if count_reductions:
        ops = CountingCrossDeviceOps(ops or tf.distribute.ReductionToOneDevice())
    return tf.distribute.MirroredStrategy(devices=devices.names, cross_device_ops=ops), note
