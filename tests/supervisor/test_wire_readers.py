"""Both ends of every socket treat the wire alike: a bad frame is counted or reported, its
connection closed, nothing crashes; and no client ever sends a command the supervisor
would refuse.

No TensorFlow here: the supervisor's readers run against socketpairs and a socket of
its own, with no trainer started; the client runs against a fake supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import CommandError, ConnectionLost, RunClient
from gpuwatch.follow.link import ReplayLink, SocketLink
from gpuwatch.supervisor import Supervisor
from tests.conftest import TINY
from tests.data.fake_trainer import step
from trainer_runtime.protocol import (
    FrameBuffer,
    InvalidCommand,
    Relaunch,
    decode,
    encode,
    encode_event,
    parse_command,
)

DEEP = b"[" * 100_000 + b"\n"


def _log_problems(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records that would put a traceback or a RecursionError in supervisor.log."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.exc_info or "RecursionError" in record.getMessage()
        or "Traceback" in record.getMessage()
    ]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="gw-wire-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def supervisor(short_dir: Path) -> Iterator[Supervisor]:
    run_dir = short_dir / "runs" / "r1"
    run_dir.mkdir(parents=True)
    shutil.copy(TINY, run_dir / "config.yaml")
    sup = Supervisor(run_dir, short_dir / "sock" / "r1.sock")
    yield sup
    sup.events.close()


# -- the supervisor's trainer side ------------------------------------------------------


async def test_trainer_reader_counts_a_deep_frame_and_closes_the_trainer_socket(
    supervisor: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    ours, trainer_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with trainer_end:
        # Whole step events (the reader checks every field), with a deep frame between.
        trainer_end.sendall(encode_event(step(1, 1)) + DEEP + encode_event(step(1, 2)))
        await asyncio.wait_for(supervisor.agents[0].read_frames(ours, 1), 10)
        trainer_end.settimeout(10)
        # The trainer sees its telemetry socket closed (it then checkpoints and exits).
        assert await asyncio.to_thread(trainer_end.recv, 16) == b""
    assert supervisor.bad_frames == 1
    assert supervisor.last_step <= 1, "no frame after the bad one is taken"
    assert _log_problems(caplog) == []


# -- the supervisor's dashboard side -------------------------------------------------------


@pytest.fixture
async def serving(supervisor: Supervisor) -> AsyncIterator[Supervisor]:
    supervisor.loop = asyncio.get_running_loop()
    await supervisor.hub.open()
    yield supervisor
    assert supervisor.hub.server is not None
    supervisor.hub.server.close()
    for client in list(supervisor.hub.clients.values()):
        supervisor.hub.drop(client, "test over")
    await supervisor.hub.server.wait_closed()


async def _exchange(path: Path, data: bytes) -> bytes:
    """Send data, half-close, and read until the supervisor closes: everything it sent."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        writer.close()


