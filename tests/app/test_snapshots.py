"""SVG snapshots of the dashboard (pytest-textual-snapshot); regenerate with --snapshot-update.

The clock is frozen at the fixture's last event, so elapsed times are stable.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Input

from .conftest import make_app, settle

pytest.importorskip("pytest_textual_snapshot", reason="pytest-textual-snapshot not installed")


def shot(
    snap_compare: Any, fixture: str, size: tuple[int, int], press: tuple[str, ...] = ()
) -> bool:
    app, link = make_app(fixture)

    async def run_before(pilot: Any) -> None:
        await settle(app, link, pilot)
        if press:
            await pilot.press(*press)
            await settle(app, link, pilot)
        # A focused field's cursor blinks every 0.5 s: caught on or off by when the shot is
        # taken (a loaded box once caught it off). Not blinking, Textual shows it steadily
        # on, as every recorded shot has it.
        for field in app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause()

    return bool(snap_compare(app, terminal_size=size, run_before=run_before))


def test_two_attempts_80x24(snap_compare):
    assert shot(snap_compare, "cpu_two_attempts.jsonl", (80, 24))


def test_pending_prefetch_80x24(snap_compare):
    assert shot(snap_compare, "cpu_one_attempt.jsonl", (80, 24), ("p", "a"))


def test_gpus_80x24(snap_compare):
    assert shot(snap_compare, "gpu_running.jsonl", (80, 24))


def test_crashed_80x24(snap_compare):
    assert shot(snap_compare, "cpu_crashed.jsonl", (80, 24))


def test_two_attempts_160x50(snap_compare):
    assert shot(snap_compare, "cpu_two_attempts.jsonl", (160, 50))


def test_two_workers_80x24(snap_compare):
    assert shot(snap_compare, "cpu_two_workers.jsonl", (80, 24))


def test_two_workers_160x50(snap_compare):
    assert shot(snap_compare, "cpu_two_workers.jsonl", (160, 50))


def test_settings_changed_live_80x24(snap_compare):
    # Read latency, parallel calls and cache changed: each row says its values beneath it.
    assert shot(snap_compare, "cpu_settings_changed.jsonl", (80, 24))


def test_settings_screen_with_errors_80x24(snap_compare):
    # e, then typed: read latency 15, parallel calls 0 (refused), accumulation 3 (refused:
    # the running batch 256 does not divide by 3); Enter keeps the screen open with 2 lines.
    typed = ("e", "1", "5", "tab", "tab", "tab", "0", "tab", "tab", "tab", "3", "enter")
    assert shot(snap_compare, "cpu_one_attempt.jsonl", (80, 24), typed)


def test_scale_probe_80x24(snap_compare):
    # A scaling probe at 1, 2 and 4 CPU replicas, the third running: the table (4 marked as
    # sharing the 2 cores), the verdict and the efficiency plot in place of the attempts.
    assert shot(snap_compare, "cpu_scale.jsonl", (80, 24))


def test_three_attempts_ended_80x24(snap_compare):
    # The last two attempts side by side, what differs between them in one line under them.
    assert shot(snap_compare, "cpu_three_attempts_ended.jsonl", (80, 24))


def test_two_workers_relaunched_80x24(snap_compare):
    # The multi-worker view after r: both attempts, the workers panel standing in for the
    # devices panel.
    assert shot(snap_compare, "cpu_two_workers_relaunched.jsonl", (80, 24))


def test_two_workers_pending_80x24(snap_compare):
    # A change waiting for r in the multi-worker view: the pending line above the footer.
    assert shot(snap_compare, "cpu_two_workers_relaunched.jsonl", (80, 24), press=("p",))


def test_keys_over_the_history_80x24(snap_compare):
    # The keys list over a live sparkline: nothing of the history shows through the box.
    assert shot(snap_compare, "cpu_two_attempts.jsonl", (80, 24), press=("question_mark",))
