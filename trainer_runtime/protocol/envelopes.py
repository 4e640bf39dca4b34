"""The envelope of every event frame, written and read: the one place for both.

``event_frame`` writes "v", "type", "seq" (the supervisor's: the line number in
events.jsonl) and "t" (the sender's clock) before the event's fields; ``parse_event``
reads them back and checks every field against its declared type, with fast paths
built per event type from the declarations (``_PLAIN_FIELDS``, ``_NULLABLE_FIELDS``,
``_EVENT_MAKERS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from types import MappingProxyType
from typing import Any

from trainer_runtime.protocol.events import EVENTS, Event
from trainer_runtime.protocol.framing import (
    PROTOCOL_VERSION,
    ProtocolError,
    _one_line,
    _show,
    encode_frame,
)
from trainer_runtime.protocol.wire import (
    _finite_number,
    _plain_type,
    _type_check,
    _type_encoder,
)

ENVELOPE = ("v", "type", "seq", "t")

# Each event's field names, in order: event_frame runs for every event recorded, and
# dataclasses.fields() rebuilds its tuple on every call.
_FIELD_NAMES: Mapping[type[Event], tuple[str, ...]] = MappingProxyType(
    {cls: tuple(f.name for f in fields(cls)) for cls in EVENTS.values()}
)

# The fields not written as they are (the sample records: samples.wire_object), per event
# type that has any: the others' values go into the frame untouched.
_FIELD_ENCODERS: Mapping[type[Event], dict[str, Callable[[Any], Any]]] = MappingProxyType(
    {
        cls: encoders
        for cls in EVENTS.values()
        if (encoders := {f.name: encode for f in fields(cls)
                         if (encode := _type_encoder(f.type)) is not None})
    }
)


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every frame carries besides its event."""

    type: str
    seq: int | None = None
    t: float | None = None


def event_frame(event: Event, *, t: float | None = None, seq: int | None = None
                ) -> dict[str, Any]:
    """The frame dict of an event: envelope first, then its fields. The one place it is built."""
    frame: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": event.TYPE}
    if seq is not None:
        frame["seq"] = seq
    if t is not None:
        frame["t"] = t
    names = _FIELD_NAMES.get(type(event))
    for name in names if names is not None else (f.name for f in fields(event)):
        frame[name] = getattr(event, name)
    encoders = _FIELD_ENCODERS.get(type(event))
    if encoders is not None:
        for name, encode in encoders.items():
            frame[name] = encode(frame[name])
    return frame


def encode_event(event: Event, *, t: float | None = None, seq: int | None = None) -> bytes:
    """One event as bytes, newline included."""
    return encode_frame(event_frame(event, t=t, seq=seq))


def parse_event(frame: Mapping[str, Any]) -> tuple[Envelope, Event]:
    """The envelope and the typed event of a decoded frame; ProtocolError if it is not one.

    Every declared field is checked against its type (an int is never a bool; a
    float field takes an int); a missing field without a default, an unknown field
    or an unknown type is refused.
    """
    frame_type = frame.get("type")
    cls = EVENTS.get(frame_type) if isinstance(frame_type, str) else None
    if cls is None:
        raise ProtocolError(f"unknown event type {_show(frame_type)}")
    seq, t = frame.get("seq"), frame.get("t")
    if seq is not None and (type(seq) is not int or seq < 0):
        raise ProtocolError(f"{cls.TYPE}: seq must be an integer >= 0 (got {_show(seq)})")
    if t is not None and not _finite_number(t):
        raise ProtocolError(f"{cls.TYPE}: t must be a number (got {_show(t)})")
    checks = _EVENT_CHECKS[cls.TYPE]
    plain = _PLAIN_FIELDS[cls.TYPE].get
    nullable = _NULLABLE_FIELDS[cls.TYPE]
    isfinite = math.isfinite
    values: dict[str, Any] = dict(_EVENT_DEFAULTS[cls.TYPE])  # the frame's fields replace them
    for key, value in frame.items():
        # The common cases first (the dashboard reads 100 steps a second): a value already
        # of its field's exact type (a finite float for a float), or None where the field
        # takes None, kept as it is; anything else takes the full check below.
        got = type(value)
        if got is plain(key) and (got is not float or isfinite(value)):
            values[key] = value
            continue
        if value is None and key in nullable:
            values[key] = None
            continue
        if key in _ENVELOPE_KEYS:
            continue
        check = checks.get(key)
        if check is None:
            raise ProtocolError(f"{cls.TYPE}: unknown field {_show(key)}")
        ok, kept = check(value)
        if not ok:
            raise ProtocolError(f"{cls.TYPE}: {key} must be {kept} (got {_show(value)})")
        values[key] = kept
    try:
        event = _EVENT_MAKERS[cls](values)
    except TypeError as exc:
        raise ProtocolError(f"{cls.TYPE}: {_one_line(exc)}") from None
    return Envelope(cls.TYPE, seq, float(t) if t is not None else None), event


_EVENT_CHECKS: Mapping[str, Mapping[str, Callable[[Any], tuple[bool, Any]]]] = MappingProxyType(
    {
        name: MappingProxyType({f.name: _type_check(f.type) for f in fields(cls)})
        for name, cls in EVENTS.items()
    }
)


# parse_event's fast path, per event type: each field's plain type, and the fields that
# take None. Plain dicts: a MappingProxyType's get costs a call more per field.
_PLAIN_FIELDS: Mapping[str, dict[str, type]] = MappingProxyType(
    {
        name: {f.name: plain for f in fields(cls) if (plain := _plain_type(f.type)) is not None}
        for name, cls in EVENTS.items()
    }
)
_NULLABLE_FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        name: frozenset(key for key, check in checks.items() if check(None) == (True, None))
        for name, checks in _EVENT_CHECKS.items()
    }
)
_ENVELOPE_KEYS = frozenset(ENVELOPE)
assert not any(f.name in _ENVELOPE_KEYS for cls in EVENTS.values() for f in fields(cls))


def _event_maker(cls: type[Event]) -> Callable[[Mapping[str, Any]], Event]:
    """``cls(**values)`` for values parse_event has checked, each slot set directly.

    A frozen dataclass's __init__ sets every field through object.__setattr__: for a
    step that cost more than all of parse_event's checks. When values holds every field
    (parse_event starts from the defaults: _EVENT_DEFAULTS) this sets the same slots to
    the same values; else it is ``cls(**values)`` itself (a default factory to call, or
    a field missing: the dataclass's own TypeError).
    """
    assert not hasattr(cls, "__post_init__"), cls  # that would have to run here too
    new = object.__new__
    slots = tuple((f.name, getattr(cls, f.name).__set__) for f in fields(cls))

    def make(values: Mapping[str, Any]) -> Event:
        event = new(cls)
        try:
            for name, set_slot in slots:
                set_slot(event, values[name])
        except KeyError:
            return cls(**values)
        return event

    return make


# Each event's plain defaults (not its default factories: a new list each time).
_EVENT_DEFAULTS: Mapping[str, dict[str, Any]] = MappingProxyType(
    {
        name: {f.name: f.default for f in fields(cls) if f.default is not MISSING}
        for name, cls in EVENTS.items()
    }
)
_EVENT_MAKERS: Mapping[type[Event], Callable[[Mapping[str, Any]], Event]] = MappingProxyType(
    {cls: _event_maker(cls) for cls in EVENTS.values()}
)
