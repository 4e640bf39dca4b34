"""Run state: a pure fold of a run's event stream into what the dashboard shows.

No Textual, no I/O. ``RunState.apply(frame)`` / ``apply_many(frames)`` fold the
supervisor's frames (each read by ``protocol.parse_event``) and the link's
``{"type": "link", ...}`` events; the supervisor folds typed events the same way
(``apply_event``) and hands an attaching dashboard its state as a snapshot
(``to_snapshot``/``from_snapshot``, gpuwatch/runstate/codec.py). Its rules: a ``seq``
already folded is skipped, so a resubscribe never counts a step twice; memory does not
grow with the run's length; in a cluster the headline figures are the chief's, except
input wait, which is the worker's that waits most (``pace_setter``). ``figures()`` takes
the figures once per repaint, so a figure shown twice is one value. This module only
re-exports its parts' names (docs/internals.md, "Module map").
"""

from gpuwatch.runstate.attempts import AttemptSummary, WorkerWait, differing_settings
from gpuwatch.runstate.command import NOT_TENSORFLOW, CommandView, printable, shell_text
from gpuwatch.runstate.figures import ATTEMPT_WINDOW, Figures, recent_window, step_figures
from gpuwatch.runstate.settings import (
    ACCUMULATION_KEY,
    BATCH_KEY,
    PREFETCH_KEY,
    SettingRefused,
    check_pending,
    command_argv,
    describe_pending,
    effective,
    format_setting,
    get_setting,
    own_settings,
    pending_applies_live,
    pending_overrides,
    setting_labels,
    setting_text,
    step_accumulation,
    step_batch,
    toggle_prefetch,
)
from gpuwatch.runstate.state import (
    AREAS,
    CHIEF,
    CURRENT_STEPS,
    LOG_TAIL_LINES,
    STALE_MIN_S,
    STALE_STEP_TIMES,
    WINDOW_STEPS,
    RunState,
)
from gpuwatch.runstate.steps import (
    WARMUP_STEPS,
    StepPoint,
    bus_bandwidth,
    pace_setter,
    share_of_link,
    steps_input_wait_pct,
)
from gpuwatch.runstate.workers import (
    WORKER_WINDOW_STEPS,
    HostReading,
    WorkerFigures,
    WorkerStep,
    WorkerSummary,
)

__all__ = [
    "ACCUMULATION_KEY",
    "AREAS",
    "ATTEMPT_WINDOW",
    "BATCH_KEY",
    "CHIEF",
    "CURRENT_STEPS",
    "LOG_TAIL_LINES",
    "NOT_TENSORFLOW",
    "PREFETCH_KEY",
    "STALE_MIN_S",
    "STALE_STEP_TIMES",
    "WARMUP_STEPS",
    "WINDOW_STEPS",
    "WORKER_WINDOW_STEPS",
    "AttemptSummary",
    "CommandView",
    "Figures",
    "HostReading",
    "RunState",
    "SettingRefused",
    "StepPoint",
    "WorkerFigures",
    "WorkerStep",
    "WorkerSummary",
    "WorkerWait",
    "bus_bandwidth",
    "check_pending",
    "command_argv",
    "describe_pending",
    "differing_settings",
    "effective",
    "format_setting",
    "get_setting",
    "own_settings",
    "pace_setter",
    "pending_applies_live",
    "pending_overrides",
    "printable",
    "recent_window",
    "setting_labels",
    "setting_text",
    "share_of_link",
    "shell_text",
    "step_accumulation",
    "step_batch",
    "step_figures",
    "steps_input_wait_pct",
    "toggle_prefetch",
]
