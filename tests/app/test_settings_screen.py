"""Pilot tests of the settings screen (e): edit live and relaunch settings, set them as
pending, r sends."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from textual.widgets import Input, Static

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.screens.settings import SettingsScreen, error_id, field_id
from gpuwatch.app.widgets.pending import PendingBar
from gpuwatch.config.settings_form import FORM_KEYS, GENERAL, LIVE_FORM_KEYS, RELAUNCH_FORM_KEYS
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate import SettingRefused, check_pending

from .conftest import SIZE, load_events, make_app, settle, wait_commands

# The recorded run (cpu_one_attempt.jsonl): a 40 ms read, serial map, prefetch off,
# batch 256 over 2 CPU replicas, running.
FIXTURE = "cpu_one_attempt.jsonl"


def bar(app: GpuwatchApp) -> str:
    return app.query_one(PendingBar).plain


def field(app: GpuwatchApp, key: str) -> Input:
    return app.screen.query_one(f"#{field_id(key)}", Input)


def error_lines(app: GpuwatchApp) -> dict[str, str]:
    """The error lines the screen shows, by key."""
    shown = {}
    for key in (*FORM_KEYS, GENERAL):
        line = app.screen.query_one(f"#{error_id(key)}", Static)
        if line.display:
            shown[key] = str(line.render())
    return shown


async def test_e_opens_the_screen_with_the_running_settings():
    app, link = make_app(FIXTURE)
    settings = load_events(FIXTURE)[0]["settings"]
    assert settings["data"]["read_latency_ms"] == 40.0  # the fixture, as the comment says
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("e")
        assert isinstance(app.screen, SettingsScreen)
        values = {key: field(app, key).value for key in FORM_KEYS}
        assert values == {
            "data.read_latency_ms": "40.0",
            "data.decode_cost": "0",
            "data.prefetch": "off",
            "data.parallel_calls": "1",
            "data.cache": "off",
            "train.global_batch_size": "256",
            "train.accumulation_steps": "1",
            # Relaunch settings; the record has no jit_compile or precision: the defaults.
            "train.steps_per_execution": "1",
            "train.jit_compile": "off",
            "train.mixed_precision": "float32",
        }
        assert error_lines(app) == {}
        rows = [str(label.render()) for label in app.screen.query(".settings-how")]
        assert rows == ["live"] * len(LIVE_FORM_KEYS) + ["relaunch"] * len(RELAUNCH_FORM_KEYS)
        title = app.screen.query_one("#settings-relaunch-title", Static)
        assert str(title.render()) == (
            "Relaunch settings (r restarts from the checkpoint, with all pending):"
        )
        accepts_line = app.screen.query_one("#settings-accepts", Static)
        assert str(accepts_line.render()) == (
            "data.read_latency_ms takes a number from 0.0 to 60000.0"
        )
        await pilot.press("tab", "tab")
        assert str(accepts_line.render()).startswith("data.prefetch takes true, false, ")


async def test_typed_parallel_calls_and_read_latency_become_pending_live_and_r_sends_them():
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("e")
        assert app.focused is field(app, "data.read_latency_ms")
        # A focused field has its text selected: typing replaces it.
        await pilot.press("1", "5", "tab", "tab", "tab")
        assert app.focused is field(app, "data.parallel_calls")
        await pilot.press("8", "enter")
        assert not isinstance(app.screen, SettingsScreen)
        assert app.pending == {"data.read_latency_ms": 15.0, "data.parallel_calls": 8}
        # At 80 columns the description gives way, never the keys or "live".
        assert bar(app).startswith("pending (live): read latency ms 40.0→15.0, paralle…")
        assert bar(app).endswith(" — r apply live · c discard")
        await pilot.press("r")
        await wait_commands(app)
        overrides = {"data.read_latency_ms": 15.0, "data.parallel_calls": 8}
        assert link.commands == [
            ("relaunch", {"overrides": overrides, "fresh": False, "live": True})
        ]


async def test_steps_per_execution_is_pending_for_a_relaunch_and_r_sends_it():
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("e")
        field(app, "train.steps_per_execution").focus()
        await pilot.press("8", "enter")
        assert not isinstance(app.screen, SettingsScreen)
        assert app.pending == {"train.steps_per_execution": 8}
        assert bar(app) == "pending (relaunch): steps per execution 1→8 — r relaunch · c discard"
        await pilot.press("r")
        await wait_commands(app)
        assert link.commands == [
            ("relaunch", {"overrides": {"train.steps_per_execution": 8}, "fresh": False,
                          "live": True})
        ]


async def test_a_live_and_a_relaunch_setting_together_are_one_relaunch():
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("e")
        field(app, "data.parallel_calls").value = "4"
        field(app, "train.jit_compile").value = "on"
        await pilot.press("enter")
        assert app.pending == {"data.parallel_calls": 4, "train.jit_compile": True}
        # Not "live": the running trainer cannot take jit_compile, so r relaunches with both.
        # At 80 columns the description gives way (cut with "…"), never the keys.
        assert bar(app) == (
            "pending (relaunch): parallel calls 1→4, jit compile… — r relaunch · c discard"
        )
        await pilot.press("r")
        await wait_commands(app)
        overrides = {"data.parallel_calls": 4, "train.jit_compile": True}
        assert link.commands == [
            ("relaunch", {"overrides": overrides, "fresh": False, "live": True})
        ]


async def test_a_refused_relaunch_setting_shows_its_line_and_nothing_is_pending():
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("e")
        field(app, "train.steps_per_execution").value = "0"
        field(app, "data.parallel_calls").value = "4"
        await pilot.press("enter")
        assert isinstance(app.screen, SettingsScreen)
        assert error_lines(app) == {
            "train.steps_per_execution": "train.steps_per_execution: must be at least 1 (got 0)"
        }
        assert app.focused is field(app, "train.steps_per_execution")
        assert app.pending == {}


async def test_pending_keys_show_in_the_screen_and_stay_unless_changed_there():
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "b", "e")
        assert field(app, "data.prefetch").value == "on"
        assert field(app, "train.global_batch_size").value == "512"
        field(app, "data.prefetch").value = "off"  # back to the running value
        field(app, "data.parallel_calls").value = "auto"
        await pilot.press("enter")
        assert app.pending == {"train.global_batch_size": 512, "data.parallel_calls": "autotune"}


@pytest.mark.parametrize(
    ("key", "text", "line"),
    [
        (
            "data.parallel_calls",
            "0",
            "data.parallel_calls: must be 'autotune' or an integer from 1 to 256 (got 0)",
        ),
        (
            "train.global_batch_size",
            "257",
            "train.global_batch_size 257 is not divisible by replicas x accumulation_steps = "
            "2 x 1 = 2",
        ),
        ("data.read_latency_ms", "fast", "data.read_latency_ms: must be a number (got 'fast')"),
        ("data.decode_cost", "12 cycles", "data.decode_cost: must be an integer (got '12 cycles')"),
        (
            "data.decode_cost",
            "99999999999999999999",
            "data.decode_cost: must be at most 1000 (got 99999999999999999999)",
        ),
        (
            "data.read_latency_ms",
            "9" * 101,
            "data.read_latency_ms: is a number written with more than 100 characters",
        ),
        (
            "train.accumulation_steps",
            "3",
            "train.global_batch_size: 256 is not divisible by train.accumulation_steps 3",
        ),
    ],
)
async def test_a_refused_value_shows_its_line_and_keeps_the_screen_and_pending(key, text, line):
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("p", "e")
        field(app, key).value = text
        beside = "data.cache" if key == "data.parallel_calls" else "data.parallel_calls"
        field(app, beside).value = "on" if beside == "data.cache" else "4"  # good, not kept
        await pilot.press("enter")
        assert isinstance(app.screen, SettingsScreen), "a refused value keeps the screen open"
        assert error_lines(app) == {key: line}
        assert app.focused is field(app, key), "the first wrong field has the focus"
        assert app.pending == {"data.prefetch": True}
        # Put right, the line goes and the screen closes.
        field(app, key).value = "2" if key != "data.read_latency_ms" else "2.5"
        await pilot.press("enter")
        assert not isinstance(app.screen, SettingsScreen)
        assert key in app.pending


async def test_escape_changes_nothing():
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("a", "e")
        field(app, "data.parallel_calls").value = "16"
        await pilot.press("escape")
        assert not isinstance(app.screen, SettingsScreen)
        assert app.pending == {"train.accumulation_steps": 2}
        await pilot.press("e")  # opened again: the pending values, not the text left behind
        assert field(app, "data.parallel_calls").value == "1"
        assert field(app, "train.accumulation_steps").value == "2"
        await pilot.press("escape")
        assert link.commands == []


async def test_with_no_trainer_running_the_screen_and_the_bar_say_relaunch():
    app, link = make_app("cpu_crashed.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        await pilot.press("e")
        intro = str(app.screen.query_one(".dialog-text", Static).render())
        assert "no trainer runs now: r relaunches with them" in intro
        field(app, "data.parallel_calls").value = "4"
        await pilot.press("enter")
        assert bar(app).startswith("pending (relaunch): parallel calls 1→4")


async def test_before_any_settings_e_says_so(notifications):
    app = GpuwatchApp(ReplayLink([]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("e")
        assert not isinstance(app.screen, SettingsScreen)
        assert notifications == ["no settings yet: the run has not started"]


# Typed into the real screen: whatever the text, Enter either closes the screen with
# pending settings a relaunch takes, or keeps it open with a line saying what is wrong.
# Each example starts an app (about 2 s here): few examples of several texts each. The
# form's own property test (tests/config/test_settings_form.py) tries hundreds of texts.
_TYPED = st.one_of(
    st.integers(min_value=0, max_value=64).map(lambda n: str(n * 8)),
    st.sampled_from(["on", "off", "auto", "0.5"]),
    st.text(max_size=24),
    st.integers().map(str),
)


@settings(max_examples=5, deadline=None)
@given(typed=st.lists(st.tuples(st.sampled_from(FORM_KEYS), _TYPED), min_size=1, max_size=8))
def test_any_text_typed_is_pending_the_schema_takes_or_a_shown_line(typed):
    asyncio.run(_type_each(typed))


async def _type_each(typed: list[tuple[str, str]]) -> None:
    app, link = make_app(FIXTURE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        for key, text in typed:
            if not isinstance(app.screen, SettingsScreen):
                await pilot.press("e")
            before = dict(app.pending)
            field(app, key).value = text
            await pilot.press("enter")
            if isinstance(app.screen, SettingsScreen):
                lines = error_lines(app)
                assert lines and all(lines.values()), f"open with no line after {text!r}"
                assert app.pending == before
            else:
                try:
                    check_pending(app.state.settings, app.pending, app.state.replicas)
                except SettingRefused as exc:
                    pytest.fail(f"{text!r} in {key} became {app.pending}, refused: {exc}")
