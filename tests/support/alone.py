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
  hold it from the first body to the last, with no drain between them, when they are in
  one module);
- a test whose measured part is only a stretch of its body takes it exclusively for that
  stretch (the fixture ``run_alone``: ``with run_alone(): ...``);
- a short stretch of the test's own processes' work with a bound (a kill, then the seconds
  until all is gone) need not empty the suite: ``run_first`` (or a test marked
  ``alone(first=True)``, for its body) runs it first in line for the CPU, every other
  test's processes at idle priority (SCHED_IDLE) meanwhile, with no drain; their tests
  go on with what it leaves. A drain cost 10-36 s of a worker's time for such holds of
  0.1-4 s (docs/benchmarks.md);
- a worker that wants it exclusively first takes the gate, which every taker passes
  through: no new test starts while an `alone` test waits for the running ones to end
  (a drain), with one exception, the backfill (as a batch scheduler backfills a queue):
  a test predicted to end before the last of the running tests does (their seconds in
  tests/durations.json, published by each worker as it starts one) starts anyway, so
  a worker whose test ended early does not sit idle through the drain. A test whose
  seconds are not known neither backfills nor lets another backfill beside it; a wrong
  prediction makes the `alone` test wait longer, never run beside another.

While a worker waits to hold the lock alone it holds nothing, and what its test started
(a trainer training on, a dashboard in tmux, a supervisor) would run beside the `alone`
test it waits for: so the test's processes (this worker's descendants, and any process
whose environment names the test's gpuwatch home: detached supervisors, their trainers,
tmux) wait at idle CPU priority (SCHED_IDLE) and get their own back once the lock is held
(``Quieted``; a spare trainer's own idle priority is kept). Only where the user may take a
thread back from idle (CAP_SYS_NICE, as root has): elsewhere nothing is quieted.

Without xdist (one process) nothing is locked: the tests run one at a time anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.durations import Durations

SHARED = fcntl.LOCK_SH
ALONE = fcntl.LOCK_EX

# A backfill starts only if its predicted seconds, times this and plus that, end before
# the last running test's predicted end: predictions come from another run on a busy box.
BACKFILL_SLACK = 1.25
BACKFILL_MARGIN_S = 1.0
POLL_S = 0.05  # how often a worker held at the gate looks for a backfill


def lock_paths(folder: Path) -> tuple[Path, Path]:
    """The gate and the lock of one test run, in the folder the controller made for it."""
    return folder / "gate", folder / "lock"


def first_path(folder: Path) -> Path:
    """The lock that lets one `run_first` stretch run at a time."""
    return folder / "first"


def workers_folder(folder: Path) -> Path:
    """Where each worker says its pid (a file named by it)."""
    return folder / "workers"


def ends_folder(folder: Path) -> Path:
    """Where each worker holding the lock shared says when it expects to let go."""
    return folder / "ends"


class RunLock:
    """One worker's side of the readers-writer lock.

    ``ends``: the folder of predicted ends (the backfill); None, no backfill. A worker
    holding the lock shared keeps a file there, ``end-<pid>-<lock>``, with the time
    (time.time()) it expects to let go, or ``-`` when it cannot tell.
    """

    def __init__(self, gate: Path, lock: Path, ends: Path | None = None) -> None:
        self._gate: IO[bytes] = open(gate, "ab")  # noqa: SIM115 - held for the worker's life
        self._lock: IO[bytes] = open(lock, "ab")  # noqa: SIM115
        self._ends = ends
        self._mine = ends / f"end-{os.getpid()}-{id(self)}" if ends is not None else None
        self.held: int | None = None
        self.backfills = 0  # shared holds taken while an `alone` test waited

    def take(self, mode: int, seconds: float | None = None) -> None:
        """Hold the lock in `mode`. Shared, `seconds` is how long the holder expects to
        keep it (None: it cannot tell): while a drain is under way, a hold predicted to
        end before the running ones starts at once (the backfill)."""
        if self.held == mode:
            return
        self.release()
        if mode == SHARED and seconds is not None and self._ends is not None:
            self._shared_or_backfill(seconds)
        else:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._lock, mode)
            finally:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.held = mode
        if mode == SHARED:
            self.publish(None if seconds is None else time.time() + seconds)

    def _shared_or_backfill(self, seconds: float) -> None:
        while True:
            try:
                fcntl.flock(self._gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Someone holds the gate: a drain (an `alone` test waits for the running
                # tests), a taker held by an `alone` test's hold, or one passing through.
                if self._fits(seconds):
                    try:  # granted only while no `alone` test holds the lock
                        fcntl.flock(self._lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:
                        pass
                    else:
                        self.backfills += 1
                        return
                time.sleep(POLL_S)
                continue
            try:
                fcntl.flock(self._lock, fcntl.LOCK_SH)
            finally:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
            return

    def _fits(self, seconds: float) -> bool:
        """Whether a hold of `seconds` from now ends before the last running one is
        predicted to; no, if none runs or one cannot tell."""
        assert self._ends is not None
        last: float | None = None
        for path in self._ends.glob("end-*"):
            if path == self._mine:
                continue
            try:
                end = float(path.read_text())
            except FileNotFoundError:  # let go since it was listed
                continue
            except (OSError, ValueError):  # "-", or caught mid-write: no guess
                return False
            last = end if last is None else max(last, end)
        return last is not None and (
            time.time() + seconds * BACKFILL_SLACK + BACKFILL_MARGIN_S <= last)

    def publish(self, end: float | None) -> None:
        """Say when this shared hold is expected to end (None: cannot tell)."""
        if self._mine is not None:
            self._mine.write_text("-" if end is None else repr(end))

    def release(self) -> None:
        if self.held is not None:
            if self._mine is not None:
                self._mine.unlink(missing_ok=True)
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self.held = None

    def close(self) -> None:
        self.release()
        self._gate.close()
        self._lock.close()


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


# GPUWATCH_HOME as this process was started with it (a shell's, say): not a test's home,
# so never a reason to count another process as the test's (the workers and the
# controller have it too). A test's is the one its `home` fixture set since.
_INHERITED_HOME = os.environ.get("GPUWATCH_HOME")


def processes_of_the_test() -> list[int]:
    """The processes of the test under way on this worker: its descendants, and every
    process whose environment names the test's gpuwatch home (GPUWATCH_HOME, as the
    `home` fixture sets it): a detached supervisor is no worker's child, nor its trainers."""
    me = os.getpid()
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(me, []))
    home = os.environ.get("GPUWATCH_HOME")
    if home and home != _INHERITED_HOME:
        marker = f"\0GPUWATCH_HOME={home}\0".encode()
        for pid in parents:
            with contextlib.suppress(OSError):
                if pid != me and marker in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                    todo.append(pid)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(found)


def processes_of_other_tests() -> list[int]:
    """Every process of this test run's other workers: the workers themselves (each says
    its pid in the lock's folder: xdist sets its variables after the worker started, so
    the worker's own /proc environ lacks them), their descendants, and what their tests
    started elsewhere (a detached supervisor and its trainers, a tmux server): by the
    variables xdist gives each worker, which what it starts inherits
    (PYTEST_XDIST_TESTRUNUID the run's, PYTEST_XDIST_WORKER another's), or by a gpuwatch
    home in another worker's temporary directory (a test's cleaned environment keeps that
    one). Never this worker's test's own (``processes_of_the_test``)."""
    me = os.getpid()
    parents = _parents()
    mine = set(processes_of_the_test()) | {me}
    workers = {pid for pid in _worker_pids() if pid != me and pid in parents}
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = list(workers) + [pid for pid in parents if pid not in mine and _of_another(pid)]
    while todo:
        pid = todo.pop()
        if pid not in found and pid not in mine:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(found)


def _worker_pids() -> list[int]:
    if _workers_dir is None:
        return []
    with contextlib.suppress(OSError, ValueError):
        return [int(entry.name) for entry in os.scandir(_workers_dir)]
    return []


# Whether a process (by pid and start time, and who asks) is another worker's, by its
# environment, which does not change: each is read once.
_another: dict[tuple[int, str, str, str], bool] = {}


def _of_another(pid: int) -> bool:
    try:
        started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return False
    key = (pid, started, os.environ.get("PYTEST_XDIST_TESTRUNUID", ""),
           os.environ.get("PYTEST_XDIST_WORKER", ""))
    if key not in _another:
        _another[key] = _environ_of_another(pid)
    return _another[key]


def _environ_of_another(pid: int) -> bool:
    run, worker = os.environ.get("PYTEST_XDIST_TESTRUNUID"), os.environ.get("PYTEST_XDIST_WORKER")
    try:
        environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    if run and worker and f"\0PYTEST_XDIST_TESTRUNUID={run}\0".encode() in environ:
        return f"\0PYTEST_XDIST_WORKER={worker}\0".encode() not in environ
    if _session_tmp is not None and _own_tmp is not None:
        home = re.search(rb"\0GPUWATCH_HOME=([^\0]*)", environ)
        if home is not None:
            path = os.fsdecode(home.group(1)) + "/"
            return path.startswith(_session_tmp) and not path.startswith(_own_tmp)
    return False


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _is_spare(pid: int) -> bool:
    """A spare trainer (trainer_runtime/spare.py), which keeps itself at idle priority."""
    with contextlib.suppress(OSError):
        return b"trainer_runtime.spare" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return False


_idle_and_back: bool | None = None


def can_idle_and_back() -> bool:
    """Whether this process may put a thread at SCHED_IDLE and take it back to SCHED_OTHER
    (the way back needs CAP_SYS_NICE or an RLIMIT_NICE of 20: root here, and in CI), by
    the spare trainer's own check, once; without it, nothing is quieted (an idled process
    would stay idle)."""
    global _idle_and_back
    if _idle_and_back is None:
        from trainer_runtime.spare import can_leave_idle  # stdlib only: no TensorFlow

        _idle_and_back = can_leave_idle()
    return _idle_and_back


class Quieted:
    """Processes at idle CPU priority (SCHED_IDLE) while it lasts, and each thread's own
    policy back after (``restore``): by default the test's own (``processes_of_the_test``)
    while its worker waits for the lock; ``find`` names others (``run_first``: every other
    test's), and ``quiet_new`` takes those found since. Only what is still idle at the
    end is touched (a spare that became a trainer meanwhile set its own policy): a thread
    of its own takes back what it had, one started meanwhile (which inherited the idle
    policy) its process's, a process started meanwhile SCHED_OTHER, but a spare trainer,
    which picks idle itself, is left as it is."""

    def __init__(self, find: Callable[[], list[int]] | None = None) -> None:
        self.find = find or processes_of_the_test
        self.policies: dict[int, dict[int, int]] = {}
        self._looked = False  # quiet_new has looked once
        if not can_idle_and_back():
            return
        self.quiet_new()

    def quiet_new(self) -> None:
        """Idle what `find` names that is not idled yet. What it finds after the first
        look, idle already, inherited that from a process idled here (a trainer a quieted
        supervisor started, a thread of a quieted process): it gets its process's policy
        back, or SCHED_OTHER, at the end; a spare trainer keeps its own idle."""
        later = self._looked
        self._looked = True
        for pid in self.find():
            known = pid in self.policies
            threads = self.policies.setdefault(pid, {})
            for tid in _threads(pid):
                if tid in threads:
                    continue
                with contextlib.suppress(OSError):
                    policy = os.sched_getscheduler(tid)
                    if later and policy == os.SCHED_IDLE and not _is_spare(pid):
                        policy = threads.get(pid, os.SCHED_OTHER) if known else os.SCHED_OTHER
                    threads[tid] = policy
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))

    def restore(self) -> None:
        if not self.policies:
            return
        # Those it idled (found again or not: a reparented one may no longer be), and
        # those started meanwhile.
        for pid in sorted(set(self.policies) | set(self.find())):
            known = self.policies.get(pid)
            if known is None and _is_spare(pid):
                continue
            for tid in _threads(pid):
                if known is None:
                    policy = os.SCHED_OTHER
                else:
                    policy = known.get(tid, known.get(pid, os.SCHED_OTHER))
                with contextlib.suppress(OSError):
                    if os.sched_getscheduler(tid) == os.SCHED_IDLE != policy:
                        os.sched_setscheduler(tid, policy, os.sched_param(0))
        self.policies = {}


