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
              (examples trained on in this optimizer step, counted in the graph),
              position (examples trained on so far, all attempts), step_time_ms,
              input_wait_ms (host time blocked on the input iterator),
              grad_sync_bytes (estimated all-reduce bytes in this step), t,
              dropped (telemetry frames dropped so far)
  checkpoint  attempt, step, micro_step, path, seconds
  resume      attempt, from_step, from_micro_step, checkpoint (path or None),
              position (examples trained on before the checkpoint), data_order
              ("continued"|"restarted"), data_note (why it restarted, else ""),
              lost_steps (added by the supervisor: steps since the checkpoint)
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

dashboard -> supervisor (commands; each answered by ack or err). Every field is
checked by type and range; an unknown command or field, or a value of the wrong
kind (1 is not true, true is not 1), is answered err and changes nothing.
  (any)       fields every command may carry
              id: a string of at most 128 characters, an integer (-9007199254740991 to
                9007199254740991) or null; default null; the reply echoes it (when it
                is valid)
  subscribe   Send every recorded event with seq >= from_seq, then live ones.
              from_seq: an integer from 0 to 9007199254740991; default 0
  relaunch    Stop the trainer, start a new attempt with these settings (resumes from
              checkpoint).
              overrides: an object of at most 64 dotted keys (like "data.prefetch") to
                JSON values; default {}; validated as the config is
              fresh: true or false; default false; only a literal true starts from
                step 0, discarding progress
  stop        Stop the trainer (it checkpoints first) and the run.
  status      The reply carries the current status, attempt, step, pids and counters.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20
# The deepest a frame may nest (the frame object itself is level 1). Real frames nest
# 4-6 levels (settings -> model -> kwargs -> ...); the limit sits far below Python's
# recursion limit, so nothing that walks a frame later (json.dumps when relaying,
# pydantic, copy) can blow the stack on one.
MAX_NESTING_DEPTH = 64

# Bounds on command fields.
MAX_WIRE_INT = 2**53 - 1  # the largest integer every JSON reader holds exactly
MAX_ID_CHARS = 128
MAX_OVERRIDES = 64
MAX_OVERRIDE_KEY_CHARS = 128

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


class InvalidCommand(ProtocolError):
    """A well-formed frame that is not a valid command; the message names command and field.

    ``command_id`` is the frame's id when that id is itself valid (the ``err`` reply
    echoes it), else None. ``field`` names the offending field ("v", "type", ...).
    """

    def __init__(
        self, message: str, command_id: CommandId = None, field_name: str | None = None
    ) -> None:
        super().__init__(message)
        self.command_id = command_id
        self.field = field_name


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


# -- commands: dashboard -> supervisor ----------------------------------------------------
#
# Each command is declared once, as a frozen dataclass whose fields carry their wire
# kind (what JSON they accept). parse_command, command_frame and command_reference
# (the text in this module's docstring and in docs/internals.md) all read these
# declarations; nothing else describes a command.

CommandId: TypeAlias = str | int | None


