"""YAML -> validated RunConfig, with one-line errors that name the file, the key and the line.

`gpuwatch train CONFIG` calls `load_config` before anything starts; a relaunch from the
dashboard goes through `apply_overrides`, which validates with the same schema
(`trainer_runtime.schema.RunConfig`). Every problem becomes a `ConfigError` whose text is
one line, ready to print after "gpuwatch: ", never a traceback and never a pydantic URL.

Line numbers come from composing the YAML into nodes first: each mapping key and each
sequence item records its 1-based line under its path, so a pydantic `loc` such as
`("train", "accumulation_steps")` maps back to the line of the offending key (or of the
closest parent the file has). What a problem is, in words, comes from
gpuwatch.config_words; this module says where it is.

No input costs more than about a second and 100 MB to accept or refuse: the file's size,
its nesting depth and its number of values (counted with YAML aliases expanded, so a
"billion laughs" file is refused before anything walks it) are bounded by the MAX_*
constants below, and so are `--set` values and the mappings `apply_overrides` is handed.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuwatch.config_words import Loc, key_text, kind, problems, show, yaml_float
from trainer_runtime.schema import (
    RunConfig,
    command_setting_refusal,
    divisibility_error,
    gpu_shortage,
    replica_count,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_VALUES",
    "MAX_NESTING_DEPTH",
    "MAX_NUMBER_CHARS",
    "MAX_TEXT_CHARS",
    "ConfigError",
    "LoadedConfig",
    "apply_overrides",
    "check_devices",
    "check_replicas",
    "command_config",
    "dump_config",
    "expected_replicas",
    "format_override",
    "load_config",
    "parse_override",
    "refuse_command_keys",
]

# Bounds on what a config may hold. A real config is a few KiB with a few hundred values;
# these leave room for large kwargs while keeping the worst input (measured in
# tests/test_config_bounds.py) well inside 1 s and 100 MB on a small machine. PyYAML's
# pure-Python parser costs about 1 us a byte and 20-40 us a value, so the byte and value
# limits are what bound the time; the depth limit bounds every recursive walk.
MAX_CONFIG_BYTES = 128 * 1024  # the file, and the config as dump_config writes it
# Values: every key, list item, setting and section, counted with YAML aliases expanded.
MAX_CONFIG_VALUES = 5_000
MAX_NESTING_DEPTH = 32  # mappings and lists inside one another
# Characters in all keys and text values, aliases expanded; half the byte limit so the
# config written out for the supervisor (with defaults, quotes, punctuation) loads again.
MAX_TEXT_CHARS = MAX_CONFIG_BYTES // 2
# YAML 1.1 reads `1:2:3` as a base-60 integer, which PyYAML builds in quadratic time.
MAX_NUMBER_CHARS = 100
_LABEL_LIMIT = 80  # an override longer than this is shortened where messages name it


class ConfigError(Exception):
    """A config problem a person can act on; `str(err)` is one line.

    `source` is the file or the override that holds the problem, `line` its 1-based line
    when YAML knows it, `key` the dotted key, `problem` the words after the key. `keys` are
    every setting the problem is about, `key` first (a limit across settings names several):
    the dashboard's settings screen shows the problem under the one a person changed.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        key: str | None = None,
        problem: str | None = None,
        keys: tuple[str, ...] = (),
    ) -> None:
        one_line = " ".join(str(message).split())
        super().__init__(one_line)
        self.message = one_line
        self.source = source
        self.line = line
        self.key = key
        self.problem = problem
        self.keys = keys or ((key,) if key else ())

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

    def where(self, key: str, *related: str) -> str:
        """Where a dotted key was set: "--set ...", "file:line" (or its parent's), or "file".

        With related keys, a `--set` of any of them wins over the file: a message about
        several settings names the override that changed one. For messages about the
        whole config, e.g. `check_replicas(loaded.config, n, loaded.where(
        "train.global_batch_size", "train.accumulation_steps", "strategy.cpu_replicas"))`.
        """
        locate = _Locator(file=str(self.path), lines=self.lines, overrides=self.override_sources)
        for candidate in (key, *related):
            label = locate.override_for(tuple(candidate.split(".")))
            if label is not None:
                return label
        return locate.where(tuple(key.split(".")))[0]


