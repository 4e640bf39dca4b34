"""The dashboard's panels: each turns part of a RunState into text, repainting only on change."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.widget import Widget

from gpuwatch.advisor import Advice, Straggler
from gpuwatch.app import fmt
from gpuwatch.app.link import RECORD
from gpuwatch.app.widgets.breakdown import (
    breakdown_lines,
    compute_sync_cell,
    look,
    part_label,
    pct_cell,
)
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.runstate import (
    ACCUMULATION_KEY,
    BATCH_KEY,
    PREFETCH_KEY,
    WARMUP_STEPS,
    AttemptSummary,
    CommandView,
    Figures,
    RunState,
    StepPoint,
    WorkerSummary,
    command_argv,
    differing_settings,
    setting_labels,
    setting_text,
)
from trainer_runtime.protocol import Hello
from trainer_runtime.schema import dotted_settings, prefetch_word

STATUS_STYLE = {
    "starting": "yellow",
    "running": "bold green",
    "stopping": "yellow",
    "stopped": "bold",
    "finished": "bold cyan",
    "crashed": "bold white on red",
    "lost": "bold white on red",
}
LEVEL_STYLE = {"high": "bold red", "moderate": "bold yellow", "none": "green", "unknown": "dim"}
# The app's breakpoints (its -wide and -tall screen classes): the panels that say more on a
# bigger terminal read the same numbers.
WIDE_COLUMNS = 120
TALL_ROWS = 40


def is_wide(widget: Widget) -> bool:
    return widget.app.size.width >= WIDE_COLUMNS


def is_tall(widget: Widget) -> bool:
    return widget.app.size.height >= TALL_ROWS


class HeaderBar(StatePanel):
    """Run id, name, attempt, status, elapsed, and the link's state, in one line of its width."""

    _last: tuple[RunState, float, float | None] | None = None

    def show_state(self, state: RunState, now: float, every_s: float | None = None) -> None:
        """every_s: the figures repaint only this often, to keep within the CPU budget."""
        self._last = (state, now, every_s)
        self.set_text(header_text(state, now, self.size.width, every_s))

    def on_resize(self, event: events.Resize) -> None:
        if self._last is not None:
            state, now, every_s = self._last
            self.set_text(header_text(state, now, event.size.width, every_s))


# The fewest cells of a name worth showing (with its "…"); shorter, it goes.
MIN_NAME_CELLS = 8


def header_text(state: RunState, now: float, width: int, every_s: float | None = None) -> Text:
    """The header in `width` cells (0: any): the status and the link's state always whole.

    every_s: the figures repaint this seldom (the dashboard keeps within its CPU
    budget), said after the elapsed time as "↻1.2s", and going with it.

    What is less important gives way first, in this order: the "gpuwatch" mark, the name
    (shortened, then dropped), the elapsed time, "attempt" (to "#"), then the run id.
    """
    status_text = state.status or "waiting"
    status = Text("  ")
    status.append(f" {status_text} ", style=STATUS_STYLE.get(status_text, ""))
    link = Text()
    if state.link_state == RECORD:  # an ended run read from its directory: all is well
        link.append("  ")
        link.append(" record ", style="reverse")
    elif state.link_state and state.link_state != "connected":
        link.append("  ")
        link.append(f" link {state.link_state} ", style="bold white on red")
    run_id = Text(f" {state.run_id or '…'} ", style="bold reverse")
    elapsed = f"  elapsed {fmt.duration(state.elapsed_s(now))}"
    if every_s is not None:
        elapsed += f" ↻{every_s:.1f}s"
    attempt = state.attempt or "-"
    # (the mark, the name: "whole", "cut" (if MIN_NAME_CELLS fit) or "", attempt, elapsed),
    # fullest first.
    forms = [
        (True, "whole", f"  attempt {attempt}", elapsed),
        (False, "whole", f"  attempt {attempt}", elapsed),
        (False, "cut", f"  attempt {attempt}", elapsed),
        (False, "", f"  attempt {attempt}", elapsed),
        (False, "", f"  attempt {attempt}", ""),
        (False, "", f"  #{attempt}", ""),
    ]
    for mark, name_form, attempt_text, elapsed_text in forms:
        text = Text(" gpuwatch " if mark else "", style="bold")
        text.append_text(run_id)
        if state.name and name_form:
            name = Text(f" {state.name}")
            room = width - text.cell_len - status.cell_len - link.cell_len
            room -= cell_len(attempt_text) + cell_len(elapsed_text)
            if width and name.cell_len > room:
                if name_form == "whole" or room < MIN_NAME_CELLS + 1:
                    continue
                name.truncate(room, overflow="ellipsis")
            text.append_text(name)
        text.append(attempt_text)
        text.append_text(status)
        text.append(elapsed_text)
        text.append_text(link)
        if not width or text.cell_len <= width:
            return text
    # Narrower still: the run id gives way, then goes with the attempt; the status and the
    # link's state stay whole.
    short_attempt = f"  #{attempt}"
    room = width - cell_len(short_attempt) - status.cell_len - link.cell_len
    if room < 3:
        return Text.assemble(status[2:], link)
    run_id.truncate(room, overflow="ellipsis")
    return Text.assemble(run_id, short_attempt, status, link)


