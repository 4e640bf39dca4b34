"""Malformed commands against a real supervisor and trainer: answered, and nothing changes.

One run (tests/data/tiny.yaml, a real TensorFlow trainer with 2 CPU replicas) serves
every test here. After each refused frame the run is still running, on the same
attempt, with the same trainer pid, and no checkpoint was removed or rewritten.

Checkpoints: tiny.yaml saves every 25 steps and CheckpointManager keeps the last
`checkpoint.keep` (3 by default), deleting older ones as training goes on, so "no
checkpoint removed" would be false with no command at all. The run is started with
`checkpoint.keep` far above what the tests can produce, so the manager never deletes
one; then each `ckpt-N.index` that existed before a frame must exist after it with
the same size and mtime (a fresh attempt would rewrite ckpt-25, ckpt-50, ...), and
the newest checkpoint step never goes backwards. A fresh or resumed relaunch would
also change the attempt and the trainer pid, which are checked on their own.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.runs import folders
from tests.conftest import shared_home, wait_for
from tests.integration.test_supervisor import start_run

# live_run (module scope) trains between the tests: tests/support/alone.py holds on.
pytestmark = [pytest.mark.slow, pytest.mark.keeps_running]

# The schema's upper bound: 25,000 steps of tiny.yaml, far past what a test runs.
KEEP_EVERY_CHECKPOINT = 1000
DEEP = b"[" * 100_000 + b"\n"

# -- the oracle: what a valid command is, written here independently of the protocol ------

MAX_ID_CHARS = 128
MAX_WIRE_INT = 2**53 - 1
MAX_OVERRIDES = 64
MAX_KEY_CHARS = 128
COMMAND_FIELDS = {
    "subscribe": {"id", "from_seq"},
    "relaunch": {"id", "overrides", "fresh", "live"},
    "stop": {"id"},
    "status": {"id"},
}


def decodes(frame: dict[str, Any]) -> bool:
    """The frame passes the envelope every frame must have (else: a bad frame, closed)."""
    version = frame.get("v")
    return type(version) is int and version == 1 and type(frame.get("type")) is str


def valid_id(value: Any) -> bool:
    if value is None:
        return True
    if type(value) is str:
        return len(value) <= MAX_ID_CHARS
    return type(value) is int and -MAX_WIRE_INT <= value <= MAX_WIRE_INT


def dotted_key(key: Any) -> bool:
    if type(key) is not str or len(key) > MAX_KEY_CHARS:
        return False
    return all(
        part and all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in part)
        for part in key.split(".")
    )


def oracle_valid(frame: dict[str, Any]) -> bool:
    """Would the supervisor act on this frame? (Written without parse_command.)"""
    if not decodes(frame) or frame["type"] not in COMMAND_FIELDS:
        return False
    if set(frame) - {"v", "type"} - COMMAND_FIELDS[frame["type"]]:
        return False
    if "id" in frame and not valid_id(frame["id"]):
        return False
    if "from_seq" in frame:
        seq = frame["from_seq"]
        if type(seq) is not int or not 0 <= seq <= MAX_WIRE_INT:
            return False
    if "fresh" in frame and type(frame["fresh"]) is not bool:
        return False
    if "overrides" in frame:
        overrides = frame["overrides"]
        if type(overrides) is not dict or len(overrides) > MAX_OVERRIDES:
            return False
        if not all(dotted_key(key) for key in overrides):
            return False
    return True


def test_the_oracle_agrees_with_the_protocol_bounds() -> None:
    from trainer_runtime import protocol

    assert (MAX_ID_CHARS, MAX_WIRE_INT, MAX_OVERRIDES, MAX_KEY_CHARS) == (
        protocol.MAX_ID_CHARS,
        protocol.MAX_WIRE_INT,
        protocol.MAX_OVERRIDES,
        protocol.MAX_OVERRIDE_KEY_CHARS,
    )
    assert set(COMMAND_FIELDS) == set(protocol.COMMANDS)


# -- one live run for the module --------------------------------------------------------


@dataclass
class LiveRun:
    info: folders.RunInfo
    socket_path: str
    checkpoints: Path


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    with shared_home(tmp_path_factory.mktemp("wire") / "gpuwatch-home"):
        info = start_run("--set", f"checkpoint.keep={KEEP_EVERY_CHECKPOINT}")
        assert info.socket_path is not None
        run = LiveRun(info, str(info.socket_path), info.run_dir / "checkpoints")
        wait_for(
            lambda: ask_status(run)["status"] == "running" and checkpoint_files(run),
            180,
            "the run to be training with a first checkpoint written",
        )
        yield run


def exchange(run: LiveRun, data: bytes, *, answered: bool, timeout_s: float = 30) -> bytes:
    """Send data on a new connection and return what the supervisor sends back.

    answered: return its first line (the answer). Otherwise read until the supervisor
    closes the connection (it does so on a bad frame), and return all it sent. The
    socket is never half-closed first: the supervisor must close it on its own.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(run.socket_path)
        received = b""
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                received += chunk
                if answered and b"\n" in received:
                    return received.split(b"\n")[0] + b"\n"
        except (BrokenPipeError, ConnectionResetError):
            pass
        return received