# ---------------------------------------------------------------------------- public API


def _settle(data: dict[Any, Any], settings: Iterable[tuple[str, Any, str]], file: str,
            lines: dict[Loc, int]) -> tuple[RunConfig, dict[Loc, str]]:
    """data with each (dotted key, value, where it came from) set on it, validated by the
    schema and bounded in size; and where each set key came from, for the messages."""
    sources: dict[Loc, str] = {}
    for key, value, label in settings:
        parts = _split_key(key, label)
        _set_path(data, parts, value, label)
        sources[_normalise_loc(data, parts)] = label
    locate = _Locator(file=file, lines=lines, overrides=sources)
    config = _validate(data, locate)
    _check_written_size(config, locate)
    return config, sources


def _one_line(exc: Exception, shown: str, nested: str, cannot: str) -> ConfigError:
    """Any failure while making a config as the one line ConfigError says (the last line
    of defence: never a traceback)."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, RecursionError):
        return ConfigError(f"{shown}: {nested}", source=shown)
    return ConfigError(f"{shown}: {cannot} ({type(exc).__name__}: {exc})", source=shown)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """Read, parse and validate a YAML config file, then apply `--set key.path=value` overrides.

    Raises ConfigError (and nothing else) on any problem with the file or the overrides.
    """
    path = Path(path)
    shown = str(path)
    try:
        _check_overrides_length(overrides)
        budget = _Budget()  # the --set values and the file share one budget of values
        parsed: list[tuple[tuple[str, Any], str]] = []
        for override in overrides:
            parsed.append((_parse_override(override, budget), _override_label(override)))
            budget.spent_on = "the --set values"
        text = _read_text(path, shown)
        data, lines = _parse_yaml(text, shown, budget)
        config, override_sources = _settle(
            data, [(key, value, label) for (key, value), label in parsed], shown, lines)
        return LoadedConfig(
            config=config, path=path, text=text, lines=lines, override_sources=override_sources
        )
    except Exception as exc:
        raise _one_line(exc, shown, "nested too deeply", "cannot load config") from None


def command_config(
    argv: Sequence[str], cwd: str, overrides: Sequence[str] = (), name: str | None = None
) -> RunConfig:
    """The config of a person's own command (`gpuwatch run [--name N] [--set K=V] -- ARGV`):
    the command and the directory it runs in, with the few settings a command takes
    (schema.COMMAND_KEYS) as `--set` and `--name`, validated by the same schema and bounded
    like a file. ConfigError (one line) if not: a `--set` of any other key names it and
    says why (schema.command_setting_refusal)."""
    shown = "gpuwatch run"
    try:
        _check_overrides_length(overrides)
        budget = _Budget()
        data: dict[Any, Any] = {"command": {"argv": list(argv), "cwd": cwd}}
        settings: list[tuple[str, Any, str]] = []
        if name is not None:
            settings.append(("name", name, "--name"))
        for override in overrides:
            key, value = _parse_override(override, budget)
            refuse_command_keys([key], f"--set {_shorten(key)}")
            settings.append((key, value, _override_label(override)))
        return _settle(data, settings, shown, {})[0]
    except Exception as exc:
        raise _one_line(exc, shown, "nested too deeply", "cannot make the config") from None


def refuse_command_keys(keys: Iterable[str], source: str) -> None:
    """ConfigError naming the first of these dotted settings that a person's own command
    cannot take (schema.command_setting_refusal): "SOURCE: reason" where SOURCE names it
    (`--set KEY`), else "SOURCE: KEY: reason"."""
    for key in keys:
        reason = command_setting_refusal(str(key))
        if reason is not None:
            where = source if str(key) in source else f"{source}: {_shorten(str(key))}"
            raise ConfigError(f"{where}: {reason}", source=source, key=str(key), problem=reason)


def parse_override(text: str) -> tuple[str, Any]:
    """Split "key.path=value" into the key and the value parsed as a YAML scalar or flow.

    "train.global_batch_size=512" -> ("train.global_batch_size", 512);
    "data.prefetch=autotune" -> ("data.prefetch", "autotune");
    "model.hidden_units=[256, 128]" -> ("model.hidden_units", [256, 128]).
    The value is bounded like a config file (MAX_* constants); ConfigError if it is not.
    """
    _check_overrides_length([text])
    return _parse_override(text, _Budget())


def format_override(key: str, value: Any) -> str:
    """The "key.path=value" text that parse_override reads back as (key, value).

    The value is written as JSON, which YAML reads the same, but for floats and text:
    YAML 1.1 reads "1e-05" as a string, so an exponent gets a mantissa with a dot
    ("1.0e-05") and infinities are YAML's own (".inf"); a character beyond U+FFFF is one
    \\U escape, not JSON's two surrogates (which YAML would keep as two). How a
    dashboard's pending settings (a mapping of dotted keys to JSON values) become `--set`
    arguments of a resume.
    """
    return f"{key}={_yaml_value(value)}"


def _yaml_value(value: Any) -> str:
    if isinstance(value, float):
        return yaml_float(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_yaml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = (f"{_yaml_text(str(k))}: {_yaml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, str):
        return _yaml_text(value)
    return json.dumps(value)


def _yaml_text(text: str) -> str:
    """A YAML double-quoted scalar: printable ASCII as it is, the rest escaped."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _parse_override(text: str, budget: _Budget) -> tuple[str, Any]:
    label = _override_label(text)
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"{label}: expected key.path=value (no '=')", source=label)
    if not key:
        raise ConfigError(f"{label}: expected key.path=value (empty key)", source=label)
    _split_key(key, label)
    try:
        budget.spend(line=None)  # the override itself: many tiny ones cost too
        value = _load_value(raw, budget) if raw.strip() else None
    except (yaml.YAMLError, _Unbuildable, *_CONSTRUCTOR_ERRORS) as exc:
        raise ConfigError(
            f"{label}: {_shorten(key)}: value is not valid YAML ({_yaml_problem(exc)})",
            source=label,
            key=key,
        ) from None
    except _LimitExceeded as exc:
        raise exc.error(label, line=None, base=(key,), whole=key) from None
    except RecursionError:
        raise ConfigError(
            f"{label}: {_shorten(key)}: value nested too deeply", source=label, key=_shorten(key)
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
        exceeded = _data_limit(overrides)
        if exceeded is not None:
            raise exceeded.error(source, line=None, whole="the mapping of settings")
        settings = [(str(key), value, source) for key, value in overrides.items()]
        return _settle(config.model_dump(), settings, source, {})[0]
    except Exception as exc:
        raise _one_line(exc, source, "settings nested too deeply",
                        "cannot apply settings") from None


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
            f"{source}: {problem}",
            source=source,
            key="train.global_batch_size",
            problem=problem,
            keys=("train.global_batch_size", "train.accumulation_steps"),
        )


