"""The run configuration's typed schema (pydantic v2), shared by gpuwatch and the trainer.

No TensorFlow here: gpuwatch validates a config with these models before any
process starts, and the trainer re-validates the JSON it is handed.
Every model forbids unknown keys so a typo is an error, not a silent default.

Every number has an upper bound as well as a lower one: a value past it is never a
real setting, only a way to crash the trainer (a batch of 10^18 examples is a
MemoryError while the data is built). Limits that follow from two settings (a
global batch no larger than the built-in data, the bytes of one micro-batch) are
checked by ``RunConfig`` itself, so every path that builds a config (a file,
``--set``, a relaunch, the dashboard's pending keys, the trainer) refuses them.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

FACTORY_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # matched whole (fullmatch)

# Upper bounds. Each is far past any real setting on the machines we target.
MAX_LAYERS = 32
MAX_UNITS = 65536
MAX_EXAMPLES = 10_000_000  # the built-in data keeps an int64 id per example
MAX_INPUT_DIMS = 4
MAX_INPUT_DIM = 65536
MAX_FEATURES_PER_EXAMPLE = 1 << 24  # 64 MiB of float32 per example
MAX_CLASSES = 100_000
MAX_READ_LATENCY_MS = 60_000.0
MAX_DECODE_COST = 1000  # rounds of a 32x32 matmul per example, each a graph op
MAX_PREFETCH = 1024
MAX_PARALLEL_CALLS = 256
MAX_GLOBAL_BATCH = 1 << 20
MAX_ACCUMULATION = 1024
MAX_LEARNING_RATE = 100.0
MAX_STEPS = 10**12
MAX_EPOCHS = 1_000_000
MAX_SEED = 2**32 - 1  # Keras' set_random_seed takes a 32-bit seed
MAX_STEPS_PER_EXECUTION = 1000
MAX_CPU_REPLICAS = 64
MAX_REPLICAS = 64  # devices one host trains on: GPUs, or logical CPU replicas
MAX_KEEP = 1000
MAX_BUFFER_FRAMES = 1_000_000
MAX_NAME_CHARS = 100
MAX_FACTORY_CHARS = 200
# A cluster (MultiWorkerMirroredStrategy): 64 hosts x 8 GPUs is what we plan for.
MAX_WORKERS = 256
MAX_HOST_CHARS = 253
MAX_COLLECTIVE_TIMEOUT_S = 3600.0
MAX_SSH_OPTIONS = 32
MAX_SSH_OPTION_CHARS = 1000
MAX_PATH_CHARS = 4096
# A person's own command (`gpuwatch run -- COMMAND`): its arguments, and each one's length.
# Linux takes at most 128 KiB in one argument and about 2 MiB in all; the config that holds
# the command is bounded too (gpuwatch/config/bounds.py: MAX_TEXT_CHARS of text in all).
MAX_COMMAND_ARGS = 4096
MAX_ARG_CHARS = 4096
# user@host, a host name or an IPv4 address; never a leading "-" (an ssh option). Matched
# whole (fullmatch), as FACTORY_RE is: a "$" would take a last newline.
HOST_RE = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}@)?[A-Za-z0-9][A-Za-z0-9.-]*")
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1"})
# The built-in MLP: 4 GiB of float32 weights (Adam keeps two more copies).
MAX_MLP_PARAMETERS = 1 << 30
# Features of one micro-step of the built-in data, all replicas together.
MAX_MICRO_BATCH_BYTES = 4 << 30


class LimitError(ValueError):
    """A limit that involves several settings; ``keys`` are those settings, the first named."""

    def __init__(self, keys: tuple[str, ...], problem: str) -> None:
        super().__init__(problem)
        self.keys = keys
        self.problem = problem


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _lax_readings_kept(kind: type[int] | type[float]) -> BeforeValidator:
    """The lax readings a strict number keeps, read as pydantic's lax mode reads them.

    Text that spells a number (YAML 1.1 reads `1e-3`, without a dot, as text; a `--set`
    or a relaunch may quote a number), and for an integer a whole float (`256.0`).
    Anything else, a bool first of all, meets the strict check.
    """
    lax = TypeAdapter(kind, config=ConfigDict(allow_inf_nan=False))

    def read(value: Any) -> Any:
        if isinstance(value, str) or (kind is int and isinstance(value, float)):
            try:
                return lax.validate_python(value)
            except ValidationError as exc:  # the lax reading's own error, e.g. int_from_float
                error = exc.errors()[0]
                raise PydanticCustomError(error["type"], error["msg"], error.get("ctx")) from None
        return value

    return BeforeValidator(read)


# Numbers are strict: pydantic's lax mode reads true as 1, and YAML 1.1 reads `yes` and
# `on` as true, so `accumulation_steps: yes` would quietly mean 1. A bool is not a number.
# allow_inf_nan=False (above) refuses .inf and .nan, which `ge=0` alone lets through.
Integer = Annotated[int, Field(strict=True), _lax_readings_kept(int)]
Number = Annotated[float, Field(strict=True), _lax_readings_kept(float)]


def _check_factory(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_FACTORY_CHARS:
        raise ValueError(f"factory must be at most {MAX_FACTORY_CHARS} characters")
    if value is not None and not FACTORY_RE.fullmatch(value):
        raise ValueError(f"factory must look like 'package.module:function', got {value!r}")
    return value


# data.prefetch in words: what a word means when read (`--set data.prefetch=on`; YAML reads
# the bare words as booleans already), and how a value is shown (`prefetch_word`).
PREFETCH_WORDS: dict[str, bool | str] = {
    "on": True,
    "true": True,
    "yes": True,
    "off": False,
    "false": False,
    "no": False,
    "none": False,
    "0": False,
    "auto": "autotune",
}


def prefetch_enabled(value: Any) -> bool:
    """Whether a data.prefetch value reads ahead: anything but off (False, or None if absent)."""
    return value is not None and value is not False


def read_prefetch_word(value: Any) -> Any:
    """data.prefetch as text read: YAML reads `on`/`off` as booleans already; --set gives words."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in PREFETCH_WORDS:
            return PREFETCH_WORDS[word]
        if word.isdigit():
            return int(word)
    return value


