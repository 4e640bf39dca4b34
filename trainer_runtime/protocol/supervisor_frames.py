"""The frames the supervisor sends that are not events: snapshots and live settings.

A snapshot of the run's state goes to a dashboard that asks for one (in parts that
``SnapshotParts`` joins); a ``reconfigure`` frame goes down a trainer's telemetry socket.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainer_runtime.protocol.framing import (
    PROTOCOL_VERSION,
    ProtocolError,
    _show,
    encode_frame,
)
from trainer_runtime.protocol.wire import MAX_WIRE_INT

# -- supervisor -> dashboard: a snapshot of the run's state ---------------------------
#
# What a dashboard would have folded from events 0..seq, sent in parts of at most
# SNAPSHOT_PART_CHARS characters so that no frame comes near MAX_FRAME_BYTES (a part's
# text, JSON-escaped, grows at most 12x for characters outside ASCII).

SNAPSHOT = "snapshot"
SNAPSHOT_PART_CHARS = 1 << 16
# The most a client joins (a longer one is a bad frame: the connection is closed).
MAX_SNAPSHOT_CHARS = 64 << 20
_SNAPSHOT_FIELDS = frozenset({"v", "type", "seq", "schema", "part", "parts", "data"})


def snapshot_frames(seq: int, schema: str, text: str) -> list[bytes]:
    """The frames of one snapshot text (the state after event seq), in order."""
    pieces = [text[i:i + SNAPSHOT_PART_CHARS]
              for i in range(0, len(text), SNAPSHOT_PART_CHARS)] or [""]
    return [
        encode_frame({"v": PROTOCOL_VERSION, "type": SNAPSHOT, "seq": seq, "schema": schema,
                      "part": index, "parts": len(pieces), "data": piece})
        for index, piece in enumerate(pieces)
    ]


class SnapshotParts:
    """Joins snapshot frames into one ``{"type": "snapshot", seq, schema, data}`` frame.

    ``feed`` returns None until the last part, then the joined frame. A part out of
    order, of another snapshot, or over MAX_SNAPSHOT_CHARS in all is a ProtocolError.
    """

    def __init__(self) -> None:
        self._head: tuple[int, str, int] | None = None
        self._pieces: list[str] = []
        self._chars = 0

    def feed(self, frame: Mapping[str, Any]) -> dict[str, Any] | None:
        seq, schema, part, parts, data = (frame.get(k) for k in
                                          ("seq", "schema", "part", "parts", "data"))
        unknown = set(frame) - _SNAPSHOT_FIELDS
        if (unknown or type(seq) is not int or seq < 0 or not isinstance(schema, str)
                or type(part) is not int or type(parts) is not int or not 0 <= part < parts
                or not isinstance(data, str)):
            raise ProtocolError("snapshot: a part must carry seq, schema, part < parts and "
                                "data, and nothing else")
        if part == 0:
            self._head, self._pieces, self._chars = (seq, schema, parts), [], 0
        elif self._head != (seq, schema, parts) or part != len(self._pieces):
            raise ProtocolError(f"snapshot: part {part} of {parts} came out of order")
        self._chars += len(data)
        if self._chars > MAX_SNAPSHOT_CHARS:
            raise ProtocolError(f"snapshot: over {MAX_SNAPSHOT_CHARS} characters")
        self._pieces.append(data)
        if part < parts - 1:
            return None
        text, self._head, self._pieces, self._chars = "".join(self._pieces), None, [], 0
        return {"v": PROTOCOL_VERSION, "type": SNAPSHOT, "seq": seq, "schema": schema,
                "data": text}


# -- supervisor -> trainer: live settings ----------------------------------------------
#
# The one frame the supervisor sends down a trainer's telemetry socket. The trainer
# answers with a ``reconfigured`` event.

RECONFIGURE = "reconfigure"
_RECONFIGURE_FIELDS = ("v", "type", "id", "settings", "at_step", "deadline_s")
# How long after a live change reaches the trainer it may still begin to apply it; past
# that it refuses it (so a late "applied" can never follow the supervisor giving up).
LIVE_DEADLINE_S = 10.0
MAX_LIVE_DEADLINE_S = 3600.0


def reconfigure_frame(
    request_id: int, settings: dict[str, Any], at_step: int,
    deadline_s: float = LIVE_DEADLINE_S,
) -> bytes:
    """The supervisor's request to apply `settings` (the full config) from step at_step + 1.

    The trainer applies it at the first execution boundary where its step >= at_step,
    if that comes within deadline_s of the request's arrival; else it refuses it.
    """
    return encode_frame({"v": PROTOCOL_VERSION, "type": RECONFIGURE, "id": request_id,
                         "settings": settings, "at_step": at_step, "deadline_s": deadline_s})


def parse_reconfigure(frame: Mapping[str, Any]) -> tuple[int, dict[str, Any], int, float]:
    """(id, settings, at_step, deadline_s) of a decoded reconfigure frame; ProtocolError else.

    deadline_s may be left out (LIVE_DEADLINE_S).
    """
    if not isinstance(frame, Mapping):
        raise ProtocolError(f"reconfigure: a frame must be a JSON object (got {_show(frame)})")
    version = frame.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"reconfigure: v must be {PROTOCOL_VERSION} (got {_show(version)})")
    if frame.get("type") != RECONFIGURE:
        raise ProtocolError(f"reconfigure: type must be \"reconfigure\" "
                            f"(got {_show(frame.get('type'))})")
    for key in frame:
        if key not in _RECONFIGURE_FIELDS:
            raise ProtocolError(f"reconfigure: unknown field {_show(key)}")
    values: list[Any] = []
    for key in ("id", "settings", "at_step"):
        if key not in frame:
            raise ProtocolError(f"reconfigure: missing field {key!r}")
        value = frame[key]
        if key == "settings":
            if not isinstance(value, dict):
                raise ProtocolError(f"reconfigure: settings must be an object (got {_show(value)})")
        elif type(value) is not int or not 0 <= value <= MAX_WIRE_INT:
            raise ProtocolError(f"reconfigure: {key} must be an integer from 0 to "
                                f"{MAX_WIRE_INT} (got {_show(value)})")
        values.append(value)
    deadline = frame.get("deadline_s", LIVE_DEADLINE_S)
    if (type(deadline) not in (int, float) or not math.isfinite(deadline)
            or not 0 < deadline <= MAX_LIVE_DEADLINE_S):
        raise ProtocolError(f"reconfigure: deadline_s must be a number of seconds above 0 and "
                            f"at most {MAX_LIVE_DEADLINE_S:.0f} (got {_show(deadline)})")
    return values[0], dict(values[1]), values[2], float(deadline)
