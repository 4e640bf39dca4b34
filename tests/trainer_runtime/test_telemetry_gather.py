"""The hook's emitter lets step frames gather and sends them together (gpuwatch run: a
script's 2 ms steps must not wake the supervisor 500 times a second); a frame that must
not wait (done, error, hello, reconfigured) or a close sends everything at once. The
runtime's emitter (gather_s 0) sends each step as it ends. A real socketpair."""

from __future__ import annotations

import socket
import time

import pytest

from tests.data.fake_trainer import step
from trainer_runtime.protocol import Done, FrameBuffer
from trainer_runtime.telemetry import SocketEmitter


def _frames_within(sock: socket.socket, seconds: float) -> list[dict]:
    sock.settimeout(0.05)
    frames = FrameBuffer()
    seen: list[dict] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        seen.extend(frames.feed(chunk))
    return seen


@pytest.mark.alone
def test_steps_gather_until_a_frame_that_must_not_wait_sends_them_all() -> None:
    ours, theirs = socket.socketpair()
    emitter = SocketEmitter(ours, gather_s=30.0)  # far longer than this test
    try:
        for number in range(1, 11):
            emitter.emit(step(1, number))
        assert _frames_within(theirs, 0.5) == []  # gathering
        emitter.emit(Done(attempt=1, reason="exited", step=10))
        seen = _frames_within(theirs, 2.0)
        assert [f.get("step") for f in seen if f["type"] == "step"] == list(range(1, 11))
        assert seen[-1]["type"] == "done"
    finally:
        emitter.close(1.0)
        theirs.close()


@pytest.mark.alone
def test_a_close_sends_what_gathered_and_the_runtimes_emitter_never_waits() -> None:
    ours, theirs = socket.socketpair()
    emitter = SocketEmitter(ours, gather_s=30.0)
    for number in range(1, 4):
        emitter.emit(step(1, number))
    emitter.close(2.0)
    assert [f["step"] for f in _frames_within(theirs, 0.5)] == [1, 2, 3]
    theirs.close()

    ours, theirs = socket.socketpair()
    runtime = SocketEmitter(ours)  # gather_s 0
    try:
        runtime.emit(step(1, 1))
        assert [f["step"] for f in _frames_within(theirs, 1.0)] == [1]
    finally:
        runtime.close(1.0)
        theirs.close()