def read_parallel_word(value: Any) -> Any:
    """data.parallel_calls as text read: auto/autotune, or a count."""
    if isinstance(value, str) and value.strip().lower() in ("auto", "autotune"):
        return "autotune"
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def prefetch_word(value: Any) -> str:
    """A data.prefetch value in a word: "off" (also when absent), "on", "autotune" or N."""
    if not prefetch_enabled(value):
        return "off"
    if value is True:
        return "on"
    return str(value)


class ModelConfig(_Strict):
    """Which network to train: a built-in by name, or your own factory."""

    name: Literal["mlp", "convnet", "resnet"] = "mlp"
    hidden_units: Annotated[
        list[Annotated[Integer, Field(gt=0, le=MAX_UNITS)]], Field(max_length=MAX_LAYERS)
    ] = Field(default_factory=lambda: [512, 512])
    dropout: Annotated[Number, Field(ge=0.0, lt=1.0)] = 0.0
    factory: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str | None) -> str | None:
        return _check_factory(value)


class DataConfig(_Strict):
    """The input pipeline and its knobs."""

    name: Literal["synthetic"] = "synthetic"
    examples: Annotated[Integer, Field(gt=0, le=MAX_EXAMPLES)] = 16384
    input_shape: Annotated[
        list[Annotated[Integer, Field(gt=0, le=MAX_INPUT_DIM)]],
        Field(min_length=1, max_length=MAX_INPUT_DIMS),
    ] = Field(default_factory=lambda: [784])
    classes: Annotated[Integer, Field(ge=2, le=MAX_CLASSES)] = 10
    # Simulated storage latency per batch read, in milliseconds (releases the GIL).
    read_latency_ms: Annotated[Number, Field(ge=0.0, le=MAX_READ_LATENCY_MS)] = 0.0
    # Extra CPU work per example (matrix ops in the map function); 0 = none.
    decode_cost: Annotated[Integer, Field(ge=0, le=MAX_DECODE_COST)] = 0
    # off: no overlap at all; on/autotune: tf.data.AUTOTUNE; an int: that many batches.
    prefetch: bool | Literal["autotune"] | Annotated[Integer, Field(ge=1, le=MAX_PREFETCH)] = False
    # 1: serial reads; an int > 1: that many parallel calls; "autotune".
    parallel_calls: Literal["autotune"] | Annotated[
        Integer, Field(ge=1, le=MAX_PARALLEL_CALLS)
    ] = 1
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
        return read_prefetch_word(value)

    @field_validator("parallel_calls", mode="before")
    @classmethod
    def _parallel_words(cls, value: Any) -> Any:
        return read_parallel_word(value)

    @field_validator("input_shape")
    @classmethod
    def _features_bounded(cls, value: list[int]) -> list[int]:
        if math.prod(value) > MAX_FEATURES_PER_EXAMPLE:
            raise ValueError(
                f"{value} is {math.prod(value):,} features per example, over the limit of "
                f"{MAX_FEATURES_PER_EXAMPLE:,}"
            )
        return value

    @property
    def prefetch_enabled(self) -> bool:
        return prefetch_enabled(self.prefetch)

    @property
    def features_per_example(self) -> int:
        return math.prod(self.input_shape)


