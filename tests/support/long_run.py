"""A long run written as the supervisor writes one: events.jsonl, events.idx and snapshot.json.

``write_long_run(run_dir, events=1_000_000)`` records, through the real ``EventLog``
and ``StateKeeper`` (the supervisor's fold and snapshot writer), a run of several
attempts: steps at about 100 steps/s, a device sample of 8 GPUs every second,
checkpoints, relaunches. Time is simulated (each step's t is the one before plus
its step time), so the keeper writes a snapshot every ``snapshot_every_s`` of run
time and at every status change, as the supervisor does in real time.

The returned ``LongRun`` carries the ground truth, computed here from the numbers
generated (not by RunState): each attempt's steps, exact median examples/s and
input-wait %, the last step. The last attempt is still running when it ends, and
events follow the last snapshot (a dashboard attaching replays that tail).
Used by the attach test and bench/bench_attach.py.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatch.config import load_config
from gpuwatch.runstate import WARMUP_STEPS
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.snapshots import StateKeeper
from tests.conftest import TINY
from trainer_runtime.protocol import (
    Attempt,
    Checkpoint,
    Done,
    Event,
    GpuSample,
    Hello,
    HostSample,
    Resume,
    Run,
    Sample,
    StatusChange,
    Step,
    input_wait_pct,
    record_from_wire,
)

T0 = 1_750_000_000.0
GPUS = 8
BATCH = 256
CHECKPOINT_EVERY = 1000
# Prefetch per attempt, so the attempts table tells them apart.
PREFETCH = (False, True, 4, 8, "autotune")


@dataclass
class AttemptTruth:
    """What the dashboard must show for one attempt, from the generated numbers."""

    attempt: int
    prefetch: Any
    first_step: int = 0
    last_step: int = 0
    steps: int = 0
    rates: list[float] = field(default_factory=list)  # examples/s of the measured steps
    sum_step_ms: float = 0.0
    sum_wait_ms: float = 0.0

    @property
    def median_examples_per_s(self) -> float:
        return statistics.median(self.rates)

    @property
    def input_wait_pct(self) -> float | None:
        return input_wait_pct(self.sum_wait_ms, self.sum_step_ms)


@dataclass
class LongRun:
    events: int
    last_step: int
    attempts: list[AttemptTruth]
    snapshot_seq: int  # the last snapshot written
    snapshot_sizes: list[tuple[int, int]]  # (seq, bytes) of every snapshot written
    keeper: StateKeeper  # its state is the full fold of every event


def gpu_sample(t: float) -> Sample:
    wave = int(t) % 20
    gpus = [
        {
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": f"GPU-{i:04d}",
            "lost": False,
            "mig": False,
            "util_gpu_pct": 80.0 + wave - i,
            "util_mem_pct": 40.0 + wave / 2,
            "mem_used_bytes": 60_000_000_000 + i * 1_000_000,
            "mem_total_bytes": 85_000_000_000,
            "temperature_c": 60 + i,
            "power_w": 500.0 + wave,
            "power_limit_w": 700.0,
            "sm_clock_mhz": 1980,
            "pcie_gen": 5,
            "pcie_width": 16,
            "pcie_tx_bytes_per_s": 1.5e9,
            "pcie_rx_bytes_per_s": 3.0e9,
            "nvlink_tx_bytes_per_s": 1.0e11,
            "nvlink_rx_bytes_per_s": 1.0e11,
            "processes": [{"pid": 5000 + i, "used_bytes": 59_000_000_000, "in_run": True}],
        }
        for i in range(GPUS)
    ]
    host = {
        "cpu_pct": 30.0 + wave,
        "per_cpu_pct": [30.0] * 16,
        "mem_used_bytes": 90_000_000_000,
        "mem_total_bytes": 2_000_000_000_000,
        "load_1m": 12.0,
        "run_cpu_pct": 800.0,
        "run_rss_bytes": 30_000_000_000,
    }
    return Sample(host=record_from_wire(HostSample, host),
                  gpus=[record_from_wire(GpuSample, gpu) for gpu in gpus], nvml=None)


class _Recorder:
    """Supervisor.record without the sockets: the log, then the fold; snapshots on time."""

    def __init__(self, run_dir: Path, snapshot_every_s: float) -> None:
        self.events = EventLog(run_dir)
        self.keeper = StateKeeper(run_dir, self.events)
        self.every_s = snapshot_every_s
        self.next_snapshot_t = T0 + snapshot_every_s
        self.sizes: list[tuple[int, int]] = []

    def record(self, event: Event, t: float) -> None:
        seq, t, _ = self.events.append(event, t)
        self.keeper.fold(seq, event, t)
        if isinstance(event, StatusChange) or t >= self.next_snapshot_t:
            self.snapshot()
            while self.next_snapshot_t <= t:
                self.next_snapshot_t += self.every_s

    def snapshot(self) -> None:
        self.keeper.write()
        latest = self.keeper.latest
        assert latest is not None, self.keeper.broken
        if not self.sizes or self.sizes[-1][0] != latest.seq:
            self.sizes.append((latest.seq, len(latest.text)))


def write_long_run(
    run_dir: Path, events: int = 1_000_000, attempts: int = 3, snapshot_every_s: float = 60.0
) -> LongRun:
    """Record a run of `events` events in run_dir (see the module); return its truth."""
    rec = _Recorder(run_dir, snapshot_every_s)
    base = load_config(TINY).config.model_dump(mode="json")
    t = T0
    rec.record(
        Run(
            run_id=run_dir.name,
            name="long",
            config_path=str(TINY),
            supervisor_pid=1,
            host="gpu-box",
            settings=base,
            created=T0,
        ),
        t,
    )
    truths: list[AttemptTruth] = []
    step = 0
    for number in range(1, attempts + 1):
        last = number == attempts
        budget = events - rec.events.next_seq if last else events // attempts
        end_seq = rec.events.next_seq + budget - (0 if last else 6)  # room to end the attempt
        truth = AttemptTruth(number, PREFETCH[(number - 1) % len(PREFETCH)])
        truths.append(truth)
        settings = {**base, "data": {**base["data"], "prefetch": truth.prefetch}}
        rec.record(
            Attempt(
                attempt=number,
                settings=settings,
                fresh=number == 1,
                reason="start" if number == 1 else "relaunch",
            ),
            t,
        )
        rec.record(StatusChange(attempt=number, status="starting"), t)
        t += 3.0
        rec.record(
            Hello(
                attempt=number,
                pid=4000 + number,
                tf_version="2.21.0",
                replicas=GPUS,
                device_kind="gpu",
                devices=[f"/device:GPU:{i}" for i in range(GPUS)],
                param_count=1_000_000,
                param_bytes=4_000_000,
                global_batch_size=BATCH,
                accumulation_steps=1,
                per_replica_batch=BATCH // GPUS,
                start_step=step,
                start_micro_step=step,
            ),
            t,
        )
        if number > 1:
            rec.record(
                Resume(
                    attempt=number,
                    from_step=step,
                    from_micro_step=step,
                    checkpoint=f"ckpt-{step}",
                    position=step * BATCH,
                    lost_steps=0,
                ),
                t,
            )
        rec.record(StatusChange(attempt=number, status="running"), t)
        next_sample = int(t) + 1
        slower = 1.0 + 0.25 * (number - 1)  # each attempt its own figures
        i = 0
        while rec.events.next_seq < end_seq:
            step += 1
            warmup = i < WARMUP_STEPS
            step_ms = (400.0 if warmup else 9.0 + (i * 37 % 101) / 50.0) * slower
            wait_ms = 0.5 + (i * 53 % 31) / 20.0
            t += step_ms / 1000.0
            rec.record(
                Step(
                    attempt=number,
                    step=step,
                    micro_step=step,
                    epoch=step // 10000,
                    loss=1.0 / (1.0 + step / 1e5),
                    lr=1e-3,
                    examples=BATCH,
                    step_time_ms=step_ms,
                    input_wait_ms=wait_ms,
                    grad_sync_bytes=8e6,
                    position=step * BATCH,
                ),
                t,
            )
            truth.steps += 1
            truth.first_step = truth.first_step or step
            truth.last_step = step
            if not warmup:
                truth.rates.append(BATCH * 1000.0 / step_ms)
                truth.sum_step_ms += step_ms
                truth.sum_wait_ms += wait_ms
            if step % CHECKPOINT_EVERY == 0 and rec.events.next_seq < end_seq:
                rec.record(
                    Checkpoint(
                        attempt=number, step=step, micro_step=step, path=f"ckpt-{step}", seconds=0.2
                    ),
                    t,
                )
            if t >= next_sample and rec.events.next_seq < end_seq:
                rec.record(gpu_sample(t), t)
                next_sample = int(t) + 1
            i += 1
        if not last:
            rec.record(
                StatusChange(attempt=number, status="stopping", message="relaunch requested"), t
            )
            rec.record(
                Checkpoint(
                    attempt=number, step=step, micro_step=step, path=f"ckpt-{step}", seconds=0.2
                ),
                t,
            )
            rec.record(Done(attempt=number, reason="sigterm", step=step), t)
            rec.record(StatusChange(attempt=number, status="relaunching"), t)
    rec.events.close()
    latest = rec.keeper.latest
    assert latest is not None
    return LongRun(
        events=rec.events.next_seq,
        last_step=step,
        attempts=truths,
        snapshot_seq=latest.seq,
        snapshot_sizes=rec.sizes,
        keeper=rec.keeper,
    )
