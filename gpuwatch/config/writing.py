"""Configs and settings written as YAML text that loads back equal: the whole config
(dump_config, what the supervisor reads back with load_config) and one `--set` (format_override,
what parse_override reads back).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from gpuwatch.config.bounds import MAX_CONFIG_BYTES
from gpuwatch.config.words import yaml_float
from trainer_runtime.schema import RunConfig

_NO_WRAP = 1 << 30  # a flow-style dump stays on one line: wrapping would indent it


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
    text = _safe_dump(data, default_flow_style=False)
    if len(text.encode("utf-8")) <= MAX_CONFIG_BYTES:
        return text
    return _safe_dump(data, default_flow_style=True, width=_NO_WRAP)


def _safe_dump(data: dict[str, Any], **style: Any) -> str:
    """Non-ASCII text as itself, except where PyYAML would write a NEL (U+0085) raw: it
    reads a raw NEL inside a quoted string back as a line break (a command argument of
    one NEL came back as a space), so such a config is written with every non-ASCII
    character escaped (a NEL as YAML's own escape, backslash N), which reads back exactly."""
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, **style)
    if "\x85" in text:
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False, **style)
    return text


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