def visible_gpus() -> int:
    """The NVIDIA GPUs the trainer will see, counted by gpuwatch.sampling (the one part of
    gpuwatch that talks to NVML): NVML's devices narrowed by CUDA_VISIBLE_DEVICES; any NVML
    failure counts as none."""
    from gpuwatch.sampling import visible_gpu_count  # lazily: psutil and NVML only when asked

    return visible_gpu_count()


def expected_replicas(config: RunConfig, gpus: int | None = None) -> int:
    """How many replicas the trainer will run (schema.replica_count): strategy.replicas, else
    the visible GPUs, else the CPU replicas. gpus: the visible GPUs (None: count them).

    A cluster (MultiWorkerMirroredStrategy) runs one CPU replica per worker, or each
    worker's GPUs, counted as this host's (every host is taken to have as many).
    """
    gpus = visible_gpus() if gpus is None else gpus
    if config.cluster is not None:
        return config.cluster.count * max(gpus, 1)
    return replica_count(config.strategy, gpus)


def check_devices(config: RunConfig, source: str, gpus: int | None = None) -> None:
    """ConfigError, naming strategy.replicas, if it asks for more GPUs than are visible
    (gpus: the visible GPUs; None: count them). The trainer refuses the same (devices.py)."""
    problem = gpu_shortage(config.strategy, visible_gpus() if gpus is None else gpus)
    if problem is not None:
        words = problem.removeprefix("strategy.replicas: ")
        raise ConfigError(
            f"{source}: {problem}", source=source, key="strategy.replicas", problem=words
        )


