"""The advisor's verdict for every bottleneck, on runs made for each with known parts.

Each run is a RunState folded from constructed events: steps whose input wait, compute,
all-reduce, update and rest are known, a hello with the model's bytes, a device sample
with known memory and GPUs. The verdict must name the part made to hold the step back,
with its share as made, and the remedy with its dashboard key.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.advisor import (
    HIGH_SYNC_PCT,
    MODERATE_SYNC_PCT,
    Advice,
    model_state_bytes,
    reading,
)
from gpuwatch.runstate import WARMUP_STEPS, RunState

STEP_MS = 100.0
GB = 1_000_000_000
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
# Settings a relaunch would change, as a validated config gives them.
SETTINGS: dict[str, Any] = {
    "name": "v",
    "data": {"prefetch": True, "parallel_calls": "autotune"},
    "train": {"global_batch_size": 256, "accumulation_steps": 1, "optimizer": "adam",
              "mixed_precision": "mixed_bfloat16", "jit_compile": True,
              "steps_per_execution": 1},
    "strategy": {"cpu_replicas": 2, "cross_device_ops": "auto"},
}


def gpu(index: int, *, name: str = H100, used: int = 20 * GB, total: int = 80 * GB,
        **extra: Any) -> dict[str, Any]:
    return {"index": index, "name": name, "mem_used_bytes": used, "mem_total_bytes": total,
            "util_gpu_pct": 90.0, "nvlink_links_active": 18, "nvlink_version": 4,
            "pcie_gen": 5, "pcie_width": 16, "processes": [], **extra}


def run(parts: dict[str, float] | None, **made: Any) -> RunState:
    """The run of ``run_events``, folded."""
    state = RunState()
    state.apply_many(run_events(parts, **made))
    assert state.bad_events == 0
    return state


def run_events(parts: dict[str, float] | None, *, settings: dict[str, Any] | None = None,
               gpus: list[dict[str, Any]] | None = None, param_bytes: int = 40_000_000,
               device_kind: str = "gpu", bus_bytes: float = 0.0, steps: int = 12
               ) -> list[dict[str, Any]]:
    """A one-host run of two replicas: `steps` steps of STEP_MS, each split as `parts`
    (input, compute, sync, update in ms; the rest is the host's), after warm-up steps."""
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "seq": len(events), "t": 1000.0 + len(events), **fields})

    config = settings or SETTINGS
    add("attempt", attempt=1, settings=config)
    batch = config["train"]["global_batch_size"]
    add("hello", attempt=1, pid=1, tf_version="2.21.0", replicas=2, device_kind=device_kind,
        devices=["GPU:0", "GPU:1"], param_count=param_bytes // 4, param_bytes=param_bytes,
        global_batch_size=batch, accumulation_steps=1, per_replica_batch=batch // 2,
        start_step=0, start_micro_step=0, host="box")
    add("sample", host={"cpu_pct": 10.0}, gpus=gpus if gpus is not None else [gpu(0), gpu(1)],
        nvml=None)
    if parts is not None:
        for number in range(1, WARMUP_STEPS + steps + 1):
            add("step", attempt=1, step=number, micro_step=number, epoch=0, loss=1.0, lr=1e-3,
                examples=batch, step_time_ms=STEP_MS, input_wait_ms=parts["input"],
                compute_ms=parts["compute"], sync_ms=parts["sync"],
                update_ms=parts["update"], grad_sync_bytes=bus_bytes)
    return events


def advice_of(state: RunState) -> Advice:
    return reading(state).advice


def keys(advice: Advice) -> list[str | None]:
    return [remedy.key for remedy in advice.remedies]


def setting(config: dict[str, Any], **train: Any) -> dict[str, Any]:
    return {**config, "train": {**config["train"], **train}}


# ---- communication-bound ---------------------------------------------------------------


def test_communication_bound_names_the_all_reduce_share_and_its_bus_against_nvlink() -> None:
    # 21 ms of each 100 ms step all-reduces 142 GB/s x 21 ms of bus bytes; 18 NVLink 4
    # links at 25 GB/s each: 450 GB/s.
    bus = 142 * GB * 0.021
    state = run({"input": 1.0, "compute": 60.0, "sync": 21.0, "update": 4.0}, bus_bytes=bus)
    advice = advice_of(state)
    assert advice.bottleneck == "communication" and advice.level == "high"
    assert advice.share_pct == pytest.approx(21.0)
    assert advice.verdict == (
        "highly communication-bound: all-reduce 21% of the step, 142 GB/s bus "
        f"= {100 * 142 / 450:.0f}% of NVLink")
    # Accumulation first: it all-reduces once per k micro-steps; then a bigger batch.
    assert keys(advice)[:2] == ["a", "b"]
    assert advice.remedies[0].setting == "train.accumulation_steps"
    assert advice.recommendations[0] == "accumulation (a): one all-reduce per k micro-steps"


