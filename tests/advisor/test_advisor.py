"""Advisor thresholds (TF Profiler's 5 % / 20 %) and recommendations from known windows."""

from __future__ import annotations

import pytest

from gpuwatch.advisor import advise, format_rate, input_bound_level
from gpuwatch.runstate import (
    Figures,
    HostReading,
    StepPoint,
    step_figures,
    steps_input_wait_pct,
)
from trainer_runtime.protocol import GpuSample, HostSample, Step

SETTINGS = {
    "data": {"prefetch": False, "parallel_calls": 1},
    "train": {"global_batch_size": 256, "accumulation_steps": 1},
}


def points(step_ms: float, wait_ms: float, n: int = 10, sync: float = 0.0) -> Figures:
    """The figures of n steps of step_ms each, wait_ms of it waiting for input."""
    return step_figures([
        StepPoint(
            Step(attempt=1, step=i, micro_step=i, epoch=0, loss=1.0, lr=1e-3, examples=256,
                 step_time_ms=step_ms, input_wait_ms=wait_ms, grad_sync_bytes=sync)
        )
        for i in range(n)
    ])


@pytest.mark.parametrize(
    ("pct", "level"),
    [
        (None, "unknown"),
        (0.0, "none"),
        (4.999, "none"),
        (5.0, "moderate"),
        (19.999, "moderate"),
        (20.0, "high"),
        (100.0, "high"),
    ],
)
def test_thresholds(pct, level):
    assert input_bound_level(pct) == level


def test_exact_boundaries_from_steps():
    # 5 ms of 100 ms is exactly 5 %: moderately input-bound.
    assert advise(points(100.0, 5.0), SETTINGS).level == "moderate"
    # 20 ms of 100 ms is exactly 20 %: highly input-bound.
    assert advise(points(100.0, 20.0), SETTINGS).level == "high"
    assert advise(points(100.0, 4.9), SETTINGS).level == "none"


def test_input_bound_with_prefetch_off_recommends_p():
    advice = advise(points(200.0, 76.0), SETTINGS)
    assert advice.input_wait_pct == pytest.approx(38.0)
    assert advice.verdict == "highly input-bound: 38.0% of step time waiting for input"
    assert advice.recommendations[0].startswith("turn prefetch on (p)")
    assert any("parallel_calls" in r for r in advice.recommendations)
    assert (advice.bottleneck, advice.remedies[0].key) == ("input", "p")


def test_prefetch_on_and_parallel_recommends_cache():
    settings = {**SETTINGS, "data": {"prefetch": True, "parallel_calls": "autotune"}}
    advice = advise(points(100.0, 30.0), settings)
    assert not any("(p)" in r for r in advice.recommendations)
    assert any("data.cache" in r for r in advice.recommendations)


def test_gradient_sync_estimate_mentions_accumulation():
    # 10 steps x 5e6 bytes over 10 x 100 ms = 50 MB/s
    advice = advise(points(100.0, 1.0, sync=5e6), SETTINGS, replicas=2)
    assert advice.level == "none"
    assert any("gradient sync est. 50.0 MB/s" in r and "(a)" in r for r in advice.recommendations)


def test_low_gpu_util_not_input_bound_suggests_bigger_batch():
    gpus = [GpuSample(0, util_gpu_pct=20.0), GpuSample(1, util_gpu_pct=30.0)]
    sample = HostReading(HostSample(), gpus, None, None)
    advice = advise(points(100.0, 1.0), SETTINGS, sample)
    assert "25% busy" in advice.recommendations[0] and "(b)" in advice.recommendations[0]


def test_no_steps_is_unknown():
    advice = advise(step_figures([]), SETTINGS)
    assert advice.level == "unknown" and advice.input_wait_pct is None
    assert steps_input_wait_pct([]) is None


def test_format_rate_units():
    assert format_rate(None) == "n/a"
    assert format_rate(512) == "512 B/s"
    assert format_rate(3_400_000) == "3.4 MB/s"
    assert format_rate(12e9) == "12.0 GB/s"
