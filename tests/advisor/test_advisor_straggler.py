"""The straggler rule against known figures: input-bound, slow devices, and none."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.advisor import (
    STRAGGLER_COMPUTE_RATIO,
    STRAGGLER_INPUT_RATIO,
    STRAGGLER_MIN_SHARE_PCT,
    find_straggler,
)
from gpuwatch.runstate import WARMUP_STEPS, RunState, WorkerSummary, step_figures
from tests.runstate.test_runstate_workers import cluster_run


def worker(index: int, *, step_ms: float | None = 100.0, wait_pct: float | None = 3.0,
           compute_ms: float | None = 12.0, measured: int = 20, **extra: Any) -> WorkerSummary:
    fields: dict[str, Any] = {
        "worker": index, "host": f"host-{index}", "replicas": 1, "status": "running",
        "last_step": 40, "measured_steps": measured, "step_time_ms": step_ms,
        "input_wait_pct": wait_pct,
        "input_wait_ms": None if wait_pct is None or step_ms is None else wait_pct * step_ms / 100,
        "compute_ms": compute_ms, "examples_per_s": 1000.0, "sample": None,
    }
    fields.update(extra)
    return WorkerSummary(**fields)


def test_input_bound_worker_is_named_with_its_wait_and_the_others():
    found = find_straggler([worker(0), worker(1, wait_pct=38.0), worker(2)])
    assert found is not None
    assert (found.worker, found.cause) == (1, "input-bound")
    assert found.message == (
        "worker 1 (host-1) is the straggler: input-bound (input wait 38% vs 3% on the others)"
    )
    assert found.extra_ms == pytest.approx(35.0)


def test_slow_devices_worker_is_named_with_its_compute():
    found = find_straggler([worker(0, compute_ms=12.0), worker(1, compute_ms=41.0)])
    assert found is not None
    assert (found.worker, found.cause) == (1, "slow devices")
    assert found.message.endswith("slow devices (compute 41 ms vs 12 ms on the others)")


def test_equal_workers_have_no_straggler():
    assert find_straggler([worker(i) for i in range(4)]) is None


def test_one_worker_has_no_straggler():
    assert find_straggler([worker(0, wait_pct=60.0)]) is None


def test_a_worker_with_no_steps_yet_is_left_out():
    waiting = worker(1, step_ms=None, wait_pct=None, compute_ms=None, measured=0)
    assert find_straggler([worker(0), waiting]) is None
    found = find_straggler([worker(0), waiting, worker(2, wait_pct=30.0)])
    assert found is not None and found.worker == 2


def test_missing_compute_ms_only_skips_the_compute_rule():
    no_compute = [worker(0, compute_ms=None), worker(1, compute_ms=None)]
    assert find_straggler(no_compute) is None
    # One worker reports compute and the other does not: nothing to compare.
    assert find_straggler([worker(0, compute_ms=None), worker(1, compute_ms=90.0)]) is None
    found = find_straggler([worker(0, compute_ms=None), worker(1, wait_pct=40.0, compute_ms=None)])
    assert found is not None and found.cause == "input-bound"


def test_input_margin_edges():
    share = STRAGGLER_MIN_SHARE_PCT
    # Extra wait just under the share of a step: noise.
    assert find_straggler([worker(0, wait_pct=3.0), worker(1, wait_pct=3.0 + share - 0.1)]) is None
    assert find_straggler([worker(0, wait_pct=3.0), worker(1, wait_pct=3.0 + share)]) is not None
    # Everyone input-bound alike (ratio under STRAGGLER_INPUT_RATIO): no one to blame.
    high = 30.0 * STRAGGLER_INPUT_RATIO - 1.0
    assert find_straggler([worker(0, wait_pct=30.0), worker(1, wait_pct=high)]) is None
    found = find_straggler([worker(0, wait_pct=30.0), worker(1, wait_pct=30.0 * 1.5)])
    assert found is not None and found.worker == 1


def test_compute_margin_edges():
    # 100 ms steps: 5 ms extra is the least that counts; the ratio must hold too.
    assert find_straggler([worker(0, compute_ms=20.0), worker(1, compute_ms=24.9)]) is None
    ratio_edge = 20.0 * STRAGGLER_COMPUTE_RATIO
    found = find_straggler([worker(0, compute_ms=20.0), worker(1, compute_ms=ratio_edge)])
    assert found is not None and found.cause == "slow devices"
    # 5 ms more of 60 ms compute is under the ratio: none.
    assert find_straggler([worker(0, compute_ms=60.0), worker(1, compute_ms=70.0)]) is None


def test_larger_extra_time_wins_when_both_rules_name_someone():
    found = find_straggler([
        worker(0), worker(1, wait_pct=13.0), worker(2, compute_ms=60.0),
    ])
    assert found is not None and (found.worker, found.cause) == (2, "slow devices")


def test_ground_truth_from_frames_input_bound_and_slow_devices_and_none():
    cases = {
        "input": ({0: (200.0, 6.0, 40.0), 1: (200.0, 76.0, 41.0)}, (1, "input-bound")),
        "compute": ({0: (200.0, 6.0, 40.0), 1: (200.0, 6.0, 120.0)}, (1, "slow devices")),
        "equal": ({0: (200.0, 6.0, 40.0), 1: (200.0, 6.0, 40.0)}, None),
    }
    for name, (per_worker, expected) in cases.items():
        state = RunState()
        state.apply_many(cluster_run(2, WARMUP_STEPS + 10, per_worker).frames)
        found = find_straggler(state.worker_summaries())
        got = None if found is None else (found.worker, found.cause)
        assert got == expected, name


def test_advice_puts_the_straggler_first_and_drops_the_input_keeps_up():
    from gpuwatch.advisor import advise

    state = RunState()
    state.apply_many(cluster_run(2, WARMUP_STEPS + 10,
                                 {0: (200.0, 6.0, 40.0), 1: (200.0, 76.0, 41.0)}).frames)
    settings = {"data": {"prefetch": True, "parallel_calls": "autotune"}}
    chief_only = advise(step_figures(state.recent_steps()), settings, None, 2)
    assert chief_only.level == "none" and "the input keeps up" in chief_only.recommendations[0]
    figures = state.figures()
    found = find_straggler(figures.workers)
    advice = advise(figures, settings, None, 2, found)
    # The run goes at the straggler's pace: the verdict is worker 1's, not the chief's,
    # and its figure is the figures' (the metrics line's): 76 ms of 200, 38 %.
    assert advice.level == "high" and advice.verdict.startswith("highly input-bound on worker 1")
    assert advice.input_wait_pct == figures.input_wait_pct == pytest.approx(38.0)
    assert found is not None and found.value == figures.input_wait_pct
    assert len(advice.recommendations) <= 2
    assert advice.recommendations[0].startswith("worker 1 waits on input")
    assert not any("the input keeps up" in r for r in advice.recommendations)
