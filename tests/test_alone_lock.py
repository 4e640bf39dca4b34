"""The lock that lets `alone` tests run with nothing else under way (tests/support/alone.py).

Each taker here is a RunLock of its own (its own open files, as each xdist worker has),
on threads: flock locks of separate opens conflict within one process as across them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import ROOT
from tests.support.alone import (
    ALONE,
    ALONE_LOG_VARIABLE,
    SHARED,
    RunLock,
    _keeps_alone,
    ends_folder,
    first_in_line,
    lock_paths,
)

HOLDS_S = 0.3  # long enough for a wrongly granted lock to be taken: the waits must last it


def own_environment() -> dict[str, str]:
    """This process's environment for a toy suite, less the outer run's hold log (its
    holds are not the suite's)."""
    return {k: v for k, v in os.environ.items() if k != ALONE_LOG_VARIABLE}


def make_lock(folder: Path, backfill: bool = False) -> RunLock:
    gate, lock = lock_paths(folder)
    gate.touch()
    lock.touch()
    ends = ends_folder(folder)
    ends.mkdir(exist_ok=True)
    return RunLock(gate, lock, ends if backfill else None)


def take_in_thread(lock: RunLock, mode: int, seconds: float | None = None) -> threading.Event:
    taken = threading.Event()

    def take() -> None:
        lock.take(mode, seconds)
        taken.set()

    threading.Thread(target=take, daemon=True).start()
    return taken


def test_shared_holders_run_together(tmp_path: Path) -> None:
    first, second = make_lock(tmp_path), make_lock(tmp_path)
    first.take(SHARED)
    assert take_in_thread(second, SHARED).wait(5.0), "a second shared hold waited"
    first.close()
    second.close()


def test_alone_waits_for_every_shared_holder_and_shared_waits_for_alone(tmp_path: Path) -> None:
    reader, writer, late = make_lock(tmp_path), make_lock(tmp_path), make_lock(tmp_path)
    reader.take(SHARED)
    alone = take_in_thread(writer, ALONE)
    assert not alone.wait(HOLDS_S), "alone was taken while a test held the lock shared"
    # A test that comes while `alone` waits does not get in ahead of it.
    late_taken = take_in_thread(late, SHARED)
    assert not late_taken.wait(HOLDS_S), "a new test started while an alone test waited"
    reader.release()
    assert alone.wait(5.0), "alone was not taken once the shared holder let go"
    assert not late_taken.wait(HOLDS_S), "a test started while an alone test ran"
    writer.release()
    assert late_taken.wait(5.0), "the waiting test did not start once alone ended"
    for lock in (reader, writer, late):
        lock.close()


def test_while_alone_waits_a_test_predicted_to_end_first_starts_and_no_other_does(
    tmp_path: Path,
) -> None:
    running, drainer, short, long_, unknown = (make_lock(tmp_path, backfill=True)
                                               for _ in range(5))
    running.take(SHARED, 30.0)  # predicted to let go in 30 s
    alone = take_in_thread(drainer, ALONE)
    assert not alone.wait(HOLDS_S)  # the drain: it holds the gate, waits for `running`
    # 1 s (x 1.25 + 1 s) ends well before: it starts during the drain.
    short_taken = take_in_thread(short, SHARED, 1.0)
    assert short_taken.wait(5.0), "a test that fits did not backfill"
    assert short.backfills == 1 and not alone.is_set()
    # 60 s would end after `running`; a test of unknown length cannot tell.
    long_taken = take_in_thread(long_, SHARED, 60.0)
    unknown_taken = take_in_thread(unknown, SHARED, None)
    assert not long_taken.wait(HOLDS_S) and not unknown_taken.is_set()
    running.release()
    assert not alone.wait(HOLDS_S), "alone was taken while a backfilled test ran"
    short.release()
    assert alone.wait(5.0), "alone was not taken once the running tests let go"
    assert not long_taken.wait(HOLDS_S) and not unknown_taken.is_set()  # not during the hold
    drainer.release()
    assert long_taken.wait(5.0) and unknown_taken.wait(5.0)
    assert long_.backfills == unknown.backfills == 0
    for lock in (running, drainer, short, long_, unknown):
        lock.close()
    assert list(ends_folder(tmp_path).iterdir()) == [], "a predicted end outlived its hold"


def test_no_backfill_beside_a_test_that_cannot_tell_or_has_overrun(tmp_path: Path) -> None:
    for seconds in (None, 0.0):  # no prediction; predicted to have ended already
        folder = tmp_path / str(seconds)
        folder.mkdir()
        running, drainer, short = (make_lock(folder, backfill=True) for _ in range(3))
        running.take(SHARED, seconds)
        alone = take_in_thread(drainer, ALONE)
        assert not alone.wait(HOLDS_S)
        short_taken = take_in_thread(short, SHARED, 0.1)
        assert not short_taken.wait(HOLDS_S), seconds
        running.release()
        assert alone.wait(5.0)
        drainer.release()
        assert short_taken.wait(5.0) and short.backfills == 0
        for lock in (running, drainer, short):
            lock.close()


class FakeItem:
    """What _keeps_alone reads of a pytest item: its module and its `alone` mark."""

    def __init__(self, module: object, alone: bool) -> None:
        self.module, self.alone = module, alone

    def get_closest_marker(self, name: str) -> object | None:
        return pytest.mark.alone.mark if name == "alone" and self.alone else None


def test_the_lock_is_kept_alone_into_the_next_test_only_within_one_module() -> None:
    here, there = object(), object()
    first, second, third = FakeItem(here, True), FakeItem(here, True), FakeItem(here, False)
    elsewhere = FakeItem(there, True)
    keeps = cast(Callable[[object, object], bool], _keeps_alone)
    assert keeps(first, second)
    assert not keeps(second, third)  # not `alone`
    assert not keeps(first, elsewhere)  # another module: its set-up may be anything
    assert not keeps(second, None)


def test_taking_the_held_mode_again_is_a_no_op_and_switching_lets_go_first(
    tmp_path: Path,
) -> None:
    one, other = make_lock(tmp_path), make_lock(tmp_path)
    one.take(SHARED)
    one.take(SHARED)
    assert one.held == SHARED
    one.take(ALONE)  # no deadlock against its own shared hold
    assert one.held == ALONE
    other_taken = take_in_thread(other, SHARED)
    assert not other_taken.wait(HOLDS_S)
    one.close()
    assert other_taken.wait(5.0)
    other.close()


TOY_TESTS = '''
import json, os, time
import pytest

def record(name):
    start = time.monotonic()
    time.sleep(0.4)
    with open(os.environ["TOY_LOG"], "a") as log:
        log.write(json.dumps([name, start, time.monotonic()]) + "\\n")

@pytest.mark.parametrize("n", range(6))
def test_shared(n):
    record(f"shared{n}")

@pytest.mark.alone
@pytest.mark.parametrize("n", range(2))
def test_alone(n):
    record(f"alone{n}")

def test_stretch(run_alone):
    record("shared-before-stretch")
    with run_alone():
        record("alone-stretch")
'''


def test_under_real_xdist_workers_no_alone_test_overlaps_another(tmp_path: Path) -> None:
    """Three real workers over toy tests in three files: the shared ones overlap (the
    workers ran side by side), no alone one (a test marked so, two in a row, or a
    `run_alone` stretch of a test) overlaps anything, and the lock's folder is gone at
    the end."""
    project = tmp_path / "toy"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["tests.support.alone"]\n')
    for name in ("a", "b", "c"):
        (project / f"test_{name}.py").write_text(TOY_TESTS)
    log = tmp_path / "log.jsonl"
    temp = tmp_path / "temp"  # the toy run's TMPDIR: where its lock's folder is made
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadfile", "--rootdir", str(project), str(project)],
        env={**own_environment(), "TOY_LOG": str(log), "PYTHONPATH": str(ROOT),
             "TMPDIR": str(temp)},
        capture_output=True, text=True, timeout=120, cwd=project, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(spans) == 3 * 10

    def overlap(a: list, b: list) -> bool:
        return a[1] < b[2] and b[1] < a[2]

    pairs = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1:]]
    assert any(overlap(a, b) for a, b in pairs if a[0].startswith("shared")
               and b[0].startswith("shared")), "the workers never ran side by side"
    clashes = [(a[0], b[0]) for a, b in pairs
               if (a[0].startswith("alone") or b[0].startswith("alone")) and overlap(a, b)]
    assert clashes == []
    assert not list(temp.glob("gpuwatch-tests-*")), "the lock's folder was left behind"


