"""Host readings with psutil: CPU (whole and per core), memory, load, and the run's processes.

CPU percentages are computed from our own ``cpu_times`` deltas rather than
``psutil.cpu_percent(None)``, whose "since the last call" state is global to
the process: another caller in the supervisor would silently shorten our
interval.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from trainer_runtime.protocol import HostSample

# Linux counts guest time inside user/nice already (as psutil does, skip them).
_NOT_IN_TOTAL = ("guest", "guest_nice")
# A process's CPU share is measured over at least this long: cpu_times ticks in 10 ms
# steps, so two readings a few ms apart could read as thousands of percent.
MIN_CPU_INTERVAL_S = 0.2
_IDLE = ("idle", "iowait")


def _total_and_idle(times: Any) -> tuple[float, float]:
    fields = times._fields
    total = sum(getattr(times, name) for name in fields if name not in _NOT_IN_TOTAL)
    idle = sum(getattr(times, name) for name in fields if name in _IDLE)
    return total, idle


def busy_pct(before: Any, after: Any) -> float | None:
    """Percent of time not idle between two ``cpu_times`` readings; None if no time passed."""
    total0, idle0 = _total_and_idle(before)
    total1, idle1 = _total_and_idle(after)
    total = total1 - total0
    if total <= 0:
        return None
    busy = total - (idle1 - idle0)
    return min(100.0, max(0.0, 100.0 * busy / total))


def exited(proc: psutil.Process) -> bool:
    """An exited process not yet reaped (a zombie) is gone: psutil still reads it, with its
    last CPU times and no memory, figures of a process that no longer runs."""
    return proc.status() == psutil.STATUS_ZOMBIE


def rss_of(pids: Iterable[int]) -> int | None:
    """The summed resident memory of these processes (None: none of them is there)."""
    total: int | None = None
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                if exited(proc):
                    continue
                rss = int(proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total = rss if total is None else total + rss
    return total


class HostSampler:
    """Keeps the previous CPU counters and the run's psutil.Process objects between samples."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._cpu_before = psutil.cpu_times(percpu=True)
        # pid -> (process, its user+system CPU seconds, when we read them)
        # pid -> (process, CPU seconds, when read, its last CPU %: None before an interval)
        self._procs: dict[int, tuple[psutil.Process, float, float, float | None]] = {}

    def sample(
        self, run_pids: Iterable[int] | None, spare_pids: Iterable[int] = ()
    ) -> HostSample:
        """The host now. Never raises: a reading that fails is None."""
        cpu_pct, per_cpu = self._cpu()
        mem_used = mem_total = None
        try:
            memory = psutil.virtual_memory()
            # "Used" as total minus available: what a new process could not
            # have, the figure `free` shows as used+buff/cache pressure.
            mem_total = int(memory.total)
            mem_used = int(memory.total - memory.available)
        except Exception:  # degrade this reading only
            pass
        try:
            load_1m: float | None = os.getloadavg()[0]
        except (OSError, AttributeError):
            load_1m = None
        run_cpu, run_rss = self._run(run_pids)
        return HostSample(
            cpu_pct=cpu_pct,
            per_cpu_pct=per_cpu,
            mem_used_bytes=mem_used,
            mem_total_bytes=mem_total,
            load_1m=load_1m,
            run_cpu_pct=run_cpu,
            run_rss_bytes=run_rss,
            spare_rss_bytes=rss_of(spare_pids),
        )

    def _cpu(self) -> tuple[float | None, tuple[float, ...]]:
        try:
            after = psutil.cpu_times(percpu=True)
        except Exception:
            return None, ()
        before, self._cpu_before = self._cpu_before, after
        if len(before) != len(after):
            return None, ()  # a CPU came or went: start again from here
        per_cpu = [busy_pct(b, a) for b, a in zip(before, after, strict=True)]
        total0 = sum(_total_and_idle(b)[0] for b in before)
        total1 = sum(_total_and_idle(a)[0] for a in after)
        idle0 = sum(_total_and_idle(b)[1] for b in before)
        idle1 = sum(_total_and_idle(a)[1] for a in after)
        if total1 - total0 <= 0 or any(p is None for p in per_cpu):
            return None, ()
        whole = 100.0 * ((total1 - total0) - (idle1 - idle0)) / (total1 - total0)
        return min(100.0, max(0.0, whole)), tuple(p for p in per_cpu if p is not None)

    def _run(self, run_pids: Iterable[int] | None) -> tuple[float | None, int | None]:
        pids = set(run_pids or ())
        for gone in set(self._procs) - pids:
            del self._procs[gone]
        if not pids:
            return None, None
        cpu_pct_sum = 0.0
        measured = 0
        rss_sum = 0
        alive = 0
        for pid in sorted(pids):
            try:
                cached = self._procs.get(pid)
                # is_running() also checks the create time, so a reused pid
                # gets a fresh Process and no bogus CPU delta.
                if cached is not None and cached[0].is_running():
                    proc = cached[0]
                else:
                    cached = None
                    proc = psutil.Process(pid)
                with proc.oneshot():
                    if exited(proc):
                        raise psutil.ZombieProcess(pid)
                    times = proc.cpu_times()
                    rss = proc.memory_info().rss
                now = self._clock()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._procs.pop(pid, None)  # no figure for a process that is gone
                continue
            cpu_s = times.user + times.system
            if cached is not None and now - cached[2] < MIN_CPU_INTERVAL_S:
                # Too soon for a fair interval: keep the baseline, report the last figure.
                if cached[3] is not None:
                    cpu_pct_sum += cached[3]
                    measured += 1
            else:
                pct = None
                if cached is not None:
                    pct = 100.0 * max(0.0, cpu_s - cached[1]) / (now - cached[2])
                    cpu_pct_sum += pct
                    measured += 1
                self._procs[pid] = (proc, cpu_s, now, pct)
            rss_sum += int(rss)
            alive += 1
        if alive == 0:
            return None, None
        # A process seen for the first time has no interval yet; if none had
        # one, the CPU figure is unknown rather than zero.
        return (cpu_pct_sum if measured else None), rss_sum
