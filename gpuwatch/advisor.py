"""Advisor: a window of steps (+ settings, device sample) -> input-bound verdict and advice.

Plain Python, no Textual. The verdict uses TF Profiler's thresholds
(openxla/xprof ``op_stats_to_input_pipeline_analysis.cc``): input wait / step
time >= 20 % is "highly input-bound", >= 5 % "moderately input-bound", else
"not input-bound". Recommendations name the dashboard key that acts on them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.runstate import StepPoint, get_setting
from gpuwatch.runstate import steps_input_wait_pct as input_wait_pct  # the rule's one home
from trainer_runtime.schema import prefetch_enabled

HIGH_INPUT_BOUND_PCT = 20.0
MODERATE_INPUT_BOUND_PCT = 5.0
LOW_GPU_UTIL_PCT = 50.0
HIGH_GPU_MEM_FRACTION = 0.90
MAX_RECOMMENDATIONS = 3


@dataclass(frozen=True)
class Advice:
    """What the numbers say: a level, a one-line verdict, and 0-3 things to try."""

    level: str  # "high" | "moderate" | "none" | "unknown"
    verdict: str
    input_wait_pct: float | None
    recommendations: list[str] = field(default_factory=list)


def input_bound_level(input_wait_pct: float | None) -> str:
    """'high' (>= 20 %), 'moderate' (>= 5 %), 'none', or 'unknown' without data."""
    if input_wait_pct is None:
        return "unknown"
    if input_wait_pct >= HIGH_INPUT_BOUND_PCT:
        return "high"
    if input_wait_pct >= MODERATE_INPUT_BOUND_PCT:
        return "moderate"
    return "none"


VERDICTS = {
    "high": "highly input-bound",
    "moderate": "moderately input-bound",
    "none": "not input-bound",
    "unknown": "no measured steps yet (warming up)",
}


def format_rate(bytes_per_s: float | None) -> str:
    """Bytes per second in decimal multiples: '512 B/s', '3.4 MB/s', '12.0 GB/s'."""
    if bytes_per_s is None:
        return "n/a"
    value = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(value) < 1000.0 or unit == "GB/s":
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.1f} {unit}"
        value /= 1000.0
    return f"{value:.1f} TB/s"  # pragma: no cover - loop returns at GB/s


def advise(
    steps: Sequence[StepPoint],
    settings: Mapping[str, Any],
    sample: Mapping[str, Any] | None = None,
    replicas: int = 1,
) -> Advice:
    """Verdict and up to three recommendations for the steps of the current attempt."""
    pct = input_wait_pct(steps)
    level = input_bound_level(pct)
    verdict = VERDICTS[level]
    if pct is not None:
        verdict = f"{verdict}: {pct:.1f}% of step time waiting for input"
    recs: list[str] = []

    prefetch_on = prefetch_enabled(get_setting(settings, "data.prefetch"))
    parallel = get_setting(settings, "data.parallel_calls")
    accumulation = get_setting(settings, "train.accumulation_steps") or 1
    gpus = [g for g in (sample or {}).get("gpus") or [] if not g.get("lost")]

    if level in ("high", "moderate"):
        if not prefetch_on:
            recs.append("turn prefetch on (p): read the next batch while this step runs")
        if parallel == 1:
            recs.append("raise data.parallel_calls (now 1: reads run one at a time), e.g. autotune")
        if prefetch_on and parallel != 1:
            recs.append("prefetch and parallel reads on: try data.cache or cheaper reads/decoding")
        utils = [g["util_gpu_pct"] for g in gpus if g.get("util_gpu_pct") is not None]
        if utils and sum(utils) / len(utils) < LOW_GPU_UTIL_PCT:
            recs.append(
                f"GPUs only {sum(utils) / len(utils):.0f}% busy while waiting: "
                "the input pipeline is the limit"
            )
    elif level == "none":
        utils = [g["util_gpu_pct"] for g in gpus if g.get("util_gpu_pct") is not None]
        if utils and sum(utils) / len(utils) < LOW_GPU_UTIL_PCT:
            recs.append(
                f"GPUs only {sum(utils) / len(utils):.0f}% busy, not waiting on input: "
                "a larger batch (b) adds work"
            )
        else:
            recs.append("the input keeps up: step time is compute (and gradient sync)")

    total_ms = sum(s.step_time_ms for s in steps)
    if replicas > 1 and total_ms > 0:
        sync_per_s = sum(s.grad_sync_bytes for s in steps) * 1000.0 / total_ms
        if sync_per_s > 0:
            if accumulation == 1:
                recs.append(
                    f"gradient sync est. {format_rate(sync_per_s)}: accumulation (a) "
                    "syncs once per k micro-steps"
                )
            else:
                recs.append(
                    f"gradient sync est. {format_rate(sync_per_s)}, "
                    f"one all-reduce per {accumulation} micro-steps"
                )

    for gpu in gpus:
        used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
        if used is not None and total and used / total >= HIGH_GPU_MEM_FRACTION:
            recs.append(
                f"GPU {gpu.get('index')} memory {100 * used / total:.0f}% full: "
                "a larger batch (b) may not fit"
            )
            break

    return Advice(level, verdict, pct, recs[:MAX_RECOMMENDATIONS])
