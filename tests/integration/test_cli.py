"""The gpuwatch command as a person runs it: the demo headless, bad input, ls/logs/attach.

Other runs of the command are checked where they start TensorFlow for more: a crash's
headless report in tests/integration/test_crash_causes.py; a factory that cannot be imported, and
`train --detach` then ls, stop by prefix and logs, in tests/integration/test_run_lifecycle_tf.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import TINY, gpuwatch

SUMMARY = re.compile(
    r"^summary: steps=(\d+) examples_per_s=([\d.]+) input_wait_pct=([\d.]+) "
    r"compute_pct=(\S+) sync_pct=(\S+) update_pct=(\S+) other_pct=(\S+) "
    r"replicas=(\d+) attempt=(\d+) workers=(\d+) flops_per_example=(\S+) tflops=(\S+)"
    r"( mfu_pct=\S+)? bus_bytes_per_s=(\S+)$",
    re.M,
)


@pytest.mark.slow
def test_demo_runs_headless_for_30_steps_on_two_replicas(home: Path) -> None:
    proc = gpuwatch("train", "demo/demo.yaml", "--headless", "--max-steps", "30")
    assert proc.returncode == 0, proc.stderr
    match = SUMMARY.search(proc.stdout)
    assert match, proc.stdout
    (steps, rate, wait, compute, sync, update, other, replicas, attempt, workers, flops,
     tflops, mfu, _bus) = match.groups()
    assert int(steps) == 30 and int(replicas) == 2 and int(attempt) == 1 and int(workers) == 1
    assert float(rate) > 0 and 0.0 <= float(wait) <= 100.0
    # The summary's figures are the trainer's own measurements, not made up: recompute
    # input wait from events.jsonl (steps after the 5 warm-up steps).
    (run_dir,) = (home / "runs").iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    steps_seen = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps_seen] == list(range(1, 31))
    measured = steps_seen[5:]
    expected = (
        100 * sum(e["input_wait_ms"] for e in measured) / sum(e["step_time_ms"] for e in measured)
    )
    assert float(wait) == pytest.approx(expected, abs=0.05)
    # The other four parts, over the same steps: n/a from a trainer that does not time the
    # all-reduce apart, else the five add to 100.
    parts = (compute, sync, update, other)
    if all("sync_ms" in e and e["sync_ms"] is not None for e in measured):
        assert sum(map(float, parts)) + float(wait) == pytest.approx(100.0, abs=0.2)
        synced = sum(e["sync_ms"] for e in measured) / sum(e["step_time_ms"] for e in measured)
        assert float(sync) == pytest.approx(100 * synced, abs=0.15)
    else:
        assert parts == ("n/a",) * 4
    assert proc.stdout.splitlines()[-1].startswith("verdict: ")
    hello = next(e for e in events if e["type"] == "hello")
    assert hello["replicas"] == 2 and hello["device_kind"] in ("cpu", "gpu")
    # FLOPs per example as the trainer counted them in its graph: the demo's MLP,
    # 784 -> 1024 -> 1024 -> 10, by hand at 2 FLOPs a multiply-add: forward and weight
    # gradient for every layer, input gradient for all but the first.
    hand = 2 * (2 * 784 * 1024) + 3 * (2 * 1024 * 1024) + 3 * (2 * 1024 * 10)
    assert hello["flops_per_example"] == pytest.approx(hand, rel=0.05)
    assert float(flops) == pytest.approx(hello["flops_per_example"], rel=1e-3)
    assert float(tflops) == pytest.approx(float(flops) * float(rate) / 1e12, rel=1e-2)
    assert (mfu is None) == (hello["device_kind"] == "cpu")  # no peak for a CPU
    assert events[-1]["type"] == "status" and events[-1]["status"] == "finished"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "missing.yaml"], "missing.yaml"),
        (["train", str(TINY), "--set", "train.global_batch_size=0"], "train.global_batch_size"),
        (["train", str(TINY), "--set", "train.accumulation_steps=3"], "divisible"),
        (["train", str(TINY), "--set", "data.prefetc=on"], "prefetch"),
        (["train", str(TINY), "--max-steps", "0"], "--max-steps"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_starts_nothing(
    home: Path, args: list[str], needle: str
) -> None:
    proc = gpuwatch(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuwatch: ") and needle in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_ls_with_no_runs_says_so(home: Path) -> None:
    proc = gpuwatch("ls", check=True)
    assert "no runs yet" in proc.stdout


def test_attach_without_a_live_run_is_a_clear_error(home: Path) -> None:
    proc = gpuwatch("attach")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "gpuwatch: no live run on this machine (gpuwatch ls lists all runs)"
    )


def test_unknown_run_prefix_is_a_clear_error(home: Path) -> None:
    for command in ("stop", "logs", "attach"):
        proc = gpuwatch(command, "zzzz")
        assert proc.returncode == 2
        assert "no run matches 'zzzz'" in proc.stderr


def test_help_lists_every_command() -> None:
    proc = gpuwatch("--help", check=True)
    for command in ("train", "run", "attach", "ls", "stop", "logs", "doctor"):
        assert command in proc.stdout


def test_a_run_whose_supervisor_has_gone_is_shown_from_its_record_and_quitting_says_so(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train` whose run ended before its dashboard came up (or `attach` of an ended run):
    the dashboard reads the record, and quitting it says the run has ended."""
    import dataclasses

    import gpuwatch.app
    from gpuwatch.cli.watch import _dashboard
    from gpuwatch.runs.folders import read_run_info
    from tests.app.conftest import load_events
    from tests.support.recorded import finished, write_run_dir

    run_dir = home / "runs" / "0612-kq7m"
    write_run_dir(run_dir, finished(load_events("cpu_one_attempt.jsonl")))
    # What `train` saw as it started it: a supervisor, and its socket, both gone since.
    started = dataclasses.replace(
        read_run_info(run_dir), supervisor_pid=2**22 + 1, socket_path=home / "gone.sock"
    )
    shown: dict[str, object] = {}

    def dashboard(home_dir: Path, run_id: str, socket_path: Path | None = None, **how: object):
        shown.update(run_id=run_id, socket_path=socket_path, **how)
        return "ended"

    monkeypatch.setattr(gpuwatch.app, "run_dashboard", dashboard)
    assert _dashboard(started) == 0
    record = shown["record"]
    assert shown["socket_path"] is None and record.status == "finished"  # type: ignore[attr-defined]
    assert capsys.readouterr().out == (
        "gpuwatch: run 0612-kq7m has ended (finished); gpuwatch resume 0612-kq7m continues it\n"
    )


def test_samples_of_a_worker_that_sends_none_get_a_note_and_ls_separates_thousands(
    home: Path,
) -> None:
    """A local 2-worker run: one host, sampled once (by worker 0)."""
    from tests.app.conftest import load_events
    from tests.support.recorded import finished, write_run_dir

    recorded = load_events("cpu_two_workers.jsonl")
    frames = [f for f in recorded if not (f["type"] == "sample" and f.get("worker"))]
    last_step = next(f for f in reversed(frames) if f["type"] == "step" and not f.get("worker"))
    frames.append({**last_step, "step": 12345})  # a run some hours old
    frames = finished(frames)
    run_dir = home / "runs" / "0101-wkrs"
    write_run_dir(run_dir, frames)
    done = gpuwatch("export", "0101-wkrs", "--what", "samples", "--worker", "1")
    assert done.returncode == 0 and done.stdout.count("\n") == 1  # the header alone
    (note,) = done.stderr.strip().splitlines()
    assert note.startswith("gpuwatch: no samples of worker 1: each host is sampled once")
    assert "--worker 0" in note
    row = next(line for line in gpuwatch("ls").stdout.splitlines() if "0101-wkrs" in line)
    assert " 12,345 " in row
