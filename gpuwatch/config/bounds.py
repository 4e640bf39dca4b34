"""What a config may hold: the MAX_* bounds, and checks of plain data and `--set` text against them.

No input costs more than about a second and 100 MB to accept or refuse: the file's size,
its nesting depth and its number of values (counted with YAML aliases expanded, so a
"billion laughs" file is refused before anything walks it) are bounded by the MAX_*
constants below, and so are `--set` values and the mappings `apply_overrides` is handed.
YAML documents are bounded as they are composed (reading.py); `Budget` is the count of
values they share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatch.config.errors import ConfigError, override_label, shorten
from gpuwatch.config.words import Loc, key_text

# Bounds on what a config may hold. A real config is a few KiB with a few hundred values;
# these leave room for large kwargs while keeping the worst input (measured in
# tests/config/test_config_bounds.py) well inside 1 s and 100 MB on a small machine. PyYAML's
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
_BIGGEST_NUMBER = 10**MAX_NUMBER_CHARS


class LimitExceeded(Exception):
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
        key = shorten(key_text(loc)) if loc else None
        subject = f"{key}:" if key else whole
        return ConfigError(
            f"{where}: {subject} {self.problem}",
            source=source,
            line=line,
            key=key,
            problem=self.problem,
        )


@dataclass
class Budget:
    """The values one load may still compose; the file and its `--set` values share it."""

    values_left: int = MAX_CONFIG_VALUES
    spent_on: str = ""  # words for what spent some of it before, e.g. "the --set values"

    def spend(self, line: int | None) -> None:
        self.values_left -= 1
        if self.values_left < 0:
            counting = f" (counting {self.spent_on})" if self.spent_on else ""
            raise LimitExceeded(
                f"has more than {MAX_CONFIG_VALUES:,} keys and values{counting}", line=line
            )


def too_deep(expanded: bool = False) -> str:
    aliases = " once YAML aliases are expanded" if expanded else ""
    return f"is nested more than {MAX_NESTING_DEPTH} levels deep{aliases}"


def data_limit(data: Any) -> LimitExceeded | None:
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
            return LimitExceeded(f"is a number of more than {MAX_NUMBER_CHARS} digits", loc=loc)
        elif item is None or isinstance(item, bool):
            characters += 5  # as the loader counts what it reads back: "false", "null"
        elif isinstance(item, int | float):
            characters += len(repr(item))
        elif isinstance(item, Mapping | list | tuple | set | frozenset):
            if level >= MAX_NESTING_DEPTH:
                return LimitExceeded(too_deep(), loc=loc)
            pairs = item.items() if isinstance(item, Mapping) else enumerate(item)
            for key, child in pairs:
                if isinstance(item, Mapping):
                    values += 1  # the key
                    characters += len(key) if isinstance(key, str) else 1
                values += 1
                if values > MAX_CONFIG_VALUES:
                    return LimitExceeded(f"has more than {MAX_CONFIG_VALUES:,} keys and values")
                part = key if isinstance(key, str | int) else str(type(key).__name__)
                pending.append(((*loc, part), child, level + 1))
        if characters > MAX_TEXT_CHARS:
            return LimitExceeded(f"has more than {MAX_TEXT_CHARS:,} characters of text")
    return None


def check_overrides_length(overrides: Sequence[str]) -> None:
    total = 0
    for text in overrides:
        total += len(text)
        if total > MAX_TEXT_CHARS:
            label = override_label(text)
            what = "the value is" if len(text) == total else "the --set values together are"
            raise ConfigError(
                f"{label}: {what} longer than {MAX_TEXT_CHARS:,} characters", source=label
            )
