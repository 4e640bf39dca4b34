"""Wire format shared by trainer, supervisor and dashboard: NDJSON frames over AF_UNIX.

Stdlib only: this module is imported by both sides of every socket, so it must
not pull in TensorFlow, Textual or gpuwatch.

Every frame is one JSON object on one line, with ``"v"`` (the protocol version,
an integer) and ``"type"``. A frame longer than ``MAX_FRAME_BYTES``, one that is
not UTF-8, not JSON, not an object, nested deeper than ``MAX_NESTING_DEPTH``, or
lacks ``v``/``type`` is a ``ProtocolError`` (every decode failure is one, never
anything else); the reader of a connection counts it and closes that connection,
never crashes.

Frame types
-----------
trainer -> supervisor (the trainer's telemetry socket):
  hello       attempt, pid, tf_version, replicas, device_kind ("gpu"|"cpu"),
              devices [str], param_count, param_bytes, global_batch_size,
              accumulation_steps, per_replica_batch, start_step, start_micro_step
  step        attempt, step (optimizer steps so far, counted across attempts),
              micro_step (micro-batches so far), epoch, loss, lr, examples
              (examples in this optimizer step = global batch), step_time_ms,
              input_wait_ms (host time blocked on the input iterator),
              grad_sync_bytes (estimated all-reduce bytes in this step), t,
              dropped (telemetry frames dropped so far)
  checkpoint  attempt, step, micro_step, path, seconds
  resume      attempt, from_step, from_micro_step, checkpoint (path or None)
  done        attempt, reason ("max_steps"|"epochs"|"sigterm"|"socket_lost"), step
  error       attempt, kind ("config"|"factory"|"runtime"), message

supervisor -> dashboard (each carries "seq", its line number in events.jsonl,
and "t"): every trainer frame above, relayed with "seq", plus
  run         run_id, config_path, created, supervisor_pid, host, settings
  attempt     attempt, settings (the full validated config), fresh, reason
  status      status (see STATUSES), attempt, exit_code, signal, message, log_tail [str]
  sample      host {cpu_pct, mem_used_bytes, mem_total_bytes, ...},
              gpus [dict], nvml (None when NVML works, else why it does not)
  ack / err   id (the command's), message (err only), and any result fields

dashboard -> supervisor (commands, each with an "id" the reply echoes):
  subscribe   from_seq: send every recorded event with seq >= from_seq, then live
  relaunch    overrides {"dotted.key": value}, fresh: bool
  stop        (stop the trainer and the run)
  status      (reply carries the current status and attempt)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20
# The deepest a frame may nest (the frame object itself is level 1). Real frames nest
# 4-6 levels (settings -> model -> kwargs -> ...); the limit sits far below Python's
# recursion limit, so nothing that walks a frame later (json.dumps when relaying,
# pydantic, copy) can blow the stack on one.
MAX_NESTING_DEPTH = 64

# "relaunching": the old attempt stopped and a new one is about to start (not terminal).
STATUSES = (
    "starting",
    "running",
    "stopping",
    "relaunching",
    "stopped",
    "finished",
    "crashed",
    "lost",
)
TERMINAL_STATUSES = frozenset({"stopped", "finished", "crashed", "lost"})


class ProtocolError(ValueError):
    """A frame that cannot be accepted: too long, not UTF-8, not JSON, wrong shape."""


# -- frames ---------------------------------------------------------------------------


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
        frame = json.loads(text)
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
        """Add bytes; return the complete frames they finish. Raises ProtocolError."""
        self._buf += data
        frames: list[dict[str, Any]] = []
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
