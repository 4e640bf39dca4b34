"""Per-GPU history: a line per GPU on a small terminal, a grid of cells on a big one.

The chief's host's GPUs from ``RunState.gpu_history`` (gpuwatch/measures/series.py):
utilization and memory over the last samples, PCIe and NVLink TX/RX, beside the
gradient-sync estimate (in the title). Below WIDE_COLUMNS x TALL_ROWS one line per GPU
(as many as fit, then "… and N more"), all one StatePanel, since each widget costs the
compositor on every repaint; from there a cell per GPU, each a StatePanel. Sparklines
are on fixed scales (utilization 0-100 %, memory 0-total, a link's rate 0-its highest on
any GPU in the window, so the GPUs compare), each cell the mean of a fixed run of
samples (``series.bucket_means``): a few bytes to the terminal per repaint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Container, Vertical

from gpuwatch.app import fmt
from gpuwatch.app.widgets.common import is_tall, is_wide
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.measures.series import GpuHistory, bucket_means
from gpuwatch.runstate import CHIEF, RunState

# A grid cell: a title line and one sparkline per reading.
CELL_MIN_WIDTH = 36
CELL_LINES = (
    ("util", "util_pct", "green"),
    ("memory", "mem_used_bytes", "cyan"),
    ("PCIe tx", "pcie_tx_bytes_per_s", "magenta"),
    ("PCIe rx", "pcie_rx_bytes_per_s", "magenta"),
    ("NVLink tx", "nvlink_tx_bytes_per_s", "yellow"),
    ("NVLink rx", "nvlink_rx_bytes_per_s", "yellow"),
)
CELL_HEIGHT = 1 + len(CELL_LINES)
# Lines per GPU panel in the compact form (the rest are summed up in one line).
COMPACT_LINES_SHORT = 8
COMPACT_LINES_TALL = 16
# Rows of cells in the grid: two, or three where the screen is this tall (the panels above
# and below keep their rows).
GRID_ROWS = 2
GRID_ROWS_TALLER = 3
GRID_TALLER_FROM_ROWS = 56
LABEL_WIDTH = 10


@dataclass(frozen=True, slots=True)
class Scale:
    """What every GPU's sparklines share in one repaint."""

    seen: int  # samples seen: cells fall on fixed sample boundaries
    pcie_top: float | None
    nvlink_top: float | None

    def top(self, gpu: GpuHistory, attr: str) -> float | None:
        if attr == "util_pct":
            return 100.0
        if attr == "mem_used_bytes":
            return gpu.mem_total_bytes
        return self.pcie_top if attr.startswith("pcie") else self.nvlink_top


def _peak(gpus: Iterable[GpuHistory], *attrs: str) -> float | None:
    values = [v for g in gpus for a in attrs for v in getattr(g, a) if v is not None]
    return max(values) if values else None


def _spark(gpu: GpuHistory, attr: str, scale: Scale, width: int) -> str:
    if width <= 0:
        return ""
    values = list(getattr(gpu, attr))
    # As few samples per cell as the kept ones need: it changes only as the history fills
    # (every `width` samples, until DEVICE_HISTORY_SAMPLES are kept), so cells stay put.
    per_cell = max(1, math.ceil(len(values) / width))
    levels = bucket_means(values, scale.seen, per_cell, width)
    return fmt.spark(levels, scale.top(gpu, attr), width)


def _util_text(gpu: GpuHistory) -> str:
    util = gpu.latest("util_pct")
    return "n/a" if util is None else fmt.pct(util)


def _mem_text(gpu: GpuHistory) -> str:
    return fmt.mem_pair(gpu.latest("mem_used_bytes"), gpu.mem_total_bytes)


def _missing(gpu: GpuHistory) -> str | None:
    if gpu.lost:
        return "lost (fell off the bus)"
    if not gpu.present:
        return "not in the latest sample"
    return None


