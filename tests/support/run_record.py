"""Reading a live run's record and processes in the drills (multi-worker, ssh, Slurm):
its events.jsonl as dicts, one kind of them, a worker's last step; a process alive."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def events(run_dir: Path) -> list[dict[str, Any]]:
    """The recorded events so far: a live run's last line may be half written (left out)."""
    text = (run_dir / "events.jsonl").read_text()
    whole = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


def of(run_dir: Path, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [
        e for e in events(run_dir)
        if e["type"] == kind and all(e.get(k) == v for k, v in match.items())
    ]


def last_step(run_dir: Path, worker: int, attempt: int) -> int:
    steps = of(run_dir, "step", worker=worker, attempt=attempt)
    return steps[-1]["step"] if steps else 0


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
