"""The run's event log: events.jsonl, append-only, one event a line, the record of truth.

An event's ``seq`` is its line number (0-based), so a supervisor restarted on the same
run directory counts the lines already there and carries on. Every event is written
(unbuffered) before anyone is sent it; replay reads the file back in bounded chunks.
events.idx makes a replay from the middle a seek, not a scan; it is written after the
line it points at, so a crash leaves it short, never ahead, and it is checked, extended
or rebuilt on open. A torn last line is cut off on open. state.json is the small summary
`gpuwatch ls` reads. The index's format and checks: docs/internals.md, "The supervisor's
parts".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import sys
import time
from array import array
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from trainer_runtime.protocol import Event, StatusChange, encode_frame, event_frame

log = logging.getLogger("gpuwatch.supervisor")

REPLAY_CHUNK_BYTES = 1 << 20
# The fields of a status event that state.json keeps (besides step and t).
STATE_FIELDS = ("status", "attempt", "exit_code", "signal", "message")
# One index record every this many lines: a replay reads at most this many lines to
# reach any seq.
INDEX_EVERY = 1024
_INDEX_MAGIC = b"GWIX"
_INDEX_HEADER = struct.Struct("<4sI")
_OFFSET = struct.Struct("<Q")


class EventLog:
    """events.jsonl (and its index, events.idx) of one run directory, open for appending."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "events.jsonl"
        self.index_path = run_dir / "events.idx"
        self.torn_bytes = cut_torn_line(self.path)
        if self.torn_bytes:
            log.warning("events.jsonl ended in a torn line: cut %d bytes", self.torn_bytes)
        self.offsets, self.next_seq, self.size = load_index(self.path, self.index_path)
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held open for the run
        self._index = open(self.index_path, "ab", buffering=0)  # noqa: SIM115 - and this

    def append(self, event: Event, t: float | None = None) -> tuple[int, float, bytes]:
        """Write one event (t: when it happened, default now); return its seq, t and bytes.

        A frame that cannot be encoded (over the size limit) raises ProtocolError
        before anything is written: no seq is spent on it.
        """
        seq, t = self.next_seq, time.time() if t is None else t
        data = encode_frame(event_frame(event, t=t, seq=seq))
        _write_all(self._file, data)
        if seq % INDEX_EVERY == 0 and seq // INDEX_EVERY == len(self.offsets):
            # After the line: an index never points past what is written.
            _write_all(self._index, _OFFSET.pack(self.size))
            self.offsets.append(self.size)
        self.size += len(data)
        self.next_seq += 1
        return seq, t, data

    def write_state(self, status: StatusChange, t: float, step: int) -> None:
        """Replace state.json with the summary of this status event (atomically)."""
        state: dict[str, Any] = {k: getattr(status, k) for k in STATE_FIELDS}
        state["step"] = step
        state["t"] = t
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.run_dir / "state.json")

    def locate(self, seq: int) -> tuple[int, int]:
        """(byte offset, seq) of the indexed line at or before seq: where a read starts.

        The line there is checked to be that seq; if it is not (an index that does not
        fit the file), the answer is the file's start.
        """
        slot = min(seq // INDEX_EVERY, len(self.offsets) - 1)
        if slot <= 0:
            return 0, 0
        offset, at = self.offsets[slot], slot * INDEX_EVERY
        if seq_at(self.path, offset) != at:
            log.warning("events.idx does not fit events.jsonl at seq %d: reading from the start",
                        at)
            return 0, 0
        return offset, at

    async def replay(self, from_seq: int, until_seq: int) -> AsyncGenerator[bytes, None]:
        """The recorded lines with from_seq <= seq < until_seq, in chunks of about 1 MiB.

        Reads happen in a thread: a long history must not stall the event loop. The
        first read seeks through the index. Stops early if the file holds fewer lines
        than until_seq.
        """
        if from_seq >= until_seq:
            return
        offset, seq = await asyncio.to_thread(self.locate, from_seq)
        while seq < until_seq:
            data, offset, seq = await asyncio.to_thread(
                read_event_lines, self.path, offset, seq, from_seq, until_seq
            )
            if data:
                yield data
            elif seq < until_seq:
                return  # the file is shorter than the record says: nothing more to send

    def lines(self, from_seq: int, until_seq: int) -> Iterator[bytes]:
        """As replay, one line at a time and in this thread (the supervisor's start-up)."""
        if from_seq >= until_seq:
            return
        offset, seq = self.locate(from_seq)
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            for line in fh:
                if seq >= until_seq:
                    return
                if seq >= from_seq:
                    yield line
                seq += 1

    def close(self) -> None:
        self._file.close()
        self._index.close()


def _write_all(fh: BinaryIO, data: bytes) -> None:
    """An unbuffered write() may take only part of its bytes: write until all are."""
    view = memoryview(data)
    while view:
        written = fh.write(view)
        view = view[written or 0 :]


def cut_torn_line(path: Path) -> int:
    """Cut an unfinished last line off events.jsonl; return how many bytes were cut."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "r+b") as fh:
        end = size
        while end > 0:  # back to the last newline, in blocks
            start = max(0, end - (1 << 16))
            fh.seek(start)
            block = fh.read(end - start)
            if start + len(block) == size and block.endswith(b"\n"):
                return 0
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        else:
            keep = 0
        fh.truncate(keep)
        os.fsync(fh.fileno())
    return size - keep


def seq_at(path: Path, offset: int) -> int | None:
    """The seq of the line that starts at this byte offset, or None if there is none."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            line = fh.readline()
        seq = json.loads(line).get("seq")
    except (OSError, ValueError, AttributeError):
        return None
    return seq if type(seq) is int else None


def load_index(path: Path, index_path: Path) -> tuple[array[int], int, int]:
    """(offsets, lines, bytes) of events.jsonl, events.idx checked and brought up to date.

    The index's records are kept up to the last one that fits the file (its line
    carries its seq), the rest of the file is counted from there, and events.idx is
    rewritten only if it changed.
    """
    try:
        raw = index_path.read_bytes()
    except FileNotFoundError:
        raw = b""
    header = _INDEX_HEADER.pack(_INDEX_MAGIC, INDEX_EVERY)
    offsets = _index_offsets(raw)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    if offsets and offsets[0] != 0:
        del offsets[:]  # not an index of this file at all
    # Records that do not fit are dropped from the end (the last ones are the last written).
    while offsets and (
        offsets[-1] >= size or seq_at(path, offsets[-1]) != (len(offsets) - 1) * INDEX_EVERY
    ):
        offsets.pop()
    seq = (len(offsets) - 1) * INDEX_EVERY if offsets else 0
    offset = offsets[-1] if offsets else 0
    added = array("Q")
    if size:
        with open(path, "rb") as fh:
            fh.seek(offset)
            for line in fh:
                if seq % INDEX_EVERY == 0 and seq // INDEX_EVERY == len(offsets) + len(added):
                    added.append(offset)
                seq += 1
                offset += len(line)
    if len(offsets) * 8 + len(header) != len(raw) or added:
        offsets.extend(added)
        _rewrite_index(index_path, header, offsets)
    return offsets, seq, offset


def read_index(index_path: Path) -> array[int]:
    """The offsets events.idx holds, as written (unchecked; nothing is rewritten): for a
    reader of a run directory that no supervisor owns, which checks each one it uses
    against events.jsonl (``seq_at``)."""
    try:
        return _index_offsets(index_path.read_bytes())
    except OSError:
        return array("Q")


def _index_offsets(raw: bytes) -> array[int]:
    offsets: array[int] = array("Q")
    header = _INDEX_HEADER.pack(_INDEX_MAGIC, INDEX_EVERY)
    if raw.startswith(header):
        body = raw[len(header):]
        offsets.frombytes(body[: len(body) // 8 * 8])
        if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
            offsets.byteswap()
    return offsets


def _rewrite_index(index_path: Path, header: bytes, offsets: array[int]) -> None:
    data = array("Q", offsets)
    if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
        data.byteswap()
    tmp = index_path.with_name(index_path.name + ".tmp")
    tmp.write_bytes(header + data.tobytes())
    tmp.replace(index_path)


def read_event_lines(
    path: Path, offset: int, seq: int, from_seq: int, until_seq: int
) -> tuple[bytes, int, int]:
    """Up to REPLAY_CHUNK_BYTES of lines from byte offset/seq, those in range; new offset, seq."""
    out = bytearray()
    with open(path, "rb") as fh:
        fh.seek(offset)
        while seq < until_seq and len(out) < REPLAY_CHUNK_BYTES:
            line = fh.readline()
            if not line:
                break
            if seq >= from_seq:
                out += line
            seq += 1
            offset += len(line)
    return bytes(out), offset, seq
