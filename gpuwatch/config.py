"""YAML -> validated RunConfig, with one-line errors that name the file, the key and the line.

`gpuwatch train CONFIG` calls `load_config` before anything starts; a relaunch from the
dashboard goes through `apply_overrides`, which validates with the same schema
(`trainer_runtime.schema.RunConfig`). Every problem becomes a `ConfigError` whose text is
one line, ready to print after "gpuwatch: ", never a traceback and never a pydantic URL.

Line numbers come from composing the YAML into nodes first: each mapping key and each
sequence item records its 1-based line under its path, so a pydantic `loc` such as
`("train", "accumulation_steps")` maps back to the line of the offending key (or of the
closest parent the file has).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import annotated_types
import yaml
from pydantic import BaseModel, ValidationError

from trainer_runtime.schema import LimitError, RunConfig, divisibility_error

__all__ = [
    "ConfigError",
    "LoadedConfig",
    "apply_overrides",
    "check_replicas",
    "dump_config",
    "expected_replicas",
    "load_config",
    "parse_override",
]

Loc = tuple[str | int, ...]

# Where a RunConfig check across settings without a LimitError is pointed: its
# pydantic loc is (), so we name the first of these the input has.
_BATCH_SPLIT_KEYS: tuple[Loc, ...] = (
    ("train", "global_batch_size"),
    ("train", "accumulation_steps"),
    ("train",),
)
_SHOW_LIMIT = 60


class ConfigError(Exception):
    """A config problem a person can act on; `str(err)` is one line.

    `source` is the file or the override that holds the problem, `line` its 1-based line
    when YAML knows it, `key` the dotted key, `problem` the words after the key.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
        problem: str | None = None,
    ) -> None:
        one_line = " ".join(str(message).split())
        super().__init__(one_line)
        self.message = one_line
        self.source = source
        self.line = line
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and the file it came from."""

    config: RunConfig
    path: Path
    text: str  # the file as read
    # 1-based line of each key path in the file, and the `--set` that set a path.
    lines: Mapping[Loc, int] = field(default_factory=dict, repr=False, compare=False)
    override_sources: Mapping[Loc, str] = field(default_factory=dict, repr=False, compare=False)

    def where(self, key: str) -> str:
        """Where a dotted key was set: "--set ...", "file:line" (or its parent's), or "file".

        For messages about the whole config, e.g.
        `check_replicas(loaded.config, n, loaded.where("train.global_batch_size"))`.
        """
        locate = _Locator(file=str(self.path), lines=self.lines, overrides=self.override_sources)
        return locate.where(tuple(key.split(".")))[0]


# ---------------------------------------------------------------------------- public API


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """Read, parse and validate a YAML config file, then apply `--set key.path=value` overrides.

    Raises ConfigError (and nothing else) on any problem with the file or the overrides.
    """
    path = Path(path)
    shown = str(path)
    try:
        parsed = [(parse_override(text), f"--set {text}") for text in overrides]
        text = _read_text(path, shown)
        data, lines = _parse_yaml(text, shown)
        override_sources: dict[Loc, str] = {}
        for (key, value), label in parsed:
            parts = _split_key(key, label)
            _set_path(data, parts, value, label)
            override_sources[_normalise_loc(data, parts)] = label
        locate = _Locator(file=shown, lines=lines, overrides=override_sources)
        config = _validate(data, locate)
        return LoadedConfig(
            config=config, path=path, text=text, lines=lines, override_sources=override_sources
        )
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{shown}: nested too deeply", source=shown) from None
    except Exception as exc:  # last line of defence: one line, never a traceback
        raise ConfigError(
            f"{shown}: cannot load config ({type(exc).__name__}: {exc})", source=shown
        ) from None


def parse_override(text: str) -> tuple[str, Any]:
    """Split "key.path=value" into the key and the value parsed as a YAML scalar or flow.

    "train.global_batch_size=512" -> ("train.global_batch_size", 512);
    "data.prefetch=autotune" -> ("data.prefetch", "autotune");
    "model.hidden_units=[256, 128]" -> ("model.hidden_units", [256, 128]).
    """
    label = f"--set {text}"
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"{label}: expected key.path=value (no '=')", source=label)
    if not key:
        raise ConfigError(f"{label}: expected key.path=value (empty key)", source=label)
    _split_key(key, label)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{label}: {key}: value is not valid YAML ({_yaml_problem(exc)})",
            source=label,
            key=key,
        ) from None
    except RecursionError:
        raise ConfigError(f"{label}: {key}: value nested too deeply", source=label) from None
    return key, value


def apply_overrides(
    config: RunConfig, overrides: Mapping[str, Any], source: str = "relaunch"
) -> RunConfig:
    """A new RunConfig with dotted-key overrides applied, validated by the same schema.

    `source` names where the overrides came from ("relaunch", "--set ...") in messages.
    """
    data = config.model_dump()
    override_sources: dict[Loc, str] = {}
    try:
        for key, value in overrides.items():
            parts = _split_key(str(key), source)
            _set_path(data, parts, value, source)
            override_sources[_normalise_loc(data, parts)] = source
        return _validate(data, _Locator(file=source, lines={}, overrides=override_sources))
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{source}: settings nested too deeply", source=source) from None
    except Exception as exc:
        raise ConfigError(
            f"{source}: cannot apply settings ({type(exc).__name__}: {exc})", source=source
        ) from None


def check_replicas(config: RunConfig, replicas: int, source: str) -> None:
    """ConfigError if the global batch cannot split over replicas x accumulation steps."""
    if replicas < 1:
        raise ConfigError(
            f"{source}: replicas must be at least 1 (got {replicas})",
            source=source,
            problem=f"replicas must be at least 1 (got {replicas})",
        )
    problem = divisibility_error(config, replicas)
    if problem is not None:
        raise ConfigError(
            f"{source}: {problem}", source=source, key="train.global_batch_size", problem=problem
        )


def expected_replicas(config: RunConfig) -> int:
    """How many replicas the trainer will run: the visible NVIDIA GPUs, else the CPU replicas.

    Counts NVML devices, narrowed by CUDA_VISIBLE_DEVICES as CUDA reads it. Any NVML
    failure (no library, no driver) counts as no GPU.
    """
    gpus = _visible_gpu_count()
    return gpus if gpus > 0 else config.strategy.cpu_replicas


def dump_config(config: RunConfig) -> str:
    """YAML text of the whole validated config (every key, defaults included); loads back equal."""
    try:
        data = config.model_dump()
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    except yaml.YAMLError:
        # A relaunch may put values YAML cannot represent into model/data kwargs.
        data = config.model_dump(mode="json")
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


# ------------------------------------------------------------------------ reading the file


def _read_text(path: Path, shown: str) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file", source=shown) from None
    except IsADirectoryError:
        raise ConfigError(f"{shown}: is a directory, not a config file", source=shown) from None
    except PermissionError:
        raise ConfigError(f"{shown}: permission denied", source=shown) from None
    except NotADirectoryError:
        raise ConfigError(
            f"{shown}: no such file (a parent is not a directory)", source=shown
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{shown}: cannot read ({reason})", source=shown) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        byte = raw[exc.start : exc.start + 1].hex()
        raise ConfigError(
            f"{shown}:{line}: not UTF-8 text (byte 0x{byte})", source=shown, line=line
        ) from None


def _parse_yaml(text: str, shown: str) -> tuple[dict[Any, Any], dict[Loc, int]]:
    """Compose and construct one YAML document; returns the data and each key's line."""
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # checks for unprintable characters already
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(
                f"{shown}: empty config (expected a mapping of settings)", source=shown
            )
        lines: dict[Loc, int] = {}
        _walk(node, (), lines, set(), set(), loader, shown)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        raise ConfigError(
            f"{where}: YAML syntax error: {_yaml_problem(exc)}",
            source=shown,
            line=mark.line + 1 if mark else None,
        ) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise ConfigError(
            f"{shown}:{line}: YAML syntax error: unacceptable character "
            f"#x{exc.character if isinstance(exc.character, int) else ord(exc.character):04x}",
            source=shown,
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"{shown}: YAML syntax error: {_yaml_problem(exc)}", source=shown
        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        line = node.start_mark.line + 1
        raise ConfigError(
            f"{shown}:{line}: the top level must be a mapping of settings (got {_kind(data)})",
            source=shown,
            line=line,
        )
    return data, lines


def _walk(
    node: yaml.Node,
    path: Loc,
    lines: dict[Loc, int],
    ancestors: set[int],
    seen: set[int],
    loader: yaml.SafeLoader,
    shown: str,
) -> None:
    """Record the line of every key and item; reject duplicate keys and recursive aliases."""
    if id(node) in ancestors:
        line = lines.get(path, node.start_mark.line + 1)
        raise ConfigError(
            f"{shown}:{line}: {_key_text(path)}: a YAML alias refers to a node that contains it",
            source=shown,
            line=line,
        )
    if id(node) in seen:  # an alias we walked already; walking it again could be exponential
        return
    seen.add(id(node))
    ancestors.add(id(node))
    try:
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base`: the merged keys keep their parent's line
                line = key_node.start_mark.line + 1
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a complex key; construction rejects it as unhashable
                key = loader.construct_object(key_node, deep=True)
                child = (*path, key)
                if key in first_line:
                    raise ConfigError(
                        f"{shown}:{line}: {_key_text(child)}: duplicate key "
                        f"(first at line {first_line[key]})",
                        source=shown,
                        line=line,
                        key=_key_text(child),
                    )
                first_line[key] = line
                lines[child] = line
                _walk(value_node, child, lines, ancestors, seen, loader, shown)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = (*path, index)
                lines[child] = item.start_mark.line + 1
                _walk(item, child, lines, ancestors, seen, loader, shown)
    finally:
        ancestors.discard(id(node))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        words = exc.problem or exc.context or "cannot parse"
        if exc.context and exc.problem and exc.context != exc.problem:
            words = f"{exc.problem} ({exc.context})"
    else:
        words = str(exc)
    return " ".join(words.split())


# ------------------------------------------------------------------------------ overrides


def _split_key(key: str, label: str) -> list[str]:
    parts = [part.strip() for part in key.split(".")]
    if not key.strip() or any(not part for part in parts):
        raise ConfigError(
            f"{label}: {key.strip() or '(empty)'}: a key path needs names between the dots",
            source=label,
        )
    return parts


def _set_path(data: dict[Any, Any], parts: list[str], value: Any, label: str) -> None:
    """Set data[a][b][c] = value for parts [a, b, c], making missing mappings on the way."""
    current: Any = data
    done: list[str | int] = []
    for index, part in enumerate(parts):
        step: str | int = part
        if isinstance(current, list):
            if not part.isdigit() or int(part) >= len(current):
                raise ConfigError(
                    f"{label}: {_key_text(tuple(done))}: no item {part} in a list of "
                    f"{len(current)}",
                    source=label,
                )
            step = int(part)
        elif not isinstance(current, dict):
            raise ConfigError(
                f"{label}: {_key_text(tuple(done))}: is not a mapping (got "
                f"{_show(current)}), so it has no key {part!r}",
                source=label,
            )
        if index == len(parts) - 1:
            current[step] = value
            return
        if isinstance(current, dict) and step not in current:
            current[step] = {}
        current = current[step]
        done.append(step)


def _normalise_loc(data: dict[Any, Any], parts: list[str]) -> Loc:
    """The override's path as pydantic spells a loc (list positions as ints)."""
    loc: list[str | int] = []
    current: Any = data
    for part in parts:
        if isinstance(current, list) and part.isdigit():
            loc.append(int(part))
            current = current[int(part)] if int(part) < len(current) else None
        else:
            loc.append(part)
            current = current.get(part) if isinstance(current, dict) else None
    return tuple(loc)


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Locator:
    """Turns a loc into "file:line" or the override that set it."""

    file: str
    lines: Mapping[Loc, int]
    overrides: Mapping[Loc, str]

    def override_for(self, loc: Loc) -> str | None:
        for size in range(len(loc), 0, -1):
            label = self.overrides.get(_str_loc(loc[:size]))
            if label is not None:
                return label
        return None

    def line_for(self, loc: Loc) -> int | None:
        for size in range(len(loc), 0, -1):
            line = self.lines.get(loc[:size])
            if line is not None:
                return line
        # pydantic spells some keys its own way (a `null` key is 'None'): compare as text.
        spelled = {tuple(str(part) for part in key): line for key, line in self.lines.items()}
        for size in range(len(loc), 0, -1):
            line = spelled.get(tuple(str(part) for part in loc[:size]))
            if line is not None:
                return line
        return None

    def where(self, loc: Loc) -> tuple[str, int | None, bool]:
        """(text before the key, line, whether an override is the source)."""
        label = self.override_for(loc)
        if label is not None:
            return label, None, True
        line = self.line_for(loc)
        return (f"{self.file}:{line}" if line else self.file), line, False


def _str_loc(loc: Loc) -> Loc:
    return tuple(str(part) if isinstance(part, int) else part for part in loc)


def _validate(data: dict[Any, Any], locate: _Locator) -> RunConfig:
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, data, locate) from None
    _check_no_bool_numbers(data, locate)
    _check_finite(config, locate)
    return config


def _check_no_bool_numbers(data: dict[Any, Any], locate: _Locator) -> None:
    # pydantic's lax mode reads true as 1, and YAML 1.1 reads `on`/`yes` as true, so
    # `accumulation_steps: yes` would quietly mean 1. A number field wants a number.
    pending: list[tuple[Loc, Any]] = [((key,), value) for key, value in data.items()]
    while pending:
        loc, value = pending.pop()
        if len(loc) > 3:
            continue
        _, annotation = _field_loc(loc)
        if annotation is None:
            continue
        if isinstance(value, bool) and _is_number_type(annotation):
            raise _error_at(locate, loc, f"must be a number, not {_show(value)}")
        if isinstance(value, dict) and _is_model(annotation):
            pending.extend(((*loc, key), item) for key, item in value.items())
        elif isinstance(value, list) and typing.get_origin(_strip_annotated(annotation)) is list:
            pending.extend(((*loc, index), item) for index, item in enumerate(value))


def _is_number_type(annotation: Any) -> bool:
    annotation = _strip_annotated(annotation)
    if _is_union(annotation):
        members = [m for m in typing.get_args(annotation) if m is not type(None)]
        return bool(members) and all(_is_number_type(member) for member in members)
    return annotation in (int, float)


def _is_model(annotation: Any) -> bool:
    annotation = _strip_annotated(annotation)
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _check_finite(config: RunConfig, locate: _Locator) -> None:
    # pydantic lets .inf through `ge=0`; an infinite latency or rate is never meant.
    for section_name in type(config).model_fields:
        section = getattr(config, section_name)
        if not isinstance(section, BaseModel):
            continue
        for field_name in type(section).model_fields:
            value = getattr(section, field_name)
            if isinstance(value, float) and not math.isfinite(value):
                loc: Loc = (section_name, field_name)
                raise _error_at(locate, loc, f"must be a finite number (got {_show(value)})")


def _error_at(locate: _Locator, loc: Loc, problem: str) -> ConfigError:
    where, line, _ = locate.where(loc)
    key = _key_text(loc)
    return ConfigError(
        f"{where}: {key}: {problem}", source=where, line=line, key=key, problem=problem
    )


def _first_error(exc: ValidationError, data: dict[Any, Any], locate: _Locator) -> ConfigError:
    """The first problem in file order, as one line of plain words."""
    groups: dict[Loc, list[dict[str, Any]]] = {}
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        field_loc, _ = _field_loc(loc)
        groups.setdefault(field_loc, []).append(dict(error))

    candidates: list[tuple[tuple[int, int, int], ConfigError]] = []
    for order, (field_loc, errors) in enumerate(groups.items()):
        if field_loc == () and errors[0]["type"] == "value_error":
            # A limit across settings (trainer_runtime.schema.LimitError) names its key.
            cause = (errors[0].get("ctx") or {}).get("error")
            keys = (
                tuple(tuple(k.split(".")) for k in cause.keys)
                if isinstance(cause, LimitError)
                else _BATCH_SPLIT_KEYS
            )
            loc = _limit_loc(locate, keys)
            where, line, from_override = locate.where(loc)
            key = _key_text(keys[0])
            problem = _value_error_text(errors[0])
            problem = problem.removeprefix(f"{key} ")
        else:
            where, line, from_override = locate.where(field_loc)
            key_loc = field_loc
            if errors[0]["type"] == "invalid_key" or field_loc[-1:] == ("[key]",):
                # The loc ends in the bad key itself: name the mapping that holds it.
                key_loc = field_loc[:-2] if field_loc[-1:] == ("[key]",) else field_loc[:-1]
            key = _key_text(key_loc) or "(top level)"
            problem = _problem(field_loc, errors)
        err = ConfigError(
            f"{where}: {key}: {problem}", source=where, line=line, key=key, problem=problem
        )
        rank = (1 if from_override else 0, line if line is not None else 1 << 30, order)
        candidates.append((rank, err))
    candidates.sort(key=lambda pair: pair[0])
    return candidates[0][1]


def _limit_loc(locate: _Locator, keys: tuple[Loc, ...]) -> Loc:
    """Where to point a check across settings: an override that set one, else the file."""
    for key in keys:
        if locate.override_for(key):
            return key
    for key in keys:
        if key in locate.lines:
            return key
    return keys[0]


def _field_loc(loc: Loc) -> tuple[Loc, Any]:
    """Strip pydantic's union-member tags from a loc; returns (field loc, its annotation)."""
    annotation: Any = RunConfig
    for index, part in enumerate(loc):
        annotation = _strip_annotated(annotation)
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
    shown = _show(error.get("input"))
    if len(errors) > 1 and annotation is not None and _is_union(annotation):
        return f"must be {_describe(annotation)} (got {shown})"
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key(field_loc)
    if kind == "invalid_key" or (field_loc and field_loc[-1] == "[key]"):
        return f"keys must be strings (got {shown})"
    if kind == "value_error":
        return _value_error_text(error)
    if kind == "literal_error":
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
    if kind in bounds:
        return f"{bounds[kind].format(**ctx)} (got {shown})"
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
    if kind in plain:
        return f"{plain[kind]} (got {shown})"
    message = str(error.get("msg", "is not valid"))
    message = message.replace("Input should be", "must be").replace("Input", "value")
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
    """Plain words for what a union field accepts: "true, false, 'autotune' or an integer ..."."""
    words: list[str] = []
    for member in typing.get_args(annotation):
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
    return [" ".join([base, *limits]) if limits else base]


# -------------------------------------------------------------------------------- helpers


def _key_text(loc: Loc) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _show(value: Any) -> str:
    """A value as a person wrote it in YAML, on one short line."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
    elif isinstance(value, int | str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=str, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            text = f"a {type(value).__name__}"
    text = " ".join(text.split())
    return text if len(text) <= _SHOW_LIMIT else text[: _SHOW_LIMIT - 3] + "..."


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the text {_show(value)}"
    return _show(value)


def _visible_gpu_count() -> int:
    try:
        import pynvml  # nvidia-ml-py; lazily, so a box without the driver never pays for it

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return count
        uuids: list[str] | None = None
        chosen: set[int] = set()
        # CUDA reads entries up to the first one it cannot match and ignores the rest.
        for raw_entry in visible.split(","):
            entry = raw_entry.strip()
            if not entry:
                break
            if entry.lstrip("-").isdigit():
                index = int(entry)
                if not 0 <= index < count:
                    break
            else:
                if uuids is None:
                    uuids = [_uuid(pynvml, i) for i in range(count)]
                matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
                if len(matches) != 1:
                    break
                index = matches[0]
            if index in chosen:
                return 0  # CUDA refuses a list that names a device twice
            chosen.add(index)
        return len(chosen)
    except Exception:
        return 0
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _uuid(pynvml: Any, index: int) -> str:
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