class MetricsPanel(StatePanel):
    """Step, epoch, loss, and the figures: examples/s, step time, input wait (a cluster's:
    the worker's that waits most, named); where the steps' parts were timed apart, where
    their time went (one stacked bar, the all-reduce's bus bandwidth, a legend with the
    shares: ``breakdown.py``); dim, and saying why, when they are not current."""

    BASE_ROWS = 2  # the step line and the figures line

    _last: tuple[RunState, Figures, float | None] | None = None

    @property
    def extra_rows(self) -> int:
        """The rows it shows beyond the two it always has: the breakdown's (or none)."""
        return max(0, len(self.plain.splitlines()) - self.BASE_ROWS)

    def on_resize(self) -> None:
        """The lines fit the new width (the bar fills it), with the figures on screen."""
        if self._last is not None:
            self.show_state(*self._last)

    def show_state(self, state: RunState, figures: Figures, now: float | None = None) -> None:
        """now: the app's clock, for "no step for 14 s" (None: not said)."""
        self._last = (state, figures, now)
        point = state.last_step
        waited = state.no_step_for_s(now) if now is not None else None
        note = f"no step for {waited:.0f} s" if waited is not None else ""
        if state.terminal:  # nothing runs: what is shown is what was last measured
            note = f"run {state.status}; last measured"
        text = Text(style="dim" if note else "")  # the figures; the note says why
        view = state.command_view()  # a person's own command (gpuwatch run): it first
        if view is not None:
            text.append_text(command_line(view, self.content_size.width))
            text.append("\n")
        if view is not None and view.note is not None:
            # Nothing of its steps can come (a command's earlier steps, if any, are not its
            # now): the note says why.
            text.append(view.note, style=NOTE_STYLE)
            self.set_text(text)
            return
        if point is None:
            ended = "no steps: the run ended before its first"
            text.append(ended if state.terminal else "no steps yet", style="dim")
            hello = state.hello
            if hello:
                text.append(f"\nbatch {hello.global_batch_size} over ")
                text.append(f"{hello.replicas} replicas")
            self.set_text(text)
            return
        accumulation = (state.current.accumulation_steps if state.current else None) or 1
        if view is not None:
            accumulation = 1  # a script's own: not a setting of ours
        text.append_text(self._step_line(point, accumulation, note))
        text.append("\n")
        rate = figures.examples_per_s
        if rate is None:
            warming = f"warming up (the first {WARMUP_STEPS} steps trace; not measured)"
            if state.terminal:
                warming = f"not measured: it ended within its first {WARMUP_STEPS} steps"
            text.append(warming, style="dim")
            self.set_text(text)
            return
        unmeasurable = view.input_wait if view is not None else None
        text.append_text(self._figures_line(figures, rate, wait=unmeasurable is None))
        if unmeasurable is not None:  # where the figure would be: why there is none
            text.append("\n")
            text.append(fit_line(unmeasurable, self.content_size.width), style="bold")
        parts = breakdown_lines(figures, self.content_size.width, cluster=state.workers > 1)
        if parts:
            text.append("\n")
            text.append_text(parts)
        self.set_text(text)

    def _figures_line(self, figures: Figures, rate: float, *, wait: bool = True) -> Text:
        """examples/s, step time, input wait, TFLOP/s (and MFU): "of step time", then the
        TFLOP/s give way on a narrow panel. wait: False where the input wait cannot be
        measured (a script's loop: the line under it says why, never a number)."""
        width = self.content_size.width
        for leave_out in ((), ("of",), ("of", "tflops")):
            line = Text()
            line.append(fmt.count(rate, "examples/s"), style="bold")
            line.append(f"  {fmt.ms(figures.step_time_ms)} per step", style="")
            if wait:
                line.append("  input wait ", style="dim")
                line.append(fmt.pct(figures.input_wait_pct, 1), style="bold")
                if figures.input_wait_worker is not None:
                    # The worker every step waits for; the chief's own may be far less.
                    line.append(f" (worker {figures.input_wait_worker})", style="bold")
                elif "of" not in leave_out:
                    line.append(" of step time", style="dim")
            if figures.tflops is not None and "tflops" not in leave_out:
                line.append(f"  {figures.tflops:.3g} TFLOP/s", style="")
                if figures.mfu_pct is not None:
                    mfu = figures.mfu_pct
                    line.append(f" {mfu:.2g}% MFU" if mfu < 10 else f" {mfu:.0f}% MFU",
                                style="bold")
            if not width or line.cell_len <= width:
                break
        return line

    def _step_line(self, point: StepPoint, accumulation: int, note: str) -> Text:
        """Step, epoch, loss, lr, then the note: lr, the micro-step and the epoch give way to
        it, in that order, on a narrow panel."""
        width = self.content_size.width
        for leave_out in ((), ("lr",), ("lr", "micro"), ("lr", "micro", "epoch")):
            line = Text()
            line.append("step ", style="dim")
            line.append(f"{point.step:,}", style="bold")
            if accumulation > 1 and "micro" not in leave_out:
                micro = f" (micro-step {point.micro_step:,}, {accumulation} per update)"
                line.append(micro, style="dim")
            if point.epoch is not None and "epoch" not in leave_out:
                line.append("  epoch ", style="dim")
                line.append(str(point.epoch))
            line.append("  loss ", style="dim")
            line.append(f"{point.loss:.4f}" if point.loss is not None else fmt.NA, style="bold")
            if point.lr is not None and "lr" not in leave_out:
                line.append(f"  lr {point.lr:.1e}", style="dim")
            if not note:
                return line
            line.append("  ")
            line.append(note, style=NOTE_STYLE)
            if not width or line.cell_len <= width:
                return line
        return line


