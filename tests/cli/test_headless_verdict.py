"""Headless's summary gives the step's five parts, and its last line is the verdict.

Runs folded from constructed events with known parts: the summary's five percentages are
those parts' shares, add to 100, and are n/a where no part was timed; the output of an
ended run ends with `verdict: ...`, the advisor's verdict on the summary's figures.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.cli.headless import _ended, part_shares, recorded_state, summary_line, verdict_line
from gpuwatch.runs.folders import RunInfo
from gpuwatch.runstate import WARMUP_STEPS
from tests.support.summary import fold, summary_keys
from trainer_runtime.protocol import Breakdown

PARTS = ("input_wait_pct", "compute_pct", "sync_pct", "update_pct", "other_pct")
SETTINGS = {"name": "h", "data": {"prefetch": True, "parallel_calls": "autotune"},
            "train": {"global_batch_size": 256, "accumulation_steps": 1,
                      "jit_compile": True, "mixed_precision": "float32"}}


def frames(parts: dict[int, tuple[float, ...]], *, steps: int = 12,
           bus_bytes: float = 0.0) -> list[dict[str, Any]]:
    """Steps of every worker in `parts`: (step, input, compute, sync, update) ms, or
    (step, input) for a trainer that does not time the parts."""
    out: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        out.append({"type": kind, "seq": len(out), "t": 1000.0 + len(out), **fields})

    workers = len(parts)
    add("attempt", attempt=1, settings=SETTINGS)
    for w in parts:
        add("hello", attempt=1, pid=1 + w, tf_version="2.21.0", replicas=2 * workers,
            device_kind="cpu", devices=["CPU:0", "CPU:1"], param_count=10, param_bytes=40,
            global_batch_size=256, accumulation_steps=1, per_replica_batch=256 // workers // 2,
            start_step=0, start_micro_step=0, worker=w, workers=workers, host=f"host-{w}")
    for number in range(1, steps + 1):
        for w, split in parts.items():
            timed = dict(zip(("compute_ms", "sync_ms", "update_ms"), split[2:], strict=False))
            add("step", attempt=1, step=number, micro_step=number, epoch=0, loss=1.0, lr=1e-3,
                examples=256, step_time_ms=split[0], input_wait_ms=split[1],
                grad_sync_bytes=bus_bytes, worker=w, **timed)
    out.append({"type": "status", "seq": len(out), "attempt": 1, "status": "finished"})
    return out


def shown(line: str) -> list[float]:
    got = summary_keys(line)
    return [float(got[key]) for key in PARTS]


def test_the_five_parts_are_the_known_shares_and_add_to_100() -> None:
    # 100 ms steps: input 10, compute 50, all-reduce 20, update 5, the rest 15.
    line = summary_line(fold(frames({0: (100.0, 10.0, 50.0, 20.0, 5.0)})))
    assert shown(line) == pytest.approx([10.0, 50.0, 20.0, 5.0, 15.0])
    assert sum(shown(line)) == pytest.approx(100.0, abs=0.2)
    # The keys that were there keep their order; the parts follow the input wait.
    order = ["steps", "examples_per_s", *PARTS, "replicas", "attempt"]
    assert list(summary_keys(line))[:9] == order
    assert summary_keys(line)["bus_bytes_per_s"] == "n/a"  # no bytes all-reduced


def test_shares_that_do_not_round_evenly_still_add_to_100() -> None:
    # 30 ms steps: thirds and sevenths, each within a rounding step of its share.
    parts = (30.0, 1.0, 10.0, 30.0 / 7, 6.0)
    line = summary_line(fold(frames({0: parts})))
    timed = Breakdown(*parts)
    assert shown(line) == pytest.approx([timed.pct(p) for p in Breakdown.PARTS], abs=0.1)
    assert sum(shown(line)) == pytest.approx(100.0, abs=0.2)


def test_the_summary_is_over_the_steps_after_warm_up() -> None:
    events = frames({0: (100.0, 10.0, 50.0, 20.0, 5.0)})
    for event in events:  # warm-up steps all-reduce for 90 ms: they must not count
        if event["type"] == "step" and event["step"] <= WARMUP_STEPS:
            event.update(step_time_ms=200.0, input_wait_ms=0.0, compute_ms=10.0, sync_ms=190.0,
                         update_ms=0.0)
    assert shown(summary_line(fold(events))) == pytest.approx([10.0, 50.0, 20.0, 5.0, 15.0])


def test_a_cluster_gives_the_parts_of_the_worker_whose_input_wait_it_shows() -> None:
    # Worker 1 waits 38 ms on input; the chief spends that time in the all-reduce.
    state = fold(frames({0: (100.0, 3.0, 40.0, 45.0, 5.0), 1: (100.0, 38.0, 40.0, 10.0, 5.0)}))
    line = summary_line(state, workers=2)
    assert shown(line) == pytest.approx([38.0, 40.0, 10.0, 5.0, 7.0])
    assert verdict_line(state) == ("verdict: highly input-bound on worker 1: 38.0% of its "
                                   "step time waiting for input")


def test_without_timed_parts_the_four_are_not_available() -> None:
    line = summary_line(fold(frames({0: (100.0, 10.0)})))
    got = summary_keys(line)
    assert got["input_wait_pct"] == "10.0"
    assert [got[key] for key in PARTS[1:]] == ["n/a"] * 4
    assert part_shares(None, 10.0) == dict.fromkeys(("compute", "sync", "update", "other"),
                                                    "n/a")


def test_a_short_run_gives_its_parts_over_all_its_steps() -> None:
    line = summary_line(fold(frames({0: (100.0, 10.0, 50.0, 20.0, 5.0)}, steps=3)))
    assert shown(line) == pytest.approx([10.0, 50.0, 20.0, 5.0, 15.0])


def test_the_bus_bandwidth_is_the_all_reduces_bytes_over_its_time() -> None:
    line = summary_line(fold(frames({0: (100.0, 1.0, 60.0, 21.0, 4.0)}, bus_bytes=3e9)))
    assert float(summary_keys(line)["bus_bytes_per_s"]) == pytest.approx(3e9 / 0.021, rel=1e-3)


def ended_output(run_dir: Path, events: list[dict[str, Any]]) -> list[str]:
    with open(run_dir / "events.jsonl", "w", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps({"v": 1, **event}) + "\n")
    state = recorded_state(run_dir)
    info = RunInfo(run_id="r", run_dir=run_dir, name="h", status="finished", attempt=1,
                   step=12, examples_per_s=None, started=None, supervisor_pid=None,
                   socket_path=None)
    out, err = io.StringIO(), io.StringIO()
    assert _ended(info, state, 1, False, out, err) == 0
    return out.getvalue().splitlines()


def test_an_ended_runs_last_line_is_the_verdict_after_the_summary(tmp_path: Path) -> None:
    lines = ended_output(tmp_path, frames({0: (100.0, 1.0, 60.0, 21.0, 4.0)}, bus_bytes=3e9))
    assert lines[-2].startswith("summary: ")
    assert lines[-1] == ("verdict: highly communication-bound: all-reduce 21% of the step, "
                         "143 GB/s bus")


def test_an_ended_run_without_timed_parts_gives_the_input_verdict(tmp_path: Path) -> None:
    lines = ended_output(tmp_path, frames({0: (100.0, 25.0)}))
    assert lines[-1] == "verdict: highly input-bound: 25.0% of step time waiting for input"


def test_a_run_that_ended_in_warm_up_says_it_measured_nothing(tmp_path: Path) -> None:
    events = [e for e in frames({0: (100.0, 1.0)}) if e["type"] != "step"]
    lines = ended_output(tmp_path, events)
    assert lines[-1] == "verdict: no measured steps: it ended while warming up"


def test_an_ended_cluster_prints_each_workers_verdict_the_stragglers_first(
    tmp_path: Path,
) -> None:
    # Worker 1 waits 38 ms of 100 on input (the straggler); the chief spends that time in
    # the all-reduce, waiting for it.
    events = frames({0: (100.0, 3.0, 40.0, 45.0, 5.0), 1: (100.0, 38.0, 40.0, 10.0, 5.0)})
    lines = ended_output(tmp_path, events)
    workers = [line for line in lines if line.startswith("gpuwatch: worker ")]
    assert [line.split(":")[1].strip() for line in workers] == ["worker 1 (host-1)",
                                                                "worker 0 (host-0)"]
    assert "highly input-bound: 38.0% of its step time waiting for input" in workers[0]
    assert "communication-bound: all-reduce 45% of its step" in workers[1]
    assert "waits there for worker 1" in workers[1]
    assert lines.index(workers[-1]) < len(lines) - 2  # before the summary and the verdict
    assert lines[-2].startswith("summary: ") and lines[-1].startswith("verdict: ")
