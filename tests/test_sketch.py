"""The bounded median of an attempt's examples/s, against the exact median of known series."""

from __future__ import annotations

import random
import statistics

import pytest

from gpuwatch.sketch import EXACT_VALUES, MAX_BINS, RELATIVE_ERROR, MedianSketch


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
