"""Pydantic's validation errors as plain words: one short problem per setting.

gpuwatch.config finds where a problem is (the file and line, or the --set) and puts the
message together; this module says what the problem is, in words a person acts on:
"must be at least 1 (got 0)", "must be a number, not true", "unknown key; did you mean
'prefetch'?". Never pydantic's own phrasing ("Input should be ...") and never a URL.
It reads the schema (trainer_runtime.schema) to name what a setting accepts.
"""

from __future__ import annotations

import difflib
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

import annotated_types
from pydantic import BaseModel, ValidationError

from trainer_runtime.schema import LimitError, RunConfig

__all__ = ["Loc", "Problem", "accepts", "key_text", "kind", "problems", "show"]

Loc = tuple[str | int, ...]

# Where a RunConfig check across settings without a LimitError is pointed: its
# pydantic loc is (), so the message names the first of these the input has.
_BATCH_SPLIT_KEYS: tuple[Loc, ...] = (
    ("train", "global_batch_size"),
    ("train", "accumulation_steps"),
    ("train",),
)
_SHOW_LIMIT = 60
_SCALARS = (bool, int, float, str, type(None))  # the one-value types `accepts` describes


@dataclass(frozen=True)
class Problem:
    """One problem of a config in words, and the settings it is about.

    `keys` are where to point (gpuwatch.config picks the one a `--set` changed, else the
    first the file has): one setting, or every setting of a limit across settings.
    `key` is the setting the message names, `words` what is wrong with it.
    """

    keys: tuple[Loc, ...]
    key: str
    words: str


def problems(exc: ValidationError) -> list[Problem]:
    """Every setting pydantic refused, in its order, with the problem in plain words."""
    groups: dict[Loc, list[dict[str, Any]]] = {}
    for error in exc.errors(include_url=False):
        field_loc, _ = _field_loc(tuple(error["loc"]))
        groups.setdefault(field_loc, []).append(dict(error))
    found = []
    for field_loc, errors in groups.items():
        cause = (errors[0].get("ctx") or {}).get("error")
        limit = isinstance(cause, LimitError)
        if errors[0]["type"] == "value_error" and (field_loc == () or limit):
            # A limit across settings (trainer_runtime.schema.LimitError) names its keys.
            keys = (
                tuple(_loc_from_text(k) for k in cause.keys)
                if isinstance(cause, LimitError)
                else _BATCH_SPLIT_KEYS
            )
            key = key_text(keys[0])
            words = _value_error_text(errors[0]).removeprefix(f"{key} ")
            found.append(Problem(keys, key, words))
            continue
        key_loc = field_loc
        if errors[0]["type"] == "invalid_key" or field_loc[-1:] == ("[key]",):
            # The loc ends in the bad key itself: name the mapping that holds it.
            key_loc = field_loc[:-2] if field_loc[-1:] == ("[key]",) else field_loc[:-1]
        key = key_text(key_loc) or "(top level)"
        found.append(Problem((field_loc,), key, _problem(field_loc, errors)))
    return found


def accepts(key: str) -> str:
    """What a one-value setting accepts, in the words its errors use: "'autotune' or an
    integer from 1 to 256" for "data.parallel_calls"; "" for a key the schema does not
    have and for a section, a list or a mapping."""
    _, annotation = _field_loc(_loc_from_text(key))
    if annotation is None:
        return ""
    plain = _members(annotation)
    if not all(m in _SCALARS or typing.get_origin(m) is Literal for m in plain):
        return ""
    return _describe(annotation)


def _loc_from_text(key: str) -> Loc:
    """"cluster.workers.1.host" as a loc, list positions as ints (pydantic's spelling)."""
    return tuple(int(part) if part.isdigit() else part for part in key.split("."))


def _wants_number_not_bool(annotation: Any) -> bool:
    """A number field, or a union with a number and no bool (`'autotune' | int`)."""
    plain = _members(annotation)
    return bool not in plain and any(member in (int, float) for member in plain)


def _takes_words(annotation: Any) -> bool:
    return any(typing.get_origin(member) is Literal for member in _members(annotation))