# What says why the figures beside it are not current: never dim, as they are.
NOTE_STYLE = "not dim bold yellow"


def command_line(view: CommandView, width: int) -> Text:
    """"script: python train.py · fit · MirroredStrategy" in `width` cells (0: any): the
    command is cut with "…", what is watched stays whole where it can."""
    head, command, tail = view.head, view.command, view.tail
    if width and len(head) + len(command) + len(tail) > width:
        room = width - len(head) - len(tail)
        if room < 12:  # too narrow for both: the command's start, then the rest cut
            tail, room = "", width - len(head)
        command = fit_line(command, max(1, room))
    text = Text(head, style="not dim bold")
    text.append(command, style="not dim")
    text.append(tail, style="not dim bold")
    return text


class AdvicePanel(StatePanel):
    """The advisor's verdict (TF Profiler thresholds) and what to try."""

    def show_advice(self, advice: Advice) -> None:
        text = Text()
        text.append(advice.verdict, style=LEVEL_STYLE.get(advice.level, ""))
        for rec in advice.recommendations:
            text.append("\n• ")
            text.append(rec)
        self.set_text(text)


class DevicesPanel(StatePanel):
    """No GPU readings: says so, with the host and the replicas (GpuPanel shows GPUs)."""

    _last_state: RunState | None = None
    _last_sync: float | None = None

    def on_resize(self) -> None:
        """The host line fits the new width (an ended run gets no new sample)."""
        shown = self._last_state
        if shown is not None:
            self.call_after_refresh(lambda: self.show_state(shown, self._last_sync))

    def show_state(self, state: RunState, sync: float | None) -> None:
        """sync: the gradient sync estimate of the figures on screen (RunState.figures);
        None where the all-reduce is measured (the metrics panel shows its bus bandwidth)."""
        self._last_state, self._last_sync = state, sync
        sample = state.sample or {}
        text = Text()
        self._no_gpu(text, state, sample, state.hello, sync)
        self.set_text(text)

    def _no_gpu(
        self,
        text: Text,
        state: RunState,
        sample: dict[str, Any],
        hello: Hello | None,
        sync: float | None,
    ) -> None:
        replicas = state.replicas
        kind = hello.device_kind if hello is not None else "cpu"
        reason = sample.get("nvml")
        devices = [
            d.rsplit("/", 1)[-1].removeprefix("device:")
            for d in (hello.devices if hello is not None else [])
        ]
        cluster = cluster_line(state)
        if kind == "gpu":
            text.append(f"{replicas} GPU replicas, but no GPU readings", style="bold yellow")
            if cluster:
                text.append(f": {cluster}")
        else:
            text.append("No NVIDIA GPU found", style="bold yellow")
            if cluster:
                text.append(f": {cluster}")
            elif hello is None and state.command is not None:
                # A person's own command: its replicas are its own, told by its hook's hello.
                text.append(": the command runs on this host's CPUs")
            else:
                text.append(f": training uses {replicas} logical CPU replicas")
        if devices and not cluster:
            text.append(f" ({', '.join(devices)})", style="dim")
        text.append("\n")
        text.append_text(host_line(state, sample.get("host") or {}, self.content_size.width))
        if sync is not None and not (sync == 0 and state.command is not None):
            # (a command's hook that cannot estimate its gradients' bytes sends none)
            text.append("\ngradient sync ", style="dim")
            text.append(fmt.format_rate(sync), style="bold")
            text.append(" (estimate)", style="dim")
            if reason:
                text.append(f"  NVML: {reason}", style="dim")
        elif reason:
            text.append(f"\nNVML: {reason}", style="dim")


