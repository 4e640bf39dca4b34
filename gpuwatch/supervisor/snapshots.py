"""The supervisor's own fold of its run, and snapshot.json: what lets a dashboard attach fast.

Every event the supervisor records is folded here into a ``RunState`` (the dashboard's
pure fold, O(1) per event). Now and then (``SNAPSHOT_INTERVAL_S``, every status change,
exit) the state is written to snapshot.json (tmp + replace) and kept as the latest
``Snapshot``: a dashboard that asks for that format gets it first and then only the
events after it (a million events take half a minute to fold in Python; a snapshot,
milliseconds). A restarted supervisor starts from snapshot.json when it fits
(``restore``, in a thread). A fold that fails (a bug) must never cost an event: the
keeper turns off, removes snapshot.json and says so in the log; dashboards then replay
the events.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.runstate import RunState, codec
from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.timings import TIMINGS
from trainer_runtime.protocol import Envelope, Event, ProtocolError, decode, parse_event

log = logging.getLogger("gpuwatch.supervisor")

SNAPSHOT_INTERVAL_S = TIMINGS.snapshot_interval_s
SNAPSHOT_FILE = "snapshot.json"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A state's text (runstate/codec.py), the seq of the last event it folds, its format."""

    seq: int
    schema: str
    text: str


class StateKeeper:
    """Folds what the supervisor records; writes and serves its snapshots."""

    def __init__(
        self, run_dir: Path, events: EventLog, interval_s: float = SNAPSHOT_INTERVAL_S
    ) -> None:
        self.path = run_dir / SNAPSHOT_FILE
        self.events = events
        self.interval_s = interval_s
        self.state = RunState()
        self.latest: Snapshot | None = None
        self.broken: str | None = None  # why snapshots are off (a fold or a write failed)
        self.writes = 0
        self._written_at = time.monotonic()
        try:
            self.schema: str = codec.schema_id(RunState)
        except codec.SnapshotError as exc:
            self.schema = ""
            self._break(f"RunState cannot be snapshotted: {exc}")

    # -- folding ------------------------------------------------------------------------

    def fold(self, seq: int, event: Event, t: float | None) -> None:
        """Fold one recorded event; never raises (a failure turns snapshots off)."""
        if self.broken is not None:
            return
        try:
            self.state.apply_event(Envelope(event.TYPE, seq, t), event)
        except Exception as exc:  # a bug in the fold must not lose the event being recorded
            log.exception("folding event %d failed", seq)
            self._break(f"folding event {seq} failed: {exc}")

    def restore(self) -> int:
        """Start from snapshot.json and fold the events after it (all, without one).

        Run before anything is recorded (in a thread: it reads the log). Returns the
        number of events folded.
        """
        saved = self._read_saved()
        if saved is not None:
            self.state, self.latest = saved
        folded = 0
        for line in self.events.lines(self.state.last_seq + 1, self.events.next_seq):
            try:
                envelope, event = parse_event(decode(line))
            except ProtocolError:
                self.state.bad_events += 1
                continue
            if envelope.seq is not None:
                self.fold(envelope.seq, event, envelope.t)
                folded += 1
        log.info(
            "state restored: %s, %d events folded after it",
            f"snapshot at seq {saved[1].seq}" if saved else "no snapshot",
            folded,
        )
        return folded

    def _read_saved(self) -> tuple[RunState, Snapshot] | None:
        """snapshot.json, if it is of this format and not ahead of events.jsonl."""
        try:
            text = self.path.read_text(encoding="utf-8")
            state = RunState.from_snapshot(text)
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, codec.SnapshotError) as exc:
            log.info("snapshot.json not used (%s): folding every event", exc)
            return None
        if not 0 <= state.last_seq < self.events.next_seq:
            log.info(
                "snapshot.json is at seq %d but events.jsonl holds %d: not used",
                state.last_seq,
                self.events.next_seq,
            )
            return None
        return state, Snapshot(state.last_seq, self.schema, text)

    # -- writing ------------------------------------------------------------------------

    def tick(self) -> None:
        """Write a snapshot if the last is SNAPSHOT_INTERVAL_S old and events came since."""
        if time.monotonic() - self._written_at >= self.interval_s:
            self.write()

    def write(self) -> None:
        """Write snapshot.json now (atomically), if anything was folded since the last one."""
        if self.broken is not None or self.state.last_seq < 0:
            return
        self._written_at = time.monotonic()
        if self.latest is not None and self.latest.seq == self.state.last_seq:
            return
        try:
            text = self.state.to_snapshot()
            tmp = self.path.with_name(SNAPSHOT_FILE + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(self.path)
        except (OSError, codec.SnapshotError, TypeError, ValueError) as exc:
            self._break(f"writing {SNAPSHOT_FILE} failed: {exc}")
            return
        self.latest = Snapshot(self.state.last_seq, self.schema, text)
        self.writes += 1

    def snapshot_for(self, schema: str) -> Snapshot | None:
        """The latest snapshot, if a client that reads `schema` can take it."""
        latest = self.latest
        if self.broken is not None or latest is None or schema != latest.schema:
            return None
        return latest

    def _break(self, why: str) -> None:
        self.broken = why
        self.latest = None
        log.warning("snapshots off: %s (dashboards replay every event)", why)
        with contextlib.suppress(OSError):
            self.path.unlink()
