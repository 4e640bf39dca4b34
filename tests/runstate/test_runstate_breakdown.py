"""The breakdown and the all-reduce's bus bandwidth as RunState folds them from steps.

Known parts in, known shares and bandwidth out: sums of each part over the measured
steps (warm-up left out), the bus bandwidth as nccl-tests defines it, and its share of
the link the chief's host sample tells.
"""

from __future__ import annotations

import pytest

from gpuwatch.runstate import WARMUP_STEPS, RunState
from tests.runstate.test_runstate import SETTINGS, step
from trainer_runtime.protocol import Breakdown, breakdown, sum_breakdowns

# Parts of one measured step, in ms: input 10, compute 50, sync 20, update 5, other 15.
PARTS = {"input_wait_ms": 10.0, "compute_ms": 50.0, "sync_ms": 20.0, "update_ms": 5.0}
BUS_BYTES = 4.5e9  # grad_sync_bytes of an update: bytes x 2(n-1)/n


def _run(samples: list[dict] | None = None, workers: int = 1) -> RunState:
    state = RunState()
    state.apply({"type": "attempt", "seq": 0, "attempt": 1, "settings": SETTINGS})
    events = [{"type": "hello", "seq": 1, "attempt": 1, "pid": 1, "tf_version": "2.21",
               "replicas": 2 * workers, "device_kind": "gpu", "devices": ["GPU:0", "GPU:1"],
               "param_count": 1, "param_bytes": 4, "global_batch_size": 256,
               "accumulation_steps": 1, "per_replica_batch": 128, "start_step": 0,
               "start_micro_step": 0, "workers": workers}]
    for sample in samples or []:
        events.append({"type": "sample", "seq": 2, "host": {}, "gpus": sample, "nvml": None})
    for i in range(WARMUP_STEPS):  # warm-up: all sync, must not count
        events.append(step(10 + i, 1, i + 1, 900.0, 0.0, compute_ms=0.0, sync_ms=900.0,
                           update_ms=0.0, grad_sync_bytes=BUS_BYTES))
    for j in range(8):
        events.append(step(100 + j, 1, 10 + j, 100.0, PARTS["input_wait_ms"],
                           **{k: v for k, v in PARTS.items() if k != "input_wait_ms"},
                           grad_sync_bytes=BUS_BYTES))
    state.apply_many(events)
    return state


def test_shares_are_each_parts_sum_over_the_step_times_and_add_to_100() -> None:
    figures = _run().figures()
    assert figures.breakdown is not None
    shares = figures.breakdown.shares()
    assert shares == pytest.approx(
        {"input": 10.0, "compute": 50.0, "sync": 20.0, "update": 5.0, "other": 15.0})
    assert sum(shares.values()) == pytest.approx(100.0)
    attempt = _run().current
    assert attempt is not None and attempt.breakdown is not None
    assert attempt.breakdown.shares() == pytest.approx(shares)
    assert attempt.breakdown.step_ms == pytest.approx(8 * 100.0)  # warm-up left out


def test_bus_bandwidth_is_the_updates_bus_bytes_over_the_all_reduce_time() -> None:
    figures = _run().figures()
    # 4.5 GB in 20 ms: 225 GB/s, whatever the step time.
    assert figures.bus_bytes_per_s == pytest.approx(225e9)
    assert figures.link is None and figures.bus_pct_of_link is None  # no sample: no link
    attempt = _run().current
    assert attempt is not None and attempt.bus_bytes_per_s == pytest.approx(225e9)


def test_bus_bandwidth_as_a_share_of_the_link_the_sample_tells() -> None:
    nvlink = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "nvlink_links_active": 18,
               "nvlink_version": 4, "pcie_gen": 5, "pcie_width": 16, "processes": []}
              for i in range(2)]
    figures = _run([nvlink]).figures()
    assert figures.link is not None and figures.link.kind == "NVLink"
    assert figures.bus_pct_of_link == pytest.approx(100.0 * 225e9 / 450e9)
    # Across hosts the network is not NVML's to tell: the achieved figure alone.
    clustered = _run([nvlink], workers=2).figures()
    assert clustered.link is None and clustered.bus_pct_of_link is None
    assert clustered.bus_bytes_per_s == pytest.approx(225e9)


def test_steps_from_an_older_trainer_have_no_breakdown() -> None:
    state = RunState()
    state.apply({"type": "attempt", "seq": 0, "attempt": 1, "settings": SETTINGS})
    state.apply_many([step(1 + i, 1, i + 1, 100.0, 10.0, compute_ms=40.0)
                      for i in range(WARMUP_STEPS + 5)])
    figures = state.figures()
    assert figures.breakdown is None and figures.bus_bytes_per_s is None
    assert figures.input_wait_pct == pytest.approx(10.0)


def test_parts_that_overrun_the_step_by_rounding_still_sum_to_100() -> None:
    over = breakdown(100.0, 10.0, 60.0, 25.0, 5.0000001)
    assert over is not None and over.other_ms == 0.0
    assert sum(over.shares().values()) == pytest.approx(100.0)
    assert breakdown(0.0, 0.0, 0.0, 0.0, 0.0) is None
    assert breakdown(10.0, 1.0, None, 1.0, 1.0) is None
    assert breakdown(10.0, 1.0, float("nan"), 1.0, 1.0) is None
    assert sum_breakdowns([None, Breakdown(10, 1, 2, 3, 4), Breakdown(10, 1, 2, 3, 4)]) == (
        Breakdown(20, 2, 4, 6, 8))
    assert sum_breakdowns([None]) is None
