"""The scaling probe's rules and arithmetic: its plan, each count's settings, and its table.

Pure. `gpuwatch scale CONFIG` runs one short, fresh attempt at each device count (the
supervisor's ``scale_attempts.py``); this module says what each runs with
(``plan_configs``) and what they measured (``scaling_rows``), the rows the dashboard,
headless, export and ``advisor.poor_scaling`` read. Counts are replicas on one host or,
for a ``cluster:`` config, workers. Weak scaling keeps the per-replica batch, strong the
global batch (which must split over every count). Figures are after warm-up.

    speed-up(N) = X(N) / X(b)    efficiency(N) = X(N) x b / (N x X(b))

(NVIDIA DeepLearningExamples; X examples/s, b the plan's smallest count.) Each efficiency
has a confidence interval (``efficiency_interval``); while one straddles the advisor's
threshold, another round runs every count with twice the steps (``another_round``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwatch.config import (
    ConfigError,
    apply_overrides,
    check_devices,
    check_replicas,
    expected_replicas,
)
from gpuwatch.measures.sketch import median_ranks
from gpuwatch.runstate import WARMUP_STEPS, AttemptSummary, RunState, get_setting
from trainer_runtime.protocol import Breakdown, Scale
from trainer_runtime.schema import (
    MAX_REPLICAS,
    MAX_WORKERS,
    RunConfig,
    divisibility_error,
    per_replica_batch,
)

MODES = ("weak", "strong")
# Each count's attempt: enough steps to take a median after the warm-up's.
DEFAULT_STEPS = 40
MIN_MEASURED_STEPS = 5
MIN_STEPS = WARMUP_STEPS + MIN_MEASURED_STEPS
MAX_STEPS = 1_000_000
# While the verdict cannot tell, every count runs again with twice the steps: at most this
# many rounds in all (the steps, 2x, 4x). Each round's attempts run under the same load on
# the box, so a count's efficiency is always its own round's.
MAX_ROUNDS = 3
# Why an attempt of the probe is there: the attempt event's reason.
REASON = "scale"
# The efficiency's interval holds the true one with at least this probability: each
# count's median examples/s gets an interval at MEDIAN_CONFIDENCE, and both hold at once
# with at least CONFIDENCE (Bonferroni: the two misses' chances add up to at most 5 %).
CONFIDENCE = 0.95
MEDIAN_CONFIDENCE = 1.0 - (1.0 - CONFIDENCE) / 2.0
# The fewest measured steps a count needs for its median's interval (7 at 97.5 %).
MIN_INTERVAL_STEPS = next(n for n in range(1, 64) if median_ranks(n, MEDIAN_CONFIDENCE))


class ScaleError(ConfigError):
    """A probe that cannot run as asked (a count, the steps, a batch that does not split)."""


# ---- the plan ------------------------------------------------------------------------


def unit_of(config: RunConfig) -> str:
    """What the counts count: "workers" for a cluster, else "replicas"."""
    return "workers" if config.cluster is not None else "replicas"


def available(config: RunConfig, gpus: int) -> int | None:
    """The most the counts can go to: the cluster's workers, the visible GPUs, or None
    (logical CPU replicas: up to MAX_REPLICAS, however many cores there are)."""
    if config.cluster is not None:
        return config.cluster.count
    return gpus if gpus > 0 else None


def default_counts(config: RunConfig, gpus: int) -> list[int]:
    """1, 2, 4, ... up to every GPU (or worker), and that number itself; 1,2 on CPU replicas."""
    most = available(config, gpus)
    if most is None:
        return [1, 2]
    counts = [1]
    while counts[-1] * 2 <= most:
        counts.append(counts[-1] * 2)
    if counts[-1] != most:
        counts.append(most)
    return counts


def parse_counts(text: str) -> list[int]:
    """"1,2,4" as a list of counts; ScaleError naming the option for anything else."""
    counts: list[int] = []
    for part in text.split(","):
        word = part.strip()
        if not word.isdigit() or int(word) < 1 or len(word) > 6:
            raise ScaleError(f"--replicas {text}: {word!r} is not a count from 1 "
                             "(give counts like 1,2,4)")
        counts.append(int(word))
    return counts


def make_plan(
    config: RunConfig, counts: Sequence[int], mode: str, steps: int, gpus: int,
    cores: int | None = None, rounds: int = 1,
) -> Scale:
    """The probe's plan (the event the supervisor records first). ScaleError unless the
    counts go up from 1, each once, within what this host (or the cluster) has, the steps
    leave some to measure after the warm-up, and the rounds are from 1 to MAX_ROUNDS with
    the last one's steps (doubled each round) at most MAX_STEPS."""
    unit = unit_of(config)
    shown = ",".join(map(str, counts))
    if not counts or list(counts) != sorted(set(counts)) or counts[0] < 1:
        raise ScaleError(f"--replicas {shown}: give each count once, smallest first "
                         "(e.g. 1,2,4)")
    limit = MAX_WORKERS if unit == "workers" else MAX_REPLICAS
    most = available(config, gpus)
    if counts[-1] > limit:
        raise ScaleError(f"--replicas {shown}: at most {limit} {unit}")
    if most is not None and counts[-1] > most:
        have = (f"cluster.workers has {most}" if unit == "workers"
                else f"{most} GPU{'s are' if most != 1 else ' is'} visible here")
        raise ScaleError(f"--replicas {shown}: {counts[-1]} {unit} asked for, but {have}")
    if mode not in MODES:
        raise ScaleError(f"--mode must be weak or strong (got {mode!r})")
    if not MIN_STEPS <= steps <= MAX_STEPS:
        raise ScaleError(
            f"--steps {steps}: each count needs at least {MIN_STEPS} steps ({WARMUP_STEPS} of "
            f"warm-up, then {MIN_MEASURED_STEPS} measured) and at most {MAX_STEPS:,}"
        )
    if not 1 <= rounds <= MAX_ROUNDS:
        raise ScaleError(f"--rounds {rounds}: from 1 (each count once) to {MAX_ROUNDS}")
    last = steps * 2 ** (rounds - 1)
    if last > MAX_STEPS:
        raise ScaleError(
            f"--steps {steps} --rounds {rounds}: round {rounds} would run {last:,} steps a "
            f"count, at most {MAX_STEPS:,} (give fewer steps, or fewer rounds)"
        )
    return Scale(counts=list(counts), unit=unit, mode=mode, steps=steps, cores=cores,
                 rounds=rounds)


