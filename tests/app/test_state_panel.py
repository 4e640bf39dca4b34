"""StatePanel repaints only the cells that changed: one figure, not the panel."""

from __future__ import annotations

import random
from typing import Any

import pytest
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.visual import Visual, visualize

from gpuwatch.app.widgets.state_panel import (
    LineKey,
    LineStrips,
    StatePanel,
    changed_span,
    line_keys,
)


def cells(key: LineKey) -> list[tuple[str, tuple[str, ...]]]:
    """Ground truth: each character with the styles over it, in the order they apply."""
    plain, spans = key
    styles: list[tuple[str, ...]] = [()] * len(plain)
    for start, end, style in spans:
        for i in range(start, end):
            styles[i] = (*styles[i], style)
    return list(zip(plain, styles, strict=True))


def truth(before: LineKey, after: LineKey) -> tuple[int, int]:
    """The cells that paint differently: [first, end), to the longer end if lengths differ."""
    old, new = cells(before), cells(after)
    first = 0
    while first < min(len(old), len(new)) and old[first] == new[first]:
        first += 1
    if len(old) != len(new):
        return first, max(len(old), len(new))
    end = len(new)
    while end > first and old[end - 1] == new[end - 1]:
        end -= 1
    return first, end


def key(text: Text) -> LineKey:
    spans = tuple((s.start, s.end, str(s.style)) for s in text.spans)
    [only] = line_keys(text.plain, spans)
    return only


def figures(step: int, loss: str) -> Text:
    text = Text()
    text.append("step ", style="dim")
    text.append(f"{step:,}", style="bold")
    text.append("  loss ", style="dim")
    text.append(loss, style="bold")
    return text


def test_changed_span_is_the_changed_figure():
    assert changed_span(key(figures(1234, "0.51")), key(figures(1235, "0.51"))) == (9, 10)
    # A figure that grows moves what follows it: repaint to the end of the line.
    before, after = key(figures(999, "0.51")), key(figures(1000, "0.51"))
    assert changed_span(before, after) == truth(before, after) == (5, len(after[0]))
    # The same characters in another style are a change too.
    plain, spans = key(figures(1234, "0.51"))
    restyled = (plain, tuple((a, b, "red" if s == "bold" else s) for a, b, s in spans))
    assert changed_span((plain, spans), restyled) == (5, len(plain))


def test_changed_span_covers_every_cell_that_paints_differently():
    rnd = random.Random(7)

    def random_line() -> LineKey:
        plain = "".join(rnd.choice("ab ") for _ in range(rnd.randint(0, 14)))
        spans = []
        for _ in range(rnd.randint(0, 4)):
            if plain:
                start = rnd.randrange(len(plain))
                spans.append((start, rnd.randint(start + 1, len(plain)), rnd.choice("xyz")))
        [line] = line_keys(plain, tuple(spans))
        return line

    checked = 0
    for _ in range(5000):
        before = random_line()
        after = random_line() if rnd.random() < 0.5 else (before[0][:-1] + "b", before[1][:1])
        if cells(before) == cells(after):
            continue
        first, end = changed_span(before, after)
        want_first, want_end = truth(before, after)
        assert first <= want_first and end >= want_end, (before, after)
        checked += 1
    assert checked > 2000


def test_line_keys_clip_spans_to_their_line():
    text = Text("ab\ncd")
    text.stylize("bold", 1, 4)
    spans = tuple((s.start, s.end, str(s.style)) for s in text.spans)
    assert line_keys(text.plain, spans) == [("ab", ((1, 2, "bold"),)), ("cd", ((0, 1, "bold"),))]


class PanelApp(App[None]):
    CSS = "StatePanel { padding: 0 1; }"

    def compose(self) -> ComposeResult:
        yield StatePanel(id="panel")


def spy_refreshes(panel: StatePanel, monkeypatch: Any) -> list[tuple[tuple[Region, ...], bool]]:
    calls: list[tuple[tuple[Region, ...], bool]] = []
    original = panel.refresh

    def refresh(*regions: Region, layout: bool = False, **kwargs: Any) -> Any:
        calls.append((regions, layout))
        return original(*regions, layout=layout, **kwargs)

    monkeypatch.setattr(panel, "refresh", refresh)
    return calls


async def test_one_changed_figure_repaints_its_cells_only(monkeypatch):
    app = PanelApp()
    async with app.run_test(size=(40, 5)) as pilot:
        panel = app.query_one(StatePanel)
        first = figures(1234, "0.5100")
        first.append("\nrate 100")
        panel.set_text(first)
        await pilot.pause()
        calls = spy_refreshes(panel, monkeypatch)
        second = figures(1235, "0.5100")
        second.append("\nrate 100")
        panel.set_text(second)
        # "step 1,23" is shared: the one changed digit, on the first line, and no layout.
        assert calls == [((Region(9, 0, 1, 1),), False)]
        panel.set_text(second.copy())  # the same text again: nothing at all
        assert len(calls) == 1
        await pilot.pause()
        assert panel.plain == second.plain
        shown = [panel.render_line(y).text.rstrip() for y in range(2)]
        assert shown == ["step 1,235  loss 0.5100", "rate 100"]


