"""A run directory as a supervisor leaves one, from recorded frames: events.jsonl, events.idx
and state.json through the real EventLog, snapshot.json through the real StateKeeper.

``finished(frames)`` ends a recorded run (the fixtures under tests/app/data stop while it
runs) as a supervisor records the end: the chief's done, then the status.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwatch.supervisor.eventlog import EventLog
from gpuwatch.supervisor.snapshots import StateKeeper
from trainer_runtime.protocol import Done, StatusChange, Step, event_frame, parse_event


def write_run_dir(
    run_dir: Path, frames: list[dict[str, Any]], *, snapshot_at: int | None = None
) -> None:
    """Record frames in run_dir (their seq: the line number); snapshot.json after the event
    of seq snapshot_at, if given."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = EventLog(run_dir)
    keeper = StateKeeper(run_dir, log)
    last_step = 0
    try:
        for frame in frames:
            _, event = parse_event(frame)
            seq, t, _ = log.append(event, frame.get("t"))
            keeper.fold(seq, event, t)
            if isinstance(event, Step) and event.worker == 0:
                last_step = event.step
            if isinstance(event, StatusChange):
                log.write_state(event, t, last_step)
            if seq == snapshot_at:
                keeper.write()
                assert keeper.latest is not None and keeper.latest.seq == seq, keeper.broken
    finally:
        log.close()


def finished(frames: list[dict[str, Any]], status: str = "finished") -> list[dict[str, Any]]:
    """The frames, then the end of their last attempt: done (max_steps) and the status."""
    attempt = max(int(f.get("attempt") or 0) for f in frames)
    steps = [f["step"] for f in frames if f["type"] == "step" and not f.get("worker")]
    t = max(float(f.get("t") or 0.0) for f in frames) + 0.5
    seq = len(frames)
    return [
        *frames,
        event_frame(Done(attempt=attempt, reason="max_steps", step=steps[-1]), t=t, seq=seq),
        event_frame(
            StatusChange(attempt=attempt, status=status, exit_code=0,
                         message="trainer finished (max_steps)"),
            t=t,
            seq=seq + 1,
        ),
    ]
