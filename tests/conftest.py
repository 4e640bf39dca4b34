"""Shared fixtures: a private GPUWATCH_HOME per test, the gpuwatch CLI as a subprocess,
and clean-up that leaves no supervisor or trainer behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # the GPU box runs tests/gpu with pytest alone (docs/gpu-validation.md)
    pass
else:
    # Property tests check what is computed, not how fast: on xdist workers sharing two
    # cores one example may stall past hypothesis's 200 ms deadline or its too-slow
    # check. Speed is asserted where it is the point: benchmarks and the `alone` tests.
    settings.register_profile(
        "gpuwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("gpuwatch")

from tests.support import tf_devices
from tests.support.durations import Durations, module_of
from tests.support.durations import write as write_durations

# TensorFlow in this process, whichever module imports it first, finds the CPU split into
# the trainer tests' two replicas (tests/support/tf_devices.py): no test depends on what
# a module before it did to the process.
tf_devices.install()

# Tests marked `alone` run with no other test under way on any xdist worker; no test is
# ever run a second time to make it pass (tests/support/no_retries.py).
pytest_plugins = ["tests.support.alone", "tests.support.no_retries"]

ROOT = Path(__file__).resolve().parents[1]
# No spare trainer (gpuwatch/supervisor/spare.py) unless a test asks: each would import
# TensorFlow once more per real run, doubling the suite's CPU on a 2-core CI box.
# tests/integration/test_spare.py and the tmux demo test turn it on.
os.environ.setdefault("GPUWATCH_SPARE_TRAINER", "0")
# Python's own default, as users run it: compiled modules are written to __pycache__ and
# read back. A box that sets PYTHONDONTWRITEBYTECODE (this development box does) made
# each of the suite's ~600 processes (CLI calls, supervisors, trainers) compile gpuwatch
# and trainer_runtime from source again (0.07-0.23 CPU-s each), and each xdist worker
# rewrite every test module's asserts (collection 10.1 CPU-s, against 5.1 with them
# cached): some 100 CPU-seconds of a run on two cores.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
TINY = ROOT / "tests" / "data" / "tiny.yaml"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; the GPU box runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many tests run side by side (`-n auto`): two more than the cores, at most 4.

    Most of a slow test's time is spent waiting on the processes it started (a trainer,
    a supervisor, a terminal): in one process the slow tests kept this project's 2-core
    CI box 52 % busy; 3 workers 76 % (12 min 24 s), 4 workers 80 % (11 min 29 s, the
    same tests: docs/benchmarks.md). More than 4 would mostly queue behind the `alone`
    tests."""
    return max(2, min(4, (os.cpu_count() or 1) + 2))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The quick tests first, so a failure there shows within a minute or two: every module
    with a test marked `slow` (real TensorFlow training, real clusters) runs after the
    modules with none; within a module, its `alone` tests last. The slow ones go longest
    first (tests/durations.json; a module not in it counts as the longest), so no long
    module starts last while the other workers run out of work. Whole modules move, so a
    module's fixtures are set up once (xdist hands them out in this order:
    --no-loadscope-reorder in pyproject.toml)."""
    known = Durations()
    slow_modules = {module_of(item.nodeid) for item in items
                    if item.get_closest_marker("slow")}
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(module_of(item.nodeid), len(first_seen))

    def key(item: pytest.Item) -> tuple[bool, float, int, bool]:
        module = module_of(item.nodeid)
        slow = module in slow_modules
        seconds = known.module_seconds(module)
        # A module's `alone` tests last in it, in their order (those in a class stay in
        # it): run one after another they take the suite's lock once, not once each, and
        # every taking waits for the tests running elsewhere to end.
        alone = (item.get_closest_marker("alone") is not None
                 and getattr(item, "cls", None) is None)
        return (slow, -(float("inf") if seconds is None else seconds) if slow else 0.0,
                first_seen[module], alone)

    items.sort(key=key)
    seed = os.environ.get(ORDER_SEED_VARIABLE)
    if seed:
        shuffle_modules(items, seed)


def shuffle_modules(items: list[Any], seed: str) -> None:
    """Whole modules in an order drawn from the seed, each module's own order kept: which
    modules a worker runs before which is new each seed, so a test that leans on what an
    earlier module left in the process fails (docs/benchmarks.md, "Flaky tests")."""
    modules = list(dict.fromkeys(module_of(item.nodeid) for item in items))
    random.Random(seed).shuffle(modules)
    rank = {module: index for index, module in enumerate(modules)}
    items.sort(key=lambda item: rank[module_of(item.nodeid)])


# Set to any text: the modules run in an order drawn from it (the header shows it).
ORDER_SEED_VARIABLE = "GPUWATCH_TEST_ORDER_SEED"


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = os.environ.get(ORDER_SEED_VARIABLE)
    return f"modules in an order drawn from {ORDER_SEED_VARIABLE}={seed}" if seed else None


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With GPUWATCH_DURATIONS_OUT set: each test's seconds, for tests/durations.json
    (on the xdist controller, which gets every worker's reports, or the one process)."""
    if os.environ.get("GPUWATCH_DURATIONS_OUT"):
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


