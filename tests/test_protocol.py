"""The wire: NDJSON frames with a version, a type and a size limit."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
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