def dump_config(config: RunConfig) -> str:
    """YAML text of the whole validated config (every key, defaults included); loads back equal.

    Block style, as a person writes it. A config whose block form is over MAX_CONFIG_BYTES
    (deep kwargs indent every line) is written in flow style on one line instead, so that
    load_config reads back anything it accepted (it checks this for every config).
    """
    try:
        return _dump(config.model_dump())
    except yaml.YAMLError:
        # A relaunch may put values YAML cannot represent into model/data kwargs.
        return _dump(config.model_dump(mode="json"))


def _dump(data: dict[str, Any]) -> str:
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    if len(text.encode("utf-8")) <= MAX_CONFIG_BYTES:
        return text
    return yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, default_flow_style=True, width=_NO_WRAP
    )


# ------------------------------------------------------------------------ reading the file


def _read_text(path: Path, shown: str) -> str:
    try:
        raw = _read_bounded(path)
    except _TooLarge as exc:
        size = (
            f"{exc.size:,} bytes; the limit is {MAX_CONFIG_BYTES:,}"
            if exc.size is not None
            else f"more than {MAX_CONFIG_BYTES:,} bytes"
        )
        raise ConfigError(f"{shown}: too large for a config ({size})", source=shown) from None
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


class _TooLarge(Exception):
    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size  # None when the file has no size to ask for (a pipe, a device)


def _read_bounded(path: Path) -> bytes:
    """The file's bytes; _TooLarge past MAX_CONFIG_BYTES, without reading the rest."""
    info = path.stat()
    if stat.S_ISREG(info.st_mode):
        if info.st_size > MAX_CONFIG_BYTES:
            raise _TooLarge(info.st_size)
        raw = path.read_bytes()
        if len(raw) > MAX_CONFIG_BYTES:  # it grew since stat
            raise _TooLarge(len(raw))
        return raw
    # A pipe or a device (`<(...)`, /dev/zero) has no size: read one byte past the limit.
    with path.open("rb") as stream:
        raw = stream.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise _TooLarge(None)
    return raw


def _parse_yaml(
    text: str, shown: str, budget: _Budget | None = None
) -> tuple[dict[Any, Any], dict[Loc, int]]:
    """Compose and construct one YAML document; returns the data and each key's line."""
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, budget or _Budget())  # checks unprintable characters
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(
                f"{shown}: empty config (expected a mapping of settings)", source=shown
            )
        lines: dict[Loc, int] = {}
        _walk(node, (), lines, set(), set(), loader, shown)
        _check_expanded(node, loader)
        data = loader.construct_document(node)
    except _LimitExceeded as exc:
        raise exc.error(shown, line=exc.line, whole="the config") from None
    except _Unbuildable as exc:
        mark = exc.node.start_mark
        line = mark.line + 1
        path = _path_to(node, exc.node)
        key = f"{key_text(path)}: " if path else ""
        raise ConfigError(
            f"{shown}:{line}: {key}cannot read {_show_scalar(exc.node)} "
            f"({exc.problem})",
            source=shown,
            line=line,
        ) from None
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
            f"{shown}:{line}: the top level must be a mapping of settings (got {kind(data)})",
            source=shown,
            line=line,
        )
    return data, lines


