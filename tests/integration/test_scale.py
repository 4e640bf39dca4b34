"""`gpuwatch scale` as a person runs it: real supervisors and trainers, checked against the record.

- the demo at 1 and 2 replicas, headless (the truth test's first probe, its read known):
  the last line is the scaling line, and its figures are the record's own (each attempt's
  median examples/s after warm-up, worked out here from events.jsonl), the attempts are
  fresh trainers at 1 and 2 replicas, and the run is listed, exportable as a scaling
  table, and leaves nothing running;
- a count that crashes: one line naming it, a non-zero exit, no later count, nothing left;
- a cluster's counts are workers;
- a plan that cannot run is one line and exit 2 before anything starts;
- the truth test: the probe's 1- and 2-replica examples/s each within 10 % of a separate
  headless `gpuwatch train` of the same settings;
- rounds, with the stand-in trainer's steps (chosen step times, no TensorFlow): a verdict
  that cannot tell runs every count again with twice the steps, up to the bound, and says
  so; one that can after round 2 ends there; --rounds 1 is one attempt per count; a stop
  in round 2 ends the run with no further attempt.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwatch import cli
from tests.conftest import TINY, gpuwatch
from tests.integration.test_run_lifecycle import assert_gone_by, recorded, run_groups
from tests.support.alone import RunAlone

SCALING = re.compile(
    r"scaling: (replicas|workers)=(\S+) examples_per_s=(\S+) speedup=(\S+) efficiency=(\S+) "
    r"efficiency_interval=(\S+) mode=(weak|strong)"
)
SUMMARY_RATE = re.compile(r"^summary: steps=\d+ examples_per_s=([\d.]+) ", re.M)
WARMUP_STEPS = 5  # gpuwatch.runstate.WARMUP_STEPS, spelled out: the record is read by hand


def scaling_line(stdout: str) -> dict[str, Any]:
    """The last line of stdout, which must be the scaling line, read into its figures."""
    last = stdout.strip().splitlines()[-1]
    match = SCALING.fullmatch(last)
    assert match, f"the last line is not the scaling line: {last!r}\n{stdout}"
    unit, counts, rates, speedups, efficiencies, intervals, mode = match.groups()

    def numbers(text: str) -> list[float | None]:
        return [None if word == "n/a" else float(word) for word in text.split(",")]

    def pairs(text: str) -> list[tuple[float, float] | None]:
        return [None if word == "n/a" else (float(word.split("-")[0]), float(word.split("-")[1]))
                for word in text.split(",")]

    return {"unit": unit, "counts": [int(c) for c in counts.split(",")], "rates": numbers(rates),
            "speedups": numbers(speedups), "efficiencies": numbers(efficiencies),
            "intervals": pairs(intervals), "mode": mode}


def the_run(home: Path) -> Path:
    (run_dir,) = (home / "runs").iterdir()
    return run_dir


def medians_after_warm_up(events: list[dict[str, Any]]) -> dict[int, float]:
    """Each attempt's median examples/s over its chief's steps after the warm-up, by hand."""
    rates: dict[int, list[float]] = {}
    for event in events:
        if event["type"] == "step" and event["worker"] == 0:
            rates.setdefault(event["attempt"], []).append(
                event["examples"] * 1000.0 / event["step_time_ms"])
    return {attempt: statistics.median(values[WARMUP_STEPS:]) for attempt, values in rates.items()}


def nothing_left(run_dir: Path) -> None:
    assert_gone_by(run_dir, run_groups(run_dir), time.time() + 10.0, "after the probe")


def check_a_headless_probe(proc: subprocess.CompletedProcess[str], run_dir: Path,
                           steps: int) -> None:
    """`gpuwatch scale demo/demo.yaml --replicas 1,2 --steps N --headless`, as a person
    reads it: its scaling line and table, the record behind them, ls and export. (Checked
    on the truth test's first probe: a probe of its own was two TensorFlow start-ups more.)"""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = scaling_line(proc.stdout)
    assert (line["unit"], line["counts"], line["mode"]) == ("replicas", [1, 2], "weak")
    events = recorded(run_dir)
    # One fresh trainer per count, in order: strategy.replicas 1 then 2, the demo's 128
    # examples per replica kept (weak), N steps each.
    attempts = [e for e in events if e["type"] == "attempt"]
    assert [(a["reason"], a["fresh"]) for a in attempts] == [("scale", True)] * 2
    assert [a["settings"]["strategy"]["replicas"] for a in attempts] == [1, 2]
    assert [a["settings"]["train"]["global_batch_size"] for a in attempts] == [128, 256]
    hellos = [e for e in events if e["type"] == "hello"]
    assert [(h["replicas"], h["per_replica_batch"]) for h in hellos] == [(1, 128), (2, 128)]
    assert hellos[0]["pid"] != hellos[1]["pid"]  # a fresh process each
    assert [e["step"] for e in events if e["type"] == "step"] == [
        *range(1, steps + 1), *range(1, steps + 1)]
    statuses = [e["status"] for e in events if e["type"] == "status"]
    assert statuses == ["starting", "running", "relaunching", "starting", "running", "finished"]
    # The line's figures are the record's: medians after warm-up, their ratios.
    by_hand = medians_after_warm_up(events)
    one, two = by_hand[1], by_hand[2]
    assert line["rates"] == [pytest.approx(one, abs=0.051), pytest.approx(two, abs=0.051)]
    assert line["speedups"] == [1.0, pytest.approx(two / one, abs=0.0051)]
    assert line["efficiencies"] == [1.0, pytest.approx(two / (2 * one), abs=0.0051)]
    # Each efficiency within its interval (the base count's is 1 by definition).
    assert line["intervals"][0] == (1.0, 1.0)
    low, high = line["intervals"][1] or (0.0, 0.0)
    assert low - 0.005 <= two / (2 * one) <= high + 0.005, line
    # Its table comes before it, a row per count.
    assert re.search(r"^\s+1\s+128\s+[\d,]+\s+1\.00\s+100%", proc.stdout, re.M), proc.stdout
    # A run like any other: listed, exported as a scaling table.
    listed = gpuwatch("ls", check=True).stdout
    assert run_dir.name in listed and "scale weak replicas=1,2" in listed
    exported = gpuwatch("export", run_dir.name, "--what", "scaling", check=True).stdout
    rows = list(csv.DictReader(io.StringIO(exported)))
    assert [(r["count"], r["state"], r["mode"]) for r in rows] == [
        ("1", "measured", "weak"), ("2", "measured", "weak")]
    assert [float(r["examples_per_s"]) for r in rows] == [pytest.approx(one), pytest.approx(two)]
    nothing_left(run_dir)


@pytest.mark.slow
def test_a_count_that_crashes_is_named_exits_1_and_no_later_count_runs(home: Path) -> None:
    proc = gpuwatch(
        "scale", str(TINY), "--replicas", "1,2,3", "--steps", "12", "--headless",
        "--set", "model.factory=tests.data.factories:model_that_fails_with_replicas",
        "--set", "model.kwargs={fail_at_replicas: 2, after_steps: 8}",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpuwatch: the probe did not measure 2 replicas: crashed" in proc.stderr
    assert "deliberate failure" in proc.stderr and "Traceback" not in proc.stdout
    line = scaling_line(proc.stdout)
    assert line["counts"] == [1, 2, 3] and line["rates"][1:] == [None, None]
    assert line["rates"][0] and line["speedups"] == [1.0, None, None]
    run_dir = the_run(home)
    events = recorded(run_dir)
    assert [e["attempt"] for e in events if e["type"] == "attempt"] == [1, 2]
    assert [e["status"] for e in events if e["type"] == "status"][-1] == "crashed"
    nothing_left(run_dir)


@pytest.mark.slow
def test_a_clusters_counts_are_workers(home: Path, tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(TINY.read_text() + "cluster:\n  workers: 2\n  timeout_s: 30\n")
    # One round: what is checked is each count's workers (rounds: test_scale_rounds.py).
    proc = gpuwatch("scale", str(config), "--steps", "12", "--rounds", "1", "--headless")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = scaling_line(proc.stdout)
    assert (line["unit"], line["counts"]) == ("workers", [1, 2])
    events = recorded(the_run(home))
    attempts = [e for e in events if e["type"] == "attempt"]
    assert [len(a["settings"]["cluster"]["workers"]) for a in attempts] == [1, 2]
    hellos = [e for e in events if e["type"] == "hello"]
    assert sorted((h["attempt"], h["worker"], h["workers"]) for h in hellos) == [
        (1, 0, 1), (2, 0, 2), (2, 1, 2)]
    by_hand = medians_after_warm_up(events)
    assert line["rates"] == [pytest.approx(by_hand[1], abs=0.051),
                             pytest.approx(by_hand[2], abs=0.051)]
    nothing_left(the_run(home))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--replicas", "2,1"], "gpuwatch: --replicas 2,1: give each count once, smallest first"),
        (["--replicas", "1,x"], "gpuwatch: --replicas 1,x: 'x' is not a count from 1"),
        (["--steps", "5"], "gpuwatch: --steps 5: each count needs at least 10 steps"),
        (["--mode", "both"], "gpuwatch: --mode must be weak or strong (got 'both')"),
        (["--replicas", "1,3", "--mode", "strong"],
         "gpuwatch: scale at 3 replicas (strong: the global batch 64 kept): "
         "train.global_batch_size 64 is not divisible by replicas x accumulation_steps = 3 x 1"),
        (["--replicas", "1,2,4", "--set", "data.examples=100"],
         "gpuwatch: scale at 4 replicas (weak: 32 examples per replica kept): "
         "train.global_batch_size: 128 is more than data.examples 100"),
    ],
)
def test_a_plan_that_cannot_run_is_one_line_and_exit_2_before_anything_starts(
    home: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    code = cli.main(["scale", str(TINY), "--headless", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(words), err
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


# ---- the truth test ------------------------------------------------------------------

TRUTH_STEPS = 40
TRUTH_ROUNDS = 1
# The demo with a step the test controls: every batch is one read of TRUTH_READ_MS (the
# demo's simulated storage, prefetch off, one read at a time) and the model is small, so
# a step is the read and little else. A measured rate then cannot pass the reads' own
# bound, global batch / read time, and a busy box moves it little: the read is a sleep,
# the compute a few percent (2026-11-28: 40 steps at 1 and 2 replicas read 2,883 and 5,744
# examples/s against bounds of 3,200 and 6,400, alone). With the demo's own model the
# compute was most of the step, and the CPU's other users moved single runs by up to 30 %.
TRUTH_READ_MS = 40
TRUTH_SETTINGS = ("--set", "model.hidden_units=[64]",
                  "--set", f"data.read_latency_ms={TRUTH_READ_MS}")


def reads_bound(count: int) -> float:
    """The most examples/s `count` replicas can train with the truth test's reads: one read
    of TRUTH_READ_MS per step, 128 examples per replica."""
    return 128 * count * 1000.0 / TRUTH_READ_MS


def probe(steps: int) -> tuple[dict[int, float], subprocess.CompletedProcess[str]]:
    """The demo's probe at 1 and 2 replicas, headless: each count's rate, and the command."""
    # One round: each count's figure is then over `steps` steps, as the separate runs'.
    proc = gpuwatch("scale", "demo/demo.yaml", "--replicas", "1,2", "--steps", str(steps),
                    "--rounds", "1", *TRUTH_SETTINGS, "--headless", timeout_s=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = scaling_line(proc.stdout)
    rates = {count: float(rate or 0.0) for count, rate in zip(line["counts"], line["rates"],
                                                               strict=True)}
    return rates, proc


def probe_runs(home: Path) -> list[Path]:
    """The probes' run folders, oldest first (a probe's attempts say "scale")."""
    found = [run_dir for run_dir in (home / "runs").iterdir()
             if any(e["type"] == "attempt" and e["reason"] == "scale"
                    for e in recorded(run_dir))]
    return sorted(found, key=lambda run_dir: recorded(run_dir)[0]["t"])


def alone_rate(count: int, steps: int) -> float:
    """`gpuwatch train` of the demo as the probe runs its count: strategy.replicas N, the
    demo's 128 examples per replica (weak scaling), `steps` steps; its summary's rate."""
    proc = gpuwatch("train", "demo/demo.yaml", "--headless", "--max-steps", str(steps),
                    "--set", f"strategy.replicas={count}",
                    "--set", f"train.global_batch_size={128 * count}", *TRUTH_SETTINGS,
                    timeout_s=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = SUMMARY_RATE.search(proc.stdout)
    assert match, proc.stdout
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.timeout(600)  # 4 real trainings, and the wait for the others to end
def test_the_probes_figures_match_separate_headless_runs_within_10_percent(
    home: Path, run_alone: RunAlone
) -> None:
    """Each count's examples/s from the probe against `gpuwatch train --headless` with the
    same settings, both the median of the attempt's steps after warm-up; and each under
    the bound its reads set (reads_bound: a figure above it is not true).

    The steps are the test's own: a known read and a small model (TRUTH_SETTINGS), so what
    either figure measures is mostly that read, whatever else the box runs. The rounds run
    alone still (tests/support/alone.py): no other test is under way meanwhile. A round
    runs the probe and the two separate runs back to back (in alternating order, where
    there are more rounds), and the 10 % bound is on the geometric mean over the rounds of
    each round's probe / separate run. One round is enough: its ratios were 0.995-1.004
    on a quiet box and 0.997-1.019 with a CPU burner on each core (2026-11-28); with the
    demo's own model, mostly compute, one round's ratio ranged 0.855-1.54 on this 2-core
    box as other load came and went (docs/benchmarks.md, "Flaky tests").
    The first probe is then read as a person reads a headless probe (check_a_headless_probe),
    beside the other tests."""
    ratios: dict[int, list[float]] = {1: [], 2: []}
    seen: list[dict[str, Any]] = []
    first_probe: subprocess.CompletedProcess[str] | None = None
    with run_alone():
        for round_index in range(TRUTH_ROUNDS):
            order: list[Any] = ["probe", 1, 2] if round_index % 2 == 0 else [2, 1, "probe"]
            probed: dict[int, float] = {}
            alone: dict[int, float] = {}
            for what in order:
                if what == "probe":
                    probed, proc = probe(TRUTH_STEPS)
                    first_probe = first_probe or proc
                else:
                    alone[what] = alone_rate(what, TRUTH_STEPS)
            seen.append({"probe": probed, "alone": alone})
            for count in (1, 2):
                ratios[count].append(probed[count] / alone[count])
    report = json.dumps({"rounds": seen, "ratios": ratios})
    print(report)
    for count in (1, 2):
        ratio = statistics.geometric_mean(ratios[count])
        assert 0.9 <= ratio <= 1.1, f"{count} replicas: probe/alone = {ratio:.3f}: {report}"
        for one in seen:
            # Above the reads' bound is a figure that is not true; far under it, a step
            # that is not the read the test set up. (2 % over: a step timed to the ms.)
            for rate in (one["probe"][count], one["alone"][count]):
                assert 0.5 * reads_bound(count) <= rate <= 1.02 * reads_bound(count), (
                    f"{count} replicas: {rate} examples/s against the reads' bound "
                    f"{reads_bound(count):.0f}: {report}")
    assert first_probe is not None
    check_a_headless_probe(first_probe, probe_runs(home)[0], TRUTH_STEPS)
    for run_dir in (home / "runs").iterdir():
        nothing_left(run_dir)


# ---- the supervisor's side, with the stand-in trainer (no TensorFlow) ------------------


def test_while_the_probe_runs_a_relaunch_is_refused_and_a_stop_ends_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from gpuwatch.follow.client import CommandError, RunClient
    from gpuwatch.runs.folders import read_run_info
    from tests.conftest import wait_for

    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")  # the first count runs until stopped
    run_id = gpuwatch("scale", str(TINY), "--replicas", "1,2", "--detach",
                      check=True).stdout.strip()
    run_dir = home / "runs" / run_id
    wait_for(lambda: any(e["type"] == "hello" for e in recorded(run_dir)), 30, "a hello")
    info = read_run_info(run_dir)
    assert info.socket_path is not None

    async def relaunch(overrides: dict[str, Any]) -> str:
        async with RunClient(info.socket_path) as client:
            with pytest.raises(CommandError) as refused:
                await client.command("relaunch", overrides=overrides)
            return str(refused.value)

    for overrides in ({}, {"data.prefetch": True}):  # a relaunch, and a live change
        message = asyncio.run(relaunch(overrides))
        assert "the scaling probe is measuring 1 replicas (count 1 of 2)" in message
    stop = gpuwatch("stop", run_id, check=True)
    assert f"run {run_id} stopped" in stop.stdout
    events = recorded(run_dir)
    assert [e["attempt"] for e in events if e["type"] == "attempt"] == [1]  # no second count
    assert [e["status"] for e in events if e["type"] == "status"][-1] == "stopped"
    nothing_left(run_dir)


def test_counts_that_measure_nothing_end_the_probe_with_a_line_and_exit_1(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "finish")  # one step each: none measured
    proc = gpuwatch("scale", str(TINY), "--replicas", "1,2,4", "--headless")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpuwatch: the probe did not measure 1 replicas: no steps measured" in proc.stderr
    line = scaling_line(proc.stdout)
    assert line["counts"] == [1, 2, 4] and line["rates"] == [None, None, None]
    assert line["intervals"] == [None, None, None]
    events = recorded(the_run(home))
    # Each count still ran, in turn: reaching its steps is no failure of the trainer. The
    # last one's end waited on the verdict (another round may follow): with none, no round,
    # and the run finished.
    assert [e["status"] for e in events if e["type"] == "status"] == [
        "starting", "running", "relaunching", "starting", "running", "relaunching",
        "starting", "running", "relaunching", "finished"]
    assert [e["round"] for e in events if e["type"] == "scale"] == [1]
    nothing_left(the_run(home))


# ---- rounds, with the stand-in trainer's steps ------------------------------------------

# Step times at 1 and 2 replicas, each spread by 10 % (tests/data/fake_trainer.py's steps
# mode), weak scaling: 2 replicas do twice the examples a step, so the efficiency is the
# ratio of the bases. 12.5 ms is 80 %, on the line: no number of steps tells. 11.2 ms is
# 89 %: its interval is 79-101 % over 20 steps, 82-97 % over 40.
ON_THE_LINE = "1=10,2=12.5"
TELLS_AT_40 = "1=10,2=11.2"


def stand_in_steps(monkeypatch: pytest.MonkeyPatch, step_ms: str) -> None:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "steps")
    monkeypatch.setenv("GPUWATCH_FAKE_STEP_MS", step_ms)
    monkeypatch.setenv("GPUWATCH_FAKE_STEP_SPREAD", "0.1")


def attempts_of(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each attempt's (replicas, train.max_steps), in order."""
    return [(e["settings"]["strategy"]["replicas"], e["settings"]["train"]["max_steps"])
            for e in events if e["type"] == "attempt" and e["reason"] == "scale"]


def test_an_undecided_probe_runs_every_count_again_with_twice_the_steps_up_to_the_bound(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwatch.measures.scaling import MAX_ROUNDS

    stand_in_steps(monkeypatch, ON_THE_LINE)
    proc = gpuwatch("scale", str(TINY), "--replicas", "1,2", "--steps", "20", "--headless")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = recorded(the_run(home))
    assert MAX_ROUNDS == 3
    assert attempts_of(events) == [(1, 20), (2, 20), (1, 40), (2, 40), (1, 80), (2, 80)]
    plans = [e for e in events if e["type"] == "scale"]
    assert [(p["round"], p["rounds"], p["steps"]) for p in plans] == [(1, 3, 20), (2, 3, 40),
                                                                      (3, 3, 80)]
    # Each later round begins with the verdict that could not tell, said headless too.
    said = [line for line in proc.stdout.splitlines() if " round " in line
            and line.startswith("gpuwatch: not enough steps to tell (")]
    assert [line.split("; ")[-1] for line in said] == [
        "round 2 of 3: every count again, 40 steps each",
        "round 3 of 3: every count again, 80 steps each"]
    assert plans[1]["message"] and plans[1]["message"] in said[0]
    # Between rounds the run is relaunching, never ended; the last round's end is the run's.
    statuses = [e["status"] for e in events if e["type"] == "status"]
    assert statuses == ["starting", "running", "relaunching"] * 5 + [
        "starting", "running", "finished"]
    # The table is the last round's; the verdict still cannot tell, with its interval.
    assert "80 steps each (round 3 of up to 3)" in proc.stdout
    verdicts = [line for line in proc.stdout.splitlines()
                if line.startswith("gpuwatch: not enough steps to tell (")]
    assert len(verdicts) == 3 and " round " not in verdicts[-1]
    line = scaling_line(proc.stdout)
    low, high = line["intervals"][1] or (1.0, 1.0)
    assert low < 0.8 < high and f"({100 * low:.0f}-{100 * high:.0f}%)" in verdicts[-1]
    listed = gpuwatch("ls", check=True).stdout
    assert the_run(home).name in listed and "finished" in listed
    rows = list(csv.DictReader(io.StringIO(
        gpuwatch("export", the_run(home).name, "--what", "scaling", check=True).stdout)))
    assert [(r["attempt"], r["measured_steps"]) for r in rows] == [("5", "75"), ("6", "75")]
    nothing_left(the_run(home))


def test_a_probe_that_can_tell_after_round_2_ends_there_finished(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_steps(monkeypatch, TELLS_AT_40)
    proc = gpuwatch("scale", str(TINY), "--replicas", "1,2", "--steps", "20", "--headless")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = recorded(the_run(home))
    assert attempts_of(events) == [(1, 20), (2, 20), (1, 40), (2, 40)]
    assert "; round 2 of 3: every count again, 40 steps each" in proc.stdout
    assert "round 3" not in proc.stdout
    ends = [e for e in events if e["type"] == "status"][-2:]
    assert [(e["status"], e["message"]) for e in ends] == [
        ("relaunching", "reached max steps; the next attempt follows"),
        ("finished", "reached max steps; round 2 of 3 could tell")]
    assert "gpuwatch: scales well: 89% (82-97%) efficiency at 2 replicas" in proc.stdout
    assert scaling_line(proc.stdout)["intervals"][1] == (0.82, 0.97)
    nothing_left(the_run(home))


def test_one_round_is_one_attempt_per_count_as_before(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_steps(monkeypatch, ON_THE_LINE)
    proc = gpuwatch("scale", str(TINY), "--replicas", "1,2", "--steps", "20", "--rounds", "1",
                    "--headless")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = recorded(the_run(home))
    assert attempts_of(events) == [(1, 20), (2, 20)]
    assert [(e["round"], e["rounds"]) for e in events if e["type"] == "scale"] == [(1, 1)]
    assert [e["status"] for e in events if e["type"] == "status"] == [
        "starting", "running", "relaunching", "starting", "running", "finished"]
    assert " round " not in proc.stdout
    assert "gpuwatch: not enough steps to tell (71-91%): 80% efficiency at 2 replicas" in (
        proc.stdout)
    nothing_left(the_run(home))


def test_a_stop_in_round_2_ends_the_run_stopped_with_no_further_attempt(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from gpuwatch.follow.client import CommandError, RunClient
    from gpuwatch.runs.folders import read_run_info
    from tests.conftest import wait_for

    stand_in_steps(monkeypatch, ON_THE_LINE)
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER_FROM", "3=hang")  # round 2's first count
    run_id = gpuwatch("scale", str(TINY), "--replicas", "1,2", "--steps", "20", "--detach",
                      check=True).stdout.strip()
    run_dir = home / "runs" / run_id
    wait_for(lambda: any(e["type"] == "hello" and e["attempt"] == 3 for e in recorded(run_dir)),
             30, "round 2's first hello")
    info = read_run_info(run_dir)
    assert info.socket_path is not None

    async def relaunch() -> str:
        async with RunClient(info.socket_path) as client:
            with pytest.raises(CommandError) as refused:
                await client.command("relaunch", overrides={})
            return str(refused.value)

    assert "measuring 1 replicas (count 1 of 2) in round 2 of up to 3" in asyncio.run(relaunch())
    stop = gpuwatch("stop", run_id, check=True)
    assert f"run {run_id} stopped" in stop.stdout
    nothing_left(run_dir)
    events = recorded(run_dir)
    assert attempts_of(events) == [(1, 20), (2, 20), (1, 40)]
    assert [e["round"] for e in events if e["type"] == "scale"] == [1, 2]
    assert [e["status"] for e in events if e["type"] == "status"][-1] == "stopped"
    # The table keeps round 1's measure of both counts: round 2 measured neither.
    rows = list(csv.DictReader(io.StringIO(
        gpuwatch("export", run_id, "--what", "scaling", check=True).stdout)))
    assert [(r["count"], r["attempt"], r["state"]) for r in rows] == [
        ("1", "1", "measured"), ("2", "2", "measured")]
    # ... and says round 2 was cut short: its first count's attempt stopped.
    from gpuwatch.cli.headless import recorded_state
    from gpuwatch.measures import scaling

    state = recorded_state(run_dir)
    rows_now = scaling.scaling_rows(state)
    assert scaling.probe_failed(rows_now) is None  # the rows alone: round 1, measured
    failed = scaling.probe_failed(rows_now, state)
    assert failed is not None and (failed.count, failed.attempt, failed.state) == (
        1, 3, "stopped")
