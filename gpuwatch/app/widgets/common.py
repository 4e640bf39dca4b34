"""What several panels share: the app's breakpoints, a line cut to a width, a count."""

from __future__ import annotations

from textual.widget import Widget

# The app's breakpoints (its -wide and -tall screen classes): the panels that say more on a
# bigger terminal read the same numbers.
WIDE_COLUMNS = 120
TALL_ROWS = 40


def is_wide(widget: Widget) -> bool:
    return widget.app.size.width >= WIDE_COLUMNS


def is_tall(widget: Widget) -> bool:
    return widget.app.size.height >= TALL_ROWS


def fit_line(line: str, width: int, keep: str = "") -> str:
    """line in width cells, cut with "…" before its tail keep (which stays whole)."""
    if len(line) <= width or width <= 0:
        return line
    head = line[: len(line) - len(keep)] if keep else line
    room = max(1, width - len(keep) - 1)
    return head[:room].rstrip(" ,") + "…" + keep


def wrapped(text: str, width: int) -> list[str]:
    """text in lines of at most width cells, broken at spaces (a word longer than a line
    is broken inside); one line if width is unknown (0)."""
    import textwrap

    if width <= 0:
        return [text]
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
