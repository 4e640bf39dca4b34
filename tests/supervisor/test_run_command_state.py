"""A person's own command (gpuwatch run), without processes: how its end becomes the run's
status (exits.py), what its agent never does (a live change, a spare), what the state,
the advisor and headless make of its events, and the CLI's pure helpers."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.advisor import (
    UNWATCHED_VERDICT,
    WAIT_NOT_MEASURED,
    final_verdict,
    reading,
)
from gpuwatch.cli.headless import progress_line, summary_line, verdict_line
from gpuwatch.cli.listing import shorten_command
from gpuwatch.cli.start import command_name
from gpuwatch.config import command_config, dump_config
from gpuwatch.runs.spawn import command_problem
from gpuwatch.runstate import (
    NOT_TENSORFLOW,
    RunState,
    SettingRefused,
    pending_applies_live,
    step_accumulation,
    step_batch,
    toggle_prefetch,
)
from gpuwatch.runstate.command import NO_TRAINING
from gpuwatch.supervisor.agent import AgentStartError, LocalAgent
from gpuwatch.supervisor.exits import TrainerExit, command_exit_status, exit_status
from gpuwatch.supervisor.trainer_start import TrainerLauncher
from tests.support.command_run import CommandEvents, command_settings
from tests.support.summary import fold, summary_keys
from trainer_runtime.changes import ACCUMULATION_REFUSAL, BATCH_REFUSAL

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    "    model.fit(data)",
    "ValueError: shapes (32, 10) and (32, 3) are incompatible",
]

# -- exits: how a command's end becomes the run's status --------------------------------


def test_a_command_that_exits_0_finished() -> None:
    status, fields = command_exit_status(TrainerExit(0), relaunching=False,
                                         stop_requested=False)
    assert (status, fields) == ("finished", {"exit_code": 0, "message": "the command exited 0"})
    # A trainer of ours that exits 0 without reaching its steps stopped; a command's 0 is
    # its own end.
    assert exit_status(TrainerExit(0), relaunching=False, stop_requested=False)[0] == "stopped"
    assert exit_status(TrainerExit(0), relaunching=False, stop_requested=False,
                       command=True)[0] == "finished"


def test_a_command_cut_at_max_steps_finished_saying_so() -> None:
    status, fields = command_exit_status(TrainerExit(0, done_reason="max_steps"),
                                         relaunching=False, stop_requested=False)
    assert status == "finished"
    assert fields["message"] == "reached max steps; the command exited 0"


def test_a_command_that_exits_non_zero_crashed_with_its_tracebacks_last_line() -> None:
    ended = TrainerExit(3, log_lines=(*TRACEBACK, "cleanup done"))
    status, fields = command_exit_status(ended, relaunching=False, stop_requested=False)
    assert status == "crashed" and fields["exit_code"] == 3 and fields["signal"] is None
    assert fields["message"] == (
        "exited with code 3: ValueError: shapes (32, 10) and (32, 3) are incompatible")
    assert fields["log_tail"][-1] == "cleanup done"


def test_a_command_killed_by_a_signal_crashed_naming_it() -> None:
    status, fields = command_exit_status(TrainerExit(-signal.SIGKILL), relaunching=False,
                                         stop_requested=False)
    assert status == "crashed" and fields["signal"] == "SIGKILL" and fields["exit_code"] is None
    assert fields["message"] == "killed by SIGKILL (out of memory, or kill -9)"
    status, fields = command_exit_status(TrainerExit(-signal.SIGSEGV), relaunching=False,
                                         stop_requested=False)
    assert status == "crashed" and fields["message"] == "killed by SIGSEGV"


@pytest.mark.parametrize("returncode", [0, 1, 143, -signal.SIGTERM, -signal.SIGKILL])
def test_a_stop_asked_for_is_stopped_whatever_the_code(returncode: int) -> None:
    """A command answers SIGTERM its own way (a shell's 143, a cleanup that exits 1)."""
    status, fields = command_exit_status(TrainerExit(returncode, log_lines=tuple(TRACEBACK)),
                                         relaunching=False, stop_requested=True)
    assert status == "stopped" and fields["message"] == "stopped on request"
    status, _ = command_exit_status(TrainerExit(returncode), relaunching=True,
                                    stop_requested=False)
    assert status == "relaunching"
    # A trainer of ours that exits 1 when asked to stop crashed: it should not.
    if returncode in (1, 143):
        assert exit_status(TrainerExit(returncode), relaunching=False,
                           stop_requested=True)[0] == "crashed"


# -- the agent: no live change, no spare ----------------------------------------------


def _agent(tmp_path: Path, *, command: bool) -> LocalAgent:
    return LocalAgent(0, tmp_path, on_frame=lambda *a: None, on_exit=lambda *a: None,
                      on_sample=lambda *a: None, command=command)


def test_a_commands_agent_takes_no_live_change(tmp_path: Path) -> None:
    assert _agent(tmp_path, command=True).live_capable is False
    assert _agent(tmp_path, command=False).live_capable is True


def test_a_command_never_gets_a_spare_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_SPARE_TRAINER", "1")
    spawned: list[str] = []

    async def fake_spawn(module: str, *args: Any) -> None:
        spawned.append(module)

    monkeypatch.setattr("gpuwatch.supervisor.trainer_start.SpareTrainer.spawn", fake_spawn)

    async def wanted(command: bool) -> bool:
        launcher = TrainerLauncher(tmp_path, (), command=command)
        launcher.trainer_stepped()
        launcher.want_spare(True, trainer_up=True)
        task = launcher._spare_task
        if task is not None:
            await task
        return task is not None

    assert asyncio.run(wanted(command=False)) is True  # the runtime's: one for the relaunch
    assert asyncio.run(wanted(command=True)) is False
    assert spawned == ["trainer_runtime"]


def test_a_command_that_cannot_start_when_its_attempt_comes_is_one_line(tmp_path: Path) -> None:
    """Checked up front by gpuwatch run; gone by the time an attempt starts (a relaunch
    after the script was deleted): the launcher's AgentStartError, in one line."""
    path = tmp_path / "attempt-1.yaml"
    path.write_text(dump_config(command_config(["./gone.sh", "--x"], str(tmp_path))))
    agent = _agent(tmp_path, command=True)
    with pytest.raises(AgentStartError) as refused:
        asyncio.run(agent.start(1, path, fresh=False))
    message = str(refused.value)
    assert message.startswith("could not start the command './gone.sh': [Errno 2]"), message
    assert "\n" not in message and agent.process is None


# -- the state: what the screen says ----------------------------------------------------


def test_a_command_with_no_hook_is_not_a_tensorflow_program() -> None:
    run = CommandEvents().start()
    state = fold(run.events)
    view = state.command_view()
    assert view is not None
    assert view.line == "command: python train.py --epochs 3"
    assert view.note == f"{NOT_TENSORFLOW} (so far)"  # it runs: a shell may start Python
    state = fold(run.end("finished", exit_code=0, message="the command exited 0").events)
    view = state.command_view()
    assert view is not None and view.note == NOT_TENSORFLOW
    assert view.input_wait is None


def test_nothing_is_said_before_the_command_started() -> None:
    run = CommandEvents().start()
    state = fold(run.events[:-1])  # the attempt is starting: its process is not up yet
    view = state.command_view()
    assert view is not None and view.note is None


def test_a_python_command_that_never_imported_tensorflow() -> None:
    run = CommandEvents().start().hook(tensorflow=False, loop="", strategy="",
                                       keras_version="")
    view = fold(run.events).command_view()
    assert view is not None
    assert view.line == "script: python train.py --epochs 3"
    assert view.note == f"{NOT_TENSORFLOW} (so far)"


@pytest.mark.parametrize("missing", ["tensorflow", "keras", "tensorflow.python"])
@pytest.mark.parametrize("hooked", [True, False])
def test_a_command_whose_python_has_no_tensorflow_says_so_not_that_it_is_not_one(
    missing: str, hooked: bool
) -> None:
    # The script imports TensorFlow (or Keras) and its Python has none: it is a TensorFlow
    # program in the wrong environment, not "not a TensorFlow program".
    run = CommandEvents().start()
    if hooked:
        run.hook(tensorflow=False, loop="", strategy="", keras_version="")
    run.end("crashed", exit_code=1,
            message=f"exited with code 1: ModuleNotFoundError: No module named '{missing}'")
    view = fold(run.events).command_view()
    assert view is not None and view.note is not None
    module = missing.split(".")[0]
    assert view.note == (f"no step metrics: the command's Python has no {module} "
                         "(install it there, or run the Python that has it)")
    assert NOT_TENSORFLOW not in view.note
    # Any other crash of a program that never imported it: not a TensorFlow program.
    other = CommandEvents().start()
    other.end("crashed", exit_code=1,
              message="exited with code 1: ModuleNotFoundError: No module named 'numpyy'")
    assert fold(other.events).command_view().note == NOT_TENSORFLOW  # type: ignore[union-attr]


def test_a_tensorflow_script_whose_hook_saw_no_training_loop_says_so() -> None:
    # A tf.data benchmark: TensorFlow imported, no fit, no strategy.run step.
    run = CommandEvents().start().hook(loop="", strategy="")
    view = fold(run.events).command_view()
    assert view is not None and view.note == f"{NO_TRAINING} (so far)"
    state = fold(run.end("finished", exit_code=0, message="the command exited 0").events)
    view = state.command_view()
    assert view is not None and view.note == NO_TRAINING
    # Not "no measured steps: it ended while warming up", as if it had trained.
    assert final_verdict(state, state.figures()) == NO_TRAINING
    assert verdict_line(state) == f"verdict: {NO_TRAINING}"
    # A loop that ran says nothing of the kind, stepped or not yet.
    for started in (CommandEvents().start().hook(loop="fit"),
                    CommandEvents().start().hook(loop="").hello().steps(3)):
        view = fold(started.events).command_view()
        assert view is not None and view.note is None


def test_a_hook_that_could_not_install_says_why_the_command_is_not_watched() -> None:
    run = CommandEvents().start().hook(installed=False, tensorflow=False, loop="",
                                       strategy="", message="python -E ignores PYTHONPATH")
    view = fold(run.events).command_view()
    assert view is not None and view.note == "not watched: python -E ignores PYTHONPATH"


def test_a_watched_fit_says_its_loop_and_strategy_and_why_no_input_wait() -> None:
    why = "steps_per_execution > 1: fit's steps run inside one call"
    run = CommandEvents().start().hook(input_wait=why).hello().steps(20)
    state = fold(run.events)
    view = state.command_view()
    assert view is not None
    assert view.line == "script: python train.py --epochs 3 · fit · MirroredStrategy"
    assert view.note is None
    assert view.input_wait == f"input wait: not measurable for this loop ({why})"
    assert state.figures().input_wait_pct is None  # never a number then
    assert state.figures().examples_per_s == pytest.approx(3200.0)


def test_each_attempt_has_its_own_hook_and_a_late_one_is_not_the_current() -> None:
    run = CommandEvents().start().hook(loop="fit")
    first_hook = run.events[-1]
    run.end("relaunching").start(reason="relaunch")
    state = fold(run.events)
    assert state.hook is None
    view = state.command_view()
    assert view is not None and view.kind == "command"
    state.apply({**first_hook, "seq": len(run.events)})  # attempt 1's, arriving late
    assert state.hook is None
    run.hook(loop="strategy.run (tf.function)")
    state = fold(run.events)
    assert state.hook is not None and state.hook.loop == "strategy.run (tf.function)"


def test_the_hook_survives_a_snapshot() -> None:
    run = CommandEvents().start().hook(input_wait="eager loop").hello().steps(8)
    state = fold(run.events)
    again = RunState.from_snapshot(state.to_snapshot())
    assert again.hook == state.hook
    assert again.command_view() == state.command_view()


def test_a_train_run_has_no_command_view() -> None:
    settings = command_settings()
    settings["command"] = None
    run = CommandEvents(settings).start()
    state = fold(run.events)
    assert state.command is None and state.command_view() is None


# -- settings keys ------------------------------------------------------------------------


def test_a_commands_batch_and_accumulation_are_refused_with_the_reason() -> None:
    settings = command_settings()
    for step, reason in ((step_accumulation, ACCUMULATION_REFUSAL), (step_batch, BATCH_REFUSAL)):
        for up in (True, False):
            with pytest.raises(SettingRefused) as refused:
                step(settings, {}, up=up, replicas=2)
            assert str(refused.value) == reason
    assert "keras-team/keras#20582" in ACCUMULATION_REFUSAL


def test_prefetch_toggles_and_never_applies_live_for_a_command() -> None:
    settings = command_settings()
    pending = toggle_prefetch(settings, {})
    assert pending == {"data.prefetch": True}
    assert toggle_prefetch(settings, pending) == {}
    assert pending_applies_live(settings, pending, running=True) is False
    train = dict(settings, command=None)
    assert pending_applies_live(train, pending, running=True) is True  # as ever


# -- the advisor and headless -------------------------------------------------------------


def test_no_input_bound_verdict_from_a_wait_not_measured() -> None:
    run = CommandEvents().start().hook(input_wait="eager loop").hello().steps(30)
    state = fold(run.events)
    advice = reading(state).advice
    assert advice.verdict == WAIT_NOT_MEASURED and advice.level == "unknown"
    assert "input-bound" not in advice.verdict
    assert final_verdict(state, state.figures()) == WAIT_NOT_MEASURED
    assert "input wait n/a" not in progress_line(state)
    assert "not measured in this loop" in progress_line(state)
    keys = summary_keys(summary_line(state))
    assert keys["input_wait_pct"] == "not_measured" and keys["replicas"] == "2"
    assert verdict_line(state) == f"verdict: {WAIT_NOT_MEASURED}"


def test_a_commands_input_bound_advice_names_only_what_it_takes() -> None:
    run = CommandEvents().start().hook().hello().steps(30, wait_ms=8.0)  # 40 % waiting
    state = fold(run.events)
    advice = reading(state).advice
    assert advice.verdict.startswith("highly input-bound: 40.0% of step time")
    assert advice.recommendations == [
        "turn prefetch on (p): read the next batch while this step runs"]
    assert {remedy.key for remedy in advice.remedies} == {"p"}
    # The same figures in a run of the runtime suggest its other settings too.
    train = CommandEvents(dict(command_settings(), command=None)).start().hello()
    train.steps(30, wait_ms=8.0)
    assert any("parallel_calls" in rec for rec in reading(fold(train.events)).advice
               .recommendations)


def test_an_ended_command_says_r_runs_it_again() -> None:
    run = CommandEvents().start().hook().hello().steps(30, wait_ms=1.0)
    run.end("finished", exit_code=0, message="the command exited 0")
    advice = reading(fold(run.events)).advice
    assert advice.recommendations[0] == (
        "the run finished: r runs the command again, with any setting you change")


def test_a_command_that_sends_no_step_is_judged_by_why() -> None:
    run = CommandEvents().start().end("finished", exit_code=0, message="the command exited 0")
    state = fold(run.events)
    assert reading(state).advice.verdict == UNWATCHED_VERDICT
    assert final_verdict(state, state.figures()) == NOT_TENSORFLOW
    assert verdict_line(state) == f"verdict: {NOT_TENSORFLOW}"
    keys = summary_keys(summary_line(state))
    assert keys["steps"] == "0" and keys["input_wait_pct"] == "n/a"
    assert keys["replicas"] == "n/a"  # not the config's default CPU replicas
    assert "no step metrics" in progress_line(state)


# -- the CLI's helpers --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "train.py", "--lr", "1"], "train.py"),
        (["python3", "-u", "/home/ana/src/fit_mnist.py"], "fit_mnist.py"),
        (["python", "-m", "pkg.train", "x"], "pkg.train"),
        (["python", "-c", "print(1)"], "python"),
        (["/usr/bin/env"], "env"),
        (["sh", "-c", "sleep 1"], "sh"),
        (["./run\nme.sh"], "run?me.sh"),
    ],
)
def test_a_run_is_named_after_its_script_or_program(argv: list[str], name: str) -> None:
    assert command_name(argv) == name


