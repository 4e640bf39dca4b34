"""StatePanel: a Static that repaints only the cells whose text or style changed.

Over SSH every byte drawn counts, and Textual repaints a whole widget on ``update``:
one changed figure would redraw its panel. ``set_text`` compares the new text with the
one shown, line by line, and marks dirty only the changed span of each changed line
(from the first changed cell to the last, or to the end of the longer line when what
follows the change moved); the panel is laid out again only when its height could
change (a line more or fewer, or one too long for the width, which wraps).

And CPU counts too: Textual renders a Static's whole text again for any dirty cell of
it. ``render_line`` (Textual's line API) keeps the strips it rendered and renders
again only the lines ``set_text`` changed; everything else that shapes the strips
(the size, the style, a selection) is the cache's key, so any other change renders
the whole text, as Static does.
"""

from __future__ import annotations

import itertools
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style as RichStyle
from rich.text import Span, Text
from textual.app import RenderResult
from textual.geometry import Region
from textual.strip import Strip
from textual.style import Style
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual.widgets import Static

# A line as the cells it paints: its text, and each span over it (start, end, style).
LineKey = tuple[str, tuple[tuple[int, int, str], ...]]


class StatePanel(Static):
    """A Static that repaints only the cells whose text or style changed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("", *args, **kwargs)
        self._shown = Text()
        self._key: tuple[Any, ...] | None = None
        self._lines: list[LineKey] = []
        self._strips: list[Strip] = []
        self._strips_key: tuple[Any, ...] | None = None  # what the strips were rendered for
        self._stale: set[int] = set()  # lines of the strips that set_text changed
        self._line_strips = LineStrips(self)

    def render(self) -> RenderResult:
        return self._shown

    def render_line(self, y: int) -> Strip:
        size = self.size
        style = self.visual_style
        key = (size, style, self.text_selection)
        if key != self._strips_key:
            self._strips = Visual.to_strips(
                self, visualize(self, self._shown, markup=False), size.width, size.height, style
            )
            self._strips_key = key
            self._stale.clear()
            self._line_strips.clear()
        elif self._stale:
            stale = {line for line in self._stale if line < len(self._strips)}
            self._stale.clear()
            fast = self._line_strips.render_lines(self._shown, stale, style)
            for line, strip in fast.items():
                self._strips[line] = strip
            slow = stale.difference(fast)
            if slow:
                # One render of the changed lines, each where it is (the others left empty):
                # each cell's offset, which a mouse selection reads, is as in a whole render.
                sparse = _only_lines(self._shown, slow)
                strips = Visual.to_strips(
                    self, visualize(self, sparse, markup=False), size.width, max(slow) + 1, style
                )
                for changed in slow:
                    if changed < len(strips):
                        self._strips[changed] = strips[changed]
        # Textual's own render_line would render the whole text for any dirty region, and
        # clear them: this one never calls it, so it clears them itself.
        self._dirty_regions.clear()
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(size.width, style.rich_style)

    def set_text(self, text: Text) -> None:
        spans = tuple((s.start, s.end, str(s.style)) for s in text.spans)
        key = (text.plain, str(text.style), spans)
        if key == self._key:
            return
        lines = line_keys(text.plain, spans)
        same_base = self._key is not None and self._key[1] == key[1]  # a text-wide style
        regions = self._changed_regions(lines) if same_base else None
        self._shown, self._key, self._lines = text, key, lines
        if regions is None:
            self._strips_key = None  # the whole text again
            self.refresh(layout=True)
        elif regions:
            self._stale.update(region.y for region in regions)
            self.refresh(*regions)

    def _changed_regions(self, lines: list[LineKey]) -> list[Region] | None:
        """The content regions to repaint, or None when the panel needs a new layout."""
        width = self.size.width
        declared = self.styles.width
        if not width or len(lines) != len(self._lines):
            return None
        if self.styles.content_align != ("left", "top") or self.styles.line_pad:
            return None  # lines placed by the whole text's height, or padded: whole renders
        if not all(_fits(plain, width) for plain, _ in lines):
            # A line that wraps takes more than one row: a strip is no longer a line.
            return None
        if declared is not None and declared.is_auto:
            return None
        whole_lines = self.styles.text_align not in ("left", "start")
        regions = []
        for y, (before, after) in enumerate(zip(self._lines, lines, strict=True)):
            if before == after:
                continue
            if not _fits(before[0], width):
                return None  # it wrapped (or a wide character shifted cells): lay out again
            if whole_lines:
                regions.append(Region(0, y, width, 1))
            else:
                first, end = changed_span(before, after)
                regions.append(Region(first, y, end - first, 1))
        return regions

    @property
    def plain(self) -> str:
        """The text shown now, without styles (for tests and screen readers)."""
        return self._key[0] if self._key else ""


# Rich styles kept by (style, x, y) for a panel: more than a panel's cells ever start a run.
PLACED_STYLES = 4096


class LineStrips:
    """One line of a StatePanel's text as Textual renders it, without Textual's whole text
    machinery (Content, wrapping, link styles: most of a repaint's CPU), for the plain case:
    a left-aligned, non-empty line that fits, of one-cell characters, with no link, no
    control code, no tab, no empty span and no selection. Anything else is None, and the
    caller renders it as Textual does. tests/app/test_state_panel.py checks the strips
    equal Textual's, cell for cell.

    Each cell run's style is Textual's (the widget's style under the combined span styles,
    converted as Content.from_rich_text converts them), its offset (x, y) as a whole render
    gives it; the combined styles are kept while the widget's style stays the same.
    """

    def __init__(self, widget: Widget) -> None:
        self.widget = widget
        self._styles: dict[Any, Style | None] = {}
        self._runs: dict[tuple[Any, ...], Style] = {}
        self._placed: dict[tuple[Style, int, int], RichStyle] = {}

    def clear(self) -> None:
        self._styles.clear()
        self._runs.clear()
        self._placed.clear()

    def render_lines(self, text: Text, lines: set[int], base: Style) -> dict[int, Strip]:
        """The strips of those lines of `text` that are the plain case, by line."""
        widget = self.widget
        if (
            widget.text_selection is not None
            or widget.styles.text_align not in ("left", "start")
            or widget.styles.content_align != ("left", "top")
        ):
            return {}
        width = widget.size.width
        plains = text.plain.split("\n")
        starts = [0]
        for plain in plains:
            starts.append(starts[-1] + len(plain) + 1)
        strips = {}
        for y in lines:
            if y >= len(plains):
                continue
            start, plain = starts[y], plains[y]
            end = start + len(plain)
            spans = [
                (max(a, start) - start, min(b, end) - start, style)
                for a, b, style in text.spans
                if a < end and b > start
            ]
            strip = self._line(plain, text.style, spans, y, base, width)
            if strip is not None:
                strips[y] = strip
        return strips

    def _line(
        self,
        plain: str,
        text_style: str | RichStyle,
        line_spans: list[tuple[int, int, str | RichStyle]],
        y: int,
        base: Style,
        width: int,
    ) -> Strip | None:
        if (
            not plain
            or len(plain) > width
            or not plain.isprintable()
            or (not plain.isascii() and cell_len(plain) != len(plain))
        ):
            return None
        spans: list[tuple[int, int, Style]] = []
        if text_style:
            converted = self._text_style(text_style)
            if converted is None:
                return None
            spans.append((0, len(plain), converted))
        for start, end, rich in line_spans:
            if end <= start:
                return None  # an empty span: Content splits the line otherwise
            converted = self._style(rich)
            if converted is None:
                return None
            spans.append((start, end, converted))
        runs: list[tuple[int, int, tuple[int, ...]]]
        if not spans:
            runs = [(0, len(plain), ())]
        else:
            cuts = sorted({0, len(plain), *(a for a, _, _ in spans), *(b for _, b, _ in spans)})
            runs = [
                (a, b, tuple(i for i, (start, end, _) in enumerate(spans) if start <= a < b <= end))
                for a, b in itertools.pairwise(cuts)
            ]
        segments = []
        for start, end, over in runs:
            key = (base, *(spans[i][2] for i in over))
            combined = self._runs.get(key)
            if combined is None:
                # As Content.render then _FormattedLine.to_strip: the base style first, then
                # each span in order; and the widget's style over that once more.
                combined = base + Style.combine([base, *key[1:]])
                self._runs[key] = combined
            at = (combined, start, y)
            placed = self._placed.get(at)
            if placed is None:
                if len(self._placed) >= PLACED_STYLES:
                    self._placed.clear()
                # The same style at the same cell, pass after pass: a figure's label and
                # mostly its value too (only their characters change).
                placed = self._placed[at] = combined.rich_style_with_offset(start, y)
            segments.append(Segment(plain[start:end], placed))
        return Strip(segments, len(plain))

    def _text_style(self, style: str | RichStyle) -> Style | None:
        """A text-wide style as Content reads it: a string by Textual's own style parser."""
        if not isinstance(style, str):
            return self._style(style)
        if style.startswith("."):
            return None  # a component class: the widget's CSS
        key = ("text-wide", style)
        if key not in self._styles:
            try:
                self._styles[key] = Style.parse(style)
            except Exception:  # as Textual: a style it cannot read is no style
                self._styles[key] = Style()
        return self._styles[key]

    def _style(self, style: str | RichStyle) -> Style | None:
        """A span's style as Content.from_rich_text converts it; None: not the plain case."""
        if style in self._styles:
            return self._styles[style]
        app = self.widget.app
        rich = app.console.get_style(style) if isinstance(style, str) else style
        converted = None if rich.link or rich._meta else Style.from_rich_style(rich, app.ansi_theme)
        self._styles[style] = converted
        return converted


def _only_lines(text: Text, keep: set[int]) -> Text:
    """The text up to its last kept line, every other line empty, styled as the text."""
    plain: list[str] = []
    spans: list[Span] = []
    start = position = 0  # where a line starts in the text, and in the new one
    for y, line in enumerate(text.plain.split("\n")[: max(keep) + 1]):
        end = start + len(line)
        if y in keep:
            plain.append(line)
            spans.extend(
                Span(max(a, start) - start + position, min(b, end) - start + position, style)
                for a, b, style in text.spans
                if a < end and b > start
            )
            position += len(line)
        else:
            plain.append("")
        position += 1
        start = end + 1
    return Text(
        "\n".join(plain),
        style=text.style,
        justify=text.justify,
        overflow=text.overflow,
        no_wrap=text.no_wrap,
        end=text.end,
        tab_size=text.tab_size,
        spans=spans,
    )


def line_keys(plain: str, spans: tuple[tuple[int, int, str], ...]) -> list[LineKey]:
    """Each line of a text with the spans over it (clipped, relative to the line, sorted)."""
    keys: list[LineKey] = []
    start = 0
    for line in plain.split("\n"):
        end = start + len(line)
        over = sorted(
            (max(a, start) - start, min(b, end) - start, style)
            for a, b, style in spans
            if a < end and b > start
        )
        keys.append((line, tuple(over)))
        start = end + 1
    return keys


def changed_span(before: LineKey, after: LineKey) -> tuple[int, int]:
    """[first, end) of the characters of a line that paint differently (one cell each).

    Spans are sorted by start: up to the start of the first span that differs, every
    character has the same spans over it in both, so only the text can differ there;
    likewise from the end of the last span that differs (in order of their ends).
    """
    (old, old_spans), (new, new_spans) = before, after
    first = _common_prefix(old, new)
    differ = _first_difference(old_spans, new_spans)
    if differ is not None:
        first = min(
            first, *(spans[differ][0] for spans in (old_spans, new_spans) if differ < len(spans))
        )
    if len(old) != len(new):
        return first, max(len(old), len(new))  # what follows the change moved
    end = len(new) - _common_prefix(old[::-1], new[::-1])
    old_by_end = sorted(old_spans, key=lambda span: -span[1])
    new_by_end = sorted(new_spans, key=lambda span: -span[1])
    differ = _first_difference(old_by_end, new_by_end)
    if differ is not None:
        end = max(
            end, *(spans[differ][1] for spans in (old_by_end, new_by_end) if differ < len(spans))
        )
    return first, max(first, end)


def _common_prefix(a: str, b: str) -> int:
    """How many leading characters two strings share."""
    size = min(len(a), len(b))
    if a[:size] == b[:size]:
        return size
    low, high = 0, size  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def _first_difference(a: list[Any] | tuple[Any, ...], b: list[Any] | tuple[Any, ...]) -> int | None:
    """The index of the first item that differs (or that one list lacks); None if equal."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _fits(plain: str, width: int) -> bool:
    """One cell per character (so characters are cells), and no wider than the panel."""
    return len(plain) <= width and (plain.isascii() or cell_len(plain) == len(plain))


def show_title(widget: Widget, title: str) -> None:
    """Set a border title only when it changed (setting one repaints the whole widget)."""
    if widget.border_title != title:
        widget.border_title = title
