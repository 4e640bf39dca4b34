"""Bytes and rates in decimal units (pure): the one home of '3.4 MB/s', '142 GB/s', '96.0 GB'.
"""

from __future__ import annotations

from collections.abc import Callable


def _decimal(value: float, units: tuple[str, ...], below: float,
             show: Callable[[float, str], str]) -> str:
    """`value` in the first of `units` (each 1000 times the last) where it is under `below`,
    as `show` writes it; the last unit takes any size. The one home of decimal units."""
    for unit in units[:-1]:
        if abs(value) < below:
            return show(value, unit)
        value /= 1000.0
    return show(value, units[-1])


_RATE_UNITS = ("B/s", "kB/s", "MB/s", "GB/s")


def format_rate(bytes_per_s: float | None) -> str:
    """Bytes per second in decimal multiples: '512 B/s', '3.4 MB/s', '12.0 GB/s'."""
    if bytes_per_s is None:
        return "n/a"
    return _decimal(float(bytes_per_s), _RATE_UNITS, 1000.0,
                    lambda v, unit: f"{v:.0f} {unit}" if unit == "B/s" else f"{v:.1f} {unit}")


def format_bandwidth(bytes_per_s: float) -> str:
    """A bandwidth to three figures: '142 GB/s', '3.21 GB/s', '45.6 MB/s'."""
    return _decimal(float(bytes_per_s), _RATE_UNITS, 999.5,
                    lambda v, unit: f"{v:.3g} {unit}" if abs(v) < 999.5 else f"{v:.0f} {unit}")


def format_bytes(size: float) -> str:
    """Bytes in decimal multiples, one decimal: '96.0 GB', '512.0 MB'."""
    return _decimal(float(size), ("B", "kB", "MB", "GB"), 1000.0,
                    lambda v, unit: f"{v:.1f} {unit}")