def _members(annotation: Any) -> list[Any]:
    """The types a field takes, without Annotated: [int, NoneType] for `int | None`."""
    annotation = _strip_annotated(annotation)
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    return [_strip_annotated(member) for member in members]


def _field_loc(loc: Loc) -> tuple[Loc, Any]:
    """Strip pydantic's union-member tags from a loc; returns (field loc, its annotation)."""
    annotation: Any = RunConfig
    for index, part in enumerate(loc):
        annotation = _optional_model(_strip_annotated(annotation))
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = annotation.model_fields.get(part) if isinstance(part, str) else None
            if info is None:
                return loc, None
            annotation = _field_annotation(info)
            continue
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is list and isinstance(part, int) and args:
            annotation = args[0]
        elif origin is dict and len(args) == 2:
            annotation = args[0] if part == "[key]" else args[1]
        elif _is_union(annotation) and isinstance(part, str):
            return loc[:index], annotation  # part names a union member, not a key
        else:
            return loc, None
    return loc, annotation


def _optional_model(annotation: Any) -> Any:
    """`Model | None` is the model, `list[X] | None` the list: a loc names their keys and
    items, not a union member."""
    if _is_union(annotation):
        members = [m for m in typing.get_args(annotation) if m is not type(None)]
        if len(members) == 1:
            member = _strip_annotated(members[0])
            if (isinstance(member, type) and issubclass(member, BaseModel)) or typing.get_origin(
                member
            ) in (list, dict):
                return member
    return annotation


def _field_annotation(info: Any) -> Any:
    # FieldInfo.annotation drops Annotated's constraints into .metadata; put them back.
    if info.metadata:
        return typing.Annotated[(info.annotation, *info.metadata)]
    return info.annotation


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType)


def _problem(field_loc: Loc, errors: list[dict[str, Any]]) -> str:
    _, annotation = _field_loc(field_loc)
    error = errors[0]
    shown = show(error.get("input"))
    if (
        isinstance(error.get("input"), bool)
        and annotation is not None
        and _wants_number_not_bool(annotation)
        and not _takes_words(annotation)
    ):
        # Numbers are strict (a bool is not one): say so rather than "must be an integer".
        return f"must be a number, not {shown}"
    if len(errors) > 1 and annotation is not None and _is_union(annotation):
        return f"must be {_describe(annotation)} (got {shown})"
    error_type = error["type"]
    ctx = error.get("ctx") or {}
    if error_type == "extra_forbidden":
        return _unknown_key(field_loc)
    if error_type == "invalid_key" or (field_loc and field_loc[-1] == "[key]"):
        return f"keys must be strings (got {shown})"
    if error_type == "value_error":
        return _value_error_text(error)
    if error_type == "literal_error":
        expected = str(ctx.get("expected", ""))
        choices = [part.strip().strip("'") for part in expected.replace(" or ", ", ").split(",")]
        words = f"must be {expected}" if len(choices) == 1 else f"must be one of {expected}"
        value = error.get("input")
        if isinstance(value, str):
            close = difflib.get_close_matches(value, choices, n=1)
            if close:
                return f"{words} (got {shown}); did you mean {close[0]!r}?"
        return f"{words} (got {shown})"
    bounds = {
        "greater_than": "must be greater than {gt}",
        "greater_than_equal": "must be at least {ge}",
        "less_than": "must be less than {lt}",
        "less_than_equal": "must be at most {le}",
        "multiple_of": "must be a multiple of {multiple_of}",
    }
    if error_type in bounds:
        return f"{bounds[error_type].format(**ctx)} (got {shown})"
    if error_type == "int_parsing_size" and annotation is not None:
        # A float such as 1e308 for an int: too large to become one, so past the bounds.
        return f"must be {_describe(annotation)} (got {shown})"
    # A list's length in items (it is shown by its count), a text's in characters.
    lengths = {
        "too_long": ("must have at most {max_length} item", "actual_length"),
        "too_short": ("must have at least {min_length} item", "actual_length"),
        "string_too_long": ("must be at most {max_length} character", ""),
        "string_too_short": ("must be at least {min_length} character", ""),
    }
    if error_type in lengths:
        words, count_key = lengths[error_type]
        words = words.format(**ctx)
        plural = "" if words.split()[-2] == "1" else "s"
        got = ctx.get(count_key, shown) if count_key else shown
        return f"{words}{plural} (got {got})"
    plain = {
        "int_parsing": "must be an integer",
        "int_type": "must be an integer",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping of settings",
        "model_attributes_type": "must be a mapping of settings",
        "none_required": "must be null",
    }
    if error_type == "missing":  # pydantic's "Field required": the key itself is absent
        return "is required here"
    if error_type in plain:
        return f"{plain[error_type]} (got {shown})"
    message = str(error.get("msg", "is not valid"))
    message = message.replace("Input should be", "must be").replace("Input", "value")
    if message.endswith(")") and "(got " in message:  # a message of ours that says it
        return message
    return f"{message} (got {shown})"


