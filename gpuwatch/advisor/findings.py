"""What a verdict is made of (pure): its grades, its shapes, its levels.

A ``Finding`` is what one rule makes of the evidence (the part that holds the step back,
how bad, its measured share, the ``Remedy``s for it); an ``Advice`` is what the screen
shows (a level, a one-line verdict, up to MAX_RECOMMENDATIONS things to try, a cluster's
``WorkerVerdict``s). The grades: input wait's (``input_bound_level``) and those of the
other parts of a step (``PART_GRADES``, ``part_level``, ``holding_part``). And the rule
for a verdict that rests on a noisy figure: its interval must lie on one side of the line
(``interval_side``); a share's grade is the one its interval vouches for
(``vouched_level``, ``unsure_note``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

HIGH_INPUT_BOUND_PCT = 20.0
MODERATE_INPUT_BOUND_PCT = 5.0
LOW_GPU_UTIL_PCT = 50.0
HIGH_GPU_MEM_FRACTION = 0.90
MAX_RECOMMENDATIONS = 3

# The other parts of a step, graded like input wait, in % of the step: the all-reduce by
# TF Profiler's grades for collectives (3 % moderate, 15 % high); the optimizer update and
# the host's rest (dispatch and work between the parts) by the input's (the profiler
# grades neither). A part holds the step back from its moderate grade on.
HIGH_SYNC_PCT = 15.0
MODERATE_SYNC_PCT = 3.0
HIGH_UPDATE_PCT = HIGH_INPUT_BOUND_PCT
MODERATE_UPDATE_PCT = MODERATE_INPUT_BOUND_PCT
HIGH_HOST_PCT = HIGH_INPUT_BOUND_PCT
MODERATE_HOST_PCT = MODERATE_INPUT_BOUND_PCT
# (high, moderate) per part of protocol.Breakdown; compute is the devices' own work.
PART_GRADES: dict[str, tuple[float, float]] = {
    "input": (HIGH_INPUT_BOUND_PCT, MODERATE_INPUT_BOUND_PCT),
    "sync": (HIGH_SYNC_PCT, MODERATE_SYNC_PCT),
    "update": (HIGH_UPDATE_PCT, MODERATE_UPDATE_PCT),
    "other": (HIGH_HOST_PCT, MODERATE_HOST_PCT),
}
# What a verdict calls the part that holds the step back (Advice.bottleneck).
BOTTLENECKS = {"input": "input", "sync": "communication", "update": "update", "other": "host"}


@dataclass(frozen=True)
class Remedy:
    """One thing to try: what and why (``text``), the dashboard key that does it (None: no
    key; a relaunch with ``--set``), and the setting it changes."""

    text: str
    key: str | None = None
    setting: str | None = None


@dataclass(frozen=True)
class Finding:
    """What one rule makes of the evidence: the bottleneck, how bad, its measured share.

    ``share_pct``: the part's share of the step; for "memory" the fullest GPU's memory
    in %; for "too-large" what the model needs as a % of one GPU's memory.
    """

    kind: str  # "input" | "communication" | "update" | "host" | "memory" | "compute" | "too-large"
    level: str  # "high" | "moderate" | "none"
    share_pct: float | None
    label: str  # "highly communication-bound"
    detail: str  # "all-reduce 21% of the step, 142 GB/s bus = 31% of NVLink"
    remedies: tuple[Remedy, ...] = ()

    @property
    def verdict(self) -> str:
        return f"{self.label}: {self.detail}"


@dataclass(frozen=True)
class WorkerVerdict:
    """One worker's verdict in a cluster, from its own steps and its host's sample."""

    worker: int
    host: str
    finding: Finding
    straggler: bool = False

    @property
    def line(self) -> str:
        """'worker 1 (host-b): highly input-bound: 38.0% of its step time waiting for input'."""
        who = f"worker {self.worker}" + (f" ({self.host})" if self.host else "")
        return f"{who}: {self.finding.verdict}"


@dataclass(frozen=True)
class Advice:
    """What the numbers say: a level, a one-line verdict, and 0-3 things to try.

    ``bottleneck`` is the kind of the finding the verdict states ("input",
    "communication", ..., ``Finding.kind``), "none" when the input wait alone was
    measured and is below its grade, "unknown" with nothing measured ("unwatched": a
    person's own command that sends no step, the verdict says why); ``share_pct`` its
    measured share; ``remedies`` what ``recommendations`` say, with their keys; ``workers``
    each measured worker's verdict in a cluster, the straggler's first.
    """

    level: str  # "high" | "moderate" | "none" | "unknown"
    verdict: str
    input_wait_pct: float | None
    recommendations: list[str] = field(default_factory=list)
    bottleneck: str = "unknown"
    share_pct: float | None = None
    remedies: tuple[Remedy, ...] = ()
    workers: tuple[WorkerVerdict, ...] = ()

    @property
    def tone(self) -> str:
        """How the verdict reads at a glance: its level, or "unsure" where it names a part
        that holds the step back (by its figure) but the share's interval could not grade
        it ("input-bound: 6.0% ... not enough steps to tell"): not the all-clear "none"
        gives a compute-bound step or an input that keeps up."""
        if self.level == "none" and self.bottleneck not in NOT_HOLDING:
            return "unsure"
        return self.level


# Advice.bottleneck values that name no part holding the step back.
NOT_HOLDING = frozenset({"none", "unknown", "unwatched", "compute"})


def interval_side(interval: tuple[float, float] | None, threshold: float) -> str | None:
    """Which side of `threshold` a noisy figure is on, by its confidence interval: "above"
    when the whole interval is at or above it, "below" when it is all below, None when it
    straddles the threshold (or there is no interval yet). A verdict that rests on the
    figure is given only on a side; None is "not enough steps to tell"."""
    if interval is None:
        return None
    low, high = interval
    if low >= threshold:
        return "above"
    if high < threshold:
        return "below"
    return None


def input_bound_level(input_wait_pct: float | None) -> str:
    """'high' (>= 20 %), 'moderate' (>= 5 %), 'none', or 'unknown' without data."""
    if input_wait_pct is None:
        return "unknown"
    if input_wait_pct >= HIGH_INPUT_BOUND_PCT:
        return "high"
    if input_wait_pct >= MODERATE_INPUT_BOUND_PCT:
        return "moderate"
    return "none"


LEVELS = ("high", "moderate", "none", "unknown")
VERDICTS = {
    "high": "highly input-bound",
    "moderate": "moderately input-bound",
    "none": "not input-bound",
    "unknown": "no measured steps yet (warming up)",
}


def part_level(part: str, pct: float | None) -> str:
    """'high', 'moderate' or 'none' for a part's share of the step (PART_GRADES);
    'unknown' without one."""
    if pct is None:
        return "unknown"
    high, moderate = PART_GRADES[part]
    if pct >= high:
        return "high"
    if pct >= moderate:
        return "moderate"
    return "none"


def holding_part(shares: Mapping[str, float | None]) -> tuple[str, float] | None:
    """(part, share) of the part that holds the step back: of the parts other than compute
    at or above their moderate grade, the largest share (a tie: PART_GRADES' order); None
    when none is."""
    graded = [(part, float(pct)) for part in PART_GRADES
              if (pct := shares.get(part)) is not None
              and part_level(part, pct) in ("high", "moderate")]
    return max(graded, key=lambda pair: pair[1]) if graded else None


GRADE_WORDS = {"high": "highly", "moderate": "moderately"}


def vouched_level(part: str, interval: tuple[float, float] | None) -> str:
    """The grade a part's share can vouch for (``interval_side``): 'high' when its interval
    is wholly at or above the part's high grade, 'moderate' when wholly at or above its
    moderate one, else 'none' (below it, across it, or no interval: too few steps). A share
    with no per-step values behind it has the interval (share, share): its own grade."""
    high, moderate = PART_GRADES[part]
    if interval_side(interval, high) == "above":
        return "high"
    if interval_side(interval, moderate) == "above":
        return "moderate"
    return "none"


def unsure_note(part: str, share: float, interval: tuple[float, float] | None) -> str:
    """What the interval could not tell, for a verdict's detail: '' when the share's own
    grade (``part_level``) is the one its interval vouches for; else the interval and the
    grade it does not reach, ' (15-23%; highly from 20%: not enough steps to tell)'."""
    graded = part_level(part, share)
    if graded not in GRADE_WORDS or graded == vouched_level(part, interval):
        return ""
    high, moderate = PART_GRADES[part]
    line = high if graded == "high" else moderate
    told = f"{GRADE_WORDS[graded]} from {line:g}%: not enough steps to tell"
    if interval is None:
        return f" (too few steps for an interval; {told})"
    return f" ({interval[0]:.0f}-{interval[1]:.0f}%; {told})"
