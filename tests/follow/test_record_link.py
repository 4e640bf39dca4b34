"""RecordLink: an ended run read from its directory, as the supervisor would have sent it.

The directories are written by the real EventLog and StateKeeper (tests/support): the
record read back (snapshot.json, then the events after it) must fold to exactly what
folding every line of events.jsonl gives.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.config import ConfigError
from gpuwatch.follow.client import CommandError
from gpuwatch.follow.link import RECORD, RecordLink
from gpuwatch.follow.record_reader import line_offset
from gpuwatch.runs import resume
from gpuwatch.runs.folders import RunInfo, read_run_info
from gpuwatch.runstate import RunState
from gpuwatch.runstate.codec import snapshotted
from tests.app.conftest import load_events
from tests.support.long_run import write_long_run
from tests.support.recorded import finished, write_run_dir
from trainer_runtime.protocol import SNAPSHOT, ProtocolError, decode

BATCH = 500


def run_fields(state: RunState) -> dict[str, Any]:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if snapshotted(f)}


def whole_fold(run_dir: Path) -> RunState:
    """Every line of events.jsonl folded, as a dashboard replaying it all would."""
    state = RunState()
    with open(run_dir / "events.jsonl", "rb") as fh:
        for line in fh:
            try:
                state.apply(decode(line))
            except ProtocolError:
                continue
    return state


async def read_all(link: RecordLink) -> list[list[dict[str, Any]]]:
    """The link's batches up to and including its record link event."""
    batches = []
    stream = link.events()
    try:
        async for batch in stream:
            batches.append(batch)
            if any(e.get("type") == "link" and e.get("state") == RECORD for e in batch):
                return batches
    finally:
        await stream.aclose()
        await link.close()
    raise AssertionError("the link ended without saying it is a record")


def fold(batches: list[list[dict[str, Any]]]) -> RunState:
    """What the link read of the record folded (its own link and status news left out)."""
    state = RunState()
    for batch in batches:
        state.apply_many(e for e in batch if "seq" in e)
    return state


@pytest.fixture
def long_run(tmp_path: Path) -> tuple[Path, int]:
    """A run of 6,000 events (an index record every 1,024), snapshots every 10 s of run time:
    the last one well before the end. Returns its directory and the last snapshot's seq."""
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    run = write_long_run(run_dir, 6000, snapshot_every_s=10.0)
    assert 1024 < run.snapshot_seq < 6000 - 100, run.snapshot_seq
    return run_dir, run.snapshot_seq


async def test_snapshot_json_and_the_events_after_it_fold_to_the_whole_record(long_run):
    run_dir, snapshot_seq = long_run
    link = RecordLink(read_run_info(run_dir), batch_size=BATCH)
    batches = await read_all(link)

    first = batches[0]
    assert [f["type"] for f in first] == [SNAPSHOT] and first[0]["seq"] == snapshot_seq
    assert link.snapshot_seq == snapshot_seq
    # The joined frame a supervisor's parts make (RunClient), no more.
    assert set(first[0]) == {"v", "type", "seq", "schema", "data"}
    after = [e["seq"] for batch in batches[1:-1] for e in batch]
    assert after == list(range(snapshot_seq + 1, 6000)), "every event after it, once, in order"
    assert max(len(b) for b in batches) <= BATCH, "read in chunks, not whole"
    # The record stops while the run was live, and no supervisor is up: it is lost, as
    # `gpuwatch ls` says; a status without seq (not part of the record) says so.
    lost, said = batches[-1]
    assert said == {"type": "link", "state": RECORD, "message": "run ended (lost); r resumes it"}
    assert "seq" not in lost and (lost["type"], lost["status"], lost["attempt"]) == (
        "status", "lost", 3
    )
    assert lost["message"] == read_run_info(run_dir).message
    state = fold(batches)
    whole = whole_fold(run_dir)
    assert state.last_seq == whole.last_seq == 5999
    assert run_fields(state) == run_fields(whole)
    assert state.to_snapshot() == whole.to_snapshot()


async def test_without_snapshot_json_every_event_is_read(long_run):
    run_dir, _ = long_run
    (run_dir / "snapshot.json").unlink()
    link = RecordLink(read_run_info(run_dir), batch_size=BATCH)
    batches = await read_all(link)
    assert link.snapshot_seq is None
    seqs = [e["seq"] for batch in batches[:-1] for e in batch]
    assert seqs == list(range(6000))
    assert fold(batches).to_snapshot() == whole_fold(run_dir).to_snapshot()