def host_line(state: RunState, host: dict[str, Any], width: int = 0) -> Text:
    """'host CPU 64% of 16 cores  memory 5.0/15.6 GiB  load 1.9  trainer 1.2 cores, 1.2 GiB
    RSS': each CPU figure says what it is of (the host's: of all its cores; the trainer's:
    cores' worth, as top's 120% is). Once the run has ended, no figure of its trainer. The
    load gives way when the line is wider than `width` (0: any).
    """
    cores = len(host.get("per_cpu_pct") or ())
    for with_load in (True, False):
        text = Text("host CPU ", style="dim")
        text.append(fmt.pct(host.get("cpu_pct")), style="bold")
        text.append(f" of {plural(cores, 'core')}" if cores else " of all cores", style="dim")
        text.append("  memory ", style="dim")
        text.append(fmt.mem_pair(host.get("mem_used_bytes"), host.get("mem_total_bytes")))
        if with_load and host.get("load_1m") is not None:
            text.append("  load ", style="dim")
            text.append(f"{host['load_1m']:.1f}")
        cpu_pct, rss = host.get("run_cpu_pct"), host.get("run_rss_bytes")
        who = "command" if state.command is not None else "trainer"  # gpuwatch run's: its own
        if state.terminal:
            text.append(f"  {who} exited", style="dim")  # its last sample is not its now
        elif cpu_pct is not None or rss is not None:
            text.append(f"  {who} ", style="dim")
            figures = [f"{cpu_pct / 100.0:.1f} cores"] if cpu_pct is not None else []
            figures += [f"{fmt.bytes_binary(rss)} RSS"] if rss is not None else []
            text.append(", ".join(figures))
        if host.get("spare_rss_bytes") is not None:
            # The spare trainer waiting for `r` (only while a dashboard is attached).
            text.append("  spare trainer ", style="dim")
            text.append(f"{fmt.bytes_binary(host.get('spare_rss_bytes'))}")
        if not width or text.cell_len <= width:
            break
    return text


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def cluster_line(state: RunState) -> str:
    """'2 workers x 1 CPU replica (MultiWorkerMirroredStrategy)'; '' on one host."""
    workers = state.workers
    if workers <= 1:
        return ""
    chief = state.workers_seen.get(0)
    hello = state.hello
    per_worker = chief.replicas if chief is not None else None
    if per_worker is None:
        per_worker = max(1, state.replicas // workers) if hello is not None else None
    kind = (hello.device_kind if hello is not None else "cpu").upper()
    replicas = plural(per_worker, f"{kind} replica") if per_worker else f"{kind} replicas"
    return f"{workers} workers x {replicas} (MultiWorkerMirroredStrategy)"


def _sum_rate(gpus: list[dict[str, Any]], *keys: str) -> float | None:
    values = [g[key] for g in gpus for key in keys if g.get(key) is not None]
    return sum(values) if values else None


def _summed_devices(summed: dict[str, Any], wide: bool) -> str:
    """device_summary of a lean sample's gpu_summary (past 8 workers): the same words."""
    count = int(summed.get("count") or 0) - int(summed.get("lost") or 0)
    utils = summed.get("util_gpu_pct")
    util = fmt.pct(utils[1]) if isinstance(utils, list) and len(utils) == 3 else fmt.NA
    used, total = summed.get("mem_used_bytes"), summed.get("mem_total_bytes")
    mem = fmt.pct(100.0 * used / total) if isinstance(used, int | float) and total else fmt.NA
    text = f"{count} GPU {util} mem {mem}"
    if wide:
        text += (f"  PCIe {fmt.format_rate(summed.get('pcie_bytes_per_s'))}"
                 f"  NVLink {fmt.format_rate(summed.get('nvlink_bytes_per_s'))}")
    return text


def device_summary(sample: dict[str, Any] | None, wide: bool = False) -> str:
    """A host's devices in a few characters: '2 GPU 92% mem 53%' or 'CPU 95% mem 33%'.

    Mean GPU utilization and memory used of all its GPUs; ``wide`` adds the host's
    PCIe and NVLink traffic (TX + RX over its GPUs), or its load, for 120+ columns.
    """
    if not sample:
        return fmt.NA
    gpus = [g for g in sample.get("gpus") or [] if not g.get("lost")]
    if gpus:
        utils = [g["util_gpu_pct"] for g in gpus if g.get("util_gpu_pct") is not None]
        used = sum(g.get("mem_used_bytes") or 0 for g in gpus)
        total = sum(g.get("mem_total_bytes") or 0 for g in gpus)
        util = fmt.pct(sum(utils) / len(utils)) if utils else fmt.NA
        mem = fmt.pct(100.0 * used / total) if total else fmt.NA
        summary = f"{len(gpus)} GPU {util} mem {mem}"
        if wide:
            pcie = _sum_rate(gpus, "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")
            nvlink = _sum_rate(gpus, "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s")
            summary += f"  PCIe {fmt.format_rate(pcie)}  NVLink {fmt.format_rate(nvlink)}"
        return summary
    summed = sample.get("gpu_summary")
    if isinstance(summed, dict) and summed.get("count"):
        return _summed_devices(summed, wide)
    host = sample.get("host") or {}
    used, total = host.get("mem_used_bytes"), host.get("mem_total_bytes")
    mem = fmt.pct(100.0 * used / total) if used is not None and total else fmt.NA
    summary = f"CPU {fmt.pct(host.get('cpu_pct'))} mem {mem}"
    if wide and host.get("load_1m") is not None:
        summary += f"  load {host['load_1m']:.1f}"
    return summary


def slowest_first(rows: list[WorkerSummary]) -> list[WorkerSummary]:
    """Failed workers, then the longest own work per step (input wait + compute), then index."""

    def key(row: WorkerSummary) -> tuple[int, float, int]:
        busy = row.busy_ms
        return (row.status not in ("error", "crashed"), -(busy if busy is not None else -1.0),
                row.worker)

    return sorted(rows, key=key)


# The strip of every worker: a cell's own work per step (input wait + compute) over the
# median worker's: (at most this ratio, its mark, its style).
STRIP_LEVELS = ((1.1, "▁", "green"), (1.25, "▃", "green"), (1.5, "▅", "yellow"),
                (float("inf"), "█", "bold red"))


def worker_strip(rows: Sequence[WorkerSummary], cells: int) -> Text:
    """Every worker at a glance, by index, in at most `cells` cells (a cell holds the worst
    of its workers when there are more): how much longer its own work per step is than
    the median worker's (▁ ▃ ▅ █), ✗ a failed worker, · not measured yet."""
    ordered = sorted(rows, key=lambda row: row.worker)
    busy = sorted(b for row in ordered if (b := row.busy_ms) is not None and row.measured)
    median = busy[len(busy) // 2] if busy else None
    per_cell = max(1, -(-len(ordered) // max(1, cells)))
    strip = Text()
    for first in range(0, len(ordered), per_cell):
        group = ordered[first:first + per_cell]
        if any(row.status in ("error", "crashed") for row in group):
            strip.append("✗", style="bold red")
            continue
        ratios = [b / median for row in group
                  if median and row.measured and (b := row.busy_ms) is not None]
        if not ratios:
            strip.append("·", style="dim")
            continue
        worst = max(ratios)
        mark, style = next((m, st) for limit, m, st in STRIP_LEVELS if worst <= limit)
        strip.append(mark, style=style)
    return strip


class WorkersPanel(StatePanel):
    """Every worker of a cluster run, slowest first, as many as fit, and the straggler.

    Where the workers' steps are timed apart, each row has its shares of compute and of
    the all-reduce ("sync": it holds the wait for the slowest worker, so the straggler's
    is the least) instead of its compute time; update and other too at 120 columns.
    """

    HOST_CHARS = 10

    def show_state(
        self, state: RunState, workers: Sequence[WorkerSummary], straggler: Straggler | None,
        taken_rows: int = 0,
    ) -> None:
        """workers: the figures' (RunState.figures), so each row is the value shown elsewhere.
        taken_rows: rows the panels above took beyond their own (the metrics' breakdown):
        on a short screen as many fewer workers are listed, so nothing below is cut off."""
        rows = slowest_first(list(workers))
        text = Text()
        tall = is_tall(self)
        wide = is_wide(self)
        # The parts each row shows: its compute and all-reduce shares (and at 120 columns
        # its update and other), once any worker's steps were timed apart.
        parts: tuple[str, ...] = ()
        if any(row.breakdown is not None for row in rows):
            parts = ("compute", "sync", "update", "other") if wide else ("compute", "sync")
        header = f"{'w':>2} {'host':<{self.HOST_CHARS}} {'rep':>3} {'step':>8} {'wait':>6}"
        if parts:
            header += "".join(f" {look(part).short:>4}" for part in parts)
        else:
            header += f" {'compute':>8}"
        header += f" {'ex/s':>7} {'status':<7} device"
        text.append(header, style="bold")
        keep = 12 if tall else max(1, 4 - taken_rows)
        # After a crash the log tail needs the rows: the failed worker (first) and a count.
        crashed_short = state.failed and not tall
        if crashed_short:
            keep = 1
        shown = rows if len(rows) <= keep + 1 else rows[:keep]
        for row in shown:
            host = row.host or "?"
            if len(host) > self.HOST_CHARS:
                host = host[: self.HOST_CHARS - 1] + "…"
            line = f"{row.worker:>2} {host:<{self.HOST_CHARS}} {row.replicas or '?'!s:>3}"
            line += f" {fmt.ms(row.step_time_ms):>8} {fmt.pct(row.input_wait_pct):>6}"
            if parts:
                line += "".join(f" {pct_cell(row.breakdown, part):>4}" for part in parts)
            else:
                line += f" {fmt.ms(row.compute_ms):>8}"
            line += f" {fmt.count(row.examples_per_s):>7}"
            style = "bold red" if row.status in ("error", "crashed") else ""
            if straggler is not None and row.worker == straggler.worker:
                style = style or "bold yellow"
            status = row.status
            if state.terminal and status in ("starting", "running"):
                status = "ended"  # the run ended with it (one lost worker ends them all)
            text.append("\n" + line)
            text.append(f" {status:<7}", style=style)
            text.append(f" {device_summary(row.sample, wide)}")
        if len(shown) < len(rows):
            more = f"… and {len(rows) - len(shown)} more"
            cells = (self.content_size.width or 78) - len(more) - 1
            if len(rows) > 8 and cells >= 16:
                # Every worker at a glance, by index (worker_strip), after the count.
                text.append(f"\n{more} ", style="dim")
                text.append_text(worker_strip(rows, cells))
            else:
                text.append(f"\n{more} workers", style="dim")
        if not rows:
            text.append("\nno worker has said hello yet", style="dim")
        if straggler is not None and not crashed_short:
            # Wrapped here, at word breaks, so every line fits: a line the panel would wrap
            # itself makes each repaint a new layout of the whole screen.
            width = self.content_size.width  # 0 before the first layout: one line then
            for line in textwrap.wrap(straggler.message, width) if width else [straggler.message]:
                text.append("\n" + line, style="bold yellow")
        title = f"workers: {len(rows)}, slowest first"
        if parts:  # the all-reduce's time holds the wait for the slowest: said once, here
            title += " · sync: all-reduce incl. wait for the slowest"
        show_title(self, title)
        self.set_text(text)


class HistoryPanel(StatePanel):
    """Sparklines of examples/s and input wait % over the recent steps, with their ranges.

    The figures now are the metrics line's (one value each, RunState.figures): this panel
    shows each step's, so its text is their range, not a second "now".

    One widget of text, not a row of label, sparkline and figure widgets: every widget
    costs the compositor on each repaint of the screen. Built again for a new width.
    """

    LABEL_WIDTH = 7
    VALUE_WIDTH = 30
    TALL_LINES = 4  # the sparklines' height on a tall terminal

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._series: tuple[list[float], list[float]] = ([], [])

    def show_state(self, state: RunState) -> None:
        rates: list[float] = []
        waits: list[float] = []
        for point in state.window:
            if point.warmup:
                continue
            rate, wait = point.event.examples_per_s, point.event.input_wait_pct
            if rate is not None:
                rates.append(rate)
            if wait is not None:  # a script's loop may not let it be measured
                waits.append(wait)
        self._series = (rates, waits)
        self.set_text(self._build(self.size.width))
        # In a cluster the steps are the chief's; the headline's input wait may not be.
        whose = "the chief's " if state.workers > 1 else ""
        show_title(self, f"history: {whose}last {len(rates)} steps after warm-up, all attempts")

    def on_resize(self, event: events.Resize) -> None:
        self.set_text(self._build(event.size.width))

    def _build(self, width: int) -> Text:
        rates, waits = self._series
        if rates:
            wait_range = (f"range {min(waits):.1f}–{max(waits):.1f}%" if waits
                          else "not measured")
            rows = [
                ("ex/s", rates, "green",
                 f"range {fmt.count(min(rates))}–{fmt.count(max(rates))}"),
                ("wait %", waits, "yellow", wait_range),
            ]
        else:
            rows = [("ex/s", [], "green", "no steps yet"), ("wait %", [], "yellow", "")]
        lines = self.TALL_LINES if is_tall(self) else 1
        room = max(0, width - self.LABEL_WIDTH - 1 - self.VALUE_WIDTH)
        text = Text()
        for label, values, style, figure in rows:
            for line, spark in enumerate(fmt.spark_rows(values, room, lines)):
                if text:
                    text.append("\n")
                text.append(f"{label if line == 0 else '':<{self.LABEL_WIDTH}}", style="dim")
                text.append(spark, style=style)
                if line == 0 and figure:
                    text.append(" ")
                    text.append(figure, style="" if values else "dim")
        return text


# Settings that differ between attempts: (short name, its value by attempt), in order.
Differences = list[tuple[str, dict[int, str]]]


class AttemptsPanel(StatePanel):
    """Each attempt's settings and its measured figures after warm-up, side by side.

    Prefetch, accumulation and batch are always shown; every other setting that differs
    between the attempts shown (``runstate.differing_settings``: read latency, parallel
    calls, cache, ...) gets a column of its own where the width allows them all, else a
    line under each row with the short names and that attempt's values. So two rows never
    read the same while their settings differ.

    A cluster's input wait is the worker's that waits most over the attempt ("38.0% w1"):
    every step waits for it, so that is the figure a change must bring down.

    Where an attempt's steps were timed apart, its shares of compute and of the all-reduce
    ("50/20%") have a column after the input wait, where every row still fits the width
    with it (the settings' columns come first; "cp/sync" when "comp/sync" is too wide).
    """

    MAX_ROWS = 8
    SPLIT_LABELS = ("comp/sync", "cp/sync")
    FIXED = (PREFETCH_KEY, ACCUMULATION_KEY, BATCH_KEY)
    VALUE_CHARS = 16  # a longer value (a list of workers) is cut, with "…"

    _last_state: RunState | None = None

    def on_resize(self) -> None:
        """How many attempts fit changed (a crash panel came, the terminal shrank)."""
        shown = self._last_state
        if shown is not None:
            self.call_after_refresh(lambda: self.show_state(shown))

    def show_state(self, state: RunState) -> None:
        self._last_state = state
        text = Text()
        recent = list(state.attempts.values())[-self.MAX_ROWS:]
        # The latest attempts that fit under the header: on a short screen the newest stay
        # in view, not the oldest.
        lines = self.content_size.height - 1 if self.content_size.height else self.MAX_ROWS
        width = self.content_size.width or 78
        attempts = recent
        columns: Differences = []
        notes: Differences = []
        for count in range(len(recent), 0, -1):
            attempts = recent[-count:]
            columns, notes = self._differences(attempts, width)
            needed = count * (2 if notes else 1) + any(s.data_restarted for s in attempts)
            if needed <= lines:
                break
        # A workers column only for a cluster: one-host runs read as they always did.
        cluster = any(s.workers > 1 for s in attempts)
        split = self._split_label(state, attempts, columns, cluster, width)
        text.append(self._header(columns, cluster, split), style="bold")
        for summary in attempts:
            text.append("\n" + self._row(state, summary, columns, cluster, split))
            if notes:  # under the row, as many as the width holds
                note = Text("  ")
                for index, (label, values) in enumerate(notes):
                    note.append("  " if index else " ")
                    note.append(f"{label} ", style="dim")
                    note.append(values[summary.attempt])
                note.truncate(width, overflow="ellipsis")
                text.append("\n")
                text.append_text(note)
        restarted = [s for s in attempts if s.data_restarted]
        if restarted:
            last = restarted[-1]
            text.append(f"\n* attempt {last.attempt}: {last.data_restarted}", style="yellow")
        if not attempts:
            text.append("\nno attempt yet", style="dim")
        title = "attempts (measured after warm-up"
        if cluster:
            title = "attempts (after warm-up; input wait: the worker that waits most"
        if split:
            title += f"; {split}: % compute / {part_label('sync', cluster)}"
        show_title(self, title + ")")
        self.set_text(text)

    def _differences(
        self, attempts: list[AttemptSummary], width: int
    ) -> tuple[Differences, Differences]:
        """The settings that differ between these attempts, besides the fixed columns:
        (as columns, as a note under each row); one of them is empty."""
        keys = [k for k in differing_settings(attempts) if k not in self.FIXED]
        labels = setting_labels(keys)
        flat = {summary.attempt: dotted_settings(summary.settings) for summary in attempts}
        found: Differences = []
        for key in keys:
            values = {}
            for summary in attempts:
                value = setting_text(key, flat[summary.attempt].get(key))
                if len(value) > self.VALUE_CHARS:
                    value = value[: self.VALUE_CHARS - 1] + "…"
                values[summary.attempt] = value
            found.append((labels[key], values))
        cluster = any(s.workers > 1 for s in attempts)
        if len(self._header(found, cluster)) <= width:
            return found, []
        return [], found

    @staticmethod
    def _widths(columns: Differences) -> list[int]:
        return [max(len(label), *(len(v) for v in values.values())) for label, values in columns]

    def _split_label(
        self, state: RunState, attempts: list[AttemptSummary], columns: Differences,
        cluster: bool, width: int,
    ) -> str:
        """The compute/all-reduce column's label that keeps every row within the width;
        '' when none does, or no attempt's steps were timed apart."""
        if not any(summary.breakdown is not None for summary in attempts):
            return ""
        for label in self.SPLIT_LABELS:
            lines = [self._header(columns, cluster, label)]
            lines += [self._row(state, s, columns, cluster, label) for s in attempts]
            if all(len(line) <= width for line in lines):
                return label
        return ""

    def _header(self, columns: Differences, cluster: bool, split: str = "") -> str:
        header = f"{'#':>2} {'prefetch':>8} {'accum':>5} {'batch':>6}"
        for (label, _), column_width in zip(columns, self._widths(columns), strict=True):
            header += f" {label:>{column_width}}"
        header += f" {'steps':>6}"
        if cluster:
            header += f" {'wkrs':>4}"
        header += f" {'ex/s (median)':>14} {'input wait':>11}"
        if split:
            header += f" {split}"
        return header + "  ended"

    def _row(
        self, state: RunState, summary: AttemptSummary, columns: Differences, cluster: bool,
        split: str = "",
    ) -> str:
        wait = summary.input_wait_pct
        prefetch = "?" if summary.prefetch is None else prefetch_word(summary.prefetch)
        row = f"{summary.attempt:>2} {prefetch:>8}"
        accumulation, batch = summary.accumulation_steps, summary.global_batch_size
        if command_argv(summary.settings) is not None:
            # A person's own command's are its own: its hook's hello says its batch.
            accumulation = "-"
            batch = summary.hello.global_batch_size if summary.hello is not None else "-"
        row += f" {accumulation or '?'!s:>5}"
        row += f" {batch or '?'!s:>6}"
        for (_, values), column_width in zip(columns, self._widths(columns), strict=True):
            row += f" {values[summary.attempt]:>{column_width}}"
        row += f" {summary.steps_seen:>6}"
        if cluster:
            row += f" {summary.workers:>4}"
        if summary.measured:
            whose = summary.input_wait_worker
            shown = fmt.pct(wait, 1) + ("" if whose is None else f" w{whose}")
            row += f" {fmt.count(summary.median_examples_per_s):>14} {shown:>11}"
        elif summary.steps_seen == 0 and command_argv(summary.settings) is not None:
            row += f" {'no steps':>14} {'':>11}"  # a command that sends none, or not yet
        else:
            row += f" {'warming up':>14} {'':>11}"
        if split:
            shares = compute_sync_cell(summary.breakdown if summary.measured else None)
            row += f" {shares:>{len(split)}}"
        ended = summary.end or ("running" if summary.attempt == state.attempt else "")
        if summary.attempt == state.attempt and state.terminal:
            ended = summary.end or state.status or ""
        if summary.data_restarted:
            ended += "*"
        return row + f"  {ended}"


class PendingBar(StatePanel):
    """What a relaunch would change, or how to change something, or the change in flight.

    The hints name the keys; the app makes them from its bindings. On one line at any
    width: the description gives way (cut with "…"), never the keys or how it applies.
    """

    def __init__(
        self, *args: Any, idle_hint: str, pending_hint: Callable[..., str], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.idle_hint = idle_hint  # the keys that change a setting
        self.pending_hint = pending_hint  # (live=, short=) -> the keys that apply or discard

    def show_pending(
        self, description: str, *, live: bool = False, note: str | None = None,
        applying: str | None = None,
    ) -> None:
        """live: `r` would apply it in the running trainer, not relaunch (the bar says which).
        note: said instead of "no pending changes" (an ended run's "r resumes it").
        applying: a live change in flight ("applying live: ... · 3 s"): said instead of all
        else, and no key invites a second press until it is settled."""
        width = self.content_size.width or self.app.size.width - 2
        if applying:
            text = Text(fit_line(applying, width, keep=applying[applying.rfind(" · "):]),
                        style="bold yellow")
        elif description:
            head = f"pending ({'live' if live else 'relaunch'}): "
            hint = f" — {self.pending_hint(live=live)}"
            if len(head) + len(description) + len(hint) > width:  # the short keys, then a cut
                hint = f" — {self.pending_hint(live=live, short=True)}"
            text = Text(head, style="bold yellow")
            text.append(fit_line(description, width - len(head) - len(hint)))
            text.append(hint, style="bold")
        elif note:
            text = Text(note, style="bold")
            text.append(f" · {self.idle_hint}", style="dim")
        else:
            text = Text(f"no pending changes · {self.idle_hint}", style="dim")
        self.set_text(text)

    def on_resize(self) -> None:
        self.app.call_after_refresh(getattr(self.app, "show_pending", lambda: None))


def fit_line(line: str, width: int, keep: str = "") -> str:
    """line in width cells, cut with "…" before its tail keep (which stays whole)."""
    if len(line) <= width or width <= 0:
        return line
    head = line[: len(line) - len(keep)] if keep else line
    room = max(1, width - len(keep) - 1)
    return head[:room].rstrip(" ,") + "…" + keep


class CrashPanel(StatePanel):
    """Exit code or signal, the supervisor's message, and the last lines of the log."""

    def show_state(self, state: RunState) -> None:
        text = Text()
        if not state.failed:
            self.set_text(text)
            return
        how = []
        if state.exit_code is not None:
            how.append(f"exit code {state.exit_code}")
        if state.signal is not None:
            how.append(f"signal {state.signal}")
        status = str(state.status)
        worker = state.status_worker
        if worker is not None and f"worker {worker}" not in (state.status_message or ""):
            status += f" (worker {worker})"
        text.append(f"{status}: {', '.join(how) or 'no exit status'}", style="bold red")
        if state.status_message:
            text.append(f" — {state.status_message}")
        # The cause once: the supervisor's message quotes the trainer's error, which is
        # also the last line of its traceback in the log.
        said = [state.status_message or ""]
        error = state.error
        if error is not None and error.message and not says_again(error.message, said):
            kind = error.kind
            if error.worker or state.workers > 1:
                kind += f", worker {error.worker}"
            text.append(f"\nerror ({kind}): {error.message}")
            said.append(error.message)
        if state.log_tail:
            # The last lines matter most (the exception): show as many as the screen allows.
            lines = [line for line in state.log_tail if not says_again(line, said)]
            keep = 16 if is_tall(self) else 5
            shown = lines[-keep:]
            title = f"trainer ended · last {plural(len(shown), 'line')} of trainer.log"
            if len(lines) < len(state.log_tail):
                title += ", less the error said above"
            show_title(self, title)
            for line in shown:
                text.append("\n  " + line)
        self.set_text(text)


# A log line this long or longer that a message above contains is that message again (a
# shorter one, like "Traceback" or ")", is not the cause). The first CAUSE_KEY_CHARS of it
# are compared: the supervisor's message cuts a long cause short.
CAUSE_MIN_CHARS = 12
CAUSE_KEY_CHARS = 80


def says_again(line: str, said: list[str]) -> bool:
    """Whether `line` only says again what one of the messages `said` says."""
    key = line.strip()
    if len(key) < CAUSE_MIN_CHARS:
        return False
    key = key[:CAUSE_KEY_CHARS]
    return any(key in message for message in said)