async def test_a_new_line_or_a_new_text_style_lays_out_again(monkeypatch):
    app = PanelApp()
    async with app.run_test(size=(40, 5)) as pilot:
        panel = app.query_one(StatePanel)
        panel.set_text(Text("one line", style="dim"))
        await pilot.pause()
        calls = spy_refreshes(panel, monkeypatch)
        panel.set_text(Text("one line\nand another", style="dim"))
        assert calls[-1] == ((), True)
        await pilot.pause()
        assert panel.size.height == 2
        panel.set_text(Text("one line\nand another", style="bold"))  # same characters
        assert calls[-1] == ((), True)
        # Too long for the width: it wraps, so its height may change.
        panel.set_text(Text("one line\n" + "x" * 60, style="bold"))
        assert calls[-1] == ((), True)
        await pilot.pause()
        assert panel.size.height == 3


STYLES: list[str | Style] = [
    "", "dim", "bold", "red", "bold yellow", "italic underline", "reverse", "white on blue",
    "#ff8800", Style(color="green", bold=True), Style(bgcolor="#223344"), Style(strike=True),
]


def _random_text(rnd: random.Random, lines: int) -> Text:
    """Figures-like lines: words and numbers in many styles, overlapping, some lines blank."""
    text = Text()
    for y in range(lines):
        if y:
            text.append("\n")
        start = len(text)
        for _ in range(rnd.randint(0, 4)):
            word = rnd.choice(["step", "loss", "ex/s", "wait", "•", "─", "▁▅█"]) + " "
            text.append(word, style=rnd.choice(STYLES))
            text.append(f"{rnd.randint(0, 10 ** rnd.randint(0, 4)):,} ", style="bold")
        if rnd.random() < 0.1:  # longer than the panel: it wraps
            text.append("wrapped " * rnd.randint(6, 9), style=rnd.choice(STYLES))
        if len(text) > start and rnd.random() < 0.3:  # a style over others
            a = rnd.randrange(start, len(text))
            text.stylize(rnd.choice(STYLES), a, rnd.randint(a, len(text)))
    return text


class StyledPanelApp(App[None]):
    CSS = "StatePanel { padding: 0 1; color: #aabbcc; background: #102030; text-style: italic; }"

    def compose(self) -> ComposeResult:
        yield StatePanel(id="panel")


@pytest.mark.parametrize("app_class", [PanelApp, StyledPanelApp])
async def test_line_by_line_strips_equal_a_whole_render(app_class, monkeypatch):
    """Ground truth: after each change, the strips shown are those of rendering the whole
    text afresh (what Static does); only the changed lines were rendered again, most of
    them by LineStrips (without Textual's Content)."""
    fast = [0]
    original = LineStrips._line

    def counted(self: LineStrips, *args: Any) -> Any:
        strip = original(self, *args)
        fast[0] += strip is not None
        return strip

    monkeypatch.setattr(LineStrips, "_line", counted)
    rnd = random.Random(11)
    app = app_class()
    async with app.run_test(size=(44, 8)) as pilot:
        panel = app.query_one(StatePanel)
        panel.set_text(_random_text(rnd, 5))
        await pilot.pause()
        partial = 0
        for _ in range(300):
            text = panel._shown.copy()
            lines = text.split("\n", allow_blank=True)
            for y in rnd.sample(range(len(lines)), rnd.randint(1, min(3, len(lines)))):
                lines[y] = _random_text(rnd, 1)
            new = Text("\n").join(lines)
            new.style = text.style
            if rnd.random() < 0.1:
                new = _random_text(rnd, rnd.randint(1, 6))  # a new shape: laid out again
                new.style = rnd.choice(
                    ["", "bold", "dim italic", "#123456 on #654321", Style(color="red")]
                )
            panel.set_text(new)
            partial += bool(panel._stale)
            await pilot.pause(0)
            width, height = panel.size
            shown = [panel.render_line(y) for y in range(height)]
            whole = Visual.to_strips(
                panel, visualize(panel, new, markup=False), width, height, panel.visual_style
            )
            assert [list(s) for s in shown] == [list(s) for s in whole]
        assert partial > 150  # most changes were rendered line by line (not those that wrap)
        assert fast[0] > 300


async def test_a_change_below_a_wrapped_line_lands_on_its_row():
    """A line that wraps takes two rows: a change below it is laid out again, not drawn
    on the row its line number would have (ground truth: a whole render)."""
    app = PanelApp()
    async with app.run_test(size=(22, 6)) as pilot:  # 20 columns inside the padding
        panel = app.query_one(StatePanel)
        panel.set_text(Text("x" * 30 + "\nline one\nline two"))
        await pilot.pause()
        changed = Text("x" * 30 + "\nline one\nline TWO")
        panel.set_text(changed)
        await pilot.pause()
        width, height = panel.size
        shown = [panel.render_line(y).text.rstrip() for y in range(height)]
        assert shown == ["x" * 20, "x" * 10, "line one", "line TWO"]
        whole = Visual.to_strips(
            panel, visualize(panel, changed, markup=False), width, height, panel.visual_style
        )
        assert [list(s) for s in (panel.render_line(y) for y in range(height))] == [
            list(s) for s in whole
        ]