class _Refused(Exception):
    """A field's value is refused; ``reason`` completes "<command>: <field> ..."."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class WireKind:
    """What one command field accepts: the words for it, and the check that enforces them.

    ``check`` returns the value to keep (of exactly the declared Python type) or
    raises _Refused.
    """

    describe: str
    check: Callable[[Any], Any]

    def refuse(self, value: Any) -> _Refused:
        return _Refused(f"must be {self.describe} (got {_show(value)})")


def _check_bool(value: Any) -> bool:
    # Only JSON true/false: not 1, not "yes", not "no" (which bool() would call true).
    if value is True or value is False:
        return bool(value)
    raise BOOL.refuse(value)


def _check_seq(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_WIRE_INT:
        return int(value)
    raise SEQ.refuse(value)


def _check_id(value: Any) -> CommandId:
    if value is None:
        return None
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS:
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_WIRE_INT:
        return int(value)
    raise COMMAND_ID.refuse(value)


_DOTTED_KEY = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")


def _check_overrides(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise OVERRIDES.refuse(value)
    if len(value) > MAX_OVERRIDES:
        raise _Refused(f"has {len(value)} keys; at most {MAX_OVERRIDES}")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        if (
            not isinstance(key, str)
            or len(key) > MAX_OVERRIDE_KEY_CHARS
            or not _DOTTED_KEY.fullmatch(key)
        ):
            raise _Refused(
                f"key {_show(key)} is not a dotted key (names of letters, digits and _ "
                f"between dots, at most {MAX_OVERRIDE_KEY_CHARS} characters)"
            )
        try:
            # Level 3: inside the frame (1) and the overrides object (2), as on the wire.
            checked[str(key)] = _json_value(item, 3)
        except _Refused as exc:
            raise _Refused(f"[{_show(key)}] {exc.reason}") from None
    return MappingProxyType(checked)


def _json_value(value: Any, depth: int) -> Any:
    """A copy of value made of JSON types only (the frame nests at most MAX_NESTING_DEPTH)."""
    if depth > MAX_NESTING_DEPTH:
        raise _Refused(f"nests deeper than {MAX_NESTING_DEPTH} levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(item, depth + 1) for item in value]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused(f"must be a JSON value (got an object key {_show(key)})")
            out[str(key)] = _json_value(item, depth + 1)
        return out
    raise _Refused(f"must be a JSON value (got {_show(value)})")


BOOL = WireKind("true or false", _check_bool)
SEQ = WireKind(f"an integer from 0 to {MAX_WIRE_INT}", _check_seq)
COMMAND_ID = WireKind(
    f"a string of at most {MAX_ID_CHARS} characters, an integer "
    f"(-{MAX_WIRE_INT} to {MAX_WIRE_INT}) or null",
    _check_id,
)
OVERRIDES = WireKind(
    f"an object of at most {MAX_OVERRIDES} dotted keys (like \"data.prefetch\") "
    "to JSON values",
    _check_overrides,
)


def _wire(kind: WireKind, note: str = "") -> dict[str, Any]:
    """A command field's metadata: its wire kind, and a note for the reference."""
    return {"kind": kind, "note": note}


@dataclass(frozen=True, kw_only=True)
class Command:
    """Base of the commands; ``TYPE`` is the frame type, the docstring's first line its summary."""

    TYPE: ClassVar[str] = ""
    id: CommandId = field(
        default=None, metadata=_wire(COMMAND_ID, "the reply echoes it (when it is valid)")
    )


@dataclass(frozen=True, kw_only=True)
class Subscribe(Command):
    """Send every recorded event with seq >= from_seq, then live ones."""

    TYPE: ClassVar[str] = "subscribe"
    from_seq: int = field(default=0, metadata=_wire(SEQ))


@dataclass(frozen=True, kw_only=True)
class Relaunch(Command):
    """Stop the trainer, start a new attempt with these settings (resumes from checkpoint)."""

    TYPE: ClassVar[str] = "relaunch"
    overrides: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=_wire(OVERRIDES, "validated as the config is"),
    )
    fresh: bool = field(
        default=False,
        metadata=_wire(BOOL, "only a literal true starts from step 0, discarding progress"),
    )


@dataclass(frozen=True, kw_only=True)
class Stop(Command):
    """Stop the trainer (it checkpoints first) and the run."""

    TYPE: ClassVar[str] = "stop"


@dataclass(frozen=True, kw_only=True)
class Status(Command):
    """The reply carries the current status, attempt, step, pids and counters."""

    TYPE: ClassVar[str] = "status"


COMMANDS: Mapping[str, type[Command]] = MappingProxyType(
    {cls.TYPE: cls for cls in (Subscribe, Relaunch, Stop, Status)}
)
_ENVELOPE = ("v", "type")
_FIELDS: Mapping[str, Mapping[str, WireKind]] = MappingProxyType(
    {
        name: MappingProxyType({f.name: f.metadata["kind"] for f in fields(cls)})
        for name, cls in COMMANDS.items()
    }
)


