"""Headless mode: follow a run without a dashboard, print progress lines and a summary.

``gpuwatch train CONFIG --headless`` (and ``run``, ``scale``) runs the same supervisor
and trainer as the dashboard; this client prints a progress line every few seconds (the
last 20 steps, and it says so), then the ``summary:`` line (the whole attempt after its
warm-up; all its steps when it had no more, and the line before it says so) and last the
advisor's ``verdict:``. A scaling probe adds its table and a ``scaling:`` line. Rule: the
figures are the ones the dashboard shows (in a cluster, input wait is the worker's that
waits most). A person's own command that sends no step says so before the summary,
and its verdict is why. The lines' fields and the exit codes (0 finished or stopped, 2 refused
settings, 1 crashed or lost, 130 Ctrl-C) are in docs/commands.md and docs/scaling.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from gpuwatch.advisor import (
    VERDICTS,
    final_verdict,
    final_worker_verdicts,
    input_bound_level,
    poor_scaling,
)
from gpuwatch.follow.client import ClientError, ConnectionLost, RunClient
from gpuwatch.measures import scaling
from gpuwatch.runs.folders import RunInfo, read_run_info, workers_in
from gpuwatch.runstate import (
    ATTEMPT_WINDOW,
    CURRENT_STEPS,
    WARMUP_STEPS,
    AttemptSummary,
    Figures,
    RunState,
    printable,
    recent_window,
    share_of_link,
    step_figures,
)
from trainer_runtime.protocol import Breakdown, ProtocolError, Scale, decode, parse_event

PROGRESS_EVERY_S = 3.0
ERROR_TAIL_LINES = 15


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def progress_line(state: RunState) -> str:
    step = state.last_step
    figures = state.figures()  # as the dashboard's: a cluster's input wait is its most
    wait = figures.input_wait_pct
    verdict = VERDICTS[input_bound_level(wait)] if wait is not None else "measuring"
    if figures.input_wait_worker is not None:
        verdict += f", worker {figures.input_wait_worker}"
    shown = f"input wait {_fmt(wait, '.1f')}% ({verdict})"
    view = state.command_view()
    if view is not None and view.note is not None:
        shown = "no step metrics"  # a command that sends none: the summary says why
    elif wait is None and figures.step_time_ms is not None:
        shown = "input wait not measured in this loop"  # a script's: never a figure
    # The figures' window first, as on the dashboard's metrics line: none before a step.
    window = f"{recent_window(figures.steps)}: " if figures.steps else ""
    return (
        f"[{state.run_id or '?'}] attempt {state.attempt} {state.status or 'starting'}"
        f" | step {step.step if step else _done_step(state)}"
        f" | loss {_fmt(step.loss if step else None, '.4f')}"
        f" | {window}{_fmt(figures.examples_per_s, ',.0f')} ex/s"
        f", {_fmt(figures.step_time_ms, '.1f')} ms per step"
        f", {shown}"
    )


def summary_figures(state: RunState) -> tuple[Figures, str]:
    """The attempt's figures the summary gives (examples/s, input wait, the breakdown over
    the same steps as the input wait, the bus bandwidth), and what they were measured over.

    The link, the workers and the straggler are the current figures' (``RunState.figures``).
    """
    now = state.figures()
    current = state.current
    if current is not None and current.measured:
        rate = current.median_examples_per_s
        _, tflops, mfu = state.flops_figures(rate)
        figures = Figures(
            examples_per_s=rate, input_wait_pct=current.input_wait_pct,
            input_wait_worker=current.input_wait_worker,
            grad_sync_bytes_per_s=current.grad_sync_bytes_per_s, workers=now.workers,
            tflops=tflops, mfu_pct=mfu, breakdown=current.input_breakdown,
            bus_bytes_per_s=current.bus_bytes_per_s, link=now.link,
            bus_pct_of_link=share_of_link(current.bus_bytes_per_s, now.link),
            steps=current.measured_steps, share_intervals=_attempt_intervals(current))
        return figures, (f"its {current.measured_steps:,} steps after the first "
                         f"{WARMUP_STEPS} (warm-up)")
    # Too short to leave warm-up out: what it did measure, said so.
    points = [p for p in state.window if p.event.attempt == state.attempt
              and p.event.worker == 0 and p.event.step_time_ms > 0]
    if not points:
        return Figures(workers=now.workers, link=now.link), "no step with a time"
    steps = step_figures(points)  # the median the dashboard shows over the same steps
    _, tflops, mfu = state.flops_figures(steps.examples_per_s)
    figures = replace(steps, workers=now.workers, tflops=tflops,
                      mfu_pct=mfu, link=now.link,
                      bus_pct_of_link=share_of_link(steps.bus_bytes_per_s, now.link))
    steps_word = "step" if len(points) == 1 else "steps"
    return figures, (f"all its {len(points)} {steps_word}, warm-up included "
                     "(too few to leave it out)")


def _attempt_intervals(summary: AttemptSummary) -> dict[str, tuple[float, float] | None] | None:
    """The attempt's shares' intervals over all its measured steps (its ``share_sums``). A
    cluster's input wait is the worker's that waits most, whose steps are another's: no
    interval of the chief's stands for it, and that share is graded on its figure."""
    intervals = {part: sums.interval() for part, sums in summary.share_sums.items()}
    if summary.input_wait_worker is not None:
        intervals.pop("input", None)
    return intervals or None


