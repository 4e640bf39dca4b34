"""Clients under connection load: a full listen backlog, idle sockets, a busy box.

The client waits out a supervisor's full backlog (a refusal, EAGAIN) until its deadline,
then fails with one line; the hub listens with the system's largest backlog and closes
connections that send no valid command. The drill at the end runs a real supervisor
process (the stand-in trainer) with 1,000 idle connections and a burst of 200 from
another process, half the time beside CPU burners, and a real client must get through.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import ConnectionLost, RunClient
from gpuwatch.supervisor.hub import Client, listen_backlog, raise_open_files_limit
from tests.conftest import ROOT, TINY
from tests.data.fake_trainer import step as fake_step
from tests.supervisor.test_supervisor_parts import HubHarness, until
from trainer_runtime.protocol import InvalidCommand, decode, encode

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="Linux's AF_UNIX backlog answers (EAGAIN)"
    ),
    pytest.mark.slow,  # real processes: after the quick tests
]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="gw-load-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class FullListener:
    """A listening socket with a backlog of 1 that accepts nothing until told: full."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.sock.setblocking(False)
        self.waiting: list[socket.socket] = []  # connected, not yet accepted
        self.accepted: list[socket.socket] = []

    def fill(self) -> None:
        """Connect until the kernel refuses (EAGAIN): the backlog is full."""
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(self.path))
            except BlockingIOError as exc:
                sock.close()
                assert exc.errno == errno.EAGAIN
                return
            self.waiting.append(sock)

    def accept_all(self) -> None:
        """Accept everything queued (making room in the backlog)."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        for sock in [*self.waiting, *self.accepted, self.sock]:
            sock.close()


@pytest.fixture
def full_listener(short_dir: Path) -> Iterator[FullListener]:
    listener = FullListener(short_dir / "full.sock")
    listener.fill()
    yield listener
    listener.close()


# -- the client's connect -------------------------------------------------------------


async def test_asyncio_takes_a_refused_unix_connect_for_a_connection(
    full_listener: FullListener,
) -> None:
    """Why RunClient connects by itself (connect_unix): asyncio reports a connect that
    the full backlog refused (EAGAIN) as done, and the first read fails with EINVAL."""
    reader, writer = await asyncio.open_unix_connection(str(full_listener.path))
    try:
        with pytest.raises(OSError) as failure:
            await asyncio.wait_for(reader.read(1), 10)
        assert failure.value.errno == errno.EINVAL
    finally:
        writer.close()


async def test_connect_waits_for_room_in_a_full_backlog(
    full_listener: FullListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusals = 0
    real_connect = socket.socket.connect

    def counting_connect(sock: socket.socket, address: Any) -> None:
        nonlocal refusals
        try:
            real_connect(sock, address)
        except BlockingIOError:
            refusals += 1
            raise

    monkeypatch.setattr(socket.socket, "connect", counting_connect)
    client = RunClient(full_listener.path)
    connecting = asyncio.create_task(client.connect(timeout_s=30))
    try:
        await until(lambda: refusals >= 2, "the client to be refused twice")
        assert not connecting.done()
        full_listener.accept_all()  # room: the next try gets in
        await asyncio.wait_for(connecting, 10)
        await until(
            lambda: full_listener.accept_all() or len(full_listener.accepted) > 1,
            "the client's connection to be accepted",
        )
        server_end = full_listener.accepted[-1]
        server_end.setblocking(False)
        asking = asyncio.create_task(client.command("status", timeout_s=10))
        loop = asyncio.get_running_loop()
        frame = decode((await asyncio.wait_for(loop.sock_recv(server_end, 4096), 10)).strip())
        assert frame["type"] == "status"
        await loop.sock_sendall(server_end, encode("ack", id=frame["id"], status="running"))
        assert (await asyncio.wait_for(asking, 10))["status"] == "running"
    finally:
        connecting.cancel()
        await client.close()


async def test_connect_fails_with_one_line_when_the_backlog_stays_full(
    full_listener: FullListener,
) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionLost) as failure:
        await RunClient(full_listener.path).connect(timeout_s=0.3)
    elapsed_s = time.monotonic() - started
    message = str(failure.value)
    assert message == (
        f"cannot connect to {full_listener.path}: its listen backlog stayed full "
        "(the supervisor is not accepting) for 0.3 s"
    )
    assert 0.3 <= elapsed_s < 5


async def test_connect_fails_after_the_deadline_when_nobody_listens(short_dir: Path) -> None:
    path = short_dir / "stale.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # the file of a supervisor that died: bound, not listening
    try:
        with pytest.raises(ConnectionLost, match=r"connection refused \(nobody listens on it\) "
                           r"for 0\.3 s$"):
            await RunClient(path).connect(timeout_s=0.3)
    finally:
        stale.close()


async def test_connect_fails_at_once_when_there_is_no_socket(short_dir: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionLost, match="No such file or directory"):
        await RunClient(short_dir / "nobody.sock").connect(timeout_s=30)
    assert time.monotonic() - started < 5


# -- the hub's side -------------------------------------------------------------------


def test_the_open_files_soft_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        now = raise_open_files_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now
        assert now == hard or hard == resource.RLIM_INFINITY
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_listen_backlog_is_the_systems_largest() -> None:
    somaxconn = Path("/proc/sys/net/core/somaxconn")
    expected = int(somaxconn.read_text()) if somaxconn.exists() else socket.SOMAXCONN
    assert listen_backlog() == max(expected, socket.SOMAXCONN)


class CommandHub(HubHarness):
    """The hub harness, answering a frame that is no command with err (as Commands does)."""

    async def answer(self, frame: dict[str, Any], client: Client) -> bytes:
        try:
            return await super().answer(frame, client)
        except InvalidCommand as exc:
            return encode("err", id=exc.command_id, message=str(exc))


@pytest.fixture
async def quick_hub(short_dir: Path) -> AsyncIterator[HubHarness]:
    harness = CommandHub(short_dir)
    harness.hub.unidentified_idle_s = 0.3
    await harness.hub.open()
    yield harness
    harness.hub.close()
    harness.events.close()


async def test_hub_backlog_holds_a_burst_of_connects(quick_hub: HubHarness) -> None:
    path = str(quick_hub.hub.socket_path)
    burst = []
    try:
        # No await in between: the hub accepts none of them before the last connects.
        for _ in range(min(300, listen_backlog())):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            burst.append(sock)
            sock.connect(path)  # EAGAIN (BlockingIOError) if the backlog were asyncio's 100
        async with RunClient(path) as client:
            assert (await client.command("status", timeout_s=10))["type"] == "ack"
    finally:
        for sock in burst:
            sock.close()


async def test_hub_closes_a_connection_that_sends_no_valid_command(
    quick_hub: HubHarness,
) -> None:
    path = str(quick_hub.hub.socket_path)
    silent = await asyncio.open_unix_connection(path)
    wrong = await asyncio.open_unix_connection(path)
    wrong[1].write(b'{"v": 1, "type": "no such command", "id": 1}\n')
    try:
        assert await asyncio.wait_for(silent[0].read(), 10) == b""
        said = await asyncio.wait_for(wrong[0].read(), 10)  # the err, then the close
        assert [decode(line)["type"] for line in said.splitlines()] == ["err"]
        assert quick_hub.hub.unidentified.culled == 2
        await until(lambda: quick_hub.hub.clients == {}, "both to be dropped")
    finally:
        silent[1].close()
        wrong[1].close()


async def test_a_valid_command_keeps_a_connection_past_the_idle_limit(
    quick_hub: HubHarness,
) -> None:
    path = quick_hub.hub.socket_path
    async with RunClient(path) as asked, RunClient(path) as subscribed:
        await asked.command("status", timeout_s=10)
        await subscribed.subscribe(0)
        # Connected after both: once it is closed for idling, both have been idle longer.
        reader, writer = await asyncio.open_unix_connection(str(path))
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        assert quick_hub.hub.unidentified.culled == 1
        assert (await asked.command("status", timeout_s=10))["type"] == "ack"
        quick_hub.record(fake_step(1, 1))
        assert (await asyncio.wait_for(subscribed.next_batch(), 10))[0]["step"] == 1
        assert len(quick_hub.hub.clients) == 2


async def test_a_first_command_that_waited_out_a_busy_loop_still_counts(
    quick_hub: HubHarness,
) -> None:
    """The loop stalls past the idle deadline while the command waits in the socket: when
    it runs again the timer and the read are due together, and the command wins."""
    hub = quick_hub.hub
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(hub.socket_path))
    try:
        await until(lambda: len(hub.unidentified) == 1, "the hub to accept the connection")
        # On purpose: the loop stalls past the deadline, as a busy supervisor's would.
        time.sleep(hub.unidentified_idle_s + hub.unidentified.LATE_S + 0.3)  # noqa: ASYNC251
        sock.sendall(encode("status", id=7))
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        data = await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)
        assert data, "closed for idling, its command unread"
        reply = decode(data.strip())
        assert (reply["type"], reply["id"]) == ("ack", 7)
        assert hub.unidentified.culled == 0 and len(hub.clients) == 1
    finally:
        sock.close()


async def test_hub_closes_the_oldest_silent_connection_past_the_cap(short_dir: Path) -> None:
    harness = CommandHub(short_dir)
    harness.hub.unidentified_max = 16
    await harness.hub.open()
    hub = harness.hub
    path = str(hub.socket_path)
    silent = []
    try:
        for count in range(1, 18):
            silent.append(await asyncio.open_unix_connection(path))
            accepted = lambda c=count: len(hub.unidentified) + hub.unidentified.culled == c  # noqa: E731
            await until(accepted, f"connection {count} to be accepted")
        assert await asyncio.wait_for(silent[0][0].read(), 10) == b""  # the oldest
        assert len(harness.hub.unidentified) == 16
        async with RunClient(path) as client:  # the 17th newest; the second oldest goes
            assert (await client.command("status", timeout_s=10))["type"] == "ack"
        assert await asyncio.wait_for(silent[1][0].read(), 10) == b""
        assert harness.hub.unidentified.culled == 2
    finally:
        for _, writer in silent:
            writer.close()
        harness.hub.close()
        harness.events.close()


# -- the drill: a real supervisor process, 1,000 idle connections, a burst, a busy box --

DRILL_REPEATS = 20
DRILL_BUSY_REPEATS = 10  # the last ones, with a CPU burner per core
IDLE_CONNECTIONS = 1000
BURST_CONNECTIONS = 200
# The stand-in supervisor starts with this soft open-files limit, as on a box whose default
# is 1,024: 1,200 connections fit only because the hub raises it.
SUPERVISOR_NOFILE_SOFT = 1024
STEP_DEADLINE_S = 30.0
START_DEADLINE_S = 120.0  # a supervisor started on the busy half: up, with its socket


def drill_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "GPUWATCH_HOME": str(home),
        "GPUWATCH_FAKE_TRAINER": "hang",
        "GPUWATCH_USER_CWD": str(ROOT),
        "GPUWATCH_SPARE_TRAINER": "0",
        "GPUWATCH_STOP_GRACE_S": "10",
        "PYTHONPATH": str(ROOT),
    }


async def start_python(
    home: Path, *args: str, **kwargs: Any
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, env=drill_env(home), **kwargs
    )


async def end_process(proc: asyncio.subprocess.Process, timeout_s: float = 20.0) -> None:
    """Ask it to end (SIGTERM), then make sure (SIGKILL): no process outlives the test."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def read_line(proc: asyncio.subprocess.Process, what: str) -> str:
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), STEP_DEADLINE_S)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")
    return line.decode().strip()


