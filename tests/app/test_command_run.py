"""The dashboard of a person's own command (gpuwatch run) at 80x24, fed its recorded events:
what it says of the command, the keys it does not take, and that it all fits."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

from gpuwatch.app.app import COMMAND_SETTINGS_REFUSAL, GpuwatchApp
from gpuwatch.app.screens.modals import KeysScreen, QuitScreen
from gpuwatch.app.screens.settings import SettingsScreen
from gpuwatch.app.widgets.advice import AdvicePanel
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.devices import DevicesPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate import NOT_TENSORFLOW
from gpuwatch.runstate.state import CURRENT_STEPS
from tests.support.command_run import CommandEvents
from trainer_runtime.changes import ACCUMULATION_REFUSAL, BATCH_REFUSAL

from .conftest import SIZE, frozen_clock_for, make_app, settle

WHY = "steps_per_execution 10: fit runs ten steps in one call"
LONG_ARGV = ["python", "/home/ana/projects/vision/experiments/train_resnet50_imagenet.py",
             "--data", "/mnt/datasets/imagenet/train", "--epochs", "90", "--lr", "0.1"]


def command_app(run: CommandEvents) -> tuple[GpuwatchApp, ReplayLink]:
    link = ReplayLink(run.events, batch_size=50)
    return GpuwatchApp(link, clock=frozen_clock_for(run.events)), link


def text(app: GpuwatchApp, widget_type: type) -> str:
    return app.query_one(widget_type).plain


def fits(app: GpuwatchApp) -> None:
    """Every line of the panels within the screen's 80 columns, and the pending bar (the
    keys' hint) still on screen, above the footer."""
    for panel in (MetricsPanel, DevicesPanel, AttemptsPanel, PendingBar):
        widget = app.query_one(panel)
        if not widget.display:
            continue
        for line in widget.plain.splitlines():
            assert len(line) <= widget.content_size.width, (panel.__name__, line)
    bar = app.query_one(PendingBar)
    assert bar.region.height == 1 and bar.region.y == app.size.height - 2, bar.region


async def test_a_watched_script_names_its_loop_and_why_its_input_wait_is_not_measured():
    run = CommandEvents().start().hook(input_wait=WHY).hello().steps(30)
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        lines = text(app, MetricsPanel).splitlines()
        assert lines[0] == "script: python train.py --epochs 3 · fit · MirroredStrategy"
        assert lines[1].startswith("step 30")
        assert lines[2].startswith(
            f"last {CURRENT_STEPS} steps: 3,200 examples/s  20.0 ms per step")
        assert "input wait" not in lines[2]  # never a number where it cannot be measured
        assert lines[3].startswith("input wait: not measurable for this loop (steps_per_")
        assert text(app, AdvicePanel).startswith("input wait not measured in this loop")
        fits(app)


async def test_why_the_input_wait_is_not_measured_is_said_whole_at_80_and_120_columns():
    # Every reason the hook gives, and the remedy in it, over as many lines as it takes:
    # none cut off (it was, at 80 columns and at 120).
    from trainer_runtime.hook.loops import NOT_FETCHED
    from trainer_runtime.hook.patching import DETERMINISM

    reasons = [NOT_FETCHED, f"steps come from a per-batch callback: {DETERMINISM}",
               "steps come from a per-batch callback: Keras 3.3 is outside the tested "
               "3.7 to 3.15; a Keras in that range measures it"]
    for size in (SIZE, (120, 30)):
        for why in reasons:
            run = CommandEvents().start().hook(input_wait=why).hello().steps(30)
            app, link = command_app(run)
            async with app.run_test(size=size) as pilot:
                await settle(app, link, pilot)
                panel = text(app, MetricsPanel)
                said = " ".join(line.strip() for line in panel.splitlines()[3:])
                assert f"input wait: not measurable for this loop ({why})" in said, panel
                fits(app)


async def test_a_long_command_is_cut_and_what_is_watched_stays():
    run = CommandEvents(command_settings_for(LONG_ARGV)).start().hook().hello()
    run.steps(30, wait_ms=2.0)
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        first = text(app, MetricsPanel).splitlines()[0]
        assert first.startswith("script: python /home/ana/projects/")
        assert first.endswith("… · fit · MirroredStrategy")
        assert "input wait 10.0%" in text(app, MetricsPanel)
        fits(app)


def command_settings_for(argv: list[str]) -> dict[str, Any]:
    from tests.support.command_run import command_settings

    return command_settings(argv)


async def test_a_command_that_is_not_a_tensorflow_program_says_so():
    run = CommandEvents().start()
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        lines = text(app, MetricsPanel).splitlines()
        assert lines == ["command: python train.py --epochs 3", f"{NOT_TENSORFLOW} (so far)"]
        assert text(app, DevicesPanel).startswith(
            "No NVIDIA GPU found: the command runs on this host's CPUs")
        assert "device sampling only" in text(app, AdvicePanel)
        assert NOT_TENSORFLOW not in text(app, AdvicePanel)  # said once
        fits(app)


