"""A live switch never waits for the old input pipeline to wind down.

Destroying a tf.data iterator waits for its pipeline's threads: for the autotuner's
sleep (up to 60 s once a run is a few minutes old, FACTS.md "tf.data teardown"), and
for any read in flight. Waiting minutes for the autotuner's period to grow makes a
poor test, so here the old pipeline's teardown is made slow the other way, for as
long as the test likes: its reads are held mid-call (a real tf.data teardown blocked
in C++, as the autotuner's is), while the switch is asked for and training goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.trainer.conftest import make_config
from trainer_runtime.teardown import PipelineReaper

DEADLINE_S = 60.0
# Counted from the moment the switch is asked for. Long enough that a switch which
# waits for the old pipeline cannot pass for one that does not (it would take this
# long, against the 5 s asked of it), and that the switch plus five steps finish well
# inside it on a loaded 2-core box: the held reads are let go after this, whatever
# happens, so a test that waits wrongly still ends.
HOLD_S = 60.0


class ReadGate:
    """Wraps the built-in data's read: reads of pipelines built before `hold` block until let go."""

    def __init__(self, make_read: Callable[[float], Callable[[Any], Any]]) -> None:
        self.make_read = make_read
        self.lock = threading.Lock()
        self.reads: list[int] = []  # reads so far, per read function (one per pipeline)
        self.held: set[int] = set()
        self.blocked = threading.Semaphore(0)  # one release per read that started waiting
        self.released = threading.Event()

    def __call__(self, latency_ms: float) -> Callable[[Any], Any]:
        read = self.make_read(latency_ms)
        with self.lock:
            index = len(self.reads)
            self.reads.append(0)

        def gated(token: Any) -> Any:
            with self.lock:
                self.reads[index] += 1
                hold = index in self.held
            if hold:
                self.blocked.release()
                self.released.wait(HOLD_S + DEADLINE_S)  # a backstop; `released` ends it
            return read(token)

        return gated

    def hold(self) -> None:
        """From now on, the next read of every pipeline built so far blocks."""
        with self.lock:
            self.held = set(range(len(self.reads)))

    def wait_reads(self, at_least: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            with self.lock:
                if self.reads and min(self.reads) >= at_least:
                    return
            assert time.monotonic() < deadline, f"reads {self.reads} never reached {at_least}"
            time.sleep(0.01)


@pytest.mark.alone
@pytest.mark.slow
def test_live_switch_is_answered_while_the_old_pipeline_is_still_tearing_down(
    strategy: Any, devices: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer_runtime import data
    from trainer_runtime.live_settings import reconfigure
    from trainer_runtime.loop import Trainer
    from trainer_runtime.telemetry import ReconfigureRequest

    gate = ReadGate(data._sleep_ms)
    monkeypatch.setattr(data, "_sleep_ms", gate)
    buffer = 2
    cfg = make_config(data={"read_latency_ms": 1, "prefetch": buffer, "parallel_calls": 1})
    trainer = Trainer(cfg, strategy, devices)
    let_go = threading.Timer(HOLD_S, gate.released.set)
    try:
        trainer.run_updates(3)
        # Each replica's pipeline has read its 3 batches and filled its prefetch buffer.
        gate.wait_reads(3 + buffer)
        gate.hold()
        trainer.run_updates(1)  # from the buffers; each refills, and that read blocks
        assert gate.blocked.acquire(timeout=DEADLINE_S), "no read of the old pipeline blocked"
        settings = cfg.model_dump(mode="json")
        settings["data"]["prefetch"] = False
        # Timed from here, not from the start: building the trainer and its first
        # updates took over 20 s on a loaded CI box, and the reads were let go early.
        let_go.start()
        event = reconfigure(trainer, ReconfigureRequest(id=1, settings=settings, at_step=0))
        assert event.ok, event.message
        assert event.changed == ["data.prefetch"]
        # Answered without waiting for the held read (a switch that waited takes HOLD_S);
        # seconds, not a tight bound: a busy 2-core box is slow at building pipelines.
        assert event.seconds < 5.0, event.seconds
        # Training runs on the new pipeline while the old one still cannot wind down.
        steps = trainer.run_updates(5)
        assert [s.step for s in steps] == [5, 6, 7, 8, 9]
        assert not gate.released.is_set()
        assert trainer.reaper.pending == 1
    finally:
        gate.released.set()
        let_go.cancel()
    # Once its reads are let go the old pipeline winds down, though its autotuner may
    # sleep out a period first (up to 60 s, more on a loaded box): off the training path.
    assert trainer.reaper.wait_idle(2 * DEADLINE_S)
    assert trainer.reaper.took_s[-1] > 0.0
    trainer.run_updates(2)


class Blocker:
    """Stands for a pipeline whose destructor blocks until let go."""

    def __init__(self, release: threading.Event, log: list[str]) -> None:
        self.release = release
        self.log = log

    def __del__(self) -> None:
        self.log.append(threading.current_thread().name)
        self.release.wait(DEADLINE_S)


def test_reaper_drops_the_last_references_on_its_own_thread() -> None:
    reaper = PipelineReaper(name="test-reaper", idle_exit_s=0.2)
    release = threading.Event()
    where: list[str] = []
    try:
        started = time.monotonic()
        reaper.drop([Blocker(release, where), Blocker(release, where)])
        reaper.drop([Blocker(release, where)])
        assert time.monotonic() - started < 1.0  # the caller never waits
        assert reaper.pending == 2
        assert not reaper.wait_idle(0.2)
    finally:
        release.set()
    assert reaper.wait_idle(DEADLINE_S)
    assert where == ["test-reaper"] * 3
    assert len(reaper.took_s) == 2


def test_reaper_thread_ends_when_idle_and_starts_again_on_the_next_drop() -> None:
    reaper = PipelineReaper(name="test-reaper-idle", idle_exit_s=0.1)

    def reapers() -> int:
        return sum(t.name == "test-reaper-idle" for t in threading.enumerate())

    for _ in range(3):
        reaper.drop([object()])
        assert reaper.wait_idle(DEADLINE_S)
        deadline = time.monotonic() + DEADLINE_S
        while reapers() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reapers() == 0
    # Many drops at once: still one thread.
    release = threading.Event()
    where: list[str] = []
    try:
        for _ in range(10):
            reaper.drop([Blocker(release, where)])
        assert reapers() == 1
    finally:
        release.set()
    assert reaper.wait_idle(DEADLINE_S)
    assert len(where) == 10
