"""Run state: a pure fold of a run's event stream into what the dashboard shows.

No Textual, no I/O. ``RunState.apply(frame)`` / ``apply_many(frames)`` take the
frames of ``trainer_runtime/protocol/`` (as relayed by the supervisor, with
``seq``), each read into its typed event by ``protocol.parse_event``, plus the
link's synthetic ``{"type": "link", ...}`` events, and keep:
the run, each attempt with its settings and measured figures (after warm-up),
the latest step, rolling windows for sparklines, the latest device sample and
the status; and the bounded histories of gpuwatch/measures/series.py: the whole run's
figures against step (the plot screen) and the chief's GPUs' recent samples.
Events whose ``seq`` was already folded are skipped, so a link that resubscribes
with an overlap never counts a step twice.

The supervisor folds the same way (``apply_event``: typed events, no parsing) and
sends a dashboard that attaches its state as a ``snapshot`` frame
(``to_snapshot``/``from_snapshot``, gpuwatch/runstate/codec.py: generic over the
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

Its parts, each a module here (this one only re-exports their names; each imports
the ones below it directly, never through this package):

- ``state``: ``RunState`` and the fold, one handler per event type.
- ``attempts``: ``AttemptSummary`` and each worker's input wait in it (``WorkerWait``),
  and which settings differ between attempts.
- ``figures``: ``Figures``, the current figures taken once (``step_figures``), and the
  words a figure's window is labelled with (``recent_window``, ``ATTEMPT_WINDOW``).
- ``workers``: each worker's fold (``WorkerFigures``) and its ``WorkerSummary``.
- ``steps``: ``StepPoint`` and the helpers of figures over steps (input wait %,
  medians, ``pace_setter``, bus bandwidth and its share of the link).
- ``command``: a person's own command as the screen says it (``CommandView``).
- ``settings``: the pure helpers behind the "pending settings" keys: reading a dotted
  setting, stepping prefetch/accumulation/batch with the divisibility rule, and
  describing what a relaunch would change; and the words of the attempts table.
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