def compact_line(gpu: GpuHistory, scale: Scale, width: int) -> Text:
    """'  0 ▅▆▇█▇▆▅▆  92%  19.8/40.0 GiB  PCIe 1.2G/3.4G  NVLink 18.7G/18.2G'.

    Two styles only (the sparkline's colour, then plain text): every style change costs
    bytes to the terminal on each repaint, and this line repaints every second.
    """
    head = f"{gpu.index:>2} "
    missing = _missing(gpu)
    if missing:
        return Text(head) + Text(missing, style="bold red" if gpu.lost else "dim")
    pcie = fmt.rate_pair(gpu.latest("pcie_tx_bytes_per_s"), gpu.latest("pcie_rx_bytes_per_s"))
    nvlink = fmt.rate_pair(gpu.latest("nvlink_tx_bytes_per_s"), gpu.latest("nvlink_rx_bytes_per_s"))
    tail = f" {_util_text(gpu):>4}  {_mem_text(gpu):>13}  PCIe {pcie:>11}  NVLink {nvlink:>11}"
    text = Text(head)
    text.append(_spark(gpu, "util_pct", scale, width - len(head) - len(tail)), style="green")
    text.append(tail)
    return text


def _cell_value(gpu: GpuHistory, attr: str) -> str:
    if attr == "util_pct":
        return _util_text(gpu)
    if attr == "mem_used_bytes":
        return _mem_text(gpu)
    return fmt.format_rate(gpu.latest(attr))


def full_cell(gpu: GpuHistory, scale: Scale, width: int) -> Text:
    """A title line (index, name, temperature) and a sparkline per reading."""
    text = Text()
    text.append(f"GPU {gpu.index}", style="bold")
    if gpu.temperature_c is not None:
        text.append(f" {gpu.temperature_c:.0f}°C")
    if gpu.name:
        room = width - len(text) - 2
        name = gpu.name if len(gpu.name) <= room else gpu.name[: max(room - 1, 0)] + "…"
        text.append(f"  {name}", style="dim")
    missing = _missing(gpu)
    if missing:
        text.append("\n" + missing, style="bold red" if gpu.lost else "dim")
        return text
    values = [_cell_value(gpu, attr) for _, attr, _ in CELL_LINES]
    value_width = max(len(v) for v in values)
    room = width - LABEL_WIDTH - 1 - value_width
    for (label, attr, style), value in zip(CELL_LINES, values, strict=True):
        text.append(f"\n{label:<{LABEL_WIDTH}}", style="dim")
        text.append(_spark(gpu, attr, scale, room), style=style)
        text.append(f" {value:>{value_width}}")
    return text


class GpuLines(StatePanel):
    """A line per GPU (the compact form), built again for the width it gets on a resize."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gpus: list[GpuHistory] = []
        self._scale = Scale(0, None, None)

    def show(self, gpus: list[GpuHistory], scale: Scale) -> None:
        self._gpus, self._scale = gpus, scale
        self.set_text(self._build(self.size.width))

    def _build(self, width: int) -> Text:
        return Text("\n").join(compact_line(gpu, self._scale, width) for gpu in self._gpus)

    def on_resize(self, event: events.Resize) -> None:
        if self._gpus:
            self.set_text(self._build(event.size.width))

    @property
    def lines(self) -> list[str]:
        """Each GPU's line as shown (for tests)."""
        return self.plain.split("\n") if self._gpus else []


class GpuView(StatePanel):
    """One GPU's cell in the grid (a big terminal), built again for a new size."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gpu: GpuHistory | None = None
        self._scale = Scale(0, None, None)

    def show(self, gpu: GpuHistory, scale: Scale) -> None:
        """Repaint the lines of the cell that changed."""
        self._gpu, self._scale = gpu, scale
        self.set_text(self._build(self.size.width))

    def _build(self, width: int) -> Text:
        if self._gpu is None:
            return Text()
        return full_cell(self._gpu, self._scale, width)

    def on_resize(self, event: events.Resize) -> None:
        if self._gpu is not None:
            self.set_text(self._build(event.size.width))


def _span(seconds: float | None) -> str:
    """The history's length, rounded so the title does not flicker: '5:00', '0:40'."""
    if seconds is None:
        return "0:00"
    rounded = round(seconds / 10.0) * 10.0 if seconds >= 10 else seconds
    return fmt.duration(rounded)


