"""Wire kinds: what a declared field accepts, and the check that enforces it.

A command's field carries its ``WireKind`` in its metadata (``_wire``): the words the
reference shows and the check ``parse_command`` runs. An event's field is checked by its
declared type, a string (``int``, ``float | None``, ``list[str]``, ...): ``_type_check``
makes its check, ``_plain_type`` the type its value has when it needs no conversion
(``parse_event``'s fast path). A field of the sample records (``HostSample``,
``list[GpuSample]``, ``GpuSummary | None``: ``samples.py``) is read by their check and
written by ``_type_encoder``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias

from trainer_runtime.protocol.framing import MAX_NESTING_DEPTH, _show
from trainer_runtime.protocol.samples import RECORDS, WireRecordError, _field_check, wire_object

# Bounds on command fields.
MAX_WIRE_INT = 2**53 - 1  # the largest integer every JSON reader holds exactly
MAX_ID_CHARS = 128
MAX_OVERRIDES = 64
MAX_OVERRIDE_KEY_CHARS = 128

# -- command fields: a WireKind each ------------------------------------------------------

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


def _check_snapshot_format(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS:
        return str(value)
    raise SNAPSHOT_FORMAT.refuse(value)


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
SNAPSHOT_FORMAT = WireKind(
    f"a string of 1 to {MAX_ID_CHARS} characters or null", _check_snapshot_format
)
OVERRIDES = WireKind(
    f"an object of at most {MAX_OVERRIDES} dotted keys (like \"data.prefetch\") "
    "to JSON values",
    _check_overrides,
)


def _wire(kind: WireKind, note: str = "") -> dict[str, Any]:
    """A command field's metadata: its wire kind, and a note for the reference."""
    return {"kind": kind, "note": note}


# -- event fields: checked by their declared type -----------------------------------------


def _finite_number(value: Any) -> bool:
    """An int or float a float can hold (10**400 is neither: OverflowError, so False)."""
    if type(value) not in (int, float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _type_check(annotation: Any) -> Callable[[Any], tuple[bool, Any]]:
    """A check for one declared field type: (True, value kept) or (False, words)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    optional = text.endswith(" | None")
    base = text.removesuffix(" | None")
    simple: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any], str]] = {
        "int": (lambda v: type(v) is int, int, "an integer"),
        "float": (
            _finite_number,
            float,
            "a finite number",
        ),
        "str": (lambda v: isinstance(v, str), str, "a string"),
        "bool": (lambda v: v is True or v is False, bool, "true or false"),
        "list[str]": (
            lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v),
            list,
            "a list of strings",
        ),
        "list[int]": (
            lambda v: isinstance(v, list) and all(type(i) is int for i in v),
            list,
            "a list of integers",
        ),
        "list[float]": (
            lambda v: isinstance(v, list) and len(v) <= 16 and all(map(_finite_number, v)),
            lambda v: [float(i) for i in v],
            "a list of at most 16 finite numbers",
        ),
        "dict[str, Any]": (lambda v: isinstance(v, dict), dict, "an object"),
        "list[dict[str, Any]]": (
            lambda v: isinstance(v, list) and all(isinstance(i, dict) for i in v),
            list,
            "a list of objects",
        ),
    }
    if base not in simple:
        return _record_check(text, base)
    accepts, convert, words = simple[base]
    words = f"{words} or null" if optional else words

    def check(value: Any) -> tuple[bool, Any]:
        if value is None and optional:
            return True, None
        if accepts(value):
            return True, convert(value)
        return False, words

    return check


def _record_name(base: str) -> str | None:
    """The sample record a field type names (``HostSample``, ``list[GpuSample]``), if any."""
    name = base.removeprefix("list[").removesuffix("]") if base.startswith("list[") else base
    return name if name in RECORDS else None


def _record_check(text: str, base: str) -> Callable[[Any], tuple[bool, Any]]:
    """The check of a field that carries the protocol's sample records (``samples.py``)."""
    if _record_name(base) is None:
        raise TypeError(f"event field type {text!r} has no wire check")
    read = _field_check(text)  # "X | None" takes null, and says so

    def check(value: Any) -> tuple[bool, Any]:
        try:
            return True, read(value)
        except WireRecordError as exc:
            return False, str(exc)

    return check


def _type_encoder(annotation: Any) -> Callable[[Any], Any] | None:
    """How a field's value is written in a frame, when it is not as it is: the sample
    records as their wire objects (``samples.wire_object``); None for every other field."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    base = text.removesuffix(" | None")
    if _record_name(base) is None:
        return None
    if base.startswith("list["):
        return lambda value: None if value is None else [wire_object(item) for item in value]
    return lambda value: None if value is None else wire_object(value)


def _plain_type(annotation: Any) -> type | None:
    """The type a field's value has when it needs no conversion (int, float, str, bool)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return {"int": int, "float": float, "str": str, "bool": bool}.get(
        text.removesuffix(" | None")
    )