def ask_status(run: LiveRun) -> dict[str, Any]:
    reply = exchange(run, b'{"v":1,"type":"status","id":"probe"}\n', answered=True)
    answer = json.loads(reply)
    assert answer["type"] == "ack" and answer["id"] == "probe", answer
    return answer


def checkpoint_files(run: LiveRun) -> dict[str, tuple[int, int]]:
    """ckpt-N.index name -> (size, mtime_ns), for every checkpoint written in full now:
    those the `checkpoint` state file names (TensorFlow rewrites it, atomically, once a
    save is complete; an index still being merged would look rewritten a moment later)."""
    try:
        state = (run.checkpoints / "checkpoint").read_text()
    except FileNotFoundError:
        return {}
    complete = {Path(name).name for name in re.findall(r'_checkpoint_paths?: "([^"]+)"', state)}
    found: dict[str, tuple[int, int]] = {}
    for path in run.checkpoints.glob("ckpt-*.index"):
        if path.name.removesuffix(".index") not in complete:
            continue
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        found[path.name] = (stat.st_size, stat.st_mtime_ns)
    return found


def newest_step(files: dict[str, tuple[int, int]]) -> int:
    return max(int(name[len("ckpt-") : -len(".index")]) for name in files)


@dataclass
class Baseline:
    attempt: int
    trainer_pid: int
    checkpoints: dict[str, tuple[int, int]]


def baseline(run: LiveRun) -> Baseline:
    status = ask_status(run)
    assert status["status"] == "running", status
    return Baseline(status["attempt"], status["trainer_pid"], checkpoint_files(run))


def assert_nothing_changed(run: LiveRun, before: Baseline, what: str) -> dict[str, Any]:
    status = ask_status(run)
    assert status["status"] == "running", f"{what}: {status}"
    assert status["attempt"] == before.attempt, f"{what}: a new attempt started"
    assert status["trainer_pid"] == before.trainer_pid, f"{what}: the trainer was replaced"
    after = checkpoint_files(run)
    gone = {name for name in before.checkpoints if name not in after}
    assert not gone, f"{what}: checkpoints removed: {sorted(gone)}"
    rewritten = {n for n, stat in before.checkpoints.items() if after[n] != stat}
    assert not rewritten, f"{what}: checkpoints rewritten: {sorted(rewritten)}"
    assert newest_step(after) >= newest_step(before.checkpoints), f"{what}: went backwards"
    return status


