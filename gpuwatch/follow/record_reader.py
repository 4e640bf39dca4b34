"""An ended run's record read back without its supervisor: snapshot.json, then events.jsonl.

Once a run has ended its directory is the whole record (nothing of it runs). A dashboard
that attaches to it (``RecordLink``, gpuwatch/follow/link.py) reads it here in the shape a
supervisor would have sent it: the saved fold (snapshot.json) as the one joined
``snapshot`` frame that RunClient makes of a supervisor's parts, when its format is the
reader's and events.jsonl holds every event it folds; then the events after it, read
forward in chunks of at most a given count (memory does not grow with the run; events.idx
seeks to the first one, and nothing in the directory is written). Lines that are not a
protocol frame (a record this version cannot read, a line over the frame limit) are skipped
and counted; a last line without its newline (torn when a supervisor died mid-write, or
still being written) is left where it is, as a supervisor restarted on the directory cuts
it off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainer_runtime.protocol import (
    MAX_FRAME_BYTES,
    ProtocolError,
    SnapshotParts,
    decode,
    snapshot_frames,
)

EVENTS_FILE = "events.jsonl"
INDEX_FILE = "events.idx"
SNAPSHOT_FILE = "snapshot.json"  # gpuwatch/supervisor/snapshots.py writes it
COUNT_BLOCK_BYTES = 1 << 20


def line_offset(run_dir: Path, seq: int) -> int | None:
    """The byte offset where line `seq` (0-based) of events.jsonl starts, every line before
    it whole; None when the file holds fewer whole lines than that.

    Seeks through events.idx where its record for that stretch fits the file (the line there
    carries the seq it should), else counts newlines from the start.
    """
    # The index's format is the event log's (imported here: the supervisor package is not
    # for a dashboard's start-up).
    from gpuwatch.supervisor.eventlog import INDEX_EVERY, read_index, seq_at

    path = run_dir / EVENTS_FILE
    at, offset = 0, 0
    offsets = read_index(run_dir / INDEX_FILE)
    slot = min(seq // INDEX_EVERY, len(offsets) - 1)
    if slot > 0 and seq_at(path, offsets[slot]) == slot * INDEX_EVERY:
        at, offset = slot * INDEX_EVERY, offsets[slot]
    if at == seq:
        return offset
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the counting loop
    except FileNotFoundError:
        return None
    with fh:
        fh.seek(offset)
        while at < seq:
            block = fh.read(COUNT_BLOCK_BYTES)
            if not block:
                return None
            newlines = block.count(b"\n")
            if at + newlines < seq:
                at += newlines
                offset += len(block)
                continue
            end = -1
            for _ in range(seq - at):
                end = block.index(b"\n", end + 1)
            return offset + end + 1
    return offset


@dataclass(frozen=True)
class SavedSnapshot:
    """snapshot.json, read back for a reader that has no supervisor."""

    frame: dict[str, Any]  # the joined ``snapshot`` frame, as RunClient joins the parts
    offset: int  # where the first event after it starts in events.jsonl
    attempt: int  # the run's attempt as of it


def saved_snapshot(run_dir: Path, schema: str | None) -> SavedSnapshot | None:
    """snapshot.json as a joined ``snapshot`` frame (the supervisor's parts, joined as
    RunClient joins them), with the byte offset in events.jsonl of the first event after it.

    None when there is none, it is unreadable, of another format than `schema` (None: the
    reader takes no snapshot), or ahead of events.jsonl: then every event is read instead.
    """
    if schema is None:
        return None
    try:
        text = (run_dir / SNAPSHOT_FILE).read_text(encoding="utf-8")
        wrapper = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(wrapper, dict) or wrapper.get("schema") != schema:
        return None
    data = wrapper.get("data")
    if not isinstance(data, dict):
        return None
    seq = data.get("last_seq")
    if type(seq) is not int or seq < 0:
        return None
    offset = line_offset(run_dir, seq + 1)
    if offset is None:  # it folds events the record does not hold
        return None
    parts = SnapshotParts()
    joined: dict[str, Any] | None = None
    try:
        for frame in snapshot_frames(seq, schema, text):
            joined = parts.feed(decode(frame))
    except ProtocolError:  # over the limit a dashboard joins: read the events instead
        return None
    if joined is None:
        return None
    attempt = data.get("attempt")
    return SavedSnapshot(joined, offset, attempt if type(attempt) is int else 0)


class RecordReader:
    """Reads events.jsonl forward from a byte offset, a chunk at a time, keeping its place."""

    def __init__(self, run_dir: Path, offset: int = 0) -> None:
        self.path = run_dir / EVENTS_FILE
        self.offset = offset
        self.bad_lines = 0  # lines skipped: not a frame this version reads, or over the limit

    def read(self, max_events: int) -> list[dict[str, Any]]:
        """Up to max_events frames after the last read ([] at the end of the record)."""
        frames: list[dict[str, Any]] = []
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return frames
        with fh:
            fh.seek(self.offset)
            while len(frames) < max_events:
                line = fh.readline(MAX_FRAME_BYTES + 1)
                if not line.endswith(b"\n"):
                    if len(line) <= MAX_FRAME_BYTES or not _skip_line(fh):
                        break  # the end, or a last line still without its newline
                    self.bad_lines += 1  # over the frame limit: never an event
                    self.offset = fh.tell()
                    continue
                self.offset += len(line)
                if not line.strip():
                    continue
                try:
                    frames.append(decode(line))
                except ProtocolError:
                    self.bad_lines += 1
        return frames


def _skip_line(fh: BinaryIO) -> bool:
    """Read past the rest of a line; False if the file ended first (no newline yet)."""
    while True:
        chunk = fh.readline(1 << 16)
        if not chunk:
            return False
        if chunk.endswith(b"\n"):
            return True