def test_communication_without_a_known_link_gives_the_achieved_figure_alone() -> None:
    state = run({"input": 1.0, "compute": 60.0, "sync": 21.0, "update": 4.0},
                gpus=[], device_kind="cpu", bus_bytes=3.2 * GB * 0.021)
    advice = advice_of(state)
    assert advice.verdict == "highly communication-bound: all-reduce 21% of the step, " \
                             "3.2 GB/s bus"


@pytest.mark.parametrize(("sync_ms", "level"), [
    (MODERATE_SYNC_PCT, "moderate"), (HIGH_SYNC_PCT - 0.5, "moderate"), (HIGH_SYNC_PCT, "high"),
])
def test_communication_grades_are_the_profilers_3_and_15_percent(sync_ms, level) -> None:
    state = run({"input": 0.0, "compute": 95.0 - sync_ms, "sync": sync_ms, "update": 2.0})
    advice = advice_of(state)
    assert (advice.bottleneck, advice.level) == ("communication", level)
    assert advice.verdict.startswith(f"{'highly' if level == 'high' else 'moderately'} "
                                     "communication-bound: all-reduce")


def test_a_slow_cross_device_ops_gets_nccl_as_a_relaunch() -> None:
    config = {**SETTINGS, "strategy": {"cpu_replicas": 2, "cross_device_ops": "reduce_to_one"}}
    advice = advice_of(run({"input": 1.0, "compute": 60.0, "sync": 21.0, "update": 4.0},
                           settings=config))
    nccl = [r for r in advice.remedies if r.setting == "strategy.cross_device_ops"]
    assert len(nccl) == 1 and nccl[0].key is None
    assert nccl[0].text.startswith("set strategy.cross_device_ops=nccl (relaunch)")


def test_with_memory_full_the_all_reduce_remedy_is_accumulation_not_a_bigger_batch() -> None:
    full = [gpu(0, used=76 * GB), gpu(1, used=20 * GB)]
    advice = advice_of(run({"input": 1.0, "compute": 60.0, "sync": 21.0, "update": 4.0},
                           gpus=full))
    assert advice.bottleneck == "communication"
    assert "b" not in keys(advice) and keys(advice)[0] == "a"
    assert advice.recommendations[-1] == "GPU 0 memory 95% full: a bigger batch (b) would not fit"


# ---- compute-bound ---------------------------------------------------------------------


def test_compute_bound_with_low_utilisation_says_why_and_what_to_change() -> None:
    # 16 examples per replica, no XLA, float32 on A100s (bfloat16 peak twice TF32's).
    config = setting(SETTINGS, global_batch_size=32, jit_compile=False,
                     mixed_precision="float32")
    state = run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0}, settings=config,
                gpus=[gpu(0, name=A100), gpu(1, name=A100)])
    advice = advice_of(state)
    assert advice.bottleneck == "compute" and advice.share_pct == pytest.approx(91.0)
    assert advice.verdict == ("compute-bound: compute 91% of the step; low utilisation: "
                              "per-replica batch 16, no XLA, float32")
    assert keys(advice)[0] == "b"
    assert [r.setting for r in advice.remedies] == [
        "train.global_batch_size", "train.jit_compile", "train.mixed_precision"]
    assert "train.mixed_precision=mixed_bfloat16" in advice.remedies[2].text
    assert "2x" in advice.remedies[2].text


def test_compute_bound_on_a_well_set_run_has_no_utilisation_complaint() -> None:
    advice = advice_of(run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0}))
    assert advice.verdict == "compute-bound: compute 91% of the step"
    assert advice.level == "none"
    assert advice.recommendations == [
        "the devices do the step's work: more replicas add throughput"]


def test_a_v100_in_float32_is_told_float16_it_has_no_bfloat16() -> None:
    config = setting(SETTINGS, mixed_precision="float32")
    v100 = [gpu(0, name="Tesla V100-SXM2-16GB", total=16 * GB, used=2 * GB),
            gpu(1, name="Tesla V100-SXM2-16GB", total=16 * GB, used=2 * GB)]
    advice = advice_of(run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0},
                           settings=config, gpus=v100))
    (precision,) = [r for r in advice.remedies if r.setting == "train.mixed_precision"]
    assert precision.text.startswith("set train.mixed_precision=mixed_float16 (relaunch)")


# ---- input-bound -----------------------------------------------------------------------


