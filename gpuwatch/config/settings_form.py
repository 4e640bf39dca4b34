"""The settings screen's form, pure: settings as text, and typed text back to settings.

No Textual. The dashboard's settings screen (`e`) shows each of FORM_KEYS as the text a
config file would hold (`form_texts`): first LIVE_FORM_KEYS (the schema's `LIVE_KEYS`, in
the schema's order: a running trainer takes them at an update boundary), then
RELAUNCH_FORM_KEYS (the relaunch settings a person tunes for speed: `r` relaunches from the
checkpoint with them). On Enter it hands every field's text to `read_form`, which either
returns the new pending settings or raises FormRefused with one line per field that is
wrong. Pending relaunch settings make the whole pending change a relaunch, live keys with
it (`runstate.pending_applies_live`; the supervisor decides the same way).

Nothing here decides what a value may be: each text is read as a `--set` value is
(`config.parse_override`: a YAML scalar, bounded), the whole config is checked by the
schema (`config.apply_overrides`) and the batch split by `config.check_replicas`, exactly
as `gpuwatch train`, the supervisor's relaunch and the p/a/b keys (`runstate.check_pending`)
check them. The error lines are those checks' own words without their source:
"data.parallel_calls: must be at least 1 (got 0)".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuwatch.config.devices import check_replicas
from gpuwatch.config.errors import ConfigError
from gpuwatch.config.overrides import apply_overrides, parse_override
from gpuwatch.runstate import (
    command_argv,
    effective,
    format_setting,
    get_setting,
    pending_overrides,
)
from trainer_runtime.changes import LIVE_KEYS, command_setting_refusal
from trainer_runtime.schema import RunConfig

__all__ = [
    "FORM_KEYS",
    "GENERAL",
    "LIVE_FORM_KEYS",
    "RELAUNCH_FORM_KEYS",
    "FormRefused",
    "form_texts",
    "read_form",
]

# Where messages say the values came from (never shown: error lines drop their source).
_SOURCE = "settings"
# The key of an error line that is about no field of the form.
GENERAL = ""


def _live_keys_in_schema_order() -> tuple[str, ...]:
    keys = []
    for section, info in RunConfig.model_fields.items():
        model = info.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            keys += [f"{section}.{name}" for name in model.model_fields]
    return tuple(key for key in keys if key in LIVE_KEYS)


# The settings a running trainer can change: the screen's first group.
LIVE_FORM_KEYS: tuple[str, ...] = _live_keys_in_schema_order()
# The settings that take a relaunch which a person tunes for speed (the demo's remedy,
# steps_per_execution, first): the screen's second group, marked "relaunch".
RELAUNCH_FORM_KEYS: tuple[str, ...] = (
    "train.steps_per_execution",
    "train.jit_compile",
    "train.mixed_precision",
)
# The settings the screen edits, in its order.
FORM_KEYS: tuple[str, ...] = LIVE_FORM_KEYS + RELAUNCH_FORM_KEYS


class FormRefused(ValueError):
    """Some fields hold what the run could not use; `errors` maps each to its line.

    A problem about no field of the form (the run's own settings unreadable) is under
    GENERAL.
    """

    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__("; ".join(errors.values()))
        self.errors = dict(errors)


def _with_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with each form key it lacks (a record from before the key was written)
    at the schema's default: what the run trains with."""
    defaults = RunConfig().model_dump(mode="json")
    full: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v
                            for k, v in settings.items()}
    for key in FORM_KEYS:
        section, _, name = key.partition(".")
        node = full.setdefault(section, {})
        if isinstance(node, dict) and name not in node:
            node[name] = defaults[section][name]
    return full


def form_texts(settings: Mapping[str, Any], pending: Mapping[str, Any]) -> dict[str, str]:
    """Each field's starting text: the pending value, else the running one, as YAML reads it."""
    settings = _with_defaults(settings)
    texts = {}
    for key in FORM_KEYS:
        value = effective(settings, pending, key)
        texts[key] = "" if value is None else format_setting(key, value)
    return texts


