"""Bounded telemetry past SUMMARY_PAST_WORKERS workers (gpuwatch/supervisor/summarize.py):
a worker's steps as one summary a second, and the fold from them against the fold from
every step of the same simulated run."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from pathlib import Path
from typing import Any

import pytest

from gpuwatch import advisor
from gpuwatch.runstate import WARMUP_STEPS, RunState
from gpuwatch.supervisor.agent import LocalAgent, relayed_event
from gpuwatch.supervisor.summarize import (
    FALLING_BEHIND,
    SUMMARY_PAST_WORKERS,
    StepSummarizer,
    summarizes,
    summary_of,
)
from trainer_runtime import protocol
from trainer_runtime.protocol import (
    AGENT_EVENTS,
    Checkpoint,
    Event,
    Hello,
    Step,
    StepSummary,
    encode_event,
    event_frame,
)

WORKERS = 12
STRAGGLER = 7
STEP_S = 0.025  # 40 updates a second


def _hello(worker: int, workers: int = WORKERS, attempt: int = 1) -> Hello:
    return Hello(attempt=attempt, pid=100 + worker, tf_version="2", replicas=workers,
                 device_kind="cpu", devices=["/cpu:0"], param_count=10, param_bytes=40,
                 global_batch_size=64 * workers, accumulation_steps=1, per_replica_batch=64,
                 start_step=0, start_micro_step=0, worker=worker, workers=workers,
                 host=f"host-{worker}")


def _step(worker: int, number: int, rng: random.Random, attempt: int = 1,
          step_ms: float | None = None) -> Step:
    """A synchronous step: every worker's takes about as long (they wait for each other);
    the straggler waits on its input, the others compute."""
    step_time = step_ms if step_ms is not None else 25.0 * rng.uniform(0.95, 1.05)
    wait = (10.0 if worker == STRAGGLER else 1.0) * rng.uniform(0.9, 1.1)
    compute = 8.0 * rng.uniform(0.9, 1.1)
    sync = step_time - wait - compute - 2.0
    return Step(attempt=attempt, step=number, micro_step=number, epoch=0,
                loss=2.0 / number, lr=0.1, examples=64, step_time_ms=step_time,
                input_wait_ms=wait, grad_sync_bytes=40.0, position=64 * number,
                worker=worker, compute_ms=compute, sync_ms=sync, update_ms=1.0)


def _simulated_run(steps: int = 200, seed: int = 0) -> list[tuple[float, Event]]:
    """(time, event) of a 12-worker run, in order."""
    rng = random.Random(seed)
    events: list[tuple[float, Event]] = [(0.0, _hello(w)) for w in range(WORKERS)]
    for number in range(1, steps + 1):
        now = number * STEP_S
        events.extend((now, _step(w, number, rng)) for w in range(WORKERS))
    return events


def _fold(events: list[tuple[float, Event]], summarized: bool) -> tuple[RunState, int]:
    """The state folded from every event, or from what the agents send past the threshold
    (the chief's steps, the others' summaries); and how many events that was."""
    state = RunState()
    sent = 0

    def fold(event: Event, t: float | None) -> None:
        nonlocal sent
        sent += 1
        state.apply_event(protocol.Envelope(event.TYPE, None, t), event)

    summarizers = {w: StepSummarizer(fold) for w in range(1, WORKERS)}
    for now, event in events:
        worker = getattr(event, "worker", 0)
        if summarized and summarizes(worker, WORKERS):
            summarizers[worker].event(event, now, now)
        else:
            fold(event, now)
    for summarizer in summarizers.values():
        summarizer.flush()
    return state, sent


def test_the_fold_from_summaries_matches_the_fold_from_every_step() -> None:
    events = _simulated_run()
    every, sent_every = _fold(events, summarized=False)
    summed, sent_summed = _fold(events, summarized=True)
    # Every worker's steps: 12 x 200 steps; summarized: the chief's 200, each other
    # worker's warm-up steps and about one summary per second (5 s of steps).
    assert sent_every == WORKERS + WORKERS * 200
    assert sent_summed <= WORKERS + 200 + (WORKERS - 1) * (WARMUP_STEPS + 6)
    exact = {w.worker: w for w in every.worker_summaries()}
    folded = {w.worker: w for w in summed.worker_summaries()}
    assert sorted(exact) == sorted(folded) == list(range(WORKERS))
    for worker, truth in exact.items():
        got = folded[worker]
        assert got.summarized == (worker != 0)
        assert got.last_step == truth.last_step == 200
        assert got.status == truth.status == "running"
        # Medians over the summary's window (its latest second), not the last 20 steps:
        # the same within the steps' own spread (+-5 % step time, +-10 % wait, compute).
        assert got.step_time_ms == pytest.approx(truth.step_time_ms, rel=0.05)
        assert got.input_wait_ms == pytest.approx(truth.input_wait_ms, rel=0.10)
        assert got.compute_ms == pytest.approx(truth.compute_ms, rel=0.10)
        assert got.input_wait_pct == pytest.approx(truth.input_wait_pct, rel=0.15)
        assert got.examples_per_s == pytest.approx(truth.examples_per_s, rel=0.05)
        assert got.breakdown is not None and truth.breakdown is not None
        for part in protocol.Breakdown.PARTS:
            assert got.breakdown.pct(part) == pytest.approx(truth.breakdown.pct(part), abs=2.0)
    # The same straggler, for the same cause.
    found_every = advisor.find_straggler(every.worker_summaries())
    found_summed = advisor.find_straggler(summed.worker_summaries())
    assert found_every is not None and found_summed is not None
    assert (found_summed.worker, found_summed.cause) == (found_every.worker,
                                                         found_every.cause) == (
        STRAGGLER, "input-bound")
    # The attempt's input wait comes from sums: the same sums, to the summaries' rounding
    # (a microsecond each).
    attempt_every, attempt_summed = every.attempts[1], summed.attempts[1]
    assert attempt_summed.input_wait_worker == attempt_every.input_wait_worker == STRAGGLER
    for worker in range(1, WORKERS):
        a, b = attempt_every.worker_waits[worker], attempt_summed.worker_waits[worker]
        assert (b.steps_seen, b.measured_steps) == (a.steps_seen, a.measured_steps)
        assert b.sum_step_time_ms == pytest.approx(a.sum_step_time_ms, abs=0.01)
        assert b.sum_input_wait_ms == pytest.approx(a.sum_input_wait_ms, abs=0.01)
        assert b.breakdown is not None and a.breakdown is not None
        assert b.breakdown.sync_ms == pytest.approx(a.breakdown.sync_ms, abs=0.01)
    # The headline is the chief's, step for step, either way.
    assert summed.last_step is not None and every.last_step is not None
    assert summed.last_step.step == every.last_step.step == 200
    assert summed.figures().examples_per_s == every.figures().examples_per_s


def test_the_threshold_at_its_boundary() -> None:
    at = SUMMARY_PAST_WORKERS
    assert not any(summarizes(i, at) for i in range(at))
    assert [summarizes(i, at + 1) for i in range(at + 1)] == [False] + [True] * at
    assert not summarizes(0, 64)  # the chief sends every step, always


def test_a_summary_holds_its_steps_spread_and_sums() -> None:
    rng = random.Random(1)
    steps = [_step(3, n, rng) for n in range(10, 20)]
    summary = summary_of(steps)
    times = sorted(s.step_time_ms for s in steps)
    assert (summary.first_step, summary.last_step, summary.count) == (10, 19, 10)
    assert summary.examples == 640 and summary.loss == steps[-1].loss
    assert summary.step_time_ms == pytest.approx(  # to a microsecond
        [times[0], (times[4] + times[5]) / 2, times[-1], sum(times)], abs=0.0005)
    assert summary.figure("input_wait_ms", "sum") == pytest.approx(
        sum(s.input_wait_ms or 0.0 for s in steps), abs=0.0005)
    # Round trip on the wire, as a remote agent relays it.
    frame = protocol.decode(encode_event(summary, t=5.0))
    assert relayed_event(frame, 1, 3, AGENT_EVENTS)[1] == summary


def test_a_trainer_cannot_send_summaries_but_an_agent_can_relay_them() -> None:
    summary = summary_of([_step(2, 7, random.Random(2))])
    frame = event_frame(summary)
    with pytest.raises(protocol.ProtocolError, match="may not send 'steps'"):
        relayed_event(frame, 1, 2)
    assert isinstance(relayed_event(frame, 1, 2, AGENT_EVENTS)[1], StepSummary)


@pytest.mark.parametrize("spread", [[1.0, 2.0], [], [1.0, 2.0, 3.0, 4.0, 5.0]])
def test_a_spread_of_the_wrong_shape_is_not_a_figure(spread: list[float]) -> None:
    state = RunState()
    for worker in (0, 1):
        state.apply_event(protocol.Envelope("hello", None, 0.0), _hello(worker))
    summary = StepSummary(attempt=1, worker=1, first_step=6, last_step=9, count=4, epoch=0,
                          examples=256, loss=1.0, step_time_ms=spread, input_wait_ms=spread)
    assert summary.figure("step_time_ms", "median") is None
    state.apply_event(protocol.Envelope("steps", None, 1.0), summary)
    worker = state.worker_summaries()[1]
    assert worker.last_step == 9 and not worker.measured  # counted, not a figure


@pytest.mark.parametrize("bad", [[1.0, float("nan"), 2.0, 3.0], ["1", 2, 3, 4], 5, [1.0] * 17])
def test_garbage_spreads_are_refused_on_the_wire(bad: Any) -> None:
    frame = event_frame(summary_of([_step(2, 7, random.Random(3))]))
    frame["step_time_ms"] = bad
    with pytest.raises(protocol.ProtocolError, match="step_time_ms"):
        protocol.parse_event(frame)


class _Sent:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event, t: float | None) -> None:
        self.events.append(event)


def test_warm_up_goes_as_steps_then_a_summary_a_second() -> None:
    sent, rng = _Sent(), random.Random(4)
    summarizer = StepSummarizer(sent)
    for n in range(1, WARMUP_STEPS + 42):  # warm-up, then just over a second of steps
        summarizer.event(_step(1, n, rng), n * STEP_S, n * STEP_S)
    kinds = [type(e).__name__ for e in sent.events]
    assert kinds[:WARMUP_STEPS] == ["Step"] * WARMUP_STEPS
    assert kinds[WARMUP_STEPS:] == ["StepSummary"]
    (summary,) = sent.events[WARMUP_STEPS:]
    assert isinstance(summary, StepSummary)
    assert summary.first_step == WARMUP_STEPS + 1
    assert 40 <= summary.count <= 41  # a second of 25 ms steps (float rounding at its end)


def test_a_step_that_falls_behind_is_sent_at_once() -> None:
    sent, rng = _Sent(), random.Random(5)
    summarizer = StepSummarizer(sent)
    n = 0
    for n in range(1, WARMUP_STEPS + 42):  # warm-up, then one summary
        summarizer.event(_step(1, n, rng), n * STEP_S, n * STEP_S)
    before = len(sent.events)
    now = n * STEP_S + 0.05
    summarizer.event(_step(1, n + 1, rng), now, now)  # usual: waits for its second
    assert len(sent.events) == before
    slow = 25.0 * (FALLING_BEHIND + 1)
    summarizer.event(_step(1, n + 2, rng, step_ms=slow), now + 0.1, now + 0.1)
    assert len(sent.events) == before + 1
    last = sent.events[-1]
    assert isinstance(last, StepSummary)
    assert last.last_step == n + 2 and last.figure("step_time_ms", "max") == slow


def test_other_events_keep_their_order_and_a_new_attempt_warms_up_again() -> None:
    sent, rng = _Sent(), random.Random(6)
    summarizer = StepSummarizer(sent)
    for n in range(1, WARMUP_STEPS + 4):
        summarizer.event(_step(1, n, rng), n * STEP_S, n * STEP_S)
    checkpoint = Checkpoint(attempt=1, step=8, micro_step=8, path="ckpt-8", seconds=0.1,
                            worker=1)
    summarizer.event(checkpoint, 1.0, 0.3)
    assert isinstance(sent.events[-2], StepSummary) and sent.events[-1] is checkpoint
    assert sent.events[-2].last_step == WARMUP_STEPS + 3
    count = len(sent.events)
    summarizer.event(_step(1, 9, rng, attempt=2), 1.1, 0.4)  # a live change: attempt 2
    assert sent.events[count:] == [sent.events[-1]] and isinstance(sent.events[-1], Step)


@pytest.mark.alone
def test_a_worker_that_stops_sending_mid_second_is_summarized_by_the_agents_timer(
        tmp_path: Path) -> None:
    # The real agent reading a trainer's socket: 10 steps past warm-up, then silence
    # (the socket stays open); the summary of those 10 comes within its second.
    got: list[tuple[float, Event]] = []
    agent = LocalAgent(1, tmp_path, on_frame=lambda i, e, t: got.append((asyncio_time(), e)),
                       on_exit=lambda i, e: None, on_sample=lambda i, f: None, sample=False)
    agent._upward.summarizer = StepSummarizer(lambda e, t: agent._upward.on_frame(1, e, t))
    rng = random.Random(7)
    ours, theirs = socket.socketpair()

    async def drill() -> float:
        reader = asyncio.create_task(agent.read_frames(ours, attempt=1))
        data = b"".join(encode_event(_step(1, n, rng), t=float(n))
                        for n in range(1, WARMUP_STEPS + 11))
        theirs.sendall(data)
        sent_at = asyncio_time()
        for _ in range(40):
            await asyncio.sleep(0.1)
            if any(isinstance(e, StepSummary) for _, e in got):
                break
        theirs.close()
        await asyncio.wait_for(reader, 5)
        return sent_at

    sent_at = asyncio.run(drill())
    summaries = [(at, e) for at, e in got if isinstance(e, StepSummary)]
    assert len(summaries) == 1
    at, summary = summaries[0]
    assert isinstance(summary, StepSummary)
    assert (summary.first_step, summary.last_step, summary.count) == (
        WARMUP_STEPS + 1, WARMUP_STEPS + 10, 10)
    assert at - sent_at < 1.0 + 0.5  # its second, and the agent's timer tick


def asyncio_time() -> float:
    import time
    return time.monotonic()


def test_a_lean_sample_shows_a_worker_s_devices_in_the_same_words(tmp_path: Path) -> None:
    # Past 8 workers a worker's host goes up with its GPUs summed: the workers panel's
    # device column reads the same from it as from every GPU's readings.
    from gpuwatch.app.widgets.devices import device_summary
    from gpuwatch.runstate import HostReading
    from gpuwatch.sampling import DeviceSampler, sample_event
    from gpuwatch.supervisor.summarize import lean_sample
    from tests.support.fake_nvml import fake_h100_box

    def reading(sample: protocol.Sample) -> HostReading:
        return HostReading(sample.host, sample.gpus, sample.nvml, None, sample.gpu_summary)

    nvml = fake_h100_box(8)
    for i, gpu in enumerate(nvml.gpus):
        gpu.util_gpu = 10 * i
    nvml.gpus[7].lost = True
    sampler = DeviceSampler(nvml=nvml)
    sampler.sample()
    full = sample_event(sampler.sample())
    lean = lean_sample(full)
    summary = lean.gpu_summary
    assert lean.gpus == [] and summary is not None and summary.count == 8
    assert summary.lost == 1
    assert summary.util_gpu_pct == [0.0, 30.0, 60.0]
    for wide in (False, True):
        assert device_summary(reading(lean), wide) == device_summary(reading(full), wide)
    line = protocol.encode_event(lean)
    assert len(line) < len(protocol.encode_event(full)) / 8
    # A valid sample frame of the host's few readings, read back as it was sent.
    assert set(json.loads(line)["host"]) == set(protocol.LEAN_HOST_FIELDS)
    assert protocol.parse_event(protocol.decode(line))[1] == lean


def _recorded(tmp_path: Path) -> tuple[Path, list[tuple[float, Event]]]:
    """The simulated run as the supervisor records it past the threshold (seq, t)."""
    events = _simulated_run(steps=120)
    sent: list[tuple[float | None, Event]] = []
    summarizers = {w: StepSummarizer(lambda e, t: sent.append((t, e))) for w in range(1, 12)}
    for now, event in events:
        worker = getattr(event, "worker", 0)
        if summarizes(worker, WORKERS):
            summarizers[worker].event(event, now, now)
        else:
            sent.append((now, event))
    for summarizer in summarizers.values():
        summarizer.flush()
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e, t=t, seq=i) for i, (t, e) in enumerate(sent)))
    return path, events


def test_export_and_tensorboard_read_the_summaries(tmp_path: Path) -> None:
    import io

    from gpuwatch.runs.export import export_events
    from gpuwatch.supervisor.tboard import summary_scalars

    path, events = _recorded(tmp_path)
    truth = [e for _, e in events if isinstance(e, Step)]
    out = io.StringIO()
    export_events(path, "summaries", "jsonl", out, worker=STRAGGLER)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    out = io.StringIO()
    export_events(path, "steps", "jsonl", out, worker=STRAGGLER)
    step_rows = [json.loads(line) for line in out.getvalue().splitlines()]
    # Every update of the worker, once: its warm-up steps as steps, the rest summarized.
    assert [r["step"] for r in step_rows] == list(range(1, WARMUP_STEPS + 1))
    covered = [n for r in rows for n in range(r["first_step"], r["last_step"] + 1)]
    assert covered == list(range(WARMUP_STEPS + 1, 121))
    assert sum(r["count"] for r in rows) == 120 - WARMUP_STEPS
    mine = [s for s in truth if s.worker == STRAGGLER]
    for row in rows:
        steps = [s for s in mine if row["first_step"] <= s.step <= row["last_step"]]
        step_sum = sum(s.step_time_ms for s in steps)
        wait_sum = sum(s.input_wait_ms or 0.0 for s in steps)
        assert row["step_time_max_ms"] == pytest.approx(max(s.step_time_ms for s in steps),
                                                        abs=0.0005)
        assert row["examples_per_s"] == pytest.approx(64 * len(steps) * 1000 / step_sum,
                                                      rel=1e-6)
        assert row["input_wait_pct"] == pytest.approx(100 * wait_sum / step_sum, rel=1e-6)
    summary = next(e for _, e in [(0, protocol.parse_event(json.loads(line))[1])
                                  for line in path.read_text().splitlines()]
                   if isinstance(e, StepSummary) and e.worker == STRAGGLER)
    scalars = summary_scalars(summary)
    steps = [s for s in mine if summary.first_step <= s.step <= summary.last_step]
    assert scalars["train/input_wait_pct"] == pytest.approx(
        100 * sum(s.input_wait_ms or 0.0 for s in steps) / sum(s.step_time_ms for s in steps),
        rel=1e-6)
    assert scalars["train/loss"] == steps[-1].loss
    assert scalars["train/compute_ms"] == pytest.approx(
        sum(s.compute_ms or 0.0 for s in steps) / len(steps), abs=0.001)
