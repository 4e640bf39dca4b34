"""The gpuwatch dashboard: a Textual app that follows one run through a RunLink.

A long-lived worker reads batches from the link and folds them into a RunState (pure);
the ``Repainter`` (``painters.py``) repaints only the parts whose areas changed, each at
its rate (docs/internals.md, "Dashboard"). Keys change *pending* settings; nothing
restarts until ``r`` sends ``relaunch`` (on an ended run, with nothing pending: a resume
through RecordLink when no supervisor is left). A live change shows as in flight
(``Applying``) until the record settles it. The app's return value says what happened:
  "detach"   the dashboard closed, the run was left as it was;
  "ended"    the dashboard closed on a run that has ended (nothing of it runs on);
  "stopped"  the person stopped the run and the supervisor acknowledged;
  "stop"     no ack came (connection lost): the caller should stop the run itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from textual import events, on, work
from textual.actions import parse as parse_textual_action
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import var
from textual.screen import ModalScreen
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from gpuwatch.app import keys
from gpuwatch.app.painters import HISTORY_INTERVAL_S, RENDER_INTERVAL_S, Repainter
from gpuwatch.app.screens.modals import (
    ConfirmStopScreen,
    KeysScreen,
    QuitChoice,
    QuitScreen,
    RunsScreen,
)
from gpuwatch.app.screens.plots import PlotsScreen
from gpuwatch.app.screens.settings import SettingsScreen
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.common import TALL_ROWS, WIDE_COLUMNS
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.gpus import GpuPanel
from gpuwatch.app.widgets.header import HeaderBar
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.app.widgets.scaling import ScalingPanel
from gpuwatch.app.widgets.workers import WorkersPanel
from gpuwatch.follow.client import ClientError, ConnectionLost
from gpuwatch.follow.link import RECORD, RunLink
from gpuwatch.runs.folders import RunInfo, list_runs
from gpuwatch.runstate import (
    RunState,
    SettingRefused,
    describe_pending,
    pending_applies_live,
    pending_overrides,
    step_accumulation,
    step_batch,
    toggle_prefetch,
)

# The keys a person's own command (gpuwatch run) does not take: its batch, its accumulation
# and the settings screen's (its code's own); greyed out, and refused if pressed anyway.
COMMAND_REFUSED_ACTIONS = frozenset({"accumulation", "batch", "edit_settings"})


def parse_action(action: str) -> tuple[str, tuple[object, ...]]:
    """A binding's action string ("batch(True)") as its name and parameters."""
    _namespace, name, parameters = parse_textual_action(action)
    return name, parameters
COMMAND_SETTINGS_REFUSAL = keys.COMMAND_SETTINGS_REFUSAL


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


