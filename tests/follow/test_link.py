"""SocketLink against a fake supervisor socket: resubscribe after a drop, paced reads."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.follow.client import BULK_BYTES, RunClient
from gpuwatch.follow.link import SocketLink
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
    from tests.app.conftest import load_events
    from trainer_runtime.protocol import encode_frame, snapshot_frames

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


async def serve_steps(socket_path: Path, send: Any) -> asyncio.Server:
    """A fake supervisor: acks the subscribe, then `send(writer)` writes the events."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frame = decode(await reader.readline())
        writer.write(encode("ack", id=frame["id"]))
        await send(writer)
        await reader.read()  # open until the client closes

    return await asyncio.start_unix_server(serve, path=str(socket_path))


async def collect(link: SocketLink, total: int) -> list[tuple[float, list[int]]]:
    """Every batch of step events until `total` arrived: (when, seqs)."""
    batches: list[tuple[float, list[int]]] = []
    count = 0
    async for batch in link.events():
        seqs = [e["seq"] for e in batch if e["type"] != "link"]
        if seqs:
            batches.append((time.monotonic(), seqs))
            count += len(seqs)
        if count >= total:
            return batches
    return batches


@pytest.mark.alone
async def test_a_paced_link_reads_a_busy_run_once_per_interval(tmp_path):
    interval, total = 0.2, 60

    async def send(writer: asyncio.StreamWriter) -> None:
        for seq in range(total):  # one frame every 10 ms, as a busy trainer's steps
            writer.write(encode("step", **step_fields(seq)))
            await writer.drain()
            await asyncio.sleep(0.01)

    link = SocketLink(tmp_path / "run.sock", read_interval_s=interval)
    async with await serve_steps(tmp_path / "run.sock", send):
        batches = await asyncio.wait_for(collect(link, total), 20)
        await link.close()
    assert [seq for _, seqs in batches for seq in seqs] == list(range(total))
    # One read per interval at most: a handful of batches, not one per frame.
    span = batches[-1][0] - batches[0][0]
    assert len(batches) <= span / interval + 2, [len(seqs) for _, seqs in batches]
    assert len(batches) < total / 4


async def test_a_replay_is_read_without_pauses(tmp_path, monkeypatch):
    total = 20_000  # about 1.7 MB, many times BULK_BYTES: a bulk transfer
    lines = b"".join(encode("step", **step_fields(seq)) for seq in range(total))
    assert len(lines) > 8 * BULK_BYTES
    received: list[int] = []
    rested_at: list[int] = []  # events read so far, at each pause
    rest = RunClient._rest_until

    async def spy(self: RunClient, until: float) -> None:
        rested_at.append(len(received) + self._events.qsize())
        await rest(self, until)

    monkeypatch.setattr(RunClient, "_rest_until", spy)

    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(lines)
        await writer.drain()

    async def consume(link: SocketLink) -> None:
        async for batch in link.events():
            received.extend(e["seq"] for e in batch if e["type"] != "link")
            if len(received) >= total:
                return

    link = SocketLink(tmp_path / "run.sock", read_interval_s=0.5)
    async with await serve_steps(tmp_path / "run.sock", send):
        await asyncio.wait_for(consume(link), 20)
        await link.close()
    assert received == list(range(total))
    # At most one pause before the replay had all been read (its very first read may be
    # small); throttled, it would pause every interval for the kernel's 208 KiB.
    assert len([n for n in rested_at if n < total]) <= 1, rested_at


def test_fixtures_are_protocol_frames():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "app" / "data").glob("*.jsonl")):
        for number, line in enumerate(path.read_bytes().splitlines()):
            frame = decode(line)
            assert frame["seq"] == number, path.name
            json.dumps(frame)
