"""Tests that time things run alone, while the rest of the suite runs side by side.

The suite runs on several pytest-xdist workers (pyproject.toml's addopts): most tests
spend their time waiting on real trainers, supervisors and terminals, so two or three
run at once on a 2-core box. A test whose assertion is a measured time (a rate against
a separate run, an injected latency seen on screen, "within 2 s") must not share the
CPU with another test: it is marked ``@pytest.mark.alone`` and runs with no other test
under way on any worker.

The rule is a readers-writer lock on two files shared by the workers (flock):
- every test holds the lock shared while it runs; a module or class whose fixtures keep
  a run going between its tests (marked ``keeps_running``) holds it from its first test
  to its last, so that run never overlaps an `alone` test either;
- an `alone` test holds it exclusively while its body runs (its set-up and tear-down,
  which measure nothing, run beside other tests; consecutive `alone` tests on a worker
  hold it from the first body to the last, with no drain between them);
- a test whose measured part is only a stretch of its body takes it exclusively for that
  stretch (the fixture ``run_alone``: ``with run_alone(): ...``);
- a worker that wants it exclusively first takes the gate, which every taker passes
  through: no new test starts while an `alone` test waits for the running ones to end.

Without xdist (one process) nothing is locked: the tests run one at a time anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

SHARED = fcntl.LOCK_SH
ALONE = fcntl.LOCK_EX


def lock_paths(folder: Path) -> tuple[Path, Path]:
    """The gate and the lock of one test run, in the folder the controller made for it."""
    return folder / "gate", folder / "lock"


class RunLock:
    """One worker's side of the readers-writer lock."""

    def __init__(self, gate: Path, lock: Path) -> None:
        self._gate: IO[bytes] = open(gate, "ab")  # noqa: SIM115 - held for the worker's life
        self._lock: IO[bytes] = open(lock, "ab")  # noqa: SIM115
        self.held: int | None = None

    def take(self, mode: int) -> None:
        if self.held == mode:
            return
        self.release()
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._lock, mode)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.held = mode

    def release(self) -> None:
        if self.held is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self.held = None

    def close(self) -> None:
        self.release()
        self._gate.close()
        self._lock.close()


_lock: RunLock | None = None
_folder: Path | None = None  # the controller's: made for the first worker, removed at the end


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: asserts a measured time; runs with no other test under way "
                   "(tests/support/alone.py)")
    config.addinivalue_line(
        "markers", "keeps_running: the module's (or class's) fixtures keep a run going "
                   "between its tests; it holds the suite's lock shared from its first "
                   "test to its last (tests/support/alone.py)")
    global _lock
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker
        _lock = RunLock(*lock_paths(Path(workerinput["gpuwatch_lock_folder"])))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller makes the run's lock (once) and hands each worker its folder."""
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="gpuwatch-tests-"))
        for path in lock_paths(_folder):
            path.touch()
    node.workerinput["gpuwatch_lock_folder"] = str(_folder)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _lock, _folder
    if _lock is not None:
        _lock.close()
        _lock = None
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
        _folder = None


def _run_keeper(item: pytest.Item) -> object | None:
    """The module or class whose fixtures keep a run going between its tests (a live run
    they share, in a module- or class-scoped fixture), which says so with the mark
    ``keeps_running``; None if none. A fixture that only holds data (a reference run's
    record, a probe's report) needs no mark: nothing of it runs between the tests."""
    for node, _mark in item.iter_markers_with_node("keeps_running"):
        return node
    return None


def _is_alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


# The test after the one under way on this worker (pytest_runtest_protocol's nextitem).
_next: pytest.Item | None = None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _next
    if _lock is None:
        yield
        return
    _next = nextitem
    # Set-up and tear-down run beside other tests, `alone` or not; an `alone` test right
    # after another on this worker keeps the lock as it is (no drain between them).
    if not (_lock.held == ALONE and _is_alone(item)):
        _lock.take(SHARED)
    yield
    if _lock.held == ALONE:  # kept for the next test, also `alone`
        return
    # A module (or class) whose fixtures keep a run going between its tests holds on to
    # its last test, so no `alone` test elsewhere runs beside that run either.
    keeper = _run_keeper(item)
    if keeper is None or nextitem is None or _run_keeper(nextitem) is not keeper:
        _lock.release()


@contextlib.contextmanager
def _exclusive(*, then_shared: bool = True) -> Iterator[None]:
    """This worker holds the lock alone while the block runs; after it, shared again (or,
    then_shared=False, still alone: the next test is `alone` too). Without xdist, nothing."""
    if _lock is None:
        yield
        return
    _lock.take(ALONE)
    try:
        yield
    finally:
        if then_shared:
            _lock.take(SHARED)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """An `alone` test's body (what it measures) runs with no other test under way; the
    next test, if also `alone`, keeps the lock from there (its set-up included)."""
    if not _is_alone(item):
        yield
        return
    with _exclusive(then_shared=not _is_alone(_next)):
        yield


# What the fixture `run_alone` gives a test: call it for a context manager.
RunAlone = Callable[[], contextlib.AbstractContextManager[None]]


@pytest.fixture
def run_alone() -> RunAlone:
    """For a test whose measured part is a stretch of its body (a kill and the seconds
    until everything is gone, say), not all of it: ``with run_alone(): ...`` runs that
    stretch with no other test under way, and the rest (starting TensorFlow, resuming,
    checks on the record) beside other tests. The test is not marked `alone`."""
    return _exclusive