def replicas_at(plan: Scale, count: int, gpus: int) -> int:
    """Replicas in sync at a count: the count itself, or a cluster's workers x each one's
    GPUs (one CPU replica per worker with no GPU)."""
    return count * max(gpus, 1) if plan.unit == "workers" else count


def plan_configs(
    config: RunConfig, plan: Scale, gpus: int
) -> list[tuple[int, RunConfig]]:
    """Each count's settings, in order: the same job at that many devices, for plan.steps
    steps. ConfigError (one line, naming the count and the key) if one cannot run here."""
    base_replicas = expected_replicas(config, gpus)
    batch = config.train.global_batch_size
    accum = config.train.accumulation_steps
    if plan.mode == "weak":
        problem = divisibility_error(config, base_replicas)
        if problem is not None:
            raise ScaleError(f"weak scaling keeps the per-replica batch, but at the config's "
                             f"{base_replicas} replicas {problem}")
        kept = per_replica_batch(config, base_replicas)
    configs: list[tuple[int, RunConfig]] = []
    for count in plan.counts:
        replicas = replicas_at(plan, count, gpus)
        source = f"scale at {count} {plan.unit}"
        overrides: dict[str, Any] = {"train.max_steps": plan.steps, "train.epochs": None}
        if plan.unit == "workers":
            assert config.cluster is not None
            cluster = config.cluster.model_dump(mode="json")
            overrides["cluster.workers"] = cluster["workers"][:count]
            if cluster.get("ports") is not None and config.cluster.launcher != "slurm":
                overrides["cluster.ports"] = cluster["ports"][:count]
        else:
            overrides["strategy.replicas"] = count
        if plan.mode == "weak":
            overrides["train.global_batch_size"] = kept * replicas * accum
            source += f" (weak: {kept} examples per replica kept)"
        else:
            source += f" (strong: the global batch {batch} kept)"
        one = apply_overrides(config, overrides, source=source)
        check_devices(one, source, gpus)
        check_replicas(one, replicas, source)
        configs.append((count, one))
    return configs


