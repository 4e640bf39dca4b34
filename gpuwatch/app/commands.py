"""The dashboard's commands to its run: relaunch (r, R) and stop (s, q), and a live change
in flight.

``CommandsMixin`` is part of GpuwatchApp (it uses the app's link, state, pending settings
and notifications). A live change is shown as in flight (the pending bar's "applying ...")
from `r` until the run's record settles it: the new attempt begins, or the trainer refuses
it, or the command's err. The supervisor may answer ``pending`` when the trainer has not
answered within its wait: the bar goes on saying "applying" until it does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual import work

from gpuwatch.app.screens.modals import ConfirmStopScreen
from gpuwatch.follow.client import ClientError, ConnectionLost
from gpuwatch.runstate import (
    RunState,
    describe_pending,
    pending_applies_live,
    pending_overrides,
)

if TYPE_CHECKING:
    from textual.app import App

    from gpuwatch.follow.link import RunLink

    _Base = App[str]
else:
    _Base = object


@dataclass
class Applying:
    """A live change sent with `r` that the record has not settled yet."""

    description: str
    since: float  # time.monotonic() when r was pressed
    from_attempt: int  # the attempt running when it was sent
    refusals: int  # the trainers' refusals recorded by then (RunState.refusals)

    def settled(self, state: RunState) -> bool:
        """The record says how it went: a new attempt began (this change's, or a relaunch's),
        a trainer refused it (one change is in flight at a time: a refusal since is its),
        or the run ended."""
        return (state.terminal or state.attempt > self.from_attempt
                or state.refusals > self.refusals)

    def line(self) -> str:
        seconds = time.monotonic() - self.since
        return f"applying live: {self.description} · {seconds:.0f} s"


class CommandsMixin(_Base):
    """r, R, s and the stop behind q: the app's commands, and the change in flight."""

    applying: Applying | None = None
    if TYPE_CHECKING:  # the app's, which these use
        link: RunLink
        state: RunState
        pending: dict[str, Any]
        _relaunched_attempt: int
        _stopped_by_person: bool

        def show_pending(self) -> None: ...

    def action_relaunch(self, live: bool = True) -> None:
        """r: live where the trainer can change them (the supervisor decides); R: live=False.
        On a run that has ended: the next attempt, with nothing pending too. R always
        relaunches, as it is when nothing is pending (a trainer that seems stuck)."""
        if live and self.applying is not None:
            self.notify("a live change is still being applied: wait for it, or R relaunches",
                        severity="warning")
            return
        overrides = pending_overrides(self.state.settings, self.pending)
        if overrides or self.state.terminal or not live:
            self.send_relaunch(overrides, live=live)

    @work(group="command", exit_on_error=False)
    async def send_relaunch(self, overrides: dict[str, Any], live: bool = True) -> None:
        description = describe_pending(self.state.settings, overrides)
        running = self.state.status == "running"
        applying = None
        if live and pending_applies_live(self.state.settings, overrides, running=running):
            # Shown until the trainer has switched: no figure reads as the new settings' yet.
            applying = self.applying = Applying(
                description, time.monotonic(), self.state.attempt, self.state.refusals
            )
            self.show_pending()
        link = self.link
        try:
            reply = await link.command("relaunch", overrides=overrides, fresh=False, live=live)
        except (ConnectionLost, TimeoutError) as exc:
            if applying is None:
                self.notify(f"relaunch failed: {exc}", severity="error")
                return
            # Sent, and maybe applied: the bar follows the record until it says how it went.
            self.notify(f"no answer to the live change ({exc}); the record will show whether "
                        "it applied", title="still applying", severity="warning")
            return
        except ClientError as exc:
            self._settle_applying(applying)
            self.notify(f"relaunch failed: {exc}", severity="error")
            return
        if link is not self.link:
            return  # switched runs meanwhile: this answer is the other run's
        if pending_overrides(self.state.settings, self.pending) == overrides:
            self.pending = {}
        if isinstance(reply.get("attempt"), int):
            self._relaunched_attempt = max(self._relaunched_attempt, reply["attempt"])
        if reply.get("pending") and applying is not None:
            self.notify(str(reply.get("message", "the trainer has not answered yet")),
                        title="still applying", severity="warning")
            self.check_applying()
            return
        self._settle_applying(applying)
        if reply.get("live"):
            self.notify(f"applied live: {description}", title="live")
        elif reply.get("resumed"):
            with_what = f": {description}" if description else ""
            self.notify(f"resuming as attempt {reply.get('attempt')}{with_what}", title="resume")
        else:
            self.notify(f"relaunching: {description or 'the same settings'}", title="relaunch")

    def _settle_applying(self, applying: Applying | None) -> None:
        if applying is not None and self.applying is applying:
            self.applying = None
            self.show_pending()

    def check_applying(self) -> None:
        """The bar's "applying" line, each second (show_pending drops it once settled)."""
        if self.applying is not None:
            self.show_pending()

    def action_stop_run(self) -> None:
        def confirmed(answer: bool | None) -> None:
            if answer:
                self.send_stop(exit_after=False)

        self.push_screen(ConfirmStopScreen(), callback=confirmed)

    @work(group="command", exit_on_error=False)
    async def send_stop(self, exit_after: bool) -> None:
        try:
            await self.link.command("stop")
        except (ClientError, TimeoutError) as exc:
            self.notify(f"stop failed: {exc}", severity="error")
            if exit_after:
                self.exit("stop")
            return
        self._stopped_by_person = True
        if exit_after:
            self.exit("stopped")
        else:
            self.notify("stop sent: the trainer checkpoints and exits", title="stop")
