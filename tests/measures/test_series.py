"""Bounded histories (gpuwatch/measures/series.py) against the exact values they summarise."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.measures.series import (
    DEVICE_HISTORY_SAMPLES,
    Bucket,
    DeviceHistory,
    RunHistory,
    RunSeries,
    bucket_means,
)
from trainer_runtime.protocol import GpuSample, Step


def exact(raw: list[tuple[int, float, float]], attempt: int, first_x: float, last_x: float):
    """The raw values a bucket should summarise: its attempt, its step range."""
    return [v for a, x, v in raw if a == attempt and first_x <= x <= last_x]


def check_buckets(series: RunSeries, raw: list[tuple[int, float, float]]) -> None:
    """Every bucket's count, mean, min and max equal the raw points it covers; every raw
    point is in exactly one bucket."""
    assert sum(b.count for b in series.buckets) == len(raw)
    for bucket in series.buckets:
        values = exact(raw, bucket.attempt, bucket.first_x, bucket.last_x)
        assert bucket.count == len(values)
        assert bucket.mean == pytest.approx(sum(values) / len(values))
        assert bucket.low == min(values)
        assert bucket.high == max(values)


def test_a_short_series_keeps_every_point_exactly():
    series = RunSeries(capacity=64)
    raw = [(1, float(x), x * 1.5) for x in range(1, 41)]
    for attempt, x, value in raw:
        series.add(attempt, x, value)
    assert series.stride == 1
    assert series.points(1) == ([x for _, x, _ in raw], [v for _, _, v in raw])


def test_a_long_series_stays_bounded_and_its_buckets_summarise_exactly():
    rng = random.Random(7)
    series = RunSeries(capacity=16)
    raw = []
    for x in range(1, 10_001):
        value = rng.uniform(-5.0, 100.0)
        raw.append((1, float(x), value))
        series.add(1, float(x), value)
        assert len(series) <= 16
    check_buckets(series, raw)
    # The whole run is still there, coarse: from the first step to the last.
    assert series.buckets[0].first_x == 1.0
    assert series.buckets[-1].last_x == 10_000.0
    # Halving doubles the stride: 10,000 points in at most 16 buckets needs >= 625 each.
    assert series.stride >= 625
    assert series.stride & (series.stride - 1) == 0  # a power of two


def test_no_bucket_spans_two_attempts_and_each_attempt_starts_where_it_did():
    # Attempt 2 resumes from step 44 (attempt 1 reached 50): the steps overlap.
    series = RunSeries(capacity=8)
    raw = []
    spans = [(1, 1, 50), (2, 45, 300), (3, 301, 307), (4, 308, 2000)]
    for attempt, first, last in spans:
        for x in range(first, last + 1):
            value = float(attempt * 1000 + x % 17)
            raw.append((attempt, float(x), value))
            series.add(attempt, float(x), value)
            assert len(series) <= 8
    check_buckets(series, raw)
    assert series.attempts() == [1, 2, 3, 4]
    for attempt, first, last in spans:
        steps, _ = series.points(attempt)
        chosen = [b for b in series.buckets if b.attempt == attempt]
        assert chosen[0].first_x == first and chosen[-1].last_x == last
        assert steps == sorted(steps)


def test_more_attempts_than_buckets_keeps_the_newest_within_the_bound():
    series = RunSeries(capacity=4)
    for attempt in range(1, 20):
        series.add(attempt, float(attempt), float(attempt))
        assert len(series) <= 4
    assert series.attempts()[-1] == 19
    assert series.points(19) == ([19.0], [19.0])


def test_run_series_needs_room_for_a_merge():
    with pytest.raises(ValueError, match="room for 2 buckets"):
        RunSeries(capacity=1)


def step_event(
    attempt: int, number: int, *, step_ms: float, wait_ms: float, loss: float | None,
    **parts: float,
) -> Step:
    return Step(
        attempt=attempt,
        step=number,
        micro_step=number,
        epoch=0,
        loss=loss,
        lr=1e-3,
        examples=256,
        step_time_ms=step_ms,
        input_wait_ms=wait_ms,
        grad_sync_bytes=0.0,
        dropped=0,
        **parts,
    )


def test_run_history_leaves_warmup_out_of_the_timings_but_keeps_every_loss():
    history = RunHistory()
    history.add(step_event(1, 1, step_ms=2400.0, wait_ms=100.0, loss=2.3), warmup=True)
    history.add(step_event(1, 2, step_ms=200.0, wait_ms=50.0, loss=2.1), warmup=False)
    history.add(step_event(1, 3, step_ms=100.0, wait_ms=10.0, loss=None), warmup=False)
    assert history.loss.points(1) == ([1.0, 2.0], [2.3, 2.1])  # a non-finite loss is null
    assert history.step_time_ms.points(1) == ([2.0, 3.0], [200.0, 100.0])
    # 256 examples in 200 ms and 100 ms; 50 of 200 ms and 10 of 100 ms waiting.
    assert history.examples_per_s.points(1) == ([2.0, 3.0], [1280.0, 2560.0])
    assert history.input_wait_pct.points(1) == ([2.0, 3.0], [25.0, 10.0])


def test_run_history_keeps_each_timed_steps_shares_of_compute_all_reduce_and_update():
    history = RunHistory()
    # Warm-up: all all-reduce, left out as the timings are.
    history.add(step_event(1, 1, step_ms=900.0, wait_ms=0.0, loss=2.3, compute_ms=0.0,
                           sync_ms=900.0, update_ms=0.0), warmup=True)
    # 100 ms: input 10 + compute 50 + all-reduce 20 + update 5 (+ other 15).
    history.add(step_event(1, 2, step_ms=100.0, wait_ms=10.0, loss=2.1, compute_ms=50.0,
                           sync_ms=20.0, update_ms=5.0), warmup=False)
    # An older trainer's step (compute alone): no shares, never a made-up 0.
    history.add(step_event(1, 3, step_ms=100.0, wait_ms=10.0, loss=2.0, compute_ms=50.0),
                warmup=False)
    # 200 ms in attempt 2: input 20 + compute 60 + all-reduce 100 + update 10 (+ other 10).
    history.add(step_event(2, 4, step_ms=200.0, wait_ms=20.0, loss=1.9, compute_ms=60.0,
                           sync_ms=100.0, update_ms=10.0), warmup=False)
    assert history.compute_pct.points(1) == ([2.0], [50.0])
    assert history.sync_pct.points(1) == ([2.0], [20.0])
    assert history.update_pct.points(1) == ([2.0], [5.0])
    assert history.input_wait_pct.points(1) == ([2.0, 3.0], [10.0, 10.0])
    assert (history.compute_pct.points(2), history.sync_pct.points(2),
            history.update_pct.points(2)) == (([4.0], [30.0]), ([4.0], [50.0]), ([4.0], [5.0]))


def gpu(index: int, util: float | None, **extra: Any) -> GpuSample:
    return GpuSample(**{
        "index": index,
        "name": "A100",
        "uuid": None,
        "util_gpu_pct": util,
        "mem_used_bytes": 10 * index,
        "mem_total_bytes": 100,
        "pcie_tx_bytes_per_s": 1.0,
        "pcie_rx_bytes_per_s": 2.0,
        "nvlink_tx_bytes_per_s": None,
        "nvlink_rx_bytes_per_s": None,
        **extra,
    })


def test_device_history_keeps_the_last_samples_per_gpu():
    history = DeviceHistory()
    total = DEVICE_HISTORY_SAMPLES + 50
    for k in range(total):
        history.add([gpu(0, float(k % 100)), gpu(1, None)], t=1000.0 + k)
    first, second = history.gpus
    assert history.samples_seen == total
    assert len(first.util_pct) == DEVICE_HISTORY_SAMPLES
    assert list(first.util_pct) == [float(k % 100) for k in range(50, total)]
    assert set(second.util_pct) == {None}  # no reading (MIG): None, never 0
    assert list(second.mem_used_bytes)[-1] == 10.0
    assert second.mem_total_bytes == 100.0
    assert history.span_s == DEVICE_HISTORY_SAMPLES - 1


def test_device_history_aligns_a_gpu_seen_late_and_one_that_went_missing():
    history = DeviceHistory()
    history.add([gpu(0, 50.0)], t=1.0)
    history.add([gpu(0, 60.0), gpu(1, 70.0)], t=2.0)
    history.add([gpu(1, 80.0, lost=True)], t=3.0)
    zero, one = history.gpus
    assert list(zero.util_pct) == [50.0, 60.0, None] and not zero.present
    assert list(one.util_pct) == [None, 70.0, 80.0] and one.lost


def test_device_history_encodes_as_json():
    history = DeviceHistory()
    history.add([gpu(0, 50.0)], t=1.0)
    run = RunHistory()
    run.add(step_event(1, 6, step_ms=100.0, wait_ms=1.0, loss=1.0), warmup=False)
    encoded = json.dumps({"devices": asdict(history), "run": asdict(run)}, default=list)
    assert '"util_pct": [50.0]' in encoded


def test_bucket_means_fall_on_fixed_sample_boundaries():
    # Samples 0..9 seen, the last 7 kept (3..9), 3 per cell: cells {3,4,5}, {6,7,8}, {9},
    # and the partly dropped cell {0,1,2} is gone entirely.
    values = [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert bucket_means(values, seen=10, per_cell=3, cells=10) == [4.0, 7.0, 9.0]
    # One more sample only changes the last cell.
    assert bucket_means([*values, 10.0], seen=11, per_cell=3, cells=10) == [4.0, 7.0, 9.5]
    # At most `cells` cells, the newest; a cell of None readings is None.
    assert bucket_means([None, None, 1.0], seen=3, per_cell=1, cells=2) == [None, 1.0]
    assert bucket_means([], seen=0, per_cell=3, cells=4) == []


@given(
    st.lists(
        st.sampled_from([0.0, -0.0, math.nan]) | st.floats(allow_nan=True, allow_infinity=True),
        min_size=1,
        max_size=20,
    )
)
def test_a_bucket_keeps_the_min_and_max_that_min_and_max_take(values: list[float]) -> None:
    """take() compares instead of calling min()/max(): the same low and high, NaN included."""
    bucket = Bucket(1, 0.0, 0.0, 1, values[0], values[0], values[0])
    low = high = values[0]
    for x, value in enumerate(values[1:], start=1):
        bucket.take(x, value)
        low, high = min(low, value), max(high, value)
    assert (repr(bucket.low), repr(bucket.high)) == (repr(low), repr(high))