_lock: RunLock | None = None
_folder: Path | None = None  # the controller's: made for the first worker, removed at the end
_first_lock: Path | None = None  # a worker's: one `run_first` stretch at a time
_workers_dir: Path | None = None  # where each worker says its pid
# The run's temporary directory and this worker's in it ("/"-ended): another worker's
# test's gpuwatch home lies in the first and not in the second.
_session_tmp: str | None = None
_own_tmp: str | None = None
# How often a `run_first` stretch looks for processes the other tests started since.
FIRST_RESCAN_S = 0.5
_durations = Durations()  # each test's predicted seconds (the backfill)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: asserts a measured time; runs with no other test under way, or "
                   "with first=True first in line for the CPU (tests/support/alone.py)")
    config.addinivalue_line(
        "markers", "keeps_running: the module's (or class's) fixtures keep a run going "
                   "between its tests; it holds the suite's lock shared from its first "
                   "test to its last (tests/support/alone.py)")
    global _lock, _first_lock, _workers_dir, _config
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker
        folder = Path(workerinput["gpuwatch_lock_folder"])
        _lock = RunLock(*lock_paths(folder), ends=ends_folder(folder))
        _first_lock = first_path(folder)
        _workers_dir = workers_folder(folder)
        (_workers_dir / str(os.getpid())).touch()
        _config = config


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller makes the run's lock (once) and hands each worker its folder."""
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="gpuwatch-tests-"))
        for path in lock_paths(_folder):
            path.touch()
        ends_folder(_folder).mkdir()
        workers_folder(_folder).mkdir()
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
    """Marked `alone`: its body runs with no other test under way (not `first=True`)."""
    if item is None:
        return False
    mark = item.get_closest_marker("alone")
    return mark is not None and not mark.kwargs.get("first", False)


