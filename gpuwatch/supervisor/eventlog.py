"""The run's event log: events.jsonl, append-only, one event a line, the record of truth.

An event's ``seq`` is its line number (0-based), so a supervisor restarted on
the same run directory counts the lines already there and carries on. Every
event is written (unbuffered) before anyone is sent it; replay reads the file
back in bounded chunks. state.json is the small summary `gpuwatch ls` reads
instead of the tail of a long events.jsonl.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from trainer_runtime.protocol import Event, StatusChange, encode_frame, event_frame

REPLAY_CHUNK_BYTES = 1 << 20
# The fields of a status event that state.json keeps (besides step and t).
STATE_FIELDS = ("status", "attempt", "exit_code", "signal", "message")


class EventLog:
    """events.jsonl of one run directory, open for appending."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "events.jsonl"
        self.next_seq = count_lines(self.path)
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held open for the run

    def append(self, event: Event, t: float | None = None) -> tuple[int, float, bytes]:
        """Write one event (t: when it happened, default now); return its seq, t and bytes.

        A frame that cannot be encoded (over the size limit) raises ProtocolError
        before anything is written: no seq is spent on it.
        """
        seq, t = self.next_seq, time.time() if t is None else t
        data = encode_frame(event_frame(event, t=t, seq=seq))
        self._file.write(data)
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

    async def replay(self, from_seq: int, until_seq: int) -> AsyncGenerator[bytes, None]:
        """The recorded lines with from_seq <= seq < until_seq, in chunks of about 1 MiB.

        Reads happen in a thread: a long history must not stall the event loop.
        Stops early if the file holds fewer lines than until_seq.
        """
        offset, seq = 0, 0
        while seq < until_seq:
            data, offset, seq = await asyncio.to_thread(
                read_event_lines, self.path, offset, seq, from_seq, until_seq
            )
            if data:
                yield data
            elif seq < until_seq:
                return  # the file is shorter than the record says: nothing more to send

    def close(self) -> None:
        self._file.close()


def count_lines(path: Path) -> int:
    """How many events a run directory already holds (0 when it has none)."""
    try:
        with open(path, "rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


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
