"""Events: trainer -> supervisor -> dashboards, each declared once.

Each event is a frozen dataclass: its fields, their Python types (checked on decode,
``wire.py``) and a note each. The envelope ("v", "type", "seq", "t") is added by
event_frame and read by parse_event (``envelopes.py``), and nowhere else; "seq" is the
supervisor's (the line number in events.jsonl), "t" the sender's clock.
event_reference() (``reference.py``) is the text of the package docstring's section on
events, generated from these declarations.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from trainer_runtime.protocol.figures import Breakdown, breakdown, input_wait_pct, per_second
from trainer_runtime.protocol.samples import (
    LEAN_HOST_FIELDS,
    GpuSample,
    GpuSummary,
    HostSample,
    wire_field_names,
)

# "relaunching": the old attempt stopped and a new one is about to start (not terminal).
STATUSES = (
    "starting",
    "running",
    "stopping",
    "relaunching",
    "stopped",
    "finished",
    "crashed",
    "lost",
)
TERMINAL_STATUSES = frozenset({"stopped", "finished", "crashed", "lost"})
# The terminal statuses in which the run failed: shown with why, and the log's tail.
FAILED_STATUSES = frozenset({"crashed", "lost"})


def host_name() -> str:
    """This host as a hello and an agent name it: in a Slurm step its node's Slurm name.

    That is what squeue and sinfo show, what the others dial, and on a host that runs
    several emulated nodes (slurmd's MULTIPLE_SLURMD) the only name that tells them apart.
    """
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _note(text: str) -> dict[str, Any]:
    return {"note": text}


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of the events; ``TYPE`` is the frame type, ``FROM`` who sends it."""

    TYPE: ClassVar[str] = ""
    FROM: ClassVar[str] = ""


def _attempt() -> Any:
    return field(metadata=_note("the attempt it belongs to (1, 2, ...)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Event):
    """The trainer is built and about to train."""

    TYPE: ClassVar[str] = "hello"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    pid: int = field(metadata=_note("the trainer's process id"))
    tf_version: str = field(metadata=_note("TensorFlow's version"))
    replicas: int = field(metadata=_note("replicas in sync"))
    device_kind: str = field(metadata=_note('"gpu" or "cpu" (logical CPU replicas)'))
    devices: list[str] = field(metadata=_note("the replica devices"))
    param_count: int = field(metadata=_note("trainable parameters"))
    param_bytes: int = field(metadata=_note("their bytes"))
    global_batch_size: int = field(metadata=_note("examples per optimizer update"))
    accumulation_steps: int = field(metadata=_note("micro-steps per update"))
    per_replica_batch: int = field(metadata=_note("examples per replica per micro-step"))
    start_step: int = field(metadata=_note("optimizer steps before this attempt"))
    start_micro_step: int = field(metadata=_note("micro-steps before this attempt"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))
    workers: int = field(default=1, metadata=_note("workers in the cluster (1: one host)"))
    host: str = field(default="", metadata=_note(
        "the worker's host name (its node's Slurm name in a Slurm step: SLURMD_NODENAME)"))
    flops_per_example: float | None = field(
        default=None,
        metadata=_note("FLOPs of one example's forward and backward pass (matmuls, convs, "
                       "einsums), counted in the traced update; null: not counted"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Step(Event):
    """One optimizer update as the trainer measured it (t: when it ended)."""

    TYPE: ClassVar[str] = "step"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    step: int = field(metadata=_note("optimizer steps so far, counted across attempts"))
    micro_step: int = field(metadata=_note("micro-batches so far"))
    epoch: int | None = field(metadata=_note(
        "passes over the data so far (0 for a factory's; null: not known, a script's own "
        "loop, whose epochs are its own)"))
    loss: float | None = field(metadata=_note("mean loss of the update (null if not finite)"))
    lr: float | None = field(
        metadata=_note("the learning rate it applied (null: not known, a script's loop)")
    )
    examples: int = field(metadata=_note("examples trained on, counted in the graph"))
    step_time_ms: float = field(metadata=_note("wall time of the whole update"))
    input_wait_ms: float | None = field(
        metadata=_note("host time blocked on the input iterator (null: not measurable, "
                       "the hook event says why)")
    )
    grad_sync_bytes: float = field(metadata=_note("estimated all-reduce bytes in this update"))
    position: int | None = field(
        default=None, metadata=_note("examples trained on so far, all attempts")
    )
    dropped: int = field(default=0, metadata=_note("telemetry frames dropped so far"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))
    compute_ms: float | None = field(
        default=None,
        metadata=_note("batch in hand to local gradients ready, before the all-reduce"),
    )
    sync_ms: float | None = field(
        default=None,
        metadata=_note(
            "gradient all-reduce: the last local replica's gradients ready to the reduced "
            "gradients in hand (holds waiting for slower workers, and on a GPU backward "
            "work still queued); null: not timed apart"
        ),
    )
    update_ms: float | None = field(
        default=None,
        metadata=_note("optimizer update: reduced gradients in hand to the new weights written"),
    )

    @property
    def examples_per_s(self) -> float | None:
        return per_second(self.examples, self.step_time_ms)

    @property
    def input_wait_pct(self) -> float | None:
        if self.input_wait_ms is None:
            return None
        return input_wait_pct(self.input_wait_ms, self.step_time_ms)

    @property
    def breakdown(self) -> Breakdown | None:
        if self.input_wait_ms is None:
            return None
        return breakdown(self.step_time_ms, self.input_wait_ms, self.compute_ms, self.sync_ms,
                         self.update_ms)


# More workers than this: every worker but the chief sends StepSummary, not its steps.
SUMMARY_PAST_WORKERS = 8
# A StepSummary's spread of one figure over its steps: [min, median, max, sum], in ms.
SPREAD = ("min", "median", "max", "sum")


_SPREAD_NOTE = ": [min, median, max, sum] ms over its steps (null: not measured in all)"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSummary(Event):
    """A worker's updates over about a second, summed by its agent: past
    SUMMARY_PAST_WORKERS workers, every worker but the chief sends these instead of its
    steps once its first WARMUP_STEPS steps of an attempt have gone as steps (t: when its
    last step ended). Sent at once, not at the second's end, when a step falls behind
    (FALLING_BEHIND times the last summary's median) and before any other event."""

    TYPE: ClassVar[str] = "steps"
    FROM: ClassVar[str] = "agent"
    attempt: int = _attempt()
    worker: int = field(default=0, metadata=_note("the worker whose steps these are"))
    first_step: int = field(metadata=_note("the first update it covers"))
    last_step: int = field(metadata=_note("the last update it covers"))
    count: int = field(metadata=_note("the updates it covers"))
    epoch: int | None = field(metadata=_note("the last update's epoch (null: not known)"))
    examples: int = field(metadata=_note("examples trained on in them"))
    loss: float | None = field(metadata=_note("the last finite loss among them (null: none)"))
    position: int | None = field(default=None, metadata=_note("the last update's position"))
    dropped: int = field(default=0, metadata=_note("telemetry frames dropped so far"))
    step_time_ms: list[float] = field(
        metadata=_note("step time: [min, median, max, sum] ms over its steps"))
    input_wait_ms: list[float] | None = field(
        default=None, metadata=_note("input wait" + _SPREAD_NOTE))
    compute_ms: list[float] | None = field(
        default=None, metadata=_note("compute" + _SPREAD_NOTE))
    sync_ms: list[float] | None = field(
        default=None, metadata=_note("gradient all-reduce" + _SPREAD_NOTE))
    update_ms: list[float] | None = field(
        default=None, metadata=_note("optimizer update" + _SPREAD_NOTE))
    breakdown_ms: list[float] | None = field(default=None, metadata=_note(
        "[step, input, compute, sync, update] ms summed over its steps that have a "
        "breakdown (null: none has)"))

    def figure(self, name: str, part: str) -> float | None:
        """One of a spread field's [min, median, max, sum] (None: not measured, or a
        spread of the wrong shape)."""
        values = getattr(self, name)
        if values is None or len(values) != len(SPREAD):
            return None
        return float(values[SPREAD.index(part)])

    @property
    def examples_per_s(self) -> float | None:
        """Its examples over its steps' summed time."""
        step_sum = self.figure("step_time_ms", "sum")
        return per_second(self.examples, step_sum) if step_sum is not None else None

    @property
    def input_wait_pct(self) -> float | None:
        """Its steps' summed input wait over their summed time (None: not measured)."""
        step_sum, wait_sum = self.figure("step_time_ms", "sum"), self.figure("input_wait_ms", "sum")
        if step_sum is None or wait_sum is None:
            return None
        return input_wait_pct(wait_sum, step_sum)

    @property
    def breakdown(self) -> Breakdown | None:
        """Its steps' breakdowns added up (sum_breakdowns' of the same steps)."""
        parts = self.breakdown_ms
        if parts is None or len(parts) != 5:
            return None
        return breakdown(*parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Event):
    """A checkpoint was written."""

    TYPE: ClassVar[str] = "checkpoint"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    step: int = field(metadata=_note("the optimizer step it holds"))
    micro_step: int = field(metadata=_note("the micro-step it holds"))
    path: str = field(metadata=_note("its path prefix"))
    seconds: float = field(metadata=_note("time the save took"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume(Event):
    """The attempt continues from a checkpoint."""

    TYPE: ClassVar[str] = "resume"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    from_step: int = field(metadata=_note("the checkpoint's optimizer step"))
    from_micro_step: int = field(metadata=_note("its micro-step"))
    checkpoint: str | None = field(metadata=_note("its path"))
    position: int = field(default=0, metadata=_note("examples trained on before it"))
    data_order: str = field(
        default="continued", metadata=_note('"continued" or "restarted"')
    )
    data_note: str = field(default="", metadata=_note("why the data order restarted"))
    lost_steps: int | None = field(
        default=None, metadata=_note("added by the supervisor: steps since the checkpoint")
    )
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconfigured(Event):
    """The trainer applied (or refused) live settings in the same process."""

    TYPE: ClassVar[str] = "reconfigured"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    id: int = field(metadata=_note("the reconfigure request's id"))
    ok: bool = field(metadata=_note("whether the new settings now apply"))
    step: int = field(
        metadata=_note("the last step under the old settings; the new apply from step + 1")
    )
    changed: list[str] = field(metadata=_note("the dotted keys that changed"))
    seconds: float = field(metadata=_note("time the switch took"))
    message: str = field(default="", metadata=_note("why not (ok false), or a note, one line"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Done(Event):
    """The trainer is ending after a checkpoint."""

    TYPE: ClassVar[str] = "done"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    reason: str = field(metadata=_note('"max_steps", "epochs", "sigterm", "socket_lost", or a '
                                    'script\'s "exited"'))
    step: int = field(metadata=_note("the last optimizer step"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Event):
    """The trainer cannot go on; the message is its root cause, one line."""

    TYPE: ClassVar[str] = "error"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    kind: str = field(metadata=_note('"config", "factory" or "runtime"'))
    message: str = field(metadata=_note("one line"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Hook(Event):
    """What gpuwatch's hook in a person's own command (`gpuwatch run`) instruments, or why
    it could not: sent when it installs, and again when it learns more."""

    TYPE: ClassVar[str] = "hook"
    FROM: ClassVar[str] = "trainer"
    attempt: int = _attempt()
    installed: bool = field(metadata=_note("the hook runs in the command's Python"))
    message: str = field(default="", metadata=_note("why not, or what it watches: one line"))
    tensorflow: bool = field(default=False, metadata=_note("the command imported TensorFlow"))
    keras_version: str = field(default="", metadata=_note("Keras' version, once imported"))
    loop: str = field(
        default="",
        metadata=_note('"fit", "fit (callback)", "strategy.run (tf.function)", '
                       '"strategy.run (eager)"; "": no training loop seen yet'),
    )
    input_wait: str = field(
        default="", metadata=_note('"" measured, else why it is not measurable')
    )
    strategy: str = field(default="", metadata=_note("the strategy's class, once seen"))
    worker: int = field(default=0, metadata=_note("the worker that sent it (0 = chief)"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Run(Event):
    """The run: the first line of events.jsonl (attempt 0)."""

    TYPE: ClassVar[str] = "run"
    FROM: ClassVar[str] = "supervisor"
    run_id: str = field(metadata=_note("the run's id"))
    name: str = field(default="", metadata=_note("the config's name"))
    config_path: str = field(metadata=_note("the config as given"))
    supervisor_pid: int = field(metadata=_note("the supervisor's process id"))
    host: str = field(metadata=_note("where it runs"))
    settings: dict[str, Any] = field(metadata=_note("the validated config"))
    created: float | None = field(default=None, metadata=_note("when the run was made"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt(Event):
    """An attempt starts with these settings."""

    TYPE: ClassVar[str] = "attempt"
    FROM: ClassVar[str] = "supervisor"
    attempt: int = _attempt()
    settings: dict[str, Any] = field(metadata=_note("the full validated config"))
    fresh: bool = field(default=False, metadata=_note("whether it ignores checkpoints"))
    reason: str = field(
        default="start", metadata=_note('"start", "relaunch", "live", "resume" or "scale"')
    )
    config_path: str = field(default="", metadata=_note("attempt-N.yaml in the run directory"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Scale(Event):
    """The run is a scaling probe: a short fresh attempt at each device count, in order."""

    TYPE: ClassVar[str] = "scale"
    FROM: ClassVar[str] = "supervisor"
    counts: list[int] = field(metadata=_note("the device counts, in the order they run"))
    unit: str = field(
        default="replicas", metadata=_note('"replicas", or "workers" for a cluster')
    )
    mode: str = field(
        default="weak",
        metadata=_note('"weak" (the per-replica batch kept) or "strong" (the global batch kept)'),
    )
    steps: int = field(metadata=_note("optimizer steps of each attempt, warm-up included"))
    cores: int | None = field(
        default=None,
        metadata=_note("CPU cores the supervisor's host lets its trainers use (logical CPU "
                       "replicas beyond them share cores)"),
    )
    rounds: int = field(
        default=1,
        metadata=_note("rounds at most: while the verdict cannot tell, every count runs "
                       "again with twice the steps, a round each"),
    )
    round: int = field(
        default=1,
        metadata=_note("the round this plan is (1, 2, ...); a later round's scale event is "
                       "recorded as it begins, its steps doubled"),
    )
    message: str | None = field(
        default=None,
        metadata=_note("why a later round runs, one line: the verdict the round before "
                       "could not give"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusChange(Event):
    """The run's status changed (see STATUSES)."""

    TYPE: ClassVar[str] = "status"
    FROM: ClassVar[str] = "supervisor"
    attempt: int = _attempt()
    status: str = field(metadata=_note("one of STATUSES"))
    exit_code: int | None = field(default=None, metadata=_note("the trainer's, if it exited"))
    signal: str | None = field(default=None, metadata=_note("the signal that ended it"))
    message: str | None = field(default=None, metadata=_note("what happened, one line"))
    log_tail: list[str] = field(
        default_factory=list, metadata=_note("the trainer log's last lines, on a crash")
    )
    worker: int | None = field(
        default=None, metadata=_note("the worker whose exit set this status, in a cluster")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample(Event):
    """One device sample of the host (1 Hz)."""

    TYPE: ClassVar[str] = "sample"
    FROM: ClassVar[str] = "supervisor"
    host: HostSample = field(metadata=_note(
        "the host's readings: " + ", ".join(wire_field_names(HostSample))
        + f" (past {SUMMARY_PAST_WORKERS} workers, a worker's but the chief's: "
        + ", ".join(LEAN_HOST_FIELDS) + ")"))
    gpus: list[GpuSample] = field(metadata=_note(
        "one per GPU: " + ", ".join(wire_field_names(GpuSample))
        + " (each process: pid, used_bytes, in_run)"))
    nvml: str | None = field(metadata=_note("null when NVML works, else why it does not"))
    worker: int = field(default=0, metadata=_note("the worker whose host it samples"))
    gpu_summary: GpuSummary | None = field(
        default=None,
        metadata=_note(f"past {SUMMARY_PAST_WORKERS} workers, a worker's (not the chief's) "
                       "GPUs summed, gpus then empty: "
                       + ", ".join(wire_field_names(GpuSummary)).replace(
                           "util_gpu_pct", "util_gpu_pct [min, mean, max]")),
    )


EVENTS: Mapping[str, type[Event]] = MappingProxyType(
    {
        cls.TYPE: cls
        for cls in (Hello, Step, Checkpoint, Resume, Reconfigured, Done, Error, Hook, Run,
                    Attempt, Scale, StatusChange, Sample, StepSummary)
    }
)
TRAINER_EVENTS = frozenset(name for name, cls in EVENTS.items() if cls.FROM == "trainer")
# What a remote agent relays: its trainer's events, and its own step summaries.
AGENT_EVENTS = TRAINER_EVENTS | {StepSummary.TYPE}
