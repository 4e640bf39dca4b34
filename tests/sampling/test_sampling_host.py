"""Host sampling for real with psutil, and the sampling package's import hygiene."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import namedtuple
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwatch.sampling import DeviceSampler
from gpuwatch.sampling.host import HostSampler, busy_pct, rss_of
from tests.support.fake_nvml import FakeNVML

SPIN = "import sys\nwhile True:\n    pass\n"
# Allocates a known 64 MiB and touches it, then waits for stdin to close.
HOLD_MEMORY = (
    "import sys\n"
    "block = bytearray(64 * 2**20)\n"
    "sys.stdout.write('ready\\n')\n"
    "sys.stdout.flush()\n"
    "sys.stdin.read()\n"
)


def wait_for(condition: Callable[[], bool], deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(code: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def test_host_readings_are_in_range() -> None:
    sampler = HostSampler()
    seen = []
    # The first interval can be shorter than a CPU tick: wait for a measured one.
    assert wait_for(lambda: seen.append(sampler.sample(None)) or seen[-1].cpu_pct is not None)
    sample = seen[-1]
    assert len(sample.per_cpu_pct) == psutil.cpu_count()
    assert all(0.0 <= p <= 100.0 for p in sample.per_cpu_pct)
    assert sample.cpu_pct is not None and 0.0 <= sample.cpu_pct <= 100.0
    assert sample.mem_total_bytes == psutil.virtual_memory().total
    assert sample.mem_used_bytes is not None and 0 < sample.mem_used_bytes <= sample.mem_total_bytes
    assert sample.load_1m is not None and sample.load_1m >= 0.0
    assert sample.run_cpu_pct is None and sample.run_rss_bytes is None  # no run pids


def test_per_cpu_list_has_one_entry_per_cpu() -> None:
    sampler = HostSampler()
    assert wait_for(lambda: len(sampler.sample(None).per_cpu_pct) == psutil.cpu_count())


def test_run_rss_sums_the_run_processes(child) -> None:
    holder = child(HOLD_MEMORY)
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    sampler = HostSampler()
    one = sampler.sample({holder.pid})
    assert one.run_rss_bytes is not None and one.run_rss_bytes >= 64 * 2**20
    both = sampler.sample({holder.pid, os.getpid()})
    own = psutil.Process().memory_info().rss
    assert both.run_rss_bytes is not None
    assert both.run_rss_bytes >= 64 * 2**20 + own * 0.5  # our own RSS moves a little


def test_run_cpu_measures_a_spinning_child(child) -> None:
    spinner = child(SPIN)
    sampler = HostSampler()
    first = sampler.sample({spinner.pid})
    assert first.run_cpu_pct is None  # a process seen once has no interval yet
    # One spinning process uses up to one core: wait until we see most of it.
    assert wait_for(lambda: (sampler.sample({spinner.pid}).run_cpu_pct or 0.0) > 30.0)
    reading = sampler.sample({spinner.pid}).run_cpu_pct
    assert reading is not None and reading <= 100.0 * psutil.cpu_count() + 5


def test_vanished_run_pids_are_dropped(child) -> None:
    spinner = child(SPIN)
    sampler = HostSampler()
    sampler.sample({spinner.pid})
    spinner.kill()
    spinner.wait(timeout=10)
    gone = sampler.sample({spinner.pid})
    assert gone.run_cpu_pct is None and gone.run_rss_bytes is None
    assert gone.mem_total_bytes is not None


def test_device_sampler_passes_run_pids_to_the_host(child) -> None:
    holder = child(HOLD_MEMORY)
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    sampler = DeviceSampler(run_pids=lambda: {holder.pid}, nvml=FakeNVML([]))
    try:
        assert (sampler.sample().host.run_rss_bytes or 0) >= 64 * 2**20
    finally:
        sampler.close()


def test_spare_memory_is_its_own_figure_not_the_runs(child) -> None:
    """A spare trainer holding a known 64 MiB: its RSS is spare_rss_bytes, apart from the
    run's (it does not train), and None once it is gone."""
    spare = child(HOLD_MEMORY)
    assert spare.stdout is not None and spare.stdout.readline() == "ready\n"
    sampler = DeviceSampler(run_pids=lambda: set(), spare_pids=lambda: {spare.pid},
                            nvml=FakeNVML([]))
    try:
        host = sampler.sample().host
        truth = psutil.Process(spare.pid).memory_info().rss
        assert host.spare_rss_bytes is not None and host.spare_rss_bytes >= 64 * 2**20
        assert abs(host.spare_rss_bytes - truth) < 4 * 2**20  # read a moment apart
        assert host.run_rss_bytes is None
        spare.kill()
        spare.wait(timeout=10)
        assert sampler.sample().host.spare_rss_bytes is None
    finally:
        sampler.close()


