"""Turning cumulative hardware counters into rates, wrap-around included.

NVML's PCIe byte counters (fields 197/198) and NVLink data counters (138/139,
KiB) only ever grow; we read them each sample and divide the difference by the
time between the reads. The counter width is the one NVML states in the field
value's ``valueType`` (32-bit ``uiVal`` or 64-bit ``ullVal``), not a guess:

- 64-bit: at 64 GB/s a 64-bit byte counter wraps after ~9 years, so a value
  that went *down* is a reset (driver reload, GPU reset), not a wrap. We report
  None for that interval and start again from the new value.
- 32-bit (or narrower): a decrease is a wrap, added back modulo 2**width. But one
  wrap is all we can see: if the link could have moved 2**width units within
  the interval, the difference is ambiguous and we report None rather than a
  number that may be off by whole multiples of 4 GiB.
"""

from __future__ import annotations

# PCIe per-lane payload rate per direction, bytes/s, after line coding:
# gen1/2 8b/10b, gen3-5 128b/130b, gen6 PAM4 + FLIT (~242/256).
_PCIE_LANE_BYTES_PER_S = {
    1: 250e6,
    2: 500e6,
    3: 8e9 / 8 * 128 / 130,
    4: 16e9 / 8 * 128 / 130,
    5: 32e9 / 8 * 128 / 130,
    6: 64e9 / 8 * 242 / 256,
}
# When the link is unknown, assume the fastest link there is: that only makes the
# ambiguity check stricter (more None), never lets a wrong number through.
PCIE_FASTEST_BYTES_PER_S = _PCIE_LANE_BYTES_PER_S[6] * 16
# Per NVLink link, per direction: NVLink 5 is 100 GB/s per link per direction;
# a generous bound, only used for the same ambiguity check.
NVLINK_LINK_MAX_BYTES_PER_S = 100e9


def pcie_link_bytes_per_s(gen: int | None, width: int | None) -> float | None:
    """What a PCIe link of this generation and width moves per direction; None: unknown."""
    if gen is None or width is None or gen not in _PCIE_LANE_BYTES_PER_S or width <= 0:
        return None
    return _PCIE_LANE_BYTES_PER_S[gen] * width


def pcie_link_max_bytes_per_s(gen: int | None, width: int | None) -> float:
    """The most a PCIe link of this generation and width can move per direction (the
    fastest link there is when unknown)."""
    known = pcie_link_bytes_per_s(gen, width)
    return PCIE_FASTEST_BYTES_PER_S if known is None else known


def counter_delta(previous: int, current: int, width_bits: int) -> int | None:
    """Units counted between two reads; None when the counter was reset."""
    if current >= previous:
        return current - previous
    if width_bits >= 64:
        return None
    return current + (1 << width_bits) - previous


def counter_rate(
    previous: int,
    current: int,
    interval_s: float,
    width_bits: int,
    unit_bytes: int = 1,
    max_bytes_per_s: float | None = None,
) -> float | None:
    """Bytes per second between two reads of a cumulative counter, or None.

    ``unit_bytes`` is what one count is (1 for PCIe bytes, 1024 for NVLink KiB).
    ``max_bytes_per_s`` is the link's ceiling, used to refuse an interval long
    enough that a narrow counter might have wrapped more than once.
    """
    if not interval_s > 0:
        return None
    if width_bits < 64:
        ceiling = PCIE_FASTEST_BYTES_PER_S if max_bytes_per_s is None else max_bytes_per_s
        if ceiling * interval_s >= (1 << width_bits) * unit_bytes:
            return None
    delta = counter_delta(previous, current, width_bits)
    if delta is None:
        return None
    return delta * unit_bytes / interval_s


def max_unambiguous_interval_s(width_bits: int, unit_bytes: int, max_bytes_per_s: float) -> float:
    """The longest interval over which a counter of this width cannot wrap twice."""
    if width_bits >= 64:
        return float("inf")
    return (1 << width_bits) * unit_bytes / max_bytes_per_s
