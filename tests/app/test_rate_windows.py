"""One examples/s per window: the metrics line's and the attempts table's, read off the screen.

The metrics line's is the median over the chief's latest steps after warm-up (at most
CURRENT_STEPS), the table's the median over its whole attempt after warm-up. Over the same
steps (an attempt with no more than CURRENT_STEPS steps after warm-up, running or ended)
the two are one value; over different steps each says its window. The truths are the
recorded steps' own rates, by hand (tests/app/data/make_fixtures.py): 256 examples a step,
200 +/- 10 ms in cpu_one_attempt and 130 +/- 6 ms in cpu_crashed, in turn, after 5
warm-up steps.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

import pytest

from gpuwatch.app.app import GpuwatchApp
from gpuwatch.app.widgets.attempts import AttemptsPanel
from gpuwatch.app.widgets.metrics import MetricsPanel
from gpuwatch.follow.link import ReplayLink
from gpuwatch.runstate.state import CURRENT_STEPS
from gpuwatch.runstate.steps import WARMUP_STEPS

from .conftest import SIZE, frozen_clock_for, load_events, settle
from .test_painters import later_steps

TABLE_LABEL = "ex/s (attempt)"


def measured(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last attempt's steps after its warm-up, as recorded."""
    attempt = max(e["attempt"] for e in events if e["type"] == "step")
    return [e for e in events if e["type"] == "step" and e["attempt"] == attempt][WARMUP_STEPS:]


def by_hand(steps: list[dict[str, Any]]) -> str:
    """The median of the steps' own examples/s, as the screen writes it."""
    return f"{statistics.median(e['examples'] * 1000.0 / e['step_time_ms'] for e in steps):,.0f}"


def until_step(events: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The recording up to its `count`-th step: a run that is that far in."""
    steps = [i for i, e in enumerate(events) if e["type"] == "step"]
    return events[: steps[count - 1] + 1]


def headline(app: GpuwatchApp) -> tuple[int, str]:
    """The metrics line's window (its steps) and examples/s, as shown."""
    panel = app.query_one(MetricsPanel)
    line = panel.plain.splitlines()[1]
    assert len(line) <= panel.content_size.width, line  # whole, at 80 columns too
    match = re.match(r"last (\d+) steps: ([\d,]+) examples/s  ", line)
    assert match is not None, line
    return int(match.group(1)), match.group(2)


def table_rate(app: GpuwatchApp, attempt: int) -> str:
    """The attempts table's examples/s of `attempt`, under its label."""
    header, *rows = app.query_one(AttemptsPanel).plain.splitlines()
    assert TABLE_LABEL in header, header
    end = header.index(TABLE_LABEL) + len(TABLE_LABEL)
    (row,) = [r for r in rows if r.split()[:1] == [str(attempt)]]
    return row[end - len(TABLE_LABEL) : end].strip()


async def shown(events: list[dict[str, Any]]) -> tuple[tuple[int, str], str]:
    link = ReplayLink(events, batch_size=50)
    app = GpuwatchApp(link, clock=frozen_clock_for(events))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, link, pilot)
        return headline(app), table_rate(app, 1)


@pytest.mark.parametrize(
    ("fixture", "steps", "status"),
    [
        ("cpu_one_attempt.jsonl", WARMUP_STEPS + 15, "running"),  # fewer than CURRENT_STEPS
        ("cpu_one_attempt.jsonl", WARMUP_STEPS + CURRENT_STEPS, "running"),  # exactly
        ("cpu_crashed.jsonl", None, "crashed"),  # 10, and the attempt ended
    ],
)
async def test_over_the_same_steps_the_headline_and_the_table_read_one_value(
    fixture: str, steps: int | None, status: str
) -> None:
    events = load_events(fixture)
    if steps is not None:
        events = until_step(events, steps)
    assert [e["status"] for e in events if e["type"] == "status"][-1] == status
    truth = measured(events)
    assert len(truth) <= CURRENT_STEPS
    (window, headline_rate), table = await shown(events)
    assert window == len(truth)  # its window is every step of the attempt after warm-up
    assert headline_rate == table == by_hand(truth)


async def test_an_odd_count_of_steps_is_not_read_as_its_neighbours_median() -> None:
    # 15 steps after warm-up, 8 of 210 ms and 7 of 190: their median is a 210 ms step's
    # 1,219, where any even window of them reads 1,283.
    events = until_step(load_events("cpu_one_attempt.jsonl"), WARMUP_STEPS + 15)
    assert by_hand(measured(events)) == "1,219"
    assert by_hand(measured(events)[1:]) == "1,283"
    (_, headline_rate), table = await shown(events)
    assert headline_rate == table == "1,219"


async def test_over_different_steps_each_figure_says_its_window() -> None:
    # The recording's 40 steps after warm-up (200 +/- 10 ms), then 20 of 100 ms: the last
    # 20 steps read 2,560 examples/s, the attempt's 60 their median, a 190 ms step's.
    events = load_events("cpu_one_attempt.jsonl")
    faster = [dict(step, step_time_ms=100.0, input_wait_ms=38.0)
              for step in later_steps(events, CURRENT_STEPS)]
    events += faster
    (window, headline_rate), table = await shown(events)
    assert window == CURRENT_STEPS and headline_rate == by_hand(faster) == "2,560"
    assert table == by_hand(measured(events)) == "1,347"
