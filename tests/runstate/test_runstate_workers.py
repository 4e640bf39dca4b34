"""RunState with several workers: the headline is the chief's, each worker has its figures."""

from __future__ import annotations

import pytest

from gpuwatch.runstate import (
    WARMUP_STEPS,
    WORKER_WINDOW_STEPS,
    RunState,
)

SETTINGS = {
    "name": "mw",
    "data": {"prefetch": True, "parallel_calls": 1},
    "train": {"global_batch_size": 256, "accumulation_steps": 1},
    "cluster": {"launcher": "local", "workers": [{"host": "localhost"}, {"host": "localhost"}]},
}


class Frames:
    """Numbered frames (seq) of a synthetic cluster run."""

    def __init__(self) -> None:
        self.seq = 0
        self.frames: list[dict] = []

    def add(self, frame_type: str, **fields) -> None:
        self.frames.append({"type": frame_type, "seq": self.seq, "t": 1000.0 + self.seq, **fields})
        self.seq += 1

    def hello(self, worker: int, workers: int, host: str, attempt: int = 1) -> None:
        self.add("hello", attempt=attempt, pid=100 + worker, tf_version="2.21.0",
                 replicas=workers, device_kind="cpu", devices=["/job:worker/device:CPU:0"],
                 param_count=10, param_bytes=40, global_batch_size=256, accumulation_steps=1,
                 per_replica_batch=256 // workers, start_step=0, start_micro_step=0,
                 worker=worker, workers=workers, host=host)

    def step(self, worker: int, number: int, step_ms: float, wait_ms: float,
             compute_ms: float | None = None, attempt: int = 1, loss: float = 1.0) -> None:
        self.add("step", attempt=attempt, step=number, micro_step=number, epoch=0, loss=loss,
                 lr=1e-3, examples=256, step_time_ms=step_ms, input_wait_ms=wait_ms,
                 grad_sync_bytes=1000.0, worker=worker, compute_ms=compute_ms)

    def sample(self, worker: int, cpu: float) -> None:
        self.add("sample", host={"cpu_pct": cpu}, gpus=[], nvml="none", worker=worker)


def cluster_run(workers: int, steps: int, per_worker: dict[int, tuple[float, float, float]],
                hosts: list[str] | None = None) -> Frames:
    """`steps` steps on every worker; per_worker[w] = (step ms, input wait ms, compute ms)."""
    frames = Frames()
    frames.add("attempt", attempt=1, settings=SETTINGS)
    for w in range(workers):
        frames.hello(w, workers, (hosts or [f"host-{w}" for w in range(workers)])[w])
    for number in range(1, steps + 1):
        for w in range(workers):
            step_ms, wait_ms, compute_ms = per_worker[w]
            frames.step(w, number, step_ms, wait_ms, compute_ms, loss=1.0 + w)
    return frames


# A relaunch that helps the straggler: worker 1 waits 110 ms of each 200 ms step on input
# in attempt 1, 20 ms in attempt 2 (data.parallel_calls 1 -> 4); the chief 1 ms in both.
STRAGGLER_WAIT_MS = {1: {0: 1.0, 1: 110.0}, 2: {0: 1.0, 1: 20.0}}
STRAGGLER_STEP_MS = 200.0


def relaunch_helps_the_straggler(steps: int = WARMUP_STEPS + 25) -> Frames:
    """Two attempts of a two-worker run, as STRAGGLER_WAIT_MS says (frames with "v")."""
    frames = Frames()
    number = 0
    for attempt, waits in STRAGGLER_WAIT_MS.items():
        parallel = 1 if attempt == 1 else 4
        settings = {**SETTINGS, "data": {**SETTINGS["data"], "parallel_calls": parallel}}
        frames.add("attempt", attempt=attempt, settings=settings,
                   reason="start" if attempt == 1 else "relaunch")
        for worker in (0, 1):
            frames.hello(worker, 2, f"host-{worker}", attempt=attempt)
        frames.add("status", attempt=attempt, status="running")
        for _ in range(steps):
            number += 1
            for worker, wait_ms in waits.items():
                frames.step(worker, number, STRAGGLER_STEP_MS, wait_ms, 40.0, attempt=attempt)
        if attempt == 1:
            frames.add("status", attempt=attempt, status="relaunching")
    for frame in frames.frames:
        frame["v"] = 1
    return frames


