"""The run's settings as the dashboard reads, words and changes them (pure).

The helpers behind the "pending settings" keys: reading a dotted setting, stepping
prefetch/accumulation/batch with the divisibility rule (``check_pending``: the checks a
relaunch makes), and describing what a relaunch would change; the words a setting's
value is shown in, and the attempts table's short names for settings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from trainer_runtime.changes import (
    ACCUMULATION_REFUSAL,
    BATCH_REFUSAL,
    COMMAND_KEYS,
    live_changes,
)
from trainer_runtime.schema import prefetch_enabled, prefetch_word

PREFETCH_KEY = "data.prefetch"
ACCUMULATION_KEY = "train.accumulation_steps"
BATCH_KEY = "train.global_batch_size"


def command_argv(settings: Mapping[str, Any]) -> list[str] | None:
    """The argv of a person's own command in a run's settings (gpuwatch run), else None."""
    argv = get_setting(settings, "command.argv")
    if isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv):
        return list(argv)
    return None


def own_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that are a run's own: all of them for the bundled runtime; for a
    person's own command, the command and the few gpuwatch sets (COMMAND_KEYS), not the
    defaults the schema fills in for a model and data it never had."""
    if command_argv(settings) is None:
        return dict(settings)
    own: dict[str, Any] = {"command": settings["command"]}
    for dotted in COMMAND_KEYS:
        section, _, key = dotted.partition(".")
        if not key:
            if section in settings:
                own[section] = settings[section]
            continue
        node = settings.get(section)
        if isinstance(node, Mapping) and key in node:
            own.setdefault(section, {})[key] = node[key]
    return own


def get_setting(settings: Mapping[str, Any], dotted: str) -> Any:
    """``settings["data"]["prefetch"]`` for ``"data.prefetch"``; None when absent."""
    node: Any = settings
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def effective(settings: Mapping[str, Any], pending: Mapping[str, Any], dotted: str) -> Any:
    """The value a relaunch would use: the pending one, else the current one."""
    if dotted in pending:
        return pending[dotted]
    return get_setting(settings, dotted)


