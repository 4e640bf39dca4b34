"""What the findings say, and the remedies (pure).

The input verdict's words (``input_finding``) and, for each part of the step that holds
it back, what to try (``part_remedies``), each with the dashboard key that does it where
one does; a setting no key changes is a relaunch with it (``relaunch``); with a GPU's
memory nearly full, no bigger batch (``within_memory``).
"""

from __future__ import annotations

from gpuwatch.advisor.evidence import (
    CROSS_DEVICE_OPS_KEY,
    PRECISION_KEY,
    STEPS_PER_EXECUTION_KEY,
    Evidence,
    mean_util,
)
from gpuwatch.advisor.findings import LOW_GPU_UTIL_PCT, VERDICTS, Finding, Remedy
from gpuwatch.advisor.units import format_bandwidth
from gpuwatch.measures import peaks
from gpuwatch.measures.breakdown import link_share_text
from gpuwatch.runstate import ACCUMULATION_KEY, BATCH_KEY, PREFETCH_KEY
from trainer_runtime.schema import prefetch_enabled


def part_remedies(ev: Evidence, part: str, share: float) -> tuple[str, list[Remedy]]:
    """(detail, remedies) of one part of the step that holds it back."""
    if part == "input":
        return "", input_remedies(ev)
    if part == "sync":
        return _communication(ev, share)
    if part == "update":
        return (f"optimizer update {share:.0f}% of {ev.step}",
                [_accumulation(ev, "one optimizer update per k micro-steps"),
                 Remedy("a bigger batch (b): more examples per update", "b", BATCH_KEY)])
    remedies = [Remedy("a bigger batch (b): the same host work over more examples", "b",
                       BATCH_KEY)]
    if ev.setting(STEPS_PER_EXECUTION_KEY) == 1:
        remedies.insert(0, relaunch(STEPS_PER_EXECUTION_KEY, "8", "several updates per "
                                    "call, fewer host round trips"))
    return f"{share:.0f}% of {ev.step} outside its measured parts (host work, dispatch)", remedies


def input_finding(ev: Evidence, level: str, unsure: str = "") -> Finding:
    """'highly input-bound: 38.0% of step time waiting for input' (in a cluster '... on
    worker 1: 38.0% of its step time ...'). `unsure`: what the share's interval could not
    tell (``unsure_note``), after the figure; with level "none" the input still holds the
    step back by its figure, ungraded: 'input-bound: 6.0% of ... (3-9%; moderately ...)'."""
    pct = ev.input_wait_pct if ev.input_wait_pct is not None else ev.share("input") or 0.0
    whose = ev.input_worker if ev.worker is None else ev.worker
    named = whose is not None and (ev.worker is None or ev.named)
    words = "input-bound" if level == "none" and unsure else VERDICTS[level]
    label = words + (f" on worker {whose}" if named else "")
    detail = (f"{pct:.1f}% of {'its ' if whose is not None else ''}step time waiting for "
              f"input{unsure}")
    holds = level in ("high", "moderate") or bool(unsure)
    remedies = tuple(input_remedies(ev)) if holds else ()
    return Finding("input", level, pct, label, detail, remedies)


def input_remedies(ev: Evidence) -> list[Remedy]:
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
    util = mean_util(ev.gpus)
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
        remedies.append(relaunch(CROSS_DEVICE_OPS_KEY, "nccl",
                                 f"now {ops}; NCCL all-reduces GPU to GPU"))
    return detail, remedies


def _accumulation(ev: Evidence, why: str) -> Remedy:
    now = ev.accumulation
    text = (f"accumulation (a): {why}" if now == 1
            else f"more accumulation (a): {why} (now {now})")
    return Remedy(text, "a", ACCUMULATION_KEY)


def relaunch(dotted: str, value: str, why: str) -> Remedy:
    """A setting no key changes: a relaunch with it (``--set`` on train or resume)."""
    return Remedy(f"set {dotted}={value} (relaunch): {why}", None, dotted)


def within_memory(ev: Evidence, remedies: list[Remedy]) -> tuple[Remedy, ...]:
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


def faster_precision(ev: Evidence) -> tuple[str, str, float] | None:
    """(policy, GPU, speed-up) where the run computes in float32 and every one of its GPUs
    has a faster peak in bfloat16 (preferred: no loss scaling) or float16; else None."""
    if peaks.precision_of(ev.setting(PRECISION_KEY)) != "float32" or not ev.gpus:
        return None
    found = [peaks.find_peak(g.name) for g in ev.gpus]
    if any(p is None for p in found):
        return None
    rows = [p for p in found if p is not None]
    for policy, precision in (("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")):
        ratios = [(fast / slow) for p in rows
                  if (fast := p.tflops(precision)) and (slow := p.tflops("float32"))]
        if len(ratios) == len(rows) and min(ratios) > 1.0:
            return policy, rows[0].product, min(ratios)
    return None
