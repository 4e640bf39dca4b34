"""The verdict on the step's shares rests on their intervals: "highly" only when a share's
interval is wholly above the high grade, "moderately" only when wholly above the moderate
one; an interval across a grade says so, and the interval holds the true share."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.advisor import HIGH_INPUT_BOUND_PCT, PART_GRADES, advise, interval_side
from gpuwatch.advisor.findings import unsure_note, vouched_level
from gpuwatch.runstate import StepPoint, step_figures
from gpuwatch.runstate.steps import (
    MIN_SHARE_STEPS,
    SHARE_CONFIDENCE,
    RatioSums,
    ratio_interval,
    share_intervals,
)
from trainer_runtime.protocol import Step

SETTINGS = {"data": {"prefetch": True, "parallel_calls": "autotune"},
            "train": {"global_batch_size": 256, "accumulation_steps": 1}}


def step(i: int, input_ms: float, compute_ms: float, sync_ms: float = 1.0,
         update_ms: float = 1.0, other_ms: float = 1.0) -> StepPoint:
    step_ms = input_ms + compute_ms + sync_ms + update_ms + other_ms
    return StepPoint(Step(attempt=1, step=i, micro_step=i, epoch=0, loss=1.0, lr=1e-3,
                          examples=256, step_time_ms=step_ms, input_wait_ms=input_ms,
                          grad_sync_bytes=1e6, compute_ms=compute_ms, sync_ms=sync_ms,
                          update_ms=update_ms))


def noisy_steps(seed: int, share: float, steps: int = 20, spread: float = 0.1
                ) -> list[StepPoint]:
    """Steps of 100 ms +- 20 % whose input wait is a share drawn uniformly within +-spread
    of `share` (independent of the step's time): the true share is `share`."""
    rng = random.Random(seed)
    points = []
    for i in range(steps):
        step_ms = rng.uniform(80.0, 120.0)
        input_ms = step_ms * rng.uniform(share - spread, share + spread)
        points.append(step(i, input_ms, step_ms - input_ms - 3.0))
    return points


def test_a_share_clearly_over_the_high_grade_is_highly() -> None:
    figures = step_figures(noisy_steps(seed=1, share=0.40))
    advice = advise(figures, SETTINGS, replicas=2)
    assert advice.level == "high"
    assert advice.verdict.startswith("highly input-bound: ")
    assert "not enough steps" not in advice.verdict


def test_a_share_whose_interval_crosses_the_high_grade_is_not_highly() -> None:
    points = noisy_steps(seed=2, share=0.21, spread=0.15)
    figures = step_figures(points)
    interval = figures.share_intervals["input"]
    assert interval is not None and interval[0] < HIGH_INPUT_BOUND_PCT <= interval[1]
    advice = advise(figures, SETTINGS, replicas=2)
    assert advice.level == "moderate"
    assert advice.bottleneck == "input"
    assert advice.verdict.startswith("moderately input-bound: ")
    assert f"({interval[0]:.0f}-{interval[1]:.0f}%; highly from 20%: not enough steps " \
           "to tell)" in advice.verdict
    assert advice.recommendations  # still the input's remedies: it holds the step back


def test_identical_steps_have_their_share_as_interval() -> None:
    figures = step_figures([step(i, 30.0, 67.0) for i in range(MIN_SHARE_STEPS)])
    assert figures.share_intervals is not None
    low, high = figures.share_intervals["input"] or (0.0, 0.0)
    assert abs(low - 30.0) < 1e-9 and abs(high - 30.0) < 1e-9
    assert advise(figures, SETTINGS, replicas=2).verdict.startswith("highly input-bound: 30.0%")


def test_too_few_steps_for_an_interval_give_no_grade() -> None:
    figures = step_figures([step(i, 30.0 + i, 67.0) for i in range(MIN_SHARE_STEPS - 1)])
    assert figures.share_intervals is not None and figures.share_intervals["input"] is None
    advice = advise(figures, SETTINGS, replicas=2)
    assert advice.verdict.startswith("input-bound: ")
    assert "too few steps for an interval; highly from 20%" in advice.verdict


def test_the_interval_holds_the_true_share() -> None:
    """Over 200 seeded series of 20 steps, truly 20 % input wait: the 95 % interval holds
    it in at least 90 % of them (the ratio estimator's interval is approximate)."""
    held = 0
    for seed in range(200):
        interval = step_figures(noisy_steps(seed, 0.20)).share_intervals["input"]
        assert interval is not None
        held += interval[0] <= 20.0 <= interval[1]
    assert held >= 0.90 * 200, held
    assert SHARE_CONFIDENCE == 0.95


class CountingSequence(Sequence):
    """A sequence that counts the items read from it."""

    def __init__(self, items: list) -> None:
        self.items, self.reads = items, 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        self.reads += 1
        return self.items[index]

    def __iter__(self) -> Iterator:
        for item in self.items:
            self.reads += 1
            yield item


def test_an_interval_costs_a_few_passes_over_the_steps() -> None:
    """It runs on every repaint: at most two passes over the steps for the five shares, one
    over a share's pairs (its five sums)."""
    points = CountingSequence(noisy_steps(seed=3, share=0.3))
    share_intervals(points)
    assert points.reads <= 2 * len(points)
    pairs = CountingSequence([(float(i), 10.0 + i) for i in range(50)])
    ratio_interval(pairs)
    assert pairs.reads <= len(pairs)


parts = st.tuples(*(st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
                    for _ in range(5)))


@settings(max_examples=200, deadline=None)
@given(st.lists(parts, min_size=1, max_size=24))
def test_the_level_never_contradicts_its_interval(series: list[tuple[float, ...]]) -> None:
    points = [step(i, *values) for i, values in enumerate(series)]
    figures = step_figures(points)
    advice = advise(figures, SETTINGS, replicas=2)
    names = {"input": "input", "communication": "sync", "update": "update", "host": "other"}
    part = names.get(advice.bottleneck)
    if part is None or figures.share_intervals is None:
        return
    interval = figures.share_intervals.get(part)
    high, moderate = PART_GRADES[part]
    if advice.level == "high":
        assert interval_side(interval, high) == "above"
    elif advice.level == "moderate":
        assert interval_side(interval, moderate) == "above"
        assert interval_side(interval, high) != "above"
    else:
        assert interval_side(interval, moderate) != "above"
    assert advice.verdict.startswith("highly") == (advice.level == "high")


def test_the_note_names_the_grade_the_interval_does_not_reach() -> None:
    assert vouched_level("sync", (14.0, 18.0)) == "moderate"
    assert unsure_note("sync", 16.0, (14.0, 18.0)) == (
        " (14-18%; highly from 15%: not enough steps to tell)")
    assert vouched_level("sync", (16.0, 18.0)) == "high"
    assert unsure_note("sync", 17.0, (16.0, 18.0)) == ""
    assert unsure_note("other", 6.0, (4.0, 8.0)) == (
        " (4-8%; moderately from 5%: not enough steps to tell)")


def test_an_attempts_share_interval_is_over_all_its_steps_from_five_sums() -> None:
    # The attempt keeps no steps, only RatioSums: its interval is the one over every pair,
    # and a long attempt's is narrower than its latest 20 steps' (the same spread).
    rng = random.Random(7)
    pairs = [(rng.uniform(15.0, 27.0), 100.0 + rng.uniform(-5.0, 5.0)) for _ in range(2000)]
    sums = RatioSums()
    for part, whole in pairs:
        sums.add(part, whole)
    whole_run = sums.interval()
    assert whole_run is not None and whole_run == pytest.approx(ratio_interval(pairs))
    latest = ratio_interval(pairs[-20:])
    assert latest is not None
    assert whole_run[1] - whole_run[0] < (latest[1] - latest[0]) / 5
    share = 100.0 * sum(p for p, _ in pairs) / sum(w for _, w in pairs)
    assert whole_run[0] < share < whole_run[1]


def test_a_share_the_interval_cannot_grade_reads_unsure_never_all_clear() -> None:
    # True share 6 %, each step's within +-5 %: the interval crosses the moderate grade
    # (5 %), so the input is named by its figure, ungraded: neither "moderately" nor the
    # all-clear a compute-bound step gets.
    figures = step_figures(noisy_steps(seed=3, share=0.06, spread=0.05))
    interval = figures.share_intervals["input"]
    assert interval is not None and interval[0] < 5.0 <= interval[1]
    advice = advise(figures, SETTINGS, replicas=2)
    assert (advice.level, advice.bottleneck) == ("none", "input")
    assert advice.verdict.startswith("input-bound: ") and "not enough steps" in advice.verdict
    assert advice.tone == "unsure"
    clear = advise(step_figures([step(i, 0.5, 90.0) for i in range(20)]), SETTINGS,
                   replicas=2)
    assert (clear.bottleneck, clear.tone) == ("compute", "none")