BACKFILL_TOY = {
    "test_long.py": '''
from toy import mark, record
def test_long():
    mark("long-started")
    record("long", 4.0)
''',
    "test_waits.py": '''
import pytest
from toy import record, wait_mark
def test_first():
    wait_mark("long-started")
    record("first", 0.1)

@pytest.mark.alone
def test_alone():
    record("alone", 0.3)
''',
    "test_quick.py": '''
import pytest
from toy import record, wait_mark
@pytest.mark.parametrize("n", range(12))
def test_quick(n):
    wait_mark("long-started")
    record(f"quick{n}", 0.2)
''',
    "toy.py": '''
import json, os, time
from pathlib import Path
def mark(name):
    Path(os.environ["TOY_LOG"]).with_name(name).touch()
def wait_mark(name):
    while not Path(os.environ["TOY_LOG"]).with_name(name).exists():
        time.sleep(0.02)
def record(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["TOY_LOG"], "a") as log:
        log.write(json.dumps([name, start, time.monotonic()]) + "\\n")
''',
}


def test_under_real_xdist_workers_short_tests_backfill_the_drain_before_an_alone_one(
    tmp_path: Path,
) -> None:
    """A 4 s test runs on one worker when a test marked `alone` comes up on another: the
    alone test waits for it (a drain). The third worker's tests of 0.2 s each are
    predicted (the toy's durations file) to end before it, so they keep starting during
    the drain instead of waiting for the alone test to end; still nothing overlaps it."""
    project = tmp_path / "toy"
    project.mkdir()
    (project / "conftest.py").write_text('pytest_plugins = ["tests.support.alone"]\n')
    for name, text in BACKFILL_TOY.items():
        (project / name).write_text(text)
    predicted = {"test_long.py": {"test_long": 4.0}, "test_waits.py": {"test_first": 0.1},
                 "test_quick.py": {f"test_quick[{n}]": 0.2 for n in range(12)}}
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps(predicted))
    log = tmp_path / "log.jsonl"
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadfile", "--rootdir", str(project), str(project)],
        env={**own_environment(), "TOY_LOG": str(log), "PYTHONPATH": f"{ROOT}{os.pathsep}{project}",
             "TMPDIR": str(temp), "GPUWATCH_TEST_DURATIONS": str(durations)},
        capture_output=True, text=True, timeout=120, cwd=project, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = {name: (start, end) for name, start, end in
             (json.loads(line) for line in log.read_text().splitlines())}
    assert len(spans) == 15
    alone = spans["alone"]
    assert all(end <= alone[0] or start >= alone[1]
               for name, (start, end) in spans.items() if name != "alone"), spans
    assert alone[0] >= spans["long"][1], "the alone test did not wait for the long one"
    # The drain began once `first` ended; without the backfill no test would start
    # between then (give it 0.3 s) and the alone test's start.
    during = [name for name, (start, _) in spans.items()
              if name.startswith("quick") and spans["first"][1] + 0.3 < start < alone[0]]
    assert len(during) >= 3, (during, spans)
    assert not list(temp.glob("gpuwatch-tests-*")), "the lock's folder was left behind"


