"""The run's state folded from its events: ``RunState``, and one handler per event type.

``RunState.apply(frame)`` reads a frame (``protocol.parse_event``; the link's own
``{"type": "link"}`` events and the supervisor's ``snapshot`` frames too), and
``apply_event`` folds a typed event: its handler here (``_HANDLERS``), O(1) per event.
An event whose ``seq`` was already folded is skipped. The figures are taken when the
screen asks (``figures``, ``worker_summaries``); the snapshot is ``to_snapshot`` /
``from_snapshot`` (gpuwatch/runstate/codec.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpuwatch.measures import peaks
from gpuwatch.measures.series import DeviceHistory, RunHistory
from gpuwatch.runstate import codec
from gpuwatch.runstate.attempts import AttemptSummary, WorkerWait, add_wait
from gpuwatch.runstate.command import (
    NO_TRAINING,
    NOT_TENSORFLOW,
    CommandView,
    missing_tensorflow,
    shell_text,
)
from gpuwatch.runstate.figures import Figures, step_figures
from gpuwatch.runstate.settings import command_argv, get_setting
from gpuwatch.runstate.steps import (
    WARMUP_STEPS,
    RatioSums,
    StepPoint,
    median_value,
    share_of_link,
)
from gpuwatch.runstate.workers import (
    HostReading,
    WorkerFigures,
    WorkerStep,
    WorkerSummary,
    summarize_workers,
)
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
    parse_event,
)
from trainer_runtime.schema import MAX_WORKERS

# Steps kept for sparklines and the "current" figures.
WINDOW_STEPS = 240
# Steps the "current" figures (examples/s, input wait) are taken over.
CURRENT_STEPS = 20
LOG_TAIL_LINES = 40
# The chief: the headline figures are its own.
CHIEF = 0
# A running run's figures are stale once no step has come for this many step times (and
# at least STALE_MIN_S): a live change being applied, a hung collective, a stalled input.
STALE_STEP_TIMES = 5
STALE_MIN_S = 5.0

# Dirty areas, so the app repaints only the widgets whose inputs changed.
AREAS = (
    "header", "metrics", "devices", "history", "attempts", "status", "link", "pending", "workers",
    "gpu_history", "plots", "scaling",
)


# The breakdown's parts whose shares an attempt keeps sums of besides the input wait (kept
# from the steps' own input wait and time).
SHARE_PARTS = tuple(part for part in Breakdown.PARTS if part != "input")

# What a step changes, always (the attempts table too once it is measured).
_STEP_AREAS = ("metrics", "history", "plots")


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
    scale: Scale | None = None  # a scaling probe's plan (gpuwatch/measures/scaling.py reads it)
    status: str | None = None
    status_message: str | None = None
    status_worker: int | None = None  # the worker whose exit set the status, in a cluster
    exit_code: int | None = None
    signal: int | str | None = None
    log_tail: list[str] = field(default_factory=list)
    hello: Hello | None = None
    last_step: StepPoint | None = None
    window: deque[StepPoint] = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS))
    sample: HostReading | None = None  # the chief's host
    gpu_history: DeviceHistory = field(default_factory=DeviceHistory)  # the chief's host
    run_history: RunHistory = field(default_factory=RunHistory)  # the chief's steps
    samples: dict[int, HostReading] = field(default_factory=dict)  # by Sample.worker
    workers_seen: dict[int, WorkerFigures] = field(default_factory=dict)
    last_seq: int = -1
    last_t: float | None = None
    # The dashboard's own connection: not part of the run, never in a snapshot.
    link_state: str | None = field(default=None, metadata=codec.LOCAL)
    link_message: str | None = field(default=None, metadata=codec.LOCAL)
    # Live changes a trainer refused, counted (each worker's refusal): what the dashboard's
    # "applying" waits for, besides the new attempt. Seen live only, never in a snapshot.
    refusals: int = field(default=0, metadata=codec.LOCAL)
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
    changed: set[str] = field(default_factory=lambda: set(AREAS), metadata=codec.LOCAL)

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
        """The state as snapshot text (gpuwatch/runstate/codec.py); its seq is ``last_seq``."""
        return codec.dumps(self)

    @classmethod
    def snapshot_format(cls) -> str | None:
        """The format to_snapshot() writes (None: this RunState cannot be snapshotted)."""
        try:
            return codec.schema_id(cls)
        except codec.SnapshotError:
            return None

    @classmethod
    def from_snapshot(cls, text: str | bytes) -> RunState:
        """A state from to_snapshot()'s text; SnapshotError if unreadable or of another schema."""
        state = codec.loads(cls, text)
        assert isinstance(state, cls)
        return state

    def _on_snapshot(self, frame: Mapping[str, Any]) -> None:
        """Take the supervisor's fold as this state (keeping the link's own fields)."""
        try:
            restored = RunState.from_snapshot(frame.get("data") or "")
        except codec.SnapshotError:
            self.bad_events += 1
            return
        if restored.last_seq <= self.last_seq:  # older than what was already folded
            self.duplicates_skipped += 1
            return
        for f in fields(self):
            if codec.snapshotted(f):
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
        # Each worker's summary is remade only when something of it changed (summarize_workers).
        current = [f for f in self.workers_seen.values() if f.attempt == self.attempt]
        return summarize_workers(current, self.samples)

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
        chief = self.samples.get(CHIEF)
        link = peaks.link_peak(chief.gpus if chief is not None else None, self.workers)
        return replace(figures, tflops=tflops, mfu_pct=mfu, link=link,
                       bus_pct_of_link=share_of_link(figures.bus_bytes_per_s, link))

    def no_step_for_s(self, now: float) -> float | None:
        """Seconds since the chief's last step while the run is running and that is several
        step times (STALE_STEP_TIMES, at least STALE_MIN_S): its figures are stale. Else None.
        """
        point = self.last_step
        if self.status != "running" or point is None or point.t is None:
            return None
        # The headline's step time (step_figures'), without its other figures: every tick.
        step_ms = (median_value([p.step_time_ms for p in self.recent_steps()])
                   or point.event.step_time_ms)
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
        precision it has no tensor cores for (gpuwatch/measures/peaks.py).
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
            gpus = summary.sample.gpus if summary.sample is not None else []
            host_names = {None if g.mig else g.name for g in gpus}
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
        argv = self.command
        if argv is None:
            return None
        hook = self.hook
        watched = tuple(part for part in (hook.loop, hook.strategy) if part) if hook else ()
        note = None
        stepped = self.last_step is not None and self.last_step.event.attempt == self.attempt
        if hook is not None and not hook.installed:
            note = f"not watched: {hook.message or 'the hook could not install'}"
        elif (hook is None or not hook.tensorflow) and not stepped:
            # The process runs (a command is running as soon as it started): no hook at all
            # is a program that is not Python; a hook without TensorFlow, a Python one that
            # has not imported it (so far: a script imports it when it gets there).
            started = self.status not in (None, "starting")
            missing = missing_tensorflow(self.status_message) if self.terminal else None
            if missing is not None:
                note = missing
            elif started:
                note = NOT_TENSORFLOW + ("" if self.terminal else " (so far)")
        elif (hook is not None and not hook.loop and not stepped
              and self.status not in (None, "starting")):
            # TensorFlow imported, and no loop of the hook's ran: not a verdict on steps.
            note = NO_TRAINING + ("" if self.terminal else " (so far)")
        input_wait = None
        if hook is not None and hook.input_wait:
            input_wait = f"input wait: not measurable for this loop ({hook.input_wait})"
        kind = "script" if hook is not None else "command"
        return CommandView(shell_text(argv), kind, watched, note, input_wait)



    # ---- folding: one method per event type (apply_event dispatches) ----------



    def _on_run(self, event: Run, t: float | None) -> None:
        self.run_id = event.run_id or self.run_id
        self.host = event.host or self.host
        self.created_t = event.created or t or self.created_t
        if not self.settings:
            self.settings = dict(event.settings)
        self.name = event.name or event.settings.get("name") or self.name
        self.changed.update(("header", "pending"))


    def _on_scale(self, event: Scale, t: float | None) -> None:
        self.scale = event
        self.changed.update(("header", "scaling"))


    def _on_attempt(self, event: Attempt, t: float | None) -> None:
        if event.attempt > self.attempt and event.reason != "live":
            self.hook = None  # a new process: its hook says again what it watches
        summary = self._attempt(event.attempt)
        summary.settings = dict(event.settings)
        self.settings = dict(event.settings)
        self.name = event.settings.get("name") or self.name
        summary.fresh = event.fresh
        summary.reason = event.reason
        summary.started_t = t
        previous = self.attempts.get(event.attempt - 1)
        if event.reason == "live" and previous is not None:
            # The same trainer goes on with new settings: no hello of its own, and the
            # attempt before it ended by this change (the attempts table says "live").
            previous.end = previous.end or "live"
            summary.hello = summary.hello or previous.hello
            summary.workers = previous.workers
        self.attempt = max(self.attempt, event.attempt)
        self.changed.update(("header", "attempts", "pending", "metrics", "scaling"))


    def _on_hello(self, event: Hello, t: float | None) -> None:
        figures = self._worker(event.worker, event.attempt)
        if figures is not None:
            figures.hello = event
            figures.host = event.host or figures.host
            figures.status = "running"
        if event.worker != CHIEF:
            return
        self.hello = event
        summary = self._attempt(event.attempt)
        summary.hello = event
        summary.workers = max(1, event.workers)
        self.attempt = max(self.attempt, event.attempt)
        self.changed.update(("devices", "header", "pending", "metrics", "attempts"))


    def _on_step(self, event: Step, t: float | None) -> None:
        # The event's fields read once each (the dashboard folds 100 steps a second).
        attempt, worker, number = event.attempt, event.worker, event.step
        step_time_ms = event.step_time_ms
        timed = event.breakdown
        figures = self._worker(worker, attempt)
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
            other = self.attempts.get(attempt)
            if (other is not None and 0 <= worker < MAX_WORKERS
                    and add_wait(other, worker, step_time_ms, event.input_wait_ms, timed)):
                self.changed.add("attempts")
            return
        summary = self._attempt(attempt)
        point = StepPoint(event, t, summary.steps_seen < WARMUP_STEPS)
        self.last_step = point
        self.window.append(point)
        self.dropped = event.dropped or self.dropped
        summary.steps_seen += 1
        # The event's fields, not the point's: StepPoint reads through a slow __getattr__,
        # and the supervisor folds every step it records through here.
        if summary.first_step is None:
            summary.first_step = number
        summary.last_step = number
        self.run_history.add(event, warmup=point.warmup)
        changed = self.changed
        add_wait(summary, worker, step_time_ms, event.input_wait_ms, timed)
        if summary.steps_seen > WARMUP_STEPS and step_time_ms > 0:
            summary.measured_steps += 1
            summary.sum_step_time_ms += step_time_ms
            sums = summary.share_sums
            if event.input_wait_ms is not None:
                summary.sum_input_wait_ms += event.input_wait_ms
                summary.sum_waited_ms += step_time_ms
                sums.setdefault("input", RatioSums()).add(event.input_wait_ms, step_time_ms)
            summary.sum_grad_sync_bytes += event.grad_sync_bytes
            if timed is not None:
                summary.breakdown = (timed if summary.breakdown is None
                                     else summary.breakdown + timed)
                for part in SHARE_PARTS:
                    sums.setdefault(part, RatioSums()).add(timed.ms(part), timed.total_ms)
                summary.sum_timed_sync_bytes += event.grad_sync_bytes
            rate = event.examples_per_s
            if rate is not None:
                summary.rates.add(rate)
            changed.add("attempts")
        changed.update(_STEP_AREAS)


    def _on_step_summary(self, event: StepSummary, t: float | None) -> None:
        # A worker's steps of about a second (summarize.py): its figures, and its input wait
        # in its attempt's; never the headline, which is the chief's steps.
        if event.count <= 0:
            return
        figures = self._worker(event.worker, event.attempt)
        if figures is not None:
            figures.steps_seen += event.count
            figures.last_step = event.last_step
            if figures.status == "starting":
                figures.status = "running"
            step_sum = event.figure("step_time_ms", "sum")
            if step_sum is not None and step_sum > 0:
                figures.add_summary(event)
        other = self.attempts.get(event.attempt)
        if other is None or not 0 <= event.worker < MAX_WORKERS:
            return
        wait = other.worker_waits.get(event.worker)
        if wait is None:
            wait = other.worker_waits[event.worker] = WorkerWait()
        wait.steps_seen += event.count
        step_sum = event.figure("step_time_ms", "sum")
        wait_sum = event.figure("input_wait_ms", "sum")
        if step_sum is None or step_sum <= 0 or wait_sum is None:
            return
        wait.measured_steps += event.count
        wait.sum_step_time_ms += step_sum
        wait.sum_input_wait_ms += wait_sum
        timed = event.breakdown
        if timed is not None:
            wait.breakdown = timed if wait.breakdown is None else wait.breakdown + timed
        self.changed.add("attempts")

    def _on_reconfigured(self, event: Reconfigured, t: float | None) -> None:
        # An applied change is its attempt event; a refused one settles a change in flight (the
        # relaunch command's err, or the trainer's reconfigured event, says why).
        if not event.ok:
            self.refusals += 1
            self.changed.add("pending")


    def _on_sample(self, event: Sample, t: float | None) -> None:
        sample = HostReading(event.host, event.gpus, event.nvml, t, event.gpu_summary)
        if 0 <= event.worker < MAX_WORKERS:
            self.samples[event.worker] = sample
        if event.worker == CHIEF:
            self.sample = sample
            self.changed.add("devices")  # the workers panel repaints on it too
            if event.gpus or self.gpu_history.gpus:
                self.gpu_history.add(event.gpus, t)
                self.changed.add("gpu_history")
        else:
            self.changed.add("workers")


    def _on_status(self, event: StatusChange, t: float | None) -> None:
        self.status = event.status
        number = event.attempt
        if number > 0:
            self.attempt = max(self.attempt, number)
        self.status_message = event.message
        self.status_worker = event.worker
        self.exit_code = event.exit_code
        self.signal = event.signal
        if event.log_tail:
            self.log_tail = event.log_tail[-LOG_TAIL_LINES:]
        # How an attempt ended, in the person's words: the trainer's own reason (its Done:
        # max_steps, epochs) unless the supervisor ended it (its SIGTERM is not the story).
        ended_as = {"crashed": "crashed", "stopped": "stopped", "relaunching": "relaunch"}
        if self.status in ended_as and number in self.attempts:
            summary = self.attempts[number]
            # An attempt that reached its steps before the next began (a scaling probe's
            # count) ended on its own: that is its end, not the relaunch.
            if not (self.status == "relaunching" and summary.end in ("max_steps", "epochs")):
                summary.end = ended_as[self.status]
            self.changed.add("attempts")
        if self.status == "crashed" and event.worker is not None:
            figures = self._worker(event.worker, number)
            if figures is not None and figures.status != "error":
                figures.status = "crashed"
        self.changed.update(("header", "status", "pending"))


    def _on_done(self, event: Done, t: float | None) -> None:
        figures = self._worker(event.worker, event.attempt)
        if figures is not None:
            figures.status = "done"
        if event.worker != CHIEF:
            return
        self.done = event
        summary = self._attempt(event.attempt)
        if summary.end not in ("crashed", "stopped", "relaunch"):  # the supervisor's word stands
            summary.end = event.reason or "done"
        self.changed.update(("header", "attempts"))


    def _on_error(self, event: Error, t: float | None) -> None:
        figures = self._worker(event.worker, event.attempt)
        if figures is not None:
            figures.status = "error"
        # The first worker's error of the newest attempt is the cause: the others' that
        # follow (a collective timing out on the chief) must not hide it.
        known = self.error
        if known is None or event.attempt > known.attempt or event.worker == known.worker:
            self.error = event
        self.changed.update(("header", "status"))


    def _on_hook(self, event: Hook, t: float | None) -> None:
        # The chief's latest word of the current attempt: an older attempt's late one is not.
        if event.worker != CHIEF or event.attempt < self.attempt:
            return
        self.hook = event
        self.changed.update(("metrics", "devices", "status"))


    def _on_resume(self, event: Resume, t: float | None) -> None:
        if event.worker != CHIEF:  # every worker resumes from the chief's checkpoint
            return
        self._attempt(event.attempt).resume = event
        self.changed.add("attempts")


    def _on_checkpoint(self, event: Checkpoint, t: float | None) -> None:
        if event.worker == CHIEF:  # only the chief's checkpoint is the real one
            self.last_checkpoint = event


_HANDLERS: dict[type[Event], Callable[[RunState, Any, float | None], None]] = {
    Run: RunState._on_run,
    Attempt: RunState._on_attempt,
    Hello: RunState._on_hello,
    Step: RunState._on_step,
    StepSummary: RunState._on_step_summary,
    Sample: RunState._on_sample,
    StatusChange: RunState._on_status,
    Done: RunState._on_done,
    Error: RunState._on_error,
    Checkpoint: RunState._on_checkpoint,
    Resume: RunState._on_resume,
    Reconfigured: RunState._on_reconfigured,
    Scale: RunState._on_scale,
    Hook: RunState._on_hook,
}