class GpuwatchApp(App[str]):
    """Live dashboard of one training run (and a switcher between the live runs)."""

    CSS_PATH = "gpuwatch.tcss"
    TITLE = "gpuwatch"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (WIDE_COLUMNS, "-wide")]  # noqa: RUF012 (Textual's API)
    VERTICAL_BREAKPOINTS = [(0, "-short"), (TALL_ROWS, "-tall")]  # noqa: RUF012

    # The keys that change a pending setting; the pending bar's hint lists them.
    SETTING_BINDINGS: ClassVar[list[Binding]] = keys.SETTING_BINDINGS
    # What to do with the pending settings; the pending bar says "press r to relaunch, ...".
    PENDING_BINDINGS: ClassVar[list[Binding]] = keys.PENDING_BINDINGS
    # Every key, in the footer's order; the keys screen (?) lists them with their tooltips.
    BINDINGS: ClassVar[list[BindingType]] = keys.BINDINGS

    pending: var[dict[str, Any]] = var(dict, init=False)

    def __init__(
        self,
        link: RunLink,
        *,
        home: Path | None = None,
        run_id: str | None = None,
        link_for: Callable[[RunInfo], RunLink] | None = None,
        clock: Callable[[], float] = time.time,
        render_interval_s: float = RENDER_INTERVAL_S,
        history_interval_s: float = HISTORY_INTERVAL_S,
        cpu_budget_pct: float | None = None,
    ) -> None:
        super().__init__()
        self.link = link
        self.home = home
        self.run_id = run_id
        self.link_for = link_for
        self.clock = clock
        self.state = RunState()
        self.repainter = Repainter(self, render_interval_s, history_interval_s, cpu_budget_pct)
        self._stopped_by_person = False
        self._relaunched_attempt = 0  # the attempt the latest r started (it may not show yet)
        self.applying: Applying | None = None  # a live change sent with r, not settled yet

    # ---- layout ---------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        with Horizontal(id="top"):
            yield MetricsPanel(id="metrics")
            yield AdvicePanel(id="advice")
        yield DevicesPanel(id="devices")
        yield GpuPanel(id="gpus")
        yield WorkersPanel(id="workers")
        yield HistoryPanel(id="history")
        yield CrashPanel(id="crash")
        yield AttemptsPanel(id="attempts")
        yield ScalingPanel(id="scaling")
        with Vertical(id="bottom"):
            yield PendingBar(
                idle_hint=self.settings_keys_hint(), pending_hint=self.pending_keys_hint,
                id="pending",
            )
            yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#devices").border_title = "devices"
        self.query_one("#history").border_title = "history"
        self.query_one("#attempts").border_title = "attempts (measured after warm-up)"
        self.query_one("#crash").border_title = "trainer ended"
        self.set_interval(1.0, self._tick)
        self.refresh_view(flush=True)
        self.follow_link()

    # ---- following the run ---------------------------------------------

    @work(exclusive=True, exit_on_error=False, group="link")
    async def follow_link(self) -> None:
        """Fold every batch from the link into the state; repaints follow at their own rates."""
        link = self.link
        async for batch in link.events():
            if link is not self.link:  # switched runs while waiting
                return
            self.state.apply_many(batch)
            self.repainter.schedule_paint()
            # A replay arrives faster than we fold it: let input and repaints in.
            await asyncio.sleep(0)

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group == "link":
            self.notify(f"lost the run's events: {event.worker.error}", severity="error")

    def _tick(self) -> None:
        if not self.state.terminal:
            self.repainter.tick()
        self.check_applying()

    def refresh_view(self, *, flush: bool = False) -> None:
        """Repaint the parts that are due now; flush: every part whose state changed, whatever
        its rate (the first paint, back from the plots, tests)."""
        if flush:
            self.repainter.paint_now()
        else:
            self.repainter.schedule_paint()

    def on_resize(self) -> None:
        """The per-GPU panel picks its form from the terminal's size, the history its
        sparklines' height: repaint them now (a panel that keeps its own size, as the
        history does when only the terminal's height changes, gets no resize of its own)."""
        self.state.changed.update(("gpu_history", "history"))
        self.repainter.restart_pace()
        self.call_after_refresh(self.refresh_view, flush=True)

    @property
    def renders(self) -> int:
        """Repaints so far that painted something."""
        return self.repainter.passes

    def show_pending(self) -> None:
        """The pending bar, and the keys that act on it."""
        bar = self.query_one(PendingBar)
        bar.idle_hint = self.settings_keys_hint()  # a command's: only the keys it takes
        live = pending_applies_live(
            self.state.settings, self.pending, running=self.state.status == "running"
        )
        # Shown from its record: the bar says the run has ended and what r does.
        note = self.state.link_message if self.state.link_state == RECORD else None
        if self.applying is not None and self.applying.settled(self.state):
            self.applying = None  # the record says how it went: its attempt, or a refusal
        applying = self.applying.line() if self.applying is not None else None
        bar.show_pending(
            describe_pending(self.state.settings, self.pending), live=live, note=note,
            applying=applying,
        )
        self.refresh_bindings()

    def watch_pending(self) -> None:
        self.show_pending()

    # ---- pending settings --------------------------------------------

    def _change(self, make: Callable[[], dict[str, Any]]) -> None:
        try:
            self.pending = make()
        except SettingRefused as refusal:
            self.notify(str(refusal), title="not changed", severity="warning")

    def action_toggle_prefetch(self) -> None:
        self._change(lambda: toggle_prefetch(self.state.settings, self.pending))

    def action_accumulation(self, up: bool) -> None:
        replicas = self.state.replicas
        self._change(
            lambda: step_accumulation(self.state.settings, self.pending, up=up, replicas=replicas)
        )

    def action_batch(self, up: bool) -> None:
        replicas = self.state.replicas
        self._change(
            lambda: step_batch(self.state.settings, self.pending, up=up, replicas=replicas)
        )

    def action_edit_settings(self) -> None:
        """e: the settings screen; what it returns becomes the pending settings (not for a
        person's own command: its settings are its own code's)."""
        if not self.state.settings:
            self.notify("no settings yet: the run has not started", severity="warning")
            return
        if self.state.command is not None:
            self.notify(COMMAND_SETTINGS_REFUSAL, title="not changed", severity="warning")
            return

        def edited(pending: dict[str, Any] | None) -> None:
            if pending is not None:
                self.pending = pending

        running = self.state.status == "running"
        self.push_screen(
            SettingsScreen(
                self.state.settings, self.pending, replicas=self.state.replicas, running=running
            ),
            callback=edited,
        )

    def action_discard(self) -> None:
        self.pending = {}

    def on_key(self, event: events.Key) -> None:
        """A key a person's own command does not take is greyed out, so its binding does
        not run and the key comes here: it says why (as the action itself would), not
        nothing."""
        if self.state.command is None or isinstance(self.screen, ModalScreen):
            return
        for binding in self.BINDINGS:
            if not isinstance(binding, Binding):
                continue
            name, parameters = parse_action(binding.action)
            if name in COMMAND_REFUSED_ACTIONS and event.key in binding.key.split(","):
                event.stop()
                getattr(self, f"action_{name}")(*parameters)
                return

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in COMMAND_REFUSED_ACTIONS and self.state.command is not None:
            return None  # a person's own command's: greyed out (the keys screen says why)
        if action == "relaunch" and parameters[:1] != (False,) and self.applying is not None:
            return None  # greyed out while a live change is in flight (R still relaunches)
        if action in ("relaunch", "discard"):
            # None: shown greyed out in the footer while nothing is pending; a run that
            # has ended goes on with r, its settings unchanged.
            if pending_overrides(self.state.settings, self.pending):
                return True
            if action == "relaunch" and (self.state.terminal or parameters[:1] == (False,)):
                return True  # an ended run goes on; R always relaunches
            return None
        return True

    # ---- commands: relaunch (r, R) and stop (s, q) ------------------------

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

    @property
    def run_ended(self) -> bool:
        """The run has ended as far as this dashboard knows: its status is terminal, and no
        attempt that r started is still to come."""
        return self.state.terminal and self.state.attempt >= self._relaunched_attempt

    def action_quit_dashboard(self) -> None:
        if self._stopped_by_person:
            self.exit("stopped")
            return
        if self.run_ended:
            self.exit("ended")
            return

        def chosen(choice: QuitChoice | None) -> None:
            if choice == "detach":
                self.exit("detach")
            elif choice == "stop":
                self.send_stop(exit_after=True)

        self.push_screen(QuitScreen(own_command=self.state.command is not None),
                         callback=chosen)

    def action_keys(self) -> None:
        self.push_screen(KeysScreen(self.key_rows()))

    def action_plots(self) -> None:
        if not isinstance(self.screen, PlotsScreen):
            # Back on the dashboard: what changed meanwhile is painted at once.
            self.push_screen(PlotsScreen(self.state), callback=self._back_from_plots)

    def _back_from_plots(self, _closed: None) -> None:
        self.repainter.restart_pace()  # every part at once: not what a repaint costs
        self.refresh_view(flush=True)

    # ---- keys, in words made from the bindings ---------------------------

    def key_rows(self) -> list[tuple[str, str]]:
        """(key, what it does) for every binding: the keys screen; for a person's own
        command, why the keys it does not take do nothing."""
        bindings = self.BINDINGS
        if self.state.command is not None:
            bindings = keys.for_command(bindings)
        return keys.key_rows(bindings, self.get_key_display)

    def settings_keys_hint(self) -> str:
        bindings = self.SETTING_BINDINGS
        if self.state.command is not None:  # only the keys a command takes
            bindings = [b for b in bindings if b.action.partition("(")[0]
                        not in COMMAND_REFUSED_ACTIONS]
        return keys.settings_hint(bindings, self.get_key_display)

    def pending_keys_hint(self, *, live: bool = False, short: bool = False) -> str:
        return keys.pending_hint(
            self.PENDING_BINDINGS, self.get_key_display, live=live, short=short
        )

    # ---- switching runs ---------------------------------------------

    @work(group="runs", exclusive=True, exit_on_error=False)
    async def action_runs(self) -> None:
        runs = await asyncio.to_thread(list_runs, self.home)
        live = [info for info in runs if info.live]
        current = self.state.run_id or self.run_id
        choice = await self.push_screen_wait(RunsScreen(live, current))
        if choice is None or choice.run_id == current:
            return
        if self.link_for is None:
            self.notify("this dashboard cannot switch runs", severity="warning")
            return
        self.switch_to(self.link_for(choice), choice.run_id)

    def switch_to(self, link: RunLink, run_id: str) -> None:
        """Follow another run: a new link, a fresh state, nothing pending."""
        old = self.link
        self.link = link
        self.run_id = run_id
        self.state = RunState()
        self.pending = {}
        self._relaunched_attempt = 0
        self.applying = None  # a change in flight is the other run's
        self.follow_link()  # exclusive: cancels the old follower
        self.run_worker(old.close(), group="close", exit_on_error=False)
        self.refresh_view(flush=True)
        self.notify(f"now following run {run_id}", title="switched")

    async def on_unmount(self) -> None:
        await self.link.close()
