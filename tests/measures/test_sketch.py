"""The bounded median of an attempt's examples/s, against the exact median of known series;
and its interval, against binomial sums worked out here and series of known median."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.measures import sketch as sketch_module
from gpuwatch.measures.sketch import (
    EXACT_VALUES,
    MAX_BINS,
    RELATIVE_ERROR,
    MedianSketch,
    median_ranks,
)


def sketch_of(values: list[float]) -> MedianSketch:
    sketch = MedianSketch()
    for value in values:
        sketch.add(value)
    return sketch


def test_an_empty_sketch_has_no_median() -> None:
    assert MedianSketch().median() is None


@pytest.mark.parametrize("count", [1, 2, 3, 10, EXACT_VALUES - 1, EXACT_VALUES])
def test_a_short_series_has_its_exact_median(count: int) -> None:
    rng = random.Random(count)
    values = [rng.uniform(100.0, 20000.0) for _ in range(count)]
    assert sketch_of(values).median() == statistics.median(values)


# Series shaped like an attempt's examples/s: steady with jitter, with stalls (a slow
# input pipeline every so often), drifting (thermal throttling), two regimes, and wide.
def _steady(rng: random.Random, n: int) -> list[float]:
    return [rng.gauss(12800.0, 300.0) for _ in range(n)]


def _stalls(rng: random.Random, n: int) -> list[float]:
    return [
        rng.uniform(1000.0, 3000.0) if i % 7 == 0 else rng.gauss(9000.0, 50.0) for i in range(n)
    ]


def _drift(rng: random.Random, n: int) -> list[float]:
    return [20000.0 - 10000.0 * i / n + rng.uniform(-5.0, 5.0) for i in range(n)]


def _bimodal(rng: random.Random, n: int) -> list[float]:
    return [rng.choice((500.0, 50000.0)) * rng.uniform(0.99, 1.01) for _ in range(n)]


def _wide(rng: random.Random, n: int) -> list[float]:
    return [rng.lognormvariate(8.0, 3.0) for _ in range(n)]


@pytest.mark.parametrize("shape", [_steady, _stalls, _drift, _bimodal, _wide])
@pytest.mark.parametrize("count", [EXACT_VALUES + 1, 20_001, 100_000])
def test_a_long_series_median_is_within_the_stated_relative_error(shape, count: int) -> None:
    values = shape(random.Random(count), count)
    exact = statistics.median(values)
    sketch = sketch_of(values)
    estimate = sketch.median()
    assert estimate is not None
    assert abs(estimate - exact) <= RELATIVE_ERROR * exact, (estimate, exact)
    # Bounded: no values kept past the exact range, at most MAX_BINS bins.
    assert sketch.exact == [] and sketch.count == count
    assert len(sketch.bins) <= MAX_BINS


def test_zero_rates_count_toward_the_median() -> None:
    values = [0.0] * 3000 + [1000.0] * 2000
    assert sketch_of(values).median() == 0.0
    values = [0.0] * 2000 + [1000.0] * 3000
    estimate = sketch_of(values).median()
    assert estimate is not None and abs(estimate - 1000.0) <= RELATIVE_ERROR * 1000.0


def test_bins_stay_bounded_whatever_the_range() -> None:
    # Values spread over 10**-6 .. 10**12: far more distinct bins than MAX_BINS.
    values = [10.0 ** (i % 180 / 10.0 - 6.0) * (1 + (i % 13) / 1000.0) for i in range(60_000)]
    sketch = sketch_of(values)
    assert len(sketch.bins) <= MAX_BINS
    assert sum(sketch.bins.values()) + sketch.zeros == sketch.count == len(values)
    exact = statistics.median(values)
    estimate = sketch.median()
    assert estimate is not None
    # Only the lowest bins were merged: the median, far above them, keeps its bound.
    assert abs(estimate - exact) <= RELATIVE_ERROR * exact


# ---- the median's interval -----------------------------------------------------------


def ranks_by_hand(count: int, confidence: float) -> tuple[int, int] | None:
    """The largest r with 2 P(B <= r - 1) <= 1 - confidence, B ~ Binomial(count, 1/2), as
    0-based ranks (r - 1, count - r): the r-th smallest and the r-th largest value."""
    best, below = None, 0
    for r in range(1, (count + 1) // 2 + 1):
        below += math.comb(count, r - 1)  # the sum of C(count, i) for i < r
        if 2 * below / 2**count <= 1 - confidence:
            best = (r - 1, count - r)
    return best


@pytest.mark.parametrize("count", [1, 5, 6, 7, 10, 20, 35, 100, 299, 512])
def test_median_ranks_are_the_binomial_ones(count: int) -> None:
    assert median_ranks(count, 0.975) == ranks_by_hand(count, 0.975)
    assert median_ranks(count, 0.95) == ranks_by_hand(count, 0.95)
    # The textbook's: 20 values at 95 %, the 6th and the 15th (95.9 %).
    assert median_ranks(20, 0.95) == (5, 14)


@pytest.mark.parametrize("count", [EXACT_VALUES + 1, 600, 1000])
def test_past_the_exact_range_the_normal_ranks_are_within_one_of_the_binomial(
    count: int
) -> None:
    ranks, exact = median_ranks(count, 0.975), ranks_by_hand(count, 0.975)
    assert ranks is not None and exact is not None
    assert abs(ranks[0] - exact[0]) <= 1 and ranks[0] + ranks[1] == count - 1


def test_too_few_values_have_no_interval() -> None:
    assert sketch_of([5.0] * 6).median_interval(0.975) is None
    assert sketch_of([5.0] * 7).median_interval(0.975) == (5.0, 5.0)
    assert MedianSketch().median_interval(0.975) is None


def test_the_interval_holds_the_true_median_as_often_as_it_says() -> None:
    # Exponential steps of median ln 2: 400 series of 30 (fixed seeds), at 97.5 %.
    held = 0
    for seed in range(400):
        rng = random.Random(seed)
        interval = sketch_of([rng.expovariate(1.0) for _ in range(30)]).median_interval(0.975)
        assert interval is not None
        held += interval[0] <= math.log(2.0) <= interval[1]
    # 394 of 400 with these seeds; the ranks' own coverage at 30 values is 98.4 %.
    assert held >= 0.975 * 400, held


@pytest.mark.parametrize("count", [EXACT_VALUES + 1, 100_000])
def test_a_long_series_interval_is_its_ranks_within_the_relative_error(count: int) -> None:
    values = _wide(random.Random(count), count)
    ranks = median_ranks(count, 0.975)
    assert ranks is not None
    ordered = sorted(values)
    interval = sketch_of(values).median_interval(0.975)
    assert interval is not None
    for got, want in zip(interval, (ordered[ranks[0]], ordered[ranks[1]]), strict=True):
        assert abs(got - want) <= RELATIVE_ERROR * want


@given(st.lists(st.floats(min_value=0.0, max_value=1e9, allow_nan=False), min_size=1,
                max_size=700))
def test_the_interval_always_holds_the_median(values: list[float]) -> None:
    sketch = sketch_of(values)
    interval, median = sketch.median_interval(0.975), sketch.median()
    assert median is not None
    if interval is not None:
        assert interval[0] <= median <= interval[1]


def test_the_intervals_cost_is_bounded_by_the_sketch_not_the_steps(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted, not timed: what the interval sorts is at most EXACT_VALUES values, or the
    # bins, however many steps there were; one sort per interval.
    sorted_items: list[int] = []

    def counting_sorted(items: Any, **kwargs: Any) -> list[Any]:
        out = sorted(items, **kwargs)
        sorted_items.append(len(out))
        return out

    for count in (EXACT_VALUES, 100_000):
        values = _stalls(random.Random(count), count)
        sketch = sketch_of(values)
        sorted_items.clear()
        monkeypatch.setattr(sketch_module, "sorted", counting_sorted, raising=False)
        assert sketch.median_interval(0.975) is not None
        monkeypatch.delattr(sketch_module, "sorted")
        assert len(sorted_items) <= 2  # the values (or bins), and the ranks asked for
        assert sum(sorted_items) <= max(EXACT_VALUES, MAX_BINS) + 2, sorted_items