# ---- the rounds ----------------------------------------------------------------------


def another_round(
    level: str | None, round_number: int, rounds: int, *, failed: bool, stop_asked: bool
) -> bool:
    """Whether the probe runs every count again, with twice the steps, after round
    `round_number` of at most `rounds`. Only while the verdict cannot tell (the advisor's
    level "unknown"; None, no verdict at all, is not that), and only where more steps can
    help: every count of the round measured up to its steps (`failed`: one crashed, was
    stopped, measured nothing or ended short) and no stop asked."""
    return level == "unknown" and round_number < rounds and not failed and not stop_asked


def next_round(plan: Scale, why: str) -> Scale:
    """The plan of the round after `plan`'s: the same counts, twice the steps; `why` it
    runs (the verdict that could not tell)."""
    return replace(plan, round=plan.round + 1, steps=plan.steps * 2, message=why)


def round_configs(
    configs: Sequence[tuple[int, RunConfig]], plan: Scale
) -> list[tuple[int, RunConfig]]:
    """Each count's settings in `plan`'s round: the same job, for plan.steps steps."""
    source = f"scale round {plan.round} ({plan.steps} steps)"
    return [(count, apply_overrides(config, {"train.max_steps": plan.steps}, source=source))
            for count, config in configs]


def reached_its_steps(summary: AttemptSummary | None) -> bool:
    """An attempt of the probe ended on its own at the steps it was given (train.max_steps),
    with steps measured after warm-up: more steps could narrow its figure's interval."""
    if summary is None or not summary.measured or summary.end not in ("max_steps", "epochs"):
        return False
    planned = get_setting(summary.settings, "train.max_steps")
    return (isinstance(planned, int) and summary.last_step is not None
            and summary.last_step >= planned)


def round_words(plan: Scale) -> str | None:
    """A later round as it begins, in one line (None for the first): why, which, how long."""
    if plan.round <= 1:
        return None
    why = f"{plan.message}; " if plan.message else ""
    return (f"{why}round {plan.round} of {plan.rounds}: every count again, {plan.steps} "
            "steps each")


def count_of(settings: Mapping[str, Any]) -> int | None:
    """The device count an attempt of the probe ran at, from its settings."""
    workers = get_setting(settings, "cluster.workers")
    if isinstance(workers, list) and workers:
        return len(workers)
    replicas = get_setting(settings, "strategy.replicas")
    return replicas if isinstance(replicas, int) else None


# ---- the table -----------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingRow:
    """One count of the probe: what its attempt ran with and measured (None: not known)."""

    count: int
    attempt: int | None = None
    state: str = "waiting"  # waiting | running | measured | the attempt's end (crashed, ...)
    global_batch_size: int | None = None
    per_replica_batch: int | None = None
    replicas: int | None = None
    device_kind: str | None = None
    measured_steps: int = 0
    examples_per_s: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    # The median examples/s's interval (MEDIAN_CONFIDENCE), and the efficiency's (CONFIDENCE):
    # None with fewer than MIN_INTERVAL_STEPS measured steps here or at the smallest count.
    examples_per_s_interval: tuple[float, float] | None = None
    efficiency_interval: tuple[float, float] | None = None
    breakdown: Breakdown | None = None
    shares_cores: bool = False  # logical CPU replicas (or local workers) beyond the cores

    @property
    def shares(self) -> dict[str, float] | None:
        """The step's parts in %, in Breakdown.PARTS order; None until the trainer times them."""
        return self.breakdown.shares() if self.breakdown is not None else None

    @property
    def failed(self) -> bool:
        """It ended without a figure: crashed, stopped, never ran, or measured nothing."""
        return self.state not in ("waiting", "running", "measured")