def test_command_problem_looks_for_the_program_as_a_shell_would(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    data = tmp_path / "data.txt"
    data.write_text("")
    assert command_problem("tool", "/", str(tmp_path)) is None  # on PATH
    assert command_problem("./tool", str(tmp_path), "") is None  # a path, from cwd
    assert command_problem("tool", str(tmp_path), "") == "command not found: tool"
    assert command_problem("./data.txt", str(tmp_path), "") == (
        "command not executable: ./data.txt")
    assert command_problem(".", str(tmp_path), "") == "command not found: ."
    assert command_problem("x" * 300, "/", "").endswith("...")


def test_a_command_is_shortened_to_fit_a_line() -> None:
    argv = ["python", "train.py", "--note", "two words", "--path", "/a/" + "b" * 100]
    assert shorten_command(argv, 200) == (
        "python train.py --note 'two words' --path /a/" + "b" * 100)
    short = shorten_command(argv, 30)
    assert len(short) == 30 and short.endswith("…")
    assert shorten_command(["echo", "a\nb"], 80) == "echo 'a?b'"


def test_a_commands_directory_gone_or_not_on_a_workers_host_is_named_in_one_line(
    tmp_path: Path,
) -> None:
    """The directory `gpuwatch run` was typed in, gone by the attempt (or not on a worker's
    host: every worker starts the command there): named, with why, in one line."""
    import socket

    gone = tmp_path / "gone"
    path = tmp_path / "attempt-1.yaml"
    path.write_text(dump_config(command_config(["python", "t.py"], str(gone))))
    agent = _agent(tmp_path, command=True)
    with pytest.raises(AgentStartError) as refused:
        asyncio.run(agent.start(1, path, fresh=False))
    message = str(refused.value)
    assert message == (f"the command's directory {gone} on {socket.gethostname()}: No such file "
                       "or directory (every worker starts the command there)"), message
    assert agent.process is None
