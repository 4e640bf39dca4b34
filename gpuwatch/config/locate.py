"""Where a problem is: a pydantic `loc` as "file:line", or as the `--set` that set it.

What a problem is, in words, comes from gpuwatch.config.words; this module says where it
is, and picks the first problem in file order (a `--set`'s last) as the one to report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from gpuwatch.config.errors import ConfigError
from gpuwatch.config.words import Loc, key_text, problems
from trainer_runtime.schema import RunConfig


@dataclass(frozen=True)
class Locator:
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
        if line is None:
            # A key the file never had, in a section only an override made (`--set
            # command.argv=[ls]` leaves command.cwd missing): that override is the source.
            for size in range(len(loc) - 1, 0, -1):
                label = self.override_under(loc[:size])
                if label is not None:
                    return label, None, True
        return (f"{self.file}:{line}" if line else self.file), line, False


def _str_loc(loc: Loc) -> Loc:
    return tuple(str(part) if isinstance(part, int) else part for part in loc)


def validate(data: dict[Any, Any], locate: Locator) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, locate) from None


def _first_error(exc: ValidationError, locate: Locator) -> ConfigError:
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


def _pointed_at(locate: Locator, keys: tuple[Loc, ...]) -> Loc:
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
