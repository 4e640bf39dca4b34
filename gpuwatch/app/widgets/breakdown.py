"""Where a step's time went, as the dashboard draws it: one stacked bar of the five parts,
a legend with each part's share, the all-reduce's bus bandwidth against the link, and the
compact shares the tables show (workers, attempts).

The parts and their shares are ``protocol.Breakdown``'s; this module only draws them.
Each part has a glyph of its own besides its colour, so the bar reads without colour too
(a terminal without it, a screenshot in print): input ░, compute █, all-reduce ▓,
update ▒, other ·. In a cluster the all-reduce's time holds waiting for the slowest
worker (a synchronous step reduces once every worker's gradients are in): its label
says so wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from gpuwatch.app import fmt
from gpuwatch.measures.breakdown import link_share_text
from gpuwatch.runstate import Figures
from trainer_runtime.protocol import Breakdown


@dataclass(frozen=True, slots=True)
class PartLook:
    """How one part is drawn: its words (full, short), its glyph and its colour."""

    label: str
    short: str
    glyph: str
    style: str


# By Breakdown.PARTS, in the bar's order.
LOOKS = {
    "input": PartLook("input", "in", "░", "yellow"),
    "compute": PartLook("compute", "comp", "█", "green"),
    "sync": PartLook("all-reduce", "sync", "▓", "magenta"),
    "update": PartLook("update", "upd", "▒", "cyan"),
    "other": PartLook("other", "other", "·", "blue"),
}
# A cluster's all-reduce: the same time holds the wait for the slowest worker.
CLUSTER_SYNC = PartLook("all-reduce incl. wait", "sync+wait", "▓", "magenta")
# The fewest cells a bar is drawn in beside the bus bandwidth; narrower, it has a line.
MIN_BAR_CELLS = 12
# The bar's width when the panel's is not known yet (before its first layout).
DEFAULT_WIDTH = 60


def look(part: str, cluster: bool = False) -> PartLook:
    return CLUSTER_SYNC if cluster and part == "sync" else LOOKS[part]


def part_label(part: str, cluster: bool = False) -> str:
    """A part's name on screen: "compute", "all-reduce" ("all-reduce incl. wait" in a
    cluster)."""
    return look(part, cluster).label


def share_text(pct: float) -> str:
    """A share as the legend writes it: '50%', '5.0%' (a tenth under 10 %)."""
    return f"{pct:.0f}%" if pct >= 9.95 else f"{pct:.1f}%"


def bar_cells(breakdown: Breakdown, width: int) -> list[tuple[str, int]]:
    """(part, cells) for a bar of `width` cells, in PARTS order: each part's share of the
    width, rounded so the cells add up to it (largest remainders get the spare cells)."""
    shares = breakdown.shares()
    exact = {part: pct * width / 100.0 for part, pct in shares.items()}
    cells = {part: int(value) for part, value in exact.items()}
    spare = width - sum(cells.values())
    for part in sorted(exact, key=lambda p: exact[p] - cells[p], reverse=True)[:max(spare, 0)]:
        cells[part] += 1
    return [(part, cells[part]) for part in Breakdown.PARTS]


def bar(breakdown: Breakdown, width: int) -> Text:
    """The stacked bar: each part's glyph in its colour, as many cells as its share."""
    text = Text()
    for part, cells in bar_cells(breakdown, width):
        if cells:
            text.append(LOOKS[part].glyph * cells, style=LOOKS[part].style)
    return text


def legend(breakdown: Breakdown, width: int, cluster: bool = False) -> Text:
    """'░input 10%  █compute 50%  ▓all-reduce 20%  ▒update 5.0%  ·other 15%', in `width`
    cells: as it needs, one space between the parts, then whole percents, then short names,
    then cut."""
    shares = breakdown.shares()
    # (short names, the gap, whole percents), fullest first
    forms = ((False, "  ", False), (False, " ", False), (False, " ", True), (True, " ", True))
    text = Text()
    for short, gap, whole in forms:
        text = Text()
        for part in Breakdown.PARTS:
            part_look = look(part, cluster)
            if text:
                text.append(gap)
            text.append(part_look.glyph, style=part_look.style)
            text.append(f"{part_look.short if short else part_look.label} ")
            share = fmt.pct(shares[part]) if whole else share_text(shares[part])
            text.append(share, style="bold")
        if text.cell_len <= width:
            return text
    text.truncate(width, overflow="ellipsis")
    return text


def bus_text(figures: Figures) -> str:
    """'all-reduce 142.0 GB/s bus = 31% of NVLink': the achieved bus bandwidth (nccl-tests'
    busbw) and its share of the link's peak where the machine tells it; the achieved figure
    alone where it does not (no GPU, across hosts); '' with no all-reduce timed."""
    bus = figures.bus_bytes_per_s
    if bus is None:
        return ""
    text = f"all-reduce {fmt.format_rate(bus)} bus"
    if figures.link is not None and figures.bus_pct_of_link is not None:
        text += f" = {link_share_text(figures.bus_pct_of_link)} of {figures.link.kind}"
    return text


def breakdown_lines(figures: Figures, width: int, cluster: bool = False) -> Text:
    """The bar with the bus bandwidth beside it, then the legend, in `width` cells (0: not
    known yet); an empty text when the steps' parts were not timed apart."""
    breakdown = figures.breakdown
    if breakdown is None:
        return Text()
    width = width or DEFAULT_WIDTH
    bus = bus_text(figures)
    room = width - len(bus) - 2 if bus else width
    text = Text()
    if room >= MIN_BAR_CELLS:
        text.append_text(bar(breakdown, room))
        if bus:
            text.append("  " + bus, style="")
        text.append("\n")
        text.append_text(legend(breakdown, width, cluster))
    else:  # too narrow for both: the bar on a line of its own, the bus bandwidth last
        text.append_text(bar(breakdown, width))
        text.append("\n")
        text.append_text(legend(breakdown, width, cluster))
        if bus:
            text.append("\n" + fmt_cut(bus, width))
    return text


def fmt_cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def pct_cell(breakdown: Breakdown | None, part: str) -> str:
    """One part's share in a table's cell: '38%', or n/a when not timed apart."""
    return fmt.NA if breakdown is None else fmt.pct(breakdown.pct(part))


def compute_sync_cell(breakdown: Breakdown | None) -> str:
    """'50/20%': the shares of compute and all-reduce, for the attempts table; '' when not
    timed apart."""
    if breakdown is None:
        return ""
    return f"{breakdown.pct('compute'):.0f}/{breakdown.pct('sync'):.0f}%"
