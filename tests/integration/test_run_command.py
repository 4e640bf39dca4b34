"""`gpuwatch run -- COMMAND`: a person's own command under a supervisor, with real processes.

Each test starts the real CLI (a detached supervisor, its socket, the command in its own
process group) on small commands: `python -c` without TensorFlow, `sh -c`. What the run
records (events.jsonl, state), what ls, logs, stop and resume say, and what the command
itself sees (its environment, its cwd, its telemetry fd) are checked, not mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import CommandError, RunClient
from gpuwatch.runs import folders
from gpuwatch.runstate.command import NO_TRAINING
from tests.conftest import ROOT, gpuwatch, run_async, wait_for
from tests.integration.test_run_lifecycle import END_TO_GONE_S, assert_gone_by, recorded
from trainer_runtime.hook import ENV_FD, ENV_SETTINGS, HOOK_DIR

PY = sys.executable


def gpuwatch_in(cwd: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI typed in another directory (gpuwatch itself found through PYTHONPATH)."""
    env = os.environ.copy()
    if str(ROOT) not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([PY, "-m", "gpuwatch", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd, env=env, check=False)


def the_run(home: Path) -> Path:
    (run_dir,) = (home / "runs").iterdir()
    return run_dir


def statuses(run_dir: Path) -> list[str]:
    return [e["status"] for e in recorded(run_dir) if e["type"] == "status"]


def last_status(run_dir: Path) -> dict[str, Any]:
    return [e for e in recorded(run_dir) if e["type"] == "status"][-1]


def no_runs(home: Path) -> bool:
    return not (home / "runs").exists() or not any((home / "runs").iterdir())


# -- how a command ends ---------------------------------------------------------------


def test_a_command_that_exits_0_finished_headless(home: Path) -> None:
    proc = gpuwatch("run", "--headless", "--", PY, "-S", "-c", "print('hello from the command')")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = the_run(home)
    assert statuses(run_dir) == ["starting", "running", "finished"]
    end = last_status(run_dir)
    assert end["exit_code"] == 0 and end["message"] == "the command exited 0"
    assert "hello from the command" in (run_dir / "trainer.log").read_text()
    lines = proc.stdout.splitlines()
    # No TensorFlow, no hook event: the summary says no step metrics came, and why.
    assert "gpuwatch: no step metrics: not a TensorFlow program" in proc.stdout
    summary = next(line for line in lines if line.startswith("summary: "))
    assert "steps=0 " in summary and "replicas=n/a " in summary
    assert lines[-1] == "verdict: no step metrics: not a TensorFlow program"


def test_a_command_that_exits_3_crashed_with_its_tracebacks_last_line(home: Path) -> None:
    script = textwrap.dedent("""\
        import sys, traceback
        try:
            raise ValueError("the script's own failure")
        except ValueError:
            traceback.print_exc()
            sys.exit(3)
    """)
    proc = gpuwatch("run", "--headless", "--", PY, "-S", "-c", script)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    end = last_status(the_run(home))
    assert end["status"] == "crashed" and end["exit_code"] == 3
    assert end["message"] == "exited with code 3: ValueError: the script's own failure"
    assert "Traceback (most recent call last):" in end["log_tail"]
    assert ("gpuwatch: the command crashed: exited with code 3: ValueError: the script's own "
            "failure") in proc.stderr
    info = folders.read_run_info(the_run(home))
    assert info.status == "crashed" and info.exit_code == 3


def test_a_crashed_commands_own_words_reach_the_terminal_without_their_escapes(
    home: Path
) -> None:
    # What a command prints is its own: relayed as text, never as the terminal's orders
    # (a title, a cleared screen).
    script = "print('\\x1b]0;pwned\\x07 out'); raise ValueError('\\x1b[2J boom')"
    proc = gpuwatch("run", "--headless", "--", PY, "-S", "-c", script)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "gpuwatch: the command crashed: exited with code 1: ValueError: ?[2J boom"
    assert "  | ?]0;pwned? out" in lines and "  | ValueError: ?[2J boom" in lines
    assert "?[2J boom" in last_status(the_run(home))["message"].replace("\x1b", "?")
    proc = gpuwatch("ls")
    assert "\x1b" not in proc.stdout and "ValueError: ?[2J boom" in proc.stdout


def test_a_command_killed_by_sigkill_crashed_naming_the_signal(home: Path) -> None:
    proc = gpuwatch("run", "--headless", "--", PY, "-S", "-c",
                    "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    end = last_status(the_run(home))
    assert end["status"] == "crashed" and end["signal"] == "SIGKILL"
    assert end["exit_code"] is None
    assert end["message"].startswith("killed by SIGKILL")


# -- a detached command: ls, logs, stop ----------------------------------------------


def pids_in_group(group: int) -> list[int]:
    """Live processes (not zombies) of a process group."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and folders.pid_alive(int(entry.name)):
            try:
                if os.getpgid(int(entry.name)) == group:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def command_pid(run_dir: Path, marker: str) -> int:
    """The command's pid: the shell whose command line carries marker (its group's leader)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and b"gpuwatch" not in cmdline:
            return int(entry.name)
    raise LookupError(marker)


def test_a_detached_command_is_listed_logged_and_stopped_with_its_whole_group(
    home: Path,
) -> None:
    marker = f"command-under-test-{os.getpid()}"
    # The shell starts a child of its own (the backgrounded sleep) and waits on another.
    script = f"echo started {marker}; sleep 60 & sleep 61; wait"
    proc = gpuwatch("run", "--detach", "--name", "sleeper", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    run_dir = home / "runs" / run_id
    wait_for(lambda: marker in (run_dir / "trainer.log").read_text(errors="replace"), 30,
             "the command's first line in trainer.log")
    leader = command_pid(run_dir, marker)
    assert os.getpgid(leader) == leader  # its own process group
    wait_for(lambda: len(pids_in_group(leader)) >= 3, 30, "the shell and both its sleeps")
    # The supervisor records "running" on its own time: a busy box (v-1 at 981bc76) can
    # show the command's processes before the record says so.
    wait_for(lambda: folders.read_run_info(run_dir).status == "running", 30, "running recorded")

    listing = gpuwatch("ls", check=True).stdout.splitlines()
    row = next(i for i, line in enumerate(listing) if line.startswith(run_id))
    assert "sleeper" in listing[row] and "running" in listing[row]
    assert listing[row + 1].strip().startswith("$ sh -c 'echo started")
    (as_json,) = [json.loads(line) for line in gpuwatch("ls", "--json", check=True).stdout
                  .splitlines() if json.loads(line)["run_id"] == run_id]
    assert as_json["command"] == ["sh", "-c", script]

    assert f"started {marker}" in gpuwatch("logs", run_id, check=True).stdout

    stopped = gpuwatch("stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"gpuwatch: run {run_id} stopped"
    end = last_status(run_dir)
    assert end["status"] == "stopped" and end["message"] == "stopped on request"
    ended_at = time.time()
    assert_gone_by(run_dir, {leader}, ended_at + END_TO_GONE_S, "after gpuwatch stop")
    assert pids_in_group(leader) == []


# -- refused before anything starts ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "gpuwatch-no-such-program-x"],
         "gpuwatch: command not found: gpuwatch-no-such-program-x"),
        (["--", "./no-such-script.sh"], "gpuwatch: command not found: ./no-such-script.sh"),
        (["--set", "train.global_batch_size=8", "--", PY, "-V"],
         "gpuwatch: --set train.global_batch_size: a script's batch size is its own: gpuwatch "
         "cannot change it from outside"),
        (["--set", "train.accumulation_steps=2", "--", PY, "-V"],
         "gpuwatch: --set train.accumulation_steps: a script's gradient accumulation is not "
         "changed from outside: Keras' gradient_accumulation_steps is wrong under "
         "MirroredStrategy inside tf.function (keras-team/keras#20582)"),
        (["--set", "data.prefetch=lots", "--", PY, "-V"],
         "gpuwatch: --set data.prefetch=lots: data.prefetch: must be true, false, 'autotune' "
         "or an integer from 1 to 1024 (got 'lots')"),
        (["--headless"], "gpuwatch: run: no command given: gpuwatch run [options] -- COMMAND "
         "[ARGS ...]"),
        (["--headless", "--"], "gpuwatch: run: no command given: gpuwatch run [options] -- "
         "COMMAND [ARGS ...]"),
        ([PY, "-V"], "gpuwatch: run: put the command after --: gpuwatch run [options] -- "
         "COMMAND [ARGS ...]"),
        (["--max-steps", "0", "--", PY, "-V"], "gpuwatch: --max-steps must be from 1 to "
         "1,000,000,000,000 (got 0)"),
        (["--max-steps", "9" * 22, "--", PY, "-V"], "gpuwatch: --max-steps must be from 1 to "
         f"1,000,000,000,000 (got {'9' * 22})"),
    ],
    ids=["not-found", "path-not-found", "batch", "accumulation", "bad-prefetch", "no-command",
         "nothing-after-dashes", "no-dashes", "max-steps-0", "max-steps-huge"],
)
def test_a_run_that_cannot_start_is_refused_in_one_line_and_starts_nothing(
    home: Path, args: list[str], message: str
) -> None:
    proc = gpuwatch("run", *args, timeout_s=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [message]
    assert no_runs(home)


def test_a_file_that_is_not_executable_is_refused(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    proc = gpuwatch_in(tmp_path, "run", "--", "./train.sh")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["gpuwatch: command not executable: ./train.sh"]
    assert no_runs(home)


# -- what the command sees ----------------------------------------------------------------

SHOW_ENV = textwrap.dedent(f"""\
    import json, os, stat
    fd = int(os.environ[{ENV_FD!r}])
    print("ENV " + json.dumps({{
        "pythonpath": os.environ.get("PYTHONPATH"),
        "settings": json.loads(os.environ[{ENV_SETTINGS!r}]),
        "fd_is_socket": stat.S_ISSOCK(os.fstat(fd).st_mode),
        "cwd": os.getcwd(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "mine": os.environ.get("GPUWATCH_TEST_MINE"),
    }}))
""")


def shown_env(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / "trainer.log").read_text()
    return [json.loads(line[4:]) for line in text.splitlines() if line.startswith("ENV ")]


def test_the_command_gets_the_hook_first_on_its_pythonpath_its_fd_and_settings(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_TEST_MINE", "kept")
    person = os.pathsep.join([str(ROOT), "/opt/person/lib"])
    monkeypatch.setenv("PYTHONPATH", person)
    work = tmp_path / "work"
    work.mkdir()
    proc = gpuwatch_in(work, "run", "--headless", "--max-steps", "7", "--set",
                       "data.prefetch=on", "--", PY, "-S", "-c", SHOW_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (seen,) = shown_env(the_run(home))
    # The hook's directory first, then the person's own PYTHONPATH as it was.
    assert seen["pythonpath"] == os.pathsep.join([str(HOOK_DIR), person])
    assert seen["settings"] == {"attempt": 1, "worker": 0, "prefetch": True, "max_steps": 7}
    assert seen["fd_is_socket"] is True
    assert seen["cwd"] == str(work)  # where gpuwatch run was typed
    assert seen["pgid_is_pid"] is True  # its own process group
    assert seen["mine"] == "kept"  # the person's environment


WHOLE_ENV = 'import json, os; print("WHOLE " + json.dumps(dict(os.environ)))'


def test_the_command_gets_the_persons_environment_tf_config_included(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A multi-worker script run by hand reads its own TF_CONFIG (the tutorial's per-worker
    # script): gpuwatch removes only what it added itself (gpuwatch/runs/environment.py).
    tf_config = json.dumps({"cluster": {"worker": ["localhost:12345", "localhost:12346"]},
                            "task": {"type": "worker", "index": 1}})
    monkeypatch.setenv("TF_CONFIG", tf_config)
    monkeypatch.setenv("GPUWATCH_TEST_MINE", "kept")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    # What the person typed gpuwatch with: gpuwatch_in's environment.
    person = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if str(ROOT) in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        person["PYTHONPATH"] = os.environ["PYTHONPATH"]
    proc = gpuwatch_in(work, "run", "--headless", "--", PY, "-S", "-c", WHOLE_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (the_run(home) / "trainer.log").read_text()
    (seen,) = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("WHOLE ")]
    assert seen["TF_CONFIG"] == tf_config
    differs = {name for name in person if seen.get(name) != person[name]}
    assert differs <= {"PYTHONPATH", "PYTHONUNBUFFERED"}, differs
    assert seen["PYTHONPATH"] == os.pathsep.join([str(HOOK_DIR), person["PYTHONPATH"]])
    added = set(seen) - set(person)
    assert added == {ENV_FD, ENV_SETTINGS, "TF_CPP_MIN_LOG_LEVEL"} | (
        {"PYTHONUNBUFFERED"} - set(person)), added


# A tf.data pipeline timed, as a benchmark of the input would: TensorFlow, no training.
TF_DATA_ONLY = textwrap.dedent("""\
    import tensorflow as tf
    ds = tf.data.Dataset.range(1000).batch(10).map(lambda b: b * 2).prefetch(2)
    print("TOTAL", sum(int(tf.reduce_sum(b)) for b in ds))
""")


def test_a_tensorflow_program_that_never_trains_says_no_training_was_seen(
    home: Path, tmp_path: Path
) -> None:
    (tmp_path / "bench_input.py").write_text(TF_DATA_ONLY)
    proc = gpuwatch_in(tmp_path, "run", "--headless", "--", PY, "bench_input.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "TOTAL 999000" in (the_run(home) / "trainer.log").read_text()
    assert f"verdict: {NO_TRAINING}" in proc.stdout, proc.stdout
    assert "warming up" not in proc.stdout


def test_a_command_found_on_path_from_its_directory(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "my-train"
    tool.write_text("#!/bin/sh\necho my-train ran in \"$(pwd)\"\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = gpuwatch_in(tmp_path, "run", "--headless", "--", "my-train")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"my-train ran in {tmp_path}" in (the_run(home) / "trainer.log").read_text()
    assert folders.read_run_info(the_run(home)).name == "my-train"


# A stand-in for the hook (trainer_runtime/hook writes these): frames on GPUWATCH_HOOK_FD.
# These commands run `python -S`: no site, so the real hook stays out and leaves the
# environment as the launcher set it (tests/integration/trainer/test_script_hook.py runs the hook).
FAKE_HOOK = textwrap.dedent(f"""\
    import json, os
    from trainer_runtime.protocol import encode
    settings = json.loads(os.environ[{ENV_SETTINGS!r}])
    attempt = settings["attempt"]
    out = os.fdopen(int(os.environ[{ENV_FD!r}]), "wb", buffering=0)
    out.write(encode("hook", attempt=attempt, installed=True, tensorflow=True,
                     keras_version="3.15.1", loop="fit", input_wait="a loop of its own",
                     strategy="MirroredStrategy"))
    for step in range(1, 13):
        out.write(encode("step", attempt=attempt, step=step, micro_step=step, epoch=0,
                         loss=0.5, lr=None, examples=32, step_time_ms=10.0,
                         input_wait_ms=None, grad_sync_bytes=0.0))
    out.write(encode("done", attempt=attempt, reason="exited", step=12))
""")


def test_hook_frames_from_the_command_are_recorded_and_summarised(home: Path) -> None:
    proc = gpuwatch("run", "--headless", "--", PY, "-S", "-c", FAKE_HOOK)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = recorded(the_run(home))
    (hook,) = [e for e in events if e["type"] == "hook"]
    assert hook["loop"] == "fit" and hook["attempt"] == 1 and hook["worker"] == 0
    assert [e["step"] for e in events if e["type"] == "step"] == list(range(1, 13))
    assert statuses(the_run(home))[-1] == "finished"
    summary = next(line for line in proc.stdout.splitlines() if line.startswith("summary: "))
    assert "steps=12 " in summary and "input_wait_pct=not_measured " in summary
    assert ("gpuwatch: input wait: not measurable for this loop (a loop of its own)"
            in proc.stdout)
    # Never an input-bound verdict from a wait that was not measured.
    assert proc.stdout.splitlines()[-1] == (
        "verdict: input wait not measured in this loop: no verdict on input")
    # Exported as any run's: its command among the attempt's settings, no wait invented.
    (attempt,) = [json.loads(line) for line in gpuwatch(
        "export", the_run(home).name, "--what", "attempts", "--format", "jsonl",
        check=True).stdout.splitlines()]
    assert attempt["command.argv"] == [PY, "-S", "-c", FAKE_HOOK] and attempt["end"] == "exited"
    assert attempt["input_wait_pct"] is None and attempt["median_examples_per_s"] == 3200.0
    # Only what is the command's: none of the model, data or optimizer the schema fills in
    # for the bundled runtime (they were: mlp [512,512], batch 256, adam).
    for key in ("model.name", "model.hidden_units", "train.global_batch_size",
                "train.optimizer", "data.examples", "strategy.replicas"):
        assert attempt.get(key) is None, (key, attempt)
    assert attempt["data.prefetch"] is False and attempt["train.max_steps"] is None
    assert list((the_run(home) / "tensorboard" / "attempt-1").glob("events.out.tfevents.*"))


# -- again: resume, and relaunch from a dashboard's command --------------------------------


def test_resume_runs_the_command_again_as_the_next_attempt(home: Path) -> None:
    proc = gpuwatch("run", "--headless", "--", PY, "-S", "-c", SHOW_ENV)
    assert proc.returncode == 0, proc.stderr
    run_id = the_run(home).name
    # Its supervisor lingers a moment after the end (LINGER_S): then the record is all.
    wait_for(lambda: folders.read_run_info(the_run(home)).supervisor_pid is None, 30,
             "the supervisor to exit")
    refused = gpuwatch("resume", run_id, "--set", "train.global_batch_size=8")
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "gpuwatch: --set train.global_batch_size: a script's batch size is its own: gpuwatch "
        "cannot change it from outside"]
    again = gpuwatch("resume", run_id, "--headless", "--set", "data.prefetch=autotune")
    assert again.returncode == 0, again.stdout + again.stderr
    assert [seen["settings"] for seen in shown_env(the_run(home))] == [
        {"attempt": 1, "worker": 0, "prefetch": False, "max_steps": None},
        {"attempt": 2, "worker": 0, "prefetch": "autotune", "max_steps": None},
    ]
    attempts = [e for e in recorded(the_run(home)) if e["type"] == "attempt"]
    assert [(a["attempt"], a["reason"]) for a in attempts] == [(1, "start"), (2, "resume")]
    assert statuses(the_run(home))[-1] == "finished"


def test_a_command_gone_since_is_refused_by_resume_in_one_line(
    home: Path, tmp_path: Path
) -> None:
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\necho job ran\n")
    job.chmod(0o755)
    proc = gpuwatch_in(tmp_path, "run", "--headless", "--", "./job.sh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wait_for(lambda: folders.read_run_info(the_run(home)).supervisor_pid is None, 30,
             "the supervisor to exit")
    job.unlink()
    again = gpuwatch("resume", the_run(home).name, "--headless")
    assert again.returncode == 2
    assert again.stderr.splitlines() == ["gpuwatch: command not found: ./job.sh"]


async def _relaunch(socket_path: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    async with RunClient(socket_path) as client:
        return await client.command("relaunch", overrides=overrides, fresh=False, live=True,
                                    timeout_s=60.0)


def test_a_relaunch_of_a_running_command_runs_it_again_never_live(home: Path) -> None:
    marker = f"relaunched-command-{os.getpid()}"
    proc = gpuwatch("run", "--detach", "--", "sh", "-c", f"echo {marker}; exec sleep 60")
    assert proc.returncode == 0, proc.stderr
    run_dir = home / "runs" / proc.stdout.strip()
    info = folders.read_run_info(run_dir)
    assert info.socket_path is not None
    wait_for(lambda: folders.read_run_info(run_dir).status == "running", 30, "running")
    with pytest.raises(CommandError, match=r"relaunch: train\.global_batch_size: a script.s batch"):
        run_async(_relaunch(info.socket_path, {"train.global_batch_size": 8}))
    reply = run_async(_relaunch(info.socket_path, {"data.prefetch": True}))
    assert reply["live"] is False and reply["attempt"] == 2
    wait_for(lambda: folders.read_run_info(run_dir).status == "running"
             and folders.read_run_info(run_dir).attempt == 2, 30, "attempt 2 running")
    ends = [e for e in recorded(run_dir) if e["type"] == "status" and e["attempt"] == 1]
    assert ends[-1]["status"] == "relaunching"  # SIGTERM for the relaunch: no crash
    assert (run_dir / "trainer.log").read_text().count(marker) == 2
    assert gpuwatch("stop", run_dir.name).returncode == 0
    assert last_status(run_dir)["status"] == "stopped"
    assert_gone_by(run_dir, set(), time.time() + END_TO_GONE_S, "after the stop")


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
