"""measures/scaling.py: the probe's plan, each count's settings, and its table's arithmetic,
against figures worked out by hand from constructed runs; and the advisor's poor-scaling
verdict (advisor.poor_scaling) on them: on recorded noisy series (built here with fixed
seeds from distributions whose true efficiency is known), a verdict only when the
efficiency's interval is on one side of the line, else "not enough steps to tell".

The real probe (a supervisor, real trainers) is tests/integration/test_scale.py.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.advisor import POOR_SCALING_EFFICIENCY, poor_scaling
from gpuwatch.advisor.findings import interval_side
from gpuwatch.advisor.scaling_verdict import steps_to_tell
from gpuwatch.config import ConfigError, apply_overrides, load_config
from gpuwatch.measures.scaling import (
    MEDIAN_CONFIDENCE,
    MIN_INTERVAL_STEPS,
    MIN_STEPS,
    ScaleError,
    ScalingRow,
    default_counts,
    efficiency,
    efficiency_interval,
    make_plan,
    parse_counts,
    plan_configs,
    scaling_line,
    scaling_rows,
    speedup,
    table_lines,
)
from gpuwatch.measures.sketch import MedianSketch
from gpuwatch.runstate import WARMUP_STEPS, RunState
from gpuwatch.supervisor.exits import TrainerExit, exit_status
from tests.conftest import ROOT, TINY
from trainer_runtime.protocol import Breakdown, Scale
from trainer_runtime.schema import RunConfig

DEMO = load_config(ROOT / "demo" / "demo.yaml").config  # global batch 256, 2 CPU replicas
CLUSTER = apply_overrides(DEMO, {"cluster.workers": 4})


# ---- the arithmetic ------------------------------------------------------------------


def test_speedup_and_efficiency_by_hand() -> None:
    assert speedup(1800.0, 1000.0) == pytest.approx(1.8)
    assert efficiency(1800.0, 2, 1000.0, 1) == pytest.approx(0.9)  # 1800 / (2 x 1000)
    assert efficiency(1000.0, 1, 1000.0, 1) == pytest.approx(1.0)
    # From a base of 2: 4 devices at 3000 against 2 at 2000 is 3000 x 2 / (4 x 2000).
    assert efficiency(3000.0, 4, 2000.0, 2) == pytest.approx(0.75)
    assert speedup(None, 1000.0) is None and speedup(1000.0, None) is None
    assert speedup(1000.0, 0.0) is None and efficiency(None, 2, 1000.0, 1) is None


# ---- the plan ------------------------------------------------------------------------


def test_default_counts_are_powers_of_two_up_to_every_gpu_and_it() -> None:
    assert default_counts(DEMO, 0) == [1, 2]
    assert default_counts(DEMO, 1) == [1]
    assert default_counts(DEMO, 4) == [1, 2, 4]
    assert default_counts(DEMO, 6) == [1, 2, 4, 6]
    assert default_counts(DEMO, 8) == [1, 2, 4, 8]
    assert default_counts(CLUSTER, 0) == [1, 2, 4]  # a cluster's counts are its workers


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1,x", "'x' is not a count from 1"),
        ("0,1", "'0' is not a count from 1"),
        ("1,,2", "'' is not a count from 1"),
        ("-1", "'-1' is not a count from 1"),
    ],
)
def test_counts_that_do_not_parse_are_one_line_naming_the_option(text: str, words: str) -> None:
    with pytest.raises(ScaleError) as refused:
        parse_counts(text)
    assert str(refused.value) == f"--replicas {text}: {words} (give counts like 1,2,4)"


@pytest.mark.parametrize(
    ("config", "counts", "gpus", "words"),
    [
        (DEMO, [2, 1], 0, "give each count once, smallest first"),
        (DEMO, [1, 1], 0, "give each count once, smallest first"),
        (DEMO, [1, 65], 0, "at most 64 replicas"),
        (DEMO, [1, 2, 4], 2, "4 replicas asked for, but 2 GPUs are visible here"),
        (CLUSTER, [1, 8], 0, "8 workers asked for, but cluster.workers has 4"),
    ],
)
def test_counts_past_what_there_is_are_refused(
    config: RunConfig, counts: list[int], gpus: int, words: str
) -> None:
    with pytest.raises(ScaleError, match=words):
        make_plan(config, counts, "weak", 40, gpus)


def test_steps_must_leave_some_to_measure_after_warm_up() -> None:
    assert MIN_STEPS == WARMUP_STEPS + 5
    make_plan(DEMO, [1, 2], "weak", MIN_STEPS, 0)
    with pytest.raises(ScaleError, match=rf"--steps {MIN_STEPS - 1}: each count needs at least"):
        make_plan(DEMO, [1, 2], "weak", MIN_STEPS - 1, 0)
    with pytest.raises(ScaleError, match="--mode must be weak or strong"):
        make_plan(DEMO, [1, 2], "sideways", 40, 0)


def test_weak_scaling_keeps_the_per_replica_batch() -> None:
    plan = make_plan(DEMO, [1, 2, 4], "weak", 30, 0)
    configs = plan_configs(DEMO, plan, 0)
    # The demo: 256 over its 2 CPU replicas = 128 per replica, kept at every count.
    assert [(n, c.strategy.replicas, c.train.global_batch_size) for n, c in configs] == [
        (1, 1, 128), (2, 2, 256), (4, 4, 512)]
    assert all(c.train.max_steps == 30 and c.train.epochs is None for _, c in configs)
    # Nothing else changes: the same job.
    for _, config in configs:
        assert config.model == DEMO.model and config.data == DEMO.data


def test_weak_scaling_with_accumulation_keeps_the_micro_batch_per_replica() -> None:
    base = apply_overrides(DEMO, {"train.accumulation_steps": 2})  # 256 / (2 x 2) = 64
    configs = plan_configs(base, make_plan(base, [1, 2], "weak", 20, 0), 0)
    assert [c.train.global_batch_size for _, c in configs] == [128, 256]


def test_strong_scaling_keeps_the_global_batch_and_says_when_it_does_not_split() -> None:
    configs = plan_configs(DEMO, make_plan(DEMO, [1, 2, 4], "strong", 20, 0), 0)
    assert [c.train.global_batch_size for _, c in configs] == [256, 256, 256]
    with pytest.raises(ConfigError) as refused:
        plan_configs(DEMO, make_plan(DEMO, [1, 3], "strong", 20, 0), 0)
    assert str(refused.value) == (
        "scale at 3 replicas (strong: the global batch 256 kept): train.global_batch_size 256 "
        "is not divisible by replicas x accumulation_steps = 3 x 1 = 3"
    )


def test_weak_scaling_past_the_data_names_the_count_and_the_key() -> None:
    small = apply_overrides(DEMO, {"data.examples": 512})
    with pytest.raises(ConfigError) as refused:
        plan_configs(small, make_plan(small, [1, 2, 8], "weak", 20, 0), 0)
    message = str(refused.value)
    assert message.startswith("scale at 8 replicas (weak: 128 examples per replica kept): ")
    assert "train.global_batch_size: 1024 is more than data.examples 512" in message


def test_on_gpus_a_count_past_the_visible_ones_is_refused_naming_strategy_replicas() -> None:
    plan = Scale(counts=[1, 4], unit="replicas", mode="weak", steps=20)  # made past make_plan
    with pytest.raises(ConfigError) as refused:
        plan_configs(DEMO, plan, 2)
    assert "strategy.replicas: 4 GPUs asked for, but 2 are visible" in str(refused.value)


def test_a_cluster_scales_over_its_first_workers() -> None:
    ported = apply_overrides(CLUSTER, {"cluster.ports": [7001, 7002, 7003, 7004]})
    configs = plan_configs(ported, make_plan(ported, [1, 2, 4], "weak", 20, 0), 0)
    assert [(c.cluster.count, c.cluster.ports) for _, c in configs if c.cluster] == [
        (1, [7001]), (2, [7001, 7002]), (4, [7001, 7002, 7003, 7004])]
    # One CPU replica per worker: 256 over 4 workers = 64 per replica, kept.
    assert [c.train.global_batch_size for _, c in configs] == [64, 128, 256]
    assert all(c.strategy.replicas is None for _, c in configs)


# ---- the table, from a constructed run -----------------------------------------------


def _settings(replicas: int, batch: int) -> dict[str, Any]:
    config = apply_overrides(RunConfig(), {"strategy.replicas": replicas,
                                           "train.global_batch_size": batch})
    return config.model_dump(mode="json")


def _step(attempt: int, step: int, batch: int, step_ms: float,
          parts: tuple[float, float, float, float] | None) -> dict[str, Any]:
    timed: dict[str, Any] = {}
    if parts is not None:
        timed = dict(zip(("input_wait_ms", "compute_ms", "sync_ms", "update_ms"), parts,
                         strict=True))
    return {"type": "step", "attempt": attempt, "step": step, "micro_step": step, "epoch": 0,
            "loss": 1.0, "lr": 1e-3, "examples": batch, "step_time_ms": step_ms,
            "input_wait_ms": 0.0, "grad_sync_bytes": 1000.0, **timed}


def probe_run(
    counts: list[int], step_ms: Mapping[int, float | Sequence[float]], *, cores: int = 8,
    kind: str = "cpu", parts: dict[int, tuple[float, float, float, float]] | None = None,
    crash_at: int | None = None, per_replica: int = 64, mode: str = "weak",
) -> RunState:
    """A probe's record folded: at count n, WARMUP_STEPS slow steps then 10 of step_ms[n]
    (or, for a series, one measured step per time in it). Weak: per_replica examples per
    replica; strong: per_replica x the first count, kept."""
    events: list[dict[str, Any]] = [
        {"type": "run", "run_id": "r", "config_path": "c", "supervisor_pid": 1, "host": "h",
         "settings": _settings(1, per_replica)},
        {"type": "scale", "counts": counts, "unit": "replicas", "mode": mode, "steps": 15,
         "cores": cores},
    ]
    for attempt, count in enumerate(counts, 1):
        batch = per_replica * (count if mode == "weak" else counts[0])
        events.append({"type": "attempt", "attempt": attempt, "settings": _settings(count, batch),
                       "fresh": True, "reason": "scale"})
        events.append({"type": "hello", "attempt": attempt, "pid": 10 + attempt, "tf_version": "x",
                       "replicas": count, "device_kind": kind, "devices": [], "param_count": 1,
                       "param_bytes": 4, "global_batch_size": batch, "accumulation_steps": 1,
                       "per_replica_batch": batch // count, "start_step": 0,
                       "start_micro_step": 0})
        for step in range(1, WARMUP_STEPS + 1):  # tracing: slow, and never measured
            events.append(_step(attempt, step, batch, 500.0, None))
        if count == crash_at:
            events.append({"type": "status", "attempt": attempt, "status": "crashed",
                           "message": "boom"})
            break
        given = step_ms[count]
        series = [given] * 10 if isinstance(given, float | int) else list(given)
        for step, ms in enumerate(series, WARMUP_STEPS + 1):
            events.append(_step(attempt, step, batch, ms, (parts or {}).get(count)))
        events.append({"type": "done", "attempt": attempt, "reason": "max_steps",
                       "step": WARMUP_STEPS + len(series)})
        last = attempt == len(counts)
        events.append({"type": "status", "attempt": attempt,
                       "status": "finished" if last else "relaunching"})
    state = RunState()
    for seq, event in enumerate(events):
        state.apply({"v": 1, "seq": seq, "t": 1000.0 + seq, **event})
    assert state.bad_events == 0
    return state


def test_rows_are_each_counts_median_after_warm_up_and_the_ratios_against_one() -> None:
    # 64 examples per replica: 1 replica 64 ex / 10 ms = 6400 ex/s; 2 replicas 128 ex /
    # 16 ms = 8000 ex/s; 4 replicas 256 ex / 40 ms = 6400 ex/s.
    state = probe_run([1, 2, 4], {1: 10.0, 2: 16.0, 4: 40.0})
    rows = scaling_rows(state)
    assert [(r.count, r.state, r.attempt, r.global_batch_size, r.measured_steps) for r in rows] == [
        (1, "measured", 1, 64, 10), (2, "measured", 2, 128, 10), (4, "measured", 3, 256, 10)]
    assert [r.examples_per_s for r in rows] == pytest.approx([6400.0, 8000.0, 6400.0])
    assert [r.speedup for r in rows] == pytest.approx([1.0, 1.25, 1.0])
    assert [r.efficiency for r in rows] == pytest.approx([1.0, 0.625, 0.25])
    assert scaling_line(state.scale, rows) == (  # type: ignore[arg-type]
        "scaling: replicas=1,2,4 examples_per_s=6400.0,8000.0,6400.0 "
        "speedup=1.00,1.25,1.00 efficiency=1.00,0.62,0.25 "
        "efficiency_interval=1.00-1.00,0.62-0.62,0.25-0.25 mode=weak"
    )
    assert all(r.breakdown is None and r.shares is None for r in rows)
    assert "'-' until the trainer times" in table_lines(state.scale, rows)[-1]  # type: ignore[arg-type]


def test_the_step_breakdown_of_each_count_is_its_measured_steps_together() -> None:
    parts = {1: (1.0, 7.0, 1.0, 1.0), 2: (1.0, 7.0, 7.0, 1.0)}  # (input, compute, sync, update)
    state = probe_run([1, 2], {1: 10.0, 2: 16.0}, parts=parts)
    one, two = scaling_rows(state)
    assert one.breakdown == Breakdown(100.0, 10.0, 70.0, 10.0, 10.0)
    assert one.shares == pytest.approx({"input": 10, "compute": 70, "sync": 10, "update": 10,
                                        "other": 0})
    assert two.shares == pytest.approx({"input": 6.25, "compute": 43.75, "sync": 43.75,
                                        "update": 6.25, "other": 0})
    lines = table_lines(state.scale, [one, two])  # type: ignore[arg-type]
    assert lines[2].split()[6:11] == ["6%", "44%", "44%", "6%", "0%"]


def test_a_crashed_count_ends_the_probe_and_the_rest_did_not_run() -> None:
    state = probe_run([1, 2, 4], {1: 10.0, 2: 16.0, 4: 40.0}, crash_at=2)
    rows = scaling_rows(state)
    assert [(r.count, r.state) for r in rows] == [(1, "measured"), (2, "crashed"),
                                                  (4, "not run")]
    assert rows[1].examples_per_s is None and rows[1].efficiency is None
    assert scaling_line(state.scale, rows).endswith(  # type: ignore[arg-type]
        "examples_per_s=6400.0,n/a,n/a speedup=1.00,n/a,n/a efficiency=1.00,n/a,n/a "
        "efficiency_interval=1.00-1.00,n/a,n/a mode=weak")


def test_logical_cpu_replicas_beyond_the_cores_are_marked_as_sharing_them() -> None:
    state = probe_run([1, 2, 4], {1: 10.0, 2: 16.0, 4: 40.0}, cores=2)
    rows = scaling_rows(state)
    assert [r.shares_cores for r in rows] == [False, False, True]
    lines = table_lines(state.scale, rows)  # type: ignore[arg-type]
    assert lines[3].split()[0] == "4*"
    assert lines[4] == ("* 4 logical CPU replicas share 2 cores: more replicas than cores is "
                        "not a real scaling measure")
    gpu = probe_run([1, 2, 4], {1: 10.0, 2: 16.0, 4: 40.0}, cores=2, kind="gpu")
    assert not any(r.shares_cores for r in scaling_rows(gpu))


def test_an_attempt_that_reached_its_steps_keeps_that_end_through_the_next_one() -> None:
    state = probe_run([1, 2], {1: 10.0, 2: 16.0})
    assert [s.end for s in state.attempts.values()] == ["max_steps", "max_steps"]


def test_a_run_that_is_not_a_probe_has_no_rows() -> None:
    assert scaling_rows(RunState()) == []


def test_between_counts_the_run_is_relaunching_not_finished() -> None:
    reached = TrainerExit(0, done_reason="max_steps")
    assert exit_status(reached, relaunching=False, stop_requested=False)[0] == "finished"
    status, fields = exit_status(reached, relaunching=False, stop_requested=False,
                                 next_follows=True)
    assert status == "relaunching" and fields["message"].endswith("the next attempt follows")
    crashed = TrainerExit(1)
    assert exit_status(crashed, relaunching=False, stop_requested=False,
                       next_follows=True)[0] == "crashed"
    assert exit_status(TrainerExit(0, done_reason="sigterm"), relaunching=False,
                       stop_requested=True, next_follows=True)[0] == "stopped"


# ---- the advisor's verdict --------------------------------------------------------------


def test_poor_scaling_names_the_all_reduce_when_it_grew_most() -> None:
    # 1 replica: 10 ms (7 compute); 2 replicas: 16 ms, the all-reduce 1 -> 7 ms.
    parts = {1: (1.0, 7.0, 1.0, 1.0), 2: (1.0, 7.0, 7.0, 1.0)}
    state = probe_run([1, 2], {1: 10.0, 2: 16.0}, parts=parts)
    advice = poor_scaling(scaling_rows(state), state.scale)  # type: ignore[arg-type]
    assert advice is not None and advice.level == "poor"
    assert advice.verdict == ("poor scaling: 62% (62-62%) efficiency at 2 replicas (below 80%); "
                              "all-reduce grew most: 10% of the step at 1 to 44% at 2")
    assert advice.recommendations[0].startswith("the all-reduce grew with the devices: "
                                                "accumulation (a) syncs once per k micro-steps")
    assert [(r.key, r.setting) for r in advice.remedies] == [
        ("a", "train.accumulation_steps"), ("b", "train.global_batch_size")]
    assert advice.bottleneck == "scaling" and advice.share_pct == pytest.approx(62.5)


def test_poor_scaling_names_the_input_when_it_grew_most() -> None:
    parts = {1: (1.0, 7.0, 1.0, 1.0), 2: (7.0, 7.0, 1.0, 1.0)}
    state = probe_run([1, 2], {1: 10.0, 2: 16.0}, parts=parts)
    advice = poor_scaling(scaling_rows(state), state.scale)  # type: ignore[arg-type]
    assert advice is not None and "input wait grew most" in advice.verdict
    assert "prefetch (p)" in advice.recommendations[0] and advice.remedies[0].key == "p"


def test_strong_scaling_blames_the_part_that_did_not_shrink() -> None:
    # Strong: 128 examples per step at both counts. 1 replica 20 ms (16 compute, 2 sync):
    # 6400 ex/s; 2 replicas 14 ms, compute halved to 8, the all-reduce 2 -> 4: 9143 ex/s,
    # efficiency 9143 / (2 x 6400) = 71%. Per example and device compute stayed at 125 us,
    # the all-reduce went from 15.6 to 62.5 us: it is what grew.
    parts = {1: (1.0, 16.0, 2.0, 1.0), 2: (1.0, 8.0, 4.0, 1.0)}
    state = probe_run([1, 2], {1: 20.0, 2: 14.0}, parts=parts, mode="strong", per_replica=128)
    rows = scaling_rows(state)
    assert [r.global_batch_size for r in rows] == [128, 128]
    assert rows[1].efficiency == pytest.approx(20.0 / (2 * 14.0))
    advice = poor_scaling(rows, state.scale)  # type: ignore[arg-type]
    assert advice is not None
    assert advice.verdict == ("poor scaling: 71% (71-71%) efficiency at 2 replicas (below 80%); "
                              "all-reduce grew most: 10% of the step at 1 to 29% at 2")


def test_good_scaling_and_too_few_counts() -> None:
    state = probe_run([1, 2], {1: 10.0, 2: 10.5})  # 95%
    advice = poor_scaling(scaling_rows(state), state.scale)  # type: ignore[arg-type]
    assert advice is not None and advice.level == "good"
    assert advice.verdict == "scales well: 95% (95-95%) efficiency at 2 replicas (at least 80%)"
    one = probe_run([1], {1: 10.0})
    assert poor_scaling(scaling_rows(one), one.scale) is None  # type: ignore[arg-type]
    assert POOR_SCALING_EFFICIENCY == 0.80


def test_replicas_sharing_cores_are_said_first() -> None:
    state = probe_run([1, 2, 4], {1: 10.0, 2: 16.0, 4: 40.0}, cores=2)
    advice = poor_scaling(scaling_rows(state), state.scale)  # type: ignore[arg-type]
    assert advice is not None and advice.verdict.startswith(
        "poor scaling: 25% (25-25%) efficiency at 4")
    assert advice.recommendations[0].startswith("4 replicas share 2 cores: not a real scaling")
    assert "not timed apart" in advice.recommendations[1]


def test_rows_of_a_failed_count_are_left_out_of_the_verdict() -> None:
    rows = [ScalingRow(1, examples_per_s=1000.0, speedup=1.0, efficiency=1.0),
            ScalingRow(2, state="crashed")]
    assert poor_scaling(rows, Scale(counts=[1, 2], steps=20)) is None


def test_tiny_yaml_loads_as_the_e2e_tests_use_it() -> None:
    assert load_config(TINY).config.train.global_batch_size == 64


def test_export_scaling_is_the_tables_rows_with_the_steps_parts_by_hand() -> None:
    # The dashboard's fixture: 1, 2 and 4 replicas on 2 cores, the last still running; its
    # parts are constant after warm-up (jitter only on the step and compute, in pairs).
    import csv
    import io

    from gpuwatch.runs.export import SCALING_COLUMNS, export_events

    out = io.StringIO()
    report = export_events(ROOT / "tests" / "app" / "data" / "cpu_scale.jsonl", "scaling",
                           "csv", out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert report.rows == 3 and list(rows[0]) == list(SCALING_COLUMNS)
    assert [(r["count"], r["state"], r["global_batch_size"], r["shares_cores"]) for r in rows] == [
        ("1", "measured", "128", "false"), ("2", "measured", "256", "false"),
        ("4", "running", "512", "true")]
    # 2 replicas: 50 ms steps of which input 5, all-reduce 8, update 3 ms.
    two = rows[1]
    assert float(two["input_wait_pct"]) == pytest.approx(10.0)
    assert float(two["sync_pct"]) == pytest.approx(16.0)
    assert float(two["update_pct"]) == pytest.approx(6.0)
    assert float(rows[2]["sync_pct"]) == pytest.approx(100 * 35 / 90)
    assert float(two["efficiency"]) == pytest.approx(
        float(two["examples_per_s"]) / (2 * float(rows[0]["examples_per_s"])))
    assert {r["mode"] for r in rows} == {"weak"} and {r["cores"] for r in rows} == {"2"}


# ---- the interval, and a verdict only on one side of the line ---------------------------

# A recorded noisy series: each step's time drawn (fixed seed) from a log-normal whose median
# is `median_ms`, so the median examples/s is examples x 1000 / median_ms exactly and the
# true efficiency of 2 replicas against 1 (64 examples per replica) is median_1 / median_2.


def noisy_ms(seed: int, median_ms: float, spread: float, steps: int) -> list[float]:
    rng = random.Random(seed)
    return [median_ms * math.exp(rng.gauss(0.0, spread)) for _ in range(steps)]


def noisy_probe(seed: int, median_2_ms: float, spread: float, steps: int = 30) -> RunState:
    """1 replica at a median 10 ms a step, 2 replicas at `median_2_ms`: true efficiency
    10 / median_2_ms."""
    return probe_run([1, 2], {1: noisy_ms(seed, 10.0, spread, steps),
                              2: noisy_ms(seed + 1, median_2_ms, spread, steps)})


def verdict_of(state: RunState) -> Any:
    advice = poor_scaling(scaling_rows(state), state.scale)  # type: ignore[arg-type]
    assert advice is not None
    return advice


def test_a_clearly_good_series_scales_well_with_its_interval_above_the_line() -> None:
    state = noisy_probe(seed=1, median_2_ms=10.5, spread=0.03)  # true efficiency 95 %
    two = scaling_rows(state)[1]
    assert two.efficiency_interval is not None
    low, high = two.efficiency_interval
    assert POOR_SCALING_EFFICIENCY <= low <= two.efficiency <= high  # type: ignore[operator]
    advice = verdict_of(state)
    assert advice.level == "good"
    assert advice.verdict == (f"scales well: {100 * two.efficiency:.0f}% "  # type: ignore[operator]
                              f"({100 * low:.0f}-{100 * high:.0f}%) efficiency at 2 replicas "
                              "(at least 80%)")


def test_a_clearly_poor_series_is_poor_scaling_with_its_interval_below_the_line() -> None:
    state = noisy_probe(seed=2, median_2_ms=16.0, spread=0.03)  # true efficiency 62.5 %
    two = scaling_rows(state)[1]
    assert two.efficiency_interval is not None
    assert two.efficiency_interval[1] < POOR_SCALING_EFFICIENCY
    advice = verdict_of(state)
    assert advice.level == "poor"
    assert re.match(r"poor scaling: 6\d% \(\d\d-\d\d%\) efficiency at 2 replicas \(below 80%\)",
                    advice.verdict), advice.verdict


def test_a_noisy_series_whose_interval_straddles_the_line_says_it_cannot_tell() -> None:
    # The case: the same job, its efficiency read 78 %, 84 %, 56 % on three runs.
    # Here it is truly 80 % and each step is noisy (a spread of 30 %): the point estimates
    # of identical runs fall on both sides of the line, and a verdict on them would flip.
    states = [noisy_probe(seed, median_2_ms=12.5, spread=0.3, steps=30)
              for seed in range(100, 160, 2)]
    points = [scaling_rows(state)[1].efficiency or 0.0 for state in states]
    assert min(points) < POOR_SCALING_EFFICIENCY <= max(points)
    levels = [verdict_of(state).level for state in states]
    assert "good" not in levels or "poor" not in levels  # identical runs never contradict
    assert levels.count("unknown") >= len(levels) * 0.9, levels
    for state, level in zip(states, levels, strict=True):
        if level != "unknown":
            continue
        two = scaling_rows(state)[1]
        low, high = two.efficiency_interval or (0.0, 0.0)
        advice = verdict_of(state)
        assert advice.verdict == (
            f"not enough steps to tell ({100 * low:.0f}-{100 * high:.0f}%): "
            f"{two.efficiency:.0%} efficiency at 2 replicas, its 95% interval across the "
            "80% line")
        assert low < POOR_SCALING_EFFICIENCY <= high
        more = advice.recommendations[-1]
        assert "--steps" in more or "sit on the 80% line" in more, more


def test_the_interval_holds_the_true_efficiency_of_a_series_built_with_it() -> None:
    # The rows' arithmetic over 200 recorded runs of known truth: it holds the true value
    # in at least 95 % of them (the seeds are fixed, so this count is too: all 200; the
    # two counts' worst ends together make it wider than 95 % needs).
    truth = 10.0 / 12.5
    held = 0
    for seed in range(200):
        one, two = noisy_ms(seed, 10.0, 0.2, 25), noisy_ms(10_000 + seed, 12.5, 0.2, 25)
        sketches = {}
        for count, series in ((1, one), (2, two)):
            sketch = sketches[count] = MedianSketch()
            for ms in series:
                sketch.add(64 * count * 1000.0 / ms)
        interval = efficiency_interval(sketches[2].median_interval(MEDIAN_CONFIDENCE), 2,
                                       sketches[1].median_interval(MEDIAN_CONFIDENCE), 1)
        assert interval is not None
        held += interval[0] <= truth <= interval[1]
    assert held >= 0.95 * 200, held
    # And through the fold, one such run: the row's interval holds it.
    two_row = scaling_rows(noisy_probe(seed=7, median_2_ms=12.5, spread=0.2))[1]
    assert two_row.efficiency_interval is not None
    assert two_row.efficiency_interval[0] <= truth <= two_row.efficiency_interval[1]


def test_too_few_steps_for_an_interval_is_not_enough_to_tell() -> None:
    assert MIN_INTERVAL_STEPS == 7  # 2 x 2**-6 <= 2.5 % < 2 x 2**-5
    state = probe_run([1, 2], {1: [10.0] * 6, 2: [20.0] * 6})  # clearly 50 %, but 6 steps
    two = scaling_rows(state)[1]
    assert two.efficiency == pytest.approx(0.5) and two.efficiency_interval is None
    advice = verdict_of(state)
    assert advice.level == "unknown"
    assert advice.verdict == ("not enough steps to tell (an interval needs 7 measured steps "
                              "a count): 50% efficiency at 2 replicas")


def test_a_verdict_names_the_count_that_is_clearly_poor_even_if_another_is_unsure() -> None:
    # 2 replicas truly 80 % and noisy (unsure); 4 replicas clearly 40 %: poor at 4.
    state = probe_run([1, 2, 4], {1: noisy_ms(3, 10.0, 0.02, 30),
                                  2: noisy_ms(4, 12.5, 0.3, 30),
                                  4: noisy_ms(5, 25.0, 0.02, 30)})
    rows = scaling_rows(state)
    assert interval_side(rows[1].efficiency_interval, POOR_SCALING_EFFICIENCY) is None
    advice = verdict_of(state)
    assert advice.level == "poor" and " efficiency at 4 replicas (below 80%)" in advice.verdict


def test_more_steps_as_the_verdict_suggests_mostly_do_tell() -> None:
    # Truly 70 %, noisy: 30 steps cannot tell; rerun (new seeds) at the steps suggested,
    # most such probes can. An estimate from noisy figures, so most, not all.
    unsure = told = 0
    for seed in range(20, 60):
        state = noisy_probe(seed, median_2_ms=10.0 / 0.7, spread=0.3, steps=30)
        rows = scaling_rows(state)
        advice = verdict_of(state)
        if advice.level != "unknown":
            continue
        steps = steps_to_tell(rows[1], rows[0])
        if steps is None or steps > 3000:  # a figure near the line: a long run to tell
            continue
        assert steps > 30 + WARMUP_STEPS
        assert f"--steps {steps} (now 15) might tell" in advice.recommendations[-1]
        unsure += 1
        longer = noisy_probe(seed + 1000, median_2_ms=10.0 / 0.7, spread=0.3,
                             steps=steps - WARMUP_STEPS)
        told += verdict_of(longer).level != "unknown"
    assert unsure >= 20 and told >= 0.7 * unsure, (told, unsure)


def test_the_interval_side_rule() -> None:
    assert interval_side((0.80, 0.90), 0.80) == "above"  # at the line is at least it
    assert interval_side((0.60, 0.79), 0.80) == "below"
    assert interval_side((0.70, 0.86), 0.80) is None
    assert interval_side((0.70, 0.80), 0.80) is None
    assert interval_side(None, 0.80) is None


def test_the_table_and_the_line_show_each_efficiency_with_its_interval() -> None:
    state = noisy_probe(seed=2, median_2_ms=16.0, spread=0.03)
    rows = scaling_rows(state)
    low, high = rows[1].efficiency_interval or (0.0, 0.0)
    lines = table_lines(state.scale, rows)  # type: ignore[arg-type]
    assert "effic. (95% CI)" in lines[0]
    assert f"{100 * rows[1].efficiency:.0f}% ({100 * low:.0f}-{100 * high:.0f}%)" in lines[2]  # type: ignore[operator]
    assert "100% (100-100%)" in lines[1]
    assert f" efficiency_interval=1.00-1.00,{low:.2f}-{high:.2f} mode=weak" in scaling_line(
        state.scale, rows)  # type: ignore[arg-type]


_series = st.lists(st.floats(min_value=1.0, max_value=1000.0, allow_nan=False), min_size=1,
                   max_size=40)


@given(one=_series, two=_series, four=_series)
def test_the_verdict_never_contradicts_its_interval(
    one: list[float], two: list[float], four: list[float]
) -> None:
    state = probe_run([1, 2, 4], {1: one, 2: two, 4: four})
    rows = scaling_rows(state)
    for row in rows:
        if row.efficiency is not None and row.efficiency_interval is not None:
            low, high = row.efficiency_interval
            assert low <= row.efficiency <= high, row  # it always holds its own figure
    advice = poor_scaling(rows, state.scale)  # type: ignore[arg-type]
    assert advice is not None
    sides = [interval_side(row.efficiency_interval, POOR_SCALING_EFFICIENCY)
             for row in rows[1:]]
    named = next(row for row in rows[1:]
                 if f" efficiency at {row.count} replicas" in advice.verdict)
    side = interval_side(named.efficiency_interval, POOR_SCALING_EFFICIENCY)
    if advice.level == "good":
        assert sides == ["above", "above"] and advice.verdict.startswith("scales well: ")
    elif advice.level == "poor":
        assert side == "below" and advice.verdict.startswith("poor scaling: ")
    else:
        assert advice.level == "unknown" and side is None and "below" not in sides
        assert advice.verdict.startswith("not enough steps to tell (")
    if named.efficiency_interval is not None:  # the interval shown is the named count's
        low, high = named.efficiency_interval
        assert f"({100 * low:.0f}-{100 * high:.0f}%)" in advice.verdict


def test_headless_prints_the_interval_and_abstains_on_a_noisy_probe(tmp_path: Any) -> None:
    import io

    from gpuwatch.cli.headless import scale_ended
    from gpuwatch.runs.folders import RunInfo

    state = noisy_probe(seed=100, median_2_ms=12.5, spread=0.3)
    two = scaling_rows(state)[1]
    low, high = two.efficiency_interval or (0.0, 0.0)
    info = RunInfo(run_id="r", run_dir=tmp_path, name="h", status="finished", attempt=2,
                   step=35, examples_per_s=None, started=None, supervisor_pid=None,
                   socket_path=None, scale=state.scale)
    out, err = io.StringIO(), io.StringIO()
    assert scale_ended(info, state, 1, False, out, err) == 0
    lines = out.getvalue().splitlines()
    shown = f"{100 * two.efficiency:.0f}% ({100 * low:.0f}-{100 * high:.0f}%)"  # type: ignore[operator]
    assert any(line.startswith("       2 ") and shown in line for line in lines), lines
    assert any(line.startswith(f"gpuwatch: not enough steps to tell ({100 * low:.0f}-"
                               f"{100 * high:.0f}%): ") for line in lines), lines
    assert any(line.startswith("  - more steps narrow the interval") for line in lines)
    assert lines[-1].startswith("scaling: replicas=1,2 ") and (
        f"efficiency_interval=1.00-1.00,{low:.2f}-{high:.2f} mode=weak") in lines[-1]
