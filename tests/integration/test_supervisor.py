"""The supervisor with a real trainer: runs outlive clients, faults are contained, nothing is lost.

Each test starts real runs (`gpuwatch train tests/data/tiny.yaml --detach`): a
detached supervisor and a TensorFlow trainer with 2 CPU replicas; where only the
supervisor and its clients matter (two runs side by side, a supervisor killed under a
client), the stand-in trainer (tests/data/fake_trainer.py) instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import CommandError, ConnectionLost, RunClient
from gpuwatch.runs import folders
from gpuwatch.supervisor import peer_allowed, peer_credentials
from tests.conftest import ROOT, TINY, gpuwatch, run_async, shared_home, wait_for
from tests.support.attached import Attached

pytestmark = pytest.mark.slow

Events = list[dict[str, Any]]


def start_run(*extra: str) -> folders.RunInfo:
    proc = gpuwatch("train", str(TINY), "--detach", *extra, check=True)
    run_id = proc.stdout.strip().splitlines()[-1]
    return folders.resolve_run(run_id)


async def collect(
    socket_path: Path, until: Callable[[Events], bool], from_seq: int = 0, timeout_s: float = 90
) -> Events:
    """Subscribe and gather events until `until(events)` holds."""
    events: Events = []
    async with RunClient(socket_path) as client:
        await client.subscribe(from_seq)

        async def gather() -> None:
            while not until(events):
                events.extend(await client.next_batch())

        await asyncio.wait_for(gather(), timeout_s)
    return events


def steps_of(events: Events) -> list[int]:
    return [e["step"] for e in events if e["type"] == "step"]


def has_step(n: int) -> Callable[[Events], bool]:
    return lambda events: any(e["type"] == "step" and e["step"] >= n for e in events)


def read_events(run_dir: Path) -> Events:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def status_of(info: folders.RunInfo) -> dict[str, Any]:
    async def ask() -> dict[str, Any]:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            return await client.command("status")

    return run_async(ask())


def process_exists(pid: int) -> bool:
    return folders.pid_alive(pid)


@pytest.fixture(scope="class")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[folders.RunInfo]:
    """One tiny run for the tests that only read it or send it what it refuses: started
    once, going on between them, stopped after the last."""
    with shared_home(tmp_path_factory.mktemp("shared") / "gpuwatch-home"):
        yield start_run()


@pytest.mark.keeps_running
class TestOneSharedRun:
    """What a run outlives and what it refuses, on one run: none of these changes its
    attempt (those that could check that it did not), so none needs a run of its own."""

    def test_killed_dashboard_loses_nothing_and_a_new_attach_sees_every_step(
        self, shared_run: folders.RunInfo
    ) -> None:
        info = shared_run
        assert info.socket_path is not None
        # A "dashboard": a separate process subscribed to the run, killed with SIGKILL.
        viewer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import asyncio, sys\n"
                    "from gpuwatch.follow.client import RunClient\n"
                    "async def main():\n"
                    "    async with RunClient(sys.argv[1]) as c:\n"
                    "        await c.subscribe(0)\n"
                    "        print('subscribed', flush=True)\n"
                    "        while True:\n"
                    "            await c.next_batch()\n"
                    "asyncio.run(main())\n"
                ),
                str(info.socket_path),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert viewer.stdout is not None
        assert viewer.stdout.readline().strip() == "subscribed"
        run_async(collect(info.socket_path, has_step(10)))
        viewer.kill()
        viewer.wait()
        events = run_async(collect(info.socket_path, has_step(40)))
        steps = steps_of(events)
        assert steps == list(range(1, len(steps) + 1)), "steps must be contiguous from 1"
        recorded = steps_of(read_events(info.run_dir))
        assert recorded[: len(steps)] == steps
        # seq is each event's line in events.jsonl: replay and file agree.
        assert [e["seq"] for e in events] == list(range(len(events)))

    def test_reconnect_from_last_seq_gets_no_duplicates_and_no_gaps(
        self, shared_run: folders.RunInfo
    ) -> None:
        info = shared_run
        assert info.socket_path is not None
        first = run_async(collect(info.socket_path, has_step(5)))
        resumed = run_async(collect(info.socket_path, has_step(25), from_seq=first[-1]["seq"] + 1))
        seqs = [e["seq"] for e in first + resumed]
        assert seqs == list(range(len(seqs)))

    def test_garbage_partial_oversized_and_non_utf8_frames_close_only_that_connection(
        self, shared_run: folders.RunInfo
    ) -> None:
        from trainer_runtime.protocol import MAX_FRAME_BYTES

        info = shared_run
        assert info.socket_path is not None
        run_async(collect(info.socket_path, has_step(1)))
        path = str(info.socket_path)
        attacks = [
            b"this is not json\n",
            b"\xff\xfe\xfd\n",
            b'{"v": 1, "type": "subscribe", "from_seq": 0',  # partial, then hang up
            b"x" * (MAX_FRAME_BYTES + 10),
            b'{"v": 1, "type": "relaunch", "id": 1, "overrides": {"train.global_batch_size": 0}}\n',
        ]
        for attack in attacks:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                try:
                    sock.sendall(attack)
                    sock.shutdown(socket.SHUT_WR)
                    reply = b""
                    while chunk := sock.recv(65536):
                        reply += chunk
                except (BrokenPipeError, ConnectionResetError):
                    reply = b""
                if b"relaunch" in attack:
                    assert b'"type":"err"' in reply and b"global_batch_size" in reply
        status = status_of(info)
        assert status["bad_frames"] >= 3
        assert status["status"] == "running" and status["attempt"] == 1
        events = run_async(collect(info.socket_path, has_step(3)))
        assert steps_of(events)[0] == 1

    def test_fuzzed_bytes_never_take_the_supervisor_down(self, shared_run: folders.RunInfo) -> None:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st

        info = shared_run
        assert info.socket_path is not None
        path = str(info.socket_path)

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.binary(min_size=1, max_size=4096))
        def throw(junk: bytes) -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                try:
                    sock.sendall(junk + b"\n")
                    sock.shutdown(socket.SHUT_WR)
                    while sock.recv(65536):
                        pass
                except (BrokenPipeError, ConnectionResetError):
                    pass

        throw()
        assert status_of(info)["status"] in ("running", "starting")

    @pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second user")
    def test_a_second_user_cannot_connect(self, shared_run: folders.RunInfo) -> None:
        info = shared_run
        assert info.socket_path is not None
        mode = info.socket_path.parent.stat().st_mode & 0o777
        assert mode == 0o700 and info.socket_path.stat().st_mode & 0o777 == 0o600
        probe = (
            "import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect(sys.argv[1]); print('connected')\n"
            "except PermissionError:\n"
            "    print('refused')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(info.socket_path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert out.stdout.strip() == "refused"

    def test_relaunch_with_bad_settings_is_refused_and_training_goes_on(
        self, shared_run: folders.RunInfo
    ) -> None:
        info = shared_run
        assert info.socket_path is not None

        async def bad() -> str:
            assert info.socket_path is not None
            async with RunClient(info.socket_path) as client:
                try:
                    await client.command("relaunch", overrides={"train.accumulation_steps": 3})
                except CommandError as exc:
                    return str(exc)
                return "accepted"

        message = run_async(bad())
        assert "divisible" in message
        assert status_of(info)["attempt"] == 1


def test_trainer_crash_is_reported_with_its_log_and_relaunch_works(home: Path) -> None:
    info = start_run(
        "--set",
        "model.factory=tests.data.factories:model_that_fails_after",
        "--set",
        "model.kwargs={fail_after_steps: 20}",
    )
    assert info.socket_path is not None
    # A dashboard stays attached: it keeps the crashed run's supervisor up for `r`.
    dashboard = Attached(info.socket_path)
    events = run_async(
        collect(
            info.socket_path,
            lambda ev: any(e["type"] == "status" and e["status"] == "crashed" for e in ev),
        )
    )
    crashed = next(e for e in events if e["type"] == "status" and e["status"] == "crashed")
    assert crashed["exit_code"] == 1
    assert "fail_after_steps" in crashed["message"] or "deliberate" in crashed["message"]
    assert any("deliberate failure" in line for line in crashed["log_tail"])
    assert len(crashed["log_tail"]) <= 50
    assert max(steps_of(events)) >= 20
    listed = gpuwatch("ls", "--json", check=True).stdout.splitlines()
    row = json.loads(listed[0])
    assert row["status"] == "crashed" and row["exit_code"] == 1

    async def relaunch() -> dict[str, Any]:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            return await client.command(
                "relaunch", overrides={"model.factory": None, "model.kwargs": {}}
            )

    reply = run_async(relaunch())
    assert reply["attempt"] == 2
    after = run_async(
        collect(
            info.socket_path,
            lambda ev: any(e["type"] == "step" and e.get("attempt") == 2 for e in ev),
        )
    )
    assert any(
        e["type"] == "status" and e["status"] == "running" and e["attempt"] == 2 for e in after
    )
    dashboard.close()


def test_peer_credentials_are_read_and_other_uids_refused() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        pid, uid, _gid = peer_credentials(left)
    assert pid == os.getpid() and uid == os.getuid()
    assert peer_allowed(uid)
    assert not peer_allowed(uid + 1, own_uid=uid)
    assert not peer_allowed(0, own_uid=1000), "root is not the run's owner either"


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def test_twenty_relaunches_leave_no_processes_fds_or_memory_behind(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's side of twenty relaunches: its file descriptors, memory and child
    processes. What it holds per attempt (the socket pair, the log, the child's process
    group) is the same whatever the child runs, so the child is the stand-in trainer
    (tests/data/fake_trainer.py, the real wire, no TensorFlow): 22 TensorFlow start-ups
    would add nothing here but minutes. Real trainers relaunch in the tests around it."""
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")  # a hello and a step, then waits
    info = start_run()
    assert info.socket_path is not None and info.supervisor_pid is not None
    sup = info.supervisor_pid

    async def relaunch_and_wait(client: RunClient, attempt: int) -> None:
        reply = await client.command("relaunch", overrides={}, timeout_s=120)
        assert reply["attempt"] == attempt

    async def scenario() -> tuple[int, int, list[int]]:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            await client.subscribe(0)
            seen_running: set[int] = set()

            async def until_running(attempt: int) -> None:
                while attempt not in seen_running:
                    for e in await client.next_batch():
                        if e["type"] == "step":
                            seen_running.add(e["attempt"])

            await until_running(1)
            await relaunch_and_wait(client, 2)
            await until_running(2)
            base = (_fd_count(sup), _rss_kib(sup), _children(sup))
            for attempt in range(3, 23):
                await relaunch_and_wait(client, attempt)
            await until_running(22)
            return base[0], base[1], base[2]

    fds_before, rss_before, children_before = run_async(scenario(), timeout_s=900)
    wait_for(lambda: len(_children(sup)) == len(children_before), 30, "one trainer tree")
    assert _fd_count(sup) <= fds_before + 2
    assert _rss_kib(sup) <= rss_before + 20 * 1024, "supervisor memory grew over 20 MiB"