class TrainConfig(_Strict):
    """Optimisation: batch, accumulation, optimizer, schedule, precision, length."""

    # Examples per optimizer update, across all replicas and micro-steps.
    global_batch_size: Annotated[Integer, Field(ge=1, le=MAX_GLOBAL_BATCH)] = 256
    accumulation_steps: Annotated[Integer, Field(ge=1, le=MAX_ACCUMULATION)] = 1
    optimizer: Literal["sgd", "adam"] = "adam"
    learning_rate: Annotated[Number, Field(gt=0.0, le=MAX_LEARNING_RATE)] = 1e-3
    lr_schedule: Literal["constant", "cosine", "step"] = "constant"
    # For cosine/step schedules: optimizer updates over which the schedule runs.
    lr_decay_steps: Annotated[Integer, Field(ge=1, le=MAX_STEPS)] = 10000
    epochs: Annotated[Integer, Field(ge=1, le=MAX_EPOCHS)] | None = None
    max_steps: Annotated[Integer, Field(ge=1, le=MAX_STEPS)] | None = None
    seed: Annotated[Integer, Field(ge=0, le=MAX_SEED)] = 0
    mixed_precision: Literal["float32", "mixed_float16", "mixed_bfloat16"] = "float32"
    jit_compile: bool = False
    # Optimizer steps run inside one tf.function call (timings still per step).
    steps_per_execution: Annotated[Integer, Field(ge=1, le=MAX_STEPS_PER_EXECUTION)] = 1


class StrategyConfig(_Strict):
    """tf.distribute settings."""

    # Devices the run trains on (one host): the first N GPUs, or N logical CPU replicas
    # with no GPU; none: every visible GPU, or cpu_replicas. Fixed for a process: a change
    # is a relaunch.
    replicas: Annotated[Integer, Field(ge=1, le=MAX_REPLICAS)] | None = None
    # Logical CPU replicas when there is no GPU and replicas is not given.
    cpu_replicas: Annotated[Integer, Field(ge=1, le=MAX_CPU_REPLICAS)] = 2
    cross_device_ops: Literal["auto", "nccl", "hierarchical_copy", "reduce_to_one"] = "auto"


class CheckpointConfig(_Strict):
    every_steps: Annotated[Integer, Field(ge=1, le=MAX_STEPS)] = 200
    keep: Annotated[Integer, Field(ge=1, le=MAX_KEEP)] = 3
    enabled: bool = True


class TelemetryConfig(_Strict):
    enabled: bool = True
    # Frames held while the reader lags; beyond this they are dropped and counted.
    buffer_frames: Annotated[Integer, Field(ge=16, le=MAX_BUFFER_FRAMES)] = 4096


Port = Annotated[Integer, Field(ge=1, le=65535)]


