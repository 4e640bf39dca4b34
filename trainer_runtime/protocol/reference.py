"""The frame reference: the commands and the events as text, made from their declarations.

The package's docstring (``trainer_runtime/protocol/__init__.py``) and docs/internals.md
carry this text; tests check that they still match it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from trainer_runtime.protocol.commands import COMMANDS, Command
from trainer_runtime.protocol.events import EVENTS, SUMMARY_PAST_WORKERS
from trainer_runtime.protocol.wire import WireKind


def command_reference(width: int = 86) -> str:
    """The commands and their fields as text, generated from the declarations.

    The package's docstring and docs/internals.md carry this text; a test checks
    that they still match it.
    """
    lines = [
        "dashboard -> supervisor (commands; each answered by ack or err). Every field is",
        "checked by type and range; an unknown command or field, or a value of the wrong",
        "kind (1 is not true, true is not 1), is answered err and changes nothing.",
    ]
    common = {f.name for f in fields(Command)}
    declared: list[type[Command]] = [Command, *COMMANDS.values()]
    for cls in declared:
        if cls is Command:
            lines.append("  (any)       fields every command may carry")
        else:
            summary = (cls.__doc__ or "").strip().splitlines()[0]
            lines.extend(
                textwrap.wrap(
                    f"{cls.TYPE:<11} {summary}",
                    width,
                    initial_indent="  ",
                    subsequent_indent=" " * 14,
                )
            )
        for f in fields(cls):
            if cls is not Command and f.name in common:
                continue
            kind: WireKind = f.metadata["kind"]
            text = f"{f.name}: {kind.describe}; default {_default_text(f)}"
            if f.metadata["note"]:
                text += f"; {f.metadata['note']}"
            lines.extend(
                textwrap.wrap(
                    text, width, initial_indent=" " * 14, subsequent_indent=" " * 16
                )
            )
    return "\n".join(lines)


def _default_text(f: Any) -> str:
    default = f.default_factory() if f.default is MISSING else f.default
    return json.dumps(dict(default) if isinstance(default, Mapping) else default)


def event_reference(width: int = 86) -> str:
    """The events and their fields as text, generated from the declarations.

    The package's docstring carries this text; a test checks that it still matches it.
    """
    lines: list[str] = []
    for source, title in (("trainer", "trainer -> supervisor (the trainer's telemetry socket)"),
                          ("agent", f"agent -> supervisor (past {SUMMARY_PAST_WORKERS} workers, "
                                    "instead of a worker's steps but the chief's)"),
                          ("supervisor", "supervisor -> dashboard, besides every trainer "
                                         "and agent event relayed")):
        lines.append(f"{title}:")
        for cls in EVENTS.values():
            if source != cls.FROM:
                continue
            summary = (cls.__doc__ or "").strip().splitlines()[0]
            lines.extend(textwrap.wrap(f"{cls.TYPE:<11} {summary}", width,
                                       initial_indent="  ", subsequent_indent=" " * 14))
            for f in fields(cls):
                text = f"{f.name} ({f.type}): {f.metadata['note']}"
                lines.extend(textwrap.wrap(text, width, initial_indent=" " * 14,
                                           subsequent_indent=" " * 16))
    return "\n".join(lines)