# A process that keeps two threads busy until killed, and starts one more at SIGUSR1; with
# "trainer_runtime.spare" as its argument it goes idle itself first, as a spare trainer
# does (trainer_runtime/spare.py).
_BUSY = """
import os, signal, sys, threading, time
if sys.argv[1:] == ["trainer_runtime.spare"]:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
def spin():
    while True:
        time.sleep(0.01)
signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=spin, daemon=True).start())
threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
spin()
"""

# Starts _BUSY and exits once it is ready: the busy one is nobody's child here, as a
# detached supervisor (and its trainers) is no worker's. Prints its pid.
_ORPHAN = """
import subprocess, sys
busy = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]],
                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                        start_new_session=True)
if busy.stdout.readline() != "ready\\n":
    busy.kill()
    sys.exit("the busy process did not start")
print(busy.pid, flush=True)
"""


def _policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


# Its assertions are scheduling policies, which another worker's `run_first` stretch
# would change under it (its processes, under this worker's temporary directory, are
# "another test's" there): it holds the first-in-line lock itself, so none runs meanwhile.
@pytest.mark.alone(first=True)
def test_a_waiting_tests_processes_go_idle_and_get_their_own_policy_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import wait_for
    from tests.support.alone import Quieted, can_idle_and_back, processes_of_the_test

    if not can_idle_and_back():
        pytest.skip("this user may not take a thread back from SCHED_IDLE (no CAP_SYS_NICE "
                    "and RLIMIT_NICE under 20): the lock then quiets nothing")
    home = tmp_path / "gpuwatch-home"
    monkeypatch.setenv("GPUWATCH_HOME", str(home))
    pids: list[int] = []

    def orphan(*argv: str, home: Path = home) -> int:
        """A busy process, not this worker's descendant, whose environment names home."""
        out = subprocess.run([sys.executable, "-c", _ORPHAN, _BUSY, *argv], text=True,
                             capture_output=True, check=True, timeout=60,
                             env={**os.environ, "GPUWATCH_HOME": str(home)})
        pids.append(int(out.stdout))
        return pids[-1]

    child = subprocess.Popen([sys.executable, "-c", _BUSY], text=True,
                             stdout=subprocess.PIPE, env={**os.environ, "GPUWATCH_HOME": ""})
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        detached = orphan()  # a detached supervisor's trainer, say
        other = orphan(home=tmp_path / "another-home")  # another test's
        spare = orphan("trainer_runtime.spare")
        found = processes_of_the_test()
        assert {child.pid, detached, spare} <= set(found) and other not in found
        quieted = Quieted()
        for pid in (child.pid, detached, spare):
            assert _policies(pid) == {os.SCHED_IDLE}
        assert _policies(other) == {os.SCHED_OTHER}
        # While the worker waits: a thread starts in an idled process (it inherits idle),
        # a process starts (as if it inherited idle), and a spare starts (idle by choice).
        threads = _threads(detached)
        os.kill(detached, signal.SIGUSR1)
        wait_for(lambda: _threads(detached) > threads, 10, "the new thread")
        assert _policies(detached) == {os.SCHED_IDLE}
        late = orphan()
        os.sched_setscheduler(late, os.SCHED_IDLE, os.sched_param(0))
        late_spare = orphan("trainer_runtime.spare")
        quieted.restore()
        for pid in (child.pid, detached, late):
            assert _policies(pid) == {os.SCHED_OTHER}
        for pid in (spare, late_spare):
            assert _policies(pid) == {os.SCHED_IDLE}, "a spare keeps its own idle priority"
        assert _policies(other) == {os.SCHED_OTHER}
    finally:
        child.kill()
        child.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# Its assertions are scheduling policies, which another worker's `run_first` stretch