def test_input_bound_keeps_its_wording_and_names_prefetch() -> None:
    config = {**SETTINGS, "data": {"prefetch": False, "parallel_calls": 1}}
    # Input 30 % is the largest of the parts over their grades (sync 5 %, host 10 %).
    state = run({"input": 30.0, "compute": 50.0, "sync": 5.0, "update": 5.0}, settings=config)
    advice = advice_of(state)
    assert advice.bottleneck == "input" and advice.level == "high"
    assert advice.verdict == "highly input-bound: 30.0% of step time waiting for input"
    assert advice.share_pct == pytest.approx(30.0)
    assert keys(advice)[0] == "p"
    assert advice.recommendations[0].startswith("turn prefetch on (p)")


# ---- update- and host-bound ------------------------------------------------------------


def test_update_bound_names_the_optimizer_update() -> None:
    advice = advice_of(run({"input": 1.0, "compute": 60.0, "sync": 2.0, "update": 25.0}))
    assert (advice.bottleneck, advice.level) == ("update", "high")
    assert advice.verdict == "highly update-bound: optimizer update 25% of the step"
    assert keys(advice)[:2] == ["a", "b"]


def test_host_bound_names_the_unmeasured_rest_and_steps_per_execution() -> None:
    advice = advice_of(run({"input": 1.0, "compute": 60.0, "sync": 2.0, "update": 2.0}))
    assert (advice.bottleneck, advice.level) == ("host", "high")
    assert advice.share_pct == pytest.approx(35.0)
    assert advice.verdict.startswith("highly host-bound: 35% of the step outside")
    assert advice.remedies[0].setting == "train.steps_per_execution"


# ---- memory-bound ----------------------------------------------------------------------


def test_memory_bound_recommends_accumulation_rather_than_a_bigger_batch() -> None:
    full = [gpu(0, used=30 * GB), gpu(1, used=76 * GB)]
    advice = advice_of(run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0},
                           gpus=full))
    assert (advice.bottleneck, advice.level) == ("memory", "moderate")
    assert advice.share_pct == pytest.approx(95.0)
    assert advice.verdict == "memory-bound: GPU 1 memory 95% full, compute 91% of the step"
    assert keys(advice) == ["a"]
    assert "a bigger batch (b) would not fit" in advice.recommendations[0]


def test_memory_just_under_90_percent_is_not_memory_bound() -> None:
    advice = advice_of(run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0},
                           gpus=[gpu(0, used=71 * GB), gpu(1, used=71 * GB)]))
    assert advice.bottleneck == "compute"


# ---- too large for data parallelism ----------------------------------------------------


def test_a_model_whose_state_exceeds_one_gpu_is_too_large_for_data_parallelism() -> None:
    # 30 GB of weights under Adam: weights + 2 slots + gradients = 120 GB > 80 GB.
    state = run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0},
                param_bytes=30 * GB)
    advice = advice_of(state)
    assert (advice.bottleneck, advice.level) == ("too-large", "high")
    assert advice.verdict == ("too large for data parallelism: weights, Adam's 2 slots, "
                              "gradients need 120.0 GB, one GPU holds 80.0 GB")
    assert advice.share_pct == pytest.approx(150.0)
    said = " ".join(advice.recommendations)
    assert "MirroredStrategy keeps a full copy on every replica" in said
    assert "keras.distribution.ModelParallel on the JAX backend" in said
    assert all(remedy.key is None for remedy in advice.remedies)


def test_too_large_is_said_before_any_step_is_measured() -> None:
    # The run that cannot hold its model never gets past its first step: the hello and the
    # sample say it.
    advice = advice_of(run(None, param_bytes=30 * GB))
    assert advice.bottleneck == "too-large"


def test_sgd_keeps_no_slots_so_the_same_model_fits() -> None:
    config = setting(SETTINGS, optimizer="sgd")
    assert model_state_bytes(30 * GB, "sgd", 1) == 60 * GB
    assert model_state_bytes(30 * GB, "adam", 4) == 150 * GB  # accumulators too
    advice = advice_of(run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0},
                           settings=config, param_bytes=30 * GB))
    assert advice.bottleneck == "compute"


def test_cpu_replicas_share_the_host_so_no_gpu_bound_applies() -> None:
    advice = advice_of(run({"input": 1.0, "compute": 91.0, "sync": 2.0, "update": 2.0},
                           gpus=[], device_kind="cpu", param_bytes=30 * GB))
    assert advice.bottleneck == "compute"


# ---- without a breakdown: as before ----------------------------------------------------


def test_steps_without_a_breakdown_keep_the_input_only_verdict() -> None:
    state = run({"input": 2.0, "compute": 60.0, "sync": 21.0, "update": 4.0})
    events = []
    for point in state.window:  # the same steps, from a trainer that does not time sync
        fields = {f: getattr(point.event, f) for f in ("attempt", "step", "micro_step",
                  "epoch", "loss", "lr", "examples", "step_time_ms", "input_wait_ms",
                  "grad_sync_bytes", "compute_ms")}
        events.append({"type": "step", **fields})
    plain = RunState()
    plain.apply({"type": "attempt", "attempt": 1, "settings": SETTINGS})
    plain.apply_many(events)
    advice = advice_of(plain)
    assert advice.verdict == "not input-bound: 2.0% of step time waiting for input"
    assert advice.bottleneck == "none"


