"""The attempts table: each attempt's settings and its measured figures, side by side."""

from __future__ import annotations

from rich.text import Text

from gpuwatch.app import fmt
from gpuwatch.app.widgets.breakdown import compute_sync_cell, part_label
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.runstate import (
    ACCUMULATION_KEY,
    ATTEMPT_WINDOW,
    BATCH_KEY,
    PREFETCH_KEY,
    AttemptSummary,
    RunState,
    command_argv,
    differing_settings,
    setting_labels,
    setting_text,
)
from trainer_runtime.changes import dotted_settings
from trainer_runtime.schema import prefetch_word

# Settings that differ between attempts: (short name, its value by attempt), in order.
Differences = list[tuple[str, dict[int, str]]]


class AttemptsPanel(StatePanel):
    """Each attempt's settings and its measured figures after warm-up, side by side.

    Each figure is over its whole attempt, and its examples/s (a median) says so: "ex/s
    (attempt)", where the metrics line's says "last 20 steps". While the attempt has no
    more steps after warm-up than that, the two are over the same steps: one value.

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
    RATE_LABEL = f"ex/s ({ATTEMPT_WINDOW})"  # its window: its column is 14 wide

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
        width = self.content_size.width or 78
        # A row is its header's width with its "ended" word in place of the word "ended".
        longest = max((len(self._ended(state, s)) for s in recent), default=0)
        attempts, columns, notes, shared = self._fit(
            recent, width - max(0, longest - len("ended")))
        # A workers column only for a cluster: one-host runs read as they always did.
        cluster = any(s.workers > 1 for s in attempts)
        split = self._split_label(state, attempts, columns, cluster, width)
        text.append(self._header(columns, cluster, split), style="bold")
        for summary in attempts:
            text.append("\n" + self._row(state, summary, columns, cluster, split))
            if notes and not shared:  # under the row, as many as the width holds
                note = Text("  ")
                for index, (label, values) in enumerate(notes):
                    note.append("  " if index else " ")
                    note.append(f"{label} ", style="dim")
                    note.append(values[summary.attempt])
                note.truncate(width, overflow="ellipsis")
                text.append("\n")
                text.append_text(note)
        if shared:
            text.append("\n")
            text.append_text(self._shared_note(attempts, notes, width))
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

    def _fit(
        self, recent: list[AttemptSummary], width: int
    ) -> tuple[list[AttemptSummary], Differences, Differences, bool]:
        """The latest attempts that fit under the header, and how their differing settings
        show: (attempts, as columns, as notes, notes shared in one line).

        On a short screen the newest stay in view, not the oldest, and as many of them as
        the height holds: where a note under each row would leave room for one attempt
        only, one line under the rows gives each differing setting's values in row order
        ("max steps 300/450"), so the current attempt and the ones before it still show
        side by side."""
        lines = self.content_size.height - 1 if self.content_size.height else self.MAX_ROWS
        attempts = recent
        columns: Differences = []
        notes: Differences = []
        for count in range(len(recent), 0, -1):
            attempts = recent[-count:]
            columns, notes = self._differences(attempts, width)
            restarted = any(s.data_restarted for s in attempts)
            if not notes and count + restarted <= lines:
                return attempts, columns, notes, False
            if notes and 2 * count + restarted <= lines:
                return attempts, columns, notes, False
            if notes and count + 1 + restarted <= lines:
                return attempts, columns, notes, True
        return attempts, columns, notes, False

    @staticmethod
    def _shared_note(attempts: list[AttemptSummary], notes: Differences, width: int) -> Text:
        """One line for the rows above: each differing setting, its values in row order."""
        note = Text("  ")
        note.append("rows above:", style="dim")
        for label, values in notes:
            note.append("  ")
            note.append(f"{label} ", style="dim")
            note.append("/".join(values[s.attempt] for s in attempts))
        note.truncate(width, overflow="ellipsis")
        return note

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
        header += f" {self.RATE_LABEL:>14} {'input wait':>11}"
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
        return row + f"  {self._ended(state, summary)}"

    @staticmethod
    def _ended(state: RunState, summary: AttemptSummary) -> str:
        """The "ended" cell: why the attempt ended, or the run's state for the current one."""
        ended = summary.end or ("running" if summary.attempt == state.attempt else "")
        if summary.attempt == state.attempt and state.terminal:
            ended = summary.end or state.status or ""
        if summary.data_restarted:
            ended += "*"
        return ended