def _value_error_text(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if "error" in ctx:
        return str(ctx["error"])
    return str(error.get("msg", "is not valid")).removeprefix("Value error, ")


def _unknown_key(loc: Loc) -> str:
    parent = _model_at(loc[:-1])
    name = str(loc[-1])
    if parent is None:
        return "unknown key"
    fields = list(parent.model_fields)
    close = difflib.get_close_matches(name, fields, n=1)
    if close:
        return f"unknown key; did you mean {close[0]!r}?"
    # The right name in the wrong section: `train.prefetch` for `data.prefetch`.
    elsewhere = [
        f"{section}.{name}"
        for section, info in RunConfig.model_fields.items()
        if isinstance(info.annotation, type)
        and issubclass(info.annotation, BaseModel)
        and name in info.annotation.model_fields
    ]
    if elsewhere:
        return f"unknown key; did you mean {elsewhere[0]!r}?"
    return f"unknown key (expected one of: {', '.join(fields)})"


def _model_at(loc: Loc) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    for part in loc:
        info = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = info.annotation if info is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _describe(annotation: Any) -> str:
    """Plain words for what a field accepts: "true, false, 'autotune' or an integer ..."."""
    words: list[str] = []
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for member in members:
        words.extend(_describe_member(member))
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} or {words[-1]}"


def _describe_member(member: Any) -> list[str]:
    constraints: list[Any] = []
    while typing.get_origin(member) is typing.Annotated:
        member, *extra = typing.get_args(member)
        constraints.extend(extra)
    if member is bool:
        return ["true", "false"]
    if member is type(None):
        return ["null"]
    if typing.get_origin(member) is Literal:
        return [repr(choice) for choice in typing.get_args(member)]
    base = {int: "an integer", float: "a number", str: "a string"}.get(member, str(member))
    limits: list[str] = []
    for constraint in constraints:
        for item in getattr(constraint, "metadata", [constraint]):
            if isinstance(item, annotated_types.Ge):
                limits.append(f"at least {item.ge}")
            elif isinstance(item, annotated_types.Gt):
                limits.append(f"greater than {item.gt}")
            elif isinstance(item, annotated_types.Le):
                limits.append(f"at most {item.le}")
            elif isinstance(item, annotated_types.Lt):
                limits.append(f"less than {item.lt}")
    if len(limits) == 2 and limits[0].startswith("at least ") and limits[1].startswith("at most "):
        low, high = limits[0].removeprefix("at least "), limits[1].removeprefix("at most ")
        return [f"{base} from {low} to {high}"]
    return [f"{base} {' and '.join(limits)}" if limits else base]


def key_text(loc: Loc) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def yaml_float(value: float) -> str:
    """A float as YAML 1.1 reads it back: its own .nan and .inf, and an exponent with a
    dotted mantissa ("1.0e-05"; a bare "1e-05" reads as text)."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, exponent, power = text.partition("e")
    return f"{mantissa}.0e{power}" if exponent and "." not in mantissa else text


def show(value: Any) -> str:
    """A value as a person wrote it in YAML, on one short line."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        text = repr(value) if math.isfinite(value) else yaml_float(value)
    elif isinstance(value, int | str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = f"a {type(value).__name__}"
    text = " ".join(text.split())
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the text {show(value)}"
    return show(value)