def speedup(rate: float | None, base_rate: float | None) -> float | None:
    """X(N) / X(b): how many times the base count's examples/s."""
    if rate is None or base_rate is None or base_rate <= 0:
        return None
    return rate / base_rate


def efficiency(
    rate: float | None, count: int, base_rate: float | None, base_count: int
) -> float | None:
    """X(N) x b / (N x X(b)): 1.0 when N devices do N/b times the base count's work."""
    gain = speedup(rate, base_rate)
    if gain is None or count <= 0:
        return None
    return gain * base_count / count


def efficiency_interval(
    rates: tuple[float, float] | None, count: int, base_rates: tuple[float, float] | None,
    base_count: int,
) -> tuple[float, float] | None:
    """The efficiency's interval from the two counts' median intervals (examples/s): from
    the count's lowest over the base's highest to its highest over the base's lowest.

    Each median interval is the distribution-free one from order statistics (sketch.py):
    no resampling, so nothing random and the same figures on every repaint, and it costs
    one sort of at most EXACT_VALUES values (or of the sketch's bins) per count. It
    assumes the measured steps of an attempt are independent draws from one distribution;
    load on the host that changes between one count's attempt and the next is not in it.
    The same ``efficiency`` arithmetic makes both ends, so the interval always holds the
    figure itself. Pairing the two medians' worst ends makes it conservative: it holds the
    true efficiency more often than CONFIDENCE says (all 200 of tests/measures/test_scaling.py's
    seeded probes). None while either count has too few steps for an interval."""
    if rates is None or base_rates is None:
        return None
    low = efficiency(rates[0], count, base_rates[1], base_count)
    high = efficiency(rates[1], count, base_rates[0], base_count)
    if low is None or high is None:
        return None
    return low, high


def _attempt_at(state: RunState, count: int) -> AttemptSummary | None:
    """The attempt of the probe a count's row shows: its latest that runs or measured,
    else its latest (which says how it failed); None before any.

    So a finished probe's rows are its last round's (a round runs every count). A round
    stopped or crashed part-way leaves the counts it did not measure with the round
    before's figures: those rows then come from different rounds, each count's attempt
    still measured whole. While a round runs, a count it has not reached yet shows the
    round before's."""
    found = [summary for summary in state.attempts.values()
             if summary.reason == REASON and count_of(summary.settings) == count]
    for summary in reversed(found):
        if _row_state(state, summary) in ("running", "measured"):
            return summary
    return found[-1] if found else None


def _row_state(state: RunState, summary: AttemptSummary | None) -> str:
    if summary is None:
        return "not run" if state.terminal else "waiting"
    if summary.attempt == state.attempt and not state.terminal and summary.end is None:
        return "running"
    end = summary.end
    if summary.attempt == state.attempt and state.terminal and state.status != "finished":
        end = end if end in ("crashed", "stopped") else state.status
    if end in (None, "max_steps", "epochs"):
        return "measured" if summary.measured else "no steps measured"
    return end


def _shares_cores(plan: Scale, count: int, summary: AttemptSummary | None,
                  settings: Mapping[str, Any]) -> bool:
    """Logical CPU replicas (or one host's CPU workers) beyond the host's cores."""
    if plan.cores is None or count <= plan.cores:
        return False
    hello = summary.hello if summary is not None else None
    if hello is not None and hello.device_kind != "cpu":
        return False
    launcher = get_setting(settings, "cluster.launcher")
    return plan.unit == "replicas" or launcher == "local"


