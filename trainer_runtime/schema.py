"""The run configuration's typed schema (pydantic v2), shared by gpuwatch and the trainer.

No TensorFlow here: gpuwatch validates a config with these models before any
process starts, and the trainer re-validates the JSON it is handed.
Every model forbids unknown keys so a typo is an error, not a silent default.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_factory(value: str | None) -> str | None:
    if value is not None and not FACTORY_RE.match(value):
        raise ValueError(f"factory must look like 'package.module:function', got {value!r}")
    return value


class ModelConfig(_Strict):
    """Which network to train: a built-in by name, or your own factory."""

    name: Literal["mlp", "convnet", "resnet"] = "mlp"
    hidden_units: list[Annotated[int, Field(gt=0)]] = Field(default_factory=lambda: [512, 512])
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    factory: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str | None) -> str | None:
        return _check_factory(value)


class DataConfig(_Strict):
    """The input pipeline and its knobs."""

    name: Literal["synthetic"] = "synthetic"
    examples: Annotated[int, Field(gt=0)] = 16384
    input_shape: list[Annotated[int, Field(gt=0)]] = Field(default_factory=lambda: [784])
    classes: Annotated[int, Field(ge=2)] = 10
    # Simulated storage latency per batch read, in milliseconds (releases the GIL).
    read_latency_ms: Annotated[float, Field(ge=0.0)] = 0.0
    # Extra CPU work per example (matrix ops in the map function); 0 = none.
    decode_cost: Annotated[int, Field(ge=0)] = 0
    # off: no overlap at all; on/autotune: tf.data.AUTOTUNE; an int: that many batches.
    prefetch: bool | Literal["autotune"] | Annotated[int, Field(ge=1)] = False
    # 1: serial reads; an int > 1: that many parallel calls; "autotune".
    parallel_calls: Literal["autotune"] | Annotated[int, Field(ge=1)] = 1
    cache: bool = False
    shuffle: bool = True
    factory: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str | None) -> str | None:
        return _check_factory(value)

    @field_validator("prefetch", mode="before")
    @classmethod
    def _prefetch_words(cls, value: Any) -> Any:
        # YAML reads `on`/`off` as booleans already; accept the words from --set too.
        if isinstance(value, str):
            word = value.strip().lower()
            if word in ("on", "true", "yes"):
                return True
            if word in ("off", "false", "no", "none", "0"):
                return False
            if word == "auto":
                return "autotune"
            if word.isdigit():
                return int(word)
        return value

    @field_validator("parallel_calls", mode="before")
    @classmethod
    def _parallel_words(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("auto", "autotune"):
            return "autotune"
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        return value

    @property
    def prefetch_enabled(self) -> bool:
        return self.prefetch is not False


class TrainConfig(_Strict):
    """Optimisation: batch, accumulation, optimizer, schedule, precision, length."""

    # Examples per optimizer update, across all replicas and micro-steps.
    global_batch_size: Annotated[int, Field(ge=1)] = 256
    accumulation_steps: Annotated[int, Field(ge=1)] = 1
    optimizer: Literal["sgd", "adam"] = "adam"
    learning_rate: Annotated[float, Field(gt=0.0)] = 1e-3
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"
    # For cosine/step schedules: optimizer updates over which the schedule runs.
    lr_decay_steps: Annotated[int, Field(ge=1)] = 10000
    epochs: Annotated[int, Field(ge=1)] | None = None
    max_steps: Annotated[int, Field(ge=1)] | None = None
    seed: int = 0
    mixed_precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    jit_compile: bool = False
    # Optimizer steps run inside one tf.function call (timings still per step).
    steps_per_execution: Annotated[int, Field(ge=1)] = 1


class StrategyConfig(_Strict):
    """tf.distribute settings."""

    # Logical CPU replicas when there is no GPU (MirroredStrategy still runs).
    cpu_replicas: Annotated[int, Field(ge=1, le=64)] = 2
    cross_device_ops: Literal["auto", "nccl", "hierarchical_copy", "reduce_to_one"] = "auto"


class CheckpointConfig(_Strict):
    every_steps: Annotated[int, Field(ge=1)] = 200
    keep: Annotated[int, Field(ge=1)] = 3
    enabled: bool = True


class TelemetryConfig(_Strict):
    enabled: bool = True
    # Frames held while the reader lags; beyond this they are dropped and counted.
    buffer_frames: Annotated[int, Field(ge=16)] = 4096


class RunConfig(_Strict):
    """A whole run: what `gpuwatch train CONFIG` reads."""

    name: str = "run"
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @model_validator(mode="after")
    def _batch_splits_over_accumulation(self) -> RunConfig:
        batch, accum = self.train.global_batch_size, self.train.accumulation_steps
        if batch % accum:
            raise ValueError(
                f"train.global_batch_size {batch} is not divisible by "
                f"train.accumulation_steps {accum}"
            )
        return self


def divisibility_error(config: RunConfig, replicas: int) -> str | None:
    """Why the global batch cannot split over replicas x accumulation, or None if it can."""
    batch = config.train.global_batch_size
    accum = config.train.accumulation_steps
    if batch % (replicas * accum):
        return (
            f"train.global_batch_size {batch} is not divisible by replicas x "
            f"accumulation_steps = {replicas} x {accum} = {replicas * accum}"
        )
    return None


def per_replica_batch(config: RunConfig, replicas: int) -> int:
    """Examples each replica sees in one micro-step."""
    return config.train.global_batch_size // (replicas * config.train.accumulation_steps)
