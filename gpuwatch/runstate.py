"""Run state: a pure fold of a run's event stream into what the dashboard shows.

No Textual, no I/O. ``RunState.apply(event)`` / ``apply_many(events)`` take the
frames of ``trainer_runtime/protocol.py`` (as relayed by the supervisor, with
``seq``) plus the link's synthetic ``{"type": "link", ...}`` events, and keep:
the run, each attempt with its settings and measured figures (after warm-up),
the latest step, rolling windows for sparklines, the latest device sample and
the status. Events whose ``seq`` was already folded are skipped, so a link that
resubscribes with an overlap never counts a step twice.

It also holds the pure helpers behind the "pending settings" keys: reading a
dotted setting, stepping prefetch/accumulation/batch with the divisibility rule,
and describing what a relaunch would change.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.protocol import TERMINAL_STATUSES
from trainer_runtime.schema import prefetch_enabled, prefetch_word

# The first steps of every attempt include tf.function tracing: never measure them.
WARMUP_STEPS = 5
# Steps kept for sparklines and the "current" figures.
WINDOW_STEPS = 240
# Steps the "current" figures (examples/s, input wait) are taken over.
CURRENT_STEPS = 20
LOG_TAIL_LINES = 40

PREFETCH_KEY = "data.prefetch"
ACCUMULATION_KEY = "train.accumulation_steps"
BATCH_KEY = "train.global_batch_size"

# The terminal statuses in which the run failed: the dashboard shows why, with the log tail.
FAILED_STATUSES = TERMINAL_STATUSES & {"crashed", "lost"}

# Dirty areas, so the app repaints only the widgets whose inputs changed.
AREAS = ("header", "metrics", "devices", "history", "attempts", "status", "link", "pending")


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One optimizer step as the trainer measured it."""

    attempt: int
    step: int
    micro_step: int
    epoch: int | None
    loss: float | None
    lr: float | None
    examples: int
    step_time_ms: float
    input_wait_ms: float
    grad_sync_bytes: float
    t: float | None
    warmup: bool = False  # one of its attempt's first WARMUP_STEPS steps (tracing)

    @property
    def examples_per_s(self) -> float | None:
        if self.step_time_ms <= 0:
            return None
        return self.examples * 1000.0 / self.step_time_ms

    @property
    def input_wait_pct(self) -> float | None:
        return input_wait_pct(self.input_wait_ms, self.step_time_ms)


def input_wait_pct(input_wait_ms: float, step_time_ms: float) -> float | None:
    """Input-wait %: time blocked on the input iterator over step time; None without step time.

    The one formula for it (docs/internals.md). Over several steps pass the sums:
    sum(input_wait_ms) / sum(step_time_ms), as `steps_input_wait_pct` does.
    """
    if step_time_ms <= 0:
        return None
    return 100.0 * input_wait_ms / step_time_ms


def steps_input_wait_pct(steps: Iterable[StepPoint]) -> float | None:
    """Input-wait % over several steps: sum(input_wait_ms) / sum(step_time_ms)."""
    points = list(steps)
    return input_wait_pct(
        sum(p.input_wait_ms for p in points), sum(p.step_time_ms for p in points)
    )


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