def summary_window(state: RunState) -> tuple[float | None, float | None, str]:
    """The attempt's examples/s and input wait %, and what they were measured over."""
    figures, window = summary_figures(state)
    return figures.examples_per_s, figures.input_wait_pct, window


def part_shares(breakdown: Breakdown | None, input_wait_pct: float | None) -> dict[str, str]:
    """The summary's compute/sync/update/other shares, one decimal each, of what the input
    wait as printed leaves (the breakdown is of the same steps: that is its rounding),
    rounded together (largest remainder) so that the five add to 100.0; 'n/a' each
    without a breakdown or an input wait."""
    parts = [part for part in Breakdown.PARTS if part != "input"]
    if breakdown is None or input_wait_pct is None:
        return {part: "n/a" for part in parts}
    shares = {part: breakdown.pct(part) for part in parts}
    total = sum(shares.values())
    if total <= 0:
        return {part: "0.0" for part in parts}
    left = max(0, 1000 - round(float(format(input_wait_pct, ".1f")) * 10))  # in tenths
    exact = {part: shares[part] * left / total for part in parts}
    tenths = {part: int(value) for part, value in exact.items()}
    by_remainder = sorted(parts, key=lambda part: exact[part] - tenths[part], reverse=True)
    for part in by_remainder[: left - sum(tenths.values())]:
        tenths[part] += 1
    return {part: f"{tenths[part] / 10:.1f}" for part in parts}


def summary_line(state: RunState, workers: int = 1) -> str:
    """The summary: its input wait 'not_measured' where steps were measured without one (a
    script's loop, gpuwatch run), n/a where no step was; a command's replicas n/a until its
    hook says them."""
    figures, _ = summary_figures(state)
    rate, wait = figures.examples_per_s, figures.input_wait_pct
    steps = state.last_step.step if state.last_step else 0
    flops = state.flops_per_example
    shares = part_shares(figures.breakdown, wait)
    bus = figures.bus_bytes_per_s
    shown_wait = _fmt(wait, ".1f")
    if wait is None and (rate is not None or figures.step_time_ms is not None):
        shown_wait = "not_measured"
    replicas = "n/a" if state.command is not None and state.hello is None else state.replicas
    return (
        f"summary: steps={steps} examples_per_s={_fmt(rate, '.1f')} "
        f"input_wait_pct={shown_wait} compute_pct={shares['compute']} "
        f"sync_pct={shares['sync']} update_pct={shares['update']} "
        f"other_pct={shares['other']} replicas={replicas} attempt={state.attempt} "
        f"workers={workers} flops_per_example={_fmt(flops, '.3e')} "
        f"tflops={_fmt(figures.tflops, '.3g')}"
        + (f" mfu_pct={figures.mfu_pct:.3g}" if figures.mfu_pct is not None else "")
        + f" bus_bytes_per_s={_fmt(bus, '.3e')}"
    )


