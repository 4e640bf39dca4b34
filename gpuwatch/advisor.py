"""Advisor: the current figures (+ settings, device sample) -> a verdict and what to try.

Plain Python, no Textual. The verdict names the part that holds the step back, with its
measured share, and remedies that name the dashboard key acting on them where one does
(``Remedy``). The rules (``RULES``), each a function of the ``Evidence``, first to speak
wins:

1. too large for data parallelism: weights, optimizer slots and gradients (and
   accumulators) need more than one GPU's memory. MirroredStrategy keeps a full copy
   on every replica, so no count of GPUs holds it; model or tensor parallelism does.
2. (poor scaling: a verdict over a scaling probe's counts, not over one attempt's
   figures, so not one of ``RULES``: ``poor_scaling``, which the probe's panel and its
   headless output show beside the current attempt's verdict.)
3. a part of the step: input wait, gradient all-reduce ("communication-bound"), optimizer
   update, or host (the step's unmeasured rest), the largest of those at or above its
   moderate grade (``PART_GRADES``, ``holding_part``). Input: TF Profiler's 5 % / 20 %
   (openxla/xprof ``op_stats_to_input_pipeline_analysis.cc``); all-reduce: its grades for
   collectives, 3 % / 15 %; update and host take the input's grades (the profiler grades
   neither).
4. memory-bound: none of those, and a GPU's memory at least 90 % full: accumulation
   rather than a bigger batch.
5. compute-bound: none of those; with what keeps utilisation low, where it is so (a small
   per-replica batch, no XLA, float32 where the GPU has faster precisions, peaks.py).

A trainer that does not time the all-reduce apart gives no breakdown: then the verdict is
input wait alone, as it always was ("highly input-bound" >= 20 %, "moderately" >= 5 %,
else "not input-bound"), with the gradient-sync estimate and the memory note.

Several workers: ``find_straggler`` names the worker that holds every synchronous
step back and why (see its docstring for the thresholds); each measured worker gets its
own verdict (``Advice.workers``), the straggler's first, and with a breakdown the
headline is the straggler's.

``reading(state)`` is what one repaint of the dashboard shows: the state's figures
(``RunState.figures``), taken once, with the straggler and the advice made from them,
so the verdict's input wait is the figure the metrics line shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatch import peaks
from gpuwatch.breakdown import link_share_text
from gpuwatch.runstate import (
    ACCUMULATION_KEY,
    BATCH_KEY,
    CHIEF,
    PREFETCH_KEY,
    Figures,
    RunState,
    WorkerSummary,
    command_argv,
    get_setting,
    pace_setter,
)
from gpuwatch.scaling import ScalingRow
from trainer_runtime.protocol import SUMMARY_PAST_WORKERS, Breakdown, Hello, Scale
from trainer_runtime.schema import prefetch_enabled

HIGH_INPUT_BOUND_PCT = 20.0
MODERATE_INPUT_BOUND_PCT = 5.0
LOW_GPU_UTIL_PCT = 50.0
HIGH_GPU_MEM_FRACTION = 0.90
MAX_RECOMMENDATIONS = 3
# Straggler rule. Under synchronous training every worker's step lasts as long as the
# slowest's; the straggler is the one whose own work (input wait or compute) is longer,
# the others spend the difference waiting in the all-reduce. It is named when its extra
# time is at least STRAGGLER_MIN_SHARE_PCT of a step (TF Profiler's "moderate" bar: less
# is noise) and at least the ratio below times the others' median (so a run where every
# worker is input-bound alike has no straggler).
STRAGGLER_MIN_SHARE_PCT = 5.0
STRAGGLER_INPUT_RATIO = 1.5
STRAGGLER_COMPUTE_RATIO = 1.25


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
# Below this many examples per replica per micro-step a GPU's kernels are too thin to
# fill it (our rule of thumb, not a measured bound): a compute-bound verdict says so.
SMALL_PER_REPLICA_BATCH = 32
# Slot variables per weight of the optimizers train.optimizer offers: Keras 3's Adam keeps
# two (first and second moments), plain SGD (no momentum) none.
OPTIMIZER_SLOTS = {"sgd": 0, "adam": 2}
JIT_KEY = "train.jit_compile"
PRECISION_KEY = "train.mixed_precision"
CROSS_DEVICE_OPS_KEY = "strategy.cross_device_ops"
STEPS_PER_EXECUTION_KEY = "train.steps_per_execution"


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
# Steps measured, but none with an input wait (a script's loop may not let the hook time
# it: gpuwatch run): no input verdict can be made from a wait that was not measured.
WAIT_NOT_MEASURED = "input wait not measured in this loop: no verdict on input"
# The dashboard's keys a person's own command takes (gpuwatch run): prefetch, which its
# hook applies. Its batch, accumulation and other settings are its own code's.
COMMAND_KEYS = frozenset({"p"})
UNWATCHED_VERDICT = "watched from outside: device sampling only"
UNWATCHED_ADVICE = "its processes and their GPUs are sampled; steps come from a TF hook"


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


def advise(
    figures: Figures,
    settings: Mapping[str, Any],
    sample: Mapping[str, Any] | None = None,
    replicas: int = 1,
    straggler: Straggler | None = None,
    hello: Hello | None = None,
    per_worker: bool = True,
) -> Advice:
    """Verdict and up to three recommendations for the current figures (``RunState.figures``).

    per_worker: also each worker's own verdict (``Advice.workers``; the dashboard's screen
    shows none of them, and past SUMMARY_PAST_WORKERS workers it leaves them out: 64
    workers' rules on every repaint were a third of its figures' cost).

    The verdict is the first rule's finding (``RULES``) for the run's figures; in a cluster
    with a straggler (``find_straggler``, from the same figures' workers) the straggler's,
    named, and its cause comes first in the recommendations. Without a measured breakdown
    it is input wait alone (``_input_only``): the figures' own, in a cluster the worker's
    that waits most, named (every step waits for it).
    """
    run = Evidence.of_run(figures, settings, sample, replicas, hello)
    found = verdict_of(run)
    workers = worker_verdicts(figures.workers, run, straggler) if per_worker else ()
    if found is None:
        return replace(_input_only(run, figures, straggler), workers=workers)
    if run.command:
        found = replace(found, remedies=_for_command(found.remedies))
    if straggler is not None:
        mine = next((w for w in figures.workers if w.worker == straggler.worker), None)
        named = verdict_of(run.of_worker(mine, named=True)) if mine is not None else None
        found = named or found
    recs = ([_straggler_text(straggler)] if straggler is not None else [])
    recs += [remedy.text for remedy in found.remedies]
    # A cluster's screen also lists its workers and names the straggler: two lines here.
    most = MAX_RECOMMENDATIONS if straggler is None else min(2, MAX_RECOMMENDATIONS)
    return Advice(found.level, found.verdict, figures.input_wait_pct, recs[:most],
                  bottleneck=found.kind, share_pct=found.share_pct, remedies=found.remedies,
                  workers=workers)


def _straggler_text(straggler: Straggler) -> str:
    if straggler.cause == "input-bound":
        return (f"worker {straggler.worker} waits on input; every step waits for it: "
                "speed up its input")
    return (f"worker {straggler.worker}'s devices are slower: the others wait for it "
            "in the all-reduce")


def _for_command(remedies: Sequence[Remedy]) -> tuple[Remedy, ...]:
    """The remedies a person's own command can take (gpuwatch run): the keys it has
    (COMMAND_KEYS), or words with no setting behind them; not a setting of the bundled
    runtime's (its batch, accumulation, data.parallel_calls are the script's own)."""
    return tuple(r for r in remedies
                 if r.key in COMMAND_KEYS or (r.key is None and r.setting is None))


def _input_only(run: Evidence, figures: Figures, straggler: Straggler | None) -> Advice:
    """The advice from input wait alone: no breakdown was measured (an older trainer, or a
    script's loop). Steps measured without an input wait make no input verdict."""
    pct = figures.input_wait_pct
    level = input_bound_level(pct)
    verdict = VERDICTS[level] if pct is None else _input_finding(run, level).verdict
    if pct is None and (figures.examples_per_s is not None or figures.step_time_ms is not None):
        verdict = WAIT_NOT_MEASURED
    recs: list[str] = [_straggler_text(straggler)] if straggler is not None else []
    util = _mean_util(run.gpus)
    remedies = tuple(_input_remedies(run)) if level in ("high", "moderate") else ()
    if run.command:
        remedies = _for_command(remedies)
    recs += [remedy.text for remedy in remedies]
    if run.command:  # a script's batch and accumulation are its own: no key to suggest
        full = run.fullest_gpu
        if full is not None:
            recs.append(f"GPU {full[0]} memory {full[1]:.0f}% full")
        bottleneck = "input" if level in ("high", "moderate") else level
        return Advice(level, verdict, pct, recs[:MAX_RECOMMENDATIONS], bottleneck=bottleneck,
                      share_pct=pct, remedies=remedies)
    if level == "none":
        if util is not None and util < LOW_GPU_UTIL_PCT:
            recs.append(f"GPUs only {util:.0f}% busy, not waiting on input: "
                        "a larger batch (b) adds work")
        elif straggler is None:
            recs.append("the input keeps up: step time is compute (and gradient sync)")
    accumulation = get_setting(run.settings, ACCUMULATION_KEY) or 1
    sync_per_s = figures.grad_sync_bytes_per_s
    if run.replicas > 1 and sync_per_s is not None and sync_per_s > 0:
        if accumulation == 1:
            recs.append(f"gradient sync est. {format_rate(sync_per_s)}: accumulation (a) "
                        "syncs once per k micro-steps")
        else:
            recs.append(f"gradient sync est. {format_rate(sync_per_s)}, "
                        f"one all-reduce per {accumulation} micro-steps")
    full = run.fullest_gpu
    if full is not None:
        recs.append(f"GPU {full[0]} memory {full[1]:.0f}% full: a larger batch (b) may not fit")
    most = MAX_RECOMMENDATIONS if straggler is None else min(2, MAX_RECOMMENDATIONS)
    bottleneck = "input" if level in ("high", "moderate") else level
    return Advice(level, verdict, pct, recs[:most], bottleneck=bottleneck, share_pct=pct,
                  remedies=remedies)


# ---- the evidence the rules read, and the rules ----------------------------------------


@dataclass(frozen=True)
class Evidence:
    """What the rules read: the run's figures, or one worker's in a cluster.

    ``worker``: whose figures (None: the run's, the chief's steps); ``named``: the
    verdict says "on worker N"; ``input_worker``: the worker the run's input wait is
    (a cluster's worker that waits most); ``waits_for``: a straggler this worker waits
    for in the all-reduce.
    """

    input_wait_pct: float | None
    breakdown: Breakdown | None
    settings: Mapping[str, Any]
    gpus: tuple[Mapping[str, Any], ...]  # the run's GPUs on this host (none: no GPU, or no sample)
    hello: Hello | None
    replicas: int
    workers: int = 1
    bus_bytes_per_s: float | None = None
    link: peaks.LinkPeak | None = None
    bus_pct_of_link: float | None = None
    mfu_pct: float | None = None
    worker: int | None = None
    named: bool = False
    input_worker: int | None = None
    waits_for: int | None = None

    @classmethod
    def of_run(cls, figures: Figures, settings: Mapping[str, Any],
               sample: Mapping[str, Any] | None, replicas: int, hello: Hello | None
               ) -> Evidence:
        return cls(
            input_wait_pct=figures.input_wait_pct, breakdown=figures.breakdown,
            settings=settings, gpus=run_gpus(sample), hello=hello, replicas=replicas,
            workers=max(1, len(figures.workers), hello.workers if hello is not None else 1),
            bus_bytes_per_s=figures.bus_bytes_per_s, link=figures.link,
            bus_pct_of_link=figures.bus_pct_of_link, mfu_pct=figures.mfu_pct,
            input_worker=figures.input_wait_worker,
        )

    def of_worker(self, summary: WorkerSummary, *, named: bool = False,
                  waits_for: int | None = None) -> Evidence:
        """One worker's evidence: its steps, its host's GPUs; the bus figure only for the
        chief (the run's is the chief's); no link across hosts, no run-wide MFU."""
        chief = summary.worker == CHIEF
        return replace(
            self, input_wait_pct=summary.input_wait_pct, breakdown=summary.breakdown,
            gpus=run_gpus(summary.sample), bus_bytes_per_s=self.bus_bytes_per_s if chief else None,
            link=None, bus_pct_of_link=None, mfu_pct=None, worker=summary.worker, named=named,
            input_worker=None, waits_for=waits_for,
        )

    @property
    def step(self) -> str:
        """'the step', or 'its step' for a worker's."""
        return "the step" if self.worker is None else "its step"

    @property
    def named_as(self) -> str:
        return f" on worker {self.worker}" if self.named and self.worker is not None else ""

    def share(self, part: str) -> float | None:
        """A part's share of the step, in %: input wait the figures' own (the metrics line's),
        the rest from the breakdown; None where not measured."""
        if part == "input" and self.input_wait_pct is not None:
            return self.input_wait_pct
        return self.breakdown.pct(part) if self.breakdown is not None else None

    def setting(self, dotted: str) -> Any:
        return get_setting(self.settings, dotted)

    @property
    def command(self) -> bool:
        """A person's own command (gpuwatch run): its settings are its own code's."""
        return command_argv(self.settings) is not None

    @property
    def accumulation(self) -> int:
        value = self.setting(ACCUMULATION_KEY)
        return value if isinstance(value, int) and value > 0 else 1

    @property
    def per_replica_batch(self) -> int | None:
        """Examples per replica per micro-step: the settings' (a live change moves it), else
        the hello's."""
        batch = self.setting(BATCH_KEY)
        if isinstance(batch, int) and batch > 0 and self.replicas > 0:
            return batch // (self.replicas * self.accumulation)
        return self.hello.per_replica_batch if self.hello is not None else None

    @property
    def on_gpu(self) -> bool:
        if self.hello is not None:
            return self.hello.device_kind == "gpu"
        return bool(self.gpus)

    @property
    def fullest_gpu(self) -> tuple[int, float] | None:
        """(index, % of its memory used) of the fullest GPU at or above HIGH_GPU_MEM_FRACTION."""
        full: tuple[int, float] | None = None
        for gpu in self.gpus:
            used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
            if not isinstance(used, int | float) or not isinstance(total, int | float):
                continue
            if total > 0 and used / total >= HIGH_GPU_MEM_FRACTION:
                pct = 100.0 * used / total
                if full is None or pct > full[1]:
                    index = gpu.get("index")
                    full = (index if isinstance(index, int) else 0, pct)
        return full


def run_gpus(sample: Mapping[str, Any] | None) -> tuple[Mapping[str, Any], ...]:
    """The GPUs of a sample the run uses: those NVML lists a process of the run on, else
    every GPU present (lost ones left out)."""
    gpus = [g for g in (sample or {}).get("gpus") or () if isinstance(g, Mapping)]
    present = [g for g in gpus if not g.get("lost")]
    in_run = [g for g in present
              if any(isinstance(p, Mapping) and p.get("in_run") for p in g.get("processes") or ())]
    return tuple(in_run or present)


def _mean_util(gpus: Sequence[Mapping[str, Any]]) -> float | None:
    utils = [u for g in gpus if isinstance(u := g.get("util_gpu_pct"), int | float)]
    return sum(utils) / len(utils) if utils else None


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


def model_state_bytes(param_bytes: int, optimizer: Any, accumulation_steps: int) -> int:
    """Bytes every replica holds for its copy of the model, at least: the weights, the
    optimizer's slots (OPTIMIZER_SLOTS; an unknown optimizer counts none), the gradients,
    and the accumulators when accumulating. Activations come on top."""
    slots = OPTIMIZER_SLOTS.get(str(optimizer), 0)
    copies = 1 + slots + 1 + (1 if accumulation_steps > 1 else 0)
    return copies * param_bytes


def too_large_for_data_parallelism(ev: Evidence) -> Finding | None:
    """The model's state is more than one GPU's memory: data parallelism cannot hold it."""
    hello = ev.hello
    totals = [t for g in ev.gpus if isinstance(t := g.get("mem_total_bytes"), int | float)
              and t > 0]
    if hello is None or hello.device_kind != "gpu" or hello.param_bytes <= 0 or not totals:
        return None
    optimizer = ev.setting("train.optimizer")
    needed = model_state_bytes(hello.param_bytes, optimizer, ev.accumulation)
    memory = min(totals)
    if needed <= memory:
        return None
    slots = OPTIMIZER_SLOTS.get(str(optimizer), 0)
    held = ["weights"]
    if slots:
        held.append(f"{str(optimizer).capitalize()}'s {slots} slots")
    held.append("gradients")
    if ev.accumulation > 1:
        held.append("accumulators")
    detail = (f"{', '.join(held)} need {format_bytes(needed)}, one GPU holds "
              f"{format_bytes(memory)}")
    return Finding("too-large", "high", 100.0 * needed / memory,
                   "too large for data parallelism" + ev.named_as, detail, (
        Remedy("MirroredStrategy keeps a full copy on every replica: more GPUs cannot hold it"),
        Remedy("shard it instead: model/tensor parallelism, e.g. keras.distribution."
               "ModelParallel on the JAX backend, or sharding outside tf.distribute"),
    ))


def step_bottleneck(ev: Evidence) -> Finding | None:
    """The part of the step that holds it back (``holding_part``), with its remedies; the
    first remedy of every other part graded high follows its own first (two parts both
    high: the runner-up's fix is one key away too)."""
    if ev.breakdown is None:
        return None
    shares = {part: ev.share(part) for part in PART_GRADES}
    held = holding_part(shares)
    if held is None:
        return None
    part, share = held
    level = part_level(part, share)
    runners_up = sorted(((p, float(pct)) for p, pct in shares.items()
                         if p != part and pct is not None and part_level(p, pct) == "high"),
                        key=lambda pair: pair[1], reverse=True)
    others = [first for p, pct in runners_up if (first := _part_remedies(ev, p, pct)[1][:1])]
    if part == "input":
        finding = _input_finding(ev, level)
        remedies = list(finding.remedies)
    else:
        grade = "highly" if level == "high" else "moderately"
        label = f"{grade} {BOTTLENECKS[part]}-bound{ev.named_as}"
        detail, remedies = _part_remedies(ev, part, share)
        finding = Finding(BOTTLENECKS[part], level, share, label, detail, ())
    if part == "input" and not others:
        return finding  # as the input rule has always said it
    merged = remedies[:1] + [r[0] for r in others if r[0] not in remedies] + remedies[1:]
    return replace(finding, remedies=_within_memory(ev, merged))


def _part_remedies(ev: Evidence, part: str, share: float) -> tuple[str, list[Remedy]]:
    """(detail, remedies) of one part of the step that holds it back."""
    if part == "input":
        return "", _input_remedies(ev)
    if part == "sync":
        return _communication(ev, share)
    if part == "update":
        return (f"optimizer update {share:.0f}% of {ev.step}",
                [_accumulation(ev, "one optimizer update per k micro-steps"),
                 Remedy("a bigger batch (b): more examples per update", "b", BATCH_KEY)])
    remedies = [Remedy("a bigger batch (b): the same host work over more examples", "b",
                       BATCH_KEY)]
    if ev.setting(STEPS_PER_EXECUTION_KEY) == 1:
        remedies.insert(0, _relaunch(STEPS_PER_EXECUTION_KEY, "8", "several updates per "
                                     "call, fewer host round trips"))
    return f"{share:.0f}% of {ev.step} outside its measured parts (host work, dispatch)", remedies


def memory_bound(ev: Evidence) -> Finding | None:
    """No part holds the step back and a GPU's memory is nearly full: accumulation, not a
    bigger batch, is how the batch grows."""
    full = ev.fullest_gpu
    if ev.breakdown is None or full is None:
        return None
    index, pct = full
    compute = ev.breakdown.pct("compute")
    remedies = [Remedy("accumulation (a): a bigger effective batch in the same memory; a "
                       "bigger batch (b) would not fit", "a", ACCUMULATION_KEY)]
    faster = _faster_precision(ev)
    if faster is not None:
        remedies.append(_relaunch(PRECISION_KEY, faster[0], "half-size activations"))
    return Finding("memory", "moderate", pct, "memory-bound" + ev.named_as,
                   f"GPU {index} memory {pct:.0f}% full, compute {compute:.0f}% of {ev.step}",
                   tuple(remedies))


def compute_bound(ev: Evidence) -> Finding | None:
    """The step is the devices' own work; what keeps their utilisation low, where known."""
    if ev.breakdown is None:
        return None
    share = ev.breakdown.pct("compute")
    detail = f"compute {share:.0f}% of {ev.step}"
    if ev.mfu_pct is not None:
        detail += f", MFU {ev.mfu_pct:.0f}%"
    causes: list[str] = []
    remedies: list[Remedy] = []
    batch = ev.per_replica_batch
    if batch is not None and batch < SMALL_PER_REPLICA_BATCH:
        causes.append(f"per-replica batch {batch}")
        remedies.append(Remedy(f"a bigger batch (b): {batch} examples per replica leave the "
                               "devices idle", "b", BATCH_KEY))
    if ev.setting(JIT_KEY) is False:
        causes.append("no XLA")
        remedies.append(_relaunch(JIT_KEY, "true", "XLA fuses the forward and backward"))
    faster = _faster_precision(ev)
    if faster is not None:
        policy, product, ratio = faster
        causes.append("float32")
        precision = peaks.precision_of(policy)
        remedies.append(_relaunch(PRECISION_KEY, policy, f"the {product}'s {precision} peak "
                                  f"is {ratio:.0f}x its float32 one"))
    if causes:
        detail += "; low utilisation: " + ", ".join(causes)
    else:
        remedies.append(Remedy("the devices do the step's work: more replicas add throughput"))
    return Finding("compute", "none", share, "compute-bound" + ev.named_as, detail,
                   _within_memory(ev, remedies))


# The rules, first to speak wins (advise, worker_verdicts). Each reads the Evidence alone.
RULES: tuple[Callable[[Evidence], Finding | None], ...] = (
    too_large_for_data_parallelism,
    # Poor scaling is over a probe's counts, not one attempt's figures: poor_scaling.
    step_bottleneck,
    memory_bound,
    compute_bound,
)


def verdict_of(ev: Evidence) -> Finding | None:
    """The first rule's finding; None when none speaks (no breakdown, no model figures)."""
    for rule in RULES:
        found = rule(ev)
        if found is not None:
            return found
    return None


def worker_verdicts(workers: Sequence[WorkerSummary], run: Evidence,
                    straggler: Straggler | None) -> tuple[WorkerVerdict, ...]:
    """Each measured worker's verdict (the rules, else its input wait alone), the
    straggler's first, then by index; the others' all-reduce holds their wait for it."""
    out: list[WorkerVerdict] = []
    slow = straggler.worker if straggler is not None else None
    for summary in workers:
        if not summary.measured:
            continue
        ev = run.of_worker(summary, waits_for=slow if summary.worker != slow else None)
        found = verdict_of(ev)
        if found is None and ev.input_wait_pct is not None:
            found = _input_finding(ev, input_bound_level(ev.input_wait_pct))
        if found is not None:
            out.append(WorkerVerdict(summary.worker, summary.host, found, summary.worker == slow))
    return tuple(sorted(out, key=lambda v: (not v.straggler, v.worker)))


# ---- what the findings say, and the remedies -------------------------------------------


def _input_finding(ev: Evidence, level: str) -> Finding:
    """'highly input-bound: 38.0% of step time waiting for input' (in a cluster '... on
    worker 1: 38.0% of its step time ...')."""
    pct = ev.input_wait_pct if ev.input_wait_pct is not None else ev.share("input") or 0.0
    whose = ev.input_worker if ev.worker is None else ev.worker
    named = whose is not None and (ev.worker is None or ev.named)
    label = VERDICTS[level] + (f" on worker {whose}" if named else "")
    detail = f"{pct:.1f}% of {'its ' if whose is not None else ''}step time waiting for input"
    remedies = tuple(_input_remedies(ev)) if level in ("high", "moderate") else ()
    return Finding("input", level, pct, label, detail, remedies)


def _input_remedies(ev: Evidence) -> list[Remedy]:
    prefetch_on = prefetch_enabled(ev.setting(PREFETCH_KEY))
    parallel = ev.setting("data.parallel_calls")
    out: list[Remedy] = []
    if not prefetch_on:
        out.append(Remedy("turn prefetch on (p): read the next batch while this step runs",
                          "p", PREFETCH_KEY))
    if parallel == 1:
        out.append(Remedy("raise data.parallel_calls (now 1: reads run one at a time), "
                          "e.g. autotune", "e", "data.parallel_calls"))
    if prefetch_on and parallel != 1:
        out.append(Remedy("prefetch and parallel reads on: try data.cache or cheaper "
                          "reads/decoding", "e", "data.cache"))
    util = _mean_util(ev.gpus)
    if util is not None and util < LOW_GPU_UTIL_PCT:
        out.append(Remedy(f"GPUs only {util:.0f}% busy while waiting: the input pipeline "
                          "is the limit"))
    return out


def _communication(ev: Evidence, share: float) -> tuple[str, list[Remedy]]:
    """'all-reduce 21% of the step, 142 GB/s bus = 31% of NVLink' and its remedies."""
    detail = f"all-reduce {share:.0f}% of {ev.step}"
    if ev.bus_bytes_per_s is not None and ev.bus_bytes_per_s > 0:
        detail += f", {format_bandwidth(ev.bus_bytes_per_s)} bus"
        if ev.link is not None and ev.bus_pct_of_link is not None:
            detail += f" = {link_share_text(ev.bus_pct_of_link)} of {ev.link.kind}"
    if ev.waits_for is not None:
        detail += f" (it waits there for worker {ev.waits_for})"
    remedies = [
        _accumulation(ev, "one all-reduce per k micro-steps"),
        Remedy("a bigger batch (b): more compute per all-reduce", "b", BATCH_KEY),
    ]
    ops = ev.setting(CROSS_DEVICE_OPS_KEY)
    if ev.on_gpu and ev.workers == 1 and ops in ("reduce_to_one", "hierarchical_copy"):
        remedies.append(_relaunch(CROSS_DEVICE_OPS_KEY, "nccl",
                                  f"now {ops}; NCCL all-reduces GPU to GPU"))
    return detail, remedies


def _accumulation(ev: Evidence, why: str) -> Remedy:
    now = ev.accumulation
    text = (f"accumulation (a): {why}" if now == 1
            else f"more accumulation (a): {why} (now {now})")
    return Remedy(text, "a", ACCUMULATION_KEY)


def _relaunch(dotted: str, value: str, why: str) -> Remedy:
    """A setting no key changes: a relaunch with it (``--set`` on train or resume)."""
    return Remedy(f"set {dotted}={value} (relaunch): {why}", None, dotted)


def _within_memory(ev: Evidence, remedies: list[Remedy]) -> tuple[Remedy, ...]:
    """The remedies that fit: with a GPU's memory nearly full, no bigger batch (b); say why
    and point at accumulation (a)."""
    full = ev.fullest_gpu
    if full is None:
        return tuple(remedies)
    kept = [r for r in remedies if r.key != "b"]
    index, pct = full
    if any(r.key == "a" for r in kept):
        kept.append(Remedy(f"GPU {index} memory {pct:.0f}% full: a bigger batch (b) would "
                           "not fit"))
    else:
        kept.append(Remedy(f"GPU {index} memory {pct:.0f}% full: accumulation (a) rather "
                           "than a bigger batch (b)", "a", ACCUMULATION_KEY))
    return tuple(kept)


def _faster_precision(ev: Evidence) -> tuple[str, str, float] | None:
    """(policy, GPU, speed-up) where the run computes in float32 and every one of its GPUs
    has a faster peak in bfloat16 (preferred: no loss scaling) or float16; else None."""
    if peaks.precision_of(ev.setting(PRECISION_KEY)) != "float32" or not ev.gpus:
        return None
    found = [peaks.find_peak(g.get("name")) for g in ev.gpus]
    if any(p is None for p in found):
        return None
    rows = [p for p in found if p is not None]
    for policy, precision in (("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")):
        ratios = [(fast / slow) for p in rows
                  if (fast := p.tflops(precision)) and (slow := p.tflops("float32"))]
        if len(ratios) == len(rows) and min(ratios) > 1.0:
            return policy, rows[0].product, min(ratios)
    return None


@dataclass(frozen=True)
class Straggler:
    """The worker the others wait for, and what makes it slow."""

    worker: int
    host: str
    cause: str  # "input-bound" | "slow devices"
    value: float  # its input wait % or compute ms
    others: float  # the others' median of the same figure
    extra_ms: float  # its extra time per step over the others' median

    @property
    def message(self) -> str:
        """'worker 1 (host-b) is the straggler: input-bound (input wait 38% vs 3% ...)'."""
        who = f"worker {self.worker}" + (f" ({self.host})" if self.host else "")
        if self.cause == "input-bound":
            figures = f"input wait {self.value:.0f}% vs {self.others:.0f}%"
        else:
            figures = f"compute {self.value:.0f} ms vs {self.others:.0f} ms"
        return f"{who} is the straggler: {self.cause} ({figures} on the others)"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _outlier(
    workers: Sequence[WorkerSummary], figure: str, ratio: float, step_ms: float
) -> tuple[WorkerSummary, float, float, float] | None:
    """(worker, its value, the others' median, extra ms) if one worker stands out."""
    known = {w.worker: w for w in workers if getattr(w, figure) is not None}
    pace = pace_setter({index: getattr(w, figure) for index, w in known.items()})
    if len(known) < 2 or pace is None:
        return None
    top, value = known[pace[0]], pace[1]
    others = _median([float(getattr(w, figure)) for w in known.values() if w is not top])
    # Input wait is a % of the step: its extra time is that share of the median step.
    extra_ms = (value - others) * (step_ms / 100.0 if figure == "input_wait_pct" else 1.0)
    if value < ratio * others or extra_ms < STRAGGLER_MIN_SHARE_PCT * step_ms / 100.0:
        return None
    return top, value, others, extra_ms


def find_straggler(workers: Sequence[WorkerSummary]) -> Straggler | None:
    """The worker that holds the synchronous step back, or None within the margins.

    Only workers with measured steps count; with fewer than two there is nothing to
    compare. Input-bound: its median input wait % is >= STRAGGLER_INPUT_RATIO x the
    others' median and the extra wait is >= STRAGGLER_MIN_SHARE_PCT % of the step.
    Slow devices: the same with compute ms (batch in hand to local gradients ready)
    and STRAGGLER_COMPUTE_RATIO; workers that do not report compute_ms are left out of
    that rule. When both rules name someone, the larger extra time per step wins.
    """
    measured = [w for w in workers if w.measured]
    if len(measured) < 2:
        return None
    step_ms = _median([float(w.step_time_ms) for w in measured if w.step_time_ms is not None])
    if step_ms <= 0:
        return None
    found = [
        (cause, hit)
        for cause, figure, ratio in (
            ("input-bound", "input_wait_pct", STRAGGLER_INPUT_RATIO),
            ("slow devices", "compute_ms", STRAGGLER_COMPUTE_RATIO),
        )
        if (hit := _outlier(measured, figure, ratio, step_ms)) is not None
    ]
    if not found:
        return None
    cause, (top, value, others, extra_ms) = max(found, key=lambda pair: pair[1][3])
    return Straggler(top.worker, top.host, cause, value, others, extra_ms)


@dataclass(frozen=True)
class Reading:
    """What one repaint shows: the figures, taken once, and what the advisor makes of them."""

    figures: Figures
    straggler: Straggler | None
    advice: Advice


def reading(state: RunState) -> Reading:
    """The state's figures now, its straggler (a cluster's) and the advice, all from one
    ``RunState.figures()``: every part of the screen that shows a figure reads it here."""
    figures = state.figures()
    straggler, advice = _judge(state, figures,
                               per_worker=len(figures.workers) <= SUMMARY_PAST_WORKERS)
    if state.terminal:  # what was last measured, and what r would do
        advice = after_the_end(advice, str(state.status), command=state.command is not None)
    return Reading(figures, straggler, advice)


def final_verdict(state: RunState, figures: Figures) -> str:
    """The verdict on an attempt over ``figures`` (headless: its summary's), as the
    advice states it, without the dashboard's "(last measured)"."""
    _, advice = _judge(state, figures)
    view = state.command_view()
    if advice.bottleneck == "unwatched" and view is not None and view.note is not None:
        return view.note
    if advice.level == "unknown" and advice.verdict != WAIT_NOT_MEASURED:
        return "no measured steps" + (": it ended while warming up" if state.terminal else "")
    return advice.verdict


def final_worker_verdicts(state: RunState, figures: Figures) -> list[str]:
    """Each measured worker's verdict in a cluster over ``figures``, the straggler's first
    (``WorkerVerdict.line``); [] on one host."""
    _, advice = _judge(state, figures)
    return [worker.line for worker in advice.workers]


def _judge(state: RunState, figures: Figures, per_worker: bool = True
           ) -> tuple[Straggler | None, Advice]:
    """The straggler of the figures' workers and the advice on them, with the current
    attempt's settings and hello."""
    straggler = find_straggler(figures.workers) if figures.workers else None
    current = state.current
    settings = current.settings if current and current.settings else state.settings
    view = state.command_view()
    if view is not None and view.note is not None:
        # A person's own command that sends no step: nothing to judge (the metrics panel
        # says why; headless's verdict is that why, final_verdict).
        return None, Advice("unknown", UNWATCHED_VERDICT, None, [UNWATCHED_ADVICE],
                            bottleneck="unwatched")
    return straggler, advise(figures, settings, state.sample, state.replicas, straggler,
                             hello=current_hello(state), per_worker=per_worker)


def current_hello(state: RunState) -> Hello | None:
    """The current attempt's chief hello (a live change keeps its trainer's), or None."""
    current = state.current
    if current is not None and current.hello is not None:
        return current.hello
    hello = state.hello
    return hello if hello is not None and hello.attempt == state.attempt else None


def after_the_end(advice: Advice, status: str, *, command: bool = False) -> Advice:
    """The advice of a run that has ended (`status`): from its last measured figures, and
    for the attempt that `r` would start from its last checkpoint (a person's own command:
    run again from its start), not for a running one."""
    first = f"the run {status}: r goes on from its last checkpoint, with any setting you change"
    if command:
        first = f"the run {status}: r runs the command again, with any setting you change"
    recommendations = [first, *advice.recommendations][:MAX_RECOMMENDATIONS]
    if advice.bottleneck == "unwatched":
        verdict = advice.verdict
    elif advice.verdict == WAIT_NOT_MEASURED:
        verdict = f"{advice.verdict} (last measured)"
    elif advice.level == "unknown":
        verdict = "no measured steps: it ended while warming up"
    else:
        verdict = f"{advice.verdict} (last measured)"
    return replace(advice, verdict=verdict, recommendations=recommendations)


# Poor scaling (gpuwatch scale): a probe's efficiency, X(N) x b / (N x X(b)), below this at
# some count is poor: at 80 %, a fifth of every added device's work is lost to what grew
# with the count. The part of the step that grew most is named, with its remedies.
POOR_SCALING_EFFICIENCY = 0.80
# What to try when a part of the step grew with the count, with the dashboard's keys.
SCALING_REMEDIES: dict[str, tuple[Remedy, ...]] = {
    "sync": (
        Remedy("the all-reduce grew with the devices: accumulation (a) syncs once per k "
               "micro-steps", "a", ACCUMULATION_KEY),
        Remedy("a bigger per-replica batch (b) does more work per all-reduce", "b", BATCH_KEY),
    ),
    "input": (
        Remedy("the input grew: every replica reads its own batches; prefetch (p) reads the "
               "next ones while a step runs", "p", PREFETCH_KEY),
        Remedy("parallel reads (data.parallel_calls) keep more replicas fed", None,
               "data.parallel_calls"),
    ),
    "compute": (
        Remedy("compute per example grew: the replicas contend for hardware they share "
               "(cores, memory bandwidth, a PCIe switch)"),
    ),
    "update": (
        Remedy("the optimizer update grew: it runs on every replica each step; a bigger "
               "per-replica batch (b) runs it less often per example", "b", BATCH_KEY),
    ),
    "other": (
        Remedy("host work and dispatch grew: more devices to launch each step; "
               "train.steps_per_execution runs several steps per call", None,
               STEPS_PER_EXECUTION_KEY),
    ),
}
SCALING_PART_NAMES = {"input": "input wait", "compute": "compute", "sync": "all-reduce",
                      "update": "optimizer update", "other": "host and dispatch"}


def poor_scaling(rows: Sequence[ScalingRow], plan: Scale) -> Advice | None:
    """A scaling probe's verdict (gpuwatch/scaling.py's rows): level "poor" when a count's
    efficiency is below POOR_SCALING_EFFICIENCY, naming the part of the step that grew most
    from the smallest count to it, with its remedies; "good" otherwise; None with fewer than
    two counts measured.

    A part's growth is its device time per example: share x count / examples/s. Perfect
    scaling keeps each part's constant, in weak and strong scaling alike, and the parts'
    growths add up to what the efficiency lost. Counts whose logical CPU replicas share
    fewer cores are said first: they measure the cores, not scaling.

    A verdict over a probe's counts, not over one attempt's figures: the probe's panel and
    headless output show it beside the current attempt's (``advise``).
    """
    measured = [row for row in rows if row.examples_per_s and row.efficiency is not None]
    if len(measured) < 2:
        return None
    base = measured[0]
    worst = min(measured[1:], key=lambda row: row.efficiency or 0.0)
    efficiency = worst.efficiency or 0.0
    unit = plan.unit
    remedies: list[Remedy] = []
    if any(row.shares_cores for row in measured):
        remedies.append(Remedy(f"{worst.count} {unit} share {plan.cores} cores: not a real "
                               "scaling measure (run it where every replica has its own "
                               "device)"))

    def advice(level: str, verdict: str) -> Advice:
        kept = tuple(remedies[:MAX_RECOMMENDATIONS])
        return Advice(level, verdict, None, [r.text for r in kept], bottleneck="scaling",
                      share_pct=100.0 * efficiency, remedies=kept)

    if efficiency >= POOR_SCALING_EFFICIENCY:
        return advice("good", f"scales well: {efficiency:.0%} efficiency at {worst.count} "
                              f"{unit} (at least {POOR_SCALING_EFFICIENCY:.0%})")
    verdict = (f"poor scaling: {efficiency:.0%} efficiency at {worst.count} {unit} "
               f"(below {POOR_SCALING_EFFICIENCY:.0%})")
    before, after = base.shares, worst.shares
    if before is None or after is None or not base.examples_per_s or not worst.examples_per_s:
        remedies.append(Remedy("the step's parts are not timed apart: which one grew is not "
                               "known"))
        return advice("poor", verdict)

    def device_ms_per_example(shares: dict[str, float], count: int, rate: float,
                              part: str) -> float:
        return shares[part] / 100.0 * count / rate * 1000.0

    growth = {
        part: device_ms_per_example(after, worst.count, worst.examples_per_s, part)
        - device_ms_per_example(before, base.count, base.examples_per_s, part)
        for part in before
    }
    part = max(growth, key=lambda name: growth[name])
    verdict += (f"; {SCALING_PART_NAMES[part]} grew most: {before[part]:.0f}% of the step at "
                f"{base.count} to {after[part]:.0f}% at {worst.count}")
    remedies.extend(SCALING_REMEDIES[part])
    return advice("poor", verdict)