class WorkerDataOverride(_Strict):
    """Input-pipeline settings one worker may set for itself: its host's storage and CPUs.

    Only what leaves the model's arithmetic alone: every worker still takes the same
    batch each step, so the synchronous step stays one step.
    """

    read_latency_ms: Annotated[Number, Field(ge=0.0, le=MAX_READ_LATENCY_MS)] | None = None
    decode_cost: Annotated[Integer, Field(ge=0, le=MAX_DECODE_COST)] | None = None
    prefetch: (
        bool | Literal["autotune"] | Annotated[Integer, Field(ge=1, le=MAX_PREFETCH)] | None
    ) = None
    parallel_calls: (
        Literal["autotune"] | Annotated[Integer, Field(ge=1, le=MAX_PARALLEL_CALLS)] | None
    ) = None
    cache: bool | None = None

    @field_validator("prefetch", mode="before")
    @classmethod
    def _prefetch_words(cls, value: Any) -> Any:
        return read_prefetch_word(value)

    @field_validator("parallel_calls", mode="before")
    @classmethod
    def _parallel_words(cls, value: Any) -> Any:
        return read_parallel_word(value)

    def given(self) -> dict[str, Any]:
        """The settings this override sets (the others follow the run's data section)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class WorkerConfig(_Strict):
    """One worker: its host, and what its input pipeline does differently, if anything."""

    host: Annotated[str, Field(min_length=1, max_length=MAX_HOST_CHARS)] = "localhost"
    data: WorkerDataOverride = Field(default_factory=WorkerDataOverride)

    @field_validator("host")
    @classmethod
    def _host_form(cls, value: str) -> str:
        if not HOST_RE.fullmatch(value):
            raise ValueError(
                f"must be a host name, an IPv4 address or user@host (got {value!r})"
            )
        return value

    @property
    def hostname(self) -> str:
        """The host without its user@ part: what TensorFlow's cluster spec names."""
        return self.host.rpartition("@")[2]

    @property
    def is_local(self) -> bool:
        """The host is this machine (whatever account a user@ part names)."""
        return self.hostname in LOCAL_HOSTS

    @property
    def account(self) -> str | None:
        """The account a user@host names (None: the person's own, as ssh would pick)."""
        user, at, _ = self.host.rpartition("@")
        return user if at else None


