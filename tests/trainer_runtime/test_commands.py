"""Wire commands: one declaration each, every field checked by type and range."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trainer_runtime.protocol as protocol
from trainer_runtime.protocol import (
    COMMANDS,
    MAX_ID_CHARS,
    MAX_NESTING_DEPTH,
    MAX_OVERRIDE_KEY_CHARS,
    MAX_OVERRIDES,
    MAX_WIRE_INT,
    Command,
    InvalidCommand,
    ProtocolError,
    Relaunch,
    Status,
    Stop,
    Subscribe,
    build_command,
    command_frame,
    command_reference,
    decode,
    encode_command,
    parse_command,
    reply_id,
)

ROOT = Path(__file__).resolve().parents[2]


def frame(frame_type: str, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": frame_type, **fields}


def deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


# (frame, the field the message must name, a fragment of the message)
REFUSED: list[tuple[dict[str, Any], str, str]] = [
    # the defect: "no" was taken as true, and attempt 3 started from step 0
    (frame("relaunch", fresh="no"), "fresh", 'fresh must be true or false (got "no")'),
    (frame("relaunch", fresh=1), "fresh", "fresh must be true or false (got 1)"),
    (frame("relaunch", fresh=0), "fresh", "(got 0)"),
    (frame("relaunch", fresh="true"), "fresh", '(got "true")'),
    (frame("relaunch", fresh=None), "fresh", "(got null)"),
    (frame("relaunch", fresh=1.0), "fresh", "(got 1.0)"),
    (frame("relaunch", fresh=[True]), "fresh", "(got a list)"),
    (frame("relaunch", fresh={}), "fresh", "(got an object)"),
    (frame("subscribe", from_seq=True), "from_seq", "from_seq must be an integer"),
    (frame("subscribe", from_seq=False), "from_seq", "(got false)"),
    (frame("subscribe", from_seq=-1), "from_seq", "(got -1)"),
    (frame("subscribe", from_seq=2**70), "from_seq", f"(got {2**70})"),
    (frame("subscribe", from_seq=MAX_WIRE_INT + 1), "from_seq", "from_seq"),
    (frame("subscribe", from_seq=1.0), "from_seq", "(got 1.0)"),
    (frame("subscribe", from_seq=2.5), "from_seq", "(got 2.5)"),
    (frame("subscribe", from_seq="3"), "from_seq", '(got "3")'),
    (frame("subscribe", from_seq=None), "from_seq", "(got null)"),
    (frame("relaunch", overrides=None), "overrides", "overrides must be an object"),
    (frame("relaunch", overrides=[["data.prefetch", True]]), "overrides", "(got a list)"),
    (frame("relaunch", overrides="data.prefetch=on"), "overrides", "overrides must be"),
    (frame("relaunch", overrides={"": 1}), "overrides", 'key "" is not a dotted key'),
    (frame("relaunch", overrides={"data..prefetch": 1}), "overrides", "not a dotted key"),
    (frame("relaunch", overrides={".data": 1}), "overrides", "not a dotted key"),
    (frame("relaunch", overrides={"data prefetch": 1}), "overrides", "not a dotted key"),
    (frame("relaunch", overrides={"a\nb": 1}), "overrides", "not a dotted key"),
    (
        frame("relaunch", overrides={"k" * (MAX_OVERRIDE_KEY_CHARS + 1): 1}),
        "overrides",
        "not a dotted key",
    ),
    (
        frame("relaunch", overrides={f"k{i}": i for i in range(MAX_OVERRIDES + 1)}),
        "overrides",
        f"overrides has {MAX_OVERRIDES + 1} keys; at most {MAX_OVERRIDES}",
    ),
    (
        frame("relaunch", overrides={"model.kwargs": {"x": deep_list(MAX_NESTING_DEPTH)}}),
        "overrides",
        'overrides["model.kwargs"] nests deeper',
    ),
    (frame("relaunch", overrides={"x": float("nan")}), "overrides", "must be a JSON value"),
    (frame("relaunch", overrides={"x": b"bytes"}), "overrides", "(got a bytes)"),
    (frame("relaunch", overrides={"x": {1: 2}}), "overrides", "object key 1"),
    (frame("relaunch", id=True), "id", "id must be a string"),
    (frame("stop", id=1.5), "id", "(got 1.5)"),
    (frame("stop", id=[1]), "id", "(got a list)"),
    (frame("stop", id={"n": 1}), "id", "(got an object)"),
    (frame("stop", id="x" * (MAX_ID_CHARS + 1)), "id", "id must be"),
    (frame("status", id=MAX_WIRE_INT + 1), "id", "id must be"),
    (frame("relaunch", frsh=True), "frsh", 'relaunch: unknown field "frsh"'),
    (frame("stop", force=True), "force", 'stop: unknown field "force" (stop takes id)'),
    (frame("status", overrides={}), "overrides", 'status: unknown field "overrides"'),
    (frame("subscribe", fresh=False), "fresh", 'subscribe: unknown field "fresh"'),
    (frame("reconfigure"), "type", 'type must be one of subscribe, relaunch, stop, status'),
    (frame("ack", id=1), "type", '(got "ack")'),
    (frame("Relaunch"), "type", '(got "Relaunch")'),
    (frame("relaunch "), "type", '(got "relaunch ")'),
    (frame(""), "type", '(got "")'),
    ({"v": 1, "type": None}, "type", "(got null)"),
    ({"v": 1, "type": ["stop"]}, "type", "(got a list)"),
    ({"v": 1}, "type", "(got null)"),
    ({"type": "stop"}, "v", "stop: v must be 1 (got null)"),
    ({"v": True, "type": "stop"}, "v", "stop: v must be 1 (got true)"),
    ({"v": 1.0, "type": "stop"}, "v", "(got 1.0)"),
    ({"v": "1", "type": "stop"}, "v", '(got "1")'),
    ({"v": 2, "type": "stop"}, "v", "(got 2)"),
]


@pytest.mark.parametrize(
    ("bad", "field", "fragment"), REFUSED, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(REFUSED)]
)
def test_each_malformed_field_is_refused_with_one_line_naming_it(
    bad: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(InvalidCommand) as caught:
        parse_command(bad)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 300
    assert caught.value.field == field
    frame_type = bad.get("type")
    command = frame_type if isinstance(frame_type, str) and frame_type in COMMANDS else "command"
    assert message.startswith(f"{command}: ")
    assert field in message


def test_the_refusal_carries_the_id_only_when_the_id_is_valid() -> None:
    with pytest.raises(InvalidCommand) as caught:
        parse_command(frame("relaunch", id=7, fresh="no"))
    assert caught.value.command_id == 7
    with pytest.raises(InvalidCommand) as caught:
        parse_command(frame("relaunch", id="mine", frsh=True))
    assert caught.value.command_id == "mine"
    for bad_id in (True, 1.5, [1], {"a": 1}, "x" * (MAX_ID_CHARS + 1), 2**60):
        with pytest.raises(InvalidCommand) as caught:
            parse_command(frame("relaunch", id=bad_id, fresh="no"))
        assert caught.value.command_id is None
        assert reply_id({"id": bad_id}) is None
    assert reply_id({}) is None and reply_id({"id": "a"}) == "a" and reply_id({"id": 3}) == 3


def test_a_frame_that_is_not_an_object_is_refused() -> None:
    not_frames: list[Any] = [None, [], "stop", 1]
    for not_a_frame in not_frames:
        with pytest.raises(InvalidCommand, match="must be a JSON object"):
            parse_command(not_a_frame)


@pytest.mark.parametrize(
    ("good", "expected"),
    [
        (frame("subscribe"), Subscribe(from_seq=0)),
        (frame("subscribe", id=1, from_seq=0), Subscribe(id=1, from_seq=0)),
        (frame("subscribe", from_seq=MAX_WIRE_INT), Subscribe(from_seq=MAX_WIRE_INT)),
        (frame("relaunch", id="r", overrides={}), Relaunch(id="r")),
        (frame("relaunch", fresh=True), Relaunch(fresh=True)),
        (frame("relaunch", fresh=False, id=None), Relaunch(fresh=False)),
        (
            frame("relaunch", overrides={"data.prefetch": True, "model.hidden_units.0": 8,
                                         "model.kwargs": {"a": [1, None, "x"]}}),
            Relaunch(overrides={"data.prefetch": True, "model.hidden_units.0": 8,
                                "model.kwargs": {"a": [1, None, "x"]}}),
        ),
        (frame("stop", id=-5), Stop(id=-5)),
        (frame("status", id="x" * MAX_ID_CHARS), Status(id="x" * MAX_ID_CHARS)),
    ],
)
def test_valid_commands_parse_and_round_trip_the_wire(
    good: dict[str, Any], expected: Command
) -> None:
    command = parse_command(good)
    assert command == expected
    assert parse_command(decode(encode_command(command))) == command
    assert build_command(command.TYPE, **{k: v for k, v in command_frame(command).items()
                                          if k not in ("v", "type")}) == command


def test_only_a_literal_true_means_fresh() -> None:
    fresh, resume = parse_command(frame("relaunch", fresh=True)), parse_command(frame("relaunch"))
    assert isinstance(fresh, Relaunch) and fresh.fresh is True
    assert isinstance(resume, Relaunch) and resume.fresh is False
    loose_values: list[Any] = ["no", "yes", 1, 0, "true", None, [], {}]
    for loose in loose_values:
        with pytest.raises(InvalidCommand, match="fresh"):
            parse_command(frame("relaunch", fresh=loose))


def test_a_parsed_command_does_not_share_the_callers_overrides() -> None:
    overrides: dict[str, Any] = {"model.kwargs": {"a": [1]}}
    command = parse_command(frame("relaunch", overrides=overrides))
    overrides["model.kwargs"]["a"].append(2)
    overrides["data.prefetch"] = True
    assert command == Relaunch(overrides={"model.kwargs": {"a": [1]}})
    assert isinstance(command, Relaunch)
    with pytest.raises(TypeError):
        command.overrides["x"] = 1  # type: ignore[index]  # read-only: a mappingproxy


# -- the declarations are the documentation ----------------------------------------------


def test_the_module_docstring_carries_the_reference_generated_from_the_declarations() -> None:
    reference = command_reference()
    assert protocol.__doc__ is not None and reference in protocol.__doc__
    for name, cls in COMMANDS.items():
        assert f"  {name} " in reference
        for declared in dataclasses.fields(cls):
            assert f"{declared.name}: " in reference
    assert "fresh: true or false; default false" in reference


def test_internals_doc_carries_the_same_reference() -> None:
    text = (ROOT / "docs" / "internals.md").read_text()
    block = "\n".join("    " + line if line else "" for line in command_reference().splitlines())
    assert block in text, "docs/internals.md: paste protocol.command_reference(), indented 4"


# -- properties ------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(["v", "type", "id", "from_seq", "overrides", "fresh"]) | st.text(
    max_size=10
)
type_names = st.sampled_from([*COMMANDS, "ack", "err", "reconfigure", "Relaunch", ""]) | st.text(
    max_size=12
)
any_frames = st.builds(
    lambda frame_type, version, extra: {"v": version, "type": frame_type, **extra},
    type_names,
    st.just(1) | json_values,
    st.dictionaries(field_names, json_values, max_size=5),
)


def assert_exactly_declared_types(command: Command) -> None:
    assert type(command) in COMMANDS.values()
    assert command.id is None or type(command.id) in (str, int)
    if isinstance(command.id, str):
        assert len(command.id) <= MAX_ID_CHARS
    if isinstance(command.id, int):
        assert abs(command.id) <= MAX_WIRE_INT
    if isinstance(command, Subscribe):
        assert type(command.from_seq) is int and 0 <= command.from_seq <= MAX_WIRE_INT
    if isinstance(command, Relaunch):
        assert type(command.fresh) is bool
        assert isinstance(command.overrides, Mapping) and len(command.overrides) <= MAX_OVERRIDES
        assert all(type(key) is str and key for key in command.overrides)
        json.dumps(dict(command.overrides), allow_nan=False)  # JSON values only


@settings(max_examples=400)
@given(any_frames)
def test_any_frame_gives_a_command_of_exactly_the_declared_types_or_a_protocol_error(
    candidate: dict[str, Any],
) -> None:
    try:
        command = parse_command(candidate)
    except ProtocolError as exc:
        assert "\n" not in str(exc)
        return
    assert_exactly_declared_types(command)


@settings(max_examples=300)
@given(any_frames)
def test_any_frame_off_the_wire_gives_a_command_or_a_protocol_error(
    candidate: dict[str, Any],
) -> None:
    try:
        command = parse_command(decode(json.dumps(candidate).encode()))
    except ProtocolError:
        return
    assert_exactly_declared_types(command)
    assert parse_command(decode(encode_command(command))) == command


dotted_keys = st.lists(
    st.text(alphabet="abcxyz_019", min_size=1, max_size=8), min_size=1, max_size=4
).map(".".join)
valid_commands = st.one_of(
    st.builds(Subscribe, id=st.none() | st.integers(-MAX_WIRE_INT, MAX_WIRE_INT),
              from_seq=st.integers(0, MAX_WIRE_INT)),
    st.builds(Relaunch, id=st.none() | st.text(max_size=MAX_ID_CHARS),
              overrides=st.dictionaries(dotted_keys, json_values, max_size=6),
              fresh=st.booleans()),
    st.builds(Stop, id=st.none() | st.text(max_size=20)),
    st.builds(Status, id=st.none() | st.integers(-MAX_WIRE_INT, MAX_WIRE_INT)),
)


@given(valid_commands)
def test_valid_commands_round_trip(command: Command) -> None:
    parsed = parse_command(decode(encode_command(command)))
    assert parsed == command
    assert_exactly_declared_types(parsed)


def test_overrides_may_nest_exactly_as_deep_as_a_frame_may() -> None:
    # frame (1) -> overrides (2) -> the value (3) -> ...: the deepest value a frame can carry.
    deepest = frame("relaunch", overrides={"model.kwargs": deep_list(MAX_NESTING_DEPTH - 2)})
    command = parse_command(decode(json.dumps(deepest).encode()))
    assert parse_command(decode(encode_command(command))) == command
    too_deep = frame("relaunch", overrides={"model.kwargs": deep_list(MAX_NESTING_DEPTH - 1)})
    with pytest.raises(ProtocolError, match="nests deeper"):
        decode(json.dumps(too_deep).encode())
    with pytest.raises(InvalidCommand, match=r'overrides\["model.kwargs"\] nests deeper'):
        parse_command(too_deep)