def scaling_rows(state: RunState) -> list[ScalingRow]:
    """The probe's table: a row per count of the plan, in order ([] for another run).

    Speed-up and efficiency are against the smallest count, once it is measured; a row
    still running shows its figures so far (after warm-up)."""
    plan = state.scale
    if plan is None:
        return []
    found = [(count, _attempt_at(state, count)) for count in plan.counts]
    states = {count: _row_state(state, summary) for count, summary in found}
    base_count = min(plan.counts)
    base = dict(found).get(base_count)
    base_rate = _rate(base, states[base_count])
    base_rates = _rate_interval(base, states[base_count])
    rows: list[ScalingRow] = []
    for count, summary in found:
        row_state = states[count]
        if summary is None:
            rows.append(ScalingRow(count, state=row_state,
                                   shares_cores=_shares_cores(plan, count, None, state.settings)))
            continue
        hello = summary.hello
        rate = _rate(summary, row_state)
        rates = _rate_interval(summary, row_state)
        if count == base_count:  # the count against itself: 1.0 by definition, no spread
            interval = (1.0, 1.0) if rates is not None and rate else None
        else:
            interval = efficiency_interval(rates, count, base_rates, base_count)
        rows.append(ScalingRow(
            count,
            attempt=summary.attempt,
            state=row_state,
            global_batch_size=summary.global_batch_size,
            per_replica_batch=hello.per_replica_batch if hello is not None else None,
            replicas=hello.replicas if hello is not None else None,
            device_kind=hello.device_kind if hello is not None else None,
            measured_steps=summary.measured_steps,
            examples_per_s=rate,
            speedup=speedup(rate, base_rate),
            efficiency=efficiency(rate, count, base_rate, base_count),
            examples_per_s_interval=rates,
            efficiency_interval=interval,
            breakdown=summary.breakdown if rate is not None else None,
            shares_cores=_shares_cores(plan, count, summary, summary.settings),
        ))
    return rows


def _rate(summary: AttemptSummary | None, row_state: str) -> float | None:
    """A count's examples/s: its attempt's median after warm-up, so far while it runs; none
    for an attempt that did not reach its steps (a crash's last steps are no measure)."""
    if summary is None or row_state not in ("measured", "running"):
        return None
    return summary.median_examples_per_s


def _rate_interval(summary: AttemptSummary | None, row_state: str
                   ) -> tuple[float, float] | None:
    """The interval of a count's median examples/s (MEDIAN_CONFIDENCE), as _rate gates it."""
    if summary is None or row_state not in ("measured", "running"):
        return None
    return summary.rates.median_interval(MEDIAN_CONFIDENCE)


def probe_failed(rows: Sequence[ScalingRow], state: RunState | None = None
                 ) -> ScalingRow | None:
    """The first count that did not measure (crashed, stopped, never ran), or None. With
    the state, also a count whose row shows an earlier round's figures (``_attempt_at``)
    while its latest attempt ended without measuring: a round cut short is said, not hidden
    behind the round before's row."""
    failed = next((row for row in rows if row.failed or row.examples_per_s is None), None)
    if failed is not None or state is None:
        return failed
    for row in rows:
        latest = [summary for summary in state.attempts.values()
                  if summary.reason == REASON and count_of(summary.settings) == row.count]
        if latest and latest[-1].attempt != row.attempt:
            ended = _row_state(state, latest[-1])
            if ended not in ("running", "measured"):
                return ScalingRow(row.count, attempt=latest[-1].attempt, state=ended)
    return None


# ---- the table in words (headless, export and the dashboard's cells) -------------------


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def pct_range(interval: tuple[float, float]) -> str:
    """An interval of fractions in whole percent: "70-86%"."""
    low, high = interval
    return f"{100 * low:.0f}-{100 * high:.0f}%"


def efficiency_words(row: ScalingRow) -> str:
    """A count's efficiency with its interval, "78% (70-86%)"; "78%" while it has none."""
    if row.efficiency is None:
        return "n/a"
    if row.efficiency_interval is None:
        return f"{100 * row.efficiency:.0f}%"
    return f"{100 * row.efficiency:.0f}% ({pct_range(row.efficiency_interval)})"


def scaling_line(plan: Scale, rows: Sequence[ScalingRow]) -> str:
    """`scaling: replicas=1,2 examples_per_s=A,B speedup=1.00,S efficiency=1.00,E
    efficiency_interval=1.00-1.00,L-H mode=weak` (one line; workers= for a cluster; n/a for
    a count that did not measure, or whose efficiency has no interval yet)."""
    def joined(values: list[str]) -> str:
        return ",".join(values)

    def interval(row: ScalingRow) -> str:
        if row.efficiency_interval is None:
            return "n/a"
        low, high = row.efficiency_interval
        return f"{low:.2f}-{high:.2f}"

    return (
        f"scaling: {plan.unit}={joined([str(r.count) for r in rows])} "
        f"examples_per_s={joined([_num(r.examples_per_s, '.1f') for r in rows])} "
        f"speedup={joined([_num(r.speedup, '.2f') for r in rows])} "
        f"efficiency={joined([_num(r.efficiency, '.2f') for r in rows])} "
        f"efficiency_interval={joined([interval(r) for r in rows])} mode={plan.mode}"
    )


