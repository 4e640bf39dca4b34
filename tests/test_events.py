"""Typed events: one declaration each in trainer_runtime.protocol; encode, decode and docs follow.

The envelope ("v", "type", "seq", "t") is written by event_frame and read by
parse_event; every field of every event is checked by its declared type.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_runtime import protocol
from trainer_runtime.protocol import (
    EVENTS,
    Envelope,
    HostSample,
    ProtocolError,
    Step,
    decode,
    encode_event,
    event_reference,
    parse_event,
)

ROOT = Path(__file__).resolve().parents[1]

EXAMPLES: dict[str, dict[str, Any]] = {
    "hello": dict(attempt=1, pid=42, tf_version="2.21.0", replicas=2, device_kind="cpu",
                  devices=["CPU:0", "CPU:1"], param_count=10, param_bytes=40,
                  global_batch_size=64, accumulation_steps=1, per_replica_batch=32,
                  start_step=0, start_micro_step=0),
    "step": dict(attempt=1, step=3, micro_step=6, epoch=0, loss=0.5, lr=1e-3, examples=64,
                 step_time_ms=12.5, input_wait_ms=2.5, grad_sync_bytes=80, position=192,
                 dropped=0),
    "checkpoint": dict(attempt=1, step=25, micro_step=25, path="/r/ckpt-25", seconds=0.1),
    "resume": dict(attempt=2, from_step=25, from_micro_step=25, checkpoint="/r/ckpt-25",
                   position=1600, data_order="continued", data_note="", lost_steps=3),
    "reconfigured": dict(attempt=1, id=2, ok=True, step=40, changed=["data.prefetch"],
                         seconds=0.2, message=""),
    "done": dict(attempt=1, reason="max_steps", step=100),
    "error": dict(attempt=1, kind="runtime", message="MemoryError: x"),
    "hook": dict(attempt=1, installed=True, message="", tensorflow=True, keras_version="3.15.1",
                 loop="fit", input_wait="", strategy="MirroredStrategy"),
    "run": dict(run_id="1121-abcd", name="demo", config_path="/r/config.yaml",
                supervisor_pid=7, host="box", settings={"name": "demo"}, created=None),
    "attempt": dict(attempt=1, settings={"name": "demo"}, fresh=False, reason="start",
                    config_path="/r/attempt-1.yaml"),
    "scale": dict(counts=[1, 2, 4], unit="replicas", mode="weak", steps=40, cores=2),
    "status": dict(attempt=1, status="crashed", exit_code=1, signal=None, message="boom",
                   log_tail=["a", "b"]),
    "sample": dict(host=HostSample(cpu_pct=50.0), gpus=[], nvml="no driver"),
    "steps": dict(attempt=1, worker=9, first_step=6, last_step=45, count=40, epoch=0,
                  examples=2560, loss=0.5, position=2880, step_time_ms=[24.0, 25.0, 27.5, 1001.0],
                  input_wait_ms=[1.0, 1.2, 3.0, 50.0], compute_ms=None,
                  breakdown_ms=[1001.0, 50.0, 320.0, 500.0, 40.0]),
}


def test_every_declared_event_has_an_example_here() -> None:
    assert set(EXAMPLES) == set(EVENTS)


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_each_event_round_trips_with_its_envelope(name: str) -> None:
    event = EVENTS[name](**EXAMPLES[name])
    line = encode_event(event, t=1000.5, seq=9)
    frame = decode(line)
    assert list(frame)[:4] == ["v", "type", "seq", "t"], "the envelope comes first"
    assert parse_event(frame) == (Envelope(name, 9, 1000.5), event)


def test_a_frame_without_seq_or_t_parses_with_an_empty_envelope() -> None:
    event = Step(**EXAMPLES["step"])
    envelope, parsed = parse_event(decode(encode_event(event)))
    assert (envelope.seq, envelope.t, parsed) == (None, None, event)


def test_step_figures_are_derived_once() -> None:
    step = Step(**EXAMPLES["step"])
    assert step.input_wait_pct == pytest.approx(20.0)
    assert step.examples_per_s == pytest.approx(64 * 1000 / 12.5)
    assert Step(**{**EXAMPLES["step"], "step_time_ms": 0.0}).input_wait_pct is None
    # A step time the wire accepts (finite) whose rate is not: 64 examples in 1e-310 ms.
    assert Step(**{**EXAMPLES["step"], "step_time_ms": 1e-310}).examples_per_s is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"step": True}, "step: step must be an integer (got true)"),
        ({"step": 1.5}, "step: step must be an integer (got 1.5)"),
        ({"loss": "x"}, 'step: loss must be a finite number or null (got "x")'),
        ({"lr": "x"}, 'step: lr must be a finite number or null (got "x")'),
        ({"step_time_ms": None}, "step: step_time_ms must be a finite number (got null)"),
        ({"extra": 1}, 'step: unknown field "extra"'),
        ({"seq": -1}, "step: seq must be an integer >= 0 (got -1)"),
        ({"t": "now"}, 'step: t must be a number (got "now")'),
    ],
)
def test_a_field_of_the_wrong_type_is_a_protocol_error_naming_it(
    change: dict[str, Any], words: str
) -> None:
    frame = {"v": 1, "type": "step", **EXAMPLES["step"], **change}
    with pytest.raises(ProtocolError) as refused:
        parse_event(frame)
    assert str(refused.value) == words


def test_a_missing_field_and_an_unknown_type_are_refused() -> None:
    frame = {"v": 1, "type": "step", **EXAMPLES["step"]}
    del frame["examples"]
    with pytest.raises(ProtocolError, match="examples"):
        parse_event(frame)
    with pytest.raises(ProtocolError, match='unknown event type "stepp"'):
        parse_event({"v": 1, "type": "stepp"})


def test_events_recorded_before_fields_were_added_still_parse() -> None:
    # The dashboard's recorded fixtures predate `position`, `config_path` and `name`.
    seen = 0
    for path in sorted((ROOT / "tests" / "app" / "data").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            parse_event(json.loads(line))
            seen += 1
    assert seen > 100


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(EVENTS)),
    key=st.text(max_size=12),
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner,
                                                                   max_size=3),
        max_leaves=6,
    ),
)
def test_any_value_in_any_field_is_an_event_of_declared_types_or_a_protocol_error(
    name: str, key: str, value: Any
) -> None:
    frame = {"v": 1, "type": name, **EXAMPLES[name], key: value}
    try:
        _, event = parse_event(frame)
    except ProtocolError:
        return
    hints = {f.name: f.type for f in dataclasses.fields(event)}
    for field_name, annotation in hints.items():
        got = getattr(event, field_name)
        base = str(annotation).removesuffix(" | None")
        if got is None:
            assert str(annotation).endswith("| None"), field_name
        elif base == "int":
            assert type(got) is int, field_name
        elif base == "float":
            assert type(got) is float, field_name
        elif base == "bool":
            assert type(got) is bool, field_name


def test_the_module_docstring_carries_the_reference_generated_from_the_declarations() -> None:
    assert protocol.__doc__ is not None and event_reference() in protocol.__doc__
    for name, cls in EVENTS.items():
        assert f"  {name} " in event_reference()
        for declared in dataclasses.fields(cls):
            assert f"{declared.name} (" in event_reference()


def test_a_number_too_big_for_a_float_is_a_protocol_error_not_an_overflow() -> None:
    frame = {"v": 1, "type": "checkpoint", **EXAMPLES["checkpoint"], "seconds": 10**400}
    with pytest.raises(ProtocolError, match="seconds must be a finite number"):
        parse_event(frame)
    with pytest.raises(ProtocolError, match="t must be a number"):
        parse_event({**frame, "seconds": 0.1, "t": 10**400})
