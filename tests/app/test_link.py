"""SocketLink against a fake supervisor socket: resubscribe from last seq + 1 after a drop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpuwatch.app.link import SocketLink
from trainer_runtime.protocol import decode, encode


def step_fields(seq: int) -> dict[str, Any]:
    return {"seq": seq, "t": 1.0 + seq, "attempt": 1, "step": seq + 1}


async def test_socket_link_resubscribes_after_drop_without_gap_or_duplicate(tmp_path):
    socket_path = tmp_path / "run.sock"
    subscribed: list[int] = []
    total = 25

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frame = decode(await reader.readline())
        assert frame["type"] == "subscribe"
        from_seq = frame["from_seq"]
        subscribed.append(from_seq)
        writer.write(encode("ack", id=frame["id"]))
        # First connection: 10 events then the supervisor "dies"; then the rest.
        stop = 10 if len(subscribed) == 1 else total
        for seq in range(from_seq, stop):
            writer.write(encode("step", **step_fields(seq)))
        await writer.drain()
        if len(subscribed) == 1:
            writer.close()
            return
        await reader.read()  # keep the connection open until the client closes

    server = await asyncio.start_unix_server(serve, path=str(socket_path))
    link = SocketLink(socket_path, backoff_s=(0.01, 0.05))
    seqs: list[int] = []
    states: list[str] = []

    async def consume() -> None:
        async for batch in link.events():
            for event in batch:
                if event["type"] == "link":
                    states.append(event["state"])
                else:
                    seqs.append(event["seq"])
            if len(seqs) >= total:
                return

    async with server:
        await asyncio.wait_for(consume(), 10)
        await link.close()
    assert subscribed == [0, 10]
    assert link.subscriptions == [0, 10]
    assert seqs == list(range(total))
    assert states == ["connected", "lost", "reconnecting", "connected"]


async def test_socket_link_reports_lost_while_no_supervisor(tmp_path):
    link = SocketLink(tmp_path / "nobody.sock", backoff_s=(0.01, 0.02))
    states: list[str] = []
    async for batch in link.events():
        states.extend(e["state"] for e in batch)
        if len(states) >= 4:
            break
    await link.close()
    assert states[:4] == ["lost", "reconnecting", "lost", "reconnecting"]
    assert link.subscriptions == []


def test_fixtures_are_protocol_frames():
    from pathlib import Path

    for path in sorted((Path(__file__).parent / "data").glob("*.jsonl")):
        for number, line in enumerate(path.read_bytes().splitlines()):
            frame = decode(line)
            assert frame["seq"] == number, path.name
            json.dumps(frame)