def send_refused(run: LiveRun, frame: dict[str, Any]) -> dict[str, Any] | None:
    """Send one frame the oracle calls invalid; check the answer; return the err (or None
    when the frame is not even a frame: then the connection is closed without one)."""
    data = json.dumps(frame).encode() + b"\n"
    if not decodes(frame):
        reply = exchange(run, data, answered=False)
        assert reply == b"", f"a bad frame gets no answer, only a closed connection: {reply!r}"
        return None
    reply = exchange(run, data, answered=True)
    assert reply, f"no answer to {frame!r:.200}"
    answer = json.loads(reply)
    assert answer["type"] == "err", f"{frame} was not refused: {answer}"
    expected_id = frame.get("id") if valid_id(frame.get("id")) else None
    assert answer["id"] == expected_id
    assert "\n" not in answer["message"]
    return answer


# -- (a) malformed relaunches ------------------------------------------------------------

PROGRESS = {"data.prefetch": True}  # a real change: an accepted relaunch would relaunch

MALFORMED_RELAUNCHES: list[tuple[dict[str, Any], str]] = [
    ({"fresh": "no"}, 'relaunch: fresh must be true or false (got "no")'),
    ({"fresh": "yes"}, "relaunch: fresh"),
    ({"fresh": 1}, "relaunch: fresh must be true or false (got 1)"),
    ({"fresh": 0}, "relaunch: fresh"),
    ({"fresh": "true"}, "relaunch: fresh"),
    ({"fresh": None}, "relaunch: fresh"),
    ({"fresh": [True]}, "relaunch: fresh"),
    ({"fresh": True, "overrides": None}, "relaunch: overrides"),
    ({"fresh": True, "overrides": [["data.prefetch", True]]}, "relaunch: overrides"),
    ({"fresh": True, "overrides": {"data..prefetch": True}}, "relaunch: overrides key"),
    ({"fresh": True, "id": True}, "relaunch: id"),
    ({"fresh": True, "id": 1.5}, "relaunch: id"),
    ({"fresh": True, "frsh": True}, 'relaunch: unknown field "frsh"'),
    ({"fresh": True, "from_seq": 0}, 'relaunch: unknown field "from_seq"'),
]


def test_malformed_relaunches_are_refused_and_change_nothing(live_run: LiveRun) -> None:
    for fields, message in MALFORMED_RELAUNCHES:
        before = baseline(live_run)
        frame = {"v": 1, "type": "relaunch", "id": fields.get("id", 7), "overrides": PROGRESS,
                 **fields}
        answer = send_refused(live_run, frame)
        assert answer is not None and message in answer["message"], (fields, answer)
        assert_nothing_changed(live_run, before, f"relaunch {fields}")
    for envelope in ({"v": True}, {"v": "1"}, {"v": 1.0}, {"type": ["relaunch"]}):
        before = baseline(live_run)
        frame = {"v": 1, "type": "relaunch", "overrides": PROGRESS, "fresh": True, **envelope}
        assert send_refused(live_run, frame) is None  # not a frame: counted, closed
        assert_nothing_changed(live_run, before, f"relaunch with {envelope}")
    attempts = [
        json.loads(line)
        for line in (live_run.info.run_dir / "events.jsonl").read_text().splitlines()
        if '"type":"attempt"' in line
    ]
    assert len(attempts) == 1, "only the first attempt was ever recorded"


# -- (b) any malformed command frame -------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
field_names = st.sampled_from(["v", "type", "id", "from_seq", "overrides", "fresh"]) | st.text(
    max_size=10
)
type_names = st.sampled_from(
    [*COMMAND_FIELDS, "ack", "err", "step", "reconfigure", "Relaunch", "stop ", ""]
) | st.text(max_size=12)

any_frames = st.builds(
    lambda frame_type, version, extra: {"v": version, "type": frame_type, **extra},
    type_names,
    st.just(1) | json_values,
    st.dictionaries(field_names, json_values, max_size=4),
)

bad_ids = st.sampled_from([True, False, 1.5, [], {}, [1], "x" * (MAX_ID_CHARS + 1),
                           MAX_WIRE_INT + 1, -(MAX_WIRE_INT + 1)])