def read_form(
    settings: Mapping[str, Any],
    pending: Mapping[str, Any],
    texts: Mapping[str, str],
    replicas: int,
) -> dict[str, Any]:
    """The new pending settings from the fields' texts, or FormRefused.

    `texts` maps keys of FORM_KEYS to what their fields hold (a key left out keeps its
    effective value). The result is `pending` with the form's keys replaced by the values
    as the schema reads them ("auto" -> "autotune", "8" -> 8), keeping only what differs
    from the running `settings`; pending keys outside the form are kept and checked too.

    Every field is checked: a text that is not a value, or that the schema refuses alone,
    gets its own line; a limit across settings (batch and accumulation, the batch split
    over `replicas`) gets one line, under the first of its settings the form changed. For
    a person's own command (gpuwatch run) a field changed to a setting it does not take
    gets the reason `command_setting_refusal` gives, as `--set` and a relaunch say it.
    """
    try:
        current = RunConfig.model_validate(dict(settings))
    except ValidationError:
        raise FormRefused(
            {GENERAL: "the run's settings are not ones this gpuwatch reads: relaunch with --set"}
        ) from None
    settings = _with_defaults(settings)
    errors: dict[str, str] = {}
    values: dict[str, Any] = {}
    for key in FORM_KEYS:
        if key not in texts:
            values[key] = effective(settings, pending, key)
            continue
        try:
            _, values[key] = parse_override(f"{key}={texts[key]}")
        except ConfigError as exc:
            words = _words(exc)
            errors[key] = words if words.startswith(key) else f"{key}: {words}"
            continue
        if command_argv(settings) is not None and values[key] != effective(settings, pending, key):
            reason = command_setting_refusal(key)
            if reason is not None:
                errors[key] = f"{key}: {reason}"
    others = {key: value for key, value in pending.items() if key not in FORM_KEYS}
    config = _check(current, settings, others, values, errors, replicas)
    if config is None:
        raise FormRefused(errors)
    read = {key: get_setting(config.model_dump(), key) for key in FORM_KEYS}
    return pending_overrides(settings, {**others, **read})


def _check(
    current: RunConfig,
    settings: Mapping[str, Any],
    others: Mapping[str, Any],
    values: Mapping[str, Any],
    errors: dict[str, str],
    replicas: int,
) -> RunConfig | None:
    """The config with the values that read (adding a line to `errors` for each problem),
    or None if any field has a problem.

    Ends: each round either stops or puts one more field of the form into `errors`, and
    the next round leaves that field out.
    """
    while True:
        candidate = {**others, **{k: v for k, v in values.items() if k not in errors}}
        overrides = pending_overrides(settings, candidate)
        try:
            config = apply_overrides(current, overrides, source=_SOURCE)
            check_replicas(config, replicas, source=_SOURCE)
        except ConfigError as exc:
            field = _field_of(exc, overrides)
            if field in errors:  # under a field whose own text already failed
                field = GENERAL
            errors[field] = _words(exc)
            if field in overrides and len(exc.keys) == 1:
                continue  # a problem of one field alone: check the others without it
            return None  # a limit across settings, or no field's: one line is enough
        return None if errors else config


def _words(exc: ConfigError) -> str:
    """The message without where it came from: "data.parallel_calls: must be ..."."""
    return str(exc).removeprefix(f"{exc.source}: ") if exc.source else str(exc)


def _field_of(exc: ConfigError, overrides: Mapping[str, Any]) -> str:
    """The field a problem belongs under: the first of its settings the form changed,
    else the first the form has, else GENERAL."""
    for key in exc.keys:
        if key in overrides and key in FORM_KEYS:
            return key
    for key in exc.keys:
        if key in FORM_KEYS:
            return key
    return GENERAL
