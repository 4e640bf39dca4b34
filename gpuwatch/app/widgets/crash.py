"""The crash panel: how the trainer ended, the cause once, and the log's last lines."""

from __future__ import annotations

from rich.text import Text

from gpuwatch.app.widgets.common import is_tall, plural
from gpuwatch.app.widgets.state_panel import StatePanel, show_title
from gpuwatch.runstate import RunState


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
        message = state.status_message or ""
        signal = None if state.signal is None else str(state.signal)
        if message and _says_how(message, state.exit_code, signal):
            # "exited with code 3: ValueError: ..." once, not after "exit code 3 —".
            text.append(f"{status}:", style="bold red")
            text.append(f" {message}")
        else:
            text.append(f"{status}: {', '.join(how) or 'no exit status'}", style="bold red")
            if message:
                text.append(f" — {message}")
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


def _says_how(message: str, exit_code: int | None, signal: str | None) -> bool:
    """Whether the supervisor's message already says how the trainer ended."""
    return ((exit_code is not None and f"exited with code {exit_code}" in message)
            or (signal is not None and f"killed by {signal}" in message))


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