def parse_command(frame: Any) -> Command:
    """The command a decoded frame carries, every field checked; else InvalidCommand.

    Strict: v must be the integer PROTOCOL_VERSION, type a known command, every
    other key a field of that command with a value of its kind. Raises
    InvalidCommand (a ProtocolError) and nothing else, with a one-line message
    naming the command and the field.
    """
    if not isinstance(frame, Mapping):
        raise InvalidCommand(f"a command must be a JSON object (got {_show(frame)})")
    command_id = reply_id(frame)
    frame_type = frame.get("type")
    cls = COMMANDS.get(frame_type) if isinstance(frame_type, str) else None
    name = cls.TYPE if cls is not None else "command"
    version = frame.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise InvalidCommand(
            f"{name}: v must be {PROTOCOL_VERSION} (got {_show(version)})", command_id, "v"
        )
    if cls is None:
        raise InvalidCommand(
            f"command: type must be one of {', '.join(COMMANDS)} (got {_show(frame_type)})",
            command_id,
            "type",
        )
    kinds = _FIELDS[name]
    for key in frame:
        if key not in _ENVELOPE and key not in kinds:
            raise InvalidCommand(
                f"{name}: unknown field {_show(key)} ({name} takes {', '.join(kinds)})",
                command_id,
                key if isinstance(key, str) else None,
            )
    values: dict[str, Any] = {}
    for field_name, kind in kinds.items():
        if field_name in frame:
            try:
                values[field_name] = kind.check(frame[field_name])
            except _Refused as exc:
                raise InvalidCommand(
                    f"{name}: {field_name}{'' if exc.reason.startswith('[') else ' '}"
                    f"{exc.reason}",
                    command_id,
                    field_name,
                ) from None
    return cls(**values)


def reply_id(frame: Mapping[str, Any]) -> CommandId:
    """The id a reply to this frame echoes: the frame's own, when valid; else None."""
    try:
        return _check_id(frame.get("id"))
    except _Refused:
        return None


def build_command(frame_type: str, /, **values: Any) -> Command:
    """A command from a type and field values, checked exactly as the supervisor checks it."""
    return parse_command({"v": PROTOCOL_VERSION, "type": frame_type, **values})


def command_frame(command: Command) -> dict[str, Any]:
    """The frame dict of a command: envelope, then every field (id only when set)."""
    frame: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": command.TYPE}
    for f in fields(command):
        value = getattr(command, f.name)
        if f.name == "id" and value is None:
            continue
        frame[f.name] = dict(value) if isinstance(value, Mapping) else value
    return frame


def encode_command(command: Command) -> bytes:
    """One command frame as bytes, newline included."""
    return encode_frame(command_frame(command))


def command_reference(width: int = 86) -> str:
    """The commands and their fields as text, generated from the declarations.

    This module's docstring and docs/internals.md carry this text; a test checks
    that they still match it.
    """
    lines = [
        "dashboard -> supervisor (commands; each answered by ack or err). Every field is",
        "checked by type and range; an unknown command or field, or a value of the wrong",
        "kind (1 is not true, true is not 1), is answered err and changes nothing.",
    ]
    common = {f.name for f in fields(Command)}
    declared: list[type[Command]] = [Command, *COMMANDS.values()]
    for cls in declared:
        if cls is Command:
            lines.append("  (any)       fields every command may carry")
        else:
            summary = (cls.__doc__ or "").strip().splitlines()[0]
            lines.extend(
                textwrap.wrap(
                    f"{cls.TYPE:<11} {summary}",
                    width,
                    initial_indent="  ",
                    subsequent_indent=" " * 14,
                )
            )
        for f in fields(cls):
            if cls is not Command and f.name in common:
                continue
            kind: WireKind = f.metadata["kind"]
            text = f"{f.name}: {kind.describe}; default {_default_text(f)}"
            if f.metadata["note"]:
                text += f"; {f.metadata['note']}"
            lines.extend(
                textwrap.wrap(
                    text, width, initial_indent=" " * 14, subsequent_indent=" " * 16
                )
            )
    return "\n".join(lines)


def _default_text(f: Any) -> str:
    default = f.default_factory() if f.default is MISSING else f.default
    return json.dumps(dict(default) if isinstance(default, Mapping) else default)


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
