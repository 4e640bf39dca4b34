"""YAML -> validated RunConfig, with one-line errors that name the file, the key and the line.

`gpuwatch train CONFIG` calls `load_config` before anything starts; a relaunch from the
dashboard goes through `apply_overrides`, validated by the same schema
(`trainer_runtime.schema.RunConfig`). Every problem becomes a `ConfigError` of one line,
ready to print after "gpuwatch: ", never a traceback or a pydantic URL. Line numbers come
from composing the YAML into nodes first, so a pydantic `loc` maps back to the offending
key's line (or its closest parent's); gpuwatch.config.words says what a problem is, this
package where. No input costs more than about a second and 100 MB to accept or refuse:
the MAX_* bounds hold the file's size, nesting and number of values (aliases expanded, so
a "billion laughs" file is refused before anything walks it), `--set` values and what
`apply_overrides` is handed. Its parts: docs/internals.md, "Module map".
"""

from gpuwatch.config.bounds import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_VALUES,
    MAX_NESTING_DEPTH,
    MAX_NUMBER_CHARS,
    MAX_TEXT_CHARS,
)
from gpuwatch.config.devices import check_devices, check_replicas, expected_replicas
from gpuwatch.config.devices import visible_gpus as visible_gpus
from gpuwatch.config.errors import ConfigError
from gpuwatch.config.loading import LoadedConfig, command_config, load_config, refuse_command_keys
from gpuwatch.config.overrides import apply_overrides, parse_override
from gpuwatch.config.writing import dump_config, format_override

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
