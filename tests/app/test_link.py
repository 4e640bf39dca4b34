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


async def test_socket_link_starts_from_a_snapshot_and_resubscribes_without_one(tmp_path):
    from gpuwatch.runstate import RunState
    from trainer_runtime.protocol import encode_frame, snapshot_frames

    from .conftest import load_events

    events = load_events("cpu_one_attempt.jsonl")
    cut, drop = 30, 45  # the snapshot holds events 0..29; the link drops after 44
    before = RunState()
    before.apply_many(events[:cut])
    socket_path = tmp_path / "run.sock"
    subscribes: list[dict] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frame = decode(await reader.readline())
        subscribes.append(frame)
        first = len(subscribes) == 1
        snapshot_seq = cut - 1 if frame.get("snapshot") == RunState.snapshot_format() else None
        writer.write(encode("ack", id=frame["id"], snapshot_seq=snapshot_seq))
        start = frame["from_seq"]
        if snapshot_seq is not None:
            for part in snapshot_frames(snapshot_seq, frame["snapshot"], before.to_snapshot()):
                writer.write(part)
            start = snapshot_seq + 1
        for event in events[start : drop if first else len(events)]:
            writer.write(encode_frame(event))
        await writer.drain()
        if first:
            writer.close()
            return
        await reader.read()

    server = await asyncio.start_unix_server(serve, path=str(socket_path))
    link = SocketLink(socket_path, backoff_s=(0.01, 0.05))
    state = RunState()
    kinds: list[str] = []

    async def consume() -> None:
        async for batch in link.events():
            kinds.extend(e["type"] for e in batch)
            state.apply_many(batch)
            if state.last_seq == len(events) - 1:
                return

    async with server:
        await asyncio.wait_for(consume(), 10)
        await link.close()
    assert [s.get("snapshot") for s in subscribes] == [RunState.snapshot_format(), None]
    assert [s["from_seq"] for s in subscribes] == [0, drop]
    assert link.snapshot_seq == cut - 1
    assert kinds[:2] == ["link", "snapshot"], "the joined snapshot comes first"
    assert kinds.count("snapshot") == 1
    whole = RunState()
    whole.apply_many(events)
    for name in ("attempts", "window", "last_step", "status", "sample", "last_seq", "hello"):
        assert getattr(state, name) == getattr(whole, name), name


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
