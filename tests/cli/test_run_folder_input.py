"""Hostile run folders, homes and outputs: each is one line and a non-zero exit, and the
run's record is never written over or quietly given up.

Every command that takes a run id (attach, resume, stop, logs, export) and every command
that reads the home is tried; the ended run here is written by hand (nothing starts:
each refusal comes before a supervisor would). The checkpoint checks are tried on a
checkpoint TensorFlow wrote in tests/integration/trainer/test_resume_checkpoint_check.py.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch import cli
from gpuwatch.config import load_config
from gpuwatch.runs import folders, resume
from gpuwatch.runs.resume import INDEX_MAGIC, checkpoint_problem, settings_path
from gpuwatch.supervisor.eventlog import EventLog
from tests.conftest import ROOT, TINY, gpuwatch, wait_for
from trainer_runtime.protocol import Attempt, Run, StatusChange, Step

RUN_ID = "1127-abcd"
RUN_COMMANDS = ("attach", "resume", "stop", "logs", "export")
HOME_COMMANDS = (("ls",), ("attach",), ("stop", RUN_ID), ("logs", RUN_ID), ("export", RUN_ID),
                 ("resume", RUN_ID), ("train", str(TINY), "--detach"))


def ended_run(home: Path, *, step: int = 20, started: float = 1.8e9,
              max_steps: int | None = None) -> Path:
    """A finished run of the tiny config at `step`, recorded with the real EventLog (as its
    supervisor records one), with a checkpoint of that step that looks whole (index,
    footer, data file), as the trainer leaves one."""
    run_dir = home / "runs" / RUN_ID
    (run_dir / "checkpoints").mkdir(parents=True)
    config = TINY.read_text()
    if max_steps is not None:
        config = config.replace("train:\n", f"train:\n  max_steps: {max_steps}\n", 1)
    (run_dir / "attempt-1.yaml").write_text(config)
    shutil.copy(TINY, run_dir / "config.yaml")
    settings = load_config(run_dir / "attempt-1.yaml").config.model_dump(mode="json")
    log = EventLog(run_dir)
    log.append(Run(run_id=RUN_ID, name="tiny", config_path=str(TINY), supervisor_pid=1,
                   host="h", settings=settings), started)
    log.append(Attempt(attempt=1, settings=settings, fresh=True, reason="start",
                       config_path=str(run_dir / "attempt-1.yaml")), started + 1)
    log.append(Step(attempt=1, step=step, micro_step=step, epoch=0, loss=0.5, lr=0.01,
                    examples=64, step_time_ms=5.0, input_wait_ms=1.0, grad_sync_bytes=0.0,
                    position=64 * step),
               started + 2)
    finished = StatusChange(attempt=1, status="finished", exit_code=0)
    log.append(finished, started + 3)
    log.write_state(finished, started + 3, step)
    log.close()
    (run_dir / "trainer.log").write_text(f"done: max_steps at step {step}\n")
    ckpt = run_dir / "checkpoints"
    (ckpt / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n'
                                     f'all_model_checkpoint_paths: "ckpt-{step}"\n')
    (ckpt / f"ckpt-{step}.index").write_bytes(b"\0" * 40 + INDEX_MAGIC)
    (ckpt / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"\0" * 64)
    return run_dir


def run_cli(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, list[str]]:
    """gpuwatch's main() in this process: its exit code and its stderr lines."""
    code = cli.main(list(words))
    return code, capsys.readouterr().err.splitlines()


