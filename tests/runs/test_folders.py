"""Run directories: ids, sockets, listing and status, without starting anything."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from gpuwatch.runs import folders


def _write_run(home: Path, run_id: str, events: list[dict], state: dict | None = None) -> Path:
    run_dir = home / "runs" / run_id
    run_dir.mkdir(parents=True)
    with open(run_dir / "events.jsonl", "w") as fh:
        for seq, event in enumerate(events):
            fh.write(json.dumps({"v": 1, "seq": seq, **event}) + "\n")
    if state is not None:
        (run_dir / "state.json").write_text(json.dumps(state))
    return run_dir


def test_run_ids_are_short_and_typeable() -> None:
    ids = {folders.new_run_id() for _ in range(200)}
    assert all(re.fullmatch(r"\d{4}-[a-z2-9]{4}", i) for i in ids)
    assert not any(ch in i[5:] for i in ids for ch in "l1o0i")


def test_a_finished_run_stays_finished_however_long_its_event_log_grew(tmp_path: Path) -> None:
    # 400 KB of samples after the final status: more than ls reads from the tail.
    sample = {"type": "sample", "host": {"cpu_pct": 1.0}, "gpus": [{"pad": "x" * 4000}]}
    events = [{"type": "run", "name": "r", "t": 1.0},
              {"type": "step", "attempt": 1, "step": 10, "examples": 256, "step_time_ms": 10.0},
              {"type": "status", "status": "finished", "attempt": 1, "exit_code": 0}]
    events += [sample] * 100
    run_dir = _write_run(tmp_path, "1121-abcd", events,
                         {"status": "finished", "attempt": 1, "exit_code": 0, "step": 10})
    info = folders.read_run_info(run_dir)
    assert info.status == "finished" and info.attempt == 1 and info.step == 10


def test_a_live_status_without_a_live_supervisor_is_lost(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path, "1121-abcd", [{"type": "run", "t": 1.0}],
                         {"status": "running", "attempt": 2})
    # A pid that exists but is not this run's supervisor (this test process).
    (run_dir / "supervisor.json").write_text(json.dumps({"pid": os.getpid(), "socket": "/x"}))
    info = folders.read_run_info(run_dir)
    assert info.status == "lost" and info.supervisor_pid is None
    assert "supervisor is gone" in (info.message or "")


def test_garbage_in_the_event_log_does_not_break_listing(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path, "1121-abcd", [{"type": "run", "t": 1.0}])
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write('{"type": "step", "step": "seven", "step_time_ms": "x"}\n[1, 2]\nnot json\n')
    (info,) = folders.list_runs(tmp_path)
    assert info.step == 0 and info.status == "lost"


def test_prefixes_resolve_uniquely_or_say_which_runs_match(tmp_path: Path) -> None:
    for run_id in ("1121-abcd", "1121-abce", "1122-wxyz"):
        _write_run(tmp_path, run_id, [{"type": "run", "t": 1.0}], {"status": "finished"})
    assert folders.resolve_run("1122", tmp_path).run_id == "1122-wxyz"
    assert folders.resolve_run("1121-abcd", tmp_path).run_id == "1121-abcd"
    with pytest.raises(folders.RunError, match=r"matches 2 runs: .*type more of the id"):
        folders.resolve_run("1121-abc", tmp_path)
    with pytest.raises(folders.RunError, match="no live run"):
        folders.resolve_run(None, tmp_path)


def test_deep_homes_get_a_short_private_socket_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    path = folders.socket_path_for("1121-abcd", deep)
    assert len(os.fsencode(path)) < 108
    assert folders.socket_path_for("1121-abcd", tmp_path).parent == (tmp_path / "sock").resolve()
    made = folders.ensure_private_dir(tmp_path / "private")
    assert made.stat().st_mode & 0o777 == 0o700
