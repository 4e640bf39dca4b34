"""Reading what headless prints, for tests: a run folded from events, a summary's keys."""

from __future__ import annotations

import re
from typing import Any

from gpuwatch.runstate import RunState


def fold(events: list[dict[str, Any]]) -> RunState:
    """A RunState folded from `events`, every one accepted."""
    state = RunState()
    state.apply_many(events)
    assert state.bad_events == 0
    return state


def summary_keys(line: str) -> dict[str, str]:
    """The key=value pairs of a `summary:` line."""
    assert line.startswith("summary: ")
    return dict(re.findall(r"(\w+)=(\S+)", line))
