"""No test passes on a second try: a plugin that reruns failures makes the run fail.

A rerun hides a flaky test behind a green run (pytest-rerunfailures' `--reruns`, the
`flaky` decorator, pytest-retry): the suite must pass on the first try, every time. So
this plugin refuses to start a session in which such a plugin is active, and fails a
session in which any test was reported as rerun, naming it, whatever the plugin.
"""

from __future__ import annotations

import pytest

# The pytest plugins that run a failed test again, by the names they register under.
RETRY_PLUGINS = ("rerunfailures", "flaky", "pytest_retry", "retry", "flakefinder")

_rerun: set[str] = set()


def active_retry_plugins(config: pytest.Config) -> list[str]:
    return [name for name in RETRY_PLUGINS if config.pluginmanager.has_plugin(name)]


def pytest_sessionstart(session: pytest.Session) -> None:
    found = active_retry_plugins(session.config)
    if found:
        raise pytest.UsageError(
            f"a plugin that reruns failed tests is active ({', '.join(found)}): the suite "
            "must pass on its first try; uninstall it or run with -p no:NAME")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":  # type: ignore[comparison-overlap]
        _rerun.add(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _rerun:
        session.config.get_terminal_writer().line(
            "FLAKY: passed or failed only on a rerun (a rerun is not allowed): "
            + ", ".join(sorted(_rerun)), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
