"""Headless mode: follow a run without a dashboard, print progress lines and a summary.

`gpuwatch train CONFIG --headless [--max-steps N]` runs the same supervisor and
trainer as the dashboard; this client prints a line every few seconds and,
when the run ends, one line that says what the summary measured, then
`summary: steps=N examples_per_s=X input_wait_pct=Y replicas=R attempt=A workers=W
flops_per_example=F tflops=T mfu_pct=M` (one line; W: a cluster's workers, 1 on one
host; F: one example's forward and backward FLOPs as the trainer counted them in its
graph; T: achieved TFLOP/s, F x X / 1e12; M: T over the replicas' GPUs' dense peak, only
where that peak is known, gpuwatch/peaks.py; n/a: a figure not known). A progress
line's figures are the last 20 steps; the summary's are the whole attempt after its
warm-up steps (the median examples/s, the summed input wait over the summed step time),
or, for an attempt too short to have any after warm-up, all its steps, and the line
before it says so. In a cluster the input wait is the worker's that waits most (every
step waits for it), as on the dashboard and in its attempts table; the progress line
names the worker.

Exit codes: 0 when the run finished or was stopped (`gpuwatch stop`, the dashboard),
2 when the trainer refused its settings (a bad config or factory), 1 when the trainer
crashed or the supervisor was lost (with the tail of the error), 130 when Ctrl-C
stopped it (the shell's code for an interrupt; the trainer checkpoints first).

A scaling probe (`gpuwatch scale CONFIG --headless`) prints the same progress lines while
its attempts run, then its table (gpuwatch/scaling.py: a row per count), the advisor's
word on how it scaled, and last the line `scaling: replicas=1,2 examples_per_s=A,B
speedup=1.00,S efficiency=1.00,E mode=weak` (workers= for a cluster; n/a for a count
not measured). It exits 0 when every count was measured, else as above (a count that
crashed: 1; one stopped: 1, or 130 for Ctrl-C), after a line naming the count.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpuwatch import scaling
from gpuwatch.advisor import VERDICTS, input_bound_level, poor_scaling
from gpuwatch.client import ClientError, ConnectionLost, RunClient
from gpuwatch.runs import RunInfo, read_run_info, workers_in
from gpuwatch.runstate import CURRENT_STEPS, WARMUP_STEPS, RunState, steps_input_wait_pct
from trainer_runtime.protocol import ProtocolError, decode

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
    return (
        f"[{state.run_id or '?'}] attempt {state.attempt} {state.status or 'starting'}"
        f" | step {step.step if step else 0}"
        f" | loss {_fmt(step.loss if step else None, '.4f')}"
        f" | {_fmt(figures.examples_per_s, ',.0f')} ex/s"
        f" | step {_fmt(figures.step_time_ms, '.1f')} ms"
        f" | input wait {_fmt(wait, '.1f')}% ({verdict})"
    )


def summary_window(state: RunState) -> tuple[float | None, float | None, str]:
    """The attempt's examples/s and input wait %, and what they were measured over."""
    current = state.current
    if current is not None and current.measured:
        return (current.median_examples_per_s, current.input_wait_pct,
                f"its {current.measured_steps:,} steps after the first {WARMUP_STEPS} "
                "(warm-up)")
    # Too short to leave warm-up out: what it did measure, said so.
    points = [p for p in state.window if p.event.attempt == state.attempt
              and p.event.worker == 0 and p.event.step_time_ms > 0]
    if not points:
        return None, None, "no step with a time"
    rates = sorted(r for p in points if (r := p.event.examples_per_s) is not None)
    rate = rates[len(rates) // 2] if rates else None
    wait = steps_input_wait_pct(points)
    return rate, wait, f"all its {len(points)} steps, warm-up included (too few to leave it out)"


def summary_line(state: RunState, workers: int = 1) -> str:
    rate, wait, _ = summary_window(state)
    steps = state.last_step.step if state.last_step else 0
    flops, tflops, mfu = state.flops_figures(rate)
    return (
        f"summary: steps={steps} examples_per_s={_fmt(rate, '.1f')} "
        f"input_wait_pct={_fmt(wait, '.1f')} replicas={state.replicas} attempt={state.attempt} "
        f"workers={workers} flops_per_example={_fmt(flops, '.3e')} tflops={_fmt(tflops, '.3g')}"
        + (f" mfu_pct={mfu:.3g}" if mfu is not None else "")
    )


def workers_of(events: list[dict[str, Any]], workers: int = 1) -> int:
    """The workers the latest run or attempt event in `events` asks for (else `workers`)."""
    for event in events:
        if event.get("type") in ("run", "attempt"):
            settings = event.get("settings")
            workers = workers_in(settings if isinstance(settings, dict) else None)
    return workers


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
    print(f"gpuwatch: attempt {state.attempt}'s figures over {window}; a progress line's are "
          f"its last {CURRENT_STEPS} steps", file=out, flush=True)
    print(summary_line(state, workers), file=out, flush=True)
    return _exit_code(info, state, stopping, err)


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
        print(f"gpuwatch: {error.message}", file=err)
        return 2
    if state.status == "crashed":
        print(f"gpuwatch: the trainer crashed: {state.status_message}", file=err)
        for line in state.log_tail[-ERROR_TAIL_LINES:]:
            print(f"  | {line}", file=err)
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
    print(f"gpuwatch: {scaling.describe(plan)}", file=out)
    for line in scaling.table_lines(plan, rows):
        print(line, file=out)
    verdict = poor_scaling(rows, plan)
    if verdict is not None:
        print(f"gpuwatch: {verdict.verdict}", file=out)
        for remedy in verdict.recommendations:
            print(f"  - {remedy}", file=out)
    code = _exit_code(info, state, stopping, err)
    failed = scaling.probe_failed(rows)
    if failed is not None:
        print(f"gpuwatch: the probe did not measure {failed.count} {plan.unit}: "
              f"{failed.state}{f' ({state.status_message})' if state.status_message else ''}",
              file=err, flush=True)
        code = code or 1
    print(scaling.scaling_line(plan, rows), file=out, flush=True)
    return code


def run_headless(info: RunInfo, after_attempt: int = 0, ended: Ending | None = None) -> int:
    return asyncio.run(follow(info, after_attempt=after_attempt, ended=ended))
