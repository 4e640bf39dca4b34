"""Each test's seconds in a measured run of the suite (tests/durations.json).

Two readers: the order the slow modules are handed out in (tests/conftest.py: longest
first) and the lock's backfill (tests/support/alone.py: while an `alone` test waits for
the running tests to end, a test predicted to end before them starts anyway).

The file maps each module to its tests' seconds (set-up, call and tear-down summed, in
a full run on the 2-core box), a test under ``QUICK_S`` left out. Regenerate it with
``GPUWATCH_DURATIONS_OUT=tests/durations.json python -m pytest -q``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# GPUWATCH_TEST_DURATIONS: another file (tests/test_alone_lock.py's toy suite has one).
FILE = Path(os.environ.get("GPUWATCH_TEST_DURATIONS")
            or Path(__file__).resolve().parents[1] / "durations.json")
QUICK_S = 0.1  # a test left out of a module in the file took less than this


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class Durations:
    """What the file says; an unreadable or missing file says nothing."""

    def __init__(self, path: Path = FILE) -> None:
        self.tests: dict[str, dict[str, float]] = {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(data, dict):
            self.tests = {module: {name: float(s) for name, s in tests.items()}
                          for module, tests in data.items() if isinstance(tests, dict)}

    def module_seconds(self, module: str) -> float | None:
        """The module's seconds; None if the file does not know it (a new module)."""
        tests = self.tests.get(module)
        return None if tests is None else sum(tests.values())

    def test_seconds(self, nodeid: str) -> float | None:
        """The test's seconds; None if the file does not know its module."""
        module, _, name = nodeid.partition("::")
        tests = self.tests.get(module)
        if tests is None:
            return None
        return tests.get(name, QUICK_S)


def write(path: Path, seconds: dict[str, float]) -> None:
    """The file from each test's seconds in a run ({nodeid: seconds})."""
    out: dict[str, dict[str, float]] = {}
    for nodeid, total in sorted(seconds.items()):
        module, _, name = nodeid.partition("::")
        tests = out.setdefault(module, {})
        if total >= QUICK_S:
            tests[name] = round(total, 1)
    path.write_text(json.dumps(out, indent=1) + "\n")