bad_overrides = st.sampled_from([
    None, [], 1, True, "data.prefetch=on", {"data..prefetch": True}, {"": 1},
    {"data prefetch": True}, {".data": 1}, {"k" * (MAX_KEY_CHARS + 1): 1},
    {f"k{i}": 1 for i in range(MAX_OVERRIDES + 1)},
]) | json_values.filter(lambda value: not isinstance(value, dict))
bad_fresh = json_values.filter(lambda value: not isinstance(value, bool))
unknown_fields = st.text(min_size=1, max_size=10).filter(
    lambda name: name not in ("v", "type", "id", "overrides", "fresh", "from_seq")
)


def _with(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    return {**base, key: value}


# A valid relaunch that would discard progress, with exactly one field made wrong.
valid_fresh_relaunch = {"v": 1, "type": "relaunch", "id": 11, "overrides": PROGRESS,
                        "fresh": True}
near_valid_relaunches = st.one_of(
    bad_ids.map(lambda value: _with(valid_fresh_relaunch, "id", value)),
    bad_overrides.map(lambda value: _with(valid_fresh_relaunch, "overrides", value)),
    bad_fresh.map(lambda value: _with(valid_fresh_relaunch, "fresh", value)),
    st.tuples(unknown_fields, json_values).map(
        lambda pair: _with(valid_fresh_relaunch, pair[0], pair[1])
    ),
    st.sampled_from([True, 1.0, "1", 2, 0, None]).map(
        lambda value: _with(valid_fresh_relaunch, "v", value)
    ),
    st.sampled_from(["Relaunch", "relaunch ", "re-launch", "relaunch\n", ""]).map(
        lambda value: _with(valid_fresh_relaunch, "type", value)
    ),
)
# A valid stop (which would end the run) with one thing wrong.
valid_stop = {"v": 1, "type": "stop", "id": "s"}
near_valid_stops = st.one_of(
    bad_ids.map(lambda value: _with(valid_stop, "id", value)),
    st.tuples(unknown_fields, json_values).map(lambda pair: _with(valid_stop, *pair)),
    st.sampled_from([True, 1.0, "1"]).map(lambda value: _with(valid_stop, "v", value)),
)

invalid_frames = st.one_of(any_frames, near_valid_relaunches, near_valid_stops).filter(
    lambda frame: not oracle_valid(frame)
)


def test_no_malformed_command_frame_changes_the_run(live_run: LiveRun) -> None:
    sent_bad_frames = sent_frames = 0
    bad_frames_before = ask_status(live_run)["bad_frames"]

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(invalid_frames)
    def refuse(frame: dict[str, Any]) -> None:
        nonlocal sent_bad_frames, sent_frames
        sent_frames += 1
        before = baseline(live_run)
        if send_refused(live_run, frame) is None:
            sent_bad_frames += 1
        assert_nothing_changed(live_run, before, f"after {frame!r:.300}")

    refuse()
    status = ask_status(live_run)
    assert status["bad_frames"] - bad_frames_before == sent_bad_frames
    print(f"sent {sent_frames} frames, {sent_bad_frames} with a wrong envelope")
    assert sent_frames >= 100, "the property ran (almost) every example"
    assert sent_bad_frames > 0, "the property also sent frames with a wrong envelope"


# -- (c) a frame 100,000 levels deep -------------------------------------------------------


def test_a_hundred_thousand_deep_frame_is_a_counted_bad_frame_and_no_traceback(
    live_run: LiveRun,
) -> None:
    before = baseline(live_run)
    bad_frames = ask_status(live_run)["bad_frames"]
    assert exchange(live_run, DEEP, answered=False) == b"", "no answer: the connection is closed"
    status = assert_nothing_changed(live_run, before, "after the deep frame")
    assert status["bad_frames"] == bad_frames + 1
    log = (live_run.info.run_dir / "supervisor.log").read_text(errors="replace")
    assert "nests deeper than" in log, "the bad frame is logged, in one line"
    assert "Traceback" not in log
    assert "RecursionError" not in log
    assert os.path.exists(live_run.socket_path)