async def test_client_reader_counts_a_deep_frame_and_closes_only_that_connection(
    serving: Supervisor, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    reply = await _exchange(serving.socket_path, DEEP)
    assert reply == b"", "no answer: the connection is closed"
    assert serving.bad_frames == 1
    assert _log_problems(caplog) == []
    # The next connection is served as usual.
    reply = await _exchange(serving.socket_path, encode("status", id=3))
    answer = decode(reply.splitlines()[0])
    assert answer["type"] == "ack" and answer["id"] == 3 and answer["bad_frames"] == 1


@pytest.mark.parametrize(
    ("fields", "echoed_id", "message"),
    [
        ({"id": 9, "fresh": "no"}, 9, 'relaunch: fresh must be true or false (got "no")'),
        ({"id": 9, "fresh": 1}, 9, "relaunch: fresh must be true or false (got 1)"),
        ({"id": True, "fresh": True}, None, "relaunch: id must be"),
        ({"id": "a", "overrides": {"data..prefetch": True}}, "a", "not a dotted key"),
        ({"id": 4, "overrides": None}, 4, "relaunch: overrides must be"),
        ({"id": 5, "fresh": True, "force": True}, 5, 'relaunch: unknown field "force"'),
    ],
)
async def test_a_malformed_relaunch_is_answered_err_and_starts_nothing(
    serving: Supervisor, fields: dict[str, Any], echoed_id: object, message: str
) -> None:
    reply = await _exchange(serving.socket_path, encode("relaunch", **fields))
    answer = decode(reply.splitlines()[0])
    assert answer["type"] == "err" and answer["id"] == echoed_id
    assert message in answer["message"]
    assert serving.attempt == 0 and serving.agents[0].process is None
    assert not (serving.run_dir / "attempt-1.yaml").exists()
    assert serving.bad_frames == 0, "a refused command is answered, not a bad frame"


# -- the client ---------------------------------------------------------------------------


class FakeSupervisor:
    """Parses every frame it gets as the supervisor does, and acks the valid ones."""

    def __init__(self, path: Path, first_words: bytes = b"") -> None:
        self.path = path
        self.first_words = first_words
        self.received: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.server: asyncio.AbstractServer | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.first_words:
            writer.write(self.first_words)
        frames = FrameBuffer()
        while chunk := await reader.read(65536):
            for frame in frames.feed(chunk):
                self.received.append(frame)
                try:
                    command = parse_command(frame)
                except InvalidCommand as exc:
                    self.refused.append(str(exc))
                    writer.write(encode("err", id=exc.command_id, message=str(exc)))
                    continue
                writer.write(encode("ack", id=command.id))
            await writer.drain()
        writer.close()

    async def __aenter__(self) -> FakeSupervisor:
        self.server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def test_every_command_the_clients_send_passes_parse_command(short_dir: Path) -> None:
    async with FakeSupervisor(short_dir / "fake.sock") as fake:
        async with RunClient(fake.path) as client:
            await client.subscribe(0)
            await client.subscribe(12)
            await client.command("status")
            # what the dashboard sends (app.py send_relaunch / send_stop)
            await client.command("relaunch", overrides={"data.prefetch": True}, fresh=False)
            await client.command("stop", timeout_s=120.0)  # what cli and headless send
            await client.send(Relaunch(overrides={"train.global_batch_size": 128}))
        link = SocketLink(fake.path)
        async for _batch in link.events():  # connects and subscribes, as the dashboard does
            await link.command("relaunch", overrides={"train.accumulation_steps": 2}, fresh=False)
            break
        await link.close()
    assert fake.refused == []
    assert [f["type"] for f in fake.received] == [
        "subscribe", "subscribe", "status", "relaunch", "stop", "relaunch", "subscribe",
        "relaunch",
    ]
    assert fake.received[3]["fresh"] is False


async def test_a_command_the_supervisor_would_refuse_is_never_sent(short_dir: Path) -> None:
    refused_fresh = re.escape('relaunch: fresh must be true or false (got "no")')
    async with FakeSupervisor(short_dir / "fake.sock") as fake, RunClient(fake.path) as client:
        with pytest.raises(CommandError, match=refused_fresh):
            await client.command("relaunch", fresh="no")
        with pytest.raises(CommandError, match="relaunch: fresh"):
            await client.send(Relaunch(fresh="no"))  # type: ignore[arg-type]
        with pytest.raises(CommandError, match="subscribe: from_seq"):
            await client.subscribe(-1)
        with pytest.raises(CommandError, match='unknown field "force"'):
            await client.command("stop", force=True)
        with pytest.raises(CommandError, match="type must be one of"):
            await client.command("reconfigure")
        await client.command("status")  # the connection is fine
    assert [f["type"] for f in fake.received] == ["status"]
    link = ReplayLink()
    with pytest.raises(CommandError, match="relaunch: fresh"):
        await link.command("relaunch", overrides={}, fresh="no")
    assert link.commands == []


async def test_client_reports_a_deep_frame_as_connection_lost(short_dir: Path) -> None:
    fake = FakeSupervisor(short_dir / "fake.sock", first_words=DEEP)
    async with fake, RunClient(fake.path) as client:
        with pytest.raises(ConnectionLost, match=r"bad frame from the supervisor: .*nests"):
            await asyncio.wait_for(client.next_batch(), 10)
        with pytest.raises(ConnectionLost, match="bad frame"):
            await client.command("status", timeout_s=60)  # at once, not after 60 s


async def test_a_reply_with_id_true_is_not_the_reply_to_command_1(short_dir: Path) -> None:
    # The supervisor echoes only valid ids, but the client does not rely on it.
    fake = FakeSupervisor(
        short_dir / "fake.sock", first_words=encode("err", id=True, message="not yours")
    )
    async with fake, RunClient(fake.path) as client:
        reply = await client.command("status")
        assert reply["type"] == "ack" and reply["id"] == 1
        stray = await asyncio.wait_for(client.next_batch(), 10)
        assert stray[0]["type"] == "err" and stray[0]["id"] is True


async def test_a_client_that_falls_behind_stops_reading_and_loses_nothing(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwatch.follow import client as client_module

    monkeypatch.setattr(client_module, "INBOX_MAX_EVENTS", 100)
    total = 20_000  # about 5 MB: far past the socket's buffers
    padding = "x" * 200
    server_done = asyncio.Event()

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for seq in range(total):
            writer.write(encode("step", seq=seq, pad=padding))
            if seq % 100 == 0:
                await writer.drain()  # blocks while the client does not read
        await writer.drain()
        server_done.set()
        await reader.read()

    server = await asyncio.start_unix_server(flood, path=str(short_dir / "flood.sock"))
    async with server, RunClient(short_dir / "flood.sock") as client:
        inbox = client._events

        async def full() -> None:
            while inbox.waits == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)

        await asyncio.wait_for(full(), 10)
        assert len(inbox) == 100, "the reader waits at the bound"
        assert not server_done.is_set(), "and the supervisor's writes wait on it"
        seqs: list[int] = []
        while len(seqs) < total:
            seqs += [frame["seq"] for frame in await asyncio.wait_for(client.next_batch(1000), 10)]
            assert len(inbox) <= 100
        assert seqs == list(range(total)), "nothing dropped, nothing out of order"
        await asyncio.wait_for(server_done.wait(), 10)