def _workers_shorthand(value: Any) -> Any:
    """`workers: 2` is two localhost workers; a host name alone is {host: name}."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= MAX_WORKERS:
            raise PydanticCustomError(
                "workers_count", "must be from 1 to {limit} (got {value})",
                {"limit": MAX_WORKERS, "value": value},
            )
        return [{} for _ in range(value)]
    if isinstance(value, list):
        return [{"host": item} if isinstance(item, str) else item for item in value]
    return value


class ClusterConfig(_Strict):
    """Several workers under MultiWorkerMirroredStrategy (worker 0 is the chief).

    launcher: local (processes on this host), ssh (one agent per host over the
    user's own ssh), slurm (one agent per node of the current allocation, via srun).
    """

    launcher: Literal["local", "ssh", "slurm"] = "local"
    workers: Annotated[
        list[WorkerConfig],
        Field(min_length=1, max_length=MAX_WORKERS),
        BeforeValidator(_workers_shorthand),
    ] = Field(default_factory=lambda: [WorkerConfig(), WorkerConfig()])
    # One TensorFlow port per worker; none: free ports found on each host at launch.
    # Slurm: the first is the port every node uses; none: a free port found on each node.
    ports: Annotated[list[Port], Field(min_length=1, max_length=MAX_WORKERS)] | None = None
    collective: Literal["auto", "ring", "nccl"] = "auto"
    timeout_s: Annotated[Number, Field(ge=1.0, le=MAX_COLLECTIVE_TIMEOUT_S)] = 60.0
    # The Python that runs the agent on other hosts; none: this interpreter's path.
    python: Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)] | None = None
    # Extra arguments for ssh before the host, e.g. ["-F", "~/.ssh/cluster_config"].
    ssh_options: Annotated[
        list[Annotated[str, Field(max_length=MAX_SSH_OPTION_CHARS)]],
        Field(max_length=MAX_SSH_OPTIONS),
    ] = Field(default_factory=list)

    @field_validator("python")
    @classmethod
    def _python_path(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("~") or not value.isprintable()):
            raise ValueError(
                f"must be an absolute path or a command name on the workers' PATH, "
                f"without ~ (got {value!r})"
            )
        return value

    @model_validator(mode="after")
    def _workers_fit_the_launcher(self) -> ClusterConfig:
        n = len(self.workers)
        if self.ports is not None and self.launcher != "slurm" and len(self.ports) != n:
            raise LimitError(
                ("cluster.ports", "cluster.workers"),
                f"cluster.ports has {len(self.ports)} ports for {n} workers: give one each",
            )
        if self.ports is not None and self.launcher != "slurm":
            seen: set[tuple[str, int]] = set()
            for worker, port in zip(self.workers, self.ports, strict=True):
                key = ("localhost" if worker.is_local else worker.hostname, port)
                if key in seen:
                    raise LimitError(
                        ("cluster.ports",),
                        f"cluster.ports gives port {port} twice on {key[0]}",
                    )
                seen.add(key)
        for i, worker in enumerate(self.workers):
            if self.launcher == "local" and not worker.is_local:
                raise LimitError(
                    (f"cluster.workers.{i}.host", "cluster.launcher"),
                    f"cluster.workers[{i}].host {worker.host!r} is another host: the local "
                    "launcher runs workers on this one (localhost); use launcher ssh or slurm",
                )
            if self.launcher == "local" and worker.account is not None:
                raise LimitError(
                    (f"cluster.workers.{i}.host", "cluster.launcher"),
                    f"cluster.workers[{i}].host {worker.host!r} names an account: the local "
                    "launcher runs workers as you; use launcher ssh to log in as another",
                )
            # The default host is no host named: a saved config (every key written, the
            # run directory's config.yaml) loads back.
            if self.launcher == "slurm" and worker.host != WorkerConfig().host:
                raise LimitError(
                    (f"cluster.workers.{i}.host", "cluster.launcher"),
                    f"cluster.workers[{i}].host: the slurm launcher takes its hosts from the "
                    "allocation (worker i runs on its node i); give a count or leave host out",
                )
        return self

    @property
    def count(self) -> int:
        return len(self.workers)


def _command_text(value: str) -> str:
    """An argument or a path as the kernel takes it: no NUL (it ends a C string), and text
    that UTF-8 can write down (a config file holds it; an undecodable byte from the command
    line is a lone surrogate here)."""
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be text UTF-8 can encode (got an undecodable byte)") from None
    return value


# The program (argv[0]) is a name or a path: never empty. Its arguments may be empty
# (`grep "" FILE` is a real command).
CommandArg = Annotated[str, Field(max_length=MAX_ARG_CHARS), AfterValidator(_command_text)]


class CommandConfig(_Strict):
    """A person's own command (`gpuwatch run -- COMMAND [ARGS ...]`): what the run starts
    instead of the bundled runtime. argv[0] is looked up on PATH as a shell would, from
    cwd, the directory `gpuwatch run` was typed in."""

    argv: Annotated[list[CommandArg], Field(min_length=1, max_length=MAX_COMMAND_ARGS)]
    cwd: Annotated[
        str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(_command_text)
    ]

    @field_validator("argv")
    @classmethod
    def _a_program(cls, value: list[str]) -> list[str]:
        if not value[0]:
            raise ValueError("argv[0], the program, must not be empty")
        return value

    @field_validator("cwd")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path (got {value[:80]!r})")
        return value


class RunConfig(_Strict):
    """A whole run: what `gpuwatch train CONFIG` reads (or `gpuwatch run` writes)."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)] = "run"
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    # Several workers under MultiWorkerMirroredStrategy; none: one host, MirroredStrategy.
    cluster: ClusterConfig | None = None
    # A person's own command (gpuwatch run); none: the bundled runtime trains.
    command: CommandConfig | None = None

    @field_validator("name")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        if not value.isprintable():
            raise ValueError(f"must be printable text on one line (got {value!r})")
        return value

    @staticmethod
    def _command_cluster(cluster: ClusterConfig) -> None:
        """A command's workers (gpuwatch run): where they run, not how the bundled runtime
        trains on them: no collective, no worker's own input pipeline."""
        if cluster.collective != "auto":
            raise LimitError(
                ("cluster.collective", "command"),
                f"{cluster.collective} is the bundled runtime's: a command's own "
                "MultiWorkerMirroredStrategy picks its collective (its CommunicationOptions)",
            )
        for i, worker in enumerate(cluster.workers):
            if worker.data != WorkerDataOverride():
                raise LimitError(
                    (f"cluster.workers.{i}.data", "command"),
                    "changes the bundled runtime's input pipeline: a command reads its own "
                    "data",
                )

    @model_validator(mode="after")
    def _settings_fit_together(self) -> RunConfig:
        if self.command is not None and self.cluster is not None:
            self._command_cluster(self.cluster)
        if self.cluster is not None and self.strategy.replicas is not None:
            raise LimitError(
                ("strategy.replicas", "cluster"),
                f"strategy.replicas {self.strategy.replicas} is for one host "
                "(MirroredStrategy); each worker of a cluster uses every GPU it sees, or one "
                "CPU: set the number of cluster.workers instead",
            )
        batch, accum = self.train.global_batch_size, self.train.accumulation_steps
        if batch % accum:
            raise LimitError(
                ("train.global_batch_size", "train.accumulation_steps"),
                f"train.global_batch_size {batch} is not divisible by "
                f"train.accumulation_steps {accum}",
            )
        if self.data.factory is None:
            self._fits_builtin_data()
        if self.model.factory is None and self.model.name == "mlp":
            params = self.mlp_parameters()
            if params > MAX_MLP_PARAMETERS:
                raise LimitError(
                    ("model.hidden_units", "data.input_shape", "data.classes"),
                    f"model.hidden_units {self.model.hidden_units} on "
                    f"{self.data.features_per_example:,} features and {self.data.classes:,} "
                    f"classes is {params:,} parameters, over the limit of "
                    f"{MAX_MLP_PARAMETERS:,}",
                )
        return self

    def mlp_parameters(self) -> int:
        """Weights and biases of the built-in MLP for these settings."""
        sizes = [self.data.features_per_example, *self.model.hidden_units, self.data.classes]
        return sum(a * b + b for a, b in itertools.pairwise(sizes))

    def _fits_builtin_data(self) -> None:
        batch, accum = self.train.global_batch_size, self.train.accumulation_steps
        examples = self.data.examples
        if batch > examples:
            raise LimitError(
                ("train.global_batch_size", "data.examples"),
                f"train.global_batch_size {batch} is more than data.examples {examples}: "
                "one update would need more examples than the data has",
            )
        micro_bytes = batch // accum * self.data.features_per_example * 4
        if micro_bytes > MAX_MICRO_BATCH_BYTES:
            raise LimitError(
                ("train.global_batch_size", "train.accumulation_steps", "data.input_shape"),
                f"train.global_batch_size {batch} / accumulation_steps {accum} examples of "
                f"{self.data.features_per_example:,} features is {micro_bytes / 2**30:.1f} GiB "
                f"per micro-step, over the {MAX_MICRO_BATCH_BYTES >> 30} GiB limit",
            )


def replica_count(strategy: StrategyConfig, gpus: int) -> int:
    """The replicas one host trains on, with `gpus` GPUs visible: strategy.replicas, else
    every GPU, else strategy.cpu_replicas logical CPU replicas. The one home of this rule:
    the trainer (devices.py) and gpuwatch (config.expected_replicas) both read it."""
    if strategy.replicas is not None:
        return strategy.replicas
    return gpus if gpus > 0 else strategy.cpu_replicas


def gpu_shortage(strategy: StrategyConfig, gpus: int) -> str | None:
    """Why strategy.replicas cannot run on `gpus` visible GPUs (more asked for than there
    are), or None. With no GPU at all the replicas are logical CPU devices: never short."""
    wanted = strategy.replicas
    if wanted is None or gpus == 0 or wanted <= gpus:
        return None
    return (
        f"strategy.replicas: {wanted} GPUs asked for, but {gpus} "
        f"{'is' if gpus == 1 else 'are'} visible here (CUDA_VISIBLE_DEVICES narrows them); "
        f"set strategy.replicas to at most {gpus}, or leave it out to use every GPU"
    )


def divisibility_error(config: RunConfig, replicas: int) -> str | None:
    """Why the global batch cannot split over replicas x accumulation, or None if it can."""
    batch = config.train.global_batch_size
    accum = config.train.accumulation_steps
    if batch < replicas * accum:
        return (
            f"train.global_batch_size {batch} is less than replicas x accumulation_steps = "
            f"{replicas} x {accum} = {replicas * accum}: a replica would get no example"
        )
    if batch % (replicas * accum):
        return (
            f"train.global_batch_size {batch} is not divisible by replicas x "
            f"accumulation_steps = {replicas} x {accum} = {replicas * accum}"
        )
    return None


def per_replica_batch(config: RunConfig, replicas: int) -> int:
    """Examples each replica sees in one micro-step."""
    return config.train.global_batch_size // (replicas * config.train.accumulation_steps)
