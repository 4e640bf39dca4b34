"""A median in bounded memory: exact for a short attempt, within 0.5 % for any length.

An attempt's median examples/s used to keep every step's rate (a list that grew
with the run). ``MedianSketch`` keeps the values themselves while there are at
most ``EXACT_VALUES`` of them (so a short run's median is exact), then moves to
log-spaced bins (the DDSketch scheme, Masson et al., VLDB 2019): a value x falls
in bin ``ceil(log_gamma(x))`` with gamma = (1 + a) / (1 - a), and the bin stands
for ``2 gamma**i / (gamma + 1)``, which is within a relative ``a`` of every value
in it. The median taken from the bins is therefore within ``RELATIVE_ERROR`` of
the exact median (the mean of the two middle values when the count is even).

Memory: at most EXACT_VALUES floats, then at most MAX_BINS bins (the lowest are
merged past that, which only touches quantiles far below the median unless the
rates span more than ~e**20). Adding a value is O(1); the median sorts the bins
(a few hundred at most in practice) when the screen asks for it.

Pure and deterministic (no randomness), so a snapshot of it folds on exactly as
the original would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RELATIVE_ERROR = 0.005
EXACT_VALUES = 512
MAX_BINS = 2048

_GAMMA = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)


def _bin(value: float) -> int:
    return math.ceil(math.log(value) / _LOG_GAMMA)


def _bin_value(index: int) -> float:
    return 2.0 * _GAMMA**index / (_GAMMA + 1.0)


@dataclass
class MedianSketch:
    """The values of a series, kept for its median in bounded memory (see the module)."""

    count: int = 0
    exact: list[float] = field(default_factory=list)  # every value while count <= EXACT_VALUES
    zeros: int = 0  # values <= 0 once binned (rates are never negative)
    bins: dict[int, int] = field(default_factory=dict)  # bin index -> values in it

    def add(self, value: float) -> None:
        self.count += 1
        if self.count <= EXACT_VALUES:
            self.exact.append(value)
            return
        if self.exact:  # the first value past the exact range: bin the ones kept so far
            kept, self.exact = self.exact, []
            for old in kept:
                self._bin(old)
        self._bin(value)

    def _bin(self, value: float) -> None:
        if value <= 0.0:
            self.zeros += 1
            return
        index = _bin(value)
        self.bins[index] = self.bins.get(index, 0) + 1
        if len(self.bins) > MAX_BINS:
            lowest, second = sorted(self.bins)[:2]
            self.bins[second] += self.bins.pop(lowest)

    def median(self) -> float | None:
        """The median (exact while count <= EXACT_VALUES, else within RELATIVE_ERROR)."""
        if self.count == 0:
            return None
        if self.exact:
            ordered = sorted(self.exact)
            mid = len(ordered) // 2
            if len(ordered) % 2:
                return ordered[mid]
            return (ordered[mid - 1] + ordered[mid]) / 2.0
        mid = self.count // 2
        if self.count % 2:
            return self._at_rank(mid)
        return (self._at_rank(mid - 1) + self._at_rank(mid)) / 2.0

    def _at_rank(self, rank: int) -> float:
        """The value standing for the rank-th smallest (0-based) of the binned values."""
        seen = self.zeros
        if rank < seen:
            return 0.0
        for index in sorted(self.bins):
            seen += self.bins[index]
            if rank < seen:
                return _bin_value(index)
        raise AssertionError("rank past the count")  # pragma: no cover - count is kept in step