def _load_value(text: str, budget: _Budget) -> Any:
    """One YAML value (a `--set` value), bounded like a file; None for an empty document."""
    loader = _BoundedLoader(text, budget)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded(node, loader)
        return loader.construct_document(node)
    finally:
        loader.dispose()


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
            f"{shown}:{line}: {key_text(path)}: a YAML alias refers to a node that contains it",
            source=shown,
            line=line,
            key=key_text(path),
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
                if key_node.tag in _NUMBER_TAGS and len(key_node.value) > MAX_NUMBER_CHARS:
                    # Before constructing it: YAML 1.1's base-60 ints are quadratic to build.
                    raise ConfigError(
                        f"{shown}:{line}: {key_text(path) or '(top level)'}: a key is a number "
                        f"written with more than {MAX_NUMBER_CHARS} characters",
                        source=shown,
                        line=line,
                    )
                key = loader.construct_object(key_node, deep=True)
                child = (*path, key)
                if key in first_line:
                    raise ConfigError(
                        f"{shown}:{line}: {key_text(child)}: duplicate key "
                        f"(first at line {first_line[key]})",
                        source=shown,
                        line=line,
                        key=key_text(child),
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


# What PyYAML's constructors raise, besides YAMLError, for a tagged or implicit scalar they
# cannot build: `2001-13-01` (a date), `!!int x`, `0x_`, `!!timestamp x`, `!!int` (empty).
_CONSTRUCTOR_ERRORS = (ValueError, TypeError, AttributeError, OverflowError, LookupError)


def _path_to(root: yaml.Node | None, target: yaml.Node) -> tuple[Any, ...]:
    """Where target sits under root: mapping keys (their text) and list indexes."""
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())] if root is not None else []
    seen: set[int] = set()
    while stack:
        current, path = stack.pop()
        if current is target:
            return path
        if id(current) in seen:  # an alias repeats a node: visit it once
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            for key_node, value_node in current.value:
                stack.append((value_node, (*path, getattr(key_node, "value", "?"))))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(current.value))
    return ()


def _show_scalar(node: yaml.Node) -> str:
    value = node.value if isinstance(node, yaml.ScalarNode) else ""
    tag = node.tag if isinstance(node, yaml.ScalarNode) and node.style is None else ""
    text = f"{value!r}" if len(str(value)) <= 40 else f"{str(value)[:37]!r}..."
    return f"{text} as {tag.rsplit(':', 1)[-1]}" if tag and "yaml.org" in tag else text


def _yaml_problem(exc: Exception) -> str:
    if isinstance(exc, _Unbuildable):
        return exc.problem
    if isinstance(exc, yaml.MarkedYAMLError):
        words = exc.problem or exc.context or "cannot parse"
        if exc.context and exc.problem and exc.context != exc.problem:
            words = f"{exc.problem} ({exc.context})"
    elif isinstance(exc, yaml.YAMLError | ValueError | OverflowError):
        words = str(exc) or type(exc).__name__
    else:  # a constructor's own bug (AttributeError on `!!timestamp x`): no words of use
        words = "cannot build this value"
    return " ".join(words.split())


# ---------------------------------------------------------------------------------- bounds

_NO_WRAP = 1 << 30  # a flow-style dump stays on one line: wrapping would indent it
_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})
_BIGGEST_NUMBER = 10**MAX_NUMBER_CHARS


class _LimitExceeded(Exception):
    """A bound broken at `loc` (under whatever the caller prefixes), on `line` if known."""

    def __init__(self, problem: str, *, line: int | None = None, loc: Loc = ()) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line
        self.loc = loc

    def error(self, source: str, *, line: int | None, whole: str, base: Loc = ()) -> ConfigError:
        """The ConfigError: "source:line: key: problem", or "...: <whole> problem" at the top."""
        where = f"{source}:{line}" if line is not None else source
        loc = (*base, *self.loc)
        key = _shorten(key_text(loc)) if loc else None
        subject = f"{key}:" if key else whole
        return ConfigError(
            f"{where}: {subject} {self.problem}",
            source=source,
            line=line,
            key=key,
            problem=self.problem,
        )


