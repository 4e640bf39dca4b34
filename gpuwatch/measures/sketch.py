"""A median in bounded memory: exact for a short attempt, within 0.5 % for any length.

``MedianSketch`` keeps the values while there are at most ``EXACT_VALUES`` (a short
run's median is exact), then log-spaced bins (DDSketch, Masson et al., VLDB 2019): x
falls in bin ``ceil(log_gamma(x))`` with gamma = (1 + a) / (1 - a), and the bin stands for
``2 gamma**i / (gamma + 1)``, within a relative ``a`` of every value in it, so the median
is within ``RELATIVE_ERROR``. At most MAX_BINS bins (the lowest merged past that); adding
is O(1). ``median_interval`` is the distribution-free interval from order statistics
(Conover, Practical Nonparametric Statistics): with B ~ Binomial(n, 1/2), the r-th
smallest and largest values hold the median with probability 1 - 2 P(B <= r - 1); no
resampling, so no seed. Pure and deterministic, so a snapshot folds on as the original.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from statistics import NormalDist

RELATIVE_ERROR = 0.005
EXACT_VALUES = 512
MAX_BINS = 2048

_GAMMA = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)


def median_ranks(count: int, confidence: float) -> tuple[int, int] | None:
    """The 0-based ranks (low, high) of the order-statistics interval that holds the median
    of `count` values with at least `confidence`; None when even the smallest and largest
    value do not (fewer than log2(2 / (1 - confidence)) values: 7 at 97.5 %).

    Exact binomial sums up to EXACT_VALUES values (cached per count); past that, the normal
    approximation with a continuity correction, which is within a rank of them there."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is not between 0 and 1")
    if count <= EXACT_VALUES:
        return _exact_median_ranks(count, confidence)
    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    low = math.floor(count / 2.0 + 0.5 - z * math.sqrt(count) / 2.0)  # 1-based rank r
    low = max(1, min(low, (count + 1) // 2))
    return low - 1, count - low


@lru_cache(maxsize=4 * EXACT_VALUES)
def _exact_median_ranks(count: int, confidence: float) -> tuple[int, int] | None:
    # The largest r with 2 P(B <= r - 1) <= 1 - confidence, in whole numbers: 2 x the
    # sum of C(n, i) for i < r against (1 - confidence) x 2**n.
    if count < 1:
        return None
    alpha = Fraction(1.0 - confidence)
    whole = 2**count
    below, term, r = 0, 1, 0  # sum of C(n, i) for i < r; term is C(n, r)
    while r < (count + 1) // 2 and 2 * (below + term) <= alpha * whole:
        below += term
        term = term * (count - r) // (r + 1)
        r += 1
    if r == 0:
        return None
    return r - 1, count - r


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
        mid = self.count // 2
        if self.count % 2:
            return self.at_ranks([mid])[0]
        below, above = self.at_ranks([mid - 1, mid])
        return (below + above) / 2.0

    def median_interval(self, confidence: float) -> tuple[float, float] | None:
        """The values that hold the median with at least `confidence` (see the module): the
        order statistics at ``median_ranks``; None with too few values for it. It always
        holds ``median()``."""
        ranks = median_ranks(self.count, confidence)
        if ranks is None:
            return None
        low, high = self.at_ranks(ranks)
        return low, high

    def at_ranks(self, ranks: Sequence[int]) -> list[float]:
        """The values at these 0-based ranks of the sorted series: exact while count <=
        EXACT_VALUES, else the bins' values (within RELATIVE_ERROR). One sort, whatever
        the number of ranks."""
        if any(not 0 <= rank < self.count for rank in ranks):
            raise IndexError(f"ranks {list(ranks)} past a sketch of {self.count} values")
        if self.exact:
            ordered = sorted(self.exact)
            return [ordered[rank] for rank in ranks]
        wanted = sorted(set(ranks))
        found: dict[int, float] = {}
        at, seen = 0, self.zeros
        while at < len(wanted) and wanted[at] < seen:
            found[wanted[at]] = 0.0
            at += 1
        for index in sorted(self.bins):
            if at == len(wanted):
                break
            seen += self.bins[index]
            while at < len(wanted) and wanted[at] < seen:
                found[wanted[at]] = _bin_value(index)
                at += 1
        return [found[rank] for rank in ranks]