async def test_a_command_the_hook_could_not_watch_says_why():
    run = CommandEvents().start().hook(installed=False, tensorflow=False, loop="",
                                       strategy="", message="python -I skips PYTHONPATH")
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        assert text(app, MetricsPanel).splitlines() == [
            "script: python train.py --epochs 3", "not watched: python -I skips PYTHONPATH"]
        fits(app)


async def test_a_crashed_command_shows_its_cause_and_its_end_fits():
    run = CommandEvents().start().hook().hello().steps(12, wait_ms=1.0)
    run.end("crashed", exit_code=3, signal=None,
            message="exited with code 3: ValueError: bad shapes",
            log_tail=["Traceback (most recent call last):", '  File "train.py", line 3',
                      "ValueError: bad shapes"])
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        screen = app.screen
        assert screen.has_class("-crashed")
        crash = app.query_one("#crash").render()
        assert "crashed: exited with code 3: ValueError: bad shapes" in str(crash)
        assert "1      off     -     64" in text(app, AttemptsPanel)  # its batch, from hello
        fits(app)


# -- the keys a command does not take ---------------------------------------------------


async def test_batch_accumulation_and_settings_keys_are_greyed_out_and_say_why(notifications):
    run = CommandEvents().start().hook().hello().steps(12, wait_ms=1.0)
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        for action in ("accumulation", "batch", "edit_settings"):
            assert app.check_action(action, (True,)) is None, action
        assert app.check_action("toggle_prefetch", ()) is True
        assert app.check_action("relaunch", ()) is None  # nothing pending yet
        for key in ("a", "A", "b", "B", "e"):
            await pilot.press(key)  # greyed out: nothing changes, and the key says why
        await pilot.pause()
        assert app.pending == {} and not isinstance(app.screen, SettingsScreen)
        assert notifications[-5:] == [ACCUMULATION_REFUSAL] * 2 + [BATCH_REFUSAL] * 2 + [
            COMMAND_SETTINGS_REFUSAL]
        # Triggered anyway (a binding of another screen, a test): refused with the reason.
        app.action_accumulation(True)
        app.action_batch(False)
        app.action_edit_settings()
        await pilot.pause()
        assert notifications[-3:] == [ACCUMULATION_REFUSAL, BATCH_REFUSAL,
                                      COMMAND_SETTINGS_REFUSAL]
        assert app.pending == {} and not isinstance(app.screen, SettingsScreen)
        assert text(app, PendingBar) == "no pending changes · p prefetch"


async def test_prefetch_is_pending_for_a_relaunch_never_live():
    run = CommandEvents().start().hook().hello().steps(12, wait_ms=1.0)
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p")
        await pilot.pause()
        assert app.pending == {"data.prefetch": True}
        assert text(app, PendingBar).startswith("pending (relaunch): prefetch off→on")
        assert app.check_action("relaunch", ()) is True


async def test_the_keys_screen_says_why_a_command_does_not_take_them():
    run = CommandEvents().start()
    app, link = command_app(run)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        rows = dict(app.key_rows())
        assert rows["a"] == rows["A"] == f"Not for a command: {ACCUMULATION_REFUSAL}"
        assert rows["b"] == rows["B"] == f"Not for a command: {BATCH_REFUSAL}"
        assert rows["e"] == f"Not for a command: {COMMAND_SETTINGS_REFUSAL}"
        assert rows["r"].startswith("Run the command again")
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, KeysScreen)
        shown = str(app.screen.query_one("#keys-text").render())
        assert "keras-team/keras#20582" in shown.replace("\n", " ")


async def test_a_train_run_keeps_every_key():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        for action in ("accumulation", "batch", "edit_settings", "toggle_prefetch"):
            assert app.check_action(action, (True,)) is True, action
        assert "Double accumulation steps" in dict(app.key_rows())["a"]
        assert "a/A accumulation" in text(app, PendingBar)
        assert text(app, MetricsPanel).startswith("step ")  # no command line


async def test_the_quit_dialog_says_what_stop_does_to_a_command_and_to_a_train_run():
    # gpuwatch keeps no checkpoint of a person's command: its Stop ends the command.
    for app, link, stop in (
        (*command_app(CommandEvents().start().hook().hello().steps(5)),
         "Stop ends your command (SIGTERM, then SIGKILL after the grace); gpuwatch keeps "
         "no checkpoint of it."),
        (*make_app("cpu_one_attempt.jsonl"), "Stop checkpoints and ends the run."),
    ):
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, link, pilot)
            await pilot.press("q")
            await pilot.pause()
            assert isinstance(app.screen, QuitScreen)
            shown = " ".join(str(app.screen.query_one(".dialog-text", Static).render()).split())
            assert shown.endswith(stop), shown
            await pilot.press("escape")
        assert link.commands == []
