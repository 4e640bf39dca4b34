"""The attempts table shows every setting that differs between the attempts it shows.

The fixture: the settings screen changed read latency, parallel calls and cache live, so
prefetch, accumulation and batch read "off 1 256" on both rows; only the three changed
settings tell them apart, and the table must show them, at 80 columns too.
"""

from __future__ import annotations

from typing import Any

from gpuwatch.app.widgets.attempts import AttemptsPanel

from .conftest import load_events, make_app, settle

FIXTURE = "cpu_settings_changed.jsonl"


def injected(events: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    """Each attempt's read latency, parallel calls and cache, from the attempt events fed
    (data.read_latency_ms, data.parallel_calls, data.cache), by the table's short names."""
    values: dict[int, dict[str, str]] = {}
    for event in events:
        if event["type"] == "attempt":
            data = event["settings"]["data"]
            values[event["attempt"]] = {
                "read ms": str(data["read_latency_ms"]),
                "parallel": str(data["parallel_calls"]),
                "cache": "on" if data["cache"] is True else "off",
            }
    return values


def row_of(lines: list[str], attempt: int) -> int:
    found = [i for i, line in enumerate(lines) if line.split()[:1] == [str(attempt)]]
    assert len(found) == 1, (attempt, lines)
    return found[0]


async def test_attempts_differing_in_settings_show_them_under_their_rows_at_80x24():
    events = load_events(FIXTURE)
    want = injected(events)
    assert want[1] != want[2]
    app, link = make_app(FIXTURE)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, link, pilot)
        panel = app.query_one(AttemptsPanel)
        lines = panel.plain.splitlines()
        assert all(len(line) <= panel.content_size.width for line in lines), lines
        first, second = row_of(lines, 1), row_of(lines, 2)
        # Prefetch, accumulation and batch alike: the rows alone do not tell them apart.
        assert lines[first].split()[1:4] == lines[second].split()[1:4] == ["off", "1", "256"]
        for attempt, row in ((1, first), (2, second)):
            note = lines[row + 1]
            assert note.startswith("   ")  # under the row, not a row of its own
            for label, value in want[attempt].items():
                assert f"{label} {value}" in note, (attempt, note)
        assert panel.region.bottom <= 24 - 2  # above the pending bar and the footer


async def test_attempts_differing_in_settings_get_a_column_each_when_wide():
    events = load_events(FIXTURE)
    want = injected(events)
    app, link = make_app(FIXTURE)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(app, link, pilot)
        lines = app.query_one(AttemptsPanel).plain.splitlines()
        header = lines[0]
        assert len(lines) == 3  # the header and a row per attempt: no notes
        for attempt in (1, 2):
            row = lines[row_of(lines, attempt)]
            for label, value in want[attempt].items():
                end = header.index(label) + len(label)  # columns are right-aligned
                assert row[end - len(value) : end] == value, (label, row)
                assert row[end - len(value) - 1] == " "


async def test_attempts_with_the_same_settings_show_no_more_columns():
    app, link = make_app("cpu_one_attempt.jsonl")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, link, pilot)
        lines = app.query_one(AttemptsPanel).plain.splitlines()
        assert lines[0].split() == [
            "#", "prefetch", "accum", "batch", "steps", "ex/s", "(attempt)", "input", "wait",
            "ended",
        ]
        assert len(lines) == 2
