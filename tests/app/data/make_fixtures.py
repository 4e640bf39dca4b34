"""Regenerate the recorded-event fixtures: `python tests/app/data/make_fixtures.py`.

Plausible numbers shaped like the supervisor's events.jsonl (trainer_runtime.protocol frames
with seq and t). Jitter comes in +d/-d pairs so the after-warm-up figures are
exact: attempt 1 waits 38.0 % of its step time, attempt 2 4.0 %.

Where a step's parts are timed apart (``parts``: compute, all-reduce and update ms, as a
newer trainer sends them), the jitter falls on the step's rest (other), so each part's
share after warm-up is exact too. cpu_two_attempts, gpu_running and cpu_two_workers
carry them; the others are an older trainer's (no breakdown: the screen as before it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
T0 = 1_750_000_000.0
NVML_MISSING = "NVML Shared Library Not Found"


def settings(prefetch: Any, accumulation: int = 1, batch: int = 256) -> dict[str, Any]:
    return {
        "name": "mnist-mlp",
        "model": {"name": "mlp", "hidden_units": [512, 512], "dropout": 0.0},
        "data": {"name": "synthetic", "examples": 16384, "input_shape": [784], "classes": 10,
                 "read_latency_ms": 40.0, "decode_cost": 0, "prefetch": prefetch,
                 "parallel_calls": 1, "cache": False, "shuffle": True},
        "train": {"global_batch_size": batch, "accumulation_steps": accumulation,
                  "optimizer": "adam", "learning_rate": 0.001, "max_steps": 2000,
                  "steps_per_execution": 1},
        "strategy": {"cpu_replicas": 2, "cross_device_ops": "auto"},
        "checkpoint": {"every_steps": 200, "keep": 3, "enabled": True},
        "telemetry": {"enabled": True, "buffer_frames": 4096},
    }


class Recorder:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t = T0

    def emit(self, frame_type: str, **fields: Any) -> None:
        head = {"v": 1, "type": frame_type, "seq": len(self.events), "t": round(self.t, 3)}
        self.events.append({**head, **fields})

    def write(self, name: str) -> None:
        with open(HERE / name, "w", encoding="utf-8") as fh:
            for event in self.events:
                fh.write(json.dumps(event, separators=(",", ":")) + "\n")


def cpu_sample(rec: Recorder, cpu: float) -> None:
    rec.emit("sample", host={"cpu_pct": cpu, "per_cpu_pct": [cpu + 3, cpu - 3],
                             "mem_used_bytes": 5_400_000_000, "mem_total_bytes": 16_700_000_000,
                             "load_1m": 1.9, "run_cpu_pct": 2 * cpu - 20,
                             "run_rss_bytes": 1_250_000_000},
             gpus=[], nvml=NVML_MISSING)


def gpu_sample(rec: Recorder, util: float) -> None:
    gpus = []
    for index in range(2):
        gpus.append({
            "index": index, "name": "NVIDIA A100-SXM4-40GB", "uuid": f"GPU-0000-{index}",
            "lost": False, "mig": False, "util_gpu_pct": util - 7 * index,
            "util_mem_pct": 31.0, "mem_used_bytes": 21_300_000_000 + index * 400_000_000,
            "mem_total_bytes": 42_949_672_960, "temperature_c": 61 + index,
            "power_w": 251.0, "power_limit_w": 400.0, "sm_clock_mhz": 1410,
            "pcie_gen": 4, "pcie_width": 16, "nvlink_links_active": 12, "nvlink_version": 3,
            "pcie_tx_bytes_per_s": 1_250_000_000,
            "pcie_rx_bytes_per_s": 3_400_000_000,
            "nvlink_tx_bytes_per_s": 18_700_000_000 if index == 0 else None,
            "nvlink_rx_bytes_per_s": 18_200_000_000 if index == 0 else None,
            "processes": [{"pid": 4242, "used_bytes": 20_000_000_000, "in_run": True}],
        })
    rec.emit("sample", host={"cpu_pct": 41.0, "per_cpu_pct": [40.0] * 16,
                             "mem_used_bytes": 48_000_000_000, "mem_total_bytes": 128_000_000_000,
                             "load_1m": 6.2, "run_cpu_pct": 310.0, "run_rss_bytes": 6_100_000_000},
             gpus=gpus, nvml=None)


def steps(rec: Recorder, attempt: int, first: int, count: int, step_ms: float, wait_ms: float,
          jitter_ms: float, *, batch: int = 256, sampler: Any = cpu_sample,
          sample_arg: float = 90.0, grad_sync_bytes: int = 2_694_440,
          parts: tuple[float, float, float] | None = None) -> int:
    """Emit `count` steps (5 warm-up + count-5 measured, an even number); return next step.

    parts: (compute, sync, update) ms of a measured step; the rest of it is other."""
    for i in range(count):
        if i < 5:  # warm-up: tracing makes the first steps slow
            ms, wait, scale = (2400.0 if i == 0 else step_ms * 1.6), wait_ms * 1.5, 1.5
        else:
            sign = 1 if i % 2 else -1
            ms = step_ms + sign * jitter_ms
            wait = wait_ms + sign * jitter_ms * wait_ms / step_ms
            scale = 1.0
        rec.t += ms / 1000.0
        number = first + i
        timed = {} if parts is None else {
            name: round(value * scale, 3)
            for name, value in zip(("compute_ms", "sync_ms", "update_ms"), parts, strict=True)
        }
        rec.emit("step", attempt=attempt, step=number, micro_step=number, epoch=number // 64,
                 loss=round(2.3 * 0.985 ** number + 0.08, 5), lr=0.001, examples=batch,
                 step_time_ms=round(ms, 3), input_wait_ms=round(wait, 3),
                 grad_sync_bytes=grad_sync_bytes, dropped=0, **timed)
        if i % 4 == 3:
            sampler(rec, sample_arg)
    return first + count


def hello(rec: Recorder, attempt: int, start_step: int, prefetch_settings: dict[str, Any],
          kind: str = "cpu", replicas: int = 2, per_replica_batch: int = 128) -> None:
    devices = ([f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(replicas)]
               if kind == "cpu" else
               [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(replicas)])
    rec.emit("hello", attempt=attempt, pid=4242 + attempt, tf_version="2.21.0",
             replicas=replicas, device_kind=kind, devices=devices, param_count=669_706,
             param_bytes=2_678_824,
             global_batch_size=prefetch_settings["train"]["global_batch_size"],
             accumulation_steps=1, per_replica_batch=per_replica_batch, start_step=start_step,
             start_micro_step=start_step)


def start(rec: Recorder, run_settings: dict[str, Any]) -> None:
    rec.emit("run", run_id="0612-kq7m", config_path="/home/ana/demo/demo.yaml", created=T0,
             supervisor_pid=4200, host="gpu-box-3", settings=run_settings)
    rec.emit("attempt", attempt=1, settings=run_settings, fresh=True, reason="start")
    rec.emit("status", status="starting", attempt=1, exit_code=None, signal=None,
             message=None, log_tail=[])


def cpu_two_attempts() -> None:
    rec = Recorder()
    first = settings(False)
    start(rec, first)
    rec.t += 4.0
    hello(rec, 1, 0, first)
    rec.emit("status", status="running", attempt=1, exit_code=None, signal=None, message=None,
             log_tail=[])
    # 200 ms: input 38 %, compute 40 %, all-reduce 15 %, update 3 %, other 4 %.
    next_step = steps(rec, 1, 1, 45, 200.0, 76.0, 10.0, parts=(80.0, 30.0, 6.0))
    rec.emit("status", status="stopping", attempt=1, exit_code=None, signal=None,
             message="relaunch requested", log_tail=[])
    rec.emit("checkpoint", attempt=1, step=next_step - 1, micro_step=next_step - 1,
             path="/runs/0612-kq7m/checkpoints/ckpt-1", seconds=0.21)
    rec.emit("done", attempt=1, reason="sigterm", step=next_step - 1)
    second = settings(True)
    rec.emit("attempt", attempt=2, settings=second, fresh=False, reason="relaunch")
    rec.t += 4.0
    hello(rec, 2, next_step - 1, second)
    rec.emit("resume", attempt=2, from_step=next_step - 1, from_micro_step=next_step - 1,
             checkpoint="/runs/0612-kq7m/checkpoints/ckpt-1")
    rec.emit("status", status="running", attempt=2, exit_code=None, signal=None, message=None,
             log_tail=[])
    # 130 ms: input 4 %, compute 60 %, all-reduce 25 %, update 5 %, other 6 %.
    steps(rec, 2, next_step, 45, 130.0, 5.2, 6.0, parts=(78.0, 32.5, 6.5))
    rec.write("cpu_two_attempts.jsonl")


def cpu_one_attempt() -> None:
    rec = Recorder()
    first = settings(False)
    start(rec, first)
    rec.t += 4.0
    hello(rec, 1, 0, first)
    rec.emit("status", status="running", attempt=1, exit_code=None, signal=None, message=None,
             log_tail=[])
    steps(rec, 1, 1, 45, 200.0, 76.0, 10.0)
    rec.write("cpu_one_attempt.jsonl")


def gpu_running() -> None:
    rec = Recorder()
    first = settings("autotune", batch=1024)
    first["data"]["parallel_calls"] = "autotune"
    start(rec, first)
    rec.t += 6.0
    hello(rec, 1, 0, first, kind="gpu", replicas=2)
    rec.emit("status", status="running", attempt=1, exit_code=None, signal=None, message=None,
             log_tail=[])
    # 48 ms: input 2.5 %, compute 62.5 %, all-reduce 20 %, update 5 %, other 10 %; two
    # A100s on 12 NVLink 3 links each (300 GB/s a direction).
    steps(rec, 1, 1, 45, 48.0, 1.2, 2.0, batch=1024, sampler=gpu_sample, sample_arg=92.0,
          parts=(30.0, 9.6, 2.4))
    rec.write("gpu_running.jsonl")


GIB = 1024**3
EIGHT_GPUS = 8
H100_TOTAL_BYTES = 80 * GIB


def eight_gpu_reading(index: int, sample: int, attempt: int) -> dict[str, Any]:
    """GPU `index` in the `sample`-th sample (0-based, the whole run) of gpu_eight.jsonl.

    Utilization: 52 - index % in attempt 1 (input-bound), 94 - index % in attempt 2,
    30 points lower in every 4th sample (a stall); memory (20 + index / 2) GiB of 80 GiB;
    PCIe tx (1.0 + index / 10) GB/s, rx 2.0 GB/s; NVLink tx/rx (47 + index) MB/s,
    about the gradient-sync estimate (4,687,942 bytes per 100 ms step, 8 replicas).
    """
    util = (52.0 if attempt == 1 else 94.0) - index - (30.0 if sample % 4 == 3 else 0.0)
    return {
        "index": index, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-8000-{index}",
        "lost": False, "mig": False, "util_gpu_pct": util, "util_mem_pct": util / 2,
        "mem_used_bytes": int((20 + index / 2) * GIB), "mem_total_bytes": H100_TOTAL_BYTES,
        "temperature_c": 50 + index, "power_w": 300.0 + index, "power_limit_w": 700.0,
        "sm_clock_mhz": 1980, "pcie_gen": 5, "pcie_width": 16,
        "pcie_tx_bytes_per_s": 1_000_000_000 + index * 100_000_000,
        "pcie_rx_bytes_per_s": 2_000_000_000,
        "nvlink_tx_bytes_per_s": 47_000_000 + index * 1_000_000,
        "nvlink_rx_bytes_per_s": 47_000_000 + index * 1_000_000,
        "processes": [{"pid": 5000 + index, "used_bytes": int(19 * GIB), "in_run": True}],
    }


class EightGpuSampler:
    """The sampler of gpu_eight.jsonl: counts its samples across attempts."""

    def __init__(self) -> None:
        self.samples = 0
        self.attempt = 1

    def __call__(self, rec: Recorder, _arg: float) -> None:
        gpus = [eight_gpu_reading(i, self.samples, self.attempt) for i in range(EIGHT_GPUS)]
        rec.emit("sample", host={"cpu_pct": 38.0, "per_cpu_pct": [38.0] * 16,
                                 "mem_used_bytes": 96_000_000_000,
                                 "mem_total_bytes": 512_000_000_000, "load_1m": 9.1,
                                 "run_cpu_pct": 620.0, "run_rss_bytes": 9_800_000_000},
                 gpus=gpus, nvml=None)
        self.samples += 1


def gpu_eight() -> None:
    """Eight H100s on one host, two attempts (prefetch off, then on), 40 samples.

    Attempt 1: steps 1-60 (55 after warm-up) of 200 +/- 10 ms waiting 80 ms (40.0 %);
    attempt 2 resumes from step 60: steps 61-160 of 100 +/- 4 ms waiting 2 ms (2.0 %).
    A sample every 4 steps (eight_gpu_reading has each GPU's readings).
    """
    rec = Recorder()
    first = settings(False, batch=2048)
    first["strategy"]["cpu_replicas"] = 8
    start(rec, first)
    rec.t += 6.0
    sampler = EightGpuSampler()
    hello(rec, 1, 0, first, kind="gpu", replicas=8, per_replica_batch=256)
    rec.emit("status", status="running", attempt=1, exit_code=None, signal=None, message=None,
             log_tail=[])
    next_step = steps(rec, 1, 1, 60, 200.0, 80.0, 10.0, batch=2048, sampler=sampler,
                      grad_sync_bytes=4_687_942)
    rec.emit("done", attempt=1, reason="sigterm", step=next_step - 1)
    second = settings(True, batch=2048)
    second["strategy"]["cpu_replicas"] = 8
    rec.emit("attempt", attempt=2, settings=second, fresh=False, reason="relaunch")
    rec.t += 5.0
    sampler.attempt = 2
    hello(rec, 2, next_step - 1, second, kind="gpu", replicas=8, per_replica_batch=256)
    rec.emit("resume", attempt=2, from_step=next_step - 1, from_micro_step=next_step - 1,
             checkpoint="/runs/0612-kq7m/checkpoints/ckpt-1")
    rec.emit("status", status="running", attempt=2, exit_code=None, signal=None, message=None,
             log_tail=[])
    steps(rec, 2, next_step, 100, 100.0, 2.0, 4.0, batch=2048, sampler=sampler,
          grad_sync_bytes=4_687_942)
    rec.write("gpu_eight.jsonl")


def cpu_crashed() -> None:
    rec = Recorder()
    first = settings(True)
    start(rec, first)
    rec.t += 4.0
    hello(rec, 1, 0, first)
    rec.emit("status", status="running", attempt=1, exit_code=None, signal=None, message=None,
             log_tail=[])
    last = steps(rec, 1, 1, 15, 130.0, 5.2, 6.0) - 1
    rec.emit("error", attempt=1, kind="runtime",
             message="ResourceExhaustedError: OOM when allocating tensor with shape[1024,512]")
    rec.emit("status", status="crashed", attempt=1, exit_code=1, signal=None,
             message=f"trainer exited with code 1 at step {last}",
             log_tail=[
                 "Traceback (most recent call last):",
                 '  File "trainer_runtime/loop.py", line 212, in run',
                 "    loss = self._step(batch)",
                 "tensorflow.python.framework.errors_impl.ResourceExhaustedError:",
                 "  OOM when allocating tensor with shape[1024,512] type float",
             ])
    rec.write("cpu_crashed.jsonl")


def two_workers_settings() -> dict[str, Any]:
    first = settings(True)
    first["strategy"]["cpu_replicas"] = 1
    first["cluster"] = {
        "launcher": "ssh",
        "workers": [{"host": "gpu-box-3", "data": {}},
                    {"host": "ana@gpu-box-4", "data": {"read_latency_ms": 80.0}}],
        "ports": None, "collective": "auto", "timeout_s": 60.0, "python": None,
        "ssh_options": [],
    }
    return first


def two_workers_attempt(rec: Recorder, attempt: int, first_step: int,
                        own: dict[int, tuple[float, float, float, float]],
                        nvml: str = NVML_MISSING) -> int:
    """One attempt of the two workers: hellos, running, 45 steps (5 of warm-up) of 200 ms
    +/- 10, each worker's (input wait, compute, all-reduce, update) ms as `own` says, and a
    sample per host every 4 steps; returns the next step."""
    hosts = ["gpu-box-3", "gpu-box-4"]
    for worker, host in enumerate(hosts):
        rec.emit("hello", attempt=attempt, pid=4243 + worker + 10 * (attempt - 1),
                 tf_version="2.21.0", replicas=2,
                 device_kind="cpu", devices=[f"/job:worker/replica:0/task:{worker}/device:CPU:0"],
                 param_count=669_706, param_bytes=2_678_824, global_batch_size=256,
                 accumulation_steps=1, per_replica_batch=128, start_step=first_step - 1,
                 start_micro_step=first_step - 1, worker=worker, workers=2, host=host)
    rec.emit("status", status="running", attempt=attempt, exit_code=None, signal=None,
             message=None, log_tail=[])
    for i in range(45):
        number = first_step + i
        warmup_ms = 2400.0 if i == 0 else 320.0
        ms = warmup_ms if i < 5 else 200.0 + (10.0 if i % 2 else -10.0)
        rec.t += ms / 1000.0
        for worker in (0, 1):
            wait, compute, sync, update = own[worker]
            if i < 5:
                wait, compute, sync, update = (part * 1.5 for part in own[worker])
            rec.emit("step", attempt=attempt, step=number, micro_step=number,
                     epoch=number // 64,
                     loss=round(2.3 * 0.985 ** number + 0.08, 5), lr=0.001, examples=256,
                     step_time_ms=round(ms, 3), input_wait_ms=round(wait, 3),
                     grad_sync_bytes=2_694_440, dropped=0, worker=worker,
                     compute_ms=round(compute, 3), sync_ms=round(sync, 3),
                     update_ms=round(update, 3))
        if i % 4 == 3:
            for worker, cpu in ((0, 62.0), (1, 97.0)):
                rec.emit("sample", host={"cpu_pct": cpu, "per_cpu_pct": [cpu, cpu],
                                         "mem_used_bytes": 5_400_000_000,
                                         "mem_total_bytes": 16_700_000_000, "load_1m": 1.9,
                                         "run_cpu_pct": cpu, "run_rss_bytes": 1_250_000_000},
                         gpus=[], nvml=nvml, worker=worker)
    return first_step + 45


def cpu_two_workers() -> None:
    """MultiWorkerMirroredStrategy over two hosts; worker 1 reads with 80 ms latency.

    Ground truth after warm-up: every worker's step is 200 ms (synchronous); the chief
    waits 6 ms on input (3.0 %) and computes 40 ms; worker 1 waits 76 ms (38.0 %) and
    computes 41 ms: worker 1 is the straggler, input-bound. Each host has its sampler.
    The chief's all-reduce takes 140 ms (70 %): it waits there for worker 1, whose own
    takes 69 ms (34.5 %); each updates in 4 ms (2 %) and the rest is 10 ms (5 %).
    """
    rec = Recorder()
    start(rec, two_workers_settings())
    rec.t += 5.0
    # (input wait, compute, all-reduce, update) ms after warm-up
    two_workers_attempt(rec, 1, 1, {0: (6.0, 40.0, 140.0, 4.0), 1: (76.0, 41.0, 69.0, 4.0)})
    rec.write("cpu_two_workers.jsonl")


# What this box's NVML says without a driver: long enough to wrap at 80 columns.
NVML_NO_DRIVER = "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"


def cpu_two_workers_relaunched() -> None:
    """The two workers of cpu_two_workers (NVML's message as a box without a driver says
    it), relaunched (r) with data.parallel_calls=autotune: two attempts whose prefetch,
    accumulation and batch read alike (on 1 256); only parallel_calls tells them apart.

    Ground truth after warm-up: attempt 1 as cpu_two_workers (input wait 38.0 % on worker
    1); attempt 2: worker 1 waits 10 ms (5.0 %), the chief 6 ms (3.0 %), 200 ms steps
    each, 1,280 examples/s (256 examples per 200 ms step) in both attempts.
    """
    rec = Recorder()
    first = two_workers_settings()
    start(rec, first)
    rec.t += 5.0
    next_step = two_workers_attempt(
        rec, 1, 1, {0: (6.0, 40.0, 140.0, 4.0), 1: (76.0, 41.0, 69.0, 4.0)}, NVML_NO_DRIVER)
    rec.emit("status", status="stopping", attempt=1, exit_code=None, signal=None,
             message="relaunch requested", log_tail=[])
    rec.emit("checkpoint", attempt=1, step=next_step - 1, micro_step=next_step - 1,
             path="/runs/0612-kq7m/checkpoints/ckpt-1", seconds=0.21)
    rec.emit("done", attempt=1, reason="sigterm", step=next_step - 1)
    second = two_workers_settings()
    second["data"]["parallel_calls"] = "autotune"
    rec.emit("attempt", attempt=2, settings=second, fresh=False, reason="relaunch")
    rec.t += 5.0
    rec.emit("resume", attempt=2, from_step=next_step - 1, from_micro_step=next_step - 1,
             checkpoint="/runs/0612-kq7m/checkpoints/ckpt-1")
    two_workers_attempt(
        rec, 2, next_step, {0: (6.0, 40.0, 140.0, 4.0), 1: (10.0, 41.0, 135.0, 4.0)},
        NVML_NO_DRIVER)
    rec.write("cpu_two_workers_relaunched.jsonl")


def cpu_three_attempts_ended() -> None:
    """The demo run three times and finished, as `gpuwatch resume RUN --max-steps N
    --set ...` leaves it: attempt 1 prefetch off, max_steps 150; attempt 2 prefetch
    autotune, max_steps 300; attempt 3 also steps_per_execution 8, max_steps 450. Each
    ends max_steps. Two settings differ besides prefetch (max_steps, steps_per_execution):
    too wide for columns at 80.

    Ground truth after warm-up: attempt 1 200 ms (input wait 38.0 %), attempt 2 130 ms
    (4.0 %), attempt 3 100 ms (4.0 %); 256 examples a step: 1,280 / 1,969 / 2,560
    examples/s.
    """
    rec = Recorder()
    plan = [(False, 150, 1, 200.0, 76.0), ("autotune", 300, 1, 130.0, 5.2),
            ("autotune", 450, 8, 100.0, 4.0)]
    step = 1
    for attempt, (prefetch, max_steps, spe, step_ms, wait_ms) in enumerate(plan, 1):
        one = settings(prefetch)
        one["train"]["max_steps"] = max_steps
        one["train"]["steps_per_execution"] = spe
        if attempt == 1:
            start(rec, one)
        else:
            rec.emit("attempt", attempt=attempt, settings=one, fresh=False, reason="resume")
            rec.emit("status", status="starting", attempt=attempt, exit_code=None,
                     signal=None, message=None, log_tail=[])
        rec.t += 4.0
        hello(rec, attempt, step - 1, one)
        rec.emit("status", status="running", attempt=attempt, exit_code=None, signal=None,
                 message=None, log_tail=[])
        step = steps(rec, attempt, step, 45, step_ms, wait_ms, 6.0,
                     parts=(0.6 * step_ms, 0.1 * step_ms, 0.05 * step_ms))
        rec.emit("done", attempt=attempt, reason="max_steps", step=step - 1)
        rec.emit("status", status="finished", attempt=attempt, exit_code=0, signal=None,
                 message=None, log_tail=[])
    rec.write("cpu_three_attempts_ended.jsonl")


def cpu_settings_changed() -> None:
    """The settings screen (e) changed read latency, parallel calls and cache live: prefetch,
    accumulation and batch stay off 1 256, so only those three tell the attempts apart.

    Ground truth after warm-up: attempt 1 (read_latency_ms 40, parallel_calls 1, no cache)
    waits 53.2 ms of 200 (26.6 %); attempt 2 (15, 4, cache) 3.0 ms of 130 (2.3 %).
    """
    rec = Recorder()
    first = settings(False)
    start(rec, first)
    rec.t += 4.0
    hello(rec, 1, 0, first)
    rec.emit("status", status="running", attempt=1, exit_code=None, signal=None, message=None,
             log_tail=[])
    next_step = steps(rec, 1, 1, 45, 200.0, 53.2, 10.0)
    second = settings(False)
    second["data"].update(read_latency_ms=15.0, parallel_calls=4, cache=True)
    changed = ["data.cache", "data.parallel_calls", "data.read_latency_ms"]
    rec.emit("reconfigured", attempt=1, id=1, ok=True, step=next_step - 1, changed=changed,
             seconds=0.4)
    rec.emit("attempt", attempt=2, settings=second, fresh=False, reason="live")
    steps(rec, 2, next_step, 45, 130.0, 3.0, 6.0)
    rec.write("cpu_settings_changed.jsonl")


def cpu_scale() -> None:
    """`gpuwatch scale demo.yaml --replicas 1,2,4 --steps 25` on a 2-core box, weak scaling
    (128 examples per replica): 1 and 2 replicas measured, 4 running (15 of its steps).

    Ground truth after warm-up (steps of step_ms +/- 2 ms in pairs; the parts in ms are
    input, compute, all-reduce, update; other is the rest):
      1 replica   128 ex,  40 ms: 4, 30, 0.5, 3   (other 2.5)
      2 replicas  256 ex,  50 ms: 5, 31, 8, 3     (other 3)
      4 replicas  512 ex,  90 ms: 6, 40, 35, 4    (other 5)
    4 logical CPU replicas on 2 cores: marked as sharing them.
    """
    rec = Recorder()
    base = settings(False, batch=256)
    base["strategy"]["replicas"] = None
    rec.emit("run", run_id="0612-sc4l", config_path="/home/ana/demo/demo.yaml", created=T0,
             supervisor_pid=4200, host="gpu-box-3", settings=base)
    rec.emit("scale", counts=[1, 2, 4], unit="replicas", mode="weak", steps=25, cores=2)
    plan = {1: (40.0, (4.0, 30.0, 0.5, 3.0)), 2: (50.0, (5.0, 31.0, 8.0, 3.0)),
            4: (90.0, (6.0, 40.0, 35.0, 4.0))}
    for attempt, (count, (step_ms, parts)) in enumerate(plan.items(), 1):
        one = settings(False, batch=128 * count)
        one["strategy"]["replicas"] = count
        one["train"]["max_steps"] = 25
        rec.emit("attempt", attempt=attempt, settings=one, fresh=True, reason="scale")
        rec.emit("status", status="starting", attempt=attempt, exit_code=None, signal=None,
                 message=None, log_tail=[])
        rec.t += 5.0
        hello(rec, attempt, 0, one, replicas=count, per_replica_batch=128)
        rec.emit("status", status="running", attempt=attempt, exit_code=None, signal=None,
                 message=None, log_tail=[])
        last = count == 4
        for i in range(15 if last else 25):
            jitter = 0.0 if i < 5 else (2.0 if i % 2 else -2.0)
            ms = 1500.0 if i == 0 else (step_ms * 1.5 if i < 5 else step_ms + jitter)
            wait, compute, sync, update = parts
            rec.t += ms / 1000.0
            rec.emit("step", attempt=attempt, step=i + 1, micro_step=i + 1, epoch=0,
                     loss=round(2.3 * 0.97 ** i + 0.1, 5), lr=0.001, examples=128 * count,
                     step_time_ms=round(ms, 3), input_wait_ms=wait, grad_sync_bytes=7_454_760,
                     dropped=0, compute_ms=compute + jitter / 2, sync_ms=sync, update_ms=update)
            if i % 4 == 3:
                cpu_sample(rec, 90.0)
        if not last:
            rec.emit("done", attempt=attempt, reason="max_steps", step=25)
            rec.emit("status", status="relaunching", attempt=attempt, exit_code=0, signal=None,
                     message="reached max steps; the next attempt follows", log_tail=[])
    rec.write("cpu_scale.jsonl")


if __name__ == "__main__":
    cpu_two_attempts()
    cpu_one_attempt()
    gpu_running()
    cpu_crashed()
    cpu_two_workers()
    cpu_two_workers_relaunched()
    cpu_three_attempts_ended()
    gpu_eight()
    cpu_settings_changed()
    cpu_scale()