def _is_first(item: pytest.Item) -> bool:
    """Marked `alone(first=True)`: its body runs first in line for the CPU (``run_first``)."""
    mark = item.get_closest_marker("alone")
    return mark is not None and bool(mark.kwargs.get("first", False))


def _predicted_hold(item: pytest.Item) -> float | None:
    """How long the worker will hold the lock shared from this test's start, by
    tests/durations.json: the test's seconds, or, in a module that keeps a run going,
    those of the rest of the module; None if it cannot tell (a test not in the file, an
    `alone` test, whose seconds are mostly its body)."""
    if _is_alone(item):
        return None
    keeper = _run_keeper(item)
    rest = [item]
    if keeper is not None:
        items = item.session.items
        start = items.index(item)
        rest = [later for later in items[start:] if _run_keeper(later) is keeper]
    total = 0.0
    for one in rest:
        seconds = _durations.test_seconds(one.nodeid)
        if seconds is None or _is_alone(one):
            return None
        total += seconds
    return total


# The test after the one under way on this worker (pytest_runtest_protocol's nextitem).
_next: pytest.Item | None = None
# When the test under way on this worker was predicted to end (None: cannot tell).
_predicted_end: float | None = None
# The test under way on this worker (the hold log's lines name it).
_current: str = ""
# Set to a file's path: each exclusive hold appends a line to it, the test, the seconds it
# waited for the lock and the seconds it held it (how much of a run is spent alone:
# docs/benchmarks.md, "The suite's time").
ALONE_LOG_VARIABLE = "GPUWATCH_ALONE_LOG"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _next, _predicted_end, _current
    if _lock is None:
        yield
        return
    _next = nextitem
    _current = item.nodeid
    # Set-up and tear-down run beside other tests, `alone` or not; an `alone` test right
    # after another on this worker keeps the lock as it is (no drain between them).
    if not (_lock.held == ALONE and _is_alone(item)):
        seconds = _predicted_hold(item)
        if _lock.held == SHARED:  # a module that keeps a run going: already held
            _lock.publish(None if seconds is None else time.time() + seconds)
        else:
            _lock.take(SHARED, seconds)
        _predicted_end = None if seconds is None else time.time() + seconds
    yield
    if _lock.held == ALONE:  # kept for the next test, also `alone`
        return
    # A module (or class) whose fixtures keep a run going between its tests holds on to
    # its last test, so no `alone` test elsewhere runs beside that run either.
    keeper = _run_keeper(item)
    if keeper is None or nextitem is None or _run_keeper(nextitem) is not keeper:
        _lock.release()