# would change under it (its processes, under this worker's temporary directory, are
# "another test's" there): it holds the first-in-line lock itself, so none runs meanwhile.
@pytest.mark.alone(first=True)
def test_a_first_stretch_idles_every_other_workers_processes_and_gives_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import wait_for
    from tests.support.alone import can_idle_and_back, processes_of_other_tests

    if not can_idle_and_back():
        pytest.skip("this user may not take a thread back from SCHED_IDLE (no CAP_SYS_NICE "
                    "and RLIMIT_NICE under 20): `run_first` then runs the stretch alone")
    # This process is worker gw0 of run "r1" (xdist's variables, which every process a
    # worker starts inherits).
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "r1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("GPUWATCH_HOME", str(tmp_path / "gpuwatch-home"))
    pids: list[int] = []

    def busy(run: str, worker: str) -> int:
        """A busy process of that run's worker (nobody's child here, as a detached
        supervisor's trainer is no worker's)."""
        env = {**os.environ, "PYTEST_XDIST_TESTRUNUID": run, "PYTEST_XDIST_WORKER": worker,
               "GPUWATCH_HOME": str(tmp_path / f"home-{run}-{worker}")}
        out = subprocess.run([sys.executable, "-c", _ORPHAN, _BUSY], text=True,
                             capture_output=True, check=True, timeout=60, env=env)
        pids.append(int(out.stdout))
        return pids[-1]

    try:
        other_worker = busy("r1", "gw1")
        mine = busy("r1", "gw0")  # this worker's own, from an earlier test, say
        other_run = busy("r2", "gw1")  # another test run's
        found = processes_of_other_tests()
        assert other_worker in found and mine not in found and other_run not in found
        with first_in_line(tmp_path / "first"):
            assert _policies(other_worker) == {os.SCHED_IDLE}
            assert _policies(mine) == {os.SCHED_OTHER}
            assert _policies(other_run) == {os.SCHED_OTHER}
            # A process the other worker starts meanwhile goes idle too.
            late = busy("r1", "gw2")
            wait_for(lambda: _policies(late) == {os.SCHED_IDLE}, 10, "the late one idle")
            # And a stretch on another worker waits for this one to end.
            second = threading.Event()

            def stretch() -> None:
                with first_in_line(tmp_path / "first"):
                    second.set()

            other = threading.Thread(target=stretch, daemon=True)
            other.start()
            assert not second.wait(HOLDS_S), "two first stretches ran at once"
        assert second.wait(5.0), "the second stretch did not run once the first ended"
        other.join(10.0)
        for name, pid in {"other_worker": other_worker, "late": late, "mine": mine,
                          "other_run": other_run}.items():
            assert _policies(pid) == {os.SCHED_OTHER}, name
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
