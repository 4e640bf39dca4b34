"""RunState fold: per-attempt figures against known inputs, dedupe, pending settings."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.config import apply_overrides
from gpuwatch.runstate import (
    PREFETCH_KEY,
    WARMUP_STEPS,
    AttemptSummary,
    RunState,
    SettingRefused,
    describe_pending,
    differing_settings,
    format_setting,
    pending_overrides,
    setting_labels,
    setting_text,
    step_accumulation,
    step_batch,
    toggle_prefetch,
)
from trainer_runtime import protocol
from trainer_runtime.protocol import STATUSES, TERMINAL_STATUSES
from trainer_runtime.schema import RunConfig

SETTINGS = {
    "name": "demo",
    "data": {"prefetch": False, "parallel_calls": 1},
    "train": {"global_batch_size": 256, "accumulation_steps": 1},
    "strategy": {"cpu_replicas": 2},
}


def step(seq: int, attempt: int, number: int, step_ms: float, wait_ms: float, **extra):
    return {
        "type": "step", "seq": seq, "t": 1000.0 + seq, "attempt": attempt, "step": number,
        "micro_step": number, "epoch": 0, "loss": 1.0, "lr": 1e-3, "examples": 256,
        "step_time_ms": step_ms, "input_wait_ms": wait_ms, "grad_sync_bytes": 1000.0, **extra,
    }


def test_input_wait_pct_is_ratio_of_sums_after_warmup():
    state = RunState()
    state.apply({"type": "attempt", "seq": 0, "attempt": 1, "settings": SETTINGS})
    events = []
    # Warm-up steps: huge, must not count.
    for i in range(WARMUP_STEPS):
        events.append(step(1 + i, 1, i + 1, 5000.0, 4000.0))
    # Measured: step times 100, 200, 300, 400 ms; waits 10, 20, 30, 140 ms.
    # ratio of sums = 200 / 1000 = 20.0 % exactly (mean of ratios would be 16.25 %).
    for j, (ms, wait) in enumerate([(100, 10), (200, 20), (300, 30), (400, 140)]):
        events.append(step(100 + j, 1, 10 + j, ms, wait))
    state.apply_many(events)
    summary = state.attempts[1]
    assert summary.steps_seen == WARMUP_STEPS + 4
    assert summary.measured_steps == 4
    assert summary.input_wait_pct == pytest.approx(20.0)
    # examples/s per step: 2560, 1280, 853.3, 640 -> median (1280 + 853.33) / 2
    assert summary.median_examples_per_s == pytest.approx((1280 + 256000 / 300) / 2)
    # 4 steps x 1000 bytes over 1.0 s
    assert summary.grad_sync_bytes_per_s == pytest.approx(4000.0)


def test_attempt_without_enough_steps_is_not_measured():
    state = RunState()
    state.apply_many(step(i, 1, i + 1, 100, 50) for i in range(WARMUP_STEPS))
    assert state.attempts[1].input_wait_pct is None
    assert state.attempts[1].median_examples_per_s is None


def test_replayed_seq_is_skipped_so_steps_are_not_counted_twice():
    state = RunState()
    first = [step(i, 1, i + 1, 100, 10) for i in range(20)]
    state.apply_many(first)
    # A reconnect that overlaps: seq 15..29
    state.apply_many([step(i, 1, i + 1, 100, 10) for i in range(15, 30)])
    assert state.attempts[1].steps_seen == 30
    assert state.duplicates_skipped == 5
    assert state.last_seq == 29
    assert state.last_step is not None and state.last_step.step == 30


def test_two_attempts_are_summarised_separately():
    state = RunState()
    seq = 0
    for attempt, wait in ((1, 40.0), (2, 4.0)):
        settings = {**SETTINGS, "data": {"prefetch": attempt == 2, "parallel_calls": 1}}
        state.apply({"type": "attempt", "seq": seq, "attempt": attempt, "settings": settings})
        seq += 1
        for i in range(WARMUP_STEPS + 10):
            state.apply(step(seq, attempt, 100 * attempt + i, 100.0, wait))
            seq += 1
    assert state.attempt == 2
    assert state.attempts[1].input_wait_pct == pytest.approx(40.0)
    assert state.attempts[2].input_wait_pct == pytest.approx(4.0)
    assert state.attempts[1].prefetch is False
    assert state.attempts[2].prefetch is True
    assert state.figures().input_wait_pct == pytest.approx(4.0)
    assert all(p.attempt == 2 for p in state.recent_steps())


def test_status_crashed_keeps_exit_code_and_log_tail():
    state = RunState()
    state.apply({"type": "attempt", "seq": 0, "attempt": 1, "settings": SETTINGS})
    state.apply({
        "type": "status", "seq": 1, "status": "crashed", "attempt": 1, "exit_code": 1,
        "signal": None, "message": "trainer exited with code 1",
        "log_tail": ["Traceback (most recent call last):", "ValueError: boom"],
    })
    assert state.status == "crashed" and state.terminal
    assert state.exit_code == 1
    assert state.log_tail[-1] == "ValueError: boom"
    assert state.attempts[1].end == "crashed"


@pytest.mark.parametrize("status", STATUSES)
def test_terminal_is_the_protocols_terminal_statuses(status: str):
    state = RunState()
    state.apply({"type": "status", "seq": 0, "status": status, "attempt": 1})
    assert state.terminal == (status in TERMINAL_STATUSES)
    assert state.failed == (status in ("crashed", "lost"))
    assert not state.failed or state.terminal


def test_changes_are_reported_once():
    state = RunState()
    state.take_changes()
    state.apply({"type": "sample", "seq": 0, "host": {"cpu_pct": 50.0}, "gpus": [], "nvml": "x"})
    assert state.take_changes() == {"devices"}
    assert state.take_changes() == set()


def test_toggle_prefetch_and_describe():
    pending = toggle_prefetch(SETTINGS, {})
    assert pending == {"data.prefetch": True}
    assert describe_pending(SETTINGS, pending) == "prefetch off→on"
    # Toggling back cancels the change entirely.
    assert toggle_prefetch(SETTINGS, pending) == {}
    autotune = {**SETTINGS, "data": {"prefetch": "autotune"}}
    assert toggle_prefetch(autotune, {}) == {"data.prefetch": False}


@pytest.mark.parametrize("value", [False, True, "autotune", 4])
def test_prefetch_as_shown_reads_back_as_the_same_setting(value):
    word = format_setting(PREFETCH_KEY, value)
    assert apply_overrides(RunConfig(), {PREFETCH_KEY: word}).data.prefetch == value


def test_accumulation_doubles_and_halves_with_divisibility():
    pending = step_accumulation(SETTINGS, {}, up=True, replicas=2)
    assert pending == {"train.accumulation_steps": 2}
    pending = toggle_prefetch(SETTINGS, pending)
    assert describe_pending(SETTINGS, pending) == "accumulation 1→2, prefetch off→on"
    with pytest.raises(SettingRefused, match="already 1"):
        step_accumulation(SETTINGS, {}, up=False, replicas=2)
    # 256 / (2 x 256) does not split: refused at accumulation 256.
    pending = {}
    for _ in range(7):
        pending = step_accumulation(SETTINGS, pending, up=True, replicas=2)
    assert pending["train.accumulation_steps"] == 128
    with pytest.raises(SettingRefused, match="less than replicas x accumulation_steps = 2 x 256"):
        step_accumulation(SETTINGS, pending, up=True, replicas=2)


def test_accumulation_refused_for_three_replicas():
    settings = {**SETTINGS, "train": {"global_batch_size": 96, "accumulation_steps": 1}}
    assert step_accumulation(settings, {}, up=True, replicas=3) == {"train.accumulation_steps": 2}
    settings = {**SETTINGS, "train": {"global_batch_size": 9, "accumulation_steps": 1}}
    with pytest.raises(SettingRefused):
        step_accumulation(settings, {}, up=True, replicas=3)


def test_batch_halves_until_it_cannot_split():
    assert step_batch(SETTINGS, {}, up=True, replicas=2) == {"train.global_batch_size": 512}
    pending: dict = {}
    for _ in range(7):
        pending = step_batch(SETTINGS, pending, up=False, replicas=2)
    assert pending == {"train.global_batch_size": 2}
    with pytest.raises(SettingRefused, match="a replica would get no example"):
        step_batch(SETTINGS, pending, up=False, replicas=2)


def test_batch_doubles_up_to_the_data_and_no_further():
    settings = {**SETTINGS, "data": {**SETTINGS["data"], "examples": 16384}}
    pending: dict = {}
    for _ in range(6):  # 256 -> 16384: every example once per update
        pending = step_batch(settings, pending, up=True, replicas=2)
    assert pending == {"train.global_batch_size": 16384}
    with pytest.raises(SettingRefused) as refused:
        step_batch(settings, pending, up=True, replicas=2)
    assert str(refused.value) == (
        "train.global_batch_size: 32768 is more than data.examples 16384: one update would "
        "need more examples than the data has"
    )


def test_every_bound_of_the_schema_refuses_a_pending_key():
    settings = {**SETTINGS, "data": {**SETTINGS["data"], "examples": 10_000_000}}
    pending = {"train.global_batch_size": 1 << 20}
    with pytest.raises(SettingRefused, match="must be at most 1048576"):
        step_batch(settings, pending, up=True, replicas=2)
    pending = {"train.accumulation_steps": 1024, "train.global_batch_size": 1 << 20}
    with pytest.raises(SettingRefused, match="accumulation_steps: must be at most 1024"):
        step_accumulation(settings, pending, up=True, replicas=2)


def test_pending_overrides_drop_values_equal_to_current():
    pending = {"data.prefetch": False, "train.global_batch_size": 512}
    assert pending_overrides(SETTINGS, pending) == {"train.global_batch_size": 512}


def test_warmup_steps_are_flagged_per_attempt():
    state = RunState()
    state.apply_many(step(i, 1, i + 1, 100, 10) for i in range(8))
    state.apply_many(step(8 + i, 2, 9 + i, 100, 10) for i in range(7))
    flags = [(p.attempt, p.warmup) for p in state.window]
    assert flags == [(1, True)] * 5 + [(1, False)] * 3 + [(2, True)] * 5 + [(2, False)] * 2


def test_recent_steps_are_the_last_measured_steps_of_the_current_attempt():
    rnd = random.Random(5)
    state = RunState()
    events, seq, number = [], 0, 0
    for attempt in (1, 2, 3):
        events.append({"type": "attempt", "seq": seq, "attempt": attempt, "settings": SETTINGS})
        seq += 1
        for _ in range(rnd.randint(1, 30)):
            number += 1
            events.append(step(seq, attempt, number, 100.0, 10.0))
            seq += 1
        if attempt == 3:  # a late step of an older attempt lands in the window too
            events.append(step(seq, 2, number, 100.0, 10.0))
            seq += 1
    state.apply_many(events)
    for count in (1, 5, 20, 500):
        want = [p for p in state.window if p.attempt == state.attempt and not p.warmup]
        assert state.recent_steps(count) == want[-count:]


_WIRE_FLOAT = st.floats(allow_nan=False, allow_infinity=False)  # what the wire accepts


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2**62),
            _WIRE_FLOAT, _WIRE_FLOAT, _WIRE_FLOAT,
        ),
        min_size=1,
        max_size=12,
    )
)
def test_every_figure_derived_from_accepted_steps_is_finite_or_none(steps) -> None:
    """Finite figures the wire accepts (a step of 1e-310 ms, 1e308 bytes) can make a rate
    no float holds: every derived rate and share is then None, never inf or NaN (the
    dashboard's sparklines and medians cannot take them)."""
    import math

    from trainer_runtime.protocol import Step, per_second

    state = RunState()
    for i, (examples, step_ms, wait_ms, sync_bytes) in enumerate(steps, start=1):
        event = Step(
            attempt=1, step=i, micro_step=i, epoch=0, loss=0.5, lr=0.1, examples=examples,
            step_time_ms=step_ms, input_wait_ms=wait_ms, grad_sync_bytes=sync_bytes,
        )
        assert event.examples_per_s is None or math.isfinite(event.examples_per_s)
        assert event.input_wait_pct is None or math.isfinite(event.input_wait_pct)
        frame = json.loads(protocol.encode_event(event, t=float(i), seq=i))
        state.apply(frame)
    now = state.figures()
    figures = [
        now.examples_per_s,
        now.step_time_ms,
        now.input_wait_pct,
        now.grad_sync_bytes_per_s,
        per_second(float(steps[0][3]), steps[0][1]),
    ]
    for summary in state.worker_summaries():
        figures += [summary.examples_per_s, summary.input_wait_pct]
    assert all(f is None or math.isfinite(f) for f in figures), figures


def test_differing_settings_are_every_key_that_differs_in_config_order():
    full = RunConfig.model_validate(SETTINGS).model_dump(mode="json")
    changed = json.loads(json.dumps(full))
    changed["data"].update(cache=True, parallel_calls=4, read_latency_ms=15.0)
    same = AttemptSummary(1, settings=full)
    live = AttemptSummary(2, settings=changed)
    unknown = AttemptSummary(3)  # no attempt event seen: nothing to compare
    keys = differing_settings([same, live, unknown])
    assert keys == ["data.read_latency_ms", "data.parallel_calls", "data.cache"]  # schema order
    assert differing_settings([same, AttemptSummary(4, settings=full), unknown]) == []
    assert differing_settings([live]) == []
    # Prefetch on (True: autotune) is not one batch of prefetch, though True == 1.
    one = json.loads(json.dumps(full))
    one["data"]["prefetch"], changed["data"]["prefetch"] = 1, True
    assert PREFETCH_KEY in differing_settings(
        [AttemptSummary(1, settings=one), AttemptSummary(2, settings=changed)]
    )
    # 40 and 40.0 ms are the same read latency.
    whole = json.loads(json.dumps(full))
    whole["data"]["read_latency_ms"], one["data"]["read_latency_ms"] = 40, 40.0
    assert "data.read_latency_ms" not in differing_settings(
        [AttemptSummary(1, settings=whole), AttemptSummary(2, settings=one)]
    )


def test_setting_labels_are_short_and_never_ambiguous():
    labels = setting_labels(["data.read_latency_ms", "data.cache", "model.name", "data.name"])
    assert labels == {
        "data.read_latency_ms": "read ms", "data.cache": "cache",
        "model.name": "model.name", "data.name": "data.name",
    }
    assert setting_labels(["train.seed"]) == {"train.seed": "seed"}
    assert setting_text("data.cache", True) == "on"
    assert setting_text("cluster.workers", [{"host": "a"}]) == '[{"host":"a"}]'


def running_with_steps(step_ms: float, count: int = WARMUP_STEPS + 10) -> RunState:
    """A running run whose steps (the step helper's: step i ends at t = 1000 + i) took step_ms."""
    state = RunState()
    state.apply({"type": "attempt", "seq": 0, "attempt": 1, "settings": SETTINGS})
    state.apply({"type": "status", "seq": 1, "status": "running", "attempt": 1})
    state.apply_many(step(2 + i, 1, i + 1, step_ms, 1.0) for i in range(count))
    return state


@pytest.mark.parametrize(
    ("step_ms", "stale_after_s"),
    [(200.0, 5.0), (2000.0, 10.0)],  # the 5 s floor; 5 x a 2 s step
)
def test_no_step_for_counts_once_several_step_times_passed(step_ms, stale_after_s):
    state = running_with_steps(step_ms)
    assert state.last_step is not None
    last_t = state.last_step.t
    assert last_t == 1000.0 + 2 + WARMUP_STEPS + 10 - 1
    assert state.figures().step_time_ms == step_ms
    assert state.no_step_for_s(last_t + stale_after_s - 0.1) is None
    assert state.no_step_for_s(last_t + stale_after_s) == pytest.approx(stale_after_s)
    assert state.no_step_for_s(last_t + 30.0) == pytest.approx(30.0)
    # A step arrives: the figures are current again.
    state.apply(step(100, 1, 99, step_ms, 1.0))
    assert state.no_step_for_s(1100.0 + 1.0) is None


def test_no_step_for_takes_the_last_steps_time_before_any_is_measured():
    state = running_with_steps(3000.0, count=2)  # warm-up only: no measured step time
    assert state.figures().step_time_ms is None
    last_t = 1000.0 + 3
    assert state.no_step_for_s(last_t + 14.9) is None  # 5 x 3 s
    assert state.no_step_for_s(last_t + 15.0) == pytest.approx(15.0)


@pytest.mark.parametrize(
    "status", ["starting", "stopping", "relaunching", *sorted(TERMINAL_STATUSES)])
def test_no_step_for_is_only_said_of_a_running_run(status):
    state = running_with_steps(200.0)
    state.apply({"type": "status", "seq": 500, "status": status, "attempt": 1})
    assert state.no_step_for_s(2000.0) is None