def pending_overrides(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> dict[str, Any]:
    """The pending changes that differ from the current settings (what relaunch sends)."""
    return {k: v for k, v in pending.items() if get_setting(settings, k) != v}


_LABELS = {
    PREFETCH_KEY: "prefetch",
    ACCUMULATION_KEY: "accumulation",
    BATCH_KEY: "batch",
    "data.parallel_calls": "parallel calls",
    "data.read_latency_ms": "read latency ms",
    "data.decode_cost": "decode cost",
    "data.cache": "cache",
    "train.steps_per_execution": "steps per execution",
    "train.jit_compile": "jit compile",
    "train.mixed_precision": "precision",
}


def format_setting(dotted: str, value: Any) -> str:
    """A setting's value in a word a config file reads back the same: "off", "on", "8"."""
    if dotted == PREFETCH_KEY:
        return prefetch_word(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:  # not set: what that means for the key, never "?" (it is known)
        return _UNSET_WORDS.get(dotted, "-")
    return str(value)


# What a setting left unset means, where it means something ("-" for the others).
_UNSET_WORDS = {
    "train.max_steps": "no limit",
    "train.epochs": "no limit",
    "strategy.replicas": "all",
    "model.factory": "built-in",
    "data.factory": "built-in",
}


# The attempts table's names for a setting (a column's head, or a note under a row).
_SHORT_LABELS = {
    PREFETCH_KEY: "prefetch",
    ACCUMULATION_KEY: "accum",
    BATCH_KEY: "batch",
    "data.parallel_calls": "parallel",
    "data.read_latency_ms": "read ms",
    "data.decode_cost": "decode",
    "data.cache": "cache",
    "train.learning_rate": "lr",
    "strategy.cpu_replicas": "cpu replicas",
    "strategy.replicas": "replicas",
    # Short enough that one of them fits as a column at 80 columns, with the longest
    # "ended" word: a note under each row would leave a 3-line table room for one attempt.
    # "spe" is Keras' own shorthand for steps_per_execution.
    "train.steps_per_execution": "spe",
    "train.jit_compile": "jit",
    "train.mixed_precision": "precision",
    "train.max_steps": "max steps",
}


def setting_labels(keys: Iterable[str]) -> dict[str, str]:
    """Each key's short name ('read ms', 'cache', else the part after its section); the
    whole key where two would read the same (data.name and model.name)."""
    keys = list(keys)
    short = {key: _SHORT_LABELS.get(key) or key.rsplit(".", 1)[-1] for key in keys}
    counts: dict[str, int] = {}
    for label in short.values():
        counts[label] = counts.get(label, 0) + 1
    return {key: label if counts[label] == 1 else key for key, label in short.items()}


def setting_text(dotted: str, value: Any) -> str:
    """A setting's value on one line: format_setting's word, a list or an object as JSON."""
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"), default=str)
    return format_setting(dotted, value)


def pending_applies_live(
    settings: Mapping[str, Any], pending: Mapping[str, Any], *, running: bool
) -> bool:
    """Whether `r` would apply the pending changes in the running trainer (else relaunch;
    always for a person's own command, which takes no live change)."""
    overrides = pending_overrides(settings, pending)
    if not running or not overrides or command_argv(settings) is not None:
        return False
    after: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v
                             for k, v in settings.items()}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        node = after.setdefault(section, {})
        if not isinstance(node, dict) or not key or "." in key:
            return False
        node[key] = value
    live, other = live_changes(settings, after)
    return bool(live) and not other


def describe_pending(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> str:
    """'prefetch off→on, accumulation 1→2' for the overrides that change something."""
    parts = []
    for key, value in pending_overrides(settings, pending).items():
        label = _LABELS.get(key, key)
        before = format_setting(key, get_setting(settings, key))
        parts.append(f"{label} {before}→{format_setting(key, value)}")
    return ", ".join(parts)


class SettingRefused(ValueError):
    """A pending change that the run could not start with; the message says why."""


def _with(
    settings: Mapping[str, Any], pending: Mapping[str, Any], key: str, value: Any
) -> dict[str, Any]:
    updated = dict(pending)
    updated[key] = value
    return pending_overrides(settings, updated)


def toggle_prefetch(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> dict[str, Any]:
    """Flip data.prefetch: any enabled form (True, 'autotune', N) -> False, off -> True."""
    enabled = prefetch_enabled(effective(settings, pending, PREFETCH_KEY))
    return _with(settings, pending, PREFETCH_KEY, not enabled)


def check_pending(settings: Mapping[str, Any], pending: Mapping[str, Any], replicas: int) -> None:
    """SettingRefused, with the schema's reason, if a relaunch with `pending` would be refused.

    The same checks as `gpuwatch train` and the supervisor's relaunch: the whole config
    through the schema (bounds, limits of the built-in data) and the split of the global
    batch over replicas x accumulation steps.
    """
    from gpuwatch.config import ConfigError, apply_overrides, check_replicas
    from trainer_runtime.schema import RunConfig

    try:
        current = RunConfig.model_validate(dict(settings))
    except ValueError:
        return  # settings from another version of gpuwatch: the supervisor still checks
    try:
        config = apply_overrides(current, pending_overrides(settings, pending), source="pending")
        check_replicas(config, replicas, source="pending")
    except ConfigError as exc:
        raise SettingRefused(str(exc).removeprefix("pending: ")) from None


def step_accumulation(
    settings: Mapping[str, Any], pending: Mapping[str, Any], *, up: bool, replicas: int
) -> dict[str, Any]:
    """Double (up) or halve accumulation steps; raises SettingRefused if it cannot split,
    or for a person's own command (ACCUMULATION_REFUSAL)."""
    if command_argv(settings) is not None:
        raise SettingRefused(ACCUMULATION_REFUSAL)
    accumulation = int(effective(settings, pending, ACCUMULATION_KEY) or 1)
    if up:
        new = accumulation * 2
    else:
        if accumulation <= 1:
            raise SettingRefused("accumulation is already 1 (no accumulation)")
        new = max(1, accumulation // 2)
    changed = _with(settings, pending, ACCUMULATION_KEY, new)
    check_pending(settings, changed, replicas)
    return changed


def step_batch(
    settings: Mapping[str, Any], pending: Mapping[str, Any], *, up: bool, replicas: int
) -> dict[str, Any]:
    """Double (up) or halve the global batch; raises SettingRefused if it cannot split, or
    for a person's own command (BATCH_REFUSAL)."""
    if command_argv(settings) is not None:
        raise SettingRefused(BATCH_REFUSAL)
    batch = int(effective(settings, pending, BATCH_KEY) or 1)
    if up:
        new = batch * 2
    else:
        if batch % 2:
            raise SettingRefused(f"global batch {batch} is odd: cannot halve it")
        new = batch // 2
    changed = _with(settings, pending, BATCH_KEY, new)
    check_pending(settings, changed, replicas)
    return changed
