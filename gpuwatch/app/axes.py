"""The plots' axes: whole steps on x, values on evenly spaced rows on y.

Plain Python (no Textual, no plotext), so the rules are unit-tested. Left to itself,
plotext puts 5 ticks evenly over x (fractional steps on a short run: 7.5, 10.5) and 7
labels over y, each on the row its value rounds to: over 8 rows, one row between two
labels is skipped where the others are not, and over 10 the gaps go 2, 1, 2, 1.
Here the labels are placed instead: a step axis is labelled at whole steps only, a
round number apart; a value axis on rows an equal number apart, from the bottom row
(the least value) to the greatest value, which sits on a labelled row (the chart's top
limit is raised by less than one spacing when the rows do not divide evenly).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

# At most this many labels on a value axis (a label every row up to 8 rows).
MOST_VALUE_LABELS = 8
# At most this many ticks on a step axis (plotext puts 5), fewer on a narrow chart.
MOST_STEP_TICKS = 6


@dataclass(frozen=True, slots=True)
class Axis:
    """The limits to give the chart, and its ticks with their labels."""

    low: float
    high: float
    ticks: list[float]
    labels: list[str]


def round_spacings() -> Iterator[int]:
    """1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, ..."""
    yield from (1, 2, 5)
    scale = 10
    while True:
        for factor in (1, 2, 2.5, 5):
            yield int(factor * scale)
        scale *= 10


def step_axis(first: float, last: float, width: int) -> Axis:
    """An axis of steps from `first` to `last` for a chart `width` cells wide: ticks on whole
    steps a round number apart (1, 2, 5, 10, 20, 25, 50, ...), as many as fit, at most
    MOST_STEP_TICKS. One step alone gets a step either side."""
    if last <= first:
        first, last = first - 1, last + 1
    low, high = math.ceil(first), math.floor(last)
    label_cells = len(str(max(abs(low), abs(high)))) + 1
    most = max(2, min(MOST_STEP_TICKS, width // (label_cells + 2)))
    ticks: list[int] = []
    for spacing in round_spacings():
        ticks = list(range(math.ceil(low / spacing) * spacing, high + 1, spacing))
        if len(ticks) <= most:
            break
    return Axis(first, last, [float(t) for t in ticks], [str(t) for t in ticks])


def value_axis(least: float, greatest: float, rows: int) -> Axis:
    """An axis of values over `rows` rows (plotext's canvas: row 0 at `least`): labels on
    rows an equal number apart, at most MOST_VALUE_LABELS, the bottom one `least` and the
    top one `greatest`. The chart's top limit is raised so `greatest` sits on its row.
    Equal values are spread as plotext spreads them (half to one and a half times)."""
    if greatest <= least:
        if least == 0:
            least, greatest = -1.0, 1.0
        else:
            least, greatest = sorted((0.5 * least, 1.5 * least))
    if rows < 2:
        return Axis(least, greatest, [least], [label(least, greatest - least)])
    spacing = max(1, math.ceil((rows - 1) / (MOST_VALUE_LABELS - 1)))  # rows between labels
    gaps = (rows - 1) // spacing  # between the bottom label and the top one
    step = (greatest - least) / gaps
    # The top limit: the value of the canvas's top row, `greatest` on row gaps x spacing.
    top = least + step * (rows - 1) / spacing
    ticks = [least + i * step for i in range(gaps + 1)]
    ticks[-1] = greatest  # exactly, whatever the sum's rounding
    return Axis(least, top, ticks, [label(tick, step) for tick in ticks])


def label(value: float, step: float) -> str:
    """A value with the decimals that tell it from a neighbour `step` away: 21333, 33.7, 2.35."""
    decimals = max(0, math.ceil(-math.log10(abs(step))) + 1) if step else 1
    return f"{value:.{decimals}f}"