def test_an_empty_run_id_names_no_run_for_any_command(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The only run is an easy target for `gpuwatch stop "$RUN"` with RUN unset.
    ended_run(home)
    for command in RUN_COMMANDS:
        for empty in ("", " ", "\t"):
            code, lines = run_cli(capsys, command, empty)
            assert code == 2, (command, empty)
            assert lines == [f"gpuwatch: no run id given ({empty!r}): gpuwatch ls lists runs"]
    assert folders.read_run_info(home / "runs" / RUN_ID).status == "finished"


@pytest.mark.parametrize("words", HOME_COMMANDS, ids=lambda w: w[0])
def test_a_home_that_is_a_file_is_one_line_for_every_command(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    words: tuple[str, ...]
) -> None:
    not_a_folder = home / "home-file"
    not_a_folder.write_text("not a folder")
    monkeypatch.setenv("GPUWATCH_HOME", str(not_a_folder))
    code, lines = run_cli(capsys, *words)
    assert (code, lines) == (2, [f"gpuwatch: GPUWATCH_HOME={not_a_folder} is not a directory"])

    too_long = home / ("x" * 300)
    monkeypatch.setenv("GPUWATCH_HOME", str(too_long))
    code, lines = run_cli(capsys, *words)
    assert (code, lines) == (2, [f"gpuwatch: GPUWATCH_HOME={too_long}: File name too long"])

    monkeypatch.setenv("GPUWATCH_HOME", str(home))
    (home / "runs").write_text("")
    code, lines = run_cli(capsys, *words)
    assert code == 2 and lines == [
        f"gpuwatch: {home / 'runs'} is not a directory (gpuwatch keeps its runs there)"]
    assert not (home / "runs").stat().st_size, "nothing was written there"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])
