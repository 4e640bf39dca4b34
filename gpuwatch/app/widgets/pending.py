"""The pending bar: what a relaunch would change, how to change it, or the change in flight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text

from gpuwatch.app.widgets.common import fit_line
from gpuwatch.app.widgets.state_panel import StatePanel


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
