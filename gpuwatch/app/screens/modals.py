"""Modal screens: quit (detach or stop), confirm stop, switch run, list keys.

Each returns a typed result through ``push_screen(..., callback=...)``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from gpuwatch.app import fmt
from gpuwatch.app.widgets.common import plural
from gpuwatch.runs.folders import RunInfo
from gpuwatch.runstate import recent_window

QuitChoice = Literal["detach", "stop", "cancel"]


class QuitScreen(ModalScreen[QuitChoice]):
    """Quit the dashboard: detach (training goes on, the default) or stop the run."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "d", "choose('detach')", "Detach", id="quit.detach", tooltip="Leave training running"
        ),
        Binding("s", "choose('stop')", "Stop run", id="quit.stop", tooltip="Stop the trainer"),
        Binding("escape", "choose('cancel')", "Cancel", id="quit.cancel", tooltip="Back"),
    ]

    def __init__(self, *, own_command: bool = False) -> None:
        super().__init__()
        self.own_command = own_command

    @property
    def text(self) -> str:
        """What the dialog says: what Stop does to this run (gpuwatch checkpoints its
        own trainer; a person's command it ends, and keeps nothing of it)."""
        stop = ("Stop ends your command (SIGTERM, then SIGKILL after the grace); gpuwatch "
                "keeps no checkpoint of it." if self.own_command
                else "Stop checkpoints and ends the run.")
        return ("Quit the dashboard?\n\nDetach leaves training running; attach again with "
                f"gpuwatch attach. {stop}")

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.text, classes="dialog-text")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Detach (d)", id="detach", variant="primary")
                yield Button("Stop run (s)", id="stop", variant="error")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#detach", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.action_choose(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice if choice in ("detach", "stop") else "cancel")  # type: ignore[arg-type]


class ConfirmStopScreen(ModalScreen[bool]):
    """Stop training? (y/n)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="stop.yes", tooltip="Stop the run"),
        Binding("n,escape", "answer(False)", "No", id="stop.no", tooltip="Keep training"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(
                "Stop training?\n\nThe trainer checkpoints and exits; the run ends. "
                "The dashboard stays open.",
                classes="dialog-text",
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Stop (y)", id="yes", variant="error")
                yield Button("Keep training (n)", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class RunsScreen(ModalScreen[RunInfo | None]):
    """The live runs on this machine; Enter switches the dashboard to one."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Close", id="runs.close", tooltip="Stay on this run"),
    ]

    def __init__(self, runs: list[RunInfo], current_run_id: str | None) -> None:
        super().__init__()
        self.runs = runs
        self.current_run_id = current_run_id

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog dialog-wide"):
            yield Static(
                "Live runs on this machine (Enter: switch, Esc: close)", classes="dialog-text"
            )
            options = []
            for info in self.runs:
                mark = "▶" if info.run_id == self.current_run_id else " "
                label = (
                    f"{mark} {info.run_id}  {info.name[:16]:<16} {info.status:<9} "
                    f"attempt {info.attempt}  step {info.step:,}  "
                    f"{fmt.count(info.examples_per_s, 'ex/s')}"
                )
                if info.examples_per_s is not None:  # over the window the headline's is
                    label += f" ({recent_window(info.examples_per_s_steps)})"
                options.append(Option(label, id=info.run_id))
            if not options:
                options.append(Option("no live runs on this machine", id="", disabled=True))
            yield OptionList(*options, id="runs-list")

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        chosen = next((r for r in self.runs if r.run_id == event.option.id), None)
        self.dismiss(chosen)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class KeysScreen(ModalScreen[None]):
    """Every key of the dashboard and what it does."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close", id="keys.close", tooltip="Back"),
    ]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        # The rows scroll (more keys than an 80x24 dialog holds); the title and the way
        # out stay in view.
        width = max(len(key) for key, _ in self.rows)
        lines = [f"{key:>{width}}  {what}" for key, what in self.rows]
        with Vertical(classes="dialog dialog-wide", id="keys-dialog"):
            yield Static("Keys", id="keys-title")
            with VerticalScroll(id="keys-scroll"):
                yield Static("\n".join(lines) + "\n", id="keys-text")
            yield Static(self.CLOSE, id="keys-close")

    CLOSE = "Esc or ? closes this list"

    def on_mount(self) -> None:
        scroll = self.query_one("#keys-scroll", VerticalScroll)
        scroll.focus()  # the arrows scroll it at once
        # Where the list is, in words: a scrollbar's thumb is drawn with block glyphs
        # that read as bits of a sparkline on a screen without colour.
        self.watch(scroll, "scroll_y", self._say_where, init=False)
        self.watch(scroll, "virtual_size", self._say_where, init=False)
        self.call_after_refresh(self._say_where)

    def _say_where(self, _value: object = None) -> None:
        scroll = self.query_one("#keys-scroll", VerticalScroll)
        above = round(scroll.scroll_y)
        below = max(0, round(scroll.max_scroll_y) - above)
        where = []
        if above:
            where.append(f"↑ {plural(above, 'line')} above")
        if below:
            where.append(f"↓ {plural(below, 'line')} below")
        text = self.CLOSE
        if where:
            text += " · " + ", ".join(where) + " (↑↓ PgUp PgDn)"
        self.query_one("#keys-close", Static).update(text)

    def action_close(self) -> None:
        self.dismiss(None)
