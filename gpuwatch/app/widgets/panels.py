"""The dashboard's panels: each turns part of a RunState into text, repainting only on change.

Each panel lives in a module of its own (``header``, ``metrics``, ``advice``, ``devices``,
``workers``, ``history``, ``attempts``, ``pending``, ``crash``; what several share in
``common``); this module names them all in one place, for tests and tools. The app's own
modules import each from its home.
"""

from __future__ import annotations

from gpuwatch.app.widgets.advice import LEVEL_STYLE, AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel, Differences
from gpuwatch.app.widgets.common import TALL_ROWS, WIDE_COLUMNS, fit_line, is_tall, is_wide, plural
from gpuwatch.app.widgets.crash import CAUSE_KEY_CHARS, CAUSE_MIN_CHARS, CrashPanel, says_again
from gpuwatch.app.widgets.devices import DevicesPanel, cluster_line, device_summary, host_line
from gpuwatch.app.widgets.header import MIN_NAME_CELLS, STATUS_STYLE, HeaderBar, header_text
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import NOTE_STYLE, MetricsPanel, command_line
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.app.widgets.workers import STRIP_LEVELS, WorkersPanel, slowest_first, worker_strip

__all__ = [
    "CAUSE_KEY_CHARS",
    "CAUSE_MIN_CHARS",
    "LEVEL_STYLE",
    "MIN_NAME_CELLS",
    "NOTE_STYLE",
    "STATUS_STYLE",
    "STRIP_LEVELS",
    "TALL_ROWS",
    "WIDE_COLUMNS",
    "AdvicePanel",
    "AttemptsPanel",
    "CrashPanel",
    "DevicesPanel",
    "Differences",
    "HeaderBar",
    "HistoryPanel",
    "MetricsPanel",
    "PendingBar",
    "StatePanel",
    "WorkersPanel",
    "cluster_line",
    "command_line",
    "device_summary",
    "fit_line",
    "header_text",
    "host_line",
    "is_tall",
    "is_wide",
    "plural",
    "says_again",
    "show_title",
    "slowest_first",
    "worker_strip",
]