# ---- a cluster: one verdict per worker, the straggler's first --------------------------


def cluster(parts_by_worker: dict[int, dict[str, float]], steps: int = 12) -> RunState:
    """A two-host CPU cluster whose workers' steps are split as given (ms of STEP_MS)."""
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "seq": len(events), "t": 1000.0 + len(events), **fields})

    workers = len(parts_by_worker)
    config = {**SETTINGS, "cluster": {"launcher": "local",
                                      "workers": [{"host": "localhost"}] * workers}}
    add("attempt", attempt=1, settings=config)
    for w in parts_by_worker:
        add("hello", attempt=1, pid=100 + w, tf_version="2.21.0", replicas=workers,
            device_kind="cpu", devices=["/job:worker/device:CPU:0"], param_count=10,
            param_bytes=40, global_batch_size=256, accumulation_steps=1,
            per_replica_batch=256 // workers, start_step=0, start_micro_step=0, worker=w,
            workers=workers, host=f"host-{w}")
    for number in range(1, WARMUP_STEPS + steps + 1):
        for w, parts in parts_by_worker.items():
            add("step", attempt=1, step=number, micro_step=number, epoch=0, loss=1.0, lr=1e-3,
                examples=256, step_time_ms=STEP_MS, input_wait_ms=parts["input"],
                compute_ms=parts["compute"], sync_ms=parts["sync"], update_ms=parts["update"],
                grad_sync_bytes=0.0, worker=w)
    state = RunState()
    state.apply_many(events)
    assert state.bad_events == 0
    return state


# Worker 1 reads slowly: 38 ms of each step waiting for input; the chief waits for it in
# the all-reduce (45 ms of its step).
SLOW_READER = {0: {"input": 3.0, "compute": 40.0, "sync": 45.0, "update": 5.0},
               1: {"input": 38.0, "compute": 40.0, "sync": 10.0, "update": 5.0}}


def test_a_cluster_gets_a_verdict_per_worker_the_stragglers_first() -> None:
    now = reading(cluster(SLOW_READER))
    assert now.straggler is not None and now.straggler.worker == 1
    advice = now.advice
    # The headline is the straggler's, named; the chief's all-reduce is its wait for it.
    assert advice.verdict == ("highly input-bound on worker 1: 38.0% of its step time "
                              "waiting for input")
    assert advice.bottleneck == "input" and advice.share_pct == pytest.approx(38.0)
    assert [(v.worker, v.straggler) for v in advice.workers] == [(1, True), (0, False)]
    assert advice.workers[0].line == (
        "worker 1 (host-1): highly input-bound: 38.0% of its step time waiting for input")
    assert advice.workers[1].line == (
        "worker 0 (host-0): highly communication-bound: all-reduce 45% of its step "
        "(it waits there for worker 1)")
    assert advice.recommendations[0].startswith("worker 1 waits on input")


def test_a_cluster_without_a_straggler_gives_each_worker_its_own_verdict_by_index() -> None:
    even = {w: {"input": 1.0, "compute": 60.0, "sync": 25.0, "update": 4.0} for w in (0, 1)}
    advice = reading(cluster(even)).advice
    assert advice.verdict == "highly communication-bound: all-reduce 25% of the step"
    assert [v.worker for v in advice.workers] == [0, 1]
    assert all(v.finding.kind == "communication" for v in advice.workers)


def test_two_parts_both_high_put_the_runner_ups_fix_one_key_away() -> None:
    # The demo before `p`: 31 ms of host work and 30 ms of input wait in a 100 ms step.
    config = {**setting(SETTINGS, steps_per_execution=1),
              "data": {"prefetch": False, "parallel_calls": 1}}
    state = run({"input": 30.0, "compute": 23.0, "sync": 1.0, "update": 15.0},
                settings=config, gpus=[], device_kind="cpu")
    advice = advice_of(state)
    assert advice.bottleneck == "host" and advice.share_pct == pytest.approx(31.0)
    # Its own first fix, then the input's (prefetch, p), then the rest of its own.
    assert [r.setting for r in advice.remedies][:3] == [
        "train.steps_per_execution", "data.prefetch", "train.global_batch_size"]
    assert advice.recommendations[1].startswith("turn prefetch on (p)")
    # A runner-up only moderate adds nothing.
    state = run({"input": 8.0, "compute": 45.0, "sync": 1.0, "update": 15.0},
                settings=config, gpus=[], device_kind="cpu")
    assert "p" not in keys(advice_of(state))
