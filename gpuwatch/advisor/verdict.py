"""The advice (pure): ``advise`` makes it of the current figures; ``reading`` is what one
repaint of the dashboard shows (the state's figures, taken once, with the straggler and
the advice made from them); ``final_verdict`` and ``final_worker_verdicts`` are
headless's words on an attempt; ``after_the_end`` is the advice of a run that has ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuwatch.advisor.evidence import Evidence, mean_util
from gpuwatch.advisor.findings import (
    LOW_GPU_UTIL_PCT,
    MAX_RECOMMENDATIONS,
    VERDICTS,
    Advice,
    Remedy,
    input_bound_level,
    unsure_note,
    vouched_level,
)
from gpuwatch.advisor.remedies import input_finding, input_remedies
from gpuwatch.advisor.rules import verdict_of, worker_verdicts
from gpuwatch.advisor.straggler import Straggler, find_straggler, straggler_text
from gpuwatch.advisor.units import format_rate
from gpuwatch.runstate import ACCUMULATION_KEY, Figures, HostReading, RunState, get_setting
from trainer_runtime.protocol import SUMMARY_PAST_WORKERS, Hello

# Steps measured, but none with an input wait (a script's loop may not let the hook time
# it: gpuwatch run): no input verdict can be made from a wait that was not measured.
WAIT_NOT_MEASURED = "input wait not measured in this loop: no verdict on input"
# An attempt whose trainer sends no step frames (telemetry.enabled: false, a bench's knob).
TELEMETRY_OFF = "telemetry was off (telemetry.enabled: false): no step figures to judge"


def telemetry_off(state: RunState) -> bool:
    """Whether the current attempt ran with its step frames turned off."""
    current = state.current
    settings = current.settings if current is not None and current.settings else state.settings
    return get_setting(settings, "telemetry.enabled") is False
# The dashboard's keys a person's own command takes (gpuwatch run): prefetch, which its
# hook applies. Its batch, accumulation and other settings are its own code's.
COMMAND_KEYS = frozenset({"p"})
UNWATCHED_VERDICT = "watched from outside: device sampling only"
UNWATCHED_ADVICE = "its processes and their GPUs are sampled; steps come from a TF hook"


def advise(
    figures: Figures,
    settings: Mapping[str, Any],
    sample: HostReading | None = None,
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
    recs = ([straggler_text(straggler)] if straggler is not None else [])
    recs += [remedy.text for remedy in found.remedies]
    # A cluster's screen also lists its workers and names the straggler: two lines here.
    most = MAX_RECOMMENDATIONS if straggler is None else min(2, MAX_RECOMMENDATIONS)
    return Advice(found.level, found.verdict, figures.input_wait_pct, recs[:most],
                  bottleneck=found.kind, share_pct=found.share_pct, remedies=found.remedies,
                  workers=workers)


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
    unsure = ""
    if pct is not None:  # its grade is the one its interval vouches for
        interval = run.interval("input")
        level, unsure = vouched_level("input", interval), unsure_note("input", pct, interval)
    verdict = VERDICTS[level] if pct is None else input_finding(run, level, unsure).verdict
    if pct is None and (figures.examples_per_s is not None or figures.step_time_ms is not None):
        verdict = WAIT_NOT_MEASURED
    recs: list[str] = [straggler_text(straggler)] if straggler is not None else []
    util = mean_util(run.gpus)
    holds = level in ("high", "moderate") or bool(unsure)  # unsure: by its figure
    remedies = tuple(input_remedies(run)) if holds else ()
    if run.command:
        remedies = _for_command(remedies)
    recs += [remedy.text for remedy in remedies]
    if run.command:  # a script's batch and accumulation are its own: no key to suggest
        full = run.fullest_gpu
        if full is not None:
            recs.append(f"GPU {full[0]} memory {full[1]:.0f}% full")
        bottleneck = "input" if holds else level
        return Advice(level, verdict, pct, recs[:MAX_RECOMMENDATIONS], bottleneck=bottleneck,
                      share_pct=pct, remedies=remedies)
    if level == "none" and not unsure:
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
    bottleneck = "input" if holds else level
    return Advice(level, verdict, pct, recs[:most], bottleneck=bottleneck, share_pct=pct,
                  remedies=remedies)


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
        if telemetry_off(state):
            return TELEMETRY_OFF
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
