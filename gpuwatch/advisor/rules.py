"""The rules (pure), each a function of the ``Evidence``, first to speak wins (``RULES``,
``verdict_of``): too large for data parallelism, a part of the step that holds it back,
memory-bound, compute-bound; and each measured worker's verdict in a cluster
(``worker_verdicts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpuwatch.advisor.evidence import JIT_KEY, PRECISION_KEY, Evidence
from gpuwatch.advisor.findings import (
    BOTTLENECKS,
    GRADE_WORDS,
    PART_GRADES,
    Finding,
    Remedy,
    WorkerVerdict,
    holding_part,
    input_bound_level,
    part_level,
    unsure_note,
    vouched_level,
)
from gpuwatch.advisor.remedies import (
    faster_precision,
    input_finding,
    part_remedies,
    relaunch,
    within_memory,
)
from gpuwatch.advisor.straggler import Straggler
from gpuwatch.advisor.units import format_bytes
from gpuwatch.measures import peaks
from gpuwatch.runstate import ACCUMULATION_KEY, BATCH_KEY, WorkerSummary

# Below this many examples per replica per micro-step a GPU's kernels are too thin to
# fill it (our rule of thumb, not a measured bound): a compute-bound verdict says so.
SMALL_PER_REPLICA_BATCH = 32
# Slot variables per weight of the optimizers train.optimizer offers: Keras 3's Adam keeps
# two (first and second moments), plain SGD (no momentum) none.
OPTIMIZER_SLOTS = {"sgd": 0, "adam": 2}


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
    totals = [t for g in ev.gpus if (t := g.mem_total_bytes) is not None and t > 0]
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
    # Its grade is the one its share's interval vouches for (two parts' intervals may
    # overlap: the larger figure still names it, but "highly" is its own interval's word).
    interval = ev.interval(part)
    level = vouched_level(part, interval)
    unsure = unsure_note(part, share, interval)
    runners_up = sorted(((p, float(pct)) for p, pct in shares.items()
                         if p != part and pct is not None and part_level(p, pct) == "high"),
                        key=lambda pair: pair[1], reverse=True)
    others = [first for p, pct in runners_up if (first := part_remedies(ev, p, pct)[1][:1])]
    if part == "input":
        finding = input_finding(ev, level, unsure)
        remedies = list(finding.remedies)
    else:
        grade = f"{GRADE_WORDS[level]} " if level in GRADE_WORDS else ""
        label = f"{grade}{BOTTLENECKS[part]}-bound{ev.named_as}"
        detail, remedies = part_remedies(ev, part, share)
        finding = Finding(BOTTLENECKS[part], level, share, label, detail + unsure, ())
    if part == "input" and not others:
        return finding  # input alone: in the input rule's own words
    merged = remedies[:1] + [r[0] for r in others if r[0] not in remedies] + remedies[1:]
    return replace(finding, remedies=within_memory(ev, merged))


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
    faster = faster_precision(ev)
    if faster is not None:
        remedies.append(relaunch(PRECISION_KEY, faster[0], "half-size activations"))
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
        remedies.append(relaunch(JIT_KEY, "true", "XLA fuses the forward and backward"))
    faster = faster_precision(ev)
    if faster is not None:
        policy, product, ratio = faster
        causes.append("float32")
        precision = peaks.precision_of(policy)
        remedies.append(relaunch(PRECISION_KEY, policy, f"the {product}'s {precision} peak "
                                 f"is {ratio:.0f}x its float32 one"))
    if causes:
        detail += "; low utilisation: " + ", ".join(causes)
    else:
        remedies.append(Remedy("the devices do the step's work: more replicas add throughput"))
    return Finding("compute", "none", share, "compute-bound" + ev.named_as, detail,
                   within_memory(ev, remedies))


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
            found = input_finding(ev, input_bound_level(ev.input_wait_pct))
        if found is not None:
            out.append(WorkerVerdict(summary.worker, summary.host, found, summary.worker == slow))
    return tuple(sorted(out, key=lambda v: (not v.straggler, v.worker)))
