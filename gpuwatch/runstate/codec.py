"""Snapshots of dataclass state as JSON: a generic, versioned encoding driven by type hints.

The supervisor writes its fold of the run down now and then (snapshot.json, and the
first frames an attaching dashboard gets), so a dashboard starts from the fold up to some
seq instead of replaying every event. Nothing here knows RunState's fields: ``encode``
walks any dataclass's fields and ``decode`` rebuilds one from the declared types, so a
field added anywhere is carried without a line changed here. A type it cannot encode is a
``SnapshotError`` when the codec is built, never a silent loss; a field with metadata
``{"snapshot": False}`` (``LOCAL``) is left out and rebuilt from its default.
``schema_id(cls)`` names the format (the encoding's version plus a hash of every
reachable dataclass's fields and types): a reader takes a snapshot only of its own
format, else it replays the events.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections import deque
from collections.abc import Callable
from functools import cache
from typing import Any

# The encoding's own version: bump it when the way values are written changes.
ENCODING_VERSION = 1

# A class's module is part of the schema id (its own name, and its fields' types): a
# module moved makes the snapshot.json files written before it unreadable, and their
# readers fold all of events.jsonl instead, as for any other change of layout. A snapshot
# is a cache of the fold; the events are the record.


class SnapshotError(ValueError):
    """A snapshot that cannot be made or read (the caller falls back to replaying events)."""


Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]  # (encode, decode)


def encode(value: Any) -> Any:
    """A dataclass instance as JSON-ready data (dicts, lists, numbers, strings, None)."""
    kind: Any = type(value)
    return _codec(kind)[0](value)


def decode(cls: type, data: Any) -> Any:
    """An instance of the dataclass cls rebuilt from encode()'s data; SnapshotError if not."""
    kind: Any = cls
    try:
        return _codec(kind)[1](data)
    except SnapshotError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise SnapshotError(f"snapshot does not fit {cls.__name__}: {exc}") from None


def dumps(value: Any, cls: type | None = None) -> str:
    """The snapshot text of a dataclass instance: its schema id and its data, one JSON object."""
    schema = schema_id(cls or type(value))
    return json.dumps({"schema": schema, "data": encode(value)}, separators=(",", ":"))


def loads(cls: type, text: str | bytes) -> Any:
    """The instance a dumps() text holds; SnapshotError if unreadable or of another schema."""
    try:
        wrapper = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"snapshot is not JSON ({exc})") from None
    if not isinstance(wrapper, dict) or "data" not in wrapper:
        raise SnapshotError("snapshot is not an object with data")
    want = schema_id(cls)
    if wrapper.get("schema") != want:
        raise SnapshotError(f"snapshot schema {wrapper.get('schema')!r} is not {want!r}")
    return decode(cls, wrapper["data"])


# The metadata of a field left out of snapshots: ``field(..., metadata=LOCAL)``.
LOCAL = {"snapshot": False}


def snapshotted(f: dataclasses.Field[Any]) -> bool:
    return bool(f.metadata.get("snapshot", True))


def schema_id(cls: type) -> str:
    """'1-<hash>': the encoding version and a hash of every dataclass layout reachable from cls."""
    return _schema_id(cls)


@cache
def _schema_id(cls: Any) -> str:
    layouts: list[str] = []
    seen: set[type] = set()
    todo: list[Any] = [cls]
    while todo:
        hint = todo.pop()
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            if hint in seen:
                continue
            seen.add(hint)
            hints = _hints(hint)
            parts = [
                f"{f.name}:{hints[f.name]!r}" for f in dataclasses.fields(hint) if snapshotted(f)
            ]
            layouts.append(f"{hint.__module__}.{hint.__qualname__}({','.join(parts)})")
            todo.extend(hints[f.name] for f in dataclasses.fields(hint) if snapshotted(f))
        else:
            todo.extend(typing.get_args(hint))
    _codec(cls)  # a layout that cannot be encoded is refused here, not when first used
    digest = hashlib.sha256("\n".join(sorted(layouts)).encode()).hexdigest()[:16]
    return f"{ENCODING_VERSION}-{digest}"


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError) as exc:
        raise SnapshotError(f"{cls.__qualname__}: field types cannot be read ({exc})") from None


