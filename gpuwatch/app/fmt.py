"""Number formatting for the dashboard: every figure with its unit, n/a for a missing reading.

Plain Python (no Textual) so the units are unit-tested. Rates are decimal
(kB/s, MB/s, GB/s, like link speeds); memory is binary (GiB, like nvidia-smi).
"""

from __future__ import annotations

import math

from gpuwatch.advisor import format_rate

NA = "n/a"

__all__ = ["NA", "bytes_binary", "count", "duration", "format_rate", "pct"]


def pct(value: float | None, digits: int = 0) -> str:
    if value is None:
        return NA
    return f"{value:.{digits}f}%"


def count(value: float | None, unit: str = "") -> str:
    """1,973 ex/s; thousands separated."""
    if value is None:
        return NA
    text = f"{value:,.0f}"
    return f"{text} {unit}" if unit else text


def bytes_binary(value: float | None) -> str:
    if value is None:
        return NA
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024.0 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024.0
    return f"{size:.1f} TiB"  # pragma: no cover


def mem_pair(used: float | None, total: float | None) -> str:
    """'21.3/40.0 GiB'."""
    if used is None or total is None:
        return f"{bytes_binary(used)} / {bytes_binary(total)}"
    gib = 1024.0**3
    return f"{used / gib:.1f}/{total / gib:.1f} GiB"


def duration(seconds: float | None) -> str:
    """'1:02:03' or '3:07' (m:ss under an hour)."""
    if seconds is None:
        return NA
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def ms(value: float | None) -> str:
    if value is None:
        return NA
    if value >= 100:
        return f"{value:.0f} ms"
    return f"{value:.1f} ms"


BARS = "▁▂▃▄▅▆▇█"
NO_READING = "·"


def spark(levels: list[float | None], top: float | None, width: int) -> str:
    """A sparkline on a fixed scale (0 to `top`), newest last, right-aligned in `width`.

    Unlike Textual's Sparkline (scaled from the data's min to its max), 90 % and 92 %
    utilization look alike here, as they should. None (no reading) is a dot.
    """
    cells = levels[-width:] if width > 0 else []
    chars = []
    for level in cells:
        if level is None:
            chars.append(NO_READING)
        elif not top or top <= 0:
            chars.append(BARS[0])
        else:
            share = min(max(level / top, 0.0), 1.0)
            chars.append(BARS[min(len(BARS) - 1, int(share * len(BARS)))])
    return "".join(chars).rjust(max(width, 0))


def spark_rows(values: list[float], width: int, rows: int = 1) -> list[str]:
    """A sparkline scaled from the values' least to their greatest, `rows` lines tall (top
    line first), `width` columns: newest last, right-aligned while there are fewer values
    than columns, else each column the greatest of an even share of them.

    Unlike spark(), the scale is the data's range: it shows how examples/s or input wait
    moved, not how far from zero they are. A flat series is a row of the lowest bar.
    """
    rows = max(rows, 1)
    if width <= 0:
        return [""] * rows
    values = [value for value in values if math.isfinite(value)]  # no bar for inf or NaN
    count = len(values)
    if count <= width:
        columns = list(values)
    else:
        columns = [max(values[i * count // width : (i + 1) * count // width]) for i in range(width)]
    low, high = (min(columns), max(columns)) if columns else (0.0, 0.0)
    steps = rows * len(BARS)
    levels = [
        int((value - low) / (high - low) * (steps - 1)) if high > low else 0 for value in columns
    ]
    lines = []
    for row in range(rows):
        floor = (rows - 1 - row) * len(BARS)  # the levels below this row's first bar
        chars = [
            " " if level < floor else "█" if level >= floor + len(BARS) else BARS[level - floor]
            for level in levels
        ]
        lines.append("".join(chars).rjust(width))
    return lines


def rate_short(bytes_per_s: float | None) -> str:
    """A rate in a few characters, decimal, unit implied (B/s): '950M', '1.2G', '18.7G'."""
    if bytes_per_s is None:
        return NA
    value = float(bytes_per_s)
    for unit in ("", "k", "M", "G"):
        if abs(value) < 1000.0 or unit == "G":
            if unit == "":
                return f"{value:.0f}"
            return f"{value:.1f}{unit}" if abs(value) < 100 else f"{value:.0f}{unit}"
        value /= 1000.0
    return f"{value:.0f}G"  # pragma: no cover - the loop returns at G


def rate_pair(tx: float | None, rx: float | None) -> str:
    """'1.2G/3.4G' (tx/rx); 'n/a' when neither is read, '-' for a missing half."""
    if tx is None and rx is None:
        return NA
    halves = ["-" if value is None else rate_short(value) for value in (tx, rx)]
    return "/".join(halves)
