"""A run that has ended leaves nothing running: every way a run ends, crossed with how it
was started, checked in the process table.

Each cell starts a real run through the CLI (a detached supervisor process, real Unix
sockets, real process groups) with the stand-in trainer `tests.data.fake_trainer`
(GPUWATCH_TRAINER_MODULE), so the 24 cells take seconds each rather than a TensorFlow
start-up each; tests/integration/test_run_lifecycle_tf.py runs the same checks with the real
trainer.
A cell ends the run one way, then checks that within 5 s of the end being recorded no
process of the run remains: none with the run's directory in its command line, none in
the process group of its supervisor, its trainers or its spares. The exception is a
dashboard still attached: its supervisor stays (the end is on its screen, `r` works), and
goes within 5 s after the dashboard detaches. Afterwards the record alone shows the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatch.cli.headless import recorded_state
from gpuwatch.follow.client import RunClient
from gpuwatch.runs import folders
from tests.conftest import ROOT, TINY, gpuwatch, wait_for
from tests.support.attached import Attached

# How long after its end a run may still have a process (the bound).
END_TO_GONE_S = 5.0


@pytest.fixture
def fake(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_WORKER_KILL_GRACE_S", "2")
    return home


# -- the process table ----------------------------------------------------------------


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def run_processes(run_dir: Path, groups: set[int]) -> list[str]:
    """Live processes of the run: its directory in their command line, or in one of its
    process groups (the supervisor's, each trainer's, each spare's)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if not folders.pid_alive(pid):
            continue  # a zombie is no process of the run
        cmdline = _cmdline(pid)
        try:
            group = os.getpgid(pid)
        except OSError:
            continue
        if os.fsencode(run_dir) in cmdline or group in groups:
            found.append(f"{pid} (group {group}): {cmdline.decode(errors='replace')[:160]}")
    return found


def run_groups(run_dir: Path) -> set[int]:
    """The process groups the run made: its supervisor's, and each trainer's and spare's
    (each is started in a session of its own, so its group is its pid)."""
    groups = set()
    info = folders.read_supervisor_info(run_dir)
    if isinstance(info.get("pid"), int):
        groups.add(info["pid"])
    for event in recorded(run_dir):
        if event["type"] == "hello":
            groups.add(event["pid"])
    for log in run_dir.glob("**/trainer.log"):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("spare trainer pid "):
                groups.add(int(line.split()[3].rstrip(":")))
    return groups


def recorded(run_dir: Path) -> list[dict[str, Any]]:
    events = []
    with contextlib.suppress(OSError):
        for line in (run_dir / "events.jsonl").read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def end_recorded_at(run_dir: Path) -> float | None:
    """When the run's terminal status was recorded (events.jsonl's clock), if it was."""
    ends = [e["t"] for e in recorded(run_dir)
            if e["type"] == "status" and e["status"] in ("finished", "stopped", "crashed")]
    return ends[-1] if ends else None


def assert_gone_by(run_dir: Path, groups: set[int], deadline: float, what: str) -> float:
    """Every process of the run is gone by `deadline` (time.time()); returns when it was."""
    while True:
        left = run_processes(run_dir, groups | run_groups(run_dir))
        if not left:
            return time.time()
        if time.time() > deadline:
            pytest.fail(f"{what}: processes of the run still there:\n" + "\n".join(left))
        time.sleep(0.05)


# -- starting and ending ------------------------------------------------------------


def cluster_config(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(TINY.read_text() + "cluster:\n  workers: 2\n  timeout_s: 2\n")
    return path


# ending -> (trainer mode, the status the record ends with, how the test ends it)
ENDINGS: dict[str, tuple[str, str]] = {
    "finished": ("finish", "finished"),
    "trainer_exception": ("crash", "crashed"),
    "trainer_sigkill": ("hang", "crashed"),
    "cluster_worker_killed": ("hang,1=killed", "crashed"),
    "bad_factory_exit_2": ("refuse", "crashed"),
    "stop": ("hang", "stopped"),
    "stop_during_startup": ("slow", "stopped"),
    "supervisor_sigkill": ("hang", "lost"),
}
STARTS = ("headless", "detach", "dashboard")


def start(
    how: str, config: Path, home: Path
) -> tuple[Path, subprocess.Popen[str] | None]:
    """Start a run; (its directory, the headless follower if any)."""
    before = set((home / "runs").glob("*")) if (home / "runs").exists() else set()
    if how == "headless":
        follower = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "train", str(config), "--headless"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        run_dir = wait_for(
            lambda: next(iter(set((home / "runs").glob("*")) - before), None)
            if (home / "runs").exists() else None,
            30, "the headless run's directory",
        )
        wait_for(lambda: folders.read_supervisor_info(run_dir).get("pid"), 30,
                 "the headless run's supervisor")
        return run_dir, follower
    proc = gpuwatch("train", str(config), "--detach", check=True)
    run_id = proc.stdout.strip().splitlines()[-1]
    return folders.runs_root(home) / run_id, None


def hello_pids(run_dir: Path, count: int = 1) -> list[int]:
    def pids() -> list[int] | None:
        found = [e["pid"] for e in recorded(run_dir) if e["type"] == "hello"]
        return found if len(found) >= count else None

    return wait_for(pids, 30, f"{count} trainer(s) to say hello")


def end_run(ending: str, run_dir: Path) -> float | None:
    """End the run the cell's way; the time a run with no recorded end ended (else None)."""
    run_id = run_dir.name
    if ending == "trainer_sigkill":
        os.kill(hello_pids(run_dir)[0], signal.SIGKILL)
    elif ending == "stop":
        hello_pids(run_dir)
        gpuwatch("stop", run_id, check=True)
    elif ending == "stop_during_startup":
        assert not [e for e in recorded(run_dir) if e["type"] == "hello"]
        gpuwatch("stop", run_id, check=True)
    elif ending == "supervisor_sigkill":
        hello_pids(run_dir)
        pid = folders.read_supervisor_info(run_dir)["pid"]
        os.kill(pid, signal.SIGKILL)
        return time.time()
    return None


@pytest.mark.parametrize("how", STARTS)
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_an_ended_run_leaves_no_process(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str, how: str
) -> None:
    mode, status = ENDINGS[ending]
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", mode)
    config = cluster_config(tmp_path) if ending == "cluster_worker_killed" else TINY
    # With a dashboard, the trainer waits until it is attached: under load, a run that ends
    # at once had ended, and its supervisor's 1 s linger passed, before the test attached.
    gate = tmp_path / "attached"
    if how == "dashboard":
        monkeypatch.setenv("GPUWATCH_FAKE_TRAINER_GATE", str(gate))
    run_dir, follower = start(how, config, fake)
    attached = None
    if how == "dashboard":
        info = folders.read_run_info(run_dir)
        assert info.socket_path is not None
        attached = Attached(info.socket_path)
        gate.touch()
    try:
        groups = run_groups(run_dir)
        killed_at = end_run(ending, run_dir)
        ended_at = killed_at or wait_for(lambda: end_recorded_at(run_dir), 60,
                                         f"the run to end {status}")
        if attached is not None and killed_at is None:
            # A dashboard is attached: the supervisor stays, with the end on its screen.
            wait_for(lambda: attached.saw_status(status), 20, f"the dashboard to see {status}")
            time.sleep(2 * END_TO_GONE_S / 5)  # past the supervisor's linger (1 s)
            pid = folders.read_supervisor_info(run_dir)["pid"]
            assert folders.supervisor_alive(pid, run_dir), "left the attached dashboard"
            assert not folders.read_run_info(run_dir).live
            ended_at = attached.close()
            attached = None
        gone_at = assert_gone_by(run_dir, groups, ended_at + END_TO_GONE_S,
                                 f"{ending}, started {how}")
        assert gone_at - ended_at <= END_TO_GONE_S
        if follower is not None:  # the headless follower ends with the run
            code = follower.wait(END_TO_GONE_S)
            out = follower.stdout.read() if follower.stdout else ""
            expected_code = {"finished": 0, "stopped": 0, "lost": 1}.get(status, 1)
            if ending == "bad_factory_exit_2":
                expected_code = 2
            assert code == expected_code, out
            if status != "lost":
                assert "summary: steps=" in out
    finally:
        if attached is not None:
            attached.close()
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
    # The record alone shows the end: no supervisor needed to read it.
    info = folders.read_run_info(run_dir)
    assert info.status == status and info.supervisor_pid is None
    if status != "lost":
        assert recorded_state(run_dir).status == status
    listing = gpuwatch("ls")
    assert run_dir.name in listing.stdout and status in listing.stdout


# -- the spare trainer: only while a dashboard is attached to a live run ------------------


@pytest.fixture
def spares_on(fake: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUWATCH_SPARE_TRAINER", "1")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    return fake


def status_of(socket_path: Path) -> dict[str, Any]:
    async def ask() -> dict[str, Any]:
        async with RunClient(socket_path) as client:
            return await client.command("status")

    return asyncio.run(ask())


def spare_processes(run_dir: Path) -> list[int]:
    return [int(line.split()[0]) for line in run_processes(run_dir, set())
            if "trainer_runtime.spare" in line]


def test_a_headless_run_never_starts_a_spare(spares_on: Path) -> None:
    run_dir, follower = start("headless", TINY, spares_on)
    assert follower is not None
    try:
        hello_pids(run_dir)
        deadline = time.monotonic() + 3.0  # a spare would come right after the first step
        while time.monotonic() < deadline:
            assert not spare_processes(run_dir)
            time.sleep(0.1)
        socket_path = folders.read_run_info(run_dir).socket_path
        assert socket_path is not None and status_of(socket_path)["spare_pids"] == []
    finally:
        gpuwatch("stop", run_dir.name)
        follower.wait(30)
    assert "spare trainer pid" not in (run_dir / "trainer.log").read_text()


@pytest.mark.alone
def test_a_spare_waits_only_while_a_dashboard_is_attached(spares_on: Path) -> None:
    run_dir, _ = start("detach", TINY, spares_on)
    hello_pids(run_dir)
    info = folders.read_run_info(run_dir)
    assert info.socket_path is not None
    time.sleep(1.0)
    assert not spare_processes(run_dir), "a spare before any dashboard attached"
    for _ in range(2):  # attach, detach, and again
        dashboard = Attached(info.socket_path)
        try:
            spares = wait_for(lambda: spare_processes(run_dir), 20, "a spare to wait")
            assert status_of(info.socket_path)["spare_pids"] == spares
        finally:
            detached_at = dashboard.close()
        wait_for(lambda: not spare_processes(run_dir), END_TO_GONE_S,
                 "the spare to go once the dashboard detached")
        assert time.time() - detached_at <= END_TO_GONE_S
        assert folders.read_run_info(run_dir).live, "detaching ends nothing but the spare"
    dashboard = Attached(info.socket_path)
    try:
        wait_for(lambda: spare_processes(run_dir), 20, "a spare to wait")
        gpuwatch("stop", run_dir.name, check=True)
        # The run ended: no relaunch needs the spare, though the dashboard stays.
        wait_for(lambda: not spare_processes(run_dir), END_TO_GONE_S,
                 "the spare to go once the run ended")
    finally:
        detached_at = dashboard.close()
    assert_gone_by(run_dir, set(), detached_at + END_TO_GONE_S, "after the last detach")


def test_a_relaunch_setting_from_the_dashboard_relaunches_in_the_spare_with_it(
    spares_on: Path,
) -> None:
    """What `r` sends for steps_per_execution=8 set on the settings screen with a live key
    beside it (live=True: the supervisor decides): a relaunch, not a live change, whose
    new attempt is the waiting spare and records both settings."""
    run_dir, _ = start("detach", TINY, spares_on)
    hello_pids(run_dir)
    info = folders.read_run_info(run_dir)
    assert info.socket_path is not None
    dashboard = Attached(info.socket_path)
    try:
        spare = wait_for(lambda: spare_processes(run_dir), 20, "a spare to wait")[0]
        overrides = {"data.parallel_calls": 4, "train.steps_per_execution": 8}

        async def relaunch() -> dict[str, Any]:
            assert info.socket_path is not None
            async with RunClient(info.socket_path) as client:
                return await client.command("relaunch", overrides=overrides, live=True)

        reply = asyncio.run(relaunch())
        assert (reply["attempt"], reply["live"]) == (2, False)
        assert hello_pids(run_dir, 2)[1] == spare
        # Ground truth: the new attempt's recorded settings, and the config it was given.
        attempts = {e["attempt"]: e for e in recorded(run_dir) if e["type"] == "attempt"}
        assert attempts[1]["settings"]["train"]["steps_per_execution"] == 1
        attempt = attempts[2]
        assert attempt["reason"] == "relaunch" and attempt["fresh"] is False
        assert attempt["settings"]["train"]["steps_per_execution"] == 8
        assert attempt["settings"]["data"]["parallel_calls"] == 4
        given = yaml.safe_load((run_dir / "attempt-2.yaml").read_text())
        assert given["train"]["steps_per_execution"] == 8
        gpuwatch("stop", run_dir.name, check=True)
    finally:
        left_at = dashboard.close()
    assert_gone_by(run_dir, set(), left_at + END_TO_GONE_S, "after the stop")


def test_a_relaunch_from_an_attached_dashboard_after_the_end_starts_the_next_attempt(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor a dashboard keeps up after a stop relaunches as it is (`r`)."""
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")
    run_dir, _ = start("detach", TINY, fake)
    hello_pids(run_dir)
    info = folders.read_run_info(run_dir)
    assert info.socket_path is not None
    dashboard = Attached(info.socket_path)
    try:
        gpuwatch("stop", run_dir.name, check=True)
        wait_for(lambda: dashboard.saw_status("stopped"), 20, "the stop on the dashboard")

        async def relaunch() -> dict[str, Any]:
            assert info.socket_path is not None
            async with RunClient(info.socket_path) as client:
                return await client.command("relaunch", overrides={}, live=True)

        # `gpuwatch resume` meanwhile: the supervisor says a dashboard is attached, and the
        # refusal says so (and what works), at once.
        refused = gpuwatch("resume", run_dir.name, "--detach")
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr == (
            f"gpuwatch: run {run_dir.name} has ended (stopped) and a dashboard attached to it "
            f"keeps its supervisor up: press r there, or quit it and resume again\n")
        reply = asyncio.run(relaunch())
        assert reply["attempt"] == 2
        hello_pids(run_dir, 2)
        assert folders.read_run_info(run_dir).live
    finally:
        dashboard.close()
    gpuwatch("stop", run_dir.name, check=True)
    assert_gone_by(run_dir, set(), time.time() + END_TO_GONE_S, "after the stop")



def test_a_run_that_crashes_before_its_own_dashboard_attaches_waits_for_it(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpuwatch train` starts the supervisor, then attaches its dashboard: on a loaded box
    the first attempt can crash before that. The supervisor waits for that first follower
    (--await-follower), so the person reads the crash and `r` relaunches in the same run,
    and goes LINGER_S after it leaves; a follower that never comes is waited for only
    FIRST_FOLLOWER_S."""
    from gpuwatch.runs.spawn import start_supervisor

    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "crash")
    # Counted from the supervisor's start, so with room for a loaded box's waits below.
    monkeypatch.setenv("GPUWATCH_FIRST_FOLLOWER_S", "20")
    started: dict[bool, Path] = {}
    for follow in (True, False):
        _run_id, started[follow] = folders.create_run_dir(fake)
        (started[follow] / "config.yaml").write_text(TINY.read_text())
        start_supervisor(started[follow], follow=follow)
    for run_dir in started.values():
        wait_for(lambda run_dir=run_dir: end_recorded_at(run_dir), 60, "the crash")
    # Without a follower to wait for, the crash ends the run's processes at once...
    alone_dir = started[False]
    assert_gone_by(alone_dir, set(), time.time() + END_TO_GONE_S, "a crash nobody follows")
    # ... while the one whose dashboard is on its way is still up, past the 1 s linger.
    run_dir = started[True]
    ended_at = end_recorded_at(run_dir)
    assert ended_at is not None
    time.sleep(max(0.0, ended_at + 2.0 - time.time()))
    pid = folders.read_supervisor_info(run_dir).get("pid")
    assert isinstance(pid, int) and folders.supervisor_alive(pid, run_dir), \
        "it left before its dashboard attached"
    info = folders.read_run_info(run_dir)
    assert info.socket_path is not None and info.status == "crashed"
    # Meanwhile `gpuwatch resume` is refused in one line, naming what the supervisor waits
    # for (its own status says so) and what works: attach, r.
    refused = gpuwatch("resume", info.run_id, "--detach")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (
        f"gpuwatch: run {info.run_id} has ended (crashed); its supervisor waits for the "
        f"dashboard of the command that started it: gpuwatch attach {info.run_id} and "
        f"press r\n"
    )
    dashboard = Attached(info.socket_path)
    try:
        wait_for(lambda: dashboard.saw_status("crashed"), 20, "the crash on the dashboard")

        async def relaunch() -> dict[str, Any]:
            assert info.socket_path is not None
            async with RunClient(info.socket_path) as client:
                return await client.command("relaunch", overrides={}, live=True)

        assert asyncio.run(relaunch())["attempt"] == 2
        wait_for(lambda: len([e for e in recorded(run_dir) if e["type"] == "status"
                              and e["status"] == "crashed"]) >= 2, 60, "attempt 2's crash")
        reasons = [e["reason"] for e in recorded(run_dir) if e["type"] == "attempt"]
        assert reasons == ["start", "relaunch"]
    finally:
        left_at = dashboard.close()
    assert_gone_by(run_dir, set(), left_at + END_TO_GONE_S, "after its dashboard left")
    # A follower that never comes: waited for FIRST_FOLLOWER_S (12 s here, from the
    # supervisor's start), then gone.
    monkeypatch.setenv("GPUWATCH_FIRST_FOLLOWER_S", "12")
    _run_id, never_dir = folders.create_run_dir(fake)
    (never_dir / "config.yaml").write_text(TINY.read_text())
    start_supervisor(never_dir, follow=True)
    ended_at = wait_for(lambda: end_recorded_at(never_dir), 60, "the crash")
    time.sleep(max(0.0, ended_at + 2.0 - time.time()))
    pid = folders.read_supervisor_info(never_dir).get("pid")
    assert isinstance(pid, int) and folders.supervisor_alive(pid, never_dir), \
        "it did not wait for the follower it was told of"
    assert_gone_by(never_dir, set(), time.time() + 12.0 + END_TO_GONE_S,
                   "a first follower that never came")


async def test_a_relaunch_that_meets_the_supervisor_on_its_way_out_says_how_to_resume(
    tmp_path: Path,
) -> None:
    """The run ended with nobody attached and the supervisor began to exit: a relaunch that
    comes now is refused in one line naming `gpuwatch resume`, not an internal error."""
    from gpuwatch.supervisor import Supervisor

    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(TINY.read_text())
    sup = Supervisor(run_dir, tmp_path / "sock" / "r1.sock")
    sup.status = "finished"
    sup.exiting = True
    with pytest.raises(ValueError, match=r"^run r1 has ended and its supervisor is exiting; "
                                         r"gpuwatch resume r1 continues it$"):
        await sup.relaunch(sup.config, fresh=False)


# Real processes (a supervisor, a trainer, sshd or tmux): after the quick tests.
pytestmark = pytest.mark.slow