def _log_hold(kind: str, kept: bool, asked: float, taken: float) -> None:
    log = os.environ.get(ALONE_LOG_VARIABLE)
    if log:
        with open(log, "a") as out:
            out.write(json.dumps({"test": _current, "kind": kind, "kept": kept,
                                  "waited_s": round(taken - asked, 2),
                                  "held_s": round(time.monotonic() - taken, 2)}) + "\n")


@contextlib.contextmanager
def _exclusive(*, then_shared: bool = True) -> Iterator[None]:
    """This worker holds the lock alone while the block runs; after it, shared again (or,
    then_shared=False, still alone: the next test is `alone` too). Without xdist, nothing."""
    if _lock is None:
        yield
        return
    asked = time.monotonic()
    was_held = _lock.held == ALONE
    quieted = Quieted()  # what the test started waits at idle priority meanwhile
    try:
        _lock.take(ALONE)
    finally:
        quieted.restore()
    taken = time.monotonic()
    try:
        yield
    finally:
        _log_hold("alone", was_held, asked, taken)
        if then_shared:
            _lock.take(SHARED)
            # Back to the end predicted when the test started (a `run_alone` stretch).
            _lock.publish(_predicted_end)


@contextlib.contextmanager
def first_in_line(lock_path: Path) -> Iterator[None]:
    """The block runs first in line for the CPU: every other test's processes
    (``processes_of_other_tests``, looked for again every FIRST_RESCAN_S) wait at idle
    CPU priority while it runs, and get their own policies back after (``Quieted``). One
    such block at a time among those that flock `lock_path`."""
    import threading

    with open(lock_path, "ab") as first:
        fcntl.flock(first, fcntl.LOCK_EX)
        others = Quieted(processes_of_other_tests)
        done = threading.Event()

        def rescan() -> None:
            while not done.wait(FIRST_RESCAN_S):
                others.quiet_new()

        scanner = threading.Thread(target=rescan, name="run-first-rescan", daemon=True)
        scanner.start()
        try:
            yield
        finally:
            done.set()
            scanner.join()
            others.restore()


