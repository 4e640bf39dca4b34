"""The header: run id, name, attempt, status, elapsed, the link's state, in one line."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual import events

from gpuwatch.app import fmt
from gpuwatch.app.widgets.state_panel import StatePanel
from gpuwatch.follow.link import RECORD
from gpuwatch.runstate import RunState

STATUS_STYLE = {
    "starting": "yellow",
    "running": "bold green",
    "stopping": "yellow",
    "stopped": "bold",
    "finished": "bold cyan",
    "crashed": "bold white on red",
    "lost": "bold white on red",
}


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
    budget), said after the elapsed time as "refresh 1.2s", and going with it.

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
        elapsed += f"  refresh {every_s:.1f}s"
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
