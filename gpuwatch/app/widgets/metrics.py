"""The metrics panel: step, loss and the figures, and where the steps' time went."""

from __future__ import annotations

from rich.text import Text

from gpuwatch.app import fmt
from gpuwatch.app.widgets.breakdown import breakdown_lines
from gpuwatch.app.widgets.common import fit_line, plural, wrapped
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.runstate import (
    WARMUP_STEPS,
    CommandView,
    Figures,
    RunState,
    StepPoint,
    recent_window,
)


class MetricsPanel(StatePanel):
    """Step, epoch, loss, and the figures: examples/s, step time, input wait (a cluster's:
    the worker's that waits most, named), after the window they are over ("last 20
    steps:", as the attempts table's say theirs: the attempt); where the steps' parts were
    timed apart, where their time went (one stacked bar, the all-reduce's bus bandwidth, a
    legend with the shares: ``breakdown.py``); dim, and saying why, when they are not
    current."""

    BASE_ROWS = 2  # the step line and the figures line
    # What the figures line leaves out, or says shorter, in turn, until it fits its width.
    GIVE_WAY = ((), ("of",), ("of", "examples"), ("of", "examples", "steps"),
                ("of", "examples", "steps", "per"),
                ("of", "examples", "steps", "per", "tflops"))

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
                text.append(plural(hello.replicas, "replica"))
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
            # Whole, over as many lines as it takes: the why and how the loop could change.
            for line in wrapped(unmeasurable, self.content_size.width):
                text.append("\n")
                text.append(line, style="bold")
        parts = breakdown_lines(figures, self.content_size.width, cluster=state.workers > 1)
        if parts:
            text.append("\n")
            text.append_text(parts)
        self.set_text(text)

    def _figures_line(self, figures: Figures, rate: float, *, wait: bool = True) -> Text:
        """The window, then examples/s, step time, input wait, TFLOP/s (and MFU). On a
        narrow panel these give way, in turn: "of step time", "examples/s" to "ex/s", the
        window's "steps" ("last 20:"), "per step" to "/step", then the TFLOP/s; the window
        itself never does. wait: False where the input wait cannot be measured (a script's
        loop: the line under it says why, never a number)."""
        width = self.content_size.width
        for leave_out in self.GIVE_WAY:
            line = Text()
            window = recent_window(figures.steps, short="steps" in leave_out)
            line.append(f"{window}: ", style="dim")
            unit = "ex/s" if "examples" in leave_out else "examples/s"
            line.append(fmt.count(rate, unit), style="bold")
            per = "/step" if "per" in leave_out else " per step"
            line.append(f"  {fmt.ms(figures.step_time_ms)}{per}", style="")
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