_config: pytest.Config | None = None


def _note_temporary_directories() -> None:
    """The run's temporary directory and this worker's (``_environ_of_another``), once."""
    global _session_tmp, _own_tmp
    if _own_tmp is not None or _config is None:
        return
    with contextlib.suppress(Exception):
        own = _config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        _own_tmp, _session_tmp = f"{own}/", f"{own.parent}/"


@contextlib.contextmanager
def _first() -> Iterator[None]:
    """The block (a `run_first` stretch, an `alone(first=True)` test's body) runs first in
    line for the CPU (``first_in_line``), with no drain: the running tests go on, at idle
    priority, so the block's own processes take the cores whenever they want them and the
    others use only what they leave. None runs during an `alone` hold (this worker holds
    the lock shared throughout). Where priorities cannot be taken back (no CAP_SYS_NICE),
    it runs alone instead (``_exclusive``)."""
    if _lock is None or _first_lock is None:
        yield
        return
    if not can_idle_and_back():
        with _exclusive():
            yield
        return
    _note_temporary_directories()
    asked = time.monotonic()
    with first_in_line(_first_lock):
        taken = time.monotonic()
        try:
            yield
        finally:
            _log_hold("first", False, asked, taken)


def _keeps_alone(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Whether the worker keeps the lock alone from this `alone` test's body to the next
    test's: the next is `alone` too, in the same module. Its set-up then runs inside the
    hold, which costs less than a drain when, as in one module, the set-ups are light
    (tests/integration/trainer/test_script_hook.py preloads its scripts at the first one); the next
    module's `alone` test may start with anything (a million-event run written in its
    set-up, 26 s), so it waits its turn like any other."""
    return (nextitem is not None and _is_alone(nextitem)
            and getattr(nextitem, "module", None) is getattr(item, "module", None))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """An `alone` test's body (what it measures) runs with no other test under way; the
    next test, if also `alone` and in the same module, keeps the lock from there (its
    set-up included)."""
    if _is_first(item):
        with _first():
            yield
        return
    if not _is_alone(item):
        yield
        return
    with _exclusive(then_shared=not _keeps_alone(item, _next)):
        yield


# What the fixtures `run_alone` and `run_first` give a test: call it for a context manager.
RunAlone = Callable[[], contextlib.AbstractContextManager[None]]


@pytest.fixture
def run_alone() -> RunAlone:
    """For a test whose measured part is a stretch of its body (a kill and the seconds
    until everything is gone, say), not all of it: ``with run_alone(): ...`` runs that
    stretch with no other test under way, and the rest (starting TensorFlow, resuming,
    checks on the record) beside other tests. The test is not marked `alone`."""
    return _exclusive


@pytest.fixture
def run_first() -> RunAlone:
    """For a test whose measured part is a short stretch of its own processes' work with a
    bound (a kill and the seconds until everything is gone): ``with run_first(): ...``
    runs that stretch first in line for the CPU, every other test's processes at idle
    priority meanwhile (``_first``), with no drain of the running tests: a drain cost
    10-36 s of a worker's time for holds of 0.1-4 s (docs/benchmarks.md)."""
    return _first
