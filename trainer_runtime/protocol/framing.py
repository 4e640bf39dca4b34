"""Framing: one JSON object per line, its size and nesting limits, frames read and written.

Every frame is one JSON object on one line, with ``"v"`` (``PROTOCOL_VERSION``) and
``"type"``. ``encode``/``encode_frame`` refuse what ``decode`` would; ``decode``, and
``FrameBuffer`` over a byte stream, raise ``ProtocolError`` and nothing else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20
# The deepest a frame may nest (the frame object itself is level 1). Real frames nest
# 4-6 levels (settings -> model -> kwargs -> ...); the limit sits far below Python's
# recursion limit, so nothing that walks a frame later (json.dumps when relaying,
# pydantic, copy) can blow the stack on one.
MAX_NESTING_DEPTH = 64


class ProtocolError(ValueError):
    """A frame that cannot be accepted: too long, not UTF-8, not JSON, wrong shape."""


def encode(frame_type: str, **fields: Any) -> bytes:
    """One frame as bytes, newline included."""
    frame = {"v": PROTOCOL_VERSION, "type": frame_type, **fields}
    return encode_frame(frame)


def encode_frame(frame: dict[str, Any]) -> bytes:
    """Serialise an already-built frame dict (must carry v and type).

    Anything the reader would refuse is refused here, as a ProtocolError (a
    ValueError): NaN, values JSON cannot hold, nesting over the limit, size.
    """
    try:
        data = json.dumps(frame, separators=(",", ":"), allow_nan=False, default=_jsonable)
    except RecursionError:
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"frame cannot be sent as JSON ({_one_line(exc)})") from None
    if _may_nest_deeper_than(data, MAX_NESTING_DEPTH) and _nests_deeper_than(
        frame, MAX_NESTING_DEPTH
    ):
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels")
    out = data.encode("utf-8") + b"\n"
    if len(out) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(out)} bytes is over the {MAX_FRAME_BYTES} limit")
    return out


def _jsonable(value: Any) -> Any:
    # numpy scalars and the like expose item(); anything else becomes its repr.
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return repr(value)


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (with or without its newline) into a frame dict.

    Raises ProtocolError, and only that, for anything it cannot accept.
    """
    if len(line) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(line)} bytes is over the {MAX_FRAME_BYTES} limit")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"frame is not UTF-8 ({exc.reason})") from None
    try:
        frame = _loads(text)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"frame is not JSON ({exc.msg})") from None
    except RecursionError:
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except Exception as exc:  # e.g. ValueError for an integer of over 4300 digits
        raise ProtocolError(f"frame is not acceptable JSON ({_one_line(exc)})") from None
    if not isinstance(frame, dict):
        raise ProtocolError("frame is not a JSON object")
    if _may_nest_deeper_than(text, MAX_NESTING_DEPTH) and _nests_deeper_than(
        frame, MAX_NESTING_DEPTH
    ):
        raise ProtocolError(f"frame nests deeper than {MAX_NESTING_DEPTH} levels")
    version = frame.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"frame has protocol version {_show(version)}, want {PROTOCOL_VERSION}")
    if not isinstance(frame.get("type"), str):
        raise ProtocolError("frame has no string 'type'")
    return frame


# json.loads without its two whitespace matches and its checks around the scan: json's
# own scanner, as json.loads's decoder has it (the same default settings), called directly
# (JSONDecoder.__init__ sets scan_once; typeshed does not list it).
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str) -> Any:
    """json.loads(text): the same value, or the same exception from json.loads itself.

    The common frame is one JSON value from its first character to its last; that is
    read by the scanner alone. Anything else (leading or trailing whitespace or text, a
    byte order mark, bad JSON, deep nesting) goes to json.loads, which reads it again
    and raises exactly what it always did.
    """
    try:
        value, end = _scan_once(text, 0)
    except Exception:  # StopIteration, JSONDecodeError, RecursionError, ValueError, ...
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _may_nest_deeper_than(text: str, limit: int) -> bool:
    # Nesting needs an opening bracket per level, so a text with few of them (a flat
    # step frame has one) cannot be too deep: two C-speed counts instead of a walk.
    return text.count("{") + text.count("[") > limit


def _nests_deeper_than(value: Any, limit: int) -> bool:
    """True when lists/dicts in value nest more than limit levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class FrameBuffer:
    """Splits a byte stream into frames; enforces the size limit before a newline arrives."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add bytes; return the complete frames they finish. Raises ProtocolError.

        On a bad line the lines before it are lost with the exception, the bad line is
        gone and the lines after it stay in the buffer, as if read one at a time.
        """
        self._buf += data
        frames: list[dict[str, Any]] = []
        if self._buf.find(b"\n") >= 0:
            # One split for all the lines a chunk completes (a reader that is behind gets
            # hundreds at once), not a find, a copy and a delete for each.
            *lines, rest = bytes(self._buf).split(b"\n")
            self._buf = bytearray(rest)
            for index, line in enumerate(lines):
                try:
                    if len(line) > self._max:
                        raise ProtocolError(
                            f"frame of {len(line)} bytes is over the {self._max} limit"
                        )
                    if line.strip():
                        frames.append(decode(line))
                except ProtocolError:
                    self._buf = bytearray(b"\n".join([*lines[index + 1 :], rest]))
                    raise
        if len(self._buf) > self._max:
            raise ProtocolError(
                f"frame over the {self._max} byte limit (no newline after "
                f"{len(self._buf)} bytes)"
            )
        return frames

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)


def _show(value: Any) -> str:
    """A short, one-line JSON-ish rendering of a refused value, for messages."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        bits = value.bit_length()
        return str(value) if bits <= 128 else f"an integer of {bits} bits"
    if isinstance(value, float):
        return json.dumps(value) if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value[:60]) + ("..." if len(value) > 60 else "")
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return f"a {type(value).__name__}"
