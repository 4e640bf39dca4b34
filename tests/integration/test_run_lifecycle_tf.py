"""The run life cycle with the real TensorFlow trainer: ended runs leave no process, and
`gpuwatch resume` continues them (same run, next attempt, from the last checkpoint).

tests/integration/test_run_lifecycle.py crosses every ending with every way of starting on the
stand-in trainer; these are the endings where the real trainer's own behaviour matters
(it checkpoints at a stop or when its supervisor is gone; its checkpoint and data
position are what a resume continues from), each followed by a resume.

A TensorFlow start-up is the suite's dearest part, so these runs also carry the checks of
the command that need such a run and nothing more: a headless summary's window, ls, logs
and export of an ended run, `train --detach` and stop by prefix, Ctrl-C's exit code.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.runs import folders
from tests.conftest import ROOT, TINY, gpuwatch, wait_for
from tests.integration.test_run_lifecycle import (
    END_TO_GONE_S,
    assert_gone_by,
    end_recorded_at,
    run_groups,
)
from tests.support.alone import RunAlone

pytestmark = pytest.mark.slow


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def of(run_dir: Path, kind: str, attempt: int | None = None) -> list[dict[str, Any]]:
    return [e for e in events(run_dir)
            if e["type"] == kind and (attempt is None or e.get("attempt") == attempt)]


def the_run(home: Path) -> Path:
    (info,) = folders.list_runs(home)
    return info.run_dir


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory the run's processes see: TensorFlow writes its autograph
    modules there while it traces a person's own functions."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setenv("TMPDIR", str(path))
    return path


def gone_after_end(run_dir: Path, ended_at: float | None = None) -> None:
    ended_at = ended_at or wait_for(lambda: end_recorded_at(run_dir), 120, "the run's end")
    assert_gone_by(run_dir, run_groups(run_dir), ended_at + END_TO_GONE_S, run_dir.name)


def newest_on_disk(run_dir: Path) -> int:
    """The step of the checkpoint a resume takes: the one the checkpoints' state file names
    (`model_checkpoint_path`, what TensorFlow's latest_checkpoint reads). A kill between a
    save's files and that file leaves a newer ckpt-<step>.index that no resume reads
    (x2 at ae7bf0d: ckpt-50.index on disk, the state file still at ckpt-25)."""
    state = (run_dir / "checkpoints" / "checkpoint").read_text()
    line = next(line for line in state.splitlines() if line.startswith("model_checkpoint_path"))
    return int(line.split('"')[1].rsplit("-", 1)[1])


def assert_resumed(run_dir: Path, attempt: int, from_step: int) -> None:
    """Attempt `attempt` resumed the same run from the checkpoint at from_step and went on
    from the next step, with the data position the checkpoint saved."""
    (resume,) = of(run_dir, "resume", attempt)
    assert resume["from_step"] == from_step
    assert resume["data_order"] == "continued"
    # The data position is where the checkpointed step left the data: that step's own
    # position, and with tiny.yaml's batch of 64, 64 examples a step.
    saved = next(e for e in of(run_dir, "step") if e["step"] == from_step and e["worker"] == 0)
    assert resume["position"] == saved["position"] == from_step * 64
    steps = [e["step"] for e in of(run_dir, "step", attempt) if e["worker"] == 0]
    assert steps[0] == from_step + 1 and steps == list(range(steps[0], steps[-1] + 1))
    (started,) = of(run_dir, "attempt", attempt)
    assert started["reason"] == "resume"
    assert len(of(run_dir, "run")) == 1, "the same run, one record"


def test_a_finished_headless_run_leaves_nothing_is_read_without_its_supervisor_and_resumes(
    home: Path, monkeypatch: pytest.MonkeyPatch, private_tmp: Path
) -> None:
    # A spare would be allowed; a headless run must still start none.
    monkeypatch.setenv("GPUWATCH_SPARE_TRAINER", "1")
    done = gpuwatch("train", str(TINY), "--headless", "--max-steps", "12")
    assert done.returncode == 0, done.stderr
    # Its summary leaves the warm-up out, and says so (a run too short to leave it out:
    # tests/integration/test_headless_summary.py).
    assert ("gpuwatch: attempt 1's figures over its 7 steps after the first 5 (warm-up); "
            "a progress line's are its last 20 steps") in done.stdout
    run_dir = the_run(home)
    gone_after_end(run_dir)
    assert "spare trainer pid" not in (run_dir / "trainer.log").read_text()
    last_checkpoint = max(e["step"] for e in of(run_dir, "checkpoint", 1))
    assert last_checkpoint == 12  # the trainer checkpoints as it finishes (every_steps: 25)
    # Nor a file in the temporary directory: the trainer's own went with it.
    assert list(private_tmp.iterdir()) == []

    # ls, logs, export and the TensorBoard files need no live supervisor.
    assert folders.read_run_info(run_dir).supervisor_pid is None
    listing = gpuwatch("ls", check=True).stdout
    assert run_dir.name in listing and "finished" in listing
    log = gpuwatch("logs", run_dir.name, check=True).stdout
    assert log == (run_dir / "trainer.log").read_text() and "attempt 1 starting" in log
    steps = gpuwatch("export", run_dir.name, "--what", "steps", check=True).stdout.splitlines()
    assert len(steps) == 1 + 12  # a header, then one row per step
    attempts = gpuwatch("export", run_dir.name, "--what", "attempts", check=True).stdout
    assert len(attempts.splitlines()) == 2 and "finished" in attempts
    board = list((run_dir / "tensorboard" / "attempt-1").glob("events.out.tfevents.*"))
    assert board and board[0].stat().st_size > 0

    again = gpuwatch("resume", run_dir.name, "--headless", "--max-steps", "45")
    # And again at once, as a script or a Slurm job's next step chains them: the last
    # one's supervisor is still on its way out (seconds), nobody attached a dashboard,
    # and this one waits for it to go, then goes on.
    chained = gpuwatch("resume", run_dir.name, "--headless", "--max-steps", "50")
    assert again.returncode == 0, again.stderr
    assert "summary: steps=45" in again.stdout and "attempt=2" in again.stdout
    assert chained.returncode == 0, chained.stderr
    assert "dashboard" not in chained.stderr, chained.stderr
    assert "summary: steps=50" in chained.stdout and "attempt=3" in chained.stdout
    assert_resumed(run_dir, 2, 12)
    assert_resumed(run_dir, 3, 45)
    gone_after_end(run_dir)
    info = folders.read_run_info(run_dir)
    assert (info.status, info.attempt, info.step) == ("finished", 3, 50)


def test_a_stopped_run_resumes_from_the_checkpoint_its_stop_wrote_and_ctrl_c_stops_it_headless(
    home: Path,
) -> None:
    # `train --detach` prints the run's id alone; ls lists it, stop takes a prefix.
    run_id = gpuwatch("train", str(TINY), "--detach", check=True).stdout.strip()
    assert re.fullmatch(r"\d{4}-[a-z2-9]{4}", run_id)
    listed = gpuwatch("ls", check=True).stdout
    assert run_id in listed and ("running" in listed or "starting" in listed)
    run_dir = folders.runs_root(home) / run_id
    wait_for(lambda: any(e["step"] >= 10 for e in of(run_dir, "step")), 120, "10 steps")
    stop = gpuwatch("stop", run_id[:7], check=True)
    assert f"run {run_id} stopped" in stop.stdout
    gone_after_end(run_dir)
    assert "attempt 1 starting" in gpuwatch("logs", run_id, check=True).stdout
    rows = [json.loads(line) for line in gpuwatch("ls", "--json", check=True).stdout.splitlines()]
    assert rows[0]["run_id"] == run_id and rows[0]["status"] == "stopped"
    stopped_at = max(e["step"] for e in of(run_dir, "step", 1))
    assert max(e["step"] for e in of(run_dir, "checkpoint", 1)) == stopped_at

    # Attempt 2 followed headless; Ctrl-C stops it with the documented code (130, as
    # gpuwatch/cli/headless.py's docstring says), and that stop checkpoints too.
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "resume", run_id, "--headless"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        wait_for(lambda: len(of(run_dir, "step", 2)) >= 5, 120, "5 steps of attempt 2")
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 130, err
    assert "summary: " in out and "stopping run" in err
    assert folders.read_run_info(run_dir).status == "stopped"
    gone_after_end(run_dir)
    assert_resumed(run_dir, 2, stopped_at)
    (resume,) = of(run_dir, "resume", 2)
    assert resume["lost_steps"] == 0
    assert max(e["step"] for e in of(run_dir, "checkpoint", 2)) == max(
        e["step"] for e in of(run_dir, "step", 2))


def test_a_sigkilled_trainer_crashes_the_run_and_a_resume_counts_the_lost_steps(
    home: Path, private_tmp: Path
) -> None:
    run_id = gpuwatch("train", str(TINY), "--detach", check=True).stdout.split()[-1]
    run_dir = folders.runs_root(home) / run_id
    wait_for(lambda: any(e["step"] >= 25 for e in of(run_dir, "checkpoint"))
             and any(e["step"] >= 32 for e in of(run_dir, "step")), 120,
             "a checkpoint at 25 and step 32")
    (hello,) = of(run_dir, "hello", 1)
    # The trainer's own temporary directory (trainer_runtime.scratch). The built-in
    # update graph and pipeline are plain graph code, not autograph-converted: nothing of
    # autograph's is in it. What a person's factory would have autograph write there
    # stands in as a file of our own.
    (scratch,) = private_tmp.glob(f"gpuwatch-trainer-{hello['pid']}-*")
    assert not list(scratch.glob("__autograph_generated_file*"))
    (scratch / "__autograph_generated_file_of_a_factory.py").write_text("pass\n")
    os.kill(hello["pid"], signal.SIGKILL)
    gone_after_end(run_dir)
    assert folders.read_run_info(run_dir).status == "crashed"
    (crashed,) = of(run_dir, "status", 1)[-1:]
    assert (crashed["status"], crashed["signal"]) == ("crashed", "SIGKILL")
    # The killed trainer could not remove its temporary directory; its supervisor did.
    assert list(private_tmp.iterdir()) == []
    last_step = max(e["step"] for e in of(run_dir, "step", 1))
    # The kill may land between a checkpoint's save and its event: the one the state file
    # names is the one a resume takes, and it is never older than the newest recorded.
    last_checkpoint = newest_on_disk(run_dir)
    assert last_checkpoint >= max(e["step"] for e in of(run_dir, "checkpoint", 1))

    assert gpuwatch("resume", run_id, "--detach", check=True).returncode == 0
    wait_for(lambda: of(run_dir, "step", 2), 120, "a step of attempt 2")
    assert_resumed(run_dir, 2, last_checkpoint)
    (resume,) = of(run_dir, "resume", 2)
    assert resume["lost_steps"] == max(0, last_step - last_checkpoint)
    assert gpuwatch("stop", run_id).returncode == 0
    gone_after_end(run_dir)


def test_a_killed_supervisor_takes_its_trainer_down_and_the_lost_run_resumes(
    home: Path, run_first: RunAlone
) -> None:
    run_id = gpuwatch("train", str(TINY), "--detach", check=True).stdout.split()[-1]
    run_dir = folders.runs_root(home) / run_id
    wait_for(lambda: any(e["step"] >= 10 for e in of(run_dir, "step")), 120, "10 steps")
    groups = run_groups(run_dir)
    with run_first():  # from the kill to the last process gone: a measured time
        os.kill(folders.read_supervisor_info(run_dir)["pid"], signal.SIGKILL)
        killed_at = time.time()
        # The trainer sees its socket close, checkpoints, and exits by itself.
        assert_gone_by(run_dir, groups, killed_at + END_TO_GONE_S, "after the supervisor's kill")
    assert folders.read_run_info(run_dir).status == "lost"
    listed = json.loads(gpuwatch("ls", "--json", check=True).stdout.splitlines()[0])
    assert (listed["run_id"], listed["status"]) == (run_id, "lost")
    assert "done: socket_lost" in (run_dir / "trainer.log").read_text()
    saved = max(e["step"] for e in of(run_dir, "checkpoint", 1)) if of(run_dir, "checkpoint", 1) \
        else None
    assert list((run_dir / "checkpoints").glob("ckpt-*.index")), "it checkpointed before exiting"
    # Its last checkpoint may not have reached the record (the supervisor was gone).
    on_disk = newest_on_disk(run_dir)
    assert saved is None or on_disk >= saved

    assert gpuwatch("resume", run_id, "--detach", check=True).returncode == 0
    wait_for(lambda: of(run_dir, "step", 2), 120, "a step of attempt 2")
    (resume,) = of(run_dir, "resume", 2)
    assert resume["from_step"] == on_disk
    steps = [e["step"] for e in of(run_dir, "step", 2)]
    assert steps[0] == on_disk + 1
    assert gpuwatch("stop", run_id).returncode == 0
    gone_after_end(run_dir)


def test_resume_refuses_a_live_run_and_a_bad_override_in_one_line(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    run_id = gpuwatch("train", str(TINY), "--detach", check=True).stdout.split()[-1]
    live = gpuwatch("resume", run_id)
    assert live.returncode == 2
    (line,) = live.stderr.strip().splitlines()
    assert line.startswith(f"gpuwatch: run {run_id} is ") and "it needs no resume" in line
    assert gpuwatch("stop", run_id).returncode == 0
    run_dir = folders.runs_root(home) / run_id
    gone_after_end(run_dir)
    for bad in (["--set", "train.global_batch_size=-3"], ["--set", "nosuch.key=1"],
                ["--max-steps", "0"]):
        refused = gpuwatch("resume", run_id, *bad)
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpuwatch: ") and "Traceback" not in \
            refused.stderr, refused.stderr
    assert gpuwatch("resume", "nosuchrun").returncode == 2
    assert len(of(run_dir, "attempt")) == 1, "a refused resume starts nothing"


def test_a_factory_that_cannot_be_imported_ends_headless_in_one_line_exit_2_leaving_nothing(
    home: Path,
) -> None:
    refused = gpuwatch("train", str(TINY), "--headless",
                       "--set", "model.factory=no_such_pkg.models:build")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.startswith("gpuwatch: ")]
    assert "model.factory 'no_such_pkg.models:build'" in line
    assert "No module named 'no_such_pkg'" in line
    assert "Traceback" not in refused.stderr
    run_dir = the_run(home)
    gone_after_end(run_dir)
    assert folders.read_run_info(run_dir).status == "crashed"
