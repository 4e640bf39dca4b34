"""Settings set on a config by dotted key, and the settle step every config goes through.

A `--set key.path=value`, a relaunch's mapping of settings and a command's few settings are
each set on the data by its dotted key (`settle`), then the whole is validated by the schema
(`trainer_runtime.schema.RunConfig`) and bounded in size, as written out, so that it loads
again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from gpuwatch.config.bounds import (
    MAX_CONFIG_BYTES,
    MAX_NESTING_DEPTH,
    Budget,
    LimitExceeded,
    check_overrides_length,
    data_limit,
)
from gpuwatch.config.errors import ConfigError, as_config_error, override_label, shorten
from gpuwatch.config.locate import Locator, validate
from gpuwatch.config.reading import CONSTRUCTOR_ERRORS, Unbuildable, load_value, yaml_problem
from gpuwatch.config.words import Loc, key_text, show
from gpuwatch.config.writing import dump_config
from trainer_runtime.schema import RunConfig


def settle(data: dict[Any, Any], settings: Iterable[tuple[str, Any, str]], file: str,
            lines: dict[Loc, int]) -> tuple[RunConfig, dict[Loc, str]]:
    """data with each (dotted key, value, where it came from) set on it, validated by the
    schema and bounded in size; and where each set key came from, for the messages."""
    sources: dict[Loc, str] = {}
    for key, value, label in settings:
        parts = _split_key(key, label)
        _set_path(data, parts, value, label)
        sources[_normalise_loc(data, parts)] = label
    locate = Locator(file=file, lines=lines, overrides=sources)
    config = validate(data, locate)
    _check_written_size(config, locate)
    return config, sources


def parse_override(text: str) -> tuple[str, Any]:
    """Split "key.path=value" into the key and the value parsed as a YAML scalar or flow.

    "train.global_batch_size=512" -> ("train.global_batch_size", 512);
    "data.prefetch=autotune" -> ("data.prefetch", "autotune");
    "model.hidden_units=[256, 128]" -> ("model.hidden_units", [256, 128]).
    The value is bounded like a config file (MAX_* constants); ConfigError if it is not.
    """
    check_overrides_length([text])
    return parse_bounded_override(text, Budget())


def parse_bounded_override(text: str, budget: Budget) -> tuple[str, Any]:
    label = override_label(text)
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"{label}: expected key.path=value (no '=')", source=label)
    if not key:
        raise ConfigError(f"{label}: expected key.path=value (empty key)", source=label)
    _split_key(key, label)
    try:
        budget.spend(line=None)  # the override itself: many tiny ones cost too
        value = load_value(raw, budget) if raw.strip() else None
    except (yaml.YAMLError, Unbuildable, *CONSTRUCTOR_ERRORS) as exc:
        raise ConfigError(
            f"{label}: {shorten(key)}: value is not valid YAML ({yaml_problem(exc)})",
            source=label,
            key=key,
        ) from None
    except LimitExceeded as exc:
        raise exc.error(label, line=None, base=(key,), whole=key) from None
    except RecursionError:
        raise ConfigError(
            f"{label}: {shorten(key)}: value nested too deeply", source=label, key=shorten(key)
        ) from None
    return key, value


def apply_overrides(
    config: RunConfig, overrides: Mapping[str, Any], source: str = "relaunch"
) -> RunConfig:
    """A new RunConfig with dotted-key overrides applied, validated by the same schema.

    `source` names where the overrides came from ("relaunch", "--set ...") in messages.
    The overrides are bounded like a config file (MAX_* constants), cycles included.
    """
    try:
        exceeded = data_limit(overrides)
        if exceeded is not None:
            raise exceeded.error(source, line=None, whole="the mapping of settings")
        settings = [(str(key), value, source) for key, value in overrides.items()]
        return settle(config.model_dump(), settings, source, {})[0]
    except Exception as exc:
        raise as_config_error(exc, source, "settings nested too deeply",
                        "cannot apply settings") from None


def _check_written_size(config: RunConfig, locate: Locator) -> None:
    """ConfigError unless the config, as dump_config writes it, loads again within the bounds.

    `gpuwatch train` writes the config for the supervisor, which reads it back with
    load_config; by then defaults and `--set` values are added and aliases are expanded.
    """
    exceeded = data_limit(config.model_dump())
    if exceeded is not None:
        where = locate.where(exceeded.loc)[0] if exceeded.loc else locate.file
        raise exceeded.error(where, line=None, whole="the config, with its defaults,")
    size = len(dump_config(config).encode("utf-8"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{locate.file}: the config, written out with its defaults, takes {size:,} bytes "
            f"(the limit is {MAX_CONFIG_BYTES:,})",
            source=locate.file,
        )


def _split_key(key: str, label: str) -> list[str]:
    parts = [part.strip() for part in key.split(".")]
    if not key.strip() or any(not part for part in parts):
        raise ConfigError(
            f"{label}: {shorten(key.strip()) or '(empty)'}: a key path needs names between "
            "the dots",
            source=label,
            key=shorten(key.strip()) or None,
        )
    if len(parts) > MAX_NESTING_DEPTH:
        raise ConfigError(
            f"{label}: {shorten(key.strip())}: a key path of more than {MAX_NESTING_DEPTH} names",
            source=label,
            key=shorten(key.strip()),
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
                    f"{label}: {key_text(tuple(done))}: no item {part} in a list of "
                    f"{len(current)}",
                    source=label,
                    key=key_text(tuple(done)),
                )
            step = int(part)
        elif not isinstance(current, dict):
            raise ConfigError(
                f"{label}: {key_text(tuple(done))}: is not a mapping (got "
                f"{show(current)}), so it has no key {part!r}",
                source=label,
                key=key_text(tuple(done)),
            )
        if index == len(parts) - 1:
            current[step] = value
            return
        if isinstance(current, dict) and current.get(step) is None:  # absent, or an unset section
            following = parts[index + 1]
            if following.isdigit():  # an item of a list the config does not have
                shown = key_text((*done, step, int(following)))
                raise ConfigError(
                    f"{label}: {shown}: no such item: {key_text((*done, step))} is not set "
                    "(set the whole list instead)",
                    source=label,
                    key=shown,
                )
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