def more_line(rest: list[GpuHistory]) -> Text:
    """'… and 2 more GPUs (6-7): util 85–91%, memory 20.1–20.6 GiB used'."""
    if not rest:
        return Text()
    text = Text(f"… and {len(rest)} more GPUs ({rest[0].index}-{rest[-1].index})", style="dim")
    utils = [u for g in rest if (u := g.latest("util_pct")) is not None]
    used = [m for g in rest if (m := g.latest("mem_used_bytes")) is not None]
    if utils:
        text.append(f": util {min(utils):.0f}–{max(utils):.0f}%", style="dim")
    if used:
        gib = 1024.0**3
        text.append(f", memory {min(used) / gib:.1f}–{max(used) / gib:.1f} GiB used", style="dim")
    return text


class GpuPanel(Vertical):
    """The chief's host's GPUs over the last minutes, in the form the terminal has room for."""

    _sync: float | None = None  # the figures' gradient sync estimate, in the title
    _span_s: float | None = None  # the history's length, in the title

    def compose(self) -> ComposeResult:
        yield GpuLines(id="gpu-lines")
        yield Container(id="gpu-views")
        yield StatePanel(id="gpu-more")

    @property
    def full(self) -> bool:
        """The grid of cells (a big terminal), else one line per GPU."""
        return is_wide(self) and is_tall(self)

    def show_state(self, state: RunState, sync: float | None, taken_rows: int = 0) -> None:
        """sync: the gradient sync estimate of the figures on screen (RunState.figures).
        taken_rows: rows the panels above took beyond their own (the metrics' breakdown):
        on a short screen the compact form gives them back, so nothing below is cut off."""
        self._sync = sync
        history = state.gpu_history
        gpus = history.gpus
        views = self.query_one("#gpu-views", Container)
        if self.full:
            # The links' sparklines (cells only) share a scale: the highest rate kept.
            scale = Scale(
                history.samples_seen,
                _peak(gpus, "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
                _peak(gpus, "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
            )
            columns = max(1, min(len(gpus), (self.app.size.width - 2) // CELL_MIN_WIDTH))
            views.styles.grid_size_columns = columns
            taller = self.app.size.height >= GRID_TALLER_FROM_ROWS
            rows = GRID_ROWS_TALLER if taller else GRID_ROWS
            shown = gpus[: columns * rows]
            cells, lines = shown, []
        else:
            scale = Scale(history.samples_seen, None, None)  # a line's one sparkline: util
            room = COMPACT_LINES_TALL if is_tall(self) else max(2, COMPACT_LINES_SHORT - taken_rows)
            shown = gpus if len(gpus) <= room else gpus[: room - 1]
            cells, lines = [], shown
        self.query_one(GpuLines).show(lines, scale)
        existing = list(views.query_children(GpuView))
        if len(existing) > len(cells):
            for view in existing[len(cells) :]:
                view.remove()
        elif len(existing) < len(cells):
            added = [GpuView() for _ in range(len(cells) - len(existing))]
            views.mount(*added)
            existing += added
        for view, gpu in zip(existing, cells, strict=False):
            view.show(gpu, scale)
        more = self.query_one("#gpu-more", StatePanel)
        rest = gpus[len(shown) :]
        more.set_text(more_line(rest))
        more.display = bool(rest)
        self._span_s = history.span_s
        show_title(self, self._title(state))

    def show_sync(self, state: RunState, sync: float | None) -> None:
        """A new gradient sync estimate (the figures were taken again): the title only."""
        self._sync = sync
        show_title(self, self._title(state))

    def texts(self) -> list[str]:
        """Each shown GPU's text: its line, or its cell in the grid (tests, screen readers)."""
        if self.full:
            return [view.plain for view in self.query(GpuView)]
        return self.query_one(GpuLines).lines

    def _title(self, state: RunState) -> str:
        chief = state.workers_seen.get(CHIEF)
        cluster = state.workers > 1
        span_s = self._span_s
        sync = fmt.format_rate(self._sync)
        if self.full:
            host = (chief.host if chief is not None else "") or state.host
            where = f"GPUs of {host}" if host else "GPUs"
            if cluster:
                where += " (the chief's host)"
            return (
                f"{where}, last {_span(span_s)} · gradient sync est. {sync} per replica"
                f" (ring all-reduce over {state.replicas}): compare each GPU's link tx"
            )
        where = "the chief's GPUs" if cluster else "GPUs"
        return f"{where}, last {_span(span_s)} · tx/rx B/s · gradient sync est. {sync}/replica"
