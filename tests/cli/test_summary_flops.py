"""The headless summary's FLOPs figures, from a hello's count and steps of known rate."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwatch.cli.headless import summary_line
from gpuwatch.runstate import WARMUP_STEPS
from tests.support.summary import fold, summary_keys

A100 = "NVIDIA A100-SXM4-80GB"


def frames(*, flops: float | None, device_kind: str = "gpu", gpus: list[dict[str, Any]],
           precision: str = "float32", examples: int = 256, step_ms: float = 100.0,
           steps: int = 12) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        out.append({"type": kind, "seq": len(out), "t": 1000.0 + len(out), **fields})

    add("attempt", attempt=1, settings={"name": "f", "train": {"mixed_precision": precision,
                                                               "global_batch_size": examples}})
    hello: dict[str, Any] = dict(
        attempt=1, pid=1, tf_version="2.21.0", replicas=2, device_kind=device_kind,
        devices=["/job:localhost/replica:0/task:0/device:GPU:0",
                 "/job:localhost/replica:0/task:0/device:GPU:1"],
        param_count=10, param_bytes=40, global_batch_size=examples, accumulation_steps=1,
        per_replica_batch=examples // 2, start_step=0, start_micro_step=0, host="box")
    if flops is not None:
        hello["flops_per_example"] = flops
    add("hello", **hello)
    add("sample", host={"cpu_pct": 1.0}, gpus=[{"index": i, **gpu} for i, gpu in enumerate(gpus)],
        nvml=None if gpus else "no GPU")
    for number in range(1, steps + 1):
        add("step", attempt=1, step=number, micro_step=number, epoch=0, loss=1.0, lr=1e-3,
            examples=examples, step_time_ms=step_ms, input_wait_ms=1.0,
            grad_sync_bytes=0.0)
    return out


def test_tflops_is_flops_per_example_times_examples_per_s_and_mfu_over_the_gpus_peak() -> None:
    flops = 1.5e9
    state = fold(frames(flops=flops, gpus=[{"index": 0, "name": A100},
                                           {"index": 1, "name": A100}]))
    assert state.attempts[1].measured_steps == 12 - WARMUP_STEPS
    line = summary_line(state)
    got = summary_keys(line)
    # Every step: 256 examples in 100 ms = 2560 examples/s.
    rate = 256 / 0.100
    assert float(got["examples_per_s"]) == pytest.approx(rate)
    assert float(got["flops_per_example"]) == pytest.approx(flops, rel=1e-3)
    expected_tflops = flops * rate / 1e12  # 3.84
    assert float(got["tflops"]) == pytest.approx(expected_tflops, rel=5e-3)
    # float32 on an A100 runs on TF32 tensor cores: 156 TFLOP/s dense each, two replicas.
    assert float(got["mfu_pct"]) == pytest.approx(100 * expected_tflops / (2 * 156), rel=5e-3)
    # The keys that were there keep their order: the other parts follow the input wait,
    # the bus bandwidth comes last.
    assert list(got) == ["steps", "examples_per_s", "input_wait_pct", "compute_pct",
                         "sync_pct", "update_pct", "other_pct", "replicas", "attempt",
                         "workers", "flops_per_example", "tflops", "mfu_pct",
                         "bus_bytes_per_s"]


def test_mixed_bfloat16_takes_the_bf16_peak() -> None:
    flops = 2e9
    state = fold(frames(flops=flops, precision="mixed_bfloat16", examples=512, step_ms=50.0,
                        gpus=[{"name": A100}, {"name": A100}]))
    got = summary_keys(summary_line(state))
    tflops = flops * (512 / 0.050) / 1e12  # 20.48
    assert float(got["tflops"]) == pytest.approx(tflops, rel=5e-3)
    assert float(got["mfu_pct"]) == pytest.approx(100 * tflops / (2 * 312), rel=5e-3)


def test_a_cpu_run_shows_the_achieved_figure_and_no_percentage() -> None:
    flops = 9.56416e6
    state = fold(frames(flops=flops, device_kind="cpu", gpus=[]))
    got = summary_keys(summary_line(state))
    assert float(got["tflops"]) == pytest.approx(flops * 2560 / 1e12, rel=5e-3)
    assert "mfu_pct" not in got


def test_an_unknown_gpu_or_a_mig_slice_shows_no_percentage() -> None:
    for gpus in ([{"name": "NVIDIA A10G"}, {"name": "NVIDIA A10G"}],
                 [{"name": A100, "mig": True}, {"name": A100, "mig": True}]):
        got = summary_keys(summary_line(fold(frames(flops=1e9, gpus=gpus))))
        assert float(got["tflops"]) == pytest.approx(1e9 * 2560 / 1e12, rel=5e-3)
        assert "mfu_pct" not in got


def test_no_count_in_the_hello_is_not_available() -> None:
    got = summary_keys(summary_line(fold(frames(flops=None, gpus=[{"name": A100}] * 2))))
    assert got["flops_per_example"] == "n/a" and got["tflops"] == "n/a"
    assert "mfu_pct" not in got


def test_a_live_change_keeps_the_count_and_a_relaunch_takes_its_own() -> None:
    events = frames(flops=1e9, gpus=[{"name": A100}] * 2)
    seq = len(events)
    # A live change: the same trainer and model go on, no hello of their own.
    events.append({"type": "attempt", "seq": seq, "t": 2000.0, "attempt": 2, "reason": "live",
                   "settings": {"name": "f", "train": {"global_batch_size": 512}}})
    state = fold(events)
    assert state.attempt == 2 and state.flops_per_example == 1e9
    # A relaunch whose trainer could not count: the old attempt's figure is not reused.
    hello = dict(next(e for e in events if e["type"] == "hello"))
    hello.update(seq=seq + 2, attempt=3)
    hello.pop("flops_per_example")
    state.apply_many([
        {"type": "attempt", "seq": seq + 1, "t": 2001.0, "attempt": 3, "reason": "relaunch",
         "settings": {"name": "f"}},
        hello,
    ])
    assert state.attempt == 3 and state.flops_per_example is None
