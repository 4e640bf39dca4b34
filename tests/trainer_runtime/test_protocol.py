"""The wire: NDJSON frames with a version, a type and a size limit."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_runtime.protocol import (
    EVENTS,
    MAX_FRAME_BYTES,
    MAX_NESTING_DEPTH,
    PROTOCOL_VERSION,
    FrameBuffer,
    ProtocolError,
    decode,
    encode,
)


def test_encode_then_decode_round_trips_fields() -> None:
    data = encode("step", step=7, loss=0.25, input_wait_ms=12.5)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    frame = decode(data)
    assert frame == {"v": PROTOCOL_VERSION, "type": "step", "step": 7, "loss": 0.25,
                     "input_wait_ms": 12.5}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"type": "step"}', "protocol version"),
        (b'{"v": 99, "type": "step"}', "protocol version 99"),
        (b'{"v": 1, "type": 5}', "no string 'type'"),
    ],
)
def test_decode_rejects_bad_frames_with_a_reason(line: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode(line)


def test_nan_cannot_be_sent() -> None:
    # JSON has no NaN; a NaN loss must be caught by the sender, not break the reader.
    with pytest.raises(ValueError):
        encode("step", loss=float("nan"))


def test_frame_buffer_splits_a_stream_at_any_chunking() -> None:
    stream = b"".join(encode("step", step=i) for i in range(50))
    for size in (1, 3, 17, 4096):
        buf = FrameBuffer()
        frames = []
        for start in range(0, len(stream), size):
            frames += buf.feed(stream[start : start + size])
        assert [f["step"] for f in frames] == list(range(50))
        assert buf.pending_bytes == 0


def test_frame_buffer_refuses_an_oversized_frame_before_its_newline() -> None:
    buf = FrameBuffer(max_frame_bytes=1000)
    with pytest.raises(ProtocolError, match="over the 1000 byte limit"):
        buf.feed(b"x" * 1001)


def test_encoder_refuses_a_frame_over_the_limit() -> None:
    with pytest.raises(ProtocolError):
        encode("log", text="x" * (MAX_FRAME_BYTES + 1))


@given(st.binary(max_size=2000))
def test_frame_buffer_only_ever_raises_protocol_error(junk: bytes) -> None:
    buf = FrameBuffer(max_frame_bytes=512)
    try:
        for frame in buf.feed(junk):
            assert frame["v"] == PROTOCOL_VERSION
    except ProtocolError:
        pass


@given(st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ("v", "type")),
                       st.one_of(st.integers(), st.text(), st.booleans(), st.none(),
                                 st.floats(allow_nan=False, allow_infinity=False)),
                       max_size=6))
def test_any_json_fields_survive_the_wire(fields: dict[str, object]) -> None:
    frame = decode(encode("status", **fields))
    assert frame == json.loads(json.dumps({"v": PROTOCOL_VERSION, "type": "status", **fields}))


# -- every decode failure is a ProtocolError -------------------------------------------


def _nested_frame(depth: int, opener: str = "[") -> bytes:
    """A log frame whose "x" field nests lists (or objects) so the frame is `depth` deep."""
    inner = depth - 1  # the frame object itself is level 1
    if opener == "[":
        value = "[" * inner + "]" * inner
    else:
        value = '{"a":' * (inner - 1) + "{}" + "}" * (inner - 1)
    return f'{{"v":1,"type":"log","x":{value}}}'.encode()


def test_a_hundred_thousand_open_brackets_are_a_protocol_error_quickly() -> None:
    started = time.monotonic()
    for line in (b"[" * 100_000, b'{"v":1,"type":"log","x":' + b"[" * 100_000, b"{" * 100_000):
        with pytest.raises(ProtocolError):
            decode(line)
        with pytest.raises(ProtocolError):
            FrameBuffer().feed(line + b"\n")
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("opener", ["[", "{"])
def test_nesting_over_the_limit_is_refused_and_at_the_limit_accepted(opener: str) -> None:
    assert decode(_nested_frame(MAX_NESTING_DEPTH, opener))["type"] == "log"
    with pytest.raises(ProtocolError, match=f"nests deeper than {MAX_NESTING_DEPTH} levels"):
        decode(_nested_frame(MAX_NESTING_DEPTH + 1, opener))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    frame = decode(encode("log", text="[" * 5000 + "{" * 5000))
    assert frame["text"].startswith("[[[")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"v":1,"type":"log","n":' + b"1" * 5000 + b"}", "not acceptable JSON"),
        (b'{"v":true,"type":"log"}', "protocol version true"),
        (b'{"v":1.0,"type":"log"}', "protocol version 1.0"),
        (b'{"v":"1","type":"log"}', 'protocol version "1"'),
        (b"NaN", "not a JSON object"),
        (b"", "not JSON"),
    ],
)
def test_json_value_errors_and_a_loose_version_are_protocol_errors(line: bytes, why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        decode(line)


def test_a_flat_step_frame_skips_the_nesting_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    # The trainer sends ~40-100 step frames a second: the depth check must cost two
    # str.count calls for them, not a walk of the decoded dict.
    from trainer_runtime.protocol import framing

    def walk_called(*_args: object) -> bool:
        raise AssertionError("a flat frame was walked")

    line = encode("step", attempt=1, step=10, micro_step=10, loss=0.5, step_time_ms=12.5,
                  input_wait_ms=1.0, examples=64, t=1.0, dropped=0)
    monkeypatch.setattr(framing, "_nests_deeper_than", walk_called)
    assert decode(line)["step"] == 10
    assert encode("step", step=11).startswith(b"{")


def test_encode_refuses_what_decode_would_refuse() -> None:
    deep: list[object] = []
    for _ in range(MAX_NESTING_DEPTH):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nests deeper"):
        encode("log", x=deep)
    circular: list[object] = []
    circular.append(circular)
    with pytest.raises(ProtocolError):
        encode("log", x=circular)
    with pytest.raises(ProtocolError):
        encode("log", x={(1, 2): "a tuple key"})
    very_deep: list[object] = []
    for _ in range(100_000):
        very_deep = [very_deep]
    with pytest.raises(ProtocolError, match="nests deeper"):
        encode("log", x=very_deep)


_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=10),
    st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.one_of(
    st.text(alphabet='[]{}":,1a-.eE \\', max_size=400),
    st.integers(min_value=0, max_value=3000).map(lambda n: "[" * n + "]" * n),
    st.recursive(_json_scalars, lambda c: st.lists(c, max_size=3)
                 | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=30)
      .map(lambda value: json.dumps({"v": 1, "type": "log", "x": value})),
))
def test_decode_only_ever_raises_protocol_error(text: str) -> None:
    try:
        frame = decode(text.encode())
    except ProtocolError:
        return
    assert type(frame["v"]) is int and isinstance(frame["type"], str)


# -- snapshot frames: the supervisor's state, in parts under the frame limit -------------


def _join(frames: list[bytes]) -> dict[str, object] | None:
    from trainer_runtime.protocol import SnapshotParts

    parts = SnapshotParts()
    joined = None
    for data in frames:
        result = parts.feed(decode(data))
        assert joined is None, "nothing after the last part"
        joined = result
    return joined


@pytest.mark.parametrize(
    "text",
    ["", "x", "a" * 200_000, '{"k":"\\u00e9\\"quoted\\""}' * 9000, "\U0001f600" * 70_000],
    ids=["empty", "one", "ascii", "escapes", "astral"],
)
def test_a_snapshot_of_any_size_goes_in_parts_under_the_frame_limit(text: str) -> None:
    from trainer_runtime.protocol import SNAPSHOT_PART_CHARS, snapshot_frames

    frames = snapshot_frames(41, "1-abc", text)
    assert len(frames) == max(1, -(-len(text) // SNAPSHOT_PART_CHARS))
    assert all(len(frame) <= MAX_FRAME_BYTES for frame in frames)
    assert _join(frames) == {"v": PROTOCOL_VERSION, "type": "snapshot", "seq": 41,
                             "schema": "1-abc", "data": text}


@pytest.mark.parametrize(
    "damage", ["second part first", "a part missing", "parts of two snapshots", "an extra field"]
)
def test_snapshot_parts_that_do_not_fit_together_are_a_protocol_error(damage: str) -> None:
    from trainer_runtime.protocol import SNAPSHOT_PART_CHARS, snapshot_frames

    frames = snapshot_frames(7, "f", "z" * (3 * SNAPSHOT_PART_CHARS))
    if damage == "second part first":
        frames = [frames[1], frames[0], frames[2]]
    elif damage == "a part missing":
        frames = [frames[0], frames[2]]
    elif damage == "parts of two snapshots":
        frames = [frames[0], snapshot_frames(8, "f", "z" * (3 * SNAPSHOT_PART_CHARS))[1]]
    else:
        frame = decode(frames[0])
        frames = [encode("snapshot", **{k: v for k, v in frame.items() if k not in ("v", "type")},
                         extra=1)]
    with pytest.raises(ProtocolError, match="snapshot"):
        _join(frames)


def test_a_snapshot_over_the_join_limit_is_a_protocol_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer_runtime.protocol import snapshot_frames, supervisor_frames

    monkeypatch.setattr(supervisor_frames, "MAX_SNAPSHOT_CHARS", 100_000)
    with pytest.raises(ProtocolError, match="over 100000 characters"):
        _join(snapshot_frames(1, "f", "y" * 200_000))


@pytest.mark.parametrize(
    ("value", "ok"),
    [(None, True), ("1-abc", True), ("x" * 128, True), ("", False), ("x" * 129, False),
     (1, False), (True, False)],
)
def test_subscribe_takes_a_snapshot_format_or_null(value: object, ok: bool) -> None:
    from trainer_runtime.protocol import InvalidCommand, Subscribe, parse_command

    frame = {"v": 1, "type": "subscribe", "from_seq": 0, "snapshot": value}
    if ok:
        assert parse_command(frame) == Subscribe(from_seq=0, snapshot=value)  # type: ignore[arg-type]
    else:
        with pytest.raises(InvalidCommand, match="subscribe: snapshot must be a string"):
            parse_command(frame)


_ANY_VALUE = st.one_of(
    # The edges of each plain type first: what a fast path gets wrong.
    st.sampled_from(
        [math.inf, -math.inf, math.nan, -0.0, 0.0, 1e308, 2**53 + 1, 0, -1, True, False, ""]
    ),
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.one_of(st.text(max_size=3), st.integers()), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _plain_value(annotation: str) -> st.SearchStrategy[object]:
    """A value a field of this type takes as it is (what a trainer sends), or None."""
    base = annotation.removesuffix(" | None")
    plain = {"int": st.integers(min_value=0, max_value=2**40),
             "float": st.floats(allow_nan=False, allow_infinity=False),
             "str": st.text(max_size=5), "bool": st.booleans(),
             "list[str]": st.lists(st.text(max_size=3), max_size=2),
             "list[int]": st.lists(st.integers(min_value=-5, max_value=2**40), max_size=3),
             "list[float]": st.lists(st.floats(allow_nan=False, allow_infinity=False),
                                     max_size=5),
             "dict[str, Any]": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
             "list[dict[str, Any]]": st.lists(st.just({"a": 1}), max_size=2),
             # The sample records' wire objects (an older sender's fields left out).
             "HostSample": st.fixed_dictionaries({}, optional={
                 "cpu_pct": st.floats(0, 100), "per_cpu_pct": st.lists(st.floats(0, 100)),
                 "mem_used_bytes": st.integers(0, 2**40), "load_1m": st.none()}),
             "list[GpuSample]": st.lists(st.fixed_dictionaries(
                 {"index": st.integers(0, 7), "name": st.text(max_size=3), "uuid": st.none()},
                 optional={"util_gpu_pct": st.integers(0, 100) | st.floats(0, 100),
                           "processes": st.lists(st.fixed_dictionaries(
                               {"pid": st.integers(1, 9), "used_bytes": st.none(),
                                "in_run": st.booleans()}), max_size=2)}), max_size=2),
             "GpuSummary": st.fixed_dictionaries(
                 {"count": st.integers(0, 8), "lost": st.integers(0, 8),
                  "util_gpu_pct": st.none() | st.lists(st.floats(0, 100), min_size=3,
                                                       max_size=3),
                  "mem_used_bytes": st.floats(0, 1e12), "mem_total_bytes": st.none(),
                  "pcie_bytes_per_s": st.none(), "nvlink_bytes_per_s": st.floats(0, 1e12)}),
             }[base]
    return st.one_of(plain, st.none()) if annotation.endswith(" | None") else plain


@settings(max_examples=400)
@given(st.sampled_from(sorted(EVENTS)), st.data())
def test_the_fast_paths_read_every_frame_as_the_full_check_does(
    kind: str, data: st.DataObject
) -> None:
    """parse_event keeps a value of its field's exact type (or None where the field takes
    None) without the full check, and sets the event's slots without its __init__: for
    any value of any field, whole frames as the trainer sends them included, the result
    (or the refusal) is the same as with the full check and ``cls(**values)``."""
    from trainer_runtime import protocol
    from trainer_runtime.protocol import envelopes

    cls = EVENTS[kind]
    frame: dict[str, object] = {"type": kind, "seq": 1, "t": 1.0}
    if data.draw(st.booleans()):  # every field, each with a plain value or any value
        for f in dataclasses.fields(cls):
            if data.draw(st.integers(0, 3)):  # now and then one left out (its default)
                frame[f.name] = data.draw(
                    _plain_value(str(f.type)) if data.draw(st.integers(0, 9)) else _ANY_VALUE
                )
    else:
        names = [f.name for f in dataclasses.fields(cls)]
        for name in data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3)):
            frame[name] = data.draw(_ANY_VALUE)

    def read() -> object:
        try:
            envelope, event = protocol.parse_event(frame)
        except protocol.ProtocolError as exc:
            return ("refused", str(exc))
        return envelope, dataclasses.asdict(event), {
            k: type(v) for k, v in dataclasses.asdict(event).items()
        }

    fast = read()
    saved = envelopes._PLAIN_FIELDS, envelopes._NULLABLE_FIELDS, envelopes._EVENT_MAKERS
    envelopes._PLAIN_FIELDS = {name: {} for name in saved[0]}  # type: ignore[assignment]
    envelopes._NULLABLE_FIELDS = {name: frozenset() for name in saved[1]}  # type: ignore[assignment]
    envelopes._EVENT_MAKERS = {c: lambda values, c=c: c(**values) for c in saved[2]}  # type: ignore[assignment,misc]
    try:
        full = read()
    finally:
        envelopes._PLAIN_FIELDS, envelopes._NULLABLE_FIELDS, envelopes._EVENT_MAKERS = saved
    assert repr(fast) == repr(full)  # repr: nan == nan, and -0.0 apart from 0.0


# -- decode's fast paths read every stream as the plain ones do --------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=8,
)


def _outcome(read: object, *args: object) -> object:
    try:
        return ("value", repr(read(*args)))  # type: ignore[operator]
    except Exception as exc:  # the exception itself is what is compared
        return ("raised", type(exc).__name__, str(exc))


@settings(max_examples=300)
@given(
    st.one_of(
        _JSON.map(lambda v: json.dumps(v, allow_nan=True)),
        st.text(alphabet="{}[]\":,0123456789.eE+-tfnulNaI \t\r\n\ufeffx", max_size=20),
        st.text(max_size=10),
    ),
    st.sampled_from(["", " ", "\n", "\ufeff", "x", " 1"]),
    st.sampled_from(["", " ", "\t", "\ufeff"]),
)
def test_decode_reads_json_as_json_loads_does(body: str, after: str, before: str) -> None:
    """decode's scanner-only read of a frame gives json.loads's value, or its exception."""
    from trainer_runtime.protocol import framing

    text = before + body + after
    assert _outcome(framing._loads, text) == _outcome(json.loads, text)


class _LineAtATime:
    """The reference: FrameBuffer as it was before it split a chunk at once (a find, a
    copy and a delete per line)."""

    def __init__(self, max_frame_bytes: int) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[dict[str, object]]:
        self._buf += data
        frames: list[dict[str, object]] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self._max:
                    raise ProtocolError(
                        f"frame over the {self._max} byte limit (no newline after "
                        f"{len(self._buf)} bytes)"
                    )
                return frames
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if len(line) > self._max:
                raise ProtocolError(f"frame of {len(line)} bytes is over the {self._max} limit")
            if line.strip():
                frames.append(decode(line))

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


_LINE = st.one_of(
    st.integers(0, 10**6).map(lambda i: encode("step", step=i)),
    st.sampled_from([b"\n", b"  \r\n", b"{x\n", b"[1]\n", b'{"v":2,"type":"a"}\n',
                     b"\xff\xfe\n", b'{"v":1,"type":"a","pad":"' + b"x" * 600 + b'"}\n',
                     b"x" * 700, b'{"v":1,"type":"a"}']),
    st.binary(max_size=30),
)


@settings(max_examples=300)
@given(st.lists(_LINE, max_size=12), st.lists(st.integers(1, 300), min_size=1, max_size=8))
def test_frame_buffer_reads_any_stream_as_a_line_at_a_time(
    lines: list[bytes], sizes: list[int]
) -> None:
    """Frames, refusals (with their words) and what stays buffered after each feed, fed on
    after a refusal too, are those of the reference that reads a line at a time."""
    stream = b"".join(lines)
    fast, slow = FrameBuffer(max_frame_bytes=512), _LineAtATime(max_frame_bytes=512)
    start, turn = 0, 0
    while start < len(stream):
        chunk = stream[start : start + sizes[turn % len(sizes)]]
        start, turn = start + len(chunk), turn + 1
        assert _outcome(fast.feed, chunk) == _outcome(slow.feed, chunk)
        assert fast.pending_bytes == slow.pending_bytes


# -- the package keeps the module's public face ---------------------------------------------


def test_every_public_class_keeps_its_home_in_the_package() -> None:
    """The protocol is a package of modules, but its classes say ``trainer_runtime.protocol``
    as they did when it was one module: gpuwatch.runstate.codec's schema id hashes that name
    (snapshot.json written before stays readable), and so do pickles and tracebacks. Their
    annotations resolve there too (typing.get_type_hints, which the snapshot codec uses)."""
    import pickle
    import typing

    from trainer_runtime import protocol

    classes = [v for v in map(protocol.__dict__.get, protocol.__all__) if isinstance(v, type)]
    assert len(classes) > 20
    for cls in classes:
        assert cls.__module__ == "trainer_runtime.protocol", cls
        assert getattr(protocol, cls.__qualname__) is cls
        if dataclasses.is_dataclass(cls):
            typing.get_type_hints(cls)
        assert pickle.loads(pickle.dumps(cls)) is cls
