"""Every crash carries its root cause in `ls`; an ended run lets go of its supervisor."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from gpuwatch.runs import folders
from gpuwatch.supervisor import describe_crash
from tests.conftest import TINY, gpuwatch, wait_for

TF_FATAL = (
    "F0000 00:00:1795289936.338802 2168 tensor_shape.cc:412] Check failed: "
    "d < dims() (1 vs. 1)"
)


@pytest.mark.parametrize(
    ("returncode", "frame", "lines", "oom", "message"),
    [
        (1, "MemoryError: cannot allocate", ["Traceback ...", "MemoryError: x"], False,
         "exited with code 1: MemoryError: cannot allocate"),
        (-signal.SIGABRT, None, ["2026 trainer INFO built", TF_FATAL, "Aborted"], False,
         "killed by SIGABRT: Aborted"),
        (-signal.SIGABRT, None, ["x", TF_FATAL, "*** Begin stack trace ***", "  File \"a\""],
         False, f"killed by SIGABRT: {TF_FATAL}"),
        (-signal.SIGABRT, None,
         ["terminate called after throwing an instance of 'std::bad_alloc'", "  what():"],
         False, "killed by SIGABRT: terminate called after throwing an instance of "
         "'std::bad_alloc'"),
        (-signal.SIGSEGV, None, ["Fatal Python error: Segmentation fault", "",
                                 "Current thread 0x00 (most recent call first):",
                                 '  File "loop.py", line 3 in run'], False,
         "killed by SIGSEGV: Fatal Python error: Segmentation fault"),
        (-signal.SIGKILL, None, ["2026 trainer INFO step"], True,
         "killed by SIGKILL (the kernel's OOM killer: the machine ran out of memory)"),
        (-signal.SIGKILL, None, ["2026 trainer INFO step"], False,
         "killed by SIGKILL (out of memory, or kill -9)"),
        (3, None, ["2026 trainer INFO step"], False, "exited with code 3"),
    ],
)
def test_describe_crash_leads_with_the_root_cause(
    returncode: int, frame: str | None, lines: list[str], oom: bool, message: str
) -> None:
    assert describe_crash(returncode, frame, lines, oom) == message


def _crash(*overrides: str) -> tuple[folders.RunInfo, dict[str, object]]:
    args = [item for override in overrides for item in ("--set", override)]
    proc = gpuwatch("train", str(TINY), "--detach", *args, check=True)
    run_id = proc.stdout.strip().splitlines()[-1]

    def crashed() -> dict[str, object] | None:
        rows = [json.loads(line) for line in gpuwatch("ls", "--json").stdout.splitlines()]
        row = next(r for r in rows if r["run_id"] == run_id)
        return row if row["status"] == "crashed" else None

    row = wait_for(crashed, 120, f"run {run_id} to crash")
    return folders.resolve_run(run_id), row


@pytest.mark.slow
def test_memory_error_while_training_ends_headless_with_its_tail_and_is_named_in_ls(
    home: Path,
) -> None:
    proc = gpuwatch("train", str(TINY), "--headless",
                    "--set", "model.factory=tests.data.factories:model_that_runs_out_of_memory")
    # Headless reports the crashed trainer with the tail of its error.
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the trainer crashed" in proc.stderr
    assert "deliberate failure" in proc.stderr
    assert "Traceback" not in proc.stdout
    (row,) = [json.loads(line) for line in gpuwatch("ls", "--json", check=True).stdout.splitlines()]
    assert row["status"] == "crashed"
    assert row["exit_code"] == 1
    # TensorFlow re-raises it as ResourceExhaustedError; the Python cause stays in the line.
    assert str(row["message"]).startswith("exited with code 1: ")
    assert "MemoryError: deliberate failure after 20 calls" in str(row["message"])
    shown = gpuwatch("ls", check=True).stdout
    assert "MemoryError: deliberate failure" in shown


@pytest.mark.slow
def test_a_c_level_abort_is_named_and_the_ended_runs_supervisor_exits_by_itself(
    home: Path,
) -> None:
    info, row = _crash(
        "data.factory=tests.data.plugins:aborting_dataset",
        "data.kwargs={after_batches: 20}",
    )
    assert row["message"] == "killed by SIGABRT: Fatal Python error: Aborted"
    # Nobody follows the run: its supervisor exits by itself once the crash is recorded.
    pid = info.supervisor_pid
    wait_for(lambda: pid is None or not folders.pid_alive(pid), 5, "the supervisor to exit")
    stopped = gpuwatch("stop", info.run_id)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == f"gpuwatch: run {info.run_id} is already crashed"
    after = json.loads(gpuwatch("ls", "--json", check=True).stdout.splitlines()[0])
    assert (after["status"], after["message"]) == ("crashed", row["message"])
    again = gpuwatch("stop", info.run_id)
    assert again.returncode == 0
    assert again.stdout.strip() == f"gpuwatch: run {info.run_id} is already crashed"


def test_a_huge_cause_and_huge_log_lines_still_make_a_status_that_fits_a_frame() -> None:
    from gpuwatch.supervisor.exits import MAX_CAUSE_CHARS, MAX_LINE_CHARS, TrainerExit, exit_status
    from trainer_runtime.protocol import StatusChange, encode_event

    ended = TrainerExit(1, error="ValueError: " + "x" * 800_000,
                        log_lines=["y" * 200_000] * 60)
    status, fields = exit_status(ended, relaunching=False, stop_requested=False)
    assert status == "crashed"
    assert len(fields["message"]) <= len("exited with code 1: ") + MAX_CAUSE_CHARS
    assert fields["message"].endswith("...")
    assert all(len(line) <= MAX_LINE_CHARS for line in fields["log_tail"])
    encode_event(StatusChange(attempt=1, status=status, **fields))  # fits: no ProtocolError