async def client_steps(socket_path: Path, load: asyncio.subprocess.Process) -> None:
    """What a dashboard and `gpuwatch stop` do: status and subscribe while the burst
    connects, then (the burst in) stop. Any failure raises."""
    async with RunClient(socket_path) as client:
        status = await client.command("status", timeout_s=STEP_DEADLINE_S)
        assert status["status"] in ("starting", "running"), status
        ack = await client.subscribe(0)
        assert ack["next_seq"] >= 1, ack
        first = await asyncio.wait_for(client.next_batch(), STEP_DEADLINE_S)
        assert first[0]["seq"] == 0 and first[0]["type"] == "run", first[0]
        burst = (await read_line(load, "the burst")).split()
        assert burst[:2] == ["burst", str(BURST_CONNECTIONS)], burst
        stopped = await client.command("stop", timeout_s=STEP_DEADLINE_S)
        assert stopped["status"] == "stopped", stopped


async def drill_once(home: Path, short_dir: Path, repeat: int) -> str | None:
    """One repeat: its own supervisor, loaded; None if the client got through, else why."""
    run_dir = home / "runs" / f"drill{repeat}"
    run_dir.mkdir(parents=True)
    shutil.copy(TINY, run_dir / "config.yaml")
    socket_path = short_dir / f"d{repeat}.sock"
    log_path = short_dir / f"supervisor{repeat}.log"
    with log_path.open("wb") as log_file:
        supervisor = await start_python(
            home, "-m", "tests.support.supervisor_process", str(run_dir), str(socket_path),
            "--nofile-soft", str(SUPERVISOR_NOFILE_SOFT), stdout=log_file, stderr=log_file,
        )
    load = None
    try:
        # Not what the drill measures: a supervisor's start-up, which on the busy half (a
        # burner per core beside the suite) once took over 30 s.
        await until(lambda: (run_dir / "supervisor.json").exists()
                    or supervisor.returncode is not None, "the supervisor's socket",
                    START_DEADLINE_S)
        assert supervisor.returncode is None, (
            f"the supervisor exited ({supervisor.returncode}) before its socket: "
            + log_path.read_text(errors="replace")[-2000:])
        load = await start_python(
            home, "-m", "tests.support.connection_load", str(socket_path),
            "--idle", str(IDLE_CONNECTIONS), "--burst", str(BURST_CONNECTIONS),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert await read_line(load, "the idle connections") == f"idle {IDLE_CONNECTIONS}"
        assert load.stdin is not None
        load.stdin.write(b"burst\n")
        await load.stdin.drain()
        try:
            await client_steps(socket_path, load)
        except Exception as exc:
            return f"repeat {repeat}: {type(exc).__name__}: {exc}"
        load.stdin.close()
        await asyncio.wait_for(load.wait(), STEP_DEADLINE_S)
        await asyncio.wait_for(supervisor.wait(), STEP_DEADLINE_S)  # stop ends it
        assert supervisor.returncode == 0
        said = log_path.read_text(errors="replace")
        assert "out of system resource" not in said, said[-2000:]  # accept(): EMFILE
        return None
    finally:
        if load is not None:
            await end_process(load)
        await end_process(supervisor)


# The repeats in four tests of five, so no one test runs long: a test marked `alone`
# elsewhere waits for every running test to end (tests/support/alone.py).
DRILL_CHUNKS = [range(start, start + 5) for start in range(0, DRILL_REPEATS, 5)]


@pytest.mark.parametrize("repeats", DRILL_CHUNKS, ids=lambda r: f"{r.start}-{r.stop - 1}")
async def test_real_clients_get_through_1000_idle_connections_and_a_burst(
    home: Path, short_dir: Path, repeats: range
) -> None:
    """The first half of the repeats run as they come (beside the rest of the suite, under
    xdist); the second half beside a CPU burner per core of our own as well, so the box is
    busy whatever else runs. Not alone: nothing here is timed (a step's deadline is
    30 s), and alone, the burners took both cores from the suite for the whole half."""
    failures: list[str] = []
    burners: list[asyncio.subprocess.Process] = []
    busy = repeats.start >= DRILL_REPEATS - DRILL_BUSY_REPEATS
    try:
        for _ in range(os.cpu_count() or 1) if busy else ():
            burners.append(await asyncio.create_subprocess_exec(
                sys.executable, "-c", "while True: pass"
            ))
        for repeat in repeats:
            failure = await drill_once(home, short_dir, repeat)
            if failure is not None:
                failures.append(failure)
    finally:
        for burner in burners:
            with contextlib.suppress(ProcessLookupError):
                burner.kill()
            await burner.wait()
    assert not failures, f"{len(failures)} of {len(repeats)} failed:\n" + "\n".join(failures)
    assert len(burners) >= 1 if busy else not burners