SHARE_HEADS = {"input": "input", "compute": "comp", "sync": "sync", "update": "upd",
               "other": "other"}


def cells(row: ScalingRow) -> dict[str, str]:
    """A row's figures as the table shows them: count, batch, ex/s, speed-up, efficiency
    and its interval, and each part of the step's share ("-" until the trainer times the parts)."""
    shares = row.shares
    mark = "*" if row.shares_cores else ""
    out = {
        "count": f"{row.count}{mark}",
        "batch": "-" if row.global_batch_size is None else str(row.global_batch_size),
        "examples_per_s": "-" if row.examples_per_s is None else f"{row.examples_per_s:,.0f}",
        "speedup": "-" if row.speedup is None else f"{row.speedup:.2f}",
        "efficiency": "-" if row.efficiency is None else f"{100 * row.efficiency:.0f}%",
        "efficiency_interval": ("-" if row.efficiency_interval is None
                                else pct_range(row.efficiency_interval)),
    }
    for part in Breakdown.PARTS:
        out[part] = "-" if shares is None else f"{shares[part]:.0f}%"
    out["state"] = row.state
    return out


def describe(plan: Scale) -> str:
    """What the probe keeps and measures, in one line (its round, where it may have more)."""
    kept = ("the per-replica batch kept" if plan.mode == "weak"
            else "the global batch kept")
    rounds = f" (round {plan.round} of up to {plan.rounds})" if plan.rounds > 1 else ""
    return (f"{plan.mode} scaling ({kept}) over {plan.unit} {','.join(map(str, plan.counts))}: "
            f"{plan.steps} steps each{rounds}, measured after the first {WARMUP_STEPS}")


def shared_cores_note(plan: Scale, rows: Sequence[ScalingRow]) -> str | None:
    """The footnote for counts marked *: their replicas share the host's cores."""
    shared = [row.count for row in rows if row.shares_cores]
    if not shared or plan.cores is None:
        return None
    what = "logical CPU replicas" if plan.unit == "replicas" else "CPU workers"
    counts = ", ".join(map(str, shared))
    cores = f"{plan.cores} core" + ("s" if plan.cores != 1 else "")
    return (f"* {counts} {what} share {cores}: more replicas than cores is not a "
            "real scaling measure")


def table_lines(plan: Scale, rows: Sequence[ScalingRow]) -> list[str]:
    """The probe's table as plain text lines (headless): a header, a row per count (its
    efficiency's interval beside it), notes."""
    effic = f"effic. ({CONFIDENCE:.0%} CI)"
    head = (f"{plan.unit:>8} {'batch':>6} {'ex/s':>9} {'speed-up':>8} {effic:>17}  "
            + " ".join(f"{SHARE_HEADS[part]:>5}" for part in Breakdown.PARTS) + "  state")
    lines = [head]
    for row in rows:
        cell = cells(row)
        interval = cell["efficiency_interval"]
        shown = cell["efficiency"] + ("" if interval == "-" else f" ({interval})")
        lines.append(
            f"{cell['count']:>8} {cell['batch']:>6} {cell['examples_per_s']:>9} "
            f"{cell['speedup']:>8} {shown:>17}  "
            + " ".join(f"{cell[part]:>5}" for part in Breakdown.PARTS) + f"  {cell['state']}"
        )
    note = shared_cores_note(plan, rows)
    if note:
        lines.append(note)
    if rows and all(row.breakdown is None for row in rows if row.examples_per_s is not None):
        lines.append("(the step's parts: '-' until the trainer times input, compute, "
                     "all-reduce and update apart)")
    return lines
