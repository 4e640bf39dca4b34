"""Run state: a pure fold of a run's event stream into what the dashboard shows.

No Textual, no I/O. ``RunState.apply(frame)`` / ``apply_many(frames)`` take the
frames of ``trainer_runtime/protocol.py`` (as relayed by the supervisor, with
``seq``), each read into its typed event by ``protocol.parse_event``, plus the
link's synthetic ``{"type": "link", ...}`` events, and keep:
the run, each attempt with its settings and measured figures (after warm-up),
the latest step, rolling windows for sparklines, the latest device sample and
the status; and the bounded histories of gpuwatch/series.py: the whole run's
figures against step (the plot screen) and the chief's GPUs' recent samples.
Events whose ``seq`` was already folded are skipped, so a link that resubscribes
with an overlap never counts a step twice.

The supervisor folds the same way (``apply_event``: typed events, no parsing) and
sends a dashboard that attaches its state as a ``snapshot`` frame
(``to_snapshot``/``from_snapshot``, gpuwatch/snapshot.py: generic over the
dataclass fields, so a field added here is carried without more code); the
dashboard takes it whole and folds only the events after it. Memory does not grow
with the run's length: windows are fixed deques, the log tail is cut, an attempt's
median examples/s is a ``MedianSketch`` (exact for a short attempt, then within
0.5 %); what grows is one ``AttemptSummary`` per attempt.

Several workers (MultiWorkerMirroredStrategy): the step, loss, examples/s, step time,
the step window and the device sample come from the chief (worker 0) alone, so nothing
is counted twice and a one-host run folds exactly as before; every worker also gets a
``WorkerFigures``: a fixed window of its recent steps, its status and its host's latest
sample. Folding costs O(1) per event; the medians are taken when the screen asks
(``worker_summaries``), over windows of at most WORKER_WINDOW_STEPS steps. Input wait
is the exception: every step waits for the worker that waits most, so a cluster's
input wait is that worker's (``pace_setter``), named, in the current figures and in
each attempt's (which keeps every worker's sums for it).

The figures the screen shows are taken once per repaint, by ``figures()``: one
``Figures`` that every panel showing one of them reads, so a figure shown twice is
the same value.

It also holds the pure helpers behind the "pending settings" keys: reading a
dotted setting, stepping prefetch/accumulation/batch with the divisibility rule,
and describing what a relaunch would change; and the attempts table's: which
settings differ between attempts, and their short names.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpuwatch import peaks, snapshot
from gpuwatch.series import DeviceHistory, RunHistory
from gpuwatch.sketch import MedianSketch
from trainer_runtime.protocol import (
    FAILED_STATUSES,
    SNAPSHOT,
    TERMINAL_STATUSES,
    Attempt,
    Breakdown,
    Checkpoint,
    Done,
    Envelope,
    Error,
    Event,
    Hello,
    Hook,
    ProtocolError,
    Reconfigured,
    Resume,
    Run,
    Sample,
    Scale,
    StatusChange,
    Step,
    StepSummary,
    input_wait_pct,
    parse_event,
    per_second,
    sum_breakdowns,
)
from trainer_runtime.schema import (
    ACCUMULATION_REFUSAL,
    BATCH_REFUSAL,
    MAX_WORKERS,
    dotted_settings,
    live_changes,
    prefetch_enabled,
    prefetch_word,
)

# The first steps of every attempt include tf.function tracing: never measure them.
WARMUP_STEPS = 5
# Steps kept for sparklines and the "current" figures.
WINDOW_STEPS = 240
# Steps the "current" figures (examples/s, input wait) are taken over.
CURRENT_STEPS = 20
LOG_TAIL_LINES = 40
# Steps per worker its figures (median step time, input wait, compute) are taken over.
WORKER_WINDOW_STEPS = 20
# The chief: the headline figures are its own.
CHIEF = 0
# A running run's figures are stale once no step has come for this many step times (and
# at least STALE_MIN_S): a live change being applied, a hung collective, a stalled input.
STALE_STEP_TIMES = 5
STALE_MIN_S = 5.0

PREFETCH_KEY = "data.prefetch"
ACCUMULATION_KEY = "train.accumulation_steps"
BATCH_KEY = "train.global_batch_size"


# Dirty areas, so the app repaints only the widgets whose inputs changed.
AREAS = (
    "header", "metrics", "devices", "history", "attempts", "status", "link", "pending", "workers",
    "gpu_history", "plots", "scaling",
)


@dataclass(frozen=True, slots=True)
class StepPoint:
    """A step as the dashboard holds it: the trainer's Step, when it ended, and whether
    it was one of its attempt's first WARMUP_STEPS (tracing, never measured).

    The step's fields are the protocol's (``protocol.Step``), read through: this class
    lists none of them.
    """

    event: Step
    t: float | None = None
    warmup: bool = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.event, name)


def steps_input_wait_pct(steps: Iterable[StepPoint]) -> float | None:
    """Input-wait % over several steps: sum(input_wait_ms) / sum(step_time_ms), over the
    steps whose input wait was measured (None: none was; a script's loop may not let it)."""
    points = [p for p in steps if p.input_wait_ms is not None]
    if not points:
        return None
    return input_wait_pct(
        sum(p.input_wait_ms for p in points), sum(p.step_time_ms for p in points)
    )


def pace_setter(values: Mapping[int, float | None]) -> tuple[int, float] | None:
    """(worker, its figure) of the worker whose figure is largest (a tie: the lowest index).

    None when no worker has the figure. Under synchronous training every step waits for
    the slowest worker: a cluster's input wait is the largest of its workers' (the
    current figures, each attempt's), and the straggler rule (advisor.find_straggler)
    takes its candidate from here too.
    """
    known = [(worker, float(value)) for worker, value in values.items() if value is not None]
    if not known:
        return None
    return max(known, key=lambda pair: (pair[1], -pair[0]))


def _weighted_median(pairs: Iterable[tuple[float | None, int]]) -> float | None:
    """The median of values that each stand for `count` steps (summaries' medians): the
    value at which half the steps are covered. None without any."""
    known = sorted((value, count) for value, count in pairs if value is not None and count > 0)
    half = sum(count for _, count in known) / 2.0
    covered = 0
    for value, count in known:
        covered += count
        if covered >= half:
            return value
    return None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


@dataclass(frozen=True, slots=True)
class WorkerStep:
    """What a worker's figures keep of one of its steps (the window holds no full events)."""

    step_time_ms: float
    input_wait_ms: float | None
    compute_ms: float | None
    examples: int
    breakdown: Breakdown | None = None


@dataclass
class WorkerFigures:
    """One worker of the current attempt, folded in O(1) per event (a fixed window)."""

    worker: int
    attempt: int = 0
    host: str = ""
    hello: Hello | None = None
    status: str = "starting"  # starting | running | done | error | crashed
    steps_seen: int = 0
    last_step: int | None = None
    window: deque[WorkerStep] = field(
        default_factory=lambda: deque(maxlen=WORKER_WINDOW_STEPS)
    )
    # Past SUMMARY_PAST_WORKERS workers its steps come as summaries: the latest that
    # cover at least WORKER_WINDOW_STEPS steps, and how many they cover.
    summaries: deque[StepSummary] = field(default_factory=deque)
    summarized_steps: int = 0
    # (what it was made from, the WorkerSummary): at 64 workers a repaint remakes only the
    # summaries of the workers that sent something since the last one.
    made: Any = field(default=None, metadata=snapshot.LOCAL, repr=False, compare=False)

    def start_attempt(self, attempt: int) -> None:
        """A newer attempt: its figures start over (never mixed across settings)."""
        self.attempt = attempt
        self.status = "starting"
        self.steps_seen = 0
        self.last_step = None
        self.window.clear()
        self.summaries.clear()
        self.summarized_steps = 0

    def add_summary(self, event: StepSummary) -> None:
        self.summaries.append(event)
        self.summarized_steps += event.count
        while (len(self.summaries) > 1
               and self.summarized_steps - self.summaries[0].count >= WORKER_WINDOW_STEPS):
            self.summarized_steps -= self.summaries.popleft().count

    @property
    def workers(self) -> int:
        return self.hello.workers if self.hello is not None and self.hello.workers > 0 else 1

    @property
    def replicas(self) -> int | None:
        """This worker's own replicas: on CPU one per worker, else its devices."""
        hello = self.hello
        if hello is None:
            return None
        if hello.device_kind == "cpu" or not hello.devices:
            return max(1, hello.replicas // self.workers)
        return len(hello.devices)


@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """A worker's figures as the screen and the straggler rule read them (None: not known).

    Over its last WORKER_WINDOW_STEPS steps after warm-up: medians, but input wait % is
    sum(input_wait_ms) / sum(step_time_ms), as everywhere (``steps_input_wait_pct``);
    examples/s is its share of the update (examples / workers) over its own step time.
    """

    worker: int
    host: str
    replicas: int | None
    status: str
    last_step: int | None
    measured_steps: int
    step_time_ms: float | None
    input_wait_pct: float | None
    input_wait_ms: float | None
    compute_ms: float | None
    examples_per_s: float | None
    sample: dict[str, Any] | None
    breakdown: Breakdown | None = None  # its window's steps together (None: not timed)
    summarized: bool = False  # from its 1 s summaries (medians at their resolution)

    @property
    def measured(self) -> bool:
        """It has steps after warm-up with a time: only those workers are compared."""
        return self.step_time_ms is not None and self.measured_steps > 0

    @property
    def busy_ms(self) -> float | None:
        """Time of a step spent on its own work (input + compute), or its step time."""
        if self.input_wait_ms is not None and self.compute_ms is not None:
            return self.input_wait_ms + self.compute_ms
        return self.step_time_ms


@dataclass
class WorkerWait:
    """One worker's input wait over an attempt: its sums over its steps after warm-up."""

    steps_seen: int = 0
    measured_steps: int = 0
    sum_step_time_ms: float = 0.0
    sum_input_wait_ms: float = 0.0
    breakdown: Breakdown | None = None  # the same steps' parts together (None: not timed)

    @property
    def input_wait_pct(self) -> float | None:
        if not self.measured_steps:
            return None
        return input_wait_pct(self.sum_input_wait_ms, self.sum_step_time_ms)


@dataclass
class AttemptSummary:
    """One attempt: what it ran with and what it measured after warm-up.

    Its figures are the chief's, but for input wait in a cluster: the worker's that
    waits most (``input_wait_worker``), from every worker's sums (``worker_waits``).
    """

    attempt: int
    settings: dict[str, Any] = field(default_factory=dict)
    fresh: bool = False
    reason: str | None = None
    started_t: float | None = None
    hello: Hello | None = None
    steps_seen: int = 0
    first_step: int | None = None
    last_step: int | None = None
    measured_steps: int = 0
    sum_step_time_ms: float = 0.0
    sum_input_wait_ms: float = 0.0
    # The step time of the measured steps whose input wait was measured (a script's loop
    # may not let it be: those steps count in neither sum).
    sum_waited_ms: float = 0.0
    sum_grad_sync_bytes: float = 0.0
    # The measured steps' breakdown together (None: none timed apart), and the all-reduce
    # bytes of those steps, for the bus bandwidth.
    breakdown: Breakdown | None = None
    sum_timed_sync_bytes: float = 0.0
    # examples/s of every measured step, for the median: bounded (exact for a short attempt)
    rates: MedianSketch = field(default_factory=MedianSketch)
    end: str | None = None  # "done: max_steps", "crashed: exit 1", ...
    resume: Resume | None = None  # where it resumed: step, data position, data order
    workers: int = 1  # the cluster size its chief's hello gave (1: one host)
    worker_waits: dict[int, WorkerWait] = field(default_factory=dict)  # by worker

    @property
    def data_restarted(self) -> str | None:
        """Why the data order started over on this attempt's resume, or None if it did not."""
        if self.resume is None or self.resume.data_order != "restarted":
            return None
        return self.resume.data_note or "data order restarted"

    @property
    def measured(self) -> bool:
        return self.measured_steps > 0 and self.sum_step_time_ms > 0

    @property
    def input_wait_pct(self) -> float | None:
        """sum(input_wait_ms) / sum(step_time_ms) over the steps after warm-up, in %: the
        chief's on one host, in a cluster the worker's that waits most."""
        pace = self._input_pace()
        if pace is not None:
            return pace[1]
        if not self.measured or self.sum_waited_ms <= 0:
            return None
        return input_wait_pct(self.sum_input_wait_ms, self.sum_waited_ms)

    @property
    def input_wait_worker(self) -> int | None:
        """Whose input wait ``input_wait_pct`` is, in a cluster; None on one host."""
        pace = self._input_pace()
        return None if pace is None else pace[0]

    def _input_pace(self) -> tuple[int, float] | None:
        if self.workers <= 1:
            return None
        return pace_setter({w: wait.input_wait_pct for w, wait in self.worker_waits.items()})

    @property
    def input_breakdown(self) -> Breakdown | None:
        """The breakdown of the steps ``input_wait_pct`` is over: the chief's measured steps
        on one host, in a cluster the waiting worker's (the summary's five shares)."""
        pace = self._input_pace()
        if pace is None:
            return self.breakdown
        wait = self.worker_waits.get(pace[0])
        return wait.breakdown if wait is not None else None

    @property
    def median_examples_per_s(self) -> float | None:
        return self.rates.median()

    @property
    def grad_sync_bytes_per_s(self) -> float | None:
        if not self.measured:
            return None
        return per_second(self.sum_grad_sync_bytes, self.sum_step_time_ms)

    @property
    def bus_bytes_per_s(self) -> float | None:
        """All-reduce bus bandwidth over the measured steps (``bus_bandwidth``)."""
        return bus_bandwidth(self.sum_timed_sync_bytes, self.breakdown)

    @property
    def prefetch(self) -> Any:
        return get_setting(self.settings, PREFETCH_KEY)

    @property
    def accumulation_steps(self) -> Any:
        return get_setting(self.settings, ACCUMULATION_KEY)

    @property
    def global_batch_size(self) -> Any:
        return get_setting(self.settings, BATCH_KEY)


@dataclass(frozen=True, slots=True)
class Figures:
    """The current attempt's figures at one moment (``RunState.figures``), each taken once.

    Every panel that shows one of them reads it here, so a figure shown twice is the same
    value: over the chief's latest CURRENT_STEPS steps after warm-up (examples/s and step
    time their medians, input wait and gradient sync their sums' ratio); in a cluster the
    input wait is the worker's that waits most, over its own latest steps, and
    ``input_wait_worker`` says whose.
    """

    examples_per_s: float | None = None
    step_time_ms: float | None = None
    input_wait_pct: float | None = None
    input_wait_worker: int | None = None  # whose input wait, in a cluster; None on one host
    grad_sync_bytes_per_s: float | None = None
    workers: tuple[WorkerSummary, ...] = ()  # every worker's figures, in a cluster
    # Achieved TFLOP/s at examples_per_s (the traced FLOPs per example), and that over the
    # GPUs' dense peak where known (RunState.flops_figures).
    tflops: float | None = None
    mfu_pct: float | None = None
    # The chief's latest steps' breakdown together (input, compute, all-reduce, update,
    # other; None: not timed apart), and the all-reduce bus bandwidth they achieved.
    breakdown: Breakdown | None = None
    bus_bytes_per_s: float | None = None
    # The link that all-reduce crosses, from the chief's host sample (peaks.link_peak;
    # None: no GPU, not told, or across hosts), and the bus bandwidth as a share of it.
    link: peaks.LinkPeak | None = None
    bus_pct_of_link: float | None = None


def share_of_link(bus_bytes_per_s: float | None, link: peaks.LinkPeak | None) -> float | None:
    """A bus bandwidth as a % of the link's peak; None when either is not known."""
    if link is None or bus_bytes_per_s is None or link.bytes_per_s <= 0:
        return None
    return 100.0 * bus_bytes_per_s / link.bytes_per_s


def bus_bandwidth(sync_bytes: float, timed: Breakdown | None) -> float | None:
    """Bus bandwidth as nccl-tests defines it: bytes all-reduced x 2(n-1)/n (a step's
    ``grad_sync_bytes``) over the all-reduce time, in bytes/s; None with no time or bytes."""
    if timed is None or sync_bytes <= 0:
        return None
    return per_second(sync_bytes, timed.sync_ms)


def step_figures(
    points: Sequence[StepPoint], workers: Sequence[WorkerSummary] = ()
) -> Figures:
    """The figures of the chief's steps ``points``; with a cluster's ``workers``, the input
    wait of the measured worker that waits most (``pace_setter``), named."""
    wait, whose = steps_input_wait_pct(points), None
    parts = [(p, p.event.breakdown) for p in points]
    timed = sum_breakdowns(b for _, b in parts)
    if workers:
        pace = pace_setter({w.worker: w.input_wait_pct for w in workers if w.measured})
        if pace is not None:
            whose, wait = pace
    return Figures(
        examples_per_s=_median([r for p in points if (r := p.examples_per_s)]),
        step_time_ms=_median([p.step_time_ms for p in points]),
        input_wait_pct=wait,
        input_wait_worker=whose,
        grad_sync_bytes_per_s=per_second(
            sum(p.grad_sync_bytes for p in points), sum(p.step_time_ms for p in points)
        ),
        workers=tuple(workers),
        breakdown=timed,
        bus_bytes_per_s=bus_bandwidth(
            sum(p.grad_sync_bytes for p, b in parts if b is not None), timed
        ),
    )


@dataclass
class RunState:
    """Everything the dashboard knows about one run, folded from its events."""

    run_id: str | None = None
    name: str | None = None
    host: str | None = None
    created_t: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    attempts: dict[int, AttemptSummary] = field(default_factory=dict)
    attempt: int = 0
    scale: Scale | None = None  # a scaling probe's plan (gpuwatch/scaling.py reads it)
    status: str | None = None
    status_message: str | None = None
    status_worker: int | None = None  # the worker whose exit set the status, in a cluster
    exit_code: int | None = None
    signal: int | str | None = None
    log_tail: list[str] = field(default_factory=list)
    hello: Hello | None = None
    last_step: StepPoint | None = None
    window: deque[StepPoint] = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS))
    sample: dict[str, Any] | None = None  # the chief's host
    gpu_history: DeviceHistory = field(default_factory=DeviceHistory)  # the chief's host
    run_history: RunHistory = field(default_factory=RunHistory)  # the chief's steps
    samples: dict[int, dict[str, Any]] = field(default_factory=dict)  # by Sample.worker
    workers_seen: dict[int, WorkerFigures] = field(default_factory=dict)
    last_seq: int = -1
    last_t: float | None = None
    # The dashboard's own connection: not part of the run, never in a snapshot.
    link_state: str | None = field(default=None, metadata=snapshot.LOCAL)
    link_message: str | None = field(default=None, metadata=snapshot.LOCAL)
    # Live changes a trainer refused, counted (each worker's refusal): what the dashboard's
    # "applying" waits for, besides the new attempt. Seen live only, never in a snapshot.
    refusals: int = field(default=0, metadata=snapshot.LOCAL)
    error: Error | None = None
    done: Done | None = None
    # A person's own command (gpuwatch run): what its hook last said it watches, or why
    # not, in the current attempt (None: nothing yet, or not a Python command at all).
    hook: Hook | None = None
    last_checkpoint: Checkpoint | None = None
    dropped: int = 0
    events_applied: int = 0
    duplicates_skipped: int = 0
    bad_events: int = 0  # frames that are not a protocol event (counted, skipped)
    changed: set[str] = field(default_factory=lambda: set(AREAS), metadata=snapshot.LOCAL)

    # ---- folding -------------------------------------------------------

    def apply_many(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, frame: Mapping[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "link":  # the link's own news, not a protocol event
            self._on_link(frame)
            self.events_applied += 1
            return
        if kind == SNAPSHOT:  # the fold up to a seq, from the supervisor (client.py joins it)
            self._on_snapshot(frame)
            return
        try:
            envelope, event = parse_event(frame)
        except ProtocolError:
            self.bad_events += 1
            return
        self.apply_event(envelope, event)

    def apply_event(self, envelope: Envelope, event: Event) -> None:
        """Fold one event already read by parse_event (apply() reads a frame, then this)."""
        if envelope.seq is not None:
            if envelope.seq <= self.last_seq:
                self.duplicates_skipped += 1
                return
            self.last_seq = envelope.seq
        if envelope.t is not None:
            self.last_t = envelope.t
        _HANDLERS[type(event)](self, event, envelope.t)
        self.events_applied += 1

    # ---- snapshots -----------------------------------------------------

    def to_snapshot(self) -> str:
        """The state as snapshot text (gpuwatch/snapshot.py); its seq is ``last_seq``."""
        return snapshot.dumps(self)

    @classmethod
    def snapshot_format(cls) -> str | None:
        """The format to_snapshot() writes (None: this RunState cannot be snapshotted)."""
        try:
            return snapshot.schema_id(cls)
        except snapshot.SnapshotError:
            return None

    @classmethod
    def from_snapshot(cls, text: str | bytes) -> RunState:
        """A state from to_snapshot()'s text; SnapshotError if unreadable or of another schema."""
        state = snapshot.loads(cls, text)
        assert isinstance(state, cls)
        return state

    def _on_snapshot(self, frame: Mapping[str, Any]) -> None:
        """Take the supervisor's fold as this state (keeping the link's own fields)."""
        try:
            restored = RunState.from_snapshot(frame.get("data") or "")
        except snapshot.SnapshotError:
            self.bad_events += 1
            return
        if restored.last_seq <= self.last_seq:  # older than what was already folded
            self.duplicates_skipped += 1
            return
        for f in fields(self):
            if snapshot.snapshotted(f):
                setattr(self, f.name, getattr(restored, f.name))
        self.changed.update(AREAS)

    def take_changes(self) -> set[str]:
        """The areas changed since the last call (the app repaints only those)."""
        changed, self.changed = self.changed, set()
        return changed

    def _attempt(self, number: int) -> AttemptSummary:
        summary = self.attempts.get(number)
        if summary is None:
            summary = AttemptSummary(attempt=number)
            self.attempts[number] = summary
        return summary

    def _worker(self, worker: int, attempt: int) -> WorkerFigures | None:
        """The figures of `worker` for `attempt` (a newer attempt starts them over);
        None for an older attempt's late event or an index no cluster can have."""
        if not 0 <= worker < MAX_WORKERS:
            return None
        figures = self.workers_seen.get(worker)
        if figures is None:
            figures = WorkerFigures(worker=worker)
            self.workers_seen[worker] = figures
        if attempt > figures.attempt:
            figures.start_attempt(attempt)
        elif attempt < figures.attempt:
            return None
        self.changed.add("workers")
        return figures

    def _on_link(self, event: Mapping[str, Any]) -> None:
        self.link_state = event.get("state")
        self.link_message = event.get("message")
        self.changed.update(("link", "header"))

    # ---- derived figures ---------------------------------------------

    @property
    def replicas(self) -> int:
        """Replicas of the current attempt (hello), else the config's replicas (strategy.replicas,
        else its CPU replicas), else 1."""
        if self.hello is not None:
            return self.hello.replicas
        value = get_setting(self.settings, "strategy.replicas")
        if value is None:
            value = get_setting(self.settings, "strategy.cpu_replicas")
        return int(value) if isinstance(value, int) and value > 0 else 1

    @property
    def workers(self) -> int:
        """Workers in the current attempt: its hellos, else the config's cluster, else 1."""
        if self.hello is not None and self.hello.attempt == self.attempt:
            return max(1, self.hello.workers)
        for figures in self.workers_seen.values():
            if figures.attempt == self.attempt and figures.hello is not None:
                return figures.workers
        cluster = get_setting(self.settings, "cluster.workers")
        if isinstance(cluster, list) and cluster:
            return len(cluster)
        return 1

    def worker_summaries(self) -> list[WorkerSummary]:
        """Every worker of the current attempt, by index, with its medians and host sample."""
        # Each worker's summary is remade only when something of it changed (_summaries).
        current = [f for f in self.workers_seen.values() if f.attempt == self.attempt]
        return _summaries(current, self.samples)

    @property
    def current(self) -> AttemptSummary | None:
        return self.attempts.get(self.attempt)

    def recent_steps(self, count: int = CURRENT_STEPS) -> list[StepPoint]:
        """The latest steps of the current attempt, warm-up steps left out (oldest first)."""
        points: list[StepPoint] = []
        for point in reversed(self.window):  # newest first: usually `count` looks suffice
            if len(points) >= count:
                break
            if point.event.attempt == self.attempt and not point.warmup:
                points.append(point)
        points.reverse()
        return points

    def figures(self) -> Figures:
        """The current figures, each computed once (see ``Figures``): take them once per
        repaint and give them to every part of the screen that shows one."""
        workers = tuple(self.worker_summaries()) if self.workers > 1 else ()
        figures = step_figures(self.recent_steps(), workers)
        _, tflops, mfu = self.flops_figures(figures.examples_per_s)
        link = peaks.link_peak((self.samples.get(CHIEF) or {}).get("gpus"), self.workers)
        return replace(figures, tflops=tflops, mfu_pct=mfu, link=link,
                       bus_pct_of_link=share_of_link(figures.bus_bytes_per_s, link))

    def no_step_for_s(self, now: float) -> float | None:
        """Seconds since the chief's last step while the run is running and that is several
        step times (STALE_STEP_TIMES, at least STALE_MIN_S): its figures are stale. Else None.
        """
        point = self.last_step
        if self.status != "running" or point is None or point.t is None:
            return None
        step_ms = step_figures(self.recent_steps()).step_time_ms or point.event.step_time_ms
        waited = now - point.t
        if waited < max(STALE_MIN_S, STALE_STEP_TIMES * step_ms / 1000.0):
            return None
        return waited

    @property
    def flops_per_example(self) -> float | None:
        """The current attempt's FLOPs per example (its chief's hello), or None."""
        summary = self.current
        hello = summary.hello if summary is not None and summary.hello is not None else None
        if hello is None and self.hello is not None and self.hello.attempt == self.attempt:
            hello = self.hello
        return hello.flops_per_example if hello is not None else None

    def flops_figures(self, examples_per_s: float | None
                      ) -> tuple[float | None, float | None, float | None]:
        """(FLOPs per example, achieved TFLOP/s, MFU %) of the current attempt at a rate.

        MFU is None where the peak is not known: no GPU, a GPU not in the table, or a
        precision it has no tensor cores for (gpuwatch/peaks.py).
        """
        flops = self.flops_per_example
        current = self.current
        settings = current.settings if current is not None and current.settings else self.settings
        precision = peaks.settings_precision(settings)
        return (flops, peaks.achieved_tflops(flops, examples_per_s),
                peaks.mfu_pct(flops, examples_per_s, self.replica_gpu_names(), precision))

    def replica_gpu_names(self) -> list[str | None]:
        """The product name of every replica's GPU, all workers ([]: no GPU; None: not known).

        A worker's replicas run on its host's GPUs; a host whose GPUs all have one
        name gives that name to each replica, one with mixed GPUs (which one a
        replica has is not known here) or a MIG slice gives None.
        """
        hello = self.hello
        if hello is None or hello.device_kind != "gpu":
            return []
        names: list[str | None] = []
        summaries = {w.worker: w for w in self.worker_summaries()}
        for worker in range(self.workers):
            summary = summaries.get(worker)
            if summary is None or summary.replicas is None:
                names.append(None)  # a worker not heard from: its GPUs are not known
                continue
            gpus = (summary.sample or {}).get("gpus") or []
            host_names = {None if g.get("mig") else g.get("name") for g in gpus
                          if isinstance(g, dict)}
            name = host_names.pop() if len(host_names) == 1 else None
            names.extend([name] * summary.replicas)
        return names

    def elapsed_s(self, now: float) -> float | None:
        """Seconds since the run was created; stops at the last event once it ended."""
        if self.created_t is None:
            return None
        end = now
        if self.terminal and self.last_t:
            end = self.last_t
        return max(0.0, end - self.created_t)

    @property
    def terminal(self) -> bool:
        """The run has ended (trainer_runtime.protocol.TERMINAL_STATUSES)."""
        return self.status in TERMINAL_STATUSES

    @property
    def failed(self) -> bool:
        """The run ended badly: the trainer crashed or the supervisor was lost."""
        return self.status in FAILED_STATUSES

    @property
    def command(self) -> list[str] | None:
        """A person's own command's argv (gpuwatch run), or None: the bundled runtime."""
        return command_argv(self.settings)

    def command_view(self) -> CommandView | None:
        """What the screen says of a person's own command (None: not a command run)."""
        return command_view(self)


# What the screen says of a command that sends no step (a program that is not Python, or
# Python that never imports TensorFlow): only its processes and devices are watched.
NOT_TENSORFLOW = "no step metrics: not a TensorFlow program"


@dataclass(frozen=True, slots=True)
class CommandView:
    """A person's own command as the screen says it (``RunState.command_view``).

    ``line``: "script: python train.py · fit · MirroredStrategy" ("command:" until its hook
    speaks: maybe not Python at all); ``note``: why there are no step metrics ("not
    watched: ...", NOT_TENSORFLOW), None when they can come; ``input_wait``: "input wait:
    not measurable for this loop (...)", said where the figure would be, else None.
    """

    command: str  # the argv as a shell would read it
    kind: str  # "script" once its hook spoke, else "command"
    watched: tuple[str, ...] = ()  # the hook's loop and strategy, once seen
    note: str | None = None
    input_wait: str | None = None

    @property
    def head(self) -> str:
        return f"{self.kind}: "

    @property
    def tail(self) -> str:
        return "".join(f" · {part}" for part in self.watched)

    @property
    def line(self) -> str:
        return f"{self.head}{self.command}{self.tail}"


def command_view(state: RunState) -> CommandView | None:
    """What the screen says of a person's own command (None: not a command run)."""
    argv = state.command
    if argv is None:
        return None
    hook = state.hook
    watched = tuple(part for part in (hook.loop, hook.strategy) if part) if hook else ()
    note = None
    stepped = state.last_step is not None and state.last_step.event.attempt == state.attempt
    if hook is not None and not hook.installed:
        note = f"not watched: {hook.message or 'the hook could not install'}"
    elif (hook is None or not hook.tensorflow) and not stepped:
        # The process runs (a command is running as soon as it started): no hook at all
        # is a program that is not Python; a hook without TensorFlow, a Python one that
        # has not imported it (so far: a script imports it when it gets there).
        started = state.status not in (None, "starting")
        if started:
            note = NOT_TENSORFLOW + ("" if state.terminal else " (so far)")
    input_wait = None
    if hook is not None and hook.input_wait:
        input_wait = f"input wait: not measurable for this loop ({hook.input_wait})"
    kind = "script" if hook is not None else "command"
    return CommandView(shell_text(argv), kind, watched, note, input_wait)


def shell_text(argv: Sequence[str]) -> str:
    """argv as a shell would read it (shlex quoting), on one line of printable text."""
    import shlex

    text = " ".join(shlex.quote(arg) for arg in argv)
    return "".join(char if char.isprintable() else "?" for char in text)


def _summaries(current: list[WorkerFigures], samples: Mapping[int, dict[str, Any]]
               ) -> list[WorkerSummary]:
    """The workers' summaries by index, each with its host's latest sample (workers on one
    host share one sampler: theirs is that host's)."""
    by_host: dict[str, dict[str, Any]] = {}
    for figures in current:
        sample = samples.get(figures.worker)
        if sample is not None and figures.host:
            by_host.setdefault(figures.host, sample)
    out: list[WorkerSummary] = []
    for figures in sorted(current, key=lambda f: f.worker):
        sample = samples.get(figures.worker) or by_host.get(figures.host)
        key = (figures.attempt, figures.steps_seen, figures.last_step, figures.status,
               figures.host, id(figures.hello), figures.summarized_steps,
               id(figures.summaries[-1]) if figures.summaries else None,
               id(sample), sample.get("t") if sample else None)
        if figures.made is None or figures.made[0] != key:
            figures.made = (key, _summarize(figures, sample))
        out.append(figures.made[1])
    return out


def _summarize(figures: WorkerFigures, sample: dict[str, Any] | None) -> WorkerSummary:
    if figures.summaries:
        return _from_summaries(figures, sample)
    steps = list(figures.window)
    share = 1.0 / figures.workers  # each worker trains its share of the update's examples
    computes = [s.compute_ms for s in steps if s.compute_ms is not None]
    waited = [(s.step_time_ms, s.input_wait_ms) for s in steps if s.input_wait_ms is not None]
    return _worker_summary(
        figures, sample,
        measured_steps=len(steps),
        step_time_ms=_median([s.step_time_ms for s in steps]),
        input_wait_pct=_wait_pct(waited),
        input_wait_ms=_median([wait for _, wait in waited]),
        compute_ms=_median(computes),
        examples_per_s=_median(
            [r for s in steps if (r := per_second(s.examples * share, s.step_time_ms)) is not None]
        ),
        breakdown=sum_breakdowns(s.breakdown for s in steps),
    )


def _worker_summary(figures: WorkerFigures, sample: dict[str, Any] | None,
                    **measured: Any) -> WorkerSummary:
    """A worker's summary: who and where it is, and its `measured` figures."""
    return WorkerSummary(worker=figures.worker, host=figures.host, replicas=figures.replicas,
                         status=figures.status, last_step=figures.last_step, sample=sample,
                         **measured)


def _wait_pct(waited: Sequence[tuple[float, float]]) -> float | None:
    """Input wait % of (step time, input wait) pairs: sum over sum (None: no pairs)."""
    if not waited:
        return None
    return input_wait_pct(sum(wait for _, wait in waited), sum(step for step, _ in waited))


def _from_summaries(figures: WorkerFigures, sample: dict[str, Any] | None) -> WorkerSummary:
    """_summarize's figures from a worker's latest summaries: medians of their medians
    (each counted for its steps), input wait % and the breakdown from their sums."""
    summaries = list(figures.summaries)
    share = 1.0 / figures.workers

    def median_of(name: str) -> float | None:
        return _weighted_median((s.figure(name, "median"), s.count) for s in summaries)

    waited = [(step, wait) for s in summaries
              if (step := s.figure("step_time_ms", "sum")) is not None
              and (wait := s.figure("input_wait_ms", "sum")) is not None]
    rates = []
    for s in summaries:
        median = s.figure("step_time_ms", "median")
        rate = per_second(s.examples / s.count * share, median) if median is not None else None
        rates.append((rate, s.count))
    return _worker_summary(
        figures, sample,
        measured_steps=figures.summarized_steps,
        step_time_ms=median_of("step_time_ms"),
        input_wait_pct=_wait_pct(waited),
        input_wait_ms=median_of("input_wait_ms"),
        compute_ms=median_of("compute_ms"),
        examples_per_s=_weighted_median(rates),
        breakdown=sum_breakdowns(s.breakdown for s in summaries),
        summarized=True,
    )


# ---- folding: one function per event type (RunState.apply_event dispatches) ----------


def _on_run(state: RunState, event: Run, t: float | None) -> None:
    state.run_id = event.run_id or state.run_id
    state.host = event.host or state.host
    state.created_t = event.created or t or state.created_t
    if not state.settings:
        state.settings = dict(event.settings)
    state.name = event.name or event.settings.get("name") or state.name
    state.changed.update(("header", "pending"))


def _on_scale(state: RunState, event: Scale, t: float | None) -> None:
    state.scale = event
    state.changed.update(("header", "scaling"))


def _on_attempt(state: RunState, event: Attempt, t: float | None) -> None:
    if event.attempt > state.attempt and event.reason != "live":
        state.hook = None  # a new process: its hook says again what it watches
    summary = state._attempt(event.attempt)
    summary.settings = dict(event.settings)
    state.settings = dict(event.settings)
    state.name = event.settings.get("name") or state.name
    summary.fresh = event.fresh
    summary.reason = event.reason
    summary.started_t = t
    previous = state.attempts.get(event.attempt - 1)
    if event.reason == "live" and previous is not None:
        # The same trainer goes on with new settings: no hello of its own, and the
        # attempt before it ended by this change (the attempts table says "live").
        previous.end = previous.end or "live"
        summary.hello = summary.hello or previous.hello
        summary.workers = previous.workers
    state.attempt = max(state.attempt, event.attempt)
    state.changed.update(("header", "attempts", "pending", "metrics", "scaling"))


def _on_hello(state: RunState, event: Hello, t: float | None) -> None:
    figures = state._worker(event.worker, event.attempt)
    if figures is not None:
        figures.hello = event
        figures.host = event.host or figures.host
        figures.status = "running"
    if event.worker != CHIEF:
        return
    state.hello = event
    summary = state._attempt(event.attempt)
    summary.hello = event
    summary.workers = max(1, event.workers)
    state.attempt = max(state.attempt, event.attempt)
    state.changed.update(("devices", "header", "pending", "metrics", "attempts"))


def _on_step(state: RunState, event: Step, t: float | None) -> None:
    # The event's fields read once each (the dashboard folds 100 steps a second).
    attempt, worker, number = event.attempt, event.worker, event.step
    step_time_ms = event.step_time_ms
    timed = event.breakdown
    figures = state._worker(worker, attempt)
    if figures is not None:
        figures.steps_seen += 1
        figures.last_step = number
        if figures.status == "starting":
            figures.status = "running"
        if figures.steps_seen > WARMUP_STEPS and step_time_ms > 0:
            figures.window.append(
                WorkerStep(step_time_ms, event.input_wait_ms, event.compute_ms, event.examples,
                           timed)
            )
    if worker != CHIEF:  # the headline is the chief's: nothing counted twice
        # But its input wait counts in its attempt's: the others may wait for it.
        other = state.attempts.get(attempt)
        if (other is not None and 0 <= worker < MAX_WORKERS
                and _add_wait(other, worker, step_time_ms, event.input_wait_ms, timed)):
            state.changed.add("attempts")
        return
    summary = state._attempt(attempt)
    point = StepPoint(event, t, summary.steps_seen < WARMUP_STEPS)
    state.last_step = point
    state.window.append(point)
    state.dropped = event.dropped or state.dropped
    summary.steps_seen += 1
    # The event's fields, not the point's: StepPoint reads through a slow __getattr__,
    # and the supervisor folds every step it records through here.
    if summary.first_step is None:
        summary.first_step = number
    summary.last_step = number
    state.run_history.add(event, warmup=point.warmup)
    changed = state.changed
    _add_wait(summary, worker, step_time_ms, event.input_wait_ms, timed)
    if summary.steps_seen > WARMUP_STEPS and step_time_ms > 0:
        summary.measured_steps += 1
        summary.sum_step_time_ms += step_time_ms
        if event.input_wait_ms is not None:
            summary.sum_input_wait_ms += event.input_wait_ms
            summary.sum_waited_ms += step_time_ms
        summary.sum_grad_sync_bytes += event.grad_sync_bytes
        if timed is not None:
            summary.breakdown = timed if summary.breakdown is None else summary.breakdown + timed
            summary.sum_timed_sync_bytes += event.grad_sync_bytes
        rate = event.examples_per_s
        if rate is not None:
            summary.rates.add(rate)
        changed.add("attempts")
    changed.update(_STEP_AREAS)


def _on_step_summary(state: RunState, event: StepSummary, t: float | None) -> None:
    # A worker's steps of about a second (summarize.py): its figures, and its input wait
    # in its attempt's; never the headline, which is the chief's steps.
    if event.count <= 0:
        return
    figures = state._worker(event.worker, event.attempt)
    if figures is not None:
        figures.steps_seen += event.count
        figures.last_step = event.last_step
        if figures.status == "starting":
            figures.status = "running"
        step_sum = event.figure("step_time_ms", "sum")
        if step_sum is not None and step_sum > 0:
            figures.add_summary(event)
    other = state.attempts.get(event.attempt)
    if other is None or not 0 <= event.worker < MAX_WORKERS:
        return
    wait = other.worker_waits.get(event.worker)
    if wait is None:
        wait = other.worker_waits[event.worker] = WorkerWait()
    wait.steps_seen += event.count
    step_sum, wait_sum = event.figure("step_time_ms", "sum"), event.figure("input_wait_ms", "sum")
    if step_sum is None or step_sum <= 0 or wait_sum is None:
        return
    wait.measured_steps += event.count
    wait.sum_step_time_ms += step_sum
    wait.sum_input_wait_ms += wait_sum
    timed = event.breakdown
    if timed is not None:
        wait.breakdown = timed if wait.breakdown is None else wait.breakdown + timed
    state.changed.add("attempts")


def _add_wait(summary: AttemptSummary, worker: int, step_time_ms: float,
              wait_ms: float | None, timed: Breakdown | None) -> bool:
    """Count a worker's step in its attempt's input wait (and breakdown); whether it was
    measured (a step without an input wait is not)."""
    wait = summary.worker_waits.get(worker)
    if wait is None:
        wait = summary.worker_waits[worker] = WorkerWait()
    wait.steps_seen += 1
    if wait.steps_seen <= WARMUP_STEPS or step_time_ms <= 0 or wait_ms is None:
        return False
    wait.measured_steps += 1
    wait.sum_step_time_ms += step_time_ms
    wait.sum_input_wait_ms += wait_ms
    if timed is not None:
        wait.breakdown = timed if wait.breakdown is None else wait.breakdown + timed
    return True


# What a step changes, always (the attempts table too once it is measured).
_STEP_AREAS = ("metrics", "history", "plots")


def _on_reconfigured(state: RunState, event: Reconfigured, t: float | None) -> None:
    # An applied change is its attempt event; a refused one settles a change in flight (the
    # relaunch command's err, or the trainer's reconfigured event, says why).
    if not event.ok:
        state.refusals += 1
        state.changed.add("pending")


def _on_sample(state: RunState, event: Sample, t: float | None) -> None:
    # The widgets read the sample as its wire fields (host/gpus are plain objects).
    sample = {"host": event.host, "gpus": event.gpus, "nvml": event.nvml, "t": t}
    if event.gpu_summary is not None:  # a summarizing worker's GPUs, summed
        sample["gpu_summary"] = event.gpu_summary
    if 0 <= event.worker < MAX_WORKERS:
        state.samples[event.worker] = sample
    if event.worker == CHIEF:
        state.sample = sample
        state.changed.add("devices")  # the workers panel repaints on it too
        if event.gpus or state.gpu_history.gpus:
            state.gpu_history.add(event.gpus, t)
            state.changed.add("gpu_history")
    else:
        state.changed.add("workers")


def _on_status(state: RunState, event: StatusChange, t: float | None) -> None:
    state.status = event.status
    number = event.attempt
    if number > 0:
        state.attempt = max(state.attempt, number)
    state.status_message = event.message
    state.status_worker = event.worker
    state.exit_code = event.exit_code
    state.signal = event.signal
    if event.log_tail:
        state.log_tail = event.log_tail[-LOG_TAIL_LINES:]
    # How an attempt ended, in the person's words: the trainer's own reason (its Done:
    # max_steps, epochs) unless the supervisor ended it (its SIGTERM is not the story).
    ended_as = {"crashed": "crashed", "stopped": "stopped", "relaunching": "relaunch"}
    if state.status in ended_as and number in state.attempts:
        summary = state.attempts[number]
        # An attempt that reached its steps before the next began (a scaling probe's
        # count) ended on its own: that is its end, not the relaunch.
        if not (state.status == "relaunching" and summary.end in ("max_steps", "epochs")):
            summary.end = ended_as[state.status]
        state.changed.add("attempts")
    if state.status == "crashed" and event.worker is not None:
        figures = state._worker(event.worker, number)
        if figures is not None and figures.status != "error":
            figures.status = "crashed"
    state.changed.update(("header", "status", "pending"))


def _on_done(state: RunState, event: Done, t: float | None) -> None:
    figures = state._worker(event.worker, event.attempt)
    if figures is not None:
        figures.status = "done"
    if event.worker != CHIEF:
        return
    state.done = event
    summary = state._attempt(event.attempt)
    if summary.end not in ("crashed", "stopped", "relaunch"):  # the supervisor's word stands
        summary.end = event.reason or "done"
    state.changed.update(("header", "attempts"))


def _on_error(state: RunState, event: Error, t: float | None) -> None:
    figures = state._worker(event.worker, event.attempt)
    if figures is not None:
        figures.status = "error"
    # The first worker's error of the newest attempt is the cause: the others' that
    # follow (a collective timing out on the chief) must not hide it.
    known = state.error
    if known is None or event.attempt > known.attempt or event.worker == known.worker:
        state.error = event
    state.changed.update(("header", "status"))


def _on_hook(state: RunState, event: Hook, t: float | None) -> None:
    # The chief's latest word of the current attempt: an older attempt's late one is not.
    if event.worker != CHIEF or event.attempt < state.attempt:
        return
    state.hook = event
    state.changed.update(("metrics", "devices", "status"))


def _on_resume(state: RunState, event: Resume, t: float | None) -> None:
    if event.worker != CHIEF:  # every worker resumes from the chief's checkpoint
        return
    state._attempt(event.attempt).resume = event
    state.changed.add("attempts")


def _on_checkpoint(state: RunState, event: Checkpoint, t: float | None) -> None:
    if event.worker == CHIEF:  # only the chief's checkpoint is the real one
        state.last_checkpoint = event


_HANDLERS: dict[type[Event], Callable[[RunState, Any, float | None], None]] = {
    Run: _on_run,
    Attempt: _on_attempt,
    Hello: _on_hello,
    Step: _on_step,
    StepSummary: _on_step_summary,
    Sample: _on_sample,
    StatusChange: _on_status,
    Done: _on_done,
    Error: _on_error,
    Checkpoint: _on_checkpoint,
    Resume: _on_resume,
    Reconfigured: _on_reconfigured,
    Scale: _on_scale,
    Hook: _on_hook,
}


# ---- settings and pending overrides -----------------------------------


def command_argv(settings: Mapping[str, Any]) -> list[str] | None:
    """The argv of a person's own command in a run's settings (gpuwatch run), else None."""
    argv = get_setting(settings, "command.argv")
    if isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv):
        return list(argv)
    return None


def get_setting(settings: Mapping[str, Any], dotted: str) -> Any:
    """``settings["data"]["prefetch"]`` for ``"data.prefetch"``; None when absent."""
    node: Any = settings
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def effective(settings: Mapping[str, Any], pending: Mapping[str, Any], dotted: str) -> Any:
    """The value a relaunch would use: the pending one, else the current one."""
    if dotted in pending:
        return pending[dotted]
    return get_setting(settings, dotted)


def pending_overrides(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> dict[str, Any]:
    """The pending changes that differ from the current settings (what relaunch sends)."""
    return {k: v for k, v in pending.items() if get_setting(settings, k) != v}


_LABELS = {
    PREFETCH_KEY: "prefetch",
    ACCUMULATION_KEY: "accumulation",
    BATCH_KEY: "batch",
    "data.parallel_calls": "parallel calls",
    "data.read_latency_ms": "read latency ms",
    "data.decode_cost": "decode cost",
    "data.cache": "cache",
}


def format_setting(dotted: str, value: Any) -> str:
    """A setting's value in a word a config file reads back the same: "off", "on", "8"."""
    if dotted == PREFETCH_KEY:
        return prefetch_word(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    return "?" if value is None else str(value)


# The attempts table's names for a setting (a column's head, or a note under a row).
_SHORT_LABELS = {
    PREFETCH_KEY: "prefetch",
    ACCUMULATION_KEY: "accum",
    BATCH_KEY: "batch",
    "data.parallel_calls": "parallel",
    "data.read_latency_ms": "read ms",
    "data.decode_cost": "decode",
    "data.cache": "cache",
    "train.learning_rate": "lr",
    "strategy.cpu_replicas": "cpu replicas",
    "strategy.replicas": "replicas",
}


def _differ(a: Any, b: Any) -> bool:
    # True == 1 in Python, but prefetch on (autotune) is not one batch of prefetch.
    return a != b or isinstance(a, bool) != isinstance(b, bool)


def differing_settings(summaries: Iterable[AttemptSummary]) -> list[str]:
    """The dotted settings whose values differ between these attempts, in the config's order.

    Keys as ``schema.dotted_settings`` splits them (``data.cache``; a deeper value such
    as the cluster's list of workers is one value); an attempt with no settings known
    is left out.
    """
    flat = [dotted_settings(s.settings) for s in summaries if s.settings]
    keys: dict[str, None] = {}
    for one in flat:
        keys.update(dict.fromkeys(one))
    return [
        key for key in keys
        if any(_differ(one.get(key), flat[0].get(key)) for one in flat[1:])
    ]


def setting_labels(keys: Iterable[str]) -> dict[str, str]:
    """Each key's short name ('read ms', 'cache', else the part after its section); the
    whole key where two would read the same (data.name and model.name)."""
    keys = list(keys)
    short = {key: _SHORT_LABELS.get(key) or key.rsplit(".", 1)[-1] for key in keys}
    counts: dict[str, int] = {}
    for label in short.values():
        counts[label] = counts.get(label, 0) + 1
    return {key: label if counts[label] == 1 else key for key, label in short.items()}


def setting_text(dotted: str, value: Any) -> str:
    """A setting's value on one line: format_setting's word, a list or an object as JSON."""
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"), default=str)
    return format_setting(dotted, value)


def pending_applies_live(
    settings: Mapping[str, Any], pending: Mapping[str, Any], *, running: bool
) -> bool:
    """Whether `r` would apply the pending changes in the running trainer (else relaunch;
    always for a person's own command, which takes no live change)."""
    overrides = pending_overrides(settings, pending)
    if not running or not overrides or command_argv(settings) is not None:
        return False
    after: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v
                             for k, v in settings.items()}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        node = after.setdefault(section, {})
        if not isinstance(node, dict) or not key or "." in key:
            return False
        node[key] = value
    live, other = live_changes(settings, after)
    return bool(live) and not other


def describe_pending(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> str:
    """'prefetch off→on, accumulation 1→2' for the overrides that change something."""
    parts = []
    for key, value in pending_overrides(settings, pending).items():
        label = _LABELS.get(key, key)
        before = format_setting(key, get_setting(settings, key))
        parts.append(f"{label} {before}→{format_setting(key, value)}")
    return ", ".join(parts)


class SettingRefused(ValueError):
    """A pending change that the run could not start with; the message says why."""


def _with(
    settings: Mapping[str, Any], pending: Mapping[str, Any], key: str, value: Any
) -> dict[str, Any]:
    updated = dict(pending)
    updated[key] = value
    return pending_overrides(settings, updated)


def toggle_prefetch(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> dict[str, Any]:
    """Flip data.prefetch: any enabled form (True, 'autotune', N) -> False, off -> True."""
    enabled = prefetch_enabled(effective(settings, pending, PREFETCH_KEY))
    return _with(settings, pending, PREFETCH_KEY, not enabled)


def check_pending(settings: Mapping[str, Any], pending: Mapping[str, Any], replicas: int) -> None:
    """SettingRefused, with the schema's reason, if a relaunch with `pending` would be refused.

    The same checks as `gpuwatch train` and the supervisor's relaunch: the whole config
    through the schema (bounds, limits of the built-in data) and the split of the global
    batch over replicas x accumulation steps.
    """
    from gpuwatch.config import ConfigError, apply_overrides, check_replicas
    from trainer_runtime.schema import RunConfig

    try:
        current = RunConfig.model_validate(dict(settings))
    except ValueError:
        return  # settings from another version of gpuwatch: the supervisor still checks
    try:
        config = apply_overrides(current, pending_overrides(settings, pending), source="pending")
        check_replicas(config, replicas, source="pending")
    except ConfigError as exc:
        raise SettingRefused(str(exc).removeprefix("pending: ")) from None


def step_accumulation(
    settings: Mapping[str, Any], pending: Mapping[str, Any], *, up: bool, replicas: int
) -> dict[str, Any]:
    """Double (up) or halve accumulation steps; raises SettingRefused if it cannot split,
    or for a person's own command (ACCUMULATION_REFUSAL)."""
    if command_argv(settings) is not None:
        raise SettingRefused(ACCUMULATION_REFUSAL)
    accumulation = int(effective(settings, pending, ACCUMULATION_KEY) or 1)
    if up:
        new = accumulation * 2
    else:
        if accumulation <= 1:
            raise SettingRefused("accumulation is already 1 (no accumulation)")
        new = max(1, accumulation // 2)
    changed = _with(settings, pending, ACCUMULATION_KEY, new)
    check_pending(settings, changed, replicas)
    return changed


def step_batch(
    settings: Mapping[str, Any], pending: Mapping[str, Any], *, up: bool, replicas: int
) -> dict[str, Any]:
    """Double (up) or halve the global batch; raises SettingRefused if it cannot split, or
    for a person's own command (BATCH_REFUSAL)."""
    if command_argv(settings) is not None:
        raise SettingRefused(BATCH_REFUSAL)
    batch = int(effective(settings, pending, BATCH_KEY) or 1)
    if up:
        new = batch * 2
    else:
        if batch % 2:
            raise SettingRefused(f"global batch {batch} is odd: cannot halve it")
        new = batch // 2
    changed = _with(settings, pending, BATCH_KEY, new)
    check_pending(settings, changed, replicas)
    return changed
