"""The lock that lets `alone` tests run with nothing else under way (tests/support/alone.py).

Each taker here is a RunLock of its own (its own open files, as each xdist worker has),
on threads: flock locks of separate opens conflict within one process as across them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.alone import ALONE, SHARED, RunLock, lock_paths

HOLDS_S = 0.3  # long enough for a wrongly granted lock to be taken: the waits must last it


def make_lock(folder: Path) -> RunLock:
    gate, lock = lock_paths(folder)
    gate.touch()
    lock.touch()
    return RunLock(gate, lock)


def take_in_thread(lock: RunLock, mode: int) -> threading.Event:
    taken = threading.Event()

    def take() -> None:
        lock.take(mode)
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
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

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
        env={**os.environ, "TOY_LOG": str(log), "PYTHONPATH": str(ROOT), "TMPDIR": str(temp)},
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