def worker_verdict_lines(state: RunState) -> list[str]:
    """'gpuwatch: worker 1 (host-b): ...': every measured worker's verdict in a cluster over
    the summary's figures, the straggler's first; none on one host."""
    figures, _ = summary_figures(state)
    return [f"gpuwatch: {line}" for line in final_worker_verdicts(state, figures)]


def verdict_line(state: RunState) -> str:
    """'verdict: ...': the advisor's verdict on the summary's figures (headless's last line)."""
    figures, _ = summary_figures(state)
    return f"verdict: {final_verdict(state, figures)}"


def workers_of(events: list[dict[str, Any]], workers: int = 1) -> int:
    """The workers the latest run or attempt event in `events` asks for (else `workers`)."""
    for event in events:
        if event.get("type") in ("run", "attempt"):
            settings = event.get("settings")
            workers = workers_in(settings if isinstance(settings, dict) else None)
    return workers


def round_lines(events: list[dict[str, Any]]) -> list[str]:
    """'gpuwatch: not enough steps to tell (...); round 2 of 3: ...' for each later round
    of a scaling probe that begins in `events`."""
    lines = []
    for frame in events:
        if frame.get("type") != Scale.TYPE:
            continue
        try:
            _, plan = parse_event(frame)
        except ProtocolError:
            continue
        words = scaling.round_words(plan) if isinstance(plan, Scale) else None
        if words is not None:
            lines.append(f"gpuwatch: {printable(words)}")
    return lines


def recorded_state(run_dir: Path) -> RunState:
    """The run folded from its record (events.jsonl), as a dashboard folds it."""
    state = RunState()
    try:
        with open(run_dir / "events.jsonl", "rb") as fh:
            for line in fh:
                try:
                    state.apply(decode(line))
                except ProtocolError:
                    continue  # a torn last line, or a record this version does not know
    except OSError:
        pass
    return state


Ending = Callable[[RunInfo, RunState, int, bool, TextIO, TextIO], int]


async def follow(
    info: RunInfo,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    *,
    after_attempt: int = 0,
    ended: Ending | None = None,
) -> int:
    """Follow the run until an attempt after `after_attempt` ends (a resume's: the one it
    started; the record's earlier attempts ended long ago), then print its end with
    `ended` (default: the summary of a training run)."""
    ended = ended or _ended
    assert info.socket_path is not None
    state = RunState()
    workers = 1  # from the recorded settings: RunState does not count workers
    client = RunClient(info.socket_path)
    stopping = False
    loop = asyncio.get_running_loop()
    stop_tasks: list[asyncio.Task[None]] = []

    async def stop_run() -> None:
        with contextlib.suppress(ClientError, TimeoutError):
            await client.command("stop", timeout_s=120.0)

    def on_interrupt() -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            print(f"gpuwatch: stopping run {info.run_id} (the trainer checkpoints first)", file=err)
            stop_tasks.append(loop.create_task(stop_run()))

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    loop.add_signal_handler(signal.SIGTERM, on_interrupt)
    try:
        await client.connect()
        await client.subscribe(0)
        print(f"gpuwatch: run {info.run_id} started; following it headless", file=out, flush=True)
        last_print = time.monotonic()
        while True:
            try:
                batch = await asyncio.wait_for(client.next_batch(), PROGRESS_EVERY_S)
            except TimeoutError:
                batch = []
            state.apply_many(batch)
            workers = workers_of(batch, workers)
            for line in round_lines(batch):
                print(line, file=out, flush=True)
            if state.terminal and state.attempt > after_attempt:
                break
            if time.monotonic() - last_print >= PROGRESS_EVERY_S:
                print(progress_line(state), file=out, flush=True)
                last_print = time.monotonic()
    except ConnectionLost as exc:
        # Its supervisor exits once the run has ended and nobody follows it: if that
        # happened before we could follow it, the record has the end.
        record = recorded_state(info.run_dir)
        if record.terminal and record.attempt > after_attempt:
            return ended(info, record, read_run_info(info.run_dir).workers, stopping, out, err)
        print(progress_line(state), file=out, flush=True)
        print(f"gpuwatch: lost the run's supervisor: {exc}", file=err)
        print(summary_line(state, workers), file=out, flush=True)
        print(verdict_line(state), file=out, flush=True)
        return 1
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        await client.close()
    return ended(info, state, workers, stopping, out, err)


