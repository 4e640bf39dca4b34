"""A full telemetry queue drops step frames, never the ones the supervisor's record waits on
(a live change settles on `reconfigured`): a real socket whose reader has stopped."""

from __future__ import annotations

import socket
import time

from tests.data.fake_trainer import step
from trainer_runtime.protocol import FrameBuffer, Reconfigured
from trainer_runtime.telemetry import NEVER_DROPPED, SocketEmitter


def test_a_full_queue_drops_steps_but_keeps_the_reconfigured_answer() -> None:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    emitter = SocketEmitter(ours, buffer_frames=8)
    try:
        number = 0
        deadline = time.monotonic() + 10
        while emitter.dropped == 0:  # nobody reads: the socket, then the queue fill up
            number += 1
            emitter.emit(step(1, number))
            assert time.monotonic() < deadline, "the queue never filled"
        answer = Reconfigured(attempt=1, id=7, ok=True, step=number, changed=["data.prefetch"],
                              seconds=0.5)
        emitter.emit(answer)
        dropped = emitter.dropped
        theirs.setblocking(False)
        frames = FrameBuffer()
        seen: list[dict] = []
        deadline = time.monotonic() + 10
        while not any(f.get("type") == "reconfigured" for f in seen):
            assert time.monotonic() < deadline, "the answer never came"
            try:
                chunk = theirs.recv(1 << 16)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            seen.extend(frames.feed(chunk))
        (kept,) = [f for f in seen if f.get("type") == "reconfigured"]
        assert kept["id"] == 7 and kept["ok"] is True
        assert dropped >= 1 and emitter.dropped == dropped  # steps went, the answer did not
        assert "reconfigured" in NEVER_DROPPED and "step" not in NEVER_DROPPED
    finally:
        emitter.close(1.0)
        ours.close()
        theirs.close()
