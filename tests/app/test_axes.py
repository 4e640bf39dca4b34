"""The plots' axes (gpuwatch/app/axes.py), plain: whole steps, labels on evenly spaced rows."""

from __future__ import annotations

import itertools
import math

import pytest
from plotext._utility import get_matrix_data  # where plotext puts a value: the ground truth

from gpuwatch.app.axes import MOST_VALUE_LABELS, label, step_axis, value_axis


@pytest.mark.parametrize(
    ("first", "last", "width", "ticks"),
    [
        (6, 12, 39, [6, 8, 10, 12]),  # 7 steps: 1 apart would be 7 ticks, more than fit
        (6, 7, 39, [6, 7]),
        (1, 12, 40, [2, 4, 6, 8, 10, 12]),
        (6, 160, 39, [25, 50, 75, 100, 125, 150]),
        (6, 160, 30, [50, 100, 150]),  # narrower: fewer
        (6.5, 159.5, 79, [25, 50, 75, 100, 125, 150]),  # bucket means: whole ticks still
        (1, 30_000, 80, [5_000, 10_000, 15_000, 20_000, 25_000, 30_000]),
        (1, 30_000, 40, [10_000, 20_000, 30_000]),  # narrower: fewer
    ],
)
def test_step_ticks_are_whole_steps_a_round_number_apart(first, last, width, ticks):
    axis = step_axis(first, last, width)
    assert axis.ticks == ticks
    assert axis.labels == [str(t) for t in ticks]
    assert (axis.low, axis.high) == (first, last)


def test_one_step_alone_gets_a_step_either_side():
    axis = step_axis(5, 5, 40)
    assert (axis.low, axis.high, axis.labels) == (4, 6, ["4", "5", "6"])


@pytest.mark.parametrize("rows", range(2, 40))
def test_value_labels_sit_on_evenly_spaced_rows_from_the_least_to_the_greatest(rows):
    least, greatest = 1.998, 2.345
    axis = value_axis(least, greatest, rows)
    assert axis.ticks[0] == least and axis.ticks[-1] == greatest
    assert 2 <= len(axis.ticks) <= MOST_VALUE_LABELS
    placed = get_matrix_data(axis.ticks, [axis.low, axis.high], rows)
    assert placed[0] == 0  # the bottom row
    gaps = {b - a for a, b in itertools.pairwise(placed)}
    assert len(gaps) == 1, placed
    gap = gaps.pop()
    assert rows - 1 - gap < placed[-1] <= rows - 1  # less than a gap of room above
    assert len(axis.ticks) == min(rows, MOST_VALUE_LABELS) or gap > 1
    assert len(set(axis.labels)) == len(axis.labels)  # each told from its neighbours


def test_labels_have_the_decimals_that_tell_neighbours_apart():
    assert label(21333.3, 1930.0) == "21333"
    assert label(33.67, 6.33) == "33.7"
    assert label(2.3451, 0.0578) == "2.345"
    assert label(190.0, 3.33) == "190.0"


@pytest.mark.parametrize(("value", "spread"), [(38.0, (19.0, 57.0)), (0.0, (-1.0, 1.0)),
                                               (-4.0, (-6.0, -2.0))])
def test_a_flat_series_is_spread_as_plotext_spreads_it(value, spread):
    axis = value_axis(value, value, 7)
    assert (axis.ticks[0], axis.ticks[-1]) == spread
    assert all(math.isfinite(t) for t in axis.ticks)