def _identity(value: Any) -> Any:
    return value


_PLAIN = (type(None), bool, int, float, str)


@cache
def _codec(hint: Any) -> Codec:
    """The (encode, decode) pair for a declared type, built once per type."""
    if hint is Any or hint in _PLAIN:
        return _identity, _identity
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass_codec(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return _union_codec(hint, args)
    if origin in (list, tuple, set, frozenset) and args:
        item = args[0]
        homogeneous = len(set(args)) == 1 or (len(args) == 2 and args[1] is Ellipsis)
        if origin is tuple and not homogeneous:
            raise SnapshotError(f"snapshot: {hint!r} (a mixed tuple) cannot be encoded")
        return _sequence_codec(origin, _codec(item))
    if origin is deque and args:
        return _deque_codec(_codec(args[0]))
    if origin is dict and len(args) == 2:
        return _dict_codec(args[0], _codec(args[1]))
    raise SnapshotError(f"snapshot: a field of type {hint!r} cannot be encoded")


def _union_codec(hint: Any, args: tuple[Any, ...]) -> Codec:
    arms = [a for a in args if a is not type(None)]
    if all(a in _PLAIN or a is Any for a in arms):
        return _identity, _identity
    if len(arms) != 1:
        raise SnapshotError(f"snapshot: {hint!r} (a union of containers) cannot be encoded")
    enc, dec = _codec(arms[0])
    return (lambda v: None if v is None else enc(v)), (lambda d: None if d is None else dec(d))


def _sequence_codec(origin: type, item: Codec) -> Codec:
    enc, dec = item

    def encode_items(value: Any) -> list[Any]:
        return [enc(v) for v in value]

    def decode_items(data: Any) -> Any:
        if not isinstance(data, list):
            raise SnapshotError(f"snapshot: expected a list for a {origin.__name__}")
        return origin(dec(d) for d in data)

    return encode_items, decode_items


def _deque_codec(item: Codec) -> Codec:
    enc, dec = item

    def encode_deque(value: deque[Any]) -> dict[str, Any]:
        return {"maxlen": value.maxlen, "items": [enc(v) for v in value]}

    def decode_deque(data: Any) -> deque[Any]:
        maxlen = data["maxlen"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise SnapshotError("snapshot: a deque's maxlen is not a count")
        return deque((dec(d) for d in data["items"]), maxlen=maxlen)

    return encode_deque, decode_deque


def _dict_codec(key: Any, value: Codec) -> Codec:
    if key not in (str, int):
        raise SnapshotError(f"snapshot: dict keys of type {key!r} cannot be encoded")
    enc, dec = value

    def encode_dict(data: dict[Any, Any]) -> dict[str, Any]:
        return {str(k): enc(v) for k, v in data.items()}

    def decode_dict(data: Any) -> dict[Any, Any]:
        if not isinstance(data, dict):
            raise SnapshotError("snapshot: expected an object for a dict")
        return {key(k): dec(v) for k, v in data.items()}

    return encode_dict, decode_dict


def _dataclass_codec(cls: type) -> Codec:
    hints = _hints(cls)
    plan: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = []
    for f in dataclasses.fields(cls):
        if snapshotted(f):
            enc, dec = _codec(hints[f.name])
            plan.append((f.name, enc, dec))
    init_names = {f.name for f in dataclasses.fields(cls) if f.init}

    def encode_instance(value: Any) -> dict[str, Any]:
        return {name: enc(getattr(value, name)) for name, enc, _ in plan}

    def decode_instance(data: Any) -> Any:
        if not isinstance(data, dict):
            raise SnapshotError(f"snapshot: expected an object for {cls.__name__}")
        values = {name: dec(data[name]) for name, _, dec in plan}
        instance = cls(**{k: v for k, v in values.items() if k in init_names})
        for name, value in values.items():
            if name not in init_names:
                object.__setattr__(instance, name, value)
        return instance

    return encode_instance, decode_instance