@dataclass
class AttemptSummary:
    """One attempt: what it ran with and what it measured after warm-up."""

    attempt: int
    settings: dict[str, Any] = field(default_factory=dict)
    fresh: bool = False
    reason: str | None = None
    started_t: float | None = None
    hello: dict[str, Any] | None = None
    steps_seen: int = 0
    first_step: int | None = None
    last_step: int | None = None
    measured_steps: int = 0
    sum_step_time_ms: float = 0.0
    sum_input_wait_ms: float = 0.0
    sum_grad_sync_bytes: float = 0.0
    rates: list[float] = field(default_factory=list)
    end: str | None = None  # "done: max_steps", "crashed: exit 1", ...
    resume: dict[str, Any] | None = None  # where it resumed: step, data position, data order

    @property
    def data_restarted(self) -> str | None:
        """Why the data order started over on this attempt's resume, or None if it did not."""
        if self.resume is None or self.resume.get("data_order") != "restarted":
            return None
        return str(self.resume.get("data_note") or "data order restarted")

    @property
    def measured(self) -> bool:
        return self.measured_steps > 0 and self.sum_step_time_ms > 0

    @property
    def input_wait_pct(self) -> float | None:
        """sum(input_wait_ms) / sum(step_time_ms) over the steps after warm-up, in %."""
        if not self.measured:
            return None
        return input_wait_pct(self.sum_input_wait_ms, self.sum_step_time_ms)

    @property
    def median_examples_per_s(self) -> float | None:
        return _median(self.rates)

    @property
    def grad_sync_bytes_per_s(self) -> float | None:
        if not self.measured:
            return None
        return self.sum_grad_sync_bytes * 1000.0 / self.sum_step_time_ms

    @property
    def prefetch(self) -> Any:
        return get_setting(self.settings, PREFETCH_KEY)

    @property
    def accumulation_steps(self) -> Any:
        return get_setting(self.settings, ACCUMULATION_KEY)

    @property
    def global_batch_size(self) -> Any:
        return get_setting(self.settings, BATCH_KEY)


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
    status: str | None = None
    status_message: str | None = None
    exit_code: int | None = None
    signal: int | str | None = None
    log_tail: list[str] = field(default_factory=list)
    hello: dict[str, Any] | None = None
    last_step: StepPoint | None = None
    window: deque[StepPoint] = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS))
    sample: dict[str, Any] | None = None
    last_seq: int = -1
    last_t: float | None = None
    link_state: str | None = None
    link_message: str | None = None
    error: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    last_checkpoint: dict[str, Any] | None = None
    dropped: int = 0
    events_applied: int = 0
    duplicates_skipped: int = 0
    changed: set[str] = field(default_factory=lambda: set(AREAS))

    # ---- folding -------------------------------------------------------

    def apply_many(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: Mapping[str, Any]) -> None:
        seq = event.get("seq")
        if isinstance(seq, int):
            if seq <= self.last_seq:
                self.duplicates_skipped += 1
                return
            self.last_seq = seq
        t = event.get("t")
        if isinstance(t, int | float):
            self.last_t = float(t)
        handler = _HANDLERS.get(str(event.get("type")))
        if handler is not None:
            handler(self, event)
        self.events_applied += 1

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

    def _on_run(self, event: Mapping[str, Any]) -> None:
        self.run_id = event.get("run_id") or self.run_id
        self.host = event.get("host") or self.host
        self.created_t = event.get("created") or event.get("t") or self.created_t
        settings = event.get("settings")
        if isinstance(settings, dict):
            if not self.settings:
                self.settings = dict(settings)
            self.name = settings.get("name") or self.name
        self.name = event.get("name") or self.name
        self.changed.update(("header", "pending"))

    def _on_attempt(self, event: Mapping[str, Any]) -> None:
        number = int(event.get("attempt") or 0)
        summary = self._attempt(number)
        settings = event.get("settings")
        if isinstance(settings, dict):
            summary.settings = dict(settings)
            self.settings = dict(settings)
            self.name = settings.get("name") or self.name
        summary.fresh = bool(event.get("fresh", False))
        summary.reason = event.get("reason")
        summary.started_t = event.get("t")
        self.attempt = max(self.attempt, number)
        self.changed.update(("header", "attempts", "pending", "metrics"))

    def _on_hello(self, event: Mapping[str, Any]) -> None:
        self.hello = dict(event)
        number = int(event.get("attempt") or self.attempt)
        self._attempt(number).hello = dict(event)
        self.attempt = max(self.attempt, number)
        self.changed.update(("devices", "header", "pending", "metrics"))

    def _on_step(self, event: Mapping[str, Any]) -> None:
        number = int(event.get("attempt") or self.attempt)
        summary = self._attempt(number)
        point = StepPoint(
            attempt=number,
            step=int(event.get("step") or 0),
            micro_step=int(event.get("micro_step") or 0),
            epoch=_opt_int(event.get("epoch")),
            loss=_opt_float(event.get("loss")),
            lr=_opt_float(event.get("lr")),
            examples=int(event.get("examples") or 0),
            step_time_ms=float(event.get("step_time_ms") or 0.0),
            input_wait_ms=float(event.get("input_wait_ms") or 0.0),
            grad_sync_bytes=float(event.get("grad_sync_bytes") or 0.0),
            t=_opt_float(event.get("t")),
            warmup=summary.steps_seen < WARMUP_STEPS,
        )
        self.last_step = point
        self.window.append(point)
        self.dropped = int(event.get("dropped") or self.dropped)
        summary.steps_seen += 1
        if summary.first_step is None:
            summary.first_step = point.step
        summary.last_step = point.step
        if summary.steps_seen > WARMUP_STEPS and point.step_time_ms > 0:
            summary.measured_steps += 1
            summary.sum_step_time_ms += point.step_time_ms
            summary.sum_input_wait_ms += point.input_wait_ms
            summary.sum_grad_sync_bytes += point.grad_sync_bytes
            rate = point.examples_per_s
            if rate is not None:
                summary.rates.append(rate)
            self.changed.add("attempts")
        self.changed.update(("metrics", "history"))

    def _on_sample(self, event: Mapping[str, Any]) -> None:
        self.sample = {
            "host": event.get("host") or {},
            "gpus": list(event.get("gpus") or []),
            "nvml": event.get("nvml"),
            "t": event.get("t"),
        }
        self.changed.add("devices")

    def _on_status(self, event: Mapping[str, Any]) -> None:
        self.status = event.get("status") or self.status
        number = event.get("attempt")
        if isinstance(number, int) and number > 0:
            self.attempt = max(self.attempt, number)
        self.status_message = event.get("message")
        self.exit_code = event.get("exit_code")
        self.signal = event.get("signal")
        tail = event.get("log_tail")
        if isinstance(tail, list):
            self.log_tail = [str(line) for line in tail][-LOG_TAIL_LINES:]
        if self.status == "crashed" and isinstance(number, int) and number in self.attempts:
            self.attempts[number].end = "crashed"
            self.changed.add("attempts")
        self.changed.update(("header", "status", "pending"))

    def _on_done(self, event: Mapping[str, Any]) -> None:
        self.done = dict(event)
        number = int(event.get("attempt") or self.attempt)
        self._attempt(number).end = str(event.get("reason") or "done")
        self.changed.update(("header", "attempts"))

    def _on_error(self, event: Mapping[str, Any]) -> None:
        self.error = dict(event)
        self.changed.update(("header", "status"))

    def _on_resume(self, event: Mapping[str, Any]) -> None:
        number = int(event.get("attempt") or self.attempt)
        self._attempt(number).resume = dict(event)
        self.changed.add("attempts")

    def _on_checkpoint(self, event: Mapping[str, Any]) -> None:
        self.last_checkpoint = dict(event)

    def _on_link(self, event: Mapping[str, Any]) -> None:
        self.link_state = event.get("state")
        self.link_message = event.get("message")
        self.changed.update(("link", "header"))

    # ---- derived figures ---------------------------------------------

    @property
    def replicas(self) -> int:
        """Replicas of the current attempt (hello), else the config's CPU replicas, else 1."""
        if self.hello and isinstance(self.hello.get("replicas"), int):
            return int(self.hello["replicas"])
        value = get_setting(self.settings, "strategy.cpu_replicas")
        return int(value) if isinstance(value, int) and value > 0 else 1

    @property
    def current(self) -> AttemptSummary | None:
        return self.attempts.get(self.attempt)

    def recent_steps(self, count: int = CURRENT_STEPS) -> list[StepPoint]:
        """The latest steps of the current attempt, warm-up steps left out."""
        summary = self.current
        points = [p for p in self.window if p.attempt == self.attempt]
        if summary is not None and summary.first_step is not None:
            skip_until = summary.first_step + WARMUP_STEPS
            points = [p for p in points if p.step >= skip_until]
        return points[-count:]

    def recent_input_wait_pct(self, count: int = CURRENT_STEPS) -> float | None:
        return steps_input_wait_pct(self.recent_steps(count))

    def recent_examples_per_s(self, count: int = CURRENT_STEPS) -> float | None:
        return _median([r for p in self.recent_steps(count) if (r := p.examples_per_s)])

    def recent_step_time_ms(self, count: int = CURRENT_STEPS) -> float | None:
        return _median([p.step_time_ms for p in self.recent_steps(count)])

    def recent_grad_sync_bytes_per_s(self, count: int = CURRENT_STEPS) -> float | None:
        points = self.recent_steps(count)
        total_ms = sum(p.step_time_ms for p in points)
        if total_ms <= 0:
            return None
        return sum(p.grad_sync_bytes for p in points) * 1000.0 / total_ms

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


def _opt_float(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
        return result if math.isfinite(result) else None
    return None


def _opt_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


_HANDLERS = {
    "run": RunState._on_run,
    "attempt": RunState._on_attempt,
    "hello": RunState._on_hello,
    "step": RunState._on_step,
    "sample": RunState._on_sample,
    "status": RunState._on_status,
    "done": RunState._on_done,
    "error": RunState._on_error,
    "checkpoint": RunState._on_checkpoint,
    "resume": RunState._on_resume,
    "link": RunState._on_link,
}


# ---- settings and pending overrides -----------------------------------


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


_LABELS = {PREFETCH_KEY: "prefetch", ACCUMULATION_KEY: "accumulation", BATCH_KEY: "batch"}


def format_setting(dotted: str, value: Any) -> str:
    if dotted == PREFETCH_KEY:
        return prefetch_word(value)
    return "?" if value is None else str(value)


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
    """Double (up) or halve accumulation steps; raises SettingRefused if it cannot split."""
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
    """Double (up) or halve the global batch; raises SettingRefused if it cannot split."""
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