async def test_a_snapshot_ahead_of_the_record_or_of_another_format_is_not_used(long_run):
    run_dir, snapshot_seq = long_run
    events = run_dir / "events.jsonl"
    lines = events.read_bytes().splitlines(keepends=True)
    events.write_bytes(b"".join(lines[:snapshot_seq]))  # it folds one event more than this
    link = RecordLink(read_run_info(run_dir), batch_size=BATCH)
    batches = await read_all(link)
    assert link.snapshot_seq is None and batches[0][0]["seq"] == 0
    assert fold(batches).last_seq == snapshot_seq - 1

    events.write_bytes(b"".join(lines))
    saved = json.loads((run_dir / "snapshot.json").read_text())
    saved["schema"] = "1-0000000000000000"
    (run_dir / "snapshot.json").write_text(json.dumps(saved))
    link = RecordLink(read_run_info(run_dir), batch_size=BATCH)
    batches = await read_all(link)
    assert link.snapshot_seq is None
    assert fold(batches).to_snapshot() == whole_fold(run_dir).to_snapshot()


async def test_a_torn_last_line_and_a_line_that_is_not_a_frame_are_skipped(tmp_path):
    run_dir = tmp_path / "runs" / "0612-kq7m"
    frames = load_events("cpu_crashed.jsonl")
    write_run_dir(run_dir, frames, snapshot_at=10)
    events = run_dir / "events.jsonl"
    torn = b'{"v":1,"type":"step","seq":26,"t":1750000100.0,"attempt":1,"st'
    events.write_bytes(events.read_bytes() + b"not json at all\n" + torn)
    link = RecordLink(read_run_info(run_dir), batch_size=4)
    batches = await read_all(link)
    state = fold(batches)
    assert link.snapshot_seq == 10
    assert link.bad_lines == 1  # the torn line is not counted: it is not there yet
    assert state.last_seq == len(frames) - 1
    assert state.status == "crashed" and state.exit_code == 1
    assert run_fields(state) == run_fields(whole_fold(run_dir))


def test_line_offset_seeks_through_the_index_and_counts_without_it(long_run):
    run_dir, _ = long_run
    lines = (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    probes = (0, 1, 1023, 1024, 1025, 2048, 3000, 5999, 6000)
    for seq in probes:
        assert line_offset(run_dir, seq) == starts[seq], seq
    assert line_offset(run_dir, 6001) is None
    (run_dir / "events.idx").write_bytes(b"GWIX" + bytes(4) + bytes(80))  # not this file's
    for seq in probes:
        assert line_offset(run_dir, seq) == starts[seq], seq
    (run_dir / "events.idx").unlink()
    assert [line_offset(run_dir, seq) for seq in probes] == [starts[seq] for seq in probes]


def recorded_run(tmp_path: Path) -> RunInfo:
    run_dir = tmp_path / "runs" / "0612-kq7m"
    write_run_dir(run_dir, finished(load_events("cpu_two_attempts.jsonl")), snapshot_at=60)
    return read_run_info(run_dir)


async def test_relaunch_resumes_with_set_texts_and_refusals_are_one_line(
    tmp_path, monkeypatch
):
    info = recorded_run(tmp_path)
    calls: list[tuple[str, list[str]]] = []

    def refuse(run: RunInfo, overrides: list[str]) -> RunInfo:
        calls.append((run.run_id, list(overrides)))
        raise ConfigError("resume.yaml: train.global_batch_size: 7 does not split over 2 replicas")

    monkeypatch.setattr(resume, "resume_run", refuse)
    link = RecordLink(info)
    with pytest.raises(CommandError, match="still being read"):
        await link.command("relaunch", overrides={})
    stream = link.events()
    async for batch in stream:
        if batch[-1].get("state") == RECORD:
            break
    overrides = {"data.prefetch": False, "train.learning_rate": 1e-05, "data.prefetch_x": "on"}
    with pytest.raises(CommandError) as refused:
        await link.command("relaunch", overrides=overrides, fresh=False, live=True)
    assert str(refused.value) == (
        "resume.yaml: train.global_batch_size: 7 does not split over 2 replicas"
    )
    assert calls == [
        ("0612-kq7m",
         ["data.prefetch=false", "train.learning_rate=1.0e-05", 'data.prefetch_x="on"'])
    ]
    assert not link.following
    with pytest.raises(CommandError, match=r"has ended \(finished\): nothing to stop"):
        await link.command("stop")
    with pytest.raises(CommandError, match="from the last checkpoint"):
        await link.command("relaunch", overrides={}, fresh=True)
    await stream.aclose()
    await link.close()
