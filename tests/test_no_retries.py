"""No test passes by luck: a rerun fails the run (tests/support/no_retries.py), and a seed
reorders the modules (tests/conftest.py) to find tests that lean on an earlier one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

_PASSES = "def test_passes():\n    assert 1 + 1 == 2\n"

# A plugin registered under rerunfailures' name, as installing it would.
_RETRY_PLUGIN = """
def pytest_configure(config):
    config.pluginmanager.register(object(), "rerunfailures")
"""

# A test reported once as rerun (what a retry plugin reports for a failed first try),
# then run as usual, and passing.
_RERUN_REPORT = """
from _pytest.reports import TestReport

def pytest_runtest_protocol(item, nextitem):
    report = TestReport(item.nodeid, item.location, {}, "rerun", None, "call")
    item.ihook.pytest_runtest_logreport(report=report)
"""


def _pytest(folder: Path) -> subprocess.CompletedProcess[str]:
    (folder / "test_one.py").write_text(_PASSES)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.no_retries", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(folder), str(folder)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_plain_run_passes(tmp_path: Path) -> None:
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_a_retry_plugin_stops_the_run_before_any_test(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(_RETRY_PLUGIN)
    proc = _pytest(tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # a usage error
    assert "reruns failed tests is active (rerunfailures)" in proc.stdout + proc.stderr
    assert "passed" not in proc.stdout


def test_a_test_that_passed_after_a_rerun_fails_the_run_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(_RERUN_REPORT)
    proc = _pytest(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FLAKY" in proc.stdout and "test_one.py::test_passes" in proc.stdout


def test_a_seed_shuffles_whole_modules_and_keeps_each_modules_order() -> None:
    from types import SimpleNamespace

    from tests.conftest import shuffle_modules

    items = [SimpleNamespace(nodeid=f"tests/test_{m}.py::test_{n}")
             for m in "abcdefgh" for n in range(3)]
    orders = []
    for seed in ("1", "2", "1"):
        shuffled = list(items)
        shuffle_modules(shuffled, seed)
        assert sorted(i.nodeid for i in shuffled) == sorted(i.nodeid for i in items)
        modules = [i.nodeid.split("::")[0] for i in shuffled]
        assert len({m for m in modules}) == len([m for k, m in enumerate(modules)
                                                 if k == 0 or modules[k - 1] != m])
        for m in set(modules):
            assert [i.nodeid for i in shuffled if i.nodeid.startswith(m)] == [
                i.nodeid for i in items if i.nodeid.startswith(m)]
        orders.append(list(dict.fromkeys(modules)))
    assert orders[0] == orders[2] and orders[0] != orders[1]
