"""Snapshots of RunState: a snapshot of a prefix, folded on, is the fold of the whole.

fold(all) == from_snapshot(to_snapshot(fold(prefix))) + fold(rest), field for field
and on every figure the screen shows, for the recorded fixtures at every cut, for
random event sequences (hypothesis), and across the bounded median's switch from
exact values to bins. Plus the generic codec's own promises: formats, refusals.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.measures.sketch import EXACT_VALUES
from gpuwatch.runstate import AREAS, RunState, codec
from gpuwatch.runstate.codec import SnapshotError, snapshotted
from trainer_runtime.protocol import (
    STATUSES,
    Attempt,
    Checkpoint,
    Done,
    Error,
    Event,
    GpuSample,
    Hello,
    HostSample,
    Reconfigured,
    Resume,
    Run,
    Sample,
    StatusChange,
    Step,
    event_frame,
)

FIXTURES = sorted((Path(__file__).parent.parent / "app" / "data").glob("*.jsonl"))


def run_fields(state: RunState) -> dict[str, Any]:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if snapshotted(f)}


def figures(state: RunState) -> dict[str, Any]:
    """Every figure the panels read from the state (gpuwatch/app/widgets/)."""
    return {
        "recent_steps": state.recent_steps(),
        "figures": state.figures(),
        "workers": state.workers,
        "replicas": state.replicas,
        "worker_summaries": state.worker_summaries(),
        "terminal": state.terminal,
        "elapsed": state.elapsed_s(2e9),
        "attempts": [
            (
                a.attempt,
                a.median_examples_per_s,
                a.input_wait_pct,
                a.input_wait_worker,
                a.grad_sync_bytes_per_s,
                a.steps_seen,
                a.end,
                a.data_restarted,
                a.prefetch,
            )
            for a in state.attempts.values()
        ],
    }


def fold(frames: list[dict[str, Any]]) -> RunState:
    state = RunState()
    state.apply_many(frames)
    return state


def assert_snapshot_folds_on(frames: list[dict[str, Any]], cut: int) -> None:
    whole = fold(frames)
    restored = RunState.from_snapshot(fold(frames[:cut]).to_snapshot())
    restored.apply_many(frames[cut:])
    assert run_fields(restored) == run_fields(whole), f"cut at {cut}"
    assert figures(restored) == figures(whole), f"cut at {cut}"


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_a_snapshot_at_every_cut_of_a_recorded_run_folds_on_to_the_whole(path: Path) -> None:
    frames = load(path)
    for cut in range(len(frames) + 1):
        assert_snapshot_folds_on(frames, cut)


# ---- random event sequences -------------------------------------------------------

finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
attempts = st.sampled_from([1, 1, 1, 2, 3])
workers = st.integers(min_value=0, max_value=2)

steps = st.builds(
    Step,
    attempt=attempts,
    step=st.integers(0, 10**6),
    micro_step=st.integers(0, 9),
    epoch=st.integers(0, 9),
    loss=st.none() | finite,
    lr=finite,
    examples=st.integers(0, 512),
    step_time_ms=st.sampled_from([0.0, 5.0, 10.0, 12.5]) | finite,
    input_wait_ms=finite,
    grad_sync_bytes=finite,
    worker=st.sampled_from([0, 0, 0, 1, 2]),
    compute_ms=st.none() | finite,
    dropped=st.integers(0, 5),
)
others: st.SearchStrategy[Event] = st.one_of(
    st.builds(
        Sample,
        host=st.builds(HostSample, cpu_pct=finite),
        gpus=st.lists(st.builds(GpuSample, index=st.integers(0, 7), util_gpu_pct=finite),
                      max_size=2),
        nvml=st.none() | st.just("no NVML"),
        worker=workers,
    ),
    st.builds(
        StatusChange,
        attempt=attempts,
        status=st.sampled_from(STATUSES),
        message=st.none() | st.text(max_size=5),
        exit_code=st.none() | st.integers(0, 2),
        log_tail=st.lists(st.text(max_size=5), max_size=3),
        worker=st.none() | workers,
    ),
    st.builds(
        Attempt,
        attempt=attempts,
        reason=st.sampled_from(["start", "relaunch", "live"]),
        settings=st.fixed_dictionaries(
            {"data": st.fixed_dictionaries({"prefetch": st.booleans() | st.integers(1, 8)})}
        ),
    ),
    st.builds(
        Hello,
        attempt=attempts,
        pid=st.just(1),
        tf_version=st.just("2"),
        replicas=st.integers(1, 4),
        device_kind=st.sampled_from(["cpu", "gpu"]),
        devices=st.lists(st.just("GPU:0"), max_size=2),
        param_count=st.just(1),
        param_bytes=st.just(4),
        global_batch_size=st.just(64),
        accumulation_steps=st.just(1),
        per_replica_batch=st.just(32),
        start_step=st.just(0),
        start_micro_step=st.just(0),
        worker=workers,
        workers=st.integers(1, 3),
        host=st.sampled_from(["a", "b"]),
    ),
    st.builds(
        Done, attempt=attempts, reason=st.just("max_steps"), step=st.integers(0, 9), worker=workers
    ),
    st.builds(
        Error,
        attempt=attempts,
        kind=st.just("runtime"),
        message=st.text(max_size=5),
        worker=workers,
    ),
    st.builds(
        Resume,
        attempt=attempts,
        from_step=st.integers(0, 9),
        from_micro_step=st.just(0),
        checkpoint=st.none(),
        data_order=st.sampled_from(["continued", "restarted"]),
        worker=workers,
    ),
    st.builds(
        Checkpoint,
        attempt=attempts,
        step=st.integers(0, 9),
        micro_step=st.just(0),
        path=st.just("c"),
        seconds=finite,
        worker=workers,
    ),
    st.builds(
        Reconfigured,
        attempt=attempts,
        id=st.integers(1, 3),
        ok=st.booleans(),
        step=st.integers(0, 9),
        changed=st.just(["data.prefetch"]),
        seconds=finite,
    ),
    st.builds(
        Run,
        run_id=st.just("r"),
        config_path=st.just("c"),
        supervisor_pid=st.just(1),
        host=st.just("h"),
        settings=st.just({"name": "x"}),
        created=st.none() | finite,
    ),
)


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], int]:
    frames: list[dict[str, Any]] = []
    seq = 0
    for _ in range(draw(st.integers(0, 120))):
        # Steps most of the time (an attempt is measured after WARMUP_STEPS of them).
        event = draw(steps if draw(st.integers(0, 9)) < 7 else others)
        seq = max(0, seq - 1) if draw(st.integers(0, 9)) == 0 else seq  # now and then a resent one
        frames.append(json.loads(json.dumps(event_frame(event, t=1000.0 + seq, seq=seq))))
        seq += 1
    return frames, draw(st.integers(0, len(frames)))


@given(runs())
@settings(max_examples=150, deadline=None)
def test_a_snapshot_of_any_prefix_folds_on_to_the_whole(
    run: tuple[list[dict[str, Any]], int],
) -> None:
    frames, cut = run
    assert_snapshot_folds_on(frames, cut)


def test_a_snapshot_taken_on_either_side_of_the_median_switch_folds_on() -> None:
    # One attempt past EXACT_VALUES measured steps: its median leaves exact values for bins.
    frames = [event_frame(Attempt(attempt=1, settings={}), t=0.0, seq=0)]
    for number in range(1, EXACT_VALUES + 200):
        step = Step(
            attempt=1,
            step=number,
            micro_step=number,
            epoch=0,
            loss=1.0,
            lr=0.1,
            examples=256,
            step_time_ms=10.0 + number % 17,
            input_wait_ms=1.0,
            grad_sync_bytes=0.0,
        )
        frames.append(event_frame(step, t=float(number), seq=number))
    for cut in (1, 100, EXACT_VALUES, EXACT_VALUES + 6, EXACT_VALUES + 7, len(frames) - 1):
        assert_snapshot_folds_on(frames, cut)
    assert fold(frames).attempts[1].rates.exact == []


# ---- the snapshot frame in a dashboard ------------------------------------------------


def test_a_dashboard_takes_a_snapshot_frame_as_its_state_and_keeps_its_link() -> None:
    frames = load(FIXTURES[0])
    source = fold(frames[:20])
    state = RunState()
    state.apply({"type": "link", "state": "connected", "message": "subscribed from seq 0"})
    state.take_changes()
    state.apply({"type": "snapshot", "seq": source.last_seq, "data": source.to_snapshot()})
    assert run_fields(state) == run_fields(source)
    assert state.link_state == "connected"
    assert state.take_changes() == set(AREAS), "everything repaints"
    # An older snapshot than what is folded already changes nothing.
    older = fold(frames[:10])
    state.apply({"type": "snapshot", "seq": older.last_seq, "data": older.to_snapshot()})
    assert state.duplicates_skipped == source.duplicates_skipped + 1
    state.duplicates_skipped -= 1
    assert run_fields(state) == run_fields(source)


def test_an_unreadable_snapshot_frame_is_counted_and_changes_nothing() -> None:
    state = fold(load(FIXTURES[0])[:5])
    before = run_fields(state)
    state.apply({"type": "snapshot", "seq": 99, "data": "{not json"})
    assert state.bad_events == 1
    assert {k: v for k, v in run_fields(state).items() if k != "bad_events"} == {
        k: v for k, v in before.items() if k != "bad_events"
    }


# ---- the codec ----------------------------------------------------------------------


@dataclasses.dataclass
class Inner:
    name: str
    values: tuple[float, ...] = ()


@dataclasses.dataclass
class Outer:
    by_index: dict[int, Inner] = dataclasses.field(default_factory=dict)
    recent: deque[int] = dataclasses.field(default_factory=lambda: deque(maxlen=3))
    tags: set[str] = dataclasses.field(default_factory=set)
    last: Inner | None = None
    mixed: int | str | None = None
    scratch: list[int] = dataclasses.field(default_factory=list, metadata={"snapshot": False})


def test_the_codec_rebuilds_nested_dataclasses_deques_and_int_keys() -> None:
    value = Outer(
        by_index={3: Inner("a", (1.5, 2.0))},
        tags={"x", "y"},
        last=Inner("b"),
        mixed="s",
        scratch=[1, 2],
    )
    value.recent.extend([1, 2, 3, 4])
    text = codec.dumps(value)
    back = codec.loads(Outer, text)
    assert back.by_index == {3: Inner("a", (1.5, 2.0))} and back.tags == {"x", "y"}
    assert back.recent == deque([2, 3, 4]) and back.recent.maxlen == 3
    assert (back.last, back.mixed) == (Inner("b"), "s")
    assert back.scratch == [], "a field marked snapshot: False is left out"


def test_a_new_field_is_a_new_format_and_the_old_snapshot_is_refused() -> None:
    old = codec.dumps(Inner("a"))

    @dataclasses.dataclass
    class Inner2:  # Inner with one more field, as a later gpuwatch might have it
        name: str
        values: tuple[float, ...] = ()
        extra: int = 0

    Inner2.__qualname__ = Inner.__qualname__
    Inner2.__module__ = Inner.__module__
    assert codec.schema_id(Inner2) != codec.schema_id(Inner)
    with pytest.raises(SnapshotError, match="schema"):
        codec.loads(Inner2, old)


@pytest.mark.parametrize("text", ["", "[]", '{"schema": 1}', "{broken", '{"data": {}}'])
def test_what_is_not_a_snapshot_is_a_snapshot_error(text: str) -> None:
    with pytest.raises(SnapshotError):
        RunState.from_snapshot(text)


def test_data_that_does_not_fit_the_format_is_a_snapshot_error() -> None:
    text = json.dumps({"schema": codec.schema_id(RunState), "data": {"run_id": "x"}})
    with pytest.raises(SnapshotError, match="RunState"):
        RunState.from_snapshot(text)


def test_a_field_the_codec_cannot_encode_is_refused_by_name() -> None:
    @dataclasses.dataclass
    class Odd:
        when: complex = 0j

    with pytest.raises(SnapshotError, match="complex"):
        codec.schema_id(Odd)


def test_runstate_has_a_format() -> None:
    assert RunState.snapshot_format() == codec.schema_id(RunState)
    assert RunState.snapshot_format() is not None
