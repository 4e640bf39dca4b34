"""The settings screen (`e`): the settings a running trainer can change, then those that
take a relaunch (steps_per_execution, jit_compile, precision), as text to edit.

Enter checks every field (gpuwatch.config.settings_form: the config's own reading and schema)
and either returns the new pending settings or shows each problem under its field and
stays open; Esc returns None. The dashboard makes the result its pending settings, which
`r` then applies: live in the running trainer when only live keys are pending, else a
relaunch from the checkpoint with all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.events import DescendantFocus
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from gpuwatch.config.settings_form import (
    FORM_KEYS,
    GENERAL,
    LIVE_FORM_KEYS,
    RELAUNCH_FORM_KEYS,
    FormRefused,
    form_texts,
    read_form,
)
from gpuwatch.config.words import accepts
from trainer_runtime.changes import LIVE_KEYS


def field_id(key: str) -> str:
    """The Input's id for a dotted key: "data.parallel_calls" -> "set-data-parallel_calls"."""
    return "set-" + key.replace(".", "-")


def error_id(key: str) -> str:
    """The id of the line under a field that says what is wrong with it."""
    return f"{field_id(key)}-error" if key != GENERAL else "set-error"


class SettingsScreen(ModalScreen[dict[str, Any] | None]):
    """Edit the settings; Enter makes them the pending settings, Esc cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape", "cancel", "Cancel", id="settings.cancel", tooltip="Close, changing nothing"
        ),
    ]

    def __init__(
        self,
        settings: Mapping[str, Any],
        pending: Mapping[str, Any],
        *,
        replicas: int,
        running: bool,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.pending = pending
        self.replicas = replicas
        self.running = running

    def compose(self) -> ComposeResult:
        texts = form_texts(self.settings, self.pending)
        how = (
            "Live settings: r applies them in the running trainer."
            if self.running
            else "Settings (no trainer runs now: r relaunches with them)."
        )
        with Vertical(classes="dialog dialog-wide", id="settings-dialog"):
            yield Static(f"{how} Enter: set as pending. Esc: cancel.", classes="dialog-text")
            with VerticalScroll(id="settings-fields"):
                for key in LIVE_FORM_KEYS:
                    yield from self._row(key, texts[key])
                yield Static(
                    # Any one pending makes r a relaunch, the live ones pending with it.
                    "Relaunch settings (r restarts from the checkpoint, with all pending):",
                    id="settings-relaunch-title",
                    classes="settings-group",
                )
                for key in RELAUNCH_FORM_KEYS:
                    yield from self._row(key, texts[key])
            yield Static(id=error_id(GENERAL), classes="settings-error")
            yield Static(id="settings-accepts")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Set (enter)", id="apply", variant="primary", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def _row(self, key: str, text: str) -> ComposeResult:
        with Horizontal(classes="settings-row"):
            yield Label(key, classes="settings-key")
            yield Input(text, id=field_id(key), classes="settings-input", compact=True)
            yield Label("live" if key in LIVE_KEYS else "relaunch", classes="settings-how")
        yield Static(id=error_id(key), classes="settings-error")

    def on_mount(self) -> None:
        self.query_one(f"#{field_id(FORM_KEYS[0])}", Input).focus()

    @on(DescendantFocus)
    def _show_accepts(self, event: DescendantFocus) -> None:
        key = next((k for k in FORM_KEYS if field_id(k) == event.widget.id), None)
        if key is not None:
            self.query_one("#settings-accepts", Static).update(f"{key} takes {accepts(key)}")

    @on(Input.Submitted)
    @on(Button.Pressed, "#apply")
    def action_apply(self) -> None:
        """Check every field; close with the new pending settings, or show what is wrong."""
        texts = {key: self.query_one(f"#{field_id(key)}", Input).value for key in FORM_KEYS}
        try:
            pending = read_form(self.settings, self.pending, texts, self.replicas)
        except FormRefused as refused:
            self._show_errors(refused.errors)
            return
        self.dismiss(pending)

    def _show_errors(self, errors: Mapping[str, str]) -> None:
        for key in (*FORM_KEYS, GENERAL):
            line = self.query_one(f"#{error_id(key)}", Static)
            line.update(errors.get(key, ""))
            line.set_class(key in errors, "-shown")
        first = next((key for key in FORM_KEYS if key in errors), None)
        if first is not None:
            self.query_one(f"#{field_id(first)}", Input).focus()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
