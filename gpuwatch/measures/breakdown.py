"""A step breakdown's shares as the run's tables name them: one name per part, everywhere.

``protocol.Breakdown`` is the one home of the five parts (input, compute, sync, update,
other) and their shares; this module is the one home of the names other tools read them
by: ``compute_pct``, ``sync_pct``, ``update_pct`` and ``other_pct`` beside
``input_wait_pct`` (the input's share, taken from the step's own input wait), and
``<part>_ms`` for their times. The export's columns and TensorBoard's ``train/`` scalars
are made from these. Pure Python.
"""

from __future__ import annotations

from trainer_runtime.protocol import Breakdown

# The parts that get a share of their own: the input's is input_wait_pct, already there.
SHARE_PARTS = tuple(part for part in Breakdown.PARTS if part != "input")
SHARE_KEYS = tuple(f"{part}_pct" for part in SHARE_PARTS)
MS_KEYS = tuple(f"{part}_ms" for part in SHARE_PARTS)


def share_cells(breakdown: Breakdown | None) -> dict[str, float | None]:
    """compute_pct, sync_pct, update_pct, other_pct of a breakdown, in %; each None when
    there is none (an older trainer, a step whose parts were not timed apart)."""
    if breakdown is None:
        return dict.fromkeys(SHARE_KEYS)
    return {key: breakdown.pct(part) for key, part in zip(SHARE_KEYS, SHARE_PARTS, strict=True)}


def ms_cells(breakdown: Breakdown) -> dict[str, float]:
    """compute_ms, sync_ms, update_ms, other_ms of a breakdown (other: the step's rest)."""
    return {key: breakdown.ms(part) for key, part in zip(MS_KEYS, SHARE_PARTS, strict=True)}


def link_share_text(pct: float) -> str:
    """The all-reduce's bus bandwidth as a share of the link: '31%', '4.2%', '0.094%' (two
    figures): the dashboard's bar and the advisor's verdict say it alike."""
    return f"{pct:.0f}%" if pct >= 9.95 else f"{pct:.2g}%"


__all__ = ["MS_KEYS", "SHARE_KEYS", "SHARE_PARTS", "link_share_text", "ms_cells", "share_cells"]