def measured_wait_pct(
    frames: list[dict], attempt: int, worker: int, last: int | None = None
) -> float:
    """By hand: a worker's input wait % over its steps of an attempt after warm-up (or the
    `last` of them): summed wait over summed step time."""
    steps = [f for f in frames if f["type"] == "step" and f["attempt"] == attempt
             and f["worker"] == worker][WARMUP_STEPS:]
    steps = steps[-last:] if last else steps
    return 100.0 * sum(f["input_wait_ms"] for f in steps) / sum(f["step_time_ms"] for f in steps)


def test_each_attempts_input_wait_is_its_straggler_s_so_a_fix_shows():
    frames = relaunch_helps_the_straggler()
    state = RunState()
    state.apply_many(frames.frames)
    for attempt in (1, 2):
        summary = state.attempts[attempt]
        want = measured_wait_pct(frames.frames, attempt, 1)
        assert want > 2 * measured_wait_pct(frames.frames, attempt, 0)
        assert (summary.input_wait_pct, summary.input_wait_worker) == (pytest.approx(want), 1)
    assert state.attempts[2].input_wait_pct < state.attempts[1].input_wait_pct / 4
    # One host: the chief's, and no worker named.
    one_host = cluster_run(1, WARMUP_STEPS + 4, {0: (100.0, 30.0, 50.0)})
    state = RunState()
    state.apply_many(one_host.frames)
    assert state.attempts[1].input_wait_pct == pytest.approx(30.0)
    assert state.attempts[1].input_wait_worker is None
    assert state.figures().input_wait_worker is None


def test_headline_is_the_chiefs_but_input_wait_is_the_worker_that_waits_most():
    # Worker 1 waits 80 ms of 200 on input, the chief 6 ms: every step waits for worker 1,
    # so the input wait is its 40 %, named; the rest (steps, loss, rates) the chief's.
    frames = cluster_run(2, WARMUP_STEPS + 10, {0: (200.0, 6.0, 20.0), 1: (200.0, 80.0, 21.0)})
    state = RunState()
    state.apply_many(frames.frames)
    summary = state.attempts[1]
    assert summary.steps_seen == WARMUP_STEPS + 10  # not twice that
    assert summary.measured_steps == 10
    assert summary.input_wait_pct == pytest.approx(40.0)
    assert summary.input_wait_worker == 1
    assert summary.worker_waits[0].input_wait_pct == pytest.approx(3.0)
    assert summary.workers == 2
    figures = state.figures()
    assert figures.input_wait_pct == pytest.approx(40.0) and figures.input_wait_worker == 1
    assert len(state.window) == WARMUP_STEPS + 10
    assert state.last_step is not None and state.last_step.worker == 0
    assert state.last_step.loss == 1.0  # the chief's, not worker 1's 2.0
    # 256 examples (the whole update) per 200 ms: 1,280 ex/s, not counted per worker.
    assert state.figures().examples_per_s == pytest.approx(1280.0)
    assert state.workers == 2
    assert state.hello is not None and state.hello.worker == 0


def test_per_worker_medians_and_share_of_examples():
    frames = cluster_run(
        3, WARMUP_STEPS + 4,
        {0: (200.0, 6.0, 20.0), 1: (200.0, 80.0, 21.0), 2: (200.0, 10.0, 60.0)},
    )
    # Worker 2's step times vary: 100, 200, 300, 400 ms -> median 250.
    for i, ms in enumerate((100.0, 200.0, 300.0, 400.0)):
        frames.frames[-(4 - i) * 3 + 2]["step_time_ms"] = ms
    state = RunState()
    state.apply_many(frames.frames)
    rows = state.worker_summaries()
    assert [r.worker for r in rows] == [0, 1, 2]
    chief, slow_input, slow_devices = rows
    assert chief.host == "host-0" and slow_input.host == "host-1"
    assert chief.replicas == 1  # 3 replicas over 3 workers on CPU
    assert chief.measured_steps == 4 and chief.last_step == WARMUP_STEPS + 4
    assert chief.step_time_ms == pytest.approx(200.0)
    assert chief.input_wait_pct == pytest.approx(3.0)
    assert slow_input.input_wait_pct == pytest.approx(40.0)
    assert slow_input.compute_ms == pytest.approx(21.0)
    assert slow_devices.step_time_ms == pytest.approx(250.0)
    assert slow_devices.compute_ms == pytest.approx(60.0)
    # Each worker trains 256 / 3 examples per step: at 200 ms, 426.7 ex/s.
    assert chief.examples_per_s == pytest.approx(256 / 3 * 5)
    assert all(r.status == "running" for r in rows)


