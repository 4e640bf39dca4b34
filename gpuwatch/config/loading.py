"""A config file, or a person's own command, made into a validated RunConfig.

`gpuwatch train CONFIG` calls `load_config` before anything starts: the file is read and
parsed within the bounds (reading.py), its `--set` overrides are applied and the whole is
validated (overrides.py's settle step). `gpuwatch run` makes its config with
`command_config`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatch.config.bounds import Budget, check_overrides_length
from gpuwatch.config.errors import ConfigError, as_config_error, override_label, shorten
from gpuwatch.config.locate import Locator
from gpuwatch.config.overrides import parse_bounded_override, settle
from gpuwatch.config.reading import parse_yaml, read_text
from gpuwatch.config.words import Loc
from trainer_runtime.changes import command_setting_refusal
from trainer_runtime.schema import RunConfig


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
        locate = Locator(file=str(self.path), lines=self.lines, overrides=self.override_sources)
        for candidate in (key, *related):
            label = locate.override_for(tuple(candidate.split(".")))
            if label is not None:
                return label
        return locate.where(tuple(key.split(".")))[0]


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> LoadedConfig:
    """Read, parse and validate a YAML config file, then apply `--set key.path=value` overrides.

    Raises ConfigError (and nothing else) on any problem with the file or the overrides.
    """
    if not str(path):  # Path("") is ".", the working directory
        raise ConfigError(f"no config file given ({str(path)!r})", source=str(path))
    path = Path(path)
    shown = str(path)
    try:
        check_overrides_length(overrides)
        budget = Budget()  # the --set values and the file share one budget of values
        parsed: list[tuple[tuple[str, Any], str]] = []
        for override in overrides:
            parsed.append((parse_bounded_override(override, budget), override_label(override)))
            budget.spent_on = "the --set values"
        text = read_text(path, shown)
        data, lines = parse_yaml(text, shown, budget)
        config, override_sources = settle(
            data, [(key, value, label) for (key, value), label in parsed], shown, lines)
        return LoadedConfig(
            config=config, path=path, text=text, lines=lines, override_sources=override_sources
        )
    except Exception as exc:
        raise as_config_error(exc, shown, "nested too deeply", "cannot load config") from None


def command_config(
    argv: Sequence[str], cwd: str, overrides: Sequence[str] = (), name: str | None = None,
    workers: int | None = None,
) -> RunConfig:
    """The config of a person's own command (`gpuwatch run [--name N] [--workers N]
    [--set K=V] -- ARGV`): the command and the directory it runs in, with the few settings
    a command takes (changes.COMMAND_KEYS) as `--set` and `--name`, and `--workers N` as a
    local cluster of N workers (the command started N times, each with its TF_CONFIG),
    validated by the same schema and bounded like a file. ConfigError (one line) if not: a
    `--set` of any other key names it and says why (changes.command_setting_refusal)."""
    shown = "gpuwatch run"
    try:
        check_overrides_length(overrides)
        budget = Budget()
        data: dict[Any, Any] = {"command": {"argv": list(argv), "cwd": cwd}}
        settings: list[tuple[str, Any, str]] = []
        if name is not None:
            settings.append(("name", name, "--name"))
        if workers is not None:
            settings.append(("cluster.workers", workers, "--workers"))
        for override in overrides:
            key, value = parse_bounded_override(override, budget)
            refuse_command_keys([key], f"--set {shorten(key)}")
            settings.append((key, value, override_label(override)))
        return settle(data, settings, shown, {})[0]
    except Exception as exc:
        raise as_config_error(exc, shown, "nested too deeply", "cannot make the config") from None


def refuse_command_keys(keys: Iterable[str], source: str) -> None:
    """ConfigError naming the first of these dotted settings that a person's own command
    cannot take (changes.command_setting_refusal): "SOURCE: reason" where SOURCE names it
    (`--set KEY`), else "SOURCE: KEY: reason"."""
    for key in keys:
        reason = command_setting_refusal(str(key))
        if reason is not None:
            where = source if str(key) in source else f"{source}: {shorten(str(key))}"
            raise ConfigError(f"{where}: {reason}", source=source, key=str(key), problem=reason)
