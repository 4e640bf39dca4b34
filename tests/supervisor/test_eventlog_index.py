"""events.idx: the seq -> byte offset index of events.jsonl (build, extend, repair, seek).

Ground truth is the file itself: every line's start offset and seq, read by
splitting events.jsonl, never the index's own answers.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gpuwatch.supervisor import eventlog
from gpuwatch.supervisor.eventlog import EventLog
from tests.data.fake_trainer import step as fake_step
from trainer_runtime.protocol import decode

EVERY = 4  # a record every 4 lines: many records from few events


@pytest.fixture(autouse=True)
def small_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventlog, "INDEX_EVERY", EVERY)


def record(log: EventLog, count: int) -> None:
    for _ in range(count):
        log.append(fake_step(1, log.next_seq + 1), 1000.0 + log.next_seq)


def line_starts(path: Path) -> list[int]:
    """The byte offset of every whole line of the file."""
    starts, offset = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        starts.append(offset)
        offset += len(line)
    return starts


def index_on_disk(path: Path) -> tuple[bytes, list[int]]:
    raw = path.read_bytes()
    header, body = raw[:8], raw[8:]
    return header, [value for (value,) in struct.iter_unpack("<Q", body)]


def expected_index(events: Path) -> list[int]:
    return line_starts(events)[::EVERY]


def seqs_of(lines: list[bytes] | bytes) -> list[int]:
    if isinstance(lines, bytes):
        lines = lines.splitlines()
    return [decode(line)["seq"] for line in lines]


async def replayed(log: EventLog, from_seq: int, until_seq: int) -> list[int]:
    out: list[int] = []
    async for chunk in log.replay(from_seq, until_seq):
        out += seqs_of(chunk)
    return out


def test_appending_writes_a_record_every_n_lines(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    try:
        record(log, 23)
    finally:
        log.close()
    header, offsets = index_on_disk(tmp_path / "events.idx")
    assert header == b"GWIX" + struct.pack("<I", EVERY)
    assert offsets == expected_index(tmp_path / "events.jsonl")
    assert len(offsets) == 6  # lines 0, 4, 8, 12, 16, 20


def test_a_missing_or_short_index_is_rebuilt_or_extended_on_open(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    record(log, 30)
    log.close()
    index = tmp_path / "events.idx"
    full = index.read_bytes()
    index.write_bytes(full[: 8 + 3 * 8 + 5])  # three records and a torn fourth
    again = EventLog(tmp_path)
    again.close()
    assert index.read_bytes() == full
    index.unlink()
    again = EventLog(tmp_path)
    assert again.next_seq == 30
    again.close()
    assert index.read_bytes() == full


@pytest.mark.parametrize(
    "damage",
    [
        "offsets of another file",
        "another interval",
        "past the end",
        "not a line start",
    ],
)
def test_an_index_that_does_not_fit_the_file_is_repaired(tmp_path: Path, damage: str) -> None:
    log = EventLog(tmp_path)
    record(log, 30)
    log.close()
    index = tmp_path / "events.idx"
    header, offsets = index_on_disk(index)
    if damage == "offsets of another file":
        offsets = [o * 2 for o in offsets]
    elif damage == "another interval":
        header = b"GWIX" + struct.pack("<I", EVERY * 2)
    elif damage == "past the end":
        offsets.append(10**9)
    else:
        offsets[-1] += 3
    index.write_bytes(header + b"".join(struct.pack("<Q", o) for o in offsets))
    again = EventLog(tmp_path)
    try:
        assert again.next_seq == 30
        assert list(again.offsets) == expected_index(tmp_path / "events.jsonl")
    finally:
        again.close()
    assert index_on_disk(index)[1] == expected_index(tmp_path / "events.jsonl")


def test_a_torn_last_line_is_cut_and_the_next_event_starts_its_own_line(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    record(log, 9)
    log.close()
    events = tmp_path / "events.jsonl"
    whole = events.read_bytes()
    with open(events, "ab") as fh:  # the supervisor died in the middle of a write
        fh.write(b'{"v":1,"type":"step","seq":9,"t":10')
    again = EventLog(tmp_path)
    try:
        assert again.torn_bytes == len(b'{"v":1,"type":"step","seq":9,"t":10')
        assert again.next_seq == 9
        assert events.read_bytes() == whole
        record(again, 3)
    finally:
        again.close()
    lines = events.read_bytes().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(12))
    assert index_on_disk(tmp_path / "events.idx")[1] == expected_index(events)


def test_a_file_of_one_torn_line_is_emptied(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_bytes(b'{"v":1,"type":"ru')
    log = EventLog(tmp_path)
    try:
        assert (log.next_seq, log.torn_bytes) == (0, 17)
        record(log, 2)
    finally:
        log.close()
    assert seqs_of((tmp_path / "events.jsonl").read_bytes()) == [0, 1]


def test_a_restarted_log_goes_on_with_its_index(tmp_path: Path) -> None:
    for _ in range(3):  # three supervisors, one after another, on one run directory
        log = EventLog(tmp_path)
        try:
            record(log, 7)
        finally:
            log.close()
    events = tmp_path / "events.jsonl"
    assert seqs_of(events.read_bytes()) == list(range(21))
    assert index_on_disk(tmp_path / "events.idx")[1] == expected_index(events)


async def test_replay_from_anywhere_equals_a_scan_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventlog, "REPLAY_CHUNK_BYTES", 700)  # a few lines a chunk
    log = EventLog(tmp_path)
    try:
        record(log, 50)
        lines = (tmp_path / "events.jsonl").read_bytes().splitlines(keepends=True)
        for from_seq in range(0, 51):
            for until_seq in (from_seq, from_seq + 1, from_seq + 5, 50, 80):
                want = seqs_of(b"".join(lines[from_seq:until_seq]))
                assert await replayed(log, from_seq, until_seq) == want, (from_seq, until_seq)
                assert seqs_of(list(log.lines(from_seq, until_seq))) == want
    finally:
        log.close()


async def test_replay_seeks_and_a_wrong_index_falls_back_to_a_scan(tmp_path: Path) -> None:
    log = EventLog(tmp_path)
    try:
        record(log, 40)
        assert log.locate(37) == (line_starts(tmp_path / "events.jsonl")[36], 36)
        assert log.locate(3) == (0, 0)
        log.offsets[5] += 1  # an index that no longer fits (say, a file changed under it)
        assert log.locate(22) == (0, 0)
        assert await replayed(log, 22, 30) == list(range(22, 30))
    finally:
        log.close()