@dataclass
class _Budget:
    """The values one load may still compose; the file and its `--set` values share it."""

    values_left: int = MAX_CONFIG_VALUES
    spent_on: str = ""  # words for what spent some of it before, e.g. "the --set values"

    def spend(self, line: int | None) -> None:
        self.values_left -= 1
        if self.values_left < 0:
            counting = f" (counting {self.spent_on})" if self.spent_on else ""
            raise _LimitExceeded(
                f"has more than {MAX_CONFIG_VALUES:,} keys and values{counting}", line=line
            )


class _Unbuildable(Exception):
    """A scalar the YAML constructors refused, with its node (for the line and the key)."""

    def __init__(self, node: yaml.Node, problem: str) -> None:
        super().__init__(problem)
        self.node = node
        self.problem = problem


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that stops composing at the first value past the budget or the depth.

    PyYAML composes recursively until the document ends; counting as it goes makes a huge
    or deep document cost no more than the bounds, wherever in it they are broken.
    """

    def __init__(self, stream: str, budget: _Budget) -> None:
        super().__init__(stream)
        self.budget = budget
        self.depth = 0
        self.aliases = 0
        # An alias in a list is the anchored node itself, marked where the anchor is:
        # (id(list node), index) -> the alias's own line, for messages.
        self.alias_lines: dict[tuple[int, int], int] = {}

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """A value PyYAML cannot build (`2001-13-01`, `!!int x`) is marked where it is."""
        try:
            return super().construct_object(node, deep=deep)
        except _CONSTRUCTOR_ERRORS as exc:
            raise _Unbuildable(node, _yaml_problem(exc)) from None

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else None
        self.budget.spend(line)
        if isinstance(event, yaml.AliasEvent):
            self.aliases += 1
            if isinstance(parent, yaml.SequenceNode) and isinstance(index, int) and line:
                self.alias_lines[(id(parent), index)] = line
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING_DEPTH:
                raise _LimitExceeded(_too_deep(), line=line)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _too_deep(expanded: bool = False) -> str:
    aliases = " once YAML aliases are expanded" if expanded else ""
    return f"is nested more than {MAX_NESTING_DEPTH} levels deep{aliases}"


def _check_expanded(root: yaml.Node, loader: _BoundedLoader) -> None:
    """_LimitExceeded if the document, with its aliases expanded, breaks a bound.

    An alias repeats a node without copying it, so nine aliases of nine aliases of ...
    compose in microseconds yet expand to billions of values for anything that walks the
    data as a tree (validation, dumps). Each node's expanded size is worked out once and
    reused wherever an alias repeats it, so this costs one visit per composed node.
    """
    sizes: dict[int, tuple[int, int, int]] = {}  # id(node) -> (values, depth, characters)
    open_nodes: set[int] = set()  # collections being measured: an alias to one is a loop
    expanded = " once YAML aliases are expanded" if loader.aliases else ""

    def visit(node: yaml.Node, loc: Loc, line: int, level: int) -> tuple[int, int, int]:
        size = sizes.get(id(node))
        if size is None:
            if id(node) in open_nodes:
                raise _LimitExceeded(
                    "a YAML alias refers to a node that contains it", line=line, loc=loc
                )
            size = measure(node, loc, line, level)
            sizes[id(node)] = size
        if level + size[1] > MAX_NESTING_DEPTH:  # an alias puts a deep node deeper still
            raise _LimitExceeded(_too_deep(expanded=True), line=line, loc=loc)
        return size

    def measure(node: yaml.Node, loc: Loc, line: int, level: int) -> tuple[int, int, int]:
        if isinstance(node, yaml.ScalarNode):
            if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
                raise _LimitExceeded(
                    f"is a number written with more than {MAX_NUMBER_CHARS} characters",
                    line=line,
                    loc=loc,
                )
            return 1, 0, len(node.value)
        if level >= MAX_NESTING_DEPTH:
            raise _LimitExceeded(_too_deep(expanded=True), line=line, loc=loc)
        children: list[tuple[yaml.Node, Loc, int]] = []
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                child_line = key_node.start_mark.line + 1
                children.append((key_node, (*loc, name), child_line))
                children.append((value_node, (*loc, name), child_line))
        else:
            for index, item in enumerate(node.value):
                item_line = loader.alias_lines.get((id(node), index), item.start_mark.line + 1)
                children.append((item, (*loc, index), item_line))
        open_nodes.add(id(node))
        values, depth, characters = 1, 1, 0
        for child, child_loc, child_line in children:
            child_values, child_depth, child_characters = visit(
                child, child_loc, child_line, level + 1
            )
            values += child_values
            depth = max(depth, child_depth + 1)
            characters += child_characters
            if values > MAX_CONFIG_VALUES:
                raise _LimitExceeded(
                    f"has more than {MAX_CONFIG_VALUES:,} keys and values{expanded}",
                    line=line,
                    loc=loc,
                )
            if characters > MAX_TEXT_CHARS:
                raise _LimitExceeded(
                    f"has more than {MAX_TEXT_CHARS:,} characters of text{expanded}",
                    line=line,
                    loc=loc,
                )
        open_nodes.discard(id(node))
        return values, depth, characters

    visit(root, (), root.start_mark.line + 1, 0)


def _data_limit(data: Any) -> _LimitExceeded | None:
    """The first bound plain data (JSON-like) breaks, walked as the tree validation sees.

    Stops at the first bound crossed, so data that shares or contains itself costs no
    more than the bounds. The count and the text are totals, reported at the top (loc ()).
    """
    values, characters = 1, 0
    pending: list[tuple[Loc, Any, int]] = [((), data, 0)]
    while pending:
        loc, item, level = pending.pop()
        if isinstance(item, str | bytes | bytearray):
            characters += len(item)
        elif isinstance(item, int) and abs(item) >= _BIGGEST_NUMBER:
            return _LimitExceeded(f"is a number of more than {MAX_NUMBER_CHARS} digits", loc=loc)
        elif item is None or isinstance(item, bool):
            characters += 5  # as the loader counts what it reads back: "false", "null"
        elif isinstance(item, int | float):
            characters += len(repr(item))
        elif isinstance(item, Mapping | list | tuple | set | frozenset):
            if level >= MAX_NESTING_DEPTH:
                return _LimitExceeded(_too_deep(), loc=loc)
            pairs = item.items() if isinstance(item, Mapping) else enumerate(item)
            for key, child in pairs:
                if isinstance(item, Mapping):
                    values += 1  # the key
                    characters += len(key) if isinstance(key, str) else 1
                values += 1
                if values > MAX_CONFIG_VALUES:
                    return _LimitExceeded(f"has more than {MAX_CONFIG_VALUES:,} keys and values")
                part = key if isinstance(key, str | int) else str(type(key).__name__)
                pending.append(((*loc, part), child, level + 1))
        if characters > MAX_TEXT_CHARS:
            return _LimitExceeded(f"has more than {MAX_TEXT_CHARS:,} characters of text")
    return None


def _check_written_size(config: RunConfig, locate: _Locator) -> None:
    """ConfigError unless the config, as dump_config writes it, loads again within the bounds.

    `gpuwatch train` writes the config for the supervisor, which reads it back with
    load_config; by then defaults and `--set` values are added and aliases are expanded.
    """
    exceeded = _data_limit(config.model_dump())
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


def _check_overrides_length(overrides: Sequence[str]) -> None:
    total = 0
    for text in overrides:
        total += len(text)
        if total > MAX_TEXT_CHARS:
            label = _override_label(text)
            what = "the value is" if len(text) == total else "the --set values together are"
            raise ConfigError(
                f"{label}: {what} longer than {MAX_TEXT_CHARS:,} characters", source=label
            )


def _override_label(text: str) -> str:
    return f"--set {_shorten(text)}"


def _shorten(text: str) -> str:
    """Text for a message: a long key or override is cut, so the message stays short."""
    if len(text) <= _LABEL_LIMIT:
        return text
    return " ".join(text[: _LABEL_LIMIT * 2].split())[: _LABEL_LIMIT - 3] + "..."


# ------------------------------------------------------------------------------ overrides


def _split_key(key: str, label: str) -> list[str]:
    parts = [part.strip() for part in key.split(".")]
    if not key.strip() or any(not part for part in parts):
        raise ConfigError(
            f"{label}: {_shorten(key.strip()) or '(empty)'}: a key path needs names between "
            "the dots",
            source=label,
            key=_shorten(key.strip()) or None,
        )
    if len(parts) > MAX_NESTING_DEPTH:
        raise ConfigError(
            f"{label}: {_shorten(key.strip())}: a key path of more than {MAX_NESTING_DEPTH} names",
            source=label,
            key=_shorten(key.strip()),
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


# ----------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Locator:
    """Turns a loc into "file:line" or the override that set it."""

    file: str
    lines: Mapping[Loc, int]
    overrides: Mapping[Loc, str]

    def override_for(self, loc: Loc) -> str | None:
        # Compared as text: an override's loc has list positions as ints (pydantic's
        # spelling), a key from `where("a.b.0")` has them as text.
        spelled = {_str_loc(key): label for key, label in self.overrides.items()}
        for size in range(len(loc), 0, -1):
            label = spelled.get(_str_loc(loc[:size]))
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

    def override_under(self, loc: Loc) -> str | None:
        """The first override that set a key under loc (`--set trian.max_steps=1` made the
        key `trian`), when the file itself has no such key."""
        wanted = _str_loc(loc)
        if any(_str_loc(key) == wanted for key in self.lines):
            return None
        for key, label in self.overrides.items():
            if _str_loc(key)[: len(wanted)] == wanted:
                return label
        return None

    def where(self, loc: Loc) -> tuple[str, int | None, bool]:
        """(text before the key, line, whether an override is the source)."""
        label = self.override_for(loc) or self.override_under(loc)
        if label is not None:
            return label, None, True
        line = self.line_for(loc)
        return (f"{self.file}:{line}" if line else self.file), line, False


def _str_loc(loc: Loc) -> Loc:
    return tuple(str(part) if isinstance(part, int) else part for part in loc)


def _validate(data: dict[Any, Any], locate: _Locator) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, locate) from None


def _first_error(exc: ValidationError, locate: _Locator) -> ConfigError:
    """The first problem in file order (a --set's last), as one line of plain words."""
    candidates: list[tuple[tuple[int, int, int], ConfigError]] = []
    for order, problem in enumerate(problems(exc)):
        where, line, from_override = locate.where(_pointed_at(locate, problem.keys))
        err = ConfigError(
            f"{where}: {problem.key}: {problem.words}",
            source=where,
            line=line,
            key=problem.key,
            problem=problem.words,
            keys=tuple(key_text(loc) for loc in problem.keys),
        )
        rank = (1 if from_override else 0, line if line is not None else 1 << 30, order)
        candidates.append((rank, err))
    candidates.sort(key=lambda pair: pair[0])
    return candidates[0][1]


def _pointed_at(locate: _Locator, keys: tuple[Loc, ...]) -> Loc:
    """Where to point a problem about these settings: an override that set one, else the file."""
    for key in keys:
        if locate.override_for(key):
            return key
    for key in keys:
        if key in locate.lines:
            return key
        if len(key) > 1 and key[:-1] in locate.lines and isinstance(key[-2], int):
            return key  # a key the file leaves out, of a list item it spells (`- gpu2`)
    return keys[0]
