"""A config against the devices it will run on: the replicas it expects, the GPUs it asks for,
and whether the global batch splits over the replicas."""

from __future__ import annotations

from gpuwatch.config.errors import ConfigError
from trainer_runtime.schema import (
    RunConfig,
    divisibility_error,
    gpu_shortage,
    replica_count,
)


def check_replicas(config: RunConfig, replicas: int, source: str) -> None:
    """ConfigError if the global batch cannot split over replicas x accumulation steps."""
    if replicas < 1:
        raise ConfigError(
            f"{source}: replicas must be at least 1 (got {replicas})",
            source=source,
            problem=f"replicas must be at least 1 (got {replicas})",
        )
    problem = divisibility_error(config, replicas)
    if problem is not None:
        raise ConfigError(
            f"{source}: {problem}",
            source=source,
            key="train.global_batch_size",
            problem=problem,
            keys=("train.global_batch_size", "train.accumulation_steps"),
        )


def visible_gpus() -> int:
    """The NVIDIA GPUs the trainer will see, counted by gpuwatch.sampling (the one part of
    gpuwatch that talks to NVML): NVML's devices narrowed by CUDA_VISIBLE_DEVICES; any NVML
    failure counts as none."""
    from gpuwatch.sampling import visible_gpu_count  # lazily: psutil and NVML only when asked

    return visible_gpu_count()


def expected_replicas(config: RunConfig, gpus: int | None = None) -> int:
    """How many replicas the trainer will run (schema.replica_count): strategy.replicas, else
    the visible GPUs, else the CPU replicas. gpus: the visible GPUs (None: count them).

    A cluster (MultiWorkerMirroredStrategy) runs one CPU replica per worker, or each
    worker's GPUs, counted as this host's (every host is taken to have as many).
    """
    gpus = visible_gpus() if gpus is None else gpus
    if config.cluster is not None:
        return config.cluster.count * max(gpus, 1)
    return replica_count(config.strategy, gpus)


def check_devices(config: RunConfig, source: str, gpus: int | None = None) -> None:
    """ConfigError, naming strategy.replicas, if it asks for more GPUs than are visible
    (gpus: the visible GPUs; None: count them). The trainer refuses the same (devices.py)."""
    problem = gpu_shortage(config.strategy, visible_gpus() if gpus is None else gpus)
    if problem is not None:
        words = problem.removeprefix("strategy.replicas: ")
        raise ConfigError(
            f"{source}: {problem}", source=source, key="strategy.replicas", problem=words
        )
