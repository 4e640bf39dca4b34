"""The verdict against any breakdown: it names the largest part over its grade, else compute,
and any figure may be missing without a crash."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.advisor import LEVELS, advise
from gpuwatch.measures import peaks
from gpuwatch.runstate import Figures, HostReading, StepPoint, step_figures
from gpuwatch.runstate.steps import MIN_SHARE_STEPS
from trainer_runtime.protocol import Breakdown, GpuProcess, GpuSample, Hello, HostSample, Step

# Each part's moderate grade, in % of the step, written out here as the docs state them:
# input 5 (TF Profiler), all-reduce 3 (its collectives' grade), update and host 5.
MODERATE = {"input": 5.0, "sync": 3.0, "update": 5.0, "other": 5.0}
NAMES = {"input": "input", "sync": "communication", "update": "update", "other": "host"}
SETTINGS = {"data": {"prefetch": True, "parallel_calls": "autotune"},
            "train": {"global_batch_size": 256, "accumulation_steps": 1}}

ms = st.floats(min_value=0.0, max_value=500.0, allow_nan=False, allow_infinity=False)


def figures_of(input_ms: float, compute_ms: float, sync_ms: float, update_ms: float,
               other_ms: float, steps: int = MIN_SHARE_STEPS) -> Figures:
    step_ms = input_ms + compute_ms + sync_ms + update_ms + other_ms
    return step_figures([
        StepPoint(Step(attempt=1, step=i, micro_step=i, epoch=0, loss=1.0, lr=1e-3,
                       examples=256, step_time_ms=step_ms, input_wait_ms=input_ms,
                       grad_sync_bytes=1e6, compute_ms=compute_ms, sync_ms=sync_ms,
                       update_ms=update_ms))
        for i in range(steps)
    ])


@settings(max_examples=400, deadline=None)
@given(ms, ms, ms, ms, ms)
def test_the_verdict_names_the_largest_part_over_its_grade(input_ms, compute_ms, sync_ms,
                                                           update_ms, other_ms) -> None:
    figures = figures_of(input_ms, compute_ms, sync_ms, update_ms, other_ms)
    advice = advise(figures, SETTINGS, replicas=2)
    if figures.breakdown is None:  # a step of no time: nothing measured
        assert advice.level == "unknown" or advice.bottleneck in ("none", "input")
        return
    shares = {part: figures.breakdown.pct(part) for part in MODERATE}
    shares["input"] = figures.input_wait_pct or 0.0  # the verdict's is the metrics line's
    over = {part: share for part, share in shares.items() if share >= MODERATE[part]}
    if not over:
        assert advice.bottleneck == "compute"
        assert advice.share_pct == pytest.approx(figures.breakdown.pct("compute"))
        return
    top = max(over.values())
    assert advice.bottleneck in {NAMES[part] for part, share in over.items() if share == top}
    assert advice.share_pct == pytest.approx(top)
    assert advice.level in ("high", "moderate")


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


gpus = st.lists(st.builds(
    GpuSample,
    index=st.integers(0, 7),
    name=maybe(st.sampled_from(["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
                                "Tesla V100-SXM2-16GB", "NVIDIA A10G", "x"])),
    mem_used_bytes=maybe(st.integers(0, 10**12)),
    mem_total_bytes=maybe(st.integers(0, 10**12)),
    util_gpu_pct=maybe(st.floats(0, 100)),
    lost=st.booleans(),
    processes=st.lists(st.builds(GpuProcess, pid=st.integers(1, 9), used_bytes=st.none(),
                                 in_run=st.booleans())).map(tuple),
), max_size=3)
hellos = st.builds(
    Hello, attempt=st.just(1), pid=st.just(1), tf_version=st.just("2.21"),
    replicas=st.integers(1, 8), device_kind=st.sampled_from(["gpu", "cpu"]),
    devices=st.just(["GPU:0"]), param_count=st.integers(0, 10**10),
    param_bytes=st.integers(0, 10**12), global_batch_size=st.integers(1, 4096),
    accumulation_steps=st.integers(1, 8), per_replica_batch=st.integers(1, 512),
    start_step=st.just(0), start_micro_step=st.just(0), workers=st.integers(1, 4),
)
configs = st.fixed_dictionaries({}, optional={
    "data": st.fixed_dictionaries({}, optional={"prefetch": maybe(st.booleans()),
                                                "parallel_calls": maybe(st.integers(1, 8))}),
    "train": st.fixed_dictionaries({}, optional={
        "global_batch_size": maybe(st.integers(1, 4096)),
        "accumulation_steps": maybe(st.integers(1, 8)),
        "optimizer": maybe(st.sampled_from(["adam", "sgd", "other"])),
        "mixed_precision": maybe(st.sampled_from(["float32", "mixed_float16",
                                                  "mixed_bfloat16"])),
        "jit_compile": maybe(st.booleans()),
        "steps_per_execution": maybe(st.integers(1, 8)),
    }),
    "strategy": st.fixed_dictionaries({}, optional={"cross_device_ops": maybe(
        st.sampled_from(["auto", "nccl", "reduce_to_one", "hierarchical_copy"]))}),
})
breakdowns = maybe(st.builds(Breakdown, ms, ms, ms, ms, ms))
pcts = maybe(st.floats(0, 100))


@settings(max_examples=300, deadline=None)
@given(breakdowns, pcts, maybe(st.floats(0, 1e12)), pcts, pcts, gpus, maybe(hellos), configs,
       st.integers(1, 16), st.booleans())
def test_any_missing_figure_gives_a_verdict_not_a_crash(breakdown, wait, bus, share, mfu,
                                                        gpu_list, hello, config, replicas,
                                                        with_link) -> None:
    figures = Figures(input_wait_pct=wait, breakdown=breakdown, bus_bytes_per_s=bus,
                      bus_pct_of_link=share, mfu_pct=mfu,
                      link=peaks.LinkPeak("NVLink", 450e9) if with_link else None)
    sample = HostReading(HostSample(), gpu_list, None, None)
    advice = advise(figures, config, sample, replicas, None, hello=hello)
    assert advice.level in LEVELS
    assert isinstance(advice.verdict, str) and advice.verdict
    assert len(advice.recommendations) <= 3
    assert all(isinstance(r, str) for r in advice.recommendations)
