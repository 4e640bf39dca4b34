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
   neither). A grade is given only where the share's interval over its steps is wholly
   above it (``vouched_level``); across it the verdict says the interval instead.
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
Its parts, each a module here (this one only re-exports their names; each imports the
ones below it directly, never through this package):

- ``verdict``: ``advise``, ``reading``, headless's ``final_verdict`` and
  ``final_worker_verdicts``, ``after_the_end``; the verdict on input wait alone.
- ``scaling_verdict``: ``poor_scaling``, a scaling probe's verdict.
- ``rules``: the ``RULES`` and ``verdict_of``, each worker's verdict (``worker_verdicts``).
- ``remedies``: what the findings say, and what to try for each part of the step.
- ``straggler``: the straggler rule (``find_straggler``).
- ``evidence``: what the rules read (``Evidence``).
- ``findings``: the grades, levels and shapes (``Finding``, ``Advice``, ``Remedy``), and
  the rule for a verdict on a noisy figure (``interval_side``).
- ``units``: bytes and rates in decimal units (``format_rate``, ``format_bandwidth``).
"""

from gpuwatch.advisor.evidence import (
    CROSS_DEVICE_OPS_KEY,
    JIT_KEY,
    PRECISION_KEY,
    STEPS_PER_EXECUTION_KEY,
    Evidence,
    run_gpus,
)
from gpuwatch.advisor.findings import (
    BOTTLENECKS,
    HIGH_GPU_MEM_FRACTION,
    HIGH_HOST_PCT,
    HIGH_INPUT_BOUND_PCT,
    HIGH_SYNC_PCT,
    HIGH_UPDATE_PCT,
    LEVELS,
    LOW_GPU_UTIL_PCT,
    MAX_RECOMMENDATIONS,
    MODERATE_HOST_PCT,
    MODERATE_INPUT_BOUND_PCT,
    MODERATE_SYNC_PCT,
    MODERATE_UPDATE_PCT,
    PART_GRADES,
    VERDICTS,
    Advice,
    Finding,
    Remedy,
    WorkerVerdict,
    holding_part,
    input_bound_level,
    interval_side,
    part_level,
)
from gpuwatch.advisor.rules import (
    OPTIMIZER_SLOTS,
    RULES,
    SMALL_PER_REPLICA_BATCH,
    compute_bound,
    memory_bound,
    model_state_bytes,
    step_bottleneck,
    too_large_for_data_parallelism,
    verdict_of,
    worker_verdicts,
)
from gpuwatch.advisor.scaling_verdict import (
    POOR_SCALING_EFFICIENCY,
    SCALING_PART_NAMES,
    SCALING_REMEDIES,
    poor_scaling,
)
from gpuwatch.advisor.straggler import (
    STRAGGLER_COMPUTE_RATIO,
    STRAGGLER_INPUT_RATIO,
    STRAGGLER_MIN_SHARE_PCT,
    Straggler,
    find_straggler,
)
from gpuwatch.advisor.units import format_bandwidth, format_bytes, format_rate
from gpuwatch.advisor.verdict import (
    COMMAND_KEYS,
    UNWATCHED_ADVICE,
    UNWATCHED_VERDICT,
    WAIT_NOT_MEASURED,
    Reading,
    advise,
    after_the_end,
    current_hello,
    final_verdict,
    final_worker_verdicts,
    reading,
)

__all__ = [
    "BOTTLENECKS",
    "COMMAND_KEYS",
    "CROSS_DEVICE_OPS_KEY",
    "HIGH_GPU_MEM_FRACTION",
    "HIGH_HOST_PCT",
    "HIGH_INPUT_BOUND_PCT",
    "HIGH_SYNC_PCT",
    "HIGH_UPDATE_PCT",
    "JIT_KEY",
    "LEVELS",
    "LOW_GPU_UTIL_PCT",
    "MAX_RECOMMENDATIONS",
    "MODERATE_HOST_PCT",
    "MODERATE_INPUT_BOUND_PCT",
    "MODERATE_SYNC_PCT",
    "MODERATE_UPDATE_PCT",
    "OPTIMIZER_SLOTS",
    "PART_GRADES",
    "POOR_SCALING_EFFICIENCY",
    "PRECISION_KEY",
    "RULES",
    "SCALING_PART_NAMES",
    "SCALING_REMEDIES",
    "SMALL_PER_REPLICA_BATCH",
    "STEPS_PER_EXECUTION_KEY",
    "STRAGGLER_COMPUTE_RATIO",
    "STRAGGLER_INPUT_RATIO",
    "STRAGGLER_MIN_SHARE_PCT",
    "UNWATCHED_ADVICE",
    "UNWATCHED_VERDICT",
    "VERDICTS",
    "WAIT_NOT_MEASURED",
    "Advice",
    "Evidence",
    "Finding",
    "Reading",
    "Remedy",
    "Straggler",
    "WorkerVerdict",
    "advise",
    "after_the_end",
    "compute_bound",
    "current_hello",
    "final_verdict",
    "final_worker_verdicts",
    "find_straggler",
    "format_bandwidth",
    "format_bytes",
    "format_rate",
    "holding_part",
    "input_bound_level",
    "interval_side",
    "memory_bound",
    "model_state_bytes",
    "part_level",
    "poor_scaling",
    "reading",
    "run_gpus",
    "step_bottleneck",
    "too_large_for_data_parallelism",
    "verdict_of",
    "worker_verdicts",
]