_SESSION_START = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the socket folders this session's homes left in /tmp (see
    _kill_everything_under; homes a test made by hand, and runs killed mid-socket, leave
    them too): each made or changed since the session began, with no live socket in it.
    Once, on the xdist controller (or the one process), after every worker is done."""
    if hasattr(session.config, "workerinput"):
        return
    out = os.environ.get("GPUWATCH_DURATIONS_OUT")
    if out and _durations:
        write_durations(Path(out), _durations)
    import glob
    import shutil
    import socket
    import tempfile

    def live(path: str) -> bool:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
            except OSError:
                return False
            return True

    for folder in glob.glob(f"/tmp/gpuwatch-{os.getuid()}-*"):
        with contextlib.suppress(OSError):
            if os.stat(folder).st_mtime < _SESSION_START:
                continue
            if not any(live(os.path.join(folder, name)) for name in os.listdir(folder)):
                shutil.rmtree(folder, ignore_errors=True)
    # And the temporary directories of trainers the tests killed outright themselves,
    # with no supervisor to remove them (trainer_runtime/scratch.py), once they are gone.
    from gpuwatch.runs.folders import pid_alive
    from trainer_runtime import scratch

    for folder in glob.glob(os.path.join(tempfile.gettempdir(), f"{scratch.PREFIX}*-*")):
        pid = os.path.basename(folder)[len(scratch.PREFIX):].split("-")[0]
        with contextlib.suppress(OSError, ValueError):
            if os.stat(folder).st_mtime >= _SESSION_START and not pid_alive(int(pid)):
                shutil.rmtree(folder, ignore_errors=True)


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str | Callable[[], str],
    every_s: float = 0.05,
) -> Any:
    """Poll until predicate() is truthy; fail naming what we waited for (what() is called
    then, so it can show the state at the timeout, e.g. the screen).

    The pause starts at every_s and grows by half each time up to POLL_MAX_S (or every_s,
    if more): a predicate that reads a whole events.jsonl or asks tmux for the screen
    costs CPU every time, and the suite shares two cores."""
    deadline = time.monotonic() + timeout_s
    pause, longest = every_s, max(every_s, POLL_MAX_S)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {said}")
        time.sleep(pause)
        pause = min(pause * 1.5, longest)


# The longest pause between two looks of wait_for.
POLL_MAX_S = 0.25


def _home_env(path: Path) -> dict[str, str]:
    """What a test's gpuwatch home sets: the home, a detach of its own, a 20 s stop grace."""
    return {"GPUWATCH_HOME": str(path), "GPUWATCH_DETACH": "setsid",
            "GPUWATCH_STOP_GRACE_S": "20"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "gpuwatch-home"
    path.mkdir()
    for key, value in _home_env(path).items():
        monkeypatch.setenv(key, value)
    yield path
    _kill_everything_under(path)


@contextlib.contextmanager
def shared_home(path: Path) -> Iterator[Path]:
    """`home` for a module- or class-scoped fixture whose run its tests share: set while
    the block runs, and every process under it ended when it leaves."""
    path.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in _home_env(path).items():
            patch.setenv(key, value)
        try:
            yield path
        finally:
            _kill_everything_under(path)


def _kill_everything_under(home: Path) -> None:
    """Stop every supervisor (and its trainer's process group) a test left running, and
    remove the home's socket folder where it is not inside the home (a test's home is
    too long a path for a socket: /tmp/gpuwatch-<uid>-<hash>, gpuwatch/runs/folders.py)."""
    import json
    import shutil

    from gpuwatch.runs import folders

    for info_path in (home / "runs").glob("*/supervisor.json"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(json.loads(info_path.read_text())["pid"])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ")
            if str(home).encode() in cmdline and int(pid_dir.name) != os.getpid():
                deadline = time.monotonic() + 30
                while Path(pid_dir).exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_dir.name), signal.SIGKILL)
    sockets = folders.socket_dir(home)
    if not sockets.is_relative_to(home.resolve()):
        shutil.rmtree(sockets, ignore_errors=True)


def gpuwatch(
    *args: str, timeout_s: float = 240, check: bool = False
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env=os.environ.copy(),
        check=False,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"gpuwatch {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def run_async(coro: Any, timeout_s: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))