def _ended(
    info: RunInfo, state: RunState, workers: int, stopping: bool, out: TextIO, err: TextIO
) -> int:
    """The last progress line, the summary and the exit code of an ended run."""
    print(progress_line(state), file=out, flush=True)
    _, _, window = summary_window(state)
    view = state.command_view()
    if view is not None and view.note is not None:  # a command that sent no step
        print(f"gpuwatch: {view.note}: its processes and devices were sampled, no step "
              "figures came", file=out, flush=True)
    else:
        print(f"gpuwatch: attempt {state.attempt}'s figures over {window}; a progress line's "
              f"are its {recent_window(CURRENT_STEPS)}", file=out, flush=True)
    if view is not None and view.input_wait is not None:
        print(f"gpuwatch: {view.input_wait}", file=out, flush=True)
    for line in worker_verdict_lines(state):
        print(line, file=out, flush=True)
    print(summary_line(state, workers), file=out, flush=True)
    print(verdict_line(state), file=out, flush=True)
    return _exit_code(info, state, stopping, err)


def _done_step(state: RunState) -> int:
    """The step the current attempt ended at, from its done frame (no step frames came:
    telemetry.enabled: false), else 0."""
    done = state.done
    return done.step if done is not None and done.attempt == state.attempt else 0


def _exit_code(info: RunInfo, state: RunState, stopping: bool, err: TextIO) -> int:
    """The exit code of an ended run, after a line on `err` saying why it failed if it did."""
    error = state.error
    if (
        state.status == "crashed"
        and state.exit_code == 2
        and error is not None
        and error.kind in ("config", "factory")
    ):
        # The trainer refused its settings before training: that is bad input, exit 2.
        print(f"gpuwatch: {printable(error.message)}", file=err)
        return 2
    if state.status == "crashed":
        what = "the command" if state.command is not None else "the trainer"
        print(f"gpuwatch: {what} crashed: {printable(state.status_message or '')}", file=err)
        for line in state.log_tail[-ERROR_TAIL_LINES:]:
            print(f"  | {printable(line)}", file=err)
        print(f"gpuwatch: full log: gpuwatch logs {info.run_id}", file=err)
        return 1
    if stopping:
        return 130
    return 0


def scale_ended(
    info: RunInfo, state: RunState, workers: int, stopping: bool, out: TextIO, err: TextIO
) -> int:
    """A scaling probe's end: its table, the advisor's word, then the `scaling:` line last."""
    plan = state.scale
    print(progress_line(state), file=out, flush=True)
    if plan is None:  # not a probe after all (its record lacks the plan): a run's end
        return _ended(info, state, workers, stopping, out, err)
    rows = scaling.scaling_rows(state)
    print(f"gpuwatch: {scaling.describe(plan)}; ex/s: each count's {ATTEMPT_WINDOW} median",
          file=out)
    for line in scaling.table_lines(plan, rows):
        print(line, file=out)
    verdict = poor_scaling(rows, plan)
    if verdict is not None:
        print(f"gpuwatch: {verdict.verdict}", file=out)
        for remedy in verdict.recommendations:
            print(f"  - {remedy}", file=out)
    code = _exit_code(info, state, stopping, err)
    failed = scaling.probe_failed(rows, state)
    if failed is not None:
        print(f"gpuwatch: the probe did not measure {failed.count} {plan.unit}: "
              f"{failed.state}{f' ({state.status_message})' if state.status_message else ''}",
              file=err, flush=True)
        code = code or 1
    print(scaling.scaling_line(plan, rows), file=out, flush=True)
    return code


def run_headless(info: RunInfo, after_attempt: int = 0, ended: Ending | None = None) -> int:
    return asyncio.run(follow(info, after_attempt=after_attempt, ended=ended))
