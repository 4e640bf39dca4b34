"""Pilot tests of the dashboard at 80x24, fed recorded events through a ReplayLink."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import ClassVar

import pytest
from textual.binding import Binding
from textual.widgets import OptionList

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.screens.modals import ConfirmStopScreen, KeysScreen, QuitScreen, RunsScreen
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.crash import CrashPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.gpus import GpuPanel
from gpuwatch.app.widgets.header import HeaderBar
from gpuwatch.app.widgets.history import HistoryPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.follow.client import ConnectionLost
from gpuwatch.follow.link import ReplayLink, link_event
from gpuwatch.runs import folders
from gpuwatch.runs.folders import RunInfo

from .conftest import (
    SIZE,
    Waiter,
    frozen_clock_for,
    load_events,
    make_app,
    settle,
    wait_commands,
)


def text(app: GpuwatchApp, widget_type: type) -> str:
    return app.query_one(widget_type).plain


async def test_input_bound_run_shows_wait_and_verdict():
    # Fixture ground truth: after warm-up every step waits 38.0 % of its time.
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        metrics = text(app, MetricsPanel)
        assert "input wait 38.0%" in metrics
        assert "examples/s" in metrics and "ms per step" in metrics
        advice = text(app, AdvicePanel)
        assert advice.startswith("highly input-bound: 38.0% of step time waiting for input")
        assert "turn prefetch on (p)" in advice
        assert "running" in text(app, HeaderBar)
        assert "0612-kq7m" in text(app, HeaderBar)


async def test_no_gpu_says_so_with_replicas_and_host():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        devices = text(app, DevicesPanel)
        assert devices.splitlines()[0] == (
            "No NVIDIA GPU found: training uses 2 logical CPU replicas (CPU:0, CPU:1)"
        )
        assert "host CPU 90%" in devices
        assert "memory 5.0/15.6 GiB" in devices
        # 2,694,440 bytes per 200 ms step = 13.47 MB/s
        assert "gradient sync 13.5 MB/s (estimate)" in devices
        assert "NVML: NVML Shared Library Not Found" in devices


async def test_one_replica_is_said_in_the_singular():
    # The same run on one logical CPU device: "1 logical CPU replica", never "replicas".
    events = load_events("cpu_one_attempt.jsonl")
    for event in events:
        if event["type"] == "hello":
            event.update(replicas=1, devices=[event["devices"][0]], per_replica_batch=256)
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert text(app, DevicesPanel).splitlines()[0] == (
            "No NVIDIA GPU found: training uses 1 logical CPU replica (CPU:0)")


async def test_gpu_lines_show_rates_with_units_and_na():
    app, link = make_app("gpu_running.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert not app.query_one(DevicesPanel).display  # GPU readings: the GPU panel instead
        panel = app.query_one(GpuPanel)
        gpu0, gpu1 = panel.texts()
        assert gpu0.split()[0] == "0" and gpu0.split()[-6:] == [
            "92%", "19.8/40.0", "GiB", "PCIe", "1.2G/3.4G", "NVLink", "18.7G/18.2G"
        ][-6:]
        assert " 92%  19.8/40.0 GiB" in gpu0
        assert gpu1.endswith("NVLink         n/a")  # GPU 1 has no NVLink readings
        # 2,694,440 bytes per 48 ms step = 56.1 MB/s, beside the link rates.
        assert "gradient sync est. 56.1 MB/s/replica" in str(panel.border_title)
        assert "tx/rx B/s" in str(panel.border_title)
        # Not input-bound (1.2 of 48 ms = 2.5 %): the fixture's steps spend 20 % in the
        # all-reduce (its known parts), at 281 MB/s bus over A100s' 12 NVLink 3 links
        # (300 GB/s each way): 0.094 % of the link.
        assert text(app, AdvicePanel).startswith(
            "highly communication-bound: all-reduce 20% of the step, 281 MB/s bus = 0.094% "
            "of NVLink")


async def test_two_attempts_side_by_side():
    app, link = make_app("cpu_two_attempts.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        rows = text(app, AttemptsPanel).splitlines()
        # The fixture's steps are timed apart: compute 40 % and all-reduce 15 % of attempt
        # 1's step, 60 % and 25 % of attempt 2's.
        assert rows[1].split() == [
            "1", "off", "1", "256", "45", "1,283", "38.0%", "40/15%", "sigterm"
        ]
        assert rows[2].split() == [
            "2", "on", "1", "256", "45", "1,973", "4.0%", "60/25%", "running"
        ]
        assert "attempt 2" in text(app, HeaderBar)
        assert "input wait 4.0%" in text(app, MetricsPanel)


async def test_prefetch_key_shows_pending_and_r_relaunches_with_override():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.check_action("relaunch", ()) is None  # greyed out: nothing pending
        await pilot.press("r")
        assert link.commands == []
        await pilot.press("p")
        assert text(app, PendingBar).startswith(
            "pending (live): prefetch off→on — press r to apply live"
        )
        assert app.check_action("relaunch", ()) is True
        await pilot.press("a")
        assert "prefetch off→on, accumulation 1→2" in text(app, PendingBar)
        await pilot.press("a", "A")
        assert text(app, PendingBar).startswith(
            "pending (live): prefetch off→on, accumulation 1→2 "
        )
        await pilot.press("A")  # back to 1: no longer pending
        assert "accumulation" not in text(app, PendingBar)
        await pilot.press("r")
        await wait_commands(app)
        assert link.commands == [
            ("relaunch", {"overrides": {"data.prefetch": True}, "fresh": False, "live": True})
        ]
        assert app.pending == {}
        assert text(app, PendingBar).startswith("no pending changes")


async def test_refused_accumulation_says_why(notifications):
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press(*["a"] * 7)  # 1 -> 128: 256 / (2 x 128) = 1 example per replica
        assert app.pending == {"train.accumulation_steps": 128}
        await pilot.press("a")
        assert app.pending == {"train.accumulation_steps": 128}
        assert notifications[-1] == (
            "train.global_batch_size 256 is less than replicas x accumulation_steps = "
            "2 x 256 = 512: a replica would get no example"
        )
        await pilot.press("c")
        assert app.pending == {}


async def test_batch_key_is_refused_at_the_datas_limit_before_relaunch(notifications):
    # The recorded run has data.examples 16384 and global batch 256, as the demo.
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press(*["b"] * 6)
        assert app.pending == {"train.global_batch_size": 16384}
        await pilot.press("b")
        assert app.pending == {"train.global_batch_size": 16384}, "the 7th press is refused"
        assert notifications[-1] == (
            "train.global_batch_size: 32768 is more than data.examples 16384: one update "
            "would need more examples than the data has"
        )
        await pilot.press("r")
        await wait_commands(app)
        assert link.commands == [
            ("relaunch",
             {"overrides": {"train.global_batch_size": 16384}, "fresh": False, "live": True})
        ]


async def test_batch_keys_double_and_halve():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("b")
        assert app.pending == {"train.global_batch_size": 512}
        await pilot.press("B", "B")
        assert app.pending == {"train.global_batch_size": 128}
        assert "batch 256→128" in text(app, PendingBar)


async def test_quit_asks_and_detach_is_the_default():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("enter")  # the focused default button: Detach
    assert app.return_value == "detach"
    assert link.commands == []


async def test_quit_with_stop_sends_stop_and_returns_stopped():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("q", "s")
        await wait_commands(app)
    assert link.commands == [("stop", {})]
    assert app.return_value == "stopped"


async def test_quit_with_stop_but_no_connection_returns_stop():
    events = load_events("cpu_one_attempt.jsonl")
    link = ReplayLink(events, replies={"stop": ConnectionLost("not connected")})
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("q", "s")
        await wait_commands(app)
    assert app.return_value == "stop"


async def test_stop_key_confirms_before_sending():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmStopScreen)
        await pilot.press("n")
        assert link.commands == []
        await pilot.press("s", "y")
        await wait_commands(app)
        assert link.commands == [("stop", {})]
        # The dashboard stays open; q afterwards needs no question.
        await pilot.press("q")
    assert app.return_value == "stopped"


async def test_crashed_run_shows_exit_code_and_log_tail():
    app, link = make_app("cpu_crashed.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        crash = app.query_one(CrashPanel)
        assert crash.display
        lines = crash.plain.splitlines()
        assert lines[0] == "crashed: trainer exited with code 1 at step 15"
        assert "OOM when allocating tensor with shape[1024,512]" in lines[1]
        assert lines[-1].strip() == "OOM when allocating tensor with shape[1024,512] type float"
        assert crash.region.height > 0  # on screen at 80x24
        assert " crashed " in text(app, HeaderBar)


async def test_reconnect_keeps_state_and_counts_no_step_twice():
    events = load_events("cpu_one_attempt.jsonl")
    link = ReplayLink(events[:30])
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        steps_before = app.state.attempts[1].steps_seen
        link.push([link_event("lost", "the supervisor closed the connection")])
        link.push([link_event("reconnecting", "retry 1 in 0.5 s")])
        await settle(app, link, pilot)
        assert "link reconnecting" in text(app, HeaderBar)
        assert app.state.attempts[1].steps_seen == steps_before  # last state kept
        # The link resubscribes from last seq + 1; even an overlap must not double-count.
        link.push([link_event("connected", "subscribed from seq 30"), *events[25:]])
        await settle(app, link, pilot)
        assert "link" not in text(app, HeaderBar).split("elapsed")[1]
        assert app.state.attempts[1].steps_seen == 45
        assert app.state.duplicates_skipped == 5
        assert "input wait 38.0%" in text(app, MetricsPanel)


@pytest.mark.alone
async def test_long_replay_folds_in_batches_not_per_event():
    events = load_events("cpu_one_attempt.jsonl")
    head = [e for e in events if e["type"] != "step" and e["type"] != "sample"]
    template = next(e for e in events if e["type"] == "step" and e["step"] == 10)
    steps = []
    for i in range(30_000):
        step = dict(template, seq=len(head) + i, step=i + 1, micro_step=i + 1)
        step["input_wait_ms"] = 76.0 if i >= 5 else 500.0
        step["step_time_ms"] = 200.0
        steps.append(step)
    link = ReplayLink(head + steps, batch_size=2000)
    app = GpuwatchApp(link, clock=frozen_clock_for(head + steps))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.state.attempts[1].steps_seen == 30_000
        assert app.state.attempts[1].input_wait_pct == 38.0
        assert "step 30,000" in text(app, MetricsPanel)
        # 16 batches: the throttle repaints a handful of times, never per event.
        assert app.renders <= 20


async def test_throttled_repaint_happens_without_an_explicit_refresh():
    app, link = make_app("cpu_one_attempt.jsonl")
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook):
        await link.wait_idle()
        await waiter.until(
            lambda: "input wait 38.0%" in text(app, MetricsPanel), "the throttled repaint"
        )


async def test_the_history_sparklines_grow_when_only_the_terminal_grows_taller():
    # The history panel keeps its width and height (3 rows of 80) when the terminal goes
    # from 80x24 to 80x45, so it gets no resize of its own: the app's resize repaints it.
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        history = app.query_one(HistoryPanel)
        assert len(history.plain.splitlines()) == 2  # a line per sparkline
        await pilot.resize_terminal(SIZE[0], 45)
        await pilot.pause()
        await pilot.pause()
        lines = history.plain.splitlines()
        assert len(lines) == 2 * HistoryPanel.TALL_LINES
        assert lines[0].startswith("ex/s")
        assert lines[HistoryPanel.TALL_LINES].startswith("wait %")
        assert history.region.height >= 2 * HistoryPanel.TALL_LINES


async def test_keys_screen_lists_every_key():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, KeysScreen)
        listing = str(app.screen.query_one("#keys-text").render())
        bindings = [b for b in GpuwatchApp.BINDINGS if isinstance(b, Binding)]
        assert len(bindings) == len(GpuwatchApp.BINDINGS)
        for binding in bindings:
            assert binding.id and binding.tooltip, binding
            assert f"{app.get_key_display(binding)}  {binding.tooltip}\n" in listing
        await pilot.press("escape")
        assert not isinstance(app.screen, KeysScreen)


async def test_the_keys_screen_says_live_where_the_pending_bar_does():
    # p pends a live change ("pending (live)"); the keys screen (?) says the same of p, a,
    # A, b and B, never "for the next relaunch".
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p")
        assert text(app, PendingBar).startswith("pending (live): prefetch off→on")
        await pilot.press("question_mark")
        listing = str(app.screen.query_one("#keys-text").render())
        for key in ("p", "a", "A", "b", "B"):
            (row,) = [line for line in listing.splitlines() if line.startswith(f" {key}  ")]
            assert "pending until r (live while the trainer runs" in row, row
        assert "next relaunch" not in listing


def test_pending_bar_hints_are_made_from_the_bindings():
    class Rebound(GpuwatchApp):
        SETTING_BINDINGS: ClassVar[list[Binding]] = [
            dataclasses.replace(b, key=b.key.swapcase()) for b in GpuwatchApp.SETTING_BINDINGS
        ]
        PENDING_BINDINGS: ClassVar[list[Binding]] = [
            dataclasses.replace(b, key=b.key.upper()) for b in GpuwatchApp.PENDING_BINDINGS
        ]

    app = Rebound(ReplayLink([]))
    assert app.settings_keys_hint() == "P prefetch · A/a accumulation ×2/÷2 · B/b batch ×2/÷2"
    assert app.pending_keys_hint() == "press R to relaunch, C to discard"


async def test_run_switcher_lists_live_runs_and_switches(tmp_path, monkeypatch):
    # folders.py checks that a live supervisor's cmdline names the run; these runs are
    # "supervised" by the test process itself.
    monkeypatch.setattr(folders, "supervisor_alive", lambda pid, run_dir: pid == os.getpid())
    home = tmp_path / "home"
    other = load_events("cpu_crashed.jsonl")
    other[0]["run_id"] = "0613-zzzz"
    recorded = (("0612-kq7m", load_events("cpu_one_attempt.jsonl")), ("0613-zzzz", other))
    for run_id, events in recorded:
        run_dir = home / "runs" / run_id
        run_dir.mkdir(parents=True)
        live = [e for e in events if e["type"] != "status" or e["status"] == "running"]
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in live))
        (run_dir / "supervisor.json").write_text(json.dumps({"pid": os.getpid()}))
    made: list[str] = []

    def link_for(info: RunInfo) -> ReplayLink:
        made.append(info.run_id)
        return ReplayLink(other)

    app, link = make_app("cpu_one_attempt.jsonl", home=home, run_id="0612-kq7m", link_for=link_for)
    waiter = Waiter()
    async with app.run_test(size=SIZE, message_hook=waiter.hook) as pilot:
        await settle(app, link, pilot)
        await pilot.press("l")
        await waiter.until(lambda: isinstance(app.screen, RunsScreen), "the runs screen")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        assert sorted(r.run_id for r in screen.runs) == ["0612-kq7m", "0613-zzzz"]
        # Each run's examples/s over the window the headline's is, and saying it: 40 and
        # 10 steps after warm-up, of 200 +/- 10 and 130 +/- 6 ms (make_fixtures.py).
        listed = screen.query_one(OptionList)
        labels = {r.run_id: str(listed.get_option_at_index(i).prompt)
                  for i, r in enumerate(screen.runs)}
        assert labels["0612-kq7m"].endswith("  1,283 ex/s (last 20 steps)")
        assert labels["0613-zzzz"].endswith("  1,973 ex/s (last 10 steps)")
        target = [r.run_id for r in screen.runs].index("0613-zzzz")
        screen.query_one(OptionList).highlighted = target
        (choosing,) = [w for w in app.workers if w.group == "runs"]  # awaits the screen
        await pilot.press("enter")
        await app.workers.wait_for_complete([choosing])
        assert made == ["0613-zzzz"]
        new_link = app.link
        assert isinstance(new_link, ReplayLink)
        await settle(app, new_link, pilot)
        assert "0613-zzzz" in text(app, HeaderBar)
        assert app.state.status == "crashed"


def _live_attempt_events() -> list[dict]:
    """cpu_one_attempt.jsonl, then prefetch turned on live: attempt 2 in the same trainer."""
    events = load_events("cpu_one_attempt.jsonl")
    seq, t = events[-1]["seq"], events[-1]["t"]
    attempt = next(e for e in events if e["type"] == "attempt")
    settings = json.loads(json.dumps(attempt["settings"]))
    settings["data"]["prefetch"] = True
    more: list[dict] = [
        {"v": 1, "type": "reconfigured", "attempt": 1, "id": 2, "ok": True, "step": 45,
         "changed": ["data.prefetch"], "seconds": 0.2, "message": ""},
        {"v": 1, "type": "attempt", "attempt": 2, "settings": settings, "fresh": False,
         "reason": "live", "config_path": "/r/attempt-2.yaml"},
    ]
    for number in range(46, 56):
        more.append({"v": 1, "type": "step", "attempt": 2, "step": number,
                     "micro_step": number, "epoch": 0, "loss": 1.2, "lr": 0.001,
                     "examples": 256, "step_time_ms": 100.0, "input_wait_ms": 2.0,
                     "grad_sync_bytes": 2694440, "dropped": 0})
    for offset, event in enumerate(more, start=1):
        event["seq"], event["t"] = seq + offset, t + offset * 0.1
    return events + more


async def test_a_live_change_is_a_new_row_and_the_row_before_says_live():
    events = _live_attempt_events()
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        rows = text(app, AttemptsPanel).splitlines()
        assert rows[1].split()[:2] == ["1", "off"] and rows[1].split()[-1] == "live"
        assert rows[2].split()[:2] == ["2", "on"] and rows[2].split()[-1] == "running"
        assert rows[2].split()[-2] == "2.0%", "attempt 2's input wait is its own"
        assert app.state.attempts[2].hello is app.state.attempts[1].hello


async def test_pending_bar_says_relaunch_when_no_trainer_runs_and_R_is_a_full_relaunch():
    app, link = make_app("cpu_crashed.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p")
        assert text(app, PendingBar).startswith("pending (relaunch): prefetch")
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p")
        assert text(app, PendingBar).startswith("pending (live): prefetch off→on")
        await pilot.press("R")
        await wait_commands(app)
        assert link.commands == [
            ("relaunch", {"overrides": {"data.prefetch": True}, "fresh": False, "live": False})
        ]


async def test_after_a_crash_r_relaunches_as_it_is_and_R_always_relaunches():
    """The README: `r` relaunches after a crash, `R` always relaunches; with nothing
    pending, both go on as the run is (a live supervisor's relaunch)."""
    app, link = make_app("cpu_crashed.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.state.status == "crashed" and not app.pending
        await pilot.press("r")
        await wait_commands(app)
        assert link.commands[-1] == ("relaunch", {"overrides": {}, "fresh": False, "live": True})
        await pilot.press("R")
        await wait_commands(app)
        assert link.commands[-1] == ("relaunch", {"overrides": {}, "fresh": False, "live": False})


async def test_R_relaunches_a_live_run_with_nothing_pending_and_r_does_not():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.state.status == "running"
        await pilot.press("r")  # nothing pending: nothing to apply
        await pilot.pause()
        assert link.commands == []
        await pilot.press("R")
        await wait_commands(app)
        assert link.commands == [("relaunch", {"overrides": {}, "fresh": False, "live": False})]


async def test_the_keys_list_scrolls_to_its_last_key_and_always_says_how_to_close():
    """At 80x24 there are more keys than the dialog holds: the rows scroll, the way out
    stays on screen (it used to be cut off with the last keys)."""
    from textual.containers import VerticalScroll

    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("question_mark")
        screen = app.screen
        assert isinstance(screen, KeysScreen)
        await pilot.pause()
        close = screen.query_one("#keys-close")
        _width, height = SIZE
        assert close.region.height == 1 and close.region.bottom <= height
        assert "Esc or ? closes this list" in str(close.render())
        scroll = screen.query_one("#keys-scroll", VerticalScroll)
        assert scroll.max_scroll_y > 0, "more rows than the box: it must scroll"
        # Where the list is, in words (no scrollbar's block glyphs in the box).
        hidden = round(scroll.max_scroll_y)
        assert str(close.render()).endswith(f"↓ {hidden} lines below (↑↓ PgUp PgDn)")
        await pilot.press("end")
        await pilot.pause()
        assert scroll.scroll_y == scroll.max_scroll_y
        assert str(close.render()).endswith(f"↑ {hidden} lines above (↑↓ PgUp PgDn)")
        rows = str(screen.query_one("#keys-text").render()).rstrip("\n").splitlines()
        last_binding = GpuwatchApp.BINDINGS[-1]
        assert isinstance(last_binding, Binding)
        assert rows[-1].strip().startswith(app.get_key_display(last_binding))
        await pilot.press("question_mark")
        assert not isinstance(app.screen, KeysScreen)


async def test_the_keys_box_over_the_history_shows_nothing_of_what_is_under_it():
    # The history's sparklines run under the box at 80x24: inside its border only its own
    # text shows (a scrollbar's thumb, drawn with ▁▂▃…, read as bits of a sparkline).
    app, link = make_app("cpu_two_attempts.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        under = app.query_one("#history").plain
        assert any(glyph in under for glyph in "▁▂▃▄▅▆▇")
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#keys-dialog")
        inside = box.content_region
        strips = app.screen._compositor.render_strips()
        for y in range(inside.y, inside.bottom):
            line = "".join(segment.text for segment in strips[y])
            assert not any(glyph in line[inside.x:inside.right] for glyph in "▁▂▃▅▆▇"), line


def _two_attempts_then_a_crash() -> list[dict]:
    """The two-attempt recording, its second attempt then crashing (the crash's status)."""
    events = load_events("cpu_two_attempts.jsonl")
    (crashed,) = [e for e in load_events("cpu_crashed.jsonl")
                  if e["type"] == "status" and e["status"] == "crashed"]
    last = events[-1]
    attempt = max(e.get("attempt") or 0 for e in events)
    return [*events, {**crashed, "seq": last["seq"] + 1, "t": last["t"] + 1, "attempt": attempt}]


async def test_at_80x24_a_crash_leaves_the_latest_attempts_and_the_pending_bar_in_view():
    events = _two_attempts_then_a_crash()
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert app.query_one(CrashPanel).display
        await pilot.press("p")
        await settle(app, link, pilot)
        await pilot.pause()
        _width, height = SIZE
        attempts = app.query_one(AttemptsPanel)
        pending = app.query_one(PendingBar)
        assert pending.region.height == 1 and pending.region.bottom <= height - 1  # footer
        assert "pending (relaunch): prefetch" in pending.plain
        shown = attempts.plain.splitlines()[: attempts.content_size.height]
        assert [row.split()[0] for row in shown[1:]] == ["1", "2"]
        assert shown[2].split()[-1] == "crashed"
        assert attempts.region.bottom <= pending.region.y


async def test_no_gpu_panel_drops_the_estimate_where_the_all_reduce_is_measured():
    # cpu_two_attempts' steps carry their parts: the metrics panel shows the all-reduce's
    # measured bus bandwidth, so the devices panel's bytes-over-step estimate goes.
    app, link = make_app("cpu_two_attempts.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        devices = text(app, DevicesPanel)
        assert "gradient sync" not in devices and "(estimate)" not in devices
        assert "NVML: " in devices
        assert re.search(r"all-reduce [\d.]+ \w?B/s bus", text(app, MetricsPanel))