def test_busy_pct_from_cpu_times() -> None:
    Times = namedtuple("Times", "user nice system idle iowait guest guest_nice")
    before = Times(100, 0, 50, 800, 50, 0, 0)
    # 30 busy, 60 idle, 10 iowait (idle too), guest counted inside user already.
    after = Times(120, 0, 60, 860, 60, 5, 0)
    assert busy_pct(before, after) == pytest.approx(30.0)
    assert busy_pct(before, before) is None


def test_sampling_package_imports_without_ui_config_or_tensorflow() -> None:
    code = (
        "import sys, gpuwatch.sampling, tests.support.fake_nvml\n"
        "bad = [m for m in ('textual', 'pydantic', 'yaml', 'tensorflow', 'keras') "
        "if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],  # where `tests` (the fake) is importable
    )
    assert out.stdout.strip() == ""


@pytest.mark.alone
def test_a_process_sampled_again_at_once_keeps_its_last_figure(child) -> None:
    """cpu_times tick in 10 ms steps: a reading a few ms after the last is no interval."""
    import time

    spinner = child(SPIN)
    sampler = HostSampler()
    sampler.sample({spinner.pid})
    time.sleep(0.5)
    measured = sampler.sample({spinner.pid}).run_cpu_pct
    assert measured is not None and 0.0 < measured <= 100.0 * psutil.cpu_count() + 5
    for _ in range(20):  # back to back, well under MIN_CPU_INTERVAL_S apart
        assert sampler.sample({spinner.pid}).run_cpu_pct == measured


def test_an_exited_process_not_yet_reaped_has_no_figures(child) -> None:
    """A trainer that has exited but is not reaped yet is a zombie: psutil still reads its
    last CPU times and no memory. It is gone: no CPU share (the sampler used to report its
    last figure, like 87 %), no 0 B RSS, as the run's or as a spare's."""
    import time

    spinner = child(SPIN)
    now = [time.monotonic()]
    sampler = HostSampler(clock=lambda: now[0])

    def sample() -> Any:
        now[0] = time.monotonic()
        return sampler.sample({spinner.pid})

    sample()
    assert wait_for(lambda: (sample().run_cpu_pct or 0.0) > 30.0)
    alive = sample()
    assert alive.run_rss_bytes is not None and alive.run_rss_bytes > 0
    spinner.kill()  # not waited for: a zombie until the fixture reaps it
    assert wait_for(lambda: psutil.Process(spinner.pid).status() == psutil.STATUS_ZOMBIE)
    assert psutil.Process(spinner.pid).memory_info().rss == 0  # what psutil reads of it
    # Read at once after the last reading (the path that keeps a live process's last
    # figure), then a second later: nothing either time.
    now[0] += 0.01
    gone = sampler.sample({spinner.pid}, spare_pids={spinner.pid})
    assert gone.run_cpu_pct is None and gone.run_rss_bytes is None
    assert gone.spare_rss_bytes is None
    now[0] += 1.0
    again = sampler.sample({spinner.pid})
    assert again.run_cpu_pct is None and again.run_rss_bytes is None
    assert rss_of({spinner.pid}) is None
