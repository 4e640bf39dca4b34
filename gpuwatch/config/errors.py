"""ConfigError, the one kind of error a config problem becomes, and the words of its messages.

Every problem with a config file, a `--set` or a mapping of settings is a ConfigError whose
text is one line, ready to print after "gpuwatch: "; `as_config_error` turns anything else
raised while making a config into one (the last line of defence: never a traceback).
"""

from __future__ import annotations

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


def as_config_error(exc: Exception, shown: str, nested: str, cannot: str) -> ConfigError:
    """Any failure while making a config as the one line ConfigError says (the last line
    of defence: never a traceback)."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, RecursionError):
        return ConfigError(f"{shown}: {nested}", source=shown)
    return ConfigError(f"{shown}: {cannot} ({type(exc).__name__}: {exc})", source=shown)


def override_label(text: str) -> str:
    return f"--set {shorten(text)}"


def shorten(text: str) -> str:
    """Text for a message: a long key or override is cut, so the message stays short."""
    if len(text) <= _LABEL_LIMIT:
        return text
    return " ".join(text[: _LABEL_LIMIT * 2].split())[: _LABEL_LIMIT - 3] + "..."
