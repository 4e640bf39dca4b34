"""The gpuwatch dashboard: a Textual app that follows one run through a RunLink.

A long-lived worker reads batches from the link and folds them into a RunState
(pure); repaints are throttled (about 4 Hz) and touch only the panels whose
part of the state changed, inside one ``batch_update``. The history areas (the
per-GPU sparklines, the plots screen) repaint at most once a second. Keys change *pending*
settings; nothing restarts until ``r`` sends ``relaunch``.

The app's return value says what happened to the run:
  "detach"   the dashboard closed, the run was left as it was;
  "stopped"  the person stopped the run and the supervisor acknowledged;
  "stop"     the person asked to stop but no ack came (connection lost): the
             caller should stop the run itself (e.g. ``gpuwatch stop ID``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.reactive import var
from textual.timer import Timer
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from gpuwatch.advisor import advise, find_straggler
from gpuwatch.app import keys
from gpuwatch.app.link import RunLink
from gpuwatch.app.screens.modals import (
    ConfirmStopScreen,
    KeysScreen,
    QuitChoice,
    QuitScreen,
    RunsScreen,
)
from gpuwatch.app.screens.plots import PlotsScreen
from gpuwatch.app.screens.settings import SettingsScreen
from gpuwatch.app.widgets.gpus import GpuPanel
from gpuwatch.app.widgets.panels import (
    TALL_ROWS,
    WIDE_COLUMNS,
    AdvicePanel,
    AttemptsPanel,
    CrashPanel,
    DevicesPanel,
    HeaderBar,
    HistoryPanel,
    MetricsPanel,
    PendingBar,
    WorkersPanel,
)
from gpuwatch.client import ClientError
from gpuwatch.runs import RunInfo, list_runs
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

# Areas that draw history: repainted at most once per history interval (1 s).
HISTORY_AREAS = frozenset({"gpu_history", "plots"})


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
        render_interval_s: float = 0.25,
        history_interval_s: float = 1.0,
    ) -> None:
        super().__init__()
        self.link = link
        self.home = home
        self.run_id = run_id
        self.link_for = link_for
        self.clock = clock
        self.render_interval_s = render_interval_s
        self.history_interval_s = history_interval_s
        self.state = RunState()
        self.renders = 0
        self._last_render = 0.0
        self._render_timer: Timer | None = None
        self._last_history_render = float("-inf")
        self._history_timer: Timer | None = None
        self._stopped_by_person = False

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
        yield PendingBar(
            idle_hint=self.settings_keys_hint(), pending_hint=self.pending_keys_hint(), id="pending"
        )
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#devices").border_title = "devices"
        self.query_one("#history").border_title = "history"
        self.query_one("#attempts").border_title = "attempts (measured after warm-up)"
        self.query_one("#crash").border_title = "trainer ended"
        self.set_interval(1.0, self._tick)
        self.refresh_view()
        self.follow_link()

    # ---- following the run ---------------------------------------------

    @work(exclusive=True, exit_on_error=False, group="link")
    async def follow_link(self) -> None:
        """Fold every batch from the link into the state; repaint at most ~4 Hz."""
        link = self.link
        async for batch in link.events():
            if link is not self.link:  # switched runs while waiting
                return
            self.state.apply_many(batch)
            self._schedule_render()
            # A replay arrives faster than we fold it: let input and repaints in.
            await asyncio.sleep(0)

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.group == "link":
            self.notify(f"lost the run's events: {event.worker.error}", severity="error")

    def _tick(self) -> None:
        if not self.state.terminal:
            self.state.changed.add("header")
            self._schedule_render()

    def _schedule_render(self) -> None:
        if self._render_timer is not None:
            return
        wait = self._last_render + self.render_interval_s - time.monotonic()
        if wait <= 0:
            self.refresh_view()
        else:
            self._render_timer = self.set_timer(wait, self._timed_render)

    def _timed_render(self) -> None:
        self._render_timer = None
        self.refresh_view()

    def _timed_history(self) -> None:
        self._history_timer = None
        self.refresh_view()

    def _hold_history(self, changes: set[str], now: float, flush: bool) -> None:
        """Take out of `changes` the history areas whose turn has not come (once a second):
        they stay changed in the state, and a timer repaints them when it comes."""
        if not isinstance(self.screen, PlotsScreen):
            changes.discard("plots")  # closed: nothing to draw
        due = changes & HISTORY_AREAS
        if not due:
            return
        wait = self._last_history_render + self.history_interval_s - now
        if wait > 0 and not flush:
            self.state.changed |= due
            changes -= due
            if self._history_timer is None:
                self._history_timer = self.set_timer(wait, self._timed_history)
            return
        self._last_history_render = now

    def on_resize(self) -> None:
        """The per-GPU panel picks its form from the terminal's size: repaint it now."""
        self.state.changed.add("gpu_history")
        self.call_after_refresh(self.refresh_view, flush=True)

    def refresh_view(self, *, flush: bool = False) -> None:
        """Repaint the panels whose part of the state changed (all of them the first time).

        flush: repaint the history areas too even if they did less than a second ago.
        """
        if not self.screen_stack:  # a timer that fires as the app closes: nothing to paint
            return
        now = time.monotonic()
        self._last_render = now
        changes = self.state.take_changes()
        self._hold_history(changes, now, flush)
        if isinstance(self.screen, PlotsScreen):
            # The dashboard is hidden: its areas wait for it to come back. (Textual repaints
            # a pushed screen wherever the screen below it changed, visible or not.)
            self.state.changed |= changes - {"plots"}
            if "plots" in changes:
                self.screen.show_state(self.state)
            return
        if not changes:
            return
        self.renders += 1
        state = self.state
        main = self.default_screen  # the dashboard, even while another screen is on top
        with self.batch_update():
            if changes & {"header", "link"}:
                self.query_one(HeaderBar).show_state(state, self.clock())
            if changes & {"metrics", "attempts"}:
                self.query_one(MetricsPanel).show_state(state)
            cluster = state.workers > 1
            main.set_class(cluster, "-cluster")
            straggler = find_straggler(state.worker_summaries()) if cluster else None
            if changes & {"metrics", "devices", "attempts", "workers"}:
                steps = state.recent_steps()
                current = state.current
                settings = current.settings if current and current.settings else state.settings
                self.query_one(AdvicePanel).show_advice(
                    advise(steps, settings, state.sample, state.replicas, straggler)
                )
            if cluster and changes & {"workers", "devices", "metrics", "status"}:
                self.query_one(WorkersPanel).show_state(state, straggler)
            gpus = bool((state.sample or {}).get("gpus"))
            main.set_class(gpus, "-gpus")
            if changes & {"devices", "metrics"} and not gpus:
                self.query_one(DevicesPanel).show_state(state)
            if "gpu_history" in changes and gpus:
                self.query_one(GpuPanel).show_state(state)
            if "history" in changes:
                self.query_one(HistoryPanel).show_state(state)
            if "attempts" in changes or "status" in changes:
                self.query_one(AttemptsPanel).show_state(state)
            if "status" in changes:
                self.query_one(CrashPanel).show_state(state)
                main.set_class(state.failed, "-crashed")
            if "pending" in changes:
                self._show_pending()

    def _show_pending(self) -> None:
        live = pending_applies_live(
            self.state.settings, self.pending, running=self.state.status == "running"
        )
        self.query_one(PendingBar).show_pending(
            describe_pending(self.state.settings, self.pending), live=live
        )
        self.refresh_bindings()

    def watch_pending(self) -> None:
        self._show_pending()

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
        """e: the settings screen; what it returns becomes the pending settings."""
        if not self.state.settings:
            self.notify("no settings yet: the run has not started", severity="warning")
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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("relaunch", "discard"):
            # None: shown greyed out in the footer while nothing is pending.
            return True if pending_overrides(self.state.settings, self.pending) else None
        return True

    # ---- commands -------------------------------------------------------

    def action_relaunch(self, live: bool = True) -> None:
        """r: live where the trainer can change them (the supervisor decides); R: live=False."""
        overrides = pending_overrides(self.state.settings, self.pending)
        if overrides:
            self.send_relaunch(overrides, live=live)

    @work(group="command", exit_on_error=False)
    async def send_relaunch(self, overrides: dict[str, Any], live: bool = True) -> None:
        description = describe_pending(self.state.settings, overrides)
        try:
            reply = await self.link.command(
                "relaunch", overrides=overrides, fresh=False, live=live
            )
        except (ClientError, TimeoutError) as exc:
            self.notify(f"relaunch failed: {exc}", severity="error")
            return
        if pending_overrides(self.state.settings, self.pending) == overrides:
            self.pending = {}
        if reply.get("live"):
            self.notify(f"applied live: {description}", title="live")
        else:
            self.notify(f"relaunching: {description}", title="relaunch")

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

    def action_quit_dashboard(self) -> None:
        if self.state.terminal or self._stopped_by_person:
            self.exit("stopped" if self._stopped_by_person else "detach")
            return

        def chosen(choice: QuitChoice | None) -> None:
            if choice == "detach":
                self.exit("detach")
            elif choice == "stop":
                self.send_stop(exit_after=True)

        self.push_screen(QuitScreen(), callback=chosen)

    def action_keys(self) -> None:
        self.push_screen(KeysScreen(self.key_rows()))

    def action_plots(self) -> None:
        if not isinstance(self.screen, PlotsScreen):
            # Back on the dashboard: what changed meanwhile is painted at once.
            self.push_screen(PlotsScreen(self.state), callback=self._back_from_plots)

    def _back_from_plots(self, _closed: None) -> None:
        self.refresh_view(flush=True)

    # ---- keys, in words made from the bindings ---------------------------

    def key_rows(self) -> list[tuple[str, str]]:
        """(key, what it does) for every binding: the keys screen."""
        return [
            (self.get_key_display(binding), binding.tooltip or binding.description)
            for binding in self.BINDINGS
            if isinstance(binding, Binding)
        ]

    def settings_keys_hint(self) -> str:
        """'p prefetch · a/A accumulation ×2/÷2 · ...': the keys that change a setting."""
        groups: list[list[Binding]] = []
        for binding in self.SETTING_BINDINGS:
            if groups and binding.group is not None and groups[-1][0].group is binding.group:
                groups[-1].append(binding)
            else:
                groups.append([binding])
        return " · ".join(
            "/".join(self.get_key_display(b) for b in group)
            + " "
            + keys.joined([b.description for b in group])
            for group in groups
        )

    def pending_keys_hint(self) -> str:
        """'press r to relaunch, c to discard': what to do with pending settings."""
        return "press " + ", ".join(
            f"{self.get_key_display(b)} to {b.description}" for b in self.PENDING_BINDINGS
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
        self.follow_link()  # exclusive: cancels the old follower
        self.run_worker(old.close(), group="close", exit_on_error=False)
        self.refresh_view()
        self.notify(f"now following run {run_id}", title="switched")

    async def on_unmount(self) -> None:
        await self.link.close()