def stand_in_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs started from here on get tests/data/fake_trainer.py (hello, a step, then it
    waits to be stopped) instead of TensorFlow: for what is the supervisor's and its
    clients' alone, whatever the trainer does."""
    monkeypatch.setenv("GPUWATCH_TRAINER_MODULE", "tests.data.fake_trainer")
    monkeypatch.setenv("GPUWATCH_FAKE_TRAINER", "hang")


def test_two_runs_at_once_have_their_own_dirs_sockets_and_both_list(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_trainer(monkeypatch)
    first, second = start_run(), start_run()
    assert first.run_dir != second.run_dir and first.socket_path != second.socket_path
    listed = {json.loads(line)["run_id"] for line in gpuwatch("ls", "--json").stdout.splitlines()}
    assert {first.run_id, second.run_id} <= listed
    for info in (first, second):
        assert info.socket_path is not None
        events = run_async(collect(info.socket_path, has_step(1)))
        assert events[0]["type"] == "run" and events[0]["run_id"] == info.run_id
        # Each run's own trainer, through its own supervisor.
        (hello,) = [e for e in events if e["type"] == "hello"]
        launched = json.loads((info.run_dir / "launch-1.json").read_text())
        assert hello["pid"] == launched["pid"]


def test_stop_by_prefix_with_a_dashboard_attached_checkpoints_and_logs_no_error(
    home: Path,
) -> None:
    info = start_run()
    assert info.socket_path is not None

    async def attached_through_the_stop() -> tuple[Events, subprocess.CompletedProcess[str]]:
        assert info.socket_path is not None
        events: Events = []
        async with RunClient(info.socket_path) as client:
            await client.subscribe(0)
            while not has_step(3)(events):
                events.extend(await client.next_batch())
            stopping = asyncio.create_task(
                asyncio.to_thread(gpuwatch, "stop", info.run_id[:6]))
            # The supervisor stays while we are attached (the end is on our screen)...
            while not any(e["type"] == "status" and e["status"] == "stopped" for e in events):
                events.extend(await asyncio.wait_for(client.next_batch(), 60))
            stopped = await stopping
            await asyncio.sleep(1.5)  # past its linger: still up for us
            assert process_exists(info.supervisor_pid or 0)
        return events, stopped

    events, stopped = run_async(attached_through_the_stop())
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    assert events[-1]["type"] == "status" and events[-1]["status"] == "stopped"
    assert any(e["type"] == "checkpoint" for e in events), "SIGTERM must checkpoint"
    # ...and goes once we detached.
    wait_for(lambda: not process_exists(info.supervisor_pid or 0), 5, "the supervisor to exit")
    recorded = read_events(info.run_dir)
    assert recorded[-1]["type"] == "status" and recorded[-1]["status"] == "stopped"
    listed = json.loads(gpuwatch("ls", "--json").stdout.splitlines()[0])
    assert listed["status"] == "stopped"
    log = (info.run_dir / "supervisor.log").read_text()
    assert "Traceback" not in log and " ERROR " not in log, log


def test_a_client_that_never_reads_is_cut_off_and_memory_stays_bounded(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUWATCH_CLIENT_QUEUE_MAX_BYTES", str(64 * 1024))
    info = start_run()
    assert info.socket_path is not None and info.supervisor_pid is not None
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(str(info.socket_path))
    stalled.sendall(b'{"v":1,"type":"subscribe","id":1,"from_seq":0}\n')
    wait_for(
        lambda: status_of(info)["dropped_clients"] >= 1,
        180,
        "the supervisor to cut off the client that never reads",
    )
    stalled.close()
    events = run_async(collect(info.socket_path, has_step(1)))
    assert events[0]["type"] == "run"


def test_connection_lost_is_an_error_not_a_hang(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_trainer(monkeypatch)
    info = start_run()
    assert info.socket_path is not None and info.supervisor_pid is not None

    async def watch() -> str:
        assert info.socket_path is not None
        async with RunClient(info.socket_path) as client:
            await client.subscribe(0)
            os.kill(info.supervisor_pid or 0, signal.SIGKILL)
            try:
                while True:
                    await client.next_batch()
            except ConnectionLost as exc:
                return str(exc)

    assert "closed" in run_async(watch(), timeout_s=60)
