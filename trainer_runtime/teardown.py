"""Old input pipelines torn down off the training path, on one reaper thread.

Destroying a tf.data iterator waits for its pipeline's autotuning thread, which
sleeps between optimisation rounds for a period that doubles up to 60 s, and the
destroyer's wake-up does not cut that sleep short (TF 2.21; FACTS.md, "tf.data
teardown"). Dropped on the training thread, the demo's pipeline a minute old held a
live switch for 26-38 s at 0 % CPU. The wait is in C++ with the GIL released, so the
last reference dropped on another thread moves all of it there: the switch is
answered, and training runs on the new pipeline, while the old one winds down.

One thread does every teardown in turn (queued pipelines' autotuners sleep out their
periods side by side, so a queue costs the longest wait, not the sum), and it ends
itself after a while idle: no thread per switch, none left once switches stop.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from typing import Any

log = logging.getLogger("trainer_runtime")

# The reaper thread ends after this long with nothing to tear down (a later drop
# starts another).
IDLE_EXIT_S = 5.0


class PipelineReaper:
    """Releases dropped input pipelines (iterators, datasets) on a thread of its own."""

    def __init__(self, name: str = "pipeline-reaper", idle_exit_s: float = IDLE_EXIT_S) -> None:
        self.name = name
        self.idle_exit_s = idle_exit_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._boxes: collections.deque[list[Any]] = collections.deque()
        self._busy = False
        self._thread: threading.Thread | None = None
        # Seconds each teardown took, newest last (a few: for logs and tests).
        self.took_s: collections.deque[float] = collections.deque(maxlen=16)

    def drop(self, box: list[Any]) -> None:
        """Tear down everything in `box` on the reaper thread.

        `box` must hold the only references to what it holds: the reaper empties
        the list itself, so the last references go on its thread whatever the
        caller still does with the (then empty) list.
        """
        with self._changed:
            self._boxes.append(box)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._changed.notify_all()

    @property
    def pending(self) -> int:
        """Pipelines dropped and not yet torn down (queued or under way)."""
        with self._lock:
            return len(self._boxes) + int(self._busy)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every dropped pipeline is torn down; False if still not after timeout_s."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._boxes or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._boxes:
                    if not self._changed.wait(self.idle_exit_s) and not self._boxes:
                        self._thread = None
                        return
                box = self._boxes.popleft()
                self._busy = True
            started = time.monotonic()
            try:
                box.clear()  # the last references: destructors run here, not in training
                del box
                gc.collect()  # and whatever of them sat in reference cycles
            except Exception:  # a teardown error must not end the reaper
                log.exception("tearing down an old input pipeline failed")
            took = time.monotonic() - started
            with self._changed:
                self._busy = False
                self.took_s.append(took)
                self._changed.notify_all()
            log.info("old input pipeline torn down in %.2fs (off the training thread)", took)