@given(started=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                         st.sampled_from([1e300, -1e18, 2.0**63, -(2.0**63), 253402300800.0])))
def test_ls_lists_a_run_whose_start_time_no_calendar_holds(
    home: Path, capsys: pytest.CaptureFixture[str], started: float
) -> None:
    shutil.rmtree(home / "runs", ignore_errors=True)
    run_dir = ended_run(home)
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["t"] = started
    (run_dir / "events.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    code = cli.main(["ls"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    row = out.splitlines()[1].split()
    assert row[0] == RUN_ID and row[2] == "finished" and row[4] == "20"
    try:
        time.localtime(started)
    except (OverflowError, OSError, ValueError):
        assert row[-1] == "-"  # (it was a traceback, and no run listed at all)


def test_a_failed_runs_message_reaches_the_terminal_without_its_escapes(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = ended_run(home)
    (run_dir / "state.json").write_text(json.dumps(
        {"status": "crashed", "attempt": 1, "exit_code": 1, "step": 20,
         "message": "boom \x1b]0;pwned\x07\x1b[2J done"}))
    assert cli.main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "boom ?]0;pwned??[2J done" in out


def test_export_never_writes_into_the_runs_own_folder(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = ended_run(home)
    record = (run_dir / "events.jsonl").read_bytes()
    state = (run_dir / "state.json").read_bytes()
    hard = tmp_path / "steps.csv"
    os.link(run_dir / "events.jsonl", hard)
    soft = tmp_path / "soft.csv"
    soft.symlink_to(run_dir / "state.json")
    linked_dir = tmp_path / "linked"
    linked_dir.symlink_to(run_dir)
    for output, says in (
        (hard, f"is the run file {RUN_ID}/events.jsonl under another name (a hard link)"),
        (run_dir / "events.jsonl", f"is inside run {RUN_ID}'s folder ({run_dir.resolve()})"),
        (run_dir / "state.json", f"is inside run {RUN_ID}'s folder ({run_dir.resolve()})"),
        (run_dir / "new.csv", f"is inside run {RUN_ID}'s folder ({run_dir.resolve()})"),
        (soft, f"is inside run {RUN_ID}'s folder ({run_dir.resolve()})"),
        (linked_dir / "x.csv", f"is inside run {RUN_ID}'s folder ({run_dir.resolve()})"),
    ):
        code, lines = run_cli(capsys, "export", RUN_ID, "-o", str(output))
        assert (code, lines) == (2, [f"gpuwatch: -o {output} {says}: choose a file outside it"])
    # Another run's record, and a path that cannot be followed (a symlink loop), too.
    other = home / "runs" / "1127-wxyz"
    other.mkdir()
    (other / "events.jsonl").write_bytes(record)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for output, says in (
        (other / "events.jsonl",
         f"is inside the runs' folder ({(home / 'runs').resolve()}), another run's record"),
        (loop / "x.csv", "cannot be followed (Symlink loop from "),
    ):
        code, lines = run_cli(capsys, "export", RUN_ID, "-o", str(output))
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"gpuwatch: -o {output} {says}"), lines
    assert (other / "events.jsonl").read_bytes() == record
    assert (run_dir / "events.jsonl").read_bytes() == record
    assert (run_dir / "state.json").read_bytes() == state
    assert not (run_dir / "new.csv").exists()
    # A device is written as before (no walk of the runs for it).
    code, lines = run_cli(capsys, "export", RUN_ID, "-o", os.devnull)
    assert code == 0 and lines == [f"gpuwatch: 1 steps rows of run {RUN_ID} -> {os.devnull}"]
    # A file of its own, even one that is there already, is written as before.
    mine = tmp_path / "mine.csv"
    mine.write_text("old")
    code, lines = run_cli(capsys, "export", RUN_ID, "-o", str(mine))
    assert code == 0 and lines == [f"gpuwatch: 1 steps rows of run {RUN_ID} -> {mine}"]
    with open(mine, newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert (row["attempt"], row["step"], row["step_time_ms"]) == ("1", "20", "5.0")


def test_export_to_a_full_device_names_it_and_fails(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("this machine has no /dev/full to write to")
    ended_run(home)
    code, lines = run_cli(capsys, "export", RUN_ID, "-o", "/dev/full")
    assert (code, lines) == (1, ["gpuwatch: cannot write /dev/full: No space left on device"])


def test_a_record_or_log_that_is_not_a_file_is_one_line(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = ended_run(home)
    (run_dir / "trainer.log").unlink()
    (run_dir / "trainer.log").mkdir()
    code, lines = run_cli(capsys, "logs", RUN_ID)
    assert (code, lines) == (1, [
        f"gpuwatch: {run_dir / 'trainer.log'} is not a file: run {RUN_ID}'s trainer log "
        "cannot be read"])
    # A record that is a FIFO is never opened (ls would wait on it for ever): no such run.
    (run_dir / "events.jsonl").unlink()
    os.mkfifo(run_dir / "events.jsonl")
    kept = tmp_path / "kept.csv"
    kept.write_text("kept")
    code, lines = run_cli(capsys, "export", RUN_ID, "-o", str(kept))
    assert code == 2 and lines == [f"gpuwatch: no run matches {RUN_ID!r} (gpuwatch ls lists runs)"]
    assert kept.read_text() == "kept", "the output is not touched before the record is found"
    assert cli.main(["ls"]) == 0


@pytest.mark.parametrize("words", [("ls",), ("logs", RUN_ID), ("export", RUN_ID), ("doctor",)],
                         ids=lambda w: w[0])
def test_a_closed_standard_output_is_one_line_not_a_traceback(
    home: Path, words: tuple[str, ...]
) -> None:
    ended_run(home)
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwatch", *words], stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60,
        preexec_fn=lambda: os.close(1), check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["gpuwatch: standard output is closed: nothing to write to"]


def resume_refusal(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    code, lines = run_cli(capsys, "resume", RUN_ID, *words)
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


def test_resume_refuses_a_run_whose_checkpoint_cannot_be_read_and_starts_nothing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = ended_run(home)
    ckpt = run_dir / "checkpoints"
    again = f"going on cannot restore it; gpuwatch train {run_dir / 'attempt-1.yaml'} " \
            "starts it over as a new run"
    pristine = {p.name: p.read_bytes() for p in ckpt.iterdir()}

    def restore() -> None:
        if not ckpt.is_dir():
            ckpt.unlink()
            ckpt.mkdir()
        for p in ckpt.iterdir():
            p.unlink()  # a FIFO too
        for name, data in pristine.items():
            (ckpt / name).write_bytes(data)

    damages = {
        "index says nothing": (lambda: (ckpt / "checkpoint").write_text("hello world\n"),
                               f"its checkpoint index {ckpt / 'checkpoint'} names no checkpoint"),
        "index not text": (lambda: (ckpt / "checkpoint").write_bytes(bytes(range(128, 256))),
                           f"its checkpoint index {ckpt / 'checkpoint'} cannot be read "
                           "(not text)"),
        "index gone": (lambda: (ckpt / "checkpoint").unlink(),
                       f"its checkpoint index {ckpt / 'checkpoint'} is missing (beside "
                       "ckpt-20.index)"),
        "bad footer": (lambda: (ckpt / "ckpt-20.index").write_bytes(os.urandom(500)),
                       f"its checkpoint {ckpt / 'ckpt-20.index'} is damaged (no TensorFlow "
                       "index footer)"),
        "no .index": (lambda: (ckpt / "ckpt-20.index").unlink(),
                      f"its checkpoint {ckpt / 'ckpt-20.index'} cannot be read "
                      "(No such file or directory)"),
        "no data": (lambda: (ckpt / "ckpt-20.data-00000-of-00001").unlink(),
                    f"its checkpoint {ckpt / 'ckpt-20'} has no data file (ckpt-20.data-*)"),
        "folder a file": (lambda: (shutil.rmtree(ckpt), ckpt.write_text("x")),
                          f"{ckpt} is not a folder"),
        "index a FIFO": (lambda: ((ckpt / "checkpoint").unlink(),
                                  os.mkfifo(ckpt / "checkpoint")),
                         f"its checkpoint index {ckpt / 'checkpoint'} is not a regular file"),
    }
    for name, (damage, says) in damages.items():
        restore()
        damage()
        assert resume_refusal(capsys) == (
            f"gpuwatch: run {RUN_ID} reached step 20, but {says}: {again}"), name
    restore()
    assert checkpoint_problem(run_dir) is None
    # Nothing started: no supervisor, no attempt 2, no resume.yaml.
    assert not (run_dir / "supervisor.json").exists() and not (run_dir / "resume.yaml").exists()


@pytest.mark.parametrize("keeps", ["no-folder", "disabled"])
def test_a_run_with_no_checkpoint_at_all_resumes_from_step_0_and_says_so(
    home: Path, monkeypatch: pytest.MonkeyPatch, keeps: str
) -> None:
    # Nothing to lose: a crash before the first checkpoint, or none kept. The next attempt
    # trains from step 0, as the attempts table then shows, and the terminal says so first.
    run_dir = ended_run(home)
    if keeps == "no-folder":
        shutil.rmtree(run_dir / "checkpoints")
        words, why = [], "none saved by step 20"
    else:
        words, why = ["--set", "checkpoint.enabled=false"], "checkpoint.enabled is false"
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "finish")
    proc = gpuwatch("resume", RUN_ID, "--detach", *words, timeout_s=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"gpuwatch: run {RUN_ID} has no checkpoint to go on from ({why}): attempt 2 trains "
        "from step 0")
    wait_for(lambda: folders.read_run_info(run_dir).attempt == 2
             and folders.read_run_info(run_dir).status == "finished", 30, "attempt 2 to finish")


def test_resume_refuses_a_max_steps_at_or_under_the_step_it_would_go_on_from(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = ended_run(home, max_steps=20)
    for words, limit in (((), 20), (("--max-steps", "10"), 10), (("--max-steps", "20"), 20)):
        assert resume_refusal(capsys, *words) == (
            f"gpuwatch: train.max_steps {limit}: run {RUN_ID} would go on from step 20, "
            "already there (--max-steps N, over 20, trains on to step N)")
    # The step it goes on from is its checkpoint's: one that crashed at the limit before
    # its last save has steps to redo (10 to 20), and one that keeps no checkpoints
    # trains from 0. Neither is refused (each then starts: the stand-in trainer).
    ckpt = run_dir / "checkpoints"
    for name in list(ckpt.iterdir()):
        name.rename(ckpt / name.name.replace("ckpt-20", "ckpt-10"))
    (ckpt / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    info = folders.read_run_info(run_dir)
    config = load_config(run_dir / "attempt-1.yaml").config
    assert (info.step, resume.start_step(run_dir, config)) == (20, 10)
    assert resume.progress_problem(info, config, run_dir / "attempt-1.yaml") is None
    off = load_config(run_dir / "attempt-1.yaml", ("checkpoint.enabled=false",)).config
    assert resume.start_step(run_dir, off) == 0
    assert resume.progress_problem(info, off, run_dir / "attempt-1.yaml") is None


def test_a_chief_on_another_host_keeps_its_checkpoints_there_and_nothing_is_said_of_them(
    home: Path
) -> None:
    # Its checkpoints are under that host's GPUWATCH_HOME: the empty folder here says nothing.
    run_dir = ended_run(home)
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").mkdir()
    info = folders.read_run_info(run_dir)
    here = load_config(run_dir / "attempt-1.yaml").config
    assert resume.resume_note(info, here) is not None
    for cluster in ("cluster.launcher=ssh", "cluster.workers=[gpu1, gpu2]"), (
            "cluster.launcher=slurm",):
        remote = load_config(run_dir / "attempt-1.yaml", cluster).config
        assert not resume.chief_checkpoints_here(remote)
        assert resume.resume_note(info, remote) is None
        assert resume.progress_problem(info, remote, run_dir / "attempt-1.yaml") is None
    local_chief = load_config(run_dir / "attempt-1.yaml", (
        "cluster.launcher=ssh", "cluster.workers=[localhost, gpu2]")).config
    assert resume.chief_checkpoints_here(local_chief)


def test_a_relaunch_after_the_end_refuses_what_resume_refuses(home: Path) -> None:
    # The dashboard's r on an ended run whose supervisor is still up: the same check, in
    # the supervisor (gpuwatch/supervisor/commands.py), before any attempt starts.
    from gpuwatch.supervisor.commands import Commands
    from trainer_runtime.protocol import Relaunch

    run_dir = ended_run(home)
    (run_dir / "checkpoints" / "ckpt-20.index").write_bytes(b"not an index")
    relaunched: list[bool] = []

    class EndedRun:
        run_id = RUN_ID
        config = load_config(run_dir / "attempt-1.yaml").config
        stop_requested = False
        stopping = False
        ended = True

        def __init__(self) -> None:
            self.run_dir = run_dir

        def replicas_for(self, config: object) -> int:
            return 2

        def live_in_flight(self) -> None:
            return None

        def can_reconfigure(self) -> bool:
            return False

        async def relaunch(self, config: object, *, fresh: bool) -> int:
            relaunched.append(fresh)
            return 2

    commands = Commands(EndedRun())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"ckpt-20.index is damaged .*going on cannot "
                                         r"restore it"):
        asyncio.run(commands._relaunch(Relaunch(overrides={}, fresh=False, live=False)))
    assert relaunched == []
    # fresh (from step 0 on purpose) is not refused; a whole checkpoint is not either.
    asyncio.run(commands._relaunch(Relaunch(overrides={}, fresh=True, live=False)))
    (run_dir / "checkpoints" / "ckpt-20.index").write_bytes(b"\0" * 40 + INDEX_MAGIC)
    asyncio.run(commands._relaunch(Relaunch(overrides={}, fresh=False, live=False)))
    assert relaunched == [True, False]


def test_the_settings_a_resume_takes_are_found_however_large_the_attempt_in_state_json(
    home: Path
) -> None:
    run_dir = ended_run(home)
    (run_dir / "attempt-3.yaml").write_text(TINY.read_text())
    for odd in ("x", "\u00b2", "\u0663", "03", str(10**30)):  # no attempt's number
        (run_dir / f"attempt-{odd}.yaml").write_text("not an attempt")
    os.mkfifo(run_dir / "attempt-2.yaml")  # never read: a FIFO would wait for ever
    # (It looked for attempt-N.yaml from N = the attempt down to 1: for ever, here.)
    info = folders.read_run_info(run_dir)
    for attempt, expected in ((10**23, "attempt-3.yaml"), (3, "attempt-3.yaml"),
                              (2, "attempt-1.yaml"), (1, "attempt-1.yaml"),
                              (0, "config.yaml")):
        assert settings_path(dataclasses.replace(info, attempt=attempt)) == run_dir / expected
