"""Commands: dashboard -> supervisor, each declared once, checked field by field.

Each command is a frozen dataclass whose fields carry their wire kind (what JSON they
accept, ``wire.py``). parse_command, command_frame and command_reference (the text in
the package's docstring and in docs/internals.md) all read these declarations; nothing
else describes a command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, ClassVar

from trainer_runtime.protocol.framing import (
    PROTOCOL_VERSION,
    ProtocolError,
    _show,
    encode_frame,
)
from trainer_runtime.protocol.wire import (
    BOOL,
    COMMAND_ID,
    OVERRIDES,
    SEQ,
    SNAPSHOT_FORMAT,
    CommandId,
    WireKind,
    _check_id,
    _Refused,
    _wire,
)


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
    snapshot: str | None = field(
        default=None,
        metadata=_wire(
            SNAPSHOT_FORMAT,
            "the snapshot format the client reads (gpuwatch.runstate.codec.schema_id); when the "
            "supervisor has one of that format at seq S >= from_seq, it sends it first "
            "(snapshot frames) and then the events from S + 1; the ack says snapshot_seq",
        ),
    )
    dashboard: bool = field(
        default=False,
        metadata=_wire(
            BOOL,
            "true: a person watches (the dashboard); while one does and the run is live, "
            "a spare trainer waits for a relaunch",
        ),
    )


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
    live: bool = field(
        default=True, metadata=_wire(BOOL, "false: always a full relaunch (key R)")
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
