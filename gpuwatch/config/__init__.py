"""YAML -> validated RunConfig, with one-line errors that name the file, the key and the line.

`gpuwatch train CONFIG` calls `load_config` before anything starts; a relaunch from the
dashboard goes through `apply_overrides`, which validates with the same schema
(`trainer_runtime.schema.RunConfig`). Every problem becomes a `ConfigError` whose text is
one line, ready to print after "gpuwatch: ", never a traceback and never a pydantic URL.

Line numbers come from composing the YAML into nodes first: each mapping key and each
sequence item records its 1-based line under its path, so a pydantic `loc` such as
`("train", "accumulation_steps")` maps back to the line of the offending key (or of the
closest parent the file has). What a problem is, in words, comes from
gpuwatch.config.words; this package says where it is.

No input costs more than about a second and 100 MB to accept or refuse: the file's size,
its nesting depth and its number of values (counted with YAML aliases expanded, so a
"billion laughs" file is refused before anything walks it) are bounded by the MAX_*
constants, and so are `--set` values and the mappings `apply_overrides` is handed.

The parts (each imports only the ones above it in this list, never this package):
  words.py      pydantic's validation errors as plain words, one short problem per setting
  errors.py     ConfigError, and the words of its messages
  bounds.py     the MAX_* bounds; plain data and `--set` text checked against them
  reading.py    a config file read and composed as YAML within the bounds, each key's line
  writing.py    dump_config and format_override: YAML text that loads back equal
  locate.py     a problem's place (file:line or the --set), the first problem in file order
  overrides.py  dotted-key settings and the settle step (set, validate, bound the size)
  loading.py    load_config, command_config, LoadedConfig
  devices.py    the replicas a config expects, the GPUs it asks for, the batch's split
  settings_form.py  the dashboard's settings screen, pure: live settings as text and back
                (it reads the run's state too; nothing here imports it)
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