def test_a_single_host_run_has_one_worker_and_no_cluster():
    frames = cluster_run(1, WARMUP_STEPS + 2, {0: (100.0, 10.0, 50.0)})
    state = RunState()
    state.apply_many(frames.frames)
    assert state.workers == 1
    assert [r.worker for r in state.worker_summaries()] == [0]


def test_workers_come_from_the_config_before_any_hello():
    state = RunState()
    state.apply({"type": "attempt", "seq": 0, "attempt": 1, "settings": SETTINGS})
    assert state.workers == 2


def test_samples_are_kept_per_worker_host_and_shared_on_one_host():
    # Two workers on one host share its sampler: samples come from worker 0 only.
    frames = cluster_run(2, 2, {0: (100.0, 1.0, 5.0), 1: (100.0, 1.0, 5.0)},
                         hosts=["box-a", "box-a"])
    frames.sample(0, 55.0)
    state = RunState()
    state.apply_many(frames.frames)
    rows = state.worker_summaries()
    assert rows[0].sample is not None and rows[0].sample.host.cpu_pct == 55.0
    assert rows[1].sample is rows[0].sample
    # Two hosts: each worker its own; the headline device sample stays the chief's.
    frames = cluster_run(2, 2, {0: (100.0, 1.0, 5.0), 1: (100.0, 1.0, 5.0)})
    frames.sample(0, 20.0)
    frames.sample(1, 97.0)
    state = RunState()
    state.apply_many(frames.frames)
    first, second = state.worker_summaries()
    assert first.sample is not None and first.sample.host.cpu_pct == 20.0
    assert second.sample is not None and second.sample.host.cpu_pct == 97.0
    assert state.sample is not None and state.sample.host.cpu_pct == 20.0
    assert state.take_changes() >= {"workers", "devices"}


def test_worker_status_done_error_and_crash_named():
    frames = cluster_run(3, 2, {w: (100.0, 1.0, 5.0) for w in range(3)})
    frames.add("done", attempt=1, reason="max_steps", step=2, worker=2)
    frames.add("error", attempt=1, kind="runtime", message="read failed", worker=1)
    frames.add("error", attempt=1, kind="runtime", message="collective timed out", worker=0)
    frames.add("status", attempt=1, status="crashed", exit_code=1,
               message="worker 1 exited with code 1", worker=1)
    state = RunState()
    state.apply_many(frames.frames)
    statuses = {r.worker: r.status for r in state.worker_summaries()}
    assert statuses == {0: "error", 1: "error", 2: "done"}
    assert state.done is None  # worker 2's done is not the run's
    assert state.error is not None and state.error.message == "read failed"  # the cause
    assert state.status_worker == 1


def test_crash_without_an_error_marks_the_worker_crashed():
    frames = cluster_run(2, 2, {w: (100.0, 1.0, 5.0) for w in range(2)})
    frames.add("status", attempt=1, status="crashed", exit_code=-9, message="worker 1 killed",
               worker=1)
    state = RunState()
    state.apply_many(frames.frames)
    assert [r.status for r in state.worker_summaries()] == ["running", "crashed"]


def test_worker_window_is_bounded_and_a_new_attempt_starts_over():
    frames = cluster_run(2, WARMUP_STEPS + 3 * WORKER_WINDOW_STEPS,
                         {0: (100.0, 1.0, 5.0), 1: (100.0, 50.0, 5.0)})
    state = RunState()
    state.apply_many(frames.frames)
    figures = state.workers_seen[1]
    assert len(figures.window) == WORKER_WINDOW_STEPS
    frames = Frames()
    frames.seq = 10_000
    frames.add("attempt", attempt=2, settings=SETTINGS)
    frames.hello(1, 2, "host-1", attempt=2)
    state.apply_many(frames.frames)
    assert state.attempt == 2
    assert len(figures.window) == 0 and figures.steps_seen == 0
    assert [r.worker for r in state.worker_summaries()] == [1]
    # A late frame of attempt 1 does not come back into attempt 2's figures.
    late = Frames()
    late.seq = 20_000
    late.step(1, 999, 100.0, 1.0, attempt=1)
    state.apply_many(late.frames)
    assert figures.last_step is None


def test_a_worker_index_no_cluster_can_have_is_not_kept():
    state = RunState()
    frames = Frames()
    frames.step(10_000, 1, 100.0, 1.0)
    state.apply_many(frames.frames)
    assert state.workers_seen == {}
